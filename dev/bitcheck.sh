#!/usr/bin/env bash
# Bit-identity check of two moe builds, for refactors that must not change one output bit: runs the
# same workloads with REF and NEW (layer-run on every fixture and with every override, expert-parallel
# under mpirun, short train runs, infer with an expert cache) and compares everything they write byte
# for byte, and their stdout without the timings. One line per case, `same` or `DIFF` with the first
# differing tensor (or line, or byte); exits 1 if any case differs or fails.
#
#   dev/bitcheck.sh REF_MOE NEW_MOE [WORKDIR]
#
# Run REF against itself first: every case must be `same` (the library is bit-deterministic for a
# fixed thread count). Environment: BITCHECK_THREADS (threads of the one-process runs, default 2;
# the mpirun ranks use 1), BITCHECK_MNIST (an IDX directory, default data/mnist, which
# scripts/get-mnist.sh fills; the train cases use its first 512 training and 200 test digits),
# BITCHECK_ONLY (a bash regex: only the cases whose names match).
set -u

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  sed -n '2,14s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
REF=$(abs "$1")
NEW=$(abs "$2")
for b in "$REF" "$NEW"; do
  [ -x "$b" ] || { echo "bitcheck: $b is not an executable" >&2; exit 2; }
done
WORK=$(abs "${3:-$(mktemp -d "${TMPDIR:-/tmp}/bitcheck.XXXXXX")}")
THREADS=${BITCHECK_THREADS:-2}
MNIST=${BITCHECK_MNIST:-$ROOT/data/mnist}
ONLY=${BITCHECK_ONLY:-}
FIX=$ROOT/tests/fixtures
mkdir -p "$WORK" || exit 2
# Determinism does not depend on these, speed does: idle OpenMP threads that spin starve the others on
# a busy machine. BLAS threads are set by the library (one per tile).
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=passive
MPIRUN=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe)

# The helpers: safetensors comparison, the E = 8 layer files, the MNIST subset (python3 stdlib only).
PY=$WORK/bitcheck.py
cat >"$PY" <<'EOF'
import json, math, os, struct, sys

def st_read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h.pop('__metadata__', {}), h, b[8 + n:]

