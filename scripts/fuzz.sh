#!/bin/sh
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) into build-fuzz and runs each for
# SECONDS (default 8), starting from its committed seed corpus fuzz/corpus/<target>; inputs it finds
# go to build-fuzz/corpus/<target> and are reused by the next run. Stops at the first crash, leak,
# timeout or out-of-memory, printing the target's output and the reproducer saved under
# build-fuzz/crashes/<target>/ (emptied when the target runs again).
# Runs JOBS (default 2) targets at a time. Replay one: build-fuzz/fuzz/fuzz_<target> FILE
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
jobs=${JOBS:-2}

# One target for SECONDS; its exit status in build-fuzz/fuzz-T.rc.
fuzz_one() {
  rm -rf "build-fuzz/crashes/$1" # only this run's reproducers
  mkdir -p "build-fuzz/corpus/$1" "build-fuzz/crashes/$1"
  rc=0
  build-fuzz/fuzz/fuzz_$1 -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/crashes/$1/" "build-fuzz/corpus/$1" "fuzz/corpus/$1" >"build-fuzz/fuzz-$1.log" 2>&1 || rc=$?
  echo "$rc" >"build-fuzz/fuzz-$1.rc"
}

# Its result: the count, or its log's end and reproducers (returns 1).
report() {
  log=build-fuzz/fuzz-$1.log
  if [ "$(cat "build-fuzz/fuzz-$1.rc")" != 0 ]; then
    tail -n 80 "$log"
    for f in "build-fuzz/crashes/$1"/*; do
      [ -f "$f" ] || continue
      echo "reproducer: $f ($(wc -c <"$f") bytes; replay: build-fuzz/fuzz/fuzz_$1 $f)"
      od -A d -c "$f" | head -n 20
    done
    return 1
  fi
  echo "fuzz_$1: $(sed -n 's/^stat::number_of_executed_units: *//p' "$log") executions in ${secs} s," \
       "$(ls "build-fuzz/corpus/$1" | wc -l) inputs found so far, no crash"
}

# JOBS targets at a time (each fuzzer is one process on one core), reported in order after each batch.
set -- $targets
while [ $# -gt 0 ]; do
  batch=
  while [ $# -gt 0 ] && [ "$(echo $batch | wc -w)" -lt "$jobs" ]; do
    fuzz_one "$1" &
    batch="$batch $1"
    shift
  done
  wait
  for t in $batch; do report "$t" || exit 1; done
done
