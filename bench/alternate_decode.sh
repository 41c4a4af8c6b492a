#!/bin/sh
# Two moe builds' decode speed on the same language models, alternated on one machine so that its noise
# falls on both alike: ROUNDS rounds of `moe bench --lm MODEL --prompt-tokens 0 --gen-tokens N` (the
# median of 3 runs of N tokens from an empty cache, 2 threads), REF first in odd rounds and NEW first in
# even ones, then per model each build's median tok/s over the rounds (min-max) and NEW's over REF's.
#
#   bench/alternate_decode.sh REF_MOE NEW_MOE MODEL... (env ROUNDS (5), N (64), THREADS (2); REF_ENV and
#   NEW_ENV: VAR=value words each side runs with, e.g. REF_ENV=MOE_NO_MMAP=0 NEW_ENV=MOE_NO_MMAP=1 and one
#   build twice: mapped against read)
set -eu
if [ $# -lt 3 ]; then
  sed -n '2,9s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
REF=$1 NEW=$2
shift 2
ROUNDS=${ROUNDS:-5} N=${N:-64} THREADS=${THREADS:-2}
for b in "$REF" "$NEW"; do [ -x "$b" ] || { echo "alternate_decode: $b is not an executable" >&2; exit 2; }; done
OUT=$(mktemp -d "${TMPDIR:-/tmp}/alternate_decode.XXXXXX")
median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.1f (%.1f-%.1f)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
echo "model | ref tok/s | new tok/s | new / ref"
for m in "$@"; do
  for i in $(seq "$ROUNDS"); do
    order="ref new"; [ $((i % 2)) = 0 ] && order="new ref"
    for side in $order; do
      bin=$REF vars=${REF_ENV:-}; [ $side = new ] && bin=$NEW vars=${NEW_ENV:-}
      # shellcheck disable=SC2086 # vars: several words
      env $vars "$bin" bench --lm "$m" --prompt-tokens 0 --gen-tokens "$N" --threads "$THREADS" --reps 3 --json |
        sed -n 's/.*"decode_tok_s": *\([0-9.e+]*\).*/\1/p' >>"$OUT/$side.txt"
    done
  done
  r=$(median <"$OUT/ref.txt") n=$(median <"$OUT/new.txt")
  echo "$(basename "$m") | $r | $n | $(echo "${n%% *} ${r%% *}" | awk '{ printf "%.2f", $1 / $2 }')"
  rm -f "$OUT/ref.txt" "$OUT/new.txt"
done
rmdir "$OUT"