def values(dtype, raw):
    if dtype == 'F32': return struct.unpack('<%df' % (len(raw) // 4), raw)
    if dtype == 'BF16': return [struct.unpack('<f', b'\0\0' + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    if dtype == 'I32': return struct.unpack('<%di' % (len(raw) // 4), raw)
    return raw

def st_cmp(ref, new):
    """The first differing tensor of new against ref, in ref's data order, and how many differ."""
    (ma, ta, da), (mb, tb, db) = st_read(ref), st_read(new)
    diffs = []
    if ma != mb: diffs.append('__metadata__')
    for name, a in sorted(ta.items(), key=lambda kv: kv[1]['data_offsets'][0]):
        b = tb.get(name)
        if b is None: diffs.append(name + ' (missing)'); continue
        if (a['dtype'], a['shape']) != (b['dtype'], b['shape']):
            diffs.append('%s (%s %s vs %s %s)' % (name, a['dtype'], a['shape'], b['dtype'], b['shape'])); continue
        ra, rb = da[slice(*a['data_offsets'])], db[slice(*b['data_offsets'])]
        if ra == rb: continue
        va, vb = values(a['dtype'], ra), values(b['dtype'], rb)
        bad = [i for i in range(len(va)) if struct.pack('<d', va[i]) != struct.pack('<d', vb[i])]
        err = max((abs(va[i] - vb[i]) for i in bad if not math.isnan(va[i] - vb[i])), default=float('nan'))
        diffs.append('%s (%d of %d values, first [%d] %r vs %r, max |d| %.3g)' % (name, len(bad), len(va), bad[0],
                     va[bad[0]], vb[bad[0]], err))
    diffs += [n + ' (extra)' for n in tb if n not in ta]
    more = ', %d more tensors differ' % (len(diffs) - 1) if len(diffs) > 1 else ''
    print(diffs[0] + more if diffs else 'bytes differ outside the tensors')

def st_write(path, meta, tensors):
    """tensors: (name, shape, floats) as F32."""
    h, off = {'__metadata__': meta}, 0
    for name, shape, v in tensors:
        h[name] = {'dtype': 'F32', 'shape': shape, 'data_offsets': [off, off + 4 * len(v)]}
        off += 4 * len(v)
    j = json.dumps(h).encode()
    j += b' ' * (-len(j) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(j)) + j + b''.join(struct.pack('<%df' % len(v), *v) for _, _, v in tensors))

def gen(out):
    """E = 8 experts (1, 2, 4 ranks divide it), T = 37 tokens (uneven slices), routing made uneven."""
    s = [5]
    def u(n, scale):
        r = []
        for _ in range(n):
            s[0] = (s[0] * 6364136223846793005 + 1442695040888963407) % 2 ** 64
            r.append(((s[0] >> 40) / 2 ** 23 - 1) * scale)
        return r
    E, D, H, T, P = 8, 12, 20, 37, 6
    meta = lambda act, disp, prio, router: {'top_k': '2', 'capacity_setting': '1.0', 'activation': act,
                                            'normalize_topk': 'true', 'dispatch': disp, 'priority': prio,
                                            'router': router}
    experts = [('experts.fc1.weight', [E, H, D], u(E * H * D, D ** -.5)), ('experts.fc1.bias', [E, H], u(E * H, .1)),
               ('experts.fc2.weight', [E, D, H], u(E * D * H, H ** -.5)), ('experts.fc2.bias', [E, D], u(E * D, .1))]
    gate = [('gate.weight', [E, D], u(E * D, 3 * D ** -.5)), ('gate.bias', [E], u(E, .3))]
    st_write(out + '/w_gelu.safetensors', meta('gelu', 'dynamic', 'index', 'linear'), gate + experts)
    st_write(out + '/w_swiglu.safetensors', meta('swiglu', 'static', 'score', 'linear'),
             gate + experts + [('experts.fc3.weight', [E, H, D], u(E * H * D, D ** -.5))])
    cosine = [('gate.weight', [E, P], u(E * P, 1)), ('gate.proj.weight', [P, D], u(P * D, D ** -.5)),
              ('gate.proj.bias', [P], u(P, .1)), ('gate.logit_scale', [1], [2.5])]
    st_write(out + '/w_cosine.safetensors', meta('silu', 'dynamic', 'index', 'cosine'), cosine + experts)
    st_write(out + '/x.safetensors', {}, [('x', [T, D], u(T * D, 1)), ('dy', [T, D], u(T * D, 1)),
                                          ('daux', [1], [0.3]), ('dz', [1], [0.05])])

def subset(src, dst, n_train, n_test):
    """The first samples of an IDX data set (header dims rewritten)."""
    os.makedirs(dst, exist_ok=True)
    for split, n in (('train', n_train), ('t10k', n_test)):
        for kind in ('images-idx3', 'labels-idx1'):
            b = open('%s/%s-%s-ubyte' % (src, split, kind), 'rb').read()
            nd = b[3]
            dims = list(struct.unpack('>%dI' % nd, b[4:4 + 4 * nd]))
            per = math.prod(dims[1:])
            dims[0] = n
            with open('%s/%s-%s-ubyte' % (dst, split, kind), 'wb') as f:
                f.write(b[:4] + struct.pack('>%dI' % nd, *dims) + b[4 + 4 * nd:4 + 4 * nd + n * per])

cmd = sys.argv[1]
if cmd == 'cmp': st_cmp(sys.argv[2], sys.argv[3])
elif cmd == 'gen': gen(sys.argv[2])
elif cmd == 'subset': subset(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
EOF

# Timings out of stdout (train --json, infer --json); everything else must match.
untimed() { sed -E 's/"(steps_per_s|samples_per_s|latency_ms_p[0-9]+)": [^,}]*(, )?//g' "$1"; }

# Compares what REF and NEW left in their directories; prints `same`, or DIFF/FAIL with the first difference.
verdict() {
  local r=$1 n=$2 out=() f
  local rc_r rc_n
  rc_r=$(cat "$r/rc") rc_n=$(cat "$n/rc")
  if [ "$rc_r" != 0 ]; then
    echo "FAIL: REF exited $rc_r: $(tail -n 1 "$r/stderr")"
    return
  fi
  if [ "$rc_n" != 0 ]; then
    echo "DIFF: NEW exited $rc_n: $(tail -n 1 "$n/stderr")"
    return
  fi
  if ! cmp -s <(untimed "$r/stdout") <(untimed "$n/stdout"); then
    out+=("stdout: $(diff <(untimed "$r/stdout") <(untimed "$n/stdout") |
      awk '/^[0-9]/ && !at { at = $0 } /^</ && !a { a = $0 } /^>/ && !b { b = $0 } END { print "line " at ": " a " | " b }')")
  fi
  for f in $( (cd "$r" && ls; cd "$n" && ls) | sort -u); do
    case $f in stdout | stderr | rc) continue ;; esac
    if [ ! -f "$r/$f" ] || [ ! -f "$n/$f" ]; then
      out+=("$f: only in $([ -f "$r/$f" ] && echo REF || echo NEW)")
    elif ! cmp -s "$r/$f" "$n/$f"; then
      case $f in
        *.safetensors) out+=("$f: $(python3 "$PY" cmp "$r/$f" "$n/$f" 2>&1 | tail -n 1)") ;;
        *) out+=("$f: $(cmp "$r/$f" "$n/$f" 2>&1 | sed 's/.*differ: //')") ;;
      esac
    fi
  done
  local msg=same
  for f in "${out[@]}"; do
    [ "$msg" = same ] && msg="DIFF $f" || msg="$msg; $f"
  done
  echo "$msg"
}

NCASES=0
NBAD=0
# check NAME NP ARGS...: `moe ARGS` (under mpirun -np NP when NP > 1) with REF and with NEW, each in
# its own directory, where relative output paths land; then the verdict.
check() {
  local name=$1 np=$2 side bin
  shift 2
  [[ -z $ONLY || $name =~ $ONLY ]] || return 0
  local d=$WORK/cases/$name
  rm -rf "$d"
  mkdir -p "$d/ref" "$d/new"
  for side in ref new; do
    bin=$REF
    [ $side = new ] && bin=$NEW
    if [ "$np" -gt 1 ]; then
      (cd "$d/$side" && "${MPIRUN[@]}" -np "$np" "$bin" "$@" >stdout 2>stderr; echo $? >rc)
    else
      (cd "$d/$side" && "$bin" "$@" >stdout 2>stderr; echo $? >rc)
    fi
  done
  local v
  v=$(verdict "$d/ref" "$d/new")
  printf '%-52s %s\n' "$name" "$v"
  NCASES=$((NCASES + 1))
  [ "$v" = same ] || NBAD=$((NBAD + 1))
}

# --- moe layer-run: every fixture, forward + backward + spec --------------------------------------
LR=(layer-run --backward --spec --out out.safetensors)
lr_fix() { # NAME FIXTURE ARGS...: layer-run on a fixture directory
  local name=$1 f=$FIX/$2
  shift 2
  check "layer/$name" 1 "${LR[@]}" --weights "$f/w.safetensors" --input "$f/x.safetensors" "$@"
}
for f in "$FIX"/*/ "$FIX"/bf16/*/; do
  [ -f "$f/w.safetensors" ] || continue
  c=${f#"$FIX"/}
  lr_fix "${c%/}" "${c%/}" --threads "$THREADS"
done

# --- layer-run overrides on the fixtures (E = 6, with dspec for their own top_k) ----------------
T=(--threads "$THREADS")
lr_fix dispatch-static/gelu_k2_cap1_index_dynamic gelu_k2_cap1_index_dynamic --dispatch static "${T[@]}"
lr_fix dispatch-dynamic/relu_k2_cap1_index_static relu_k2_cap1_index_static --dispatch dynamic "${T[@]}"
lr_fix priority-score/relu_k2_cap1_index_static relu_k2_cap1_index_static --priority score "${T[@]}"
lr_fix priority-index/drops_silu_k2_cap05_score_static drops_silu_k2_cap05_score_static --priority index "${T[@]}"
lr_fix priority-score/gelu_k3_capneg_score_static+cap0.5 gelu_k3_capneg_score_static --capacity_setting 0.5 "${T[@]}"
lr_fix activation-silu/relu_k2_cap1_index_static relu_k2_cap1_index_static --activation silu "${T[@]}"
lr_fix nonorm/gelu_k2_cap1_index_dynamic gelu_k2_cap1_index_dynamic --normalize_topk false "${T[@]}"
lr_fix capacity-0.25/swiglu_k2_cap1_score_static swiglu_k2_cap1_score_static --capacity_setting 0.25 "${T[@]}"
lr_fix expert-capacity/relu_k2_cap1_index_static relu_k2_cap1_index_static --expert-capacity 3,0,9,2,5,1 "${T[@]}"
lr_fix expert-capacity/cosine_relu_k2_cap1_static cosine_relu_k2_cap1_static --expert-capacity 1,7,0,4,4,2 "${T[@]}"
lr_fix dtype-bf16/gelu_k2_cap1_index_dynamic gelu_k2_cap1_index_dynamic --dtype bf16 "${T[@]}"
lr_fix dtype-bf16/swiglu_k2_cap1_score_static swiglu_k2_cap1_score_static --dtype bf16 "${T[@]}"
lr_fix dtype-bf16/cosine_gelu_k2_dynamic cosine_gelu_k2_dynamic --dtype bf16 "${T[@]}"
lr_fix dtype-f32/bf16/silu_k3_dynamic bf16/silu_k3_dynamic --dtype f32 "${T[@]}"
lr_fix out-bf16/relu_k2_cap1_score_static relu_k2_cap1_score_static --out-dtype bf16 "${T[@]}"
lr_fix out-bf16/bf16/drops_swiglu_k2_cap075_score_static bf16/drops_swiglu_k2_cap075_score_static --out-dtype bf16 "${T[@]}"
for t in 1 3; do # serial, and more tiles than cores
  lr_fix threads-$t/swiglu_k3_cap1_index_dynamic swiglu_k3_cap1_index_dynamic --threads $t
  lr_fix threads-$t/drops_silu_k2_cap05_score_static drops_silu_k2_cap05_score_static --threads $t
  lr_fix threads-$t/bf16/odd_gelu_k3_capneg_index_static bf16/odd_gelu_k3_capneg_index_static --threads $t
done

# --- layer-run on E = 8, T = 37 (no dspec: any top_k) -------------------------------------------
SYN=$WORK/synth
mkdir -p "$SYN" && python3 "$PY" gen "$SYN" || exit 2
lr_syn() { # NAME WEIGHTS NP ARGS...
  local name=$1 w=$2 np=$3
  shift 3
  check "layer8/$name" "$np" "${LR[@]}" --weights "$SYN/w_$w.safetensors" --input "$SYN/x.safetensors" "$@"
}
for w in gelu swiglu cosine; do
  for k in 1 2 3; do
    lr_syn $w-k$k-dynamic $w 1 --top_k $k --dispatch dynamic "${T[@]}"
    lr_syn $w-k$k-static $w 1 --top_k $k --dispatch static "${T[@]}"
  done
  lr_syn $w-static-score-cap0.5 $w 1 --dispatch static --priority score --capacity_setting 0.5 "${T[@]}"
  lr_syn $w-static-index-capneg $w 1 --dispatch static --priority index --capacity_setting -1.5 "${T[@]}"
  lr_syn $w-expert-capacity $w 1 --dispatch static --expert-capacity 3,0,9,2,5,1,7,4 "${T[@]}"
  lr_syn $w-bf16 $w 1 --dtype bf16 --out-dtype bf16 "${T[@]}"
done

# --- expert-parallel under mpirun (ranks take uneven token slices: 37 tokens) --------------------
EP=(--expert-parallel --threads 1)
for w in gelu swiglu cosine; do
  for disp in dynamic static; do
    lr_syn ep/$w-$disp-np1 $w 1 "${EP[@]}" --dispatch $disp
    lr_syn ep/$w-$disp-np2-linear $w 2 "${EP[@]}" --dispatch $disp --a2a linear
    [ $w = cosine ] || lr_syn ep/$w-$disp-np4-linear $w 4 "${EP[@]}" --dispatch $disp --a2a linear
    lr_syn ep/$w-$disp-np4-2dh $w 4 "${EP[@]}" --dispatch $disp --a2a 2dh --ranks-per-node 2
  done
done
lr_syn ep/gelu-k3-score-np2 gelu 2 "${EP[@]}" --top_k 3 --dispatch static --priority score
lr_syn ep/gelu-bf16-np2 gelu 2 "${EP[@]}" --dtype bf16
for np in 2 4; do
  lr_syn ep/swiglu-expert-capacity-np$np swiglu $np "${EP[@]}" --expert-capacity 3,0,9,2,5,1,7,4
done
echo '{"devices": 2, "method": "greedy", "layers": [{"layer": 0, "expert_device": [1, 0, 0, 1, 1, 0, 1, 0]}]}' \
  >"$SYN/placement.json"
lr_syn ep/gelu-placement-np2 gelu 2 "${EP[@]}" --placement "$SYN/placement.json"
for g in 2 3; do # 2DH on uneven grids: 3 nodes of 2, 2 nodes of 3
  check "layer/ep/swiglu_k3_cap1_index_dynamic-np6-2dh-g$g" 6 "${LR[@]}" "${EP[@]}" --a2a 2dh --ranks-per-node $g \
    --weights "$FIX/swiglu_k3_cap1_index_dynamic/w.safetensors" --input "$FIX/swiglu_k3_cap1_index_dynamic/x.safetensors"
done

# --- moe train: checkpoints byte for byte, per-step losses ------------------------------------------
DATA=$WORK/mnist
if [ ! -f "$MNIST/train-images-idx3-ubyte" ]; then
  echo "bitcheck: no MNIST in $MNIST: run scripts/get-mnist.sh (or set BITCHECK_MNIST)" >&2
  exit 2
fi
python3 "$PY" subset "$MNIST" "$DATA" 512 200 || exit 2
TR=(train --data "$DATA" --experts 4 --top-k 2 --hidden 32 --model 32 --blocks 2 --batch 32 --augment 1 --json
    --log-steps)
train() { # NAME NP ARGS...: one-process runs write a checkpoint (mpirun refuses one)
  local name=$1 np=$2
  shift 2
  if [ "$np" -gt 1 ]; then check "train/$name" "$np" "${TR[@]}" --threads 1 "$@"
  else check "train/$name" 1 "${TR[@]}" --threads "$THREADS" --checkpoint ck.safetensors "$@"; fi
}
train default 1 --epochs 2
train dispatch-static 1 --epochs 2 --dispatch static --capacity 1.0
train dispatch-static-cap0.5-score 1 --epochs 2 --dispatch static --capacity 0.5 --priority score
# --delta-launch 0: every step's counts reach the trigger (with more, newer counts supersede older
# ones as timing has it, and the capacities, hence the bits, vary from run to run)
train capacity-dynamic 1 --epochs 2 --capacity dynamic --delta-launch 0
train cache-assignments 1 --epochs 3 --cache-assignments --cache-on 0 --cache-min-epoch 1
train hier 1 --epochs 2 --hier-experts 4 --hier-top-k 1
train hier-k2-static 1 --epochs 2 --hier-experts 4 --hier-top-k 2 --dispatch static --capacity 1.0
train loss-specification 1 --epochs 2 --loss specification
train router-cosine 1 --epochs 2 --router cosine
train dtype-bf16 1 --epochs 2 --dtype bf16
train priority-score 1 --epochs 2 --priority score --dispatch static --capacity 0.75
train swiglu-k1 1 --epochs 2 --activation swiglu --top-k 1
train sgd-stop-after 1 --epochs 3 --stop-after 1 --optimizer sgd --momentum 0.9
train np2-default 2 --epochs 2
train np2-static 2 --epochs 2 --dispatch static --capacity 1.0
train np2-cache-assignments 2 --epochs 3 --cache-assignments --cache-on 0 --cache-min-epoch 1
train np2-capacity-dynamic 2 --epochs 2 --capacity dynamic --delta-launch 0
train np2-bf16-cosine 2 --epochs 2 --dtype bf16 --router cosine

# --- moe infer on the checkpoints of two train cases (REF's, so NEW reads the same bytes) --------
for ck in default:bf16 dtype-bf16:f32; do
  flip=${ck#*:} ck=${ck%:*}
  CK=$WORK/cases/train/$ck/ref/ck.safetensors
  [ -f "$CK" ] || continue # filtered out by BITCHECK_ONLY, or it failed (reported above)
  IN=(infer --checkpoint "$CK" --data "$DATA" --batch 16 --json --trace trace.csv --threads "$THREADS")
  check "infer/$ck" 1 "${IN[@]}"
  for pol in lifo lru; do
    check "infer/$ck-cache2-$pol" 1 "${IN[@]}" --cache 2 --policy $pol
    check "infer/$ck-cache2-$pol-as-$flip" 1 "${IN[@]}" --cache 2 --policy $pol --dtype "$flip"
  done
done

echo "bitcheck: $NCASES cases, $NBAD differ or fail (work dir $WORK)"
[ "$NBAD" = 0 ]
