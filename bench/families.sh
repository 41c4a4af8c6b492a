#!/bin/sh
# The language-model families against Mixtral (issues 39 and 40), as markdown tables of medians over
# REPS alternated runs (each rep runs every side once, in the same order: A B A B ...):
#  1. decode tokens/s (moe bench --lm on random checkpoints from bench/random_lm.py) of Mixtral, Qwen2-MoE,
#     Qwen3-MoE, OLMoE, gpt-oss and DeepSeek-V2 of about the same active parameters per token: the same D,
#     layers, heads, experts and top-k; Qwen2-MoE's experts (and its shared expert) H k / (k + 1) wide, so
#     that its k routed experts and its shared one have the k experts' width; the table gives each
#     model's active parameters (all but the embedding table and the experts not chosen) so the match shows;
#  2. training tokens/s (moe train --task lm --family F at the same sizes, a synthetic corpus; moe train's
#     own family layouts, e.g. DeepSeek's dense first layer and shared expert: their active parameters given);
#  3. DeepSeek-V2's latent attention against Mixtral's grouped-query attention of the same D, layers and
#     heads: the KV cache's bytes per token (fp32: layers x (kv_lora_rank + qk_rope_head_dim) x 4 against
#     layers x 2 x kv_heads x head_dim x 4) and decode tokens/s after a prompt of CTX_MLA positions;
#  4. gpt-oss with its layers alternating a WINDOW-token sliding window and full attention, against the
#     same model with every layer full: decode milliseconds a token after prompts of each of CONTEXTS.
# usage: bench/families.sh [MOE] [REPS] [SIZE]   SIZE: small (default: D 512, 4 layers, 8 heads of 64, 4 KV
# heads, 8 experts top-2 of H 1024, vocab 4096; 256 decoded tokens; 40 training steps; CTX_MLA 2048;
# CONTEXTS 4096 8192, WINDOW 128) or tiny (a check that the script runs, in seconds: its timings mean
# nothing). THREADS (default 2) for every run. Needs /usr/bin/python3 with numpy.
set -e
MOE=${1:-build/moe}
REPS=${2:-3}
SIZE=${3:-small}
THREADS=${THREADS:-2}
PY=/usr/bin/python3
HERE=$(dirname "$0")
case $SIZE in
  small) D=512 L=4 NH=8 NKV=4 E=8 K=2 H=1024 V=4096 GEN=256 STEPS=40 CTX_MLA=2048 CONTEXTS="4096 8192" WINDOW=128 ;;
  tiny) D=64 L=2 NH=4 NKV=2 E=4 K=2 H=64 V=512 GEN=8 STEPS=3 CTX_MLA=32 CONTEXTS="64 128" WINDOW=16 ;;
  *) echo "usage: bench/families.sh [MOE] [REPS] [small|tiny]" >&2; exit 2 ;;
esac
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
HQ=$((H * K / (K + 1))) # Qwen2-MoE: k routed experts and the shared one of this width
MAXPOS=0
for c in $CONTEXTS $CTX_MLA; do [ "$c" -gt "$MAXPOS" ] && MAXPOS=$c; done
MAXPOS=$((MAXPOS + GEN))

