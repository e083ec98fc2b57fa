#!/usr/bin/env bash
# CI smoke of the fuzz targets: installs cargo-fuzz if it is missing, builds
# every target, and runs each for FUZZ_SECONDS (default 20) over its seed
# corpus, one after the other. Fails on the first crash, hang (a run over
# 20 s), or run over 2 GB of memory; libFuzzer then names the input it
# wrote under tests/fuzz/artifacts/TARGET/.
#
# Builds on a stable toolchain: no sanitizer (`--sanitizer none` needs no
# unstable flag), and the `dev` profile of tests/fuzz/Cargo.toml (optimized
# a little, built in parallel), which builds much faster than `--release`
# with one codegen unit; the longer runs by hand use `--release` (see
# docs/fuzzing.md). New inputs go to a scratch corpus, never to the seeds.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${FUZZ_SECONDS:-20}"
targets=(jobfile worker_stream store_codec peer)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz --version 0.13.2
fi

build=(--fuzz-dir tests/fuzz --sanitizer none --dev)
cargo fuzz build "${build[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    echo "fuzzing $target for ${seconds} s"
    log="$scratch/$target.log"
    status=0
    cargo fuzz run "${build[@]}" "$target" "$scratch/$target" "tests/fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^Done ' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 80 "$log" >&2
        echo "fuzz target $target failed (exit $status)" >&2
        exit "$status"
    fi
done
echo "fuzz smoke passed: ${#targets[@]} targets, ${seconds} s each"
