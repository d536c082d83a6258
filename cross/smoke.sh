#!/usr/bin/env bash
# Runs a part of the integration tests against the aarch64 static binary under
# qemu-aarch64-static, emulating a plain ARMv8.0 core (Cortex-A53, as on small gateways):
# serve on loopback, users, records and activities in XML and JSON (the same golden files as
# on the build machine), access control, health and metrics, SIGTERM.
#
#   bash cross/smoke.sh            (cross/setup.sh installs what it needs)
#
# Uses the `smoke` profile (release code without LTO) to keep the build short.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-musl
cargo build --locked --profile smoke --target "$target"
bin="target/$target/smoke/sitegate"
file "$bin" | grep -q "statically linked" || { echo "cross/smoke.sh: $bin is not static" >&2; exit 1; }

export SITEGATE_BIN="$PWD/$bin"
export SITEGATE_RUNNER="qemu-aarch64-static -cpu cortex-a53"
filter='test(/^(records|activities|access)::/) | test(=cli::user_and_group_commands) | test(=cli::version_prints_the_version) | test(=ops::health_and_metrics) | test(=http::sigterm_stops_the_service_cleanly) | test(=batch::batch_golden) | test(=webhooks::every_event_is_delivered_signed_and_in_order) | test(=mqtt::organisations_cannot_see_or_write_each_others_topics)'
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --locked --test it -E "$filter"
else
    cargo test --locked --test it -- records:: activities:: access:: cli::user_and_group_commands \
        cli::version_prints_the_version ops::health_and_metrics http::sigterm_stops_the_service_cleanly
fi