# random_lm.py DIR FAMILY [more flags]
model() {
  dir=$1 fam=$2
  shift 2
  $PY "$HERE/random_lm.py" "$TMP/$dir" --vocab $V --family "$fam" --layers $L --model $D --heads $NH --kv-heads $NKV \
    --experts $E --top-k $K --max-pos $MAXPOS "$@" >/dev/null
}
# active parameters per token of checkpoint DIR: every tensor but the embedding table, the routed
# experts' (".experts.", per expert or fused with E leading) counted k / E
active() {
  $PY - "$1" <<'EOF'
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
E = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
k = c.get("num_experts_per_tok") or c.get("experts_per_token")
f = open(d + "/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
n = 0.0
for name, t in h.items():
    if name == "__metadata__" or name == "model.embed_tokens.weight":
        continue
    size = 1
    for s in t["shape"]:
        size *= s
    n += size * k / E if ".experts." in name else size
print("%.2fM" % (n / 1e6))
EOF
}
# FILE has a figure for each rep so far (R): else the run failed (its error above)
got() {
  [ "$(grep -c . "$TMP/$1" 2>/dev/null || true)" = "$r" ] || { echo "bench/families.sh: $2 gave no figure" >&2; exit 1; }
}
# decode tokens/s of DIR after a prompt of P tokens, appended to FILE
decode() {
  "$MOE" bench --lm "$TMP/$1" --prompt-tokens "$2" --gen-tokens $GEN --threads $THREADS --reps 1 --json |
    sed -n 's/.*"decode_tok_s":\([0-9.e+-]*\).*/\1/p' >> "$TMP/$3"
  got "$3" "moe bench --lm ($1, $2 positions)"
}
median() { sort -g "$TMP/$1" | awk '{ v[NR] = $1 } END { printf "%.4g", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
runs() { awk '{ printf "%.4g ", $1 }' "$TMP/$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

FAMILIES="mixtral qwen2_moe qwen3_moe olmoe gpt_oss deepseek_v2"
for f in $FAMILIES; do
  if [ "$f" = qwen2_moe ]; then model "$f" "$f" --hidden $HQ; else model "$f" "$f" --hidden $H; fi
done
model gpt_oss_window gpt_oss --hidden $H --sliding-window $WINDOW

# the training corpus: random words (tokens/s does not depend on the text)
$PY - "$TMP/corpus" <<'EOF'
import os, random, sys
os.makedirs(sys.argv[1])
r = random.Random(1)
w = "the cat sat on a mat while experts route every token to two of eight experts in each layer".split()
for name, n in (("train.txt", 200000), ("valid.txt", 5000)):
    open(os.path.join(sys.argv[1], name), "w").write(" ".join(r.choice(w) for _ in range(n)) + "\n")
EOF

for r in $(seq "$REPS"); do
  for f in $FAMILIES; do
    decode "$f" 16 "$f.decode"
    h=$H
    [ "$f" = qwen2_moe ] && h=$HQ
    "$MOE" train --task lm --data "$TMP/corpus" --vocab $V --family "$f" --layers $L --model $D --heads $NH \
      --kv-heads $NKV --experts $E --top-k $K --hidden $h --steps $STEPS --threads $THREADS --eval-every 100000 \
      --eval-windows 1 --json --quiet --checkpoint "$TMP/train_$f" |
      sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | head -1 >> "$TMP/$f.train"
    got "$f.train" "moe train --task lm --family $f"
  done
  decode mixtral $CTX_MLA gqa.long
  decode deepseek_v2 $CTX_MLA mla.long
  for c in $CONTEXTS; do
    decode gpt_oss_window "$c" "window.$c"
    decode gpt_oss "$c" "full.$c"
  done
done

echo "### Families against Mixtral: D $D, $L layers, $NH heads ($NKV KV), $E experts top-$K of H $H, $THREADS threads, $REPS alternated runs"
echo
echo "| family | active params (decode model) | decode tok/s ($GEN tokens) | median | / mixtral | active params (trained model) | train tok/s ($STEPS steps) | median | / mixtral |"
echo "|---|---|---|---|---|---|---|---|---|"
bd=$(median mixtral.decode) bt=$(median mixtral.train)
for f in $FAMILIES; do
  md=$(median "$f.decode") mt=$(median "$f.train")
  echo "| $f | $(active "$TMP/$f") | $(runs "$f.decode")| $md | $(ratio "$md" "$bd") | $(active "$TMP/train_$f") | $(runs "$f.train")| $mt | $(ratio "$mt" "$bt") |"
done
echo
kv=$($PY -c "import json; c = json.load(open('$TMP/deepseek_v2/config.json')); print($L * (c['kv_lora_rank'] + c['qk_rope_head_dim']) * 4)")
gqa=$((L * 2 * NKV * (D / NH) * 4))
mg=$(median gqa.long) mm=$(median mla.long)
echo "### Latent attention (DeepSeek-V2) against grouped-query attention (Mixtral), decode after $CTX_MLA positions"
echo
echo "| attention | KV cache bytes/token (fp32) | decode tok/s | median | / GQA |"
echo "|---|---|---|---|---|"
echo "| GQA ($NKV KV heads of $((D / NH))) | $gqa | $(runs gqa.long)| $mg | 1.00 |"
echo "| MLA (latent and rotary key: $((kv / 4 / L)) floats a layer) | $kv | $(runs mla.long)| $mm | $(ratio "$mm" "$mg") |"
echo
echo "### gpt-oss: sliding window ($WINDOW) on every other layer against full attention on every layer"
echo
echo "| context | full: ms/token | window: ms/token | window / full |"
echo "|---|---|---|---|"
for c in $CONTEXTS; do
  mf=$(median "full.$c") mw=$(median "window.$c")
  echo "| $c | $(awk -v t="$mf" 'BEGIN { printf "%.3f", 1000 / t }') | $(awk -v t="$mw" 'BEGIN { printf "%.3f", 1000 / t }') | $(ratio "$mf" "$mw") |"
done
