#!/usr/bin/env bash
# Checks a built sitegate against its OpenAPI description (docs/openapi.json, served at
# GET /openapi.json): starts the binary on a fresh database, gives it some data
# (tests/schema/seed.py, which checks each answer against the description too), then lets
# Schemathesis generate requests for every operation and check every answer: status codes,
# content types, headers and bodies against the description, no 5xx, valid input accepted,
# invalid input refused, credentials enforced, created resources found, deleted ones gone.
#
#   bash tests/schema/run.sh PATH_TO_BINARY
#
# Environment:
#   SITEGATE_SCHEMA_EXAMPLES  test cases per operation and phase (default 10; raise it for a
#                             long run)
#   SITEGATE_SCHEMA_SOURCE    where to read the description from: default the service's own
#                             http://127.0.0.1:PORT/openapi.json; a file path (relative to the
#                             repository) or another URL instead
#   SITEGATE_SCHEMA_SEED      Schemathesis' random seed, to repeat a run
#
# Needs: python3 with venv, and PyPI to install into target/schema-venv (created or reused;
# pinned versions of schemathesis and openapi-spec-validator). Network: loopback only. Where
# `unshare -rn` works, the service and the tests run in a network namespace of their own that
# has nothing but loopback; in any case the hook URLs the tests generate are pointed at
# 127.0.0.1 (tests/schema/loopback_hooks.py), so webhook deliveries stay on this machine.
# The service's directory (database, logs, reports) is kept when the run fails.
# Exits non-zero when a check failed, the service did not start, or it did not stop cleanly
# (exit status 0) on SIGTERM.
set -euo pipefail
script=$(realpath "$0")
if [ "${1:-}" = "--inside" ]; then
    # Second stage, in the network namespace when there is one.
    shift
    inside=1
else
    inside=0
fi
if [ $# -ne 1 ]; then
    echo "usage: bash tests/schema/run.sh PATH_TO_BINARY" >&2
    exit 2
fi
if [ ! -f "$1" ] || [ ! -x "$1" ]; then
    echo "tests/schema/run.sh: $1 is not an executable" >&2
    exit 2
fi
bin=$(realpath "$1")
cd "$(dirname "$script")/../.."

SCHEMATHESIS_VERSION=4.32.5
VALIDATOR_VERSION=0.9.0
VENV=target/schema-venv

if [ "$inside" -eq 0 ]; then
    # The virtual environment, with the pinned versions.
    if [ ! -x "$VENV/bin/python" ]; then
        echo "tests/schema/run.sh: creating $VENV"
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('schemathesis') != '$SCHEMATHESIS_VERSION' or m.version('openapi-spec-validator') != '$VALIDATOR_VERSION')
" 2>/dev/null; then
        echo "tests/schema/run.sh: installing schemathesis $SCHEMATHESIS_VERSION, openapi-spec-validator $VALIDATOR_VERSION"
        "$VENV/bin/pip" install -q --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION" "openapi-spec-validator==$VALIDATOR_VERSION"
    fi
    "$VENV/bin/openapi-spec-validator" docs/openapi.json

    # Loopback only: a network namespace of our own when the system allows one.
    if command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 \
        && unshare -rn sh -c 'ip link set lo up' >/dev/null 2>&1; then
        exec unshare -rn bash "$script" --inside "$bin"
    fi
    echo "tests/schema/run.sh: no network namespace here (unshare -rn); running on the host's loopback"
else
    ip link set lo up
fi

examples=${SITEGATE_SCHEMA_EXAMPLES:-10}
dir=$(mktemp -d "${TMPDIR:-/tmp}/sitegate-schema.XXXXXX")
cat >"$dir/config.toml" <<EOF
[http]
listen = "127.0.0.1:0"
workers = 4

[mqtt]
listen = "127.0.0.1:0"

[store]
path = "$dir/sitegate.db"

# One run makes thousands of calls, and probes with wrong credentials on purpose: neither the
# hourly quota nor the failed-login lockout may get in the way.
[api]
quota_calls_per_hour = 100000000
login_failures_max = 1000000
EOF

"$bin" serve --config "$dir/config.toml" >"$dir/stdout.log" 2>"$dir/stderr.log" </dev/null &
pid=$!
stopped=0
stop() {
    if [ "$stopped" -eq 0 ]; then
        stopped=1
        kill -TERM "$pid" 2>/dev/null || true
        set +e
        wait "$pid"
        service_status=$?
        set -e
    fi
}
trap 'stop' EXIT

