#!/usr/bin/env bash
# Installs what the BLE mock harness needs: a private D-Bus daemon, libdbus headers for the
# btleplug build, python-dbus/GObject from Debian, and python-dbusmock in a venv that sees them.
# Idempotent: prints nothing when everything is already there, one line when it installed something.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv="${SITEGATE_BLE_VENV:-target/ble-venv}"
dbusmock_version="0.38.1"
# Debian's python3-dbus and python3-gi are built for Debian's interpreter, so the venv must be
# made from it (not from whatever python3 comes first on PATH).
syspython=/usr/bin/python3
packages=(dbus-daemon libdbus-1-dev pkg-config python3 python3-venv python3-dbus python3-gi)

die() { echo "tests/ble/setup.sh: $*" >&2; exit 1; }

installed=()

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    if [[ $status != "install ok installed" ]]; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "missing Debian packages ${missing[*]} and no apt-get to install them"
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "missing Debian packages ${missing[*]}; not root and no sudo"
        sudo=(sudo)
    fi
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    export DEBIAN_FRONTEND=noninteractive
    if ! "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >"$log" 2>&1; then
        "${sudo[@]}" apt-get update -qq >>"$log" 2>&1 || { cat "$log" >&2; die "apt-get update failed"; }
        "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >>"$log" 2>&1 ||
            { cat "$log" >&2; die "apt-get install ${missing[*]} failed"; }
    fi
    installed+=("${missing[@]}")
fi

[[ -x $syspython ]] || die "$syspython not found"
"$syspython" -c 'import dbus, gi' 2>/dev/null || die "$syspython cannot import dbus and gi (python3-dbus, python3-gi)"

# A venv made some other way (another interpreter, no system site packages) cannot see
# python3-dbus and python3-gi: make it again.
if [[ -f $venv/pyvenv.cfg ]] && ! { grep -qE '^include-system-site-packages *= *true' "$venv/pyvenv.cfg" &&
    "$venv/bin/python" -c 'import dbus, gi' 2>/dev/null; }; then
    rm -rf "$venv"
fi
if [[ ! -x $venv/bin/python ]]; then
    [[ ! -e $venv ]] || die "$venv exists but is not a venv; remove it or set SITEGATE_BLE_VENV"
    mkdir -p "$(dirname "$venv")"
    "$syspython" -m venv --system-site-packages "$venv" >/dev/null 2>&1 ||
        { rm -rf "$venv"; die "could not create the venv $venv with $syspython -m venv"; }
    installed+=("venv $venv")
fi

if ! "$venv/bin/python" - "$dbusmock_version" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import dbus, gi, dbusmock  # noqa: F401
sys.exit(0 if version("python-dbusmock") == sys.argv[1] else 1)
PY
then
    log=$(mktemp)
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "python-dbusmock==$dbusmock_version" >"$log" 2>&1; then
        cat "$log" >&2; rm -f "$log"
        die "pip install python-dbusmock==$dbusmock_version failed"
    fi
    rm -f "$log"
    "$venv/bin/python" -c 'import dbus, gi, dbusmock' || die "the venv $venv cannot import dbus, gi and dbusmock"
    installed+=("python-dbusmock==$dbusmock_version")
fi

if ((${#installed[@]})); then
    echo "tests/ble/setup.sh: installed ${installed[*]}"
fi
