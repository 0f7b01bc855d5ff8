#!/usr/bin/env bash
# Runs a libFuzzer target from its checked-in seed corpus for a bounded time;
# new inputs go to a work corpus beside the binary, crashes to
# <work>.artifacts/. Exit status non-zero on any crash, sanitizer report or
# broken invariant.
# Usage: scripts/fuzz.sh FUZZER_BINARY SECONDS [libFuzzer flags...]
# e.g.   scripts/fuzz.sh build-sanitize/tests/fuzz/request_fuzzer 600
set -euo pipefail
bin=$1
seconds=$2
shift 2
name=$(basename "$bin")
root=$(cd "$(dirname "$0")/.." && pwd)
work=${FUZZ_WORK_DIR:-$(dirname "$bin")/$name.corpus}
mkdir -p "$work" "$work.artifacts"
exec "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work.artifacts/" "$@" \
  "$work" "$root/tests/fuzz/corpus/$name"