# The ready line names the port; the first start prints the administrator's token once.
port=""
token=""
for _ in $(seq 1 120); do
    port=$(grep -ho 'ready http=127\.0\.0\.1:[0-9]*' "$dir/stdout.log" "$dir/stderr.log" 2>/dev/null | head -n 1 | sed 's/.*://' || true)
    token=$(sed -n 's/^sitegate: admin token: \([0-9a-f]*\)$/\1/p' "$dir/stderr.log" | head -n 1)
    if [ -n "$port" ] && [ -n "$token" ]; then
        break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        break
    fi
    sleep 0.5
done
if [ -z "$port" ] || [ -z "$token" ]; then
    echo "tests/schema/run.sh: the service did not get ready within 60 s; its log:" >&2
    tail -n 40 "$dir/stderr.log" >&2
    exit 1
fi
email=$(sed -n 's/^sitegate: admin email: \(.*\)$/\1/p' "$dir/stderr.log" | head -n 1)
email=${email:-admin@sitegate.local}
base="http://127.0.0.1:$port"

# The description, from the service itself unless told otherwise.
source=${SITEGATE_SCHEMA_SOURCE:-$base/openapi.json}
schema="$dir/openapi.json"
case "$source" in
    http://* | https://*)
        if ! "$VENV/bin/python" - "$source" "$schema" <<'EOF'; then
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as r:
    doc = json.load(r)
json.dump(doc, open(sys.argv[2], "w"))
EOF
            echo "tests/schema/run.sh: could not read the description at $source" >&2
            exit 1
        fi
        ;;
    *) cp "$source" "$schema" ;;
esac

status=0
"$VENV/bin/python" tests/schema/seed.py "$base" "$email" "$token" "$schema" || status=1

seed_args=()
if [ -n "${SITEGATE_SCHEMA_SEED:-}" ]; then
    seed_args=(--seed "$SITEGATE_SCHEMA_SEED")
fi
started=$(date +%s)
set +e
# /status/events is a stream that lasts as long as the credentials: not a request-answer pair.
PYTHONPATH="$PWD/tests/schema" SCHEMATHESIS_HOOKS=loopback_hooks \
    "$VENV/bin/schemathesis" --config-file tests/schema/schemathesis.toml run "$schema" \
    --url "$base" \
    --auth "$email:$token" \
    --header 'Accept: application/json' \
    --generation-with-security-parameters false \
    --exclude-operation-id statusEvents \
    --max-examples "$examples" \
    --request-timeout 30 \
    --no-color \
    --report junit \
    --report-dir "$dir/report" \
    "${seed_args[@]}" >"$dir/schemathesis.log" 2>&1
st_status=$?
set -e
elapsed=$(($(date +%s) - started))
[ "$st_status" -eq 0 ] || status=1

# The failures in full, then a short summary.
sed -n '/^=* FAILURES =*$/,/^=* SUMMARY =*$/p' "$dir/schemathesis.log"
sed -n '/^=* ERRORS =*$/,/^=* SUMMARY =*$/p' "$dir/schemathesis.log"
tested=$(sed -n 's/^ *Tested: *\([0-9]*\).*/\1/p' "$dir/schemathesis.log" | head -n 1)
generated=$(sed -n 's/^ *\([0-9]*\) generated.*/\1/p' "$dir/schemathesis.log" | head -n 1)
found=$(sed -n 's/.* found \([0-9]*\) unique failures.*/\1/p' "$dir/schemathesis.log" | head -n 1)
used_seed=$(sed -n 's/^Seed: *\([0-9]*\).*/\1/p' "$dir/schemathesis.log" | head -n 1)
echo "schema: ${tested:-?} operations tested, ${generated:-?} examples, ${found:-0} failures in ${elapsed} s (Schemathesis exit status $st_status, seed ${used_seed:-?}, ${examples} examples per operation and phase)"
if [ "$st_status" -ne 0 ] && [ -z "$found" ]; then
    tail -n 40 "$dir/schemathesis.log"
fi

stop
trap - EXIT
if [ "$service_status" -ne 0 ]; then
    echo "tests/schema/run.sh: the service exited with status $service_status on SIGTERM; its log:" >&2
    tail -n 40 "$dir/stderr.log" >&2
    status=1
fi
if grep -E 'internal error|panicked' "$dir/stderr.log" >/dev/null; then
    echo "tests/schema/run.sh: the service logged internal errors:" >&2
    grep -E 'internal error|panicked' "$dir/stderr.log" | head -n 20 >&2
    status=1
fi
if [ "$status" -eq 0 ]; then
    rm -rf "$dir"
else
    echo "tests/schema/run.sh: FAILED; the service's directory, logs and the Schemathesis report are in $dir" >&2
fi
exit "$status"
