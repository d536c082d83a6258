#!/usr/bin/env bash
# Builds the shipping binaries: fully static, stripped, for each target given
# (default: both), into dist/sitegate-<version>-<target>. Run cross/setup.sh once first.
#
#   bash cross/build.sh [x86_64-unknown-linux-musl] [aarch64-unknown-linux-musl]
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
mkdir -p dist
for target in "${targets[@]}"; do
    cargo build --locked --release --target "$target"
    out="dist/sitegate-$version-$target"
    cp "target/$target/release/sitegate" "$out"
    if file "$out" | grep -q "dynamically linked"; then
        echo "cross/build.sh: $out is not static" >&2
        exit 1
    fi
    printf '%s\t%s bytes\n' "$out" "$(stat -c %s "$out")"
done
