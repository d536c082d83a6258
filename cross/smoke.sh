#!/usr/bin/env bash
# Runs a part of the integration tests against a static musl binary: serve on loopback, users,
# records and activities in XML and JSON (the same golden files as on the build machine),
# access control, health and metrics, SIGTERM, batches, webhooks and MQTT.
#
#   bash cross/smoke.sh            the aarch64 binary under qemu-aarch64-static, emulating a
#                                  plain ARMv8.0 core (Cortex-A53, as on small gateways)
#   bash cross/smoke.sh x86_64     the x86_64 binary, natively
#
# Both binaries take some of libc's memory functions from crates/fastmem instead of musl's;
# its tests run on the target first.
#
# cross/setup.sh installs what it needs. Uses the `smoke` profile (release code without LTO)
# to keep the build short.
set -euo pipefail
cd "$(dirname "$0")/.."

arch="${1:-aarch64}"
case "$arch" in
    aarch64) runner="qemu-aarch64-static -cpu cortex-a53" ;;
    x86_64) runner="" ;;
    *) echo "cross/smoke.sh: unknown architecture $arch (aarch64 or x86_64)" >&2; exit 64 ;;
esac
target="$arch-unknown-linux-musl"
# crates/fastmem's own tests on the target (under qemu for aarch64: the runner in
# .cargo/config.toml).
cargo test --locked -p fastmem --release --target "$target"
cargo build --locked --profile smoke --target "$target"
bin="target/$target/smoke/sitegate"
file "$bin" | grep -qE "statically linked|static-pie linked" || { echo "cross/smoke.sh: $bin is not static" >&2; exit 1; }

export SITEGATE_BIN="$PWD/$bin"
if [ -n "$runner" ]; then export SITEGATE_RUNNER="$runner"; else unset SITEGATE_RUNNER; fi
filter='test(/^(records|activities|access)::/) | test(=cli::user_and_group_commands) | test(=cli::version_prints_the_version) | test(=ops::health_and_metrics) | test(=http::sigterm_stops_the_service_cleanly) | test(=batch::batch_golden) | test(=webhooks::every_event_is_delivered_signed_and_in_order) | test(=mqtt::organisations_cannot_see_or_write_each_others_topics)'
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --locked --test it -E "$filter"
else
    cargo test --locked --test it -- records:: activities:: access:: cli::user_and_group_commands \
        cli::version_prints_the_version ops::health_and_metrics http::sigterm_stops_the_service_cleanly
fi
