#!/bin/sh
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) into build-fuzz and runs each for
# SECONDS (default 8), starting from its committed seed corpus fuzz/corpus/<target>; inputs it finds
# go to build-fuzz/corpus/<target> and are reused by the next run. Stops at the first crash, leak,
# timeout or out-of-memory, printing the target's output and the reproducer saved under
# build-fuzz/crashes/<target>/ (emptied when the target runs again).
# Replay one: build-fuzz/fuzz/fuzz_<target> FILE
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -e
secs=${1:-8}
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" \
  -DMOE_FUZZ=ON -DMOE_NO_MPI=ON >/dev/null
cmake --build build-fuzz -j "${JOBS:-2}" --target fuzz >/dev/null
targets=${*:-$(cd fuzz && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//')}
export UBSAN_OPTIONS=print_stacktrace=1
for t in $targets; do
  rm -rf "build-fuzz/crashes/$t" # only this run's reproducers
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  log=build-fuzz/fuzz-$t.log
  if ! build-fuzz/fuzz/fuzz_$t -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/crashes/$t/" "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 80 "$log"
    for f in "build-fuzz/crashes/$t"/*; do
      [ -f "$f" ] || continue
      echo "reproducer: $f ($(wc -c <"$f") bytes; replay: build-fuzz/fuzz/fuzz_$t $f)"
      od -A d -c "$f" | head -n 20
    done
    exit 1
  fi
  echo "fuzz_$t: $(sed -n 's/^stat::number_of_executed_units: *//p' "$log") executions in ${secs} s," \
       "$(ls "build-fuzz/corpus/$t" | wc -l) inputs found so far, no crash"
done
