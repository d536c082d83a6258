#!/usr/bin/env bash
# Prepares a Debian (12) machine to build fully static sitegate binaries for
# x86_64-unknown-linux-musl and aarch64-unknown-linux-musl, and to run the aarch64 one
# under qemu. Idempotent; needs root (or sudo) for apt.
#
#   bash cross/setup.sh
set -euo pipefail

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi

rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl

packages=(musl-tools gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu musl-dev:arm64 qemu-user-static)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        "${sudo[@]}" dpkg --add-architecture arm64
    fi
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "cross/setup.sh: ready to build for x86_64 and aarch64 (musl, static)"
