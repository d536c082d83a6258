#!/usr/bin/env bash
# Builds the shipping binaries: fully static, stripped, for each target given
# (default: both), into dist/sitegate-<version>-<target>. Run cross/setup.sh once first.
# Fails when the aarch64 binary is over its budget (gateways' storage; BENCHMARKS.md).
#
#   bash cross/build.sh [x86_64-unknown-linux-musl] [aarch64-unknown-linux-musl]
set -euo pipefail
cd "$(dirname "$0")/.."

AARCH64_BINARY_BYTES_MAX=10000000

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
mkdir -p dist
for target in "${targets[@]}"; do
    # aarch64 is built for size (its 10 MB budget), x86_64 for speed (Cargo.toml).
    case "$target" in
        aarch64-*) profile=small ;;
        *) profile=release ;;
    esac
    cargo build --locked --profile "$profile" --target "$target"
    out="dist/sitegate-$version-$target"
    cp "target/$target/$profile/sitegate" "$out"
    if file "$out" | grep -q "dynamically linked"; then
        echo "cross/build.sh: $out is not static" >&2
        exit 1
    fi
    bytes=$(stat -c %s "$out")
    printf '%s\t%s bytes\n' "$out" "$bytes"
    if [[ "$target" == aarch64-* ]] && [ "$bytes" -gt "$AARCH64_BINARY_BYTES_MAX" ]; then
        echo "cross/build.sh: $out is $bytes bytes, over its budget of $AARCH64_BINARY_BYTES_MAX" >&2
        exit 1
    fi
done
