#!/usr/bin/python3
"""Check that a `moe train` checkpoint loads in PyTorch and is the same model there.

What it checks:
  1. The safetensors file, parsed here (8-byte little-endian header length, JSON header, raw data;
     no `safetensors` package): every tensor becomes a torch tensor of its stored dtype (F32 ->
     torch.float32, BF16 -> torch.bfloat16 read as raw little-endian bits, I32/I64 likewise). The
     parameters the metadata's configuration implies are all there with their shapes and dtypes: the
     expert matrices blocks.N.moe.experts.fc*.weight are BF16 when __metadata__ says "dtype": "bf16",
     F32 otherwise, and everything else is F32. When the training checkpoint holds the fp32 masters
     (master.<name>), each BF16 matrix must be bit for bit PyTorch's own rounding of its master
     (`master.to(torch.bfloat16)`): the bytes are the bf16 values PyTorch itself would write.
  2. The model's forward pass, reimplemented in PyTorch from the metadata and the tensors (src/model/model.c,
     DESIGN 4.1): h = in(x); L pre-norm blocks h = h + MoE(LayerNorm(h)); the final LayerNorm; the head;
     the prediction is the first largest logit. The MoE layer: linear or cosine router, softmax, top-k
     with ties to the lower expert id, normalize_topk, capacity and drops under static dispatch
     (slot-major placement, priority index or score), experts with relu, gelu (erf), silu or swiglu.
     With dtype bf16 the experts compute as the C side does: their inputs and the activation h rounded
     to bf16 before each GEMM, the stored bf16 weights, fp32 accumulation, fp32 biases; the rest fp32.
     Hierarchical MoE (inner_experts > 0) and per-expert capacities (--capacity dynamic) are refused.
  3. The test split (t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte in IDX format, pixels / 255, as
     src/formats/idx.c reads them) in batches of --batch (capacity depends on the batch, as in `moe eval`),
     and the test accuracy. With --moe, `moe eval` on the same checkpoint, data and batch must print
     the same accuracy. A few differing predictions are accepted only when at most as many samples are
     near ties (top-2 logit margin or a routing probability gap below NEAR_TIE), where bf16 rounding
     noise can flip a decision.
  4. With --moe also each block's MoE layer against `moe layer-run` (DESIGN 4.2) on that block's input
     for the first batch, as PyTorch computes it: the block's tensors and layer options written to a
     temporary safetensors file. The outputs y must agree within LAYER_RTOL (relative Frobenius error)
     over the tokens that are not near a routing tie. Accuracy alone cannot tell the bf16 expert
     semantics from fp32 ones (rounding h or not changes no prediction of a small MNIST model); this
     check can: leaving out the bf16 rounding of h costs about 1e-3, while the C side and this script
     agree to about 1e-6.

Usage: /usr/bin/python3 dev/check_checkpoint_torch.py CHECKPOINT --data DIR [--moe build/moe] [--batch 500]
Exit status: 0 when everything checks (and the accuracies agree), 1 when a check fails, 2 when the file
cannot be checked (unreadable, not a libmoe checkpoint, a configuration this script does not implement).
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
LN_EPS = float(np.float32(1e-5))           # MOE_LN_EPS, a float constant, promoted to double
COS_EPS = float(np.float32(1e-12))         # the cosine router's norm floor
LOG_MAX_SCALE = float(np.float32(math.log(100.0)))  # the cosine logit scale is clamped at 100
SQRT1_2 = float(np.float32(math.sqrt(0.5)))  # sources/ffn.c's float constant in the GELU
NEAR_TIE = 1e-3  # margins below this may flip between implementations under bf16 rounding noise
LAYER_RTOL = 1e-4  # moe layer-run's y against this script's, relative Frobenius error
LAYER_META = ("top_k", "capacity_setting", "normalize_topk", "activation", "dispatch", "priority", "router",
              "dtype")
EXPERT_MATRIX = re.compile(r"blocks\.\d+\.moe\.experts\.fc\d\.weight")


class Unsupported(Exception):
    """The file cannot be checked: unreadable, not a checkpoint, or a configuration not implemented."""


class Mismatch(Exception):
    """A check failed."""


def read_safetensors(path):
    """Returns (metadata dict, {name: tensor}, {name: stored dtype string})."""
    if sys.byteorder != "little":
        raise Unsupported("safetensors data is little-endian; this reader needs a little-endian host")
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Unsupported(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise Unsupported(f"{path}: header length {n} runs past the end of the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise Unsupported(f"{path}: the safetensors header is not JSON ({e})") from None
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors, dtypes = {}, {}
    for name, info in header.items():
        dt = ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise Unsupported(f"{path}: tensor '{name}' has dtype {info['dtype']}, not one this reader knows")
        shape, (lo, hi) = info["shape"], info["data_offsets"]
        size = math.prod(shape) * torch.empty(0, dtype=dt).element_size()
        if not 0 <= lo <= hi <= len(data) or hi - lo != size:
            raise Unsupported(f"{path}: tensor '{name}': data_offsets [{lo}, {hi}] do not hold "
                              f"{shape} {info['dtype']}")
        flat = torch.frombuffer(bytearray(data[lo:hi]), dtype=dt) if size else torch.empty(0, dtype=dt)
        tensors[name] = flat.reshape(shape)
        dtypes[name] = info["dtype"]
    return meta, tensors, dtypes


def write_safetensors(path, tensors, meta):
    """F32 and BF16 tensors, the larger element size first so that every offset is aligned."""
    names = sorted(tensors, key=lambda n: -tensors[n].element_size())
    header, blobs, off = {"__metadata__": meta}, [], 0
    for n in names:
        t = tensors[n].contiguous()
        blob = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        dtype = next(k for k, v in ST_DTYPES.items() if v == t.dtype)
        header[n] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@dataclass
class Config:
    """The model configuration from a checkpoint's __metadata__ (defaults as moe_layer_config_default)."""
    in_dim: int
    classes: int
    blocks: int
    D: int
    H: int
    E: int
    proj_dim: int
    gate_bias: bool
    expert_bias: bool
    top_k: int
    capacity_setting: float
    normalize_topk: bool
    activation: str
    dispatch: str
    priority: str
    router: str
    dtype: str

    @classmethod
    def from_meta(cls, meta, path):
        if meta.get("format") != "libmoe-checkpoint-1":
            raise Unsupported(f"{path}: __metadata__ format is {meta.get('format')!r}, "
                              "not a libmoe checkpoint")
        try:
            need = {k: int(meta[k]) for k in ("in_dim", "classes", "blocks", "D", "H", "E", "proj_dim")}
            bias = {k: int(meta[k]) != 0 for k in ("gate_bias", "expert_bias")}
            inner = int(meta.get("inner_experts", "0"))
            top_k = int(meta.get("top_k", "2"))
        except (KeyError, ValueError) as e:
            raise Unsupported(f"{path}: __metadata__: missing or bad integer ({e})") from None
        if inner > 0:
            raise Unsupported(f"{path}: hierarchical MoE (inner_experts={inner}) is not implemented here")
        if any(k.endswith(".expert_capacity_tokens") for k in meta):
            raise Unsupported(f"{path}: per-expert capacities (--capacity dynamic) are not implemented here")
        norm = meta.get("normalize_topk")
        c = cls(**need, **bias, top_k=top_k,
                capacity_setting=float(np.float32(meta.get("capacity_setting", "1"))),
                normalize_topk=top_k > 1 if norm is None else norm == "true",
                activation=meta.get("activation", "relu"), dispatch=meta.get("dispatch", "dynamic"),
                priority=meta.get("priority", "index"), router=meta.get("router", "linear"),
                dtype=meta.get("dtype", "f32"))
        for field, allowed in (("activation", ("relu", "gelu", "silu", "swiglu")),
                               ("dispatch", ("dynamic", "static")), ("priority", ("index", "score")),
                               ("router", ("linear", "cosine")), ("dtype", ("f32", "bf16"))):
            if getattr(c, field) not in allowed:
                raise Unsupported(f"{path}: __metadata__ {field}={getattr(c, field)!r} "
                                  f"is not one of {allowed}")
        return c

    def expected_tensors(self):
        """{name: (shape, stored dtype)} of every parameter, as moe_model_init lays them out."""
        D, H, E, P = self.D, self.H, self.E, self.proj_dim
        ew = "BF16" if self.dtype == "bf16" else "F32"
        want = {"in.weight": ((D, self.in_dim), "F32"), "in.bias": ((D,), "F32")}
        for i in range(self.blocks):
            b = f"blocks.{i}."
            want[b + "norm.weight"] = ((D,), "F32")
            want[b + "norm.bias"] = ((D,), "F32")
            m = b + "moe."
            if self.router == "linear":
                want[m + "gate.weight"] = ((E, D), "F32")
                if self.gate_bias:
                    want[m + "gate.bias"] = ((E,), "F32")
            else:
                want[m + "gate.weight"] = ((E, P), "F32")
                want[m + "gate.proj.weight"] = ((P, D), "F32")
                want[m + "gate.proj.bias"] = ((P,), "F32")
                want[m + "gate.logit_scale"] = ((1,), "F32")
            want[m + "experts.fc1.weight"] = ((E, H, D), ew)
            want[m + "experts.fc2.weight"] = ((E, D, H), ew)
            if self.expert_bias:
                want[m + "experts.fc1.bias"] = ((E, H), "F32")
                want[m + "experts.fc2.bias"] = ((E, D), "F32")
            if self.activation == "swiglu":
                want[m + "experts.fc3.weight"] = ((E, H, D), ew)
        want["norm.weight"] = ((D,), "F32")
        want["norm.bias"] = ((D,), "F32")
        want["head.weight"] = ((self.classes, D), "F32")
        want["head.bias"] = ((self.classes,), "F32")
        return want


def check_tensors(cfg, tensors, dtypes):
    """Shapes and dtypes of the parameters; the BF16 expert matrices against their fp32 masters."""
    for name, (shape, dt) in cfg.expected_tensors().items():
        if name not in tensors:
            raise Mismatch(f"tensor '{name}' is missing")
        if tuple(tensors[name].shape) != shape or dtypes[name] != dt:
            raise Mismatch(f"tensor '{name}' is {dtypes[name]} {list(tensors[name].shape)}, "
                           f"want {dt} {list(shape)}")
    matrices = sorted(n for n in tensors if EXPERT_MATRIX.fullmatch(n))
    print(f"expert matrices: {len(matrices)}, stored as {sorted({dtypes[n] for n in matrices})} "
          f"(__metadata__ dtype={cfg.dtype}): ok")
    if cfg.dtype != "bf16":
        return
    with_master = [n for n in matrices if "master." + n in tensors]
    for n in with_master:
        mine = tensors["master." + n].to(torch.bfloat16).view(torch.int16)
        if not torch.equal(tensors[n].view(torch.int16), mine):
            bad = int((tensors[n].view(torch.int16) != mine).sum())
            raise Mismatch(f"'{n}': {bad} stored bf16 values differ from PyTorch's rounding of master.{n}")
    if with_master:
        print(f"BF16 bits: {len(with_master)} of {len(matrices)} expert matrices equal "
              "master.<name>.to(torch.bfloat16) bit for bit: ok")
    else:
        print("BF16 bits: no fp32 masters in the file (not a training checkpoint): "
              "rounding not cross-checked")


def bf16_round(t):
    return t.to(torch.bfloat16).float()


def layer_norm(x, g, b):
    """As src/kernels/norm.c: row statistics in double, the normalization in float."""
    xd = x.double()
    mu = xd.mean(dim=1, keepdim=True)
    rstd = (1.0 / torch.sqrt(((xd - mu) ** 2).mean(dim=1, keepdim=True) + LN_EPS)).float()
    return ((x - mu.float()) * rstd) * g + b


def router_logits(cfg, p, x):
    if cfg.router == "linear":
        logits = x @ p["gate.weight"].T
        return logits + p["gate.bias"] if cfg.gate_bias else logits

    def unit_rows(a):
        n = torch.sqrt((a.double() ** 2).sum(dim=1, keepdim=True)).float()
        return a * (1.0 / torch.clamp(n, min=COS_EPS))

    proj = unit_rows(x @ p["gate.proj.weight"].T + p["gate.proj.bias"])
    scale = torch.exp(torch.clamp(p["gate.logit_scale"], max=LOG_MAX_SCALE))
    return scale * (proj @ unit_rows(p["gate.weight"]).T)


def capacity(cfg, T, maxc):
    """placement.c's capacity(): C from capacity_setting x, k, T and the largest per-expert count."""
    x = cfg.capacity_setting
    if cfg.dispatch == "dynamic" or x == 0:
        return maxc
    v = abs(x) * cfg.top_k * T / cfg.E
    r = round(v)  # nearbyint: ties to even, as Python's round
    if abs(v - r) <= 1e-6 * max(1.0, r):
        v = r
    c = min(math.ceil(v), T)
    return c if x > 0 or c < maxc else maxc


def kept_assignments(cfg, top_e, top_p):
    """(T, k) bool: the assignments that find room, placed slot-major in priority order."""
    T, k = top_e.shape
    if cfg.dispatch == "dynamic":
        return torch.ones_like(top_e, dtype=torch.bool)
    counts = torch.bincount(top_e.flatten(), minlength=cfg.E)
    C = capacity(cfg, T, int(counts.max()))
    order = torch.arange(T)
    if cfg.priority == "score":  # highest top probability first, ties to the lower token
        order = torch.sort(top_p[:, 0], descending=True, stable=True).indices
    kept = torch.empty_like(top_e, dtype=torch.bool)
    fill = torch.zeros(cfg.E, dtype=torch.int64)
    for j in range(k):
        e = top_e[order, j]
        onehot = F.one_hot(e, cfg.E)
        # assignments to the same expert earlier in slot j's order
        before = (onehot.cumsum(0) - onehot).gather(1, e[:, None]).squeeze(1)
        kept[order, j] = fill[e] + before < C
        fill += onehot.sum(0)
    return kept


def activation(cfg, a1, a3):
    if cfg.activation == "relu":
        return torch.relu(a1)
    if cfg.activation == "gelu":
        # the erf GELU as sources/ffn.c writes it: F.gelu differs in the last bit for most inputs, and
        # under bf16 that moves some 0.5% of h to the neighbouring bf16 value
        return 0.5 * a1 * (1.0 + torch.erf(a1 * SQRT1_2))
    if cfg.activation == "silu":
        return F.silu(a1)
    return F.silu(a1) * a3


def moe_layer(cfg, p, x):
    """DESIGN 4.1 forward of one layer on x (T, D). Returns y and each token's smallest routing gap
    (prob of its k-th choice minus the next one; inf when k = E)."""
    T, k, bf = x.shape[0], cfg.top_k, cfg.dtype == "bf16"
    logits = router_logits(cfg, p, x)
    probs = torch.softmax(logits.double(), dim=1).float()
    ranked = torch.sort(probs, dim=1, descending=True, stable=True)  # stable: ties to the lower id
    top_e, top_p = ranked.indices[:, :k], ranked.values[:, :k]
    gap = ranked.values[:, k - 1] - ranked.values[:, k] if k < cfg.E else torch.full((T,), math.inf)
    weights = top_p / top_p.sum(dim=1, keepdim=True) if cfg.normalize_topk else top_p
    kept = kept_assignments(cfg, top_e, top_p)
    xin = bf16_round(x) if bf else x
    w1, w2 = p["experts.fc1.weight"].float(), p["experts.fc2.weight"].float()  # bf16 values, exactly
    w3 = p["experts.fc3.weight"].float() if cfg.activation == "swiglu" else None
    out = torch.zeros(T, k, cfg.D)
    for e in range(cfg.E):
        tok, slot = torch.nonzero((top_e == e) & kept, as_tuple=True)
        if len(tok) == 0:
            continue
        xs = xin[tok]
        a1 = xs @ w1[e].T
        if cfg.expert_bias:
            a1 = a1 + p["experts.fc1.bias"][e]
        h = activation(cfg, a1, xs @ w3[e].T if w3 is not None else None)
        o = (bf16_round(h) if bf else h) @ w2[e].T
        out[tok, slot] = o + p["experts.fc2.bias"][e] if cfg.expert_bias else o
    y = torch.zeros(T, cfg.D)
    for j in range(k):  # slot order, as the combine sums
        y = y + weights[:, j:j + 1] * out[:, j]
    return y, gap


def block_params(t, i):
    """Block i's MoE tensors under the layer's own names (gate.weight, experts.fc1.weight, ...)."""
    prefix = f"blocks.{i}.moe."
    return {n[len(prefix):]: v for n, v in t.items() if n.startswith(prefix)}


def model_forward(cfg, t, x):
    """Logits (B, classes), each sample's smallest routing gap over the blocks, and per block its MoE
    layer's input, output and routing gaps."""
    h = x @ t["in.weight"].T + t["in.bias"]
    gap = torch.full((x.shape[0],), math.inf)
    blocks = []
    for i in range(cfg.blocks):
        xn = layer_norm(h, t[f"blocks.{i}.norm.weight"], t[f"blocks.{i}.norm.bias"])
        y, g = moe_layer(cfg, block_params(t, i), xn)
        blocks.append((xn, y, g))
        h = y + h
        gap = torch.minimum(gap, g)
    return layer_norm(h, t["norm.weight"], t["norm.bias"]) @ t["head.weight"].T + t["head.bias"], gap, blocks


def read_idx(path, magic, ndim):
    with open(path, "rb") as f:
        raw = f.read()
    hdr = 4 + 4 * ndim
    if len(raw) < hdr:
        raise Unsupported(f"{path}: {len(raw)} bytes, shorter than the {hdr}-byte IDX header")
    found, *dims = struct.unpack(f">{1 + ndim}I", raw[:hdr])
    if found != magic:
        raise Unsupported(f"{path}: bad magic 0x{found:08x}, expected 0x{magic:08x}")
    if min(dims) == 0:
        raise Unsupported(f"{path}: dimensions {dims}: every one must be positive")
    if len(raw) != hdr + math.prod(dims):
        raise Unsupported(f"{path}: {len(raw)} bytes, expected {hdr + math.prod(dims)} for dimensions {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=hdr).reshape(dims)


def load_test_split(data_dir):
    """Images (n, rows * cols) as float32 pixel / 255 and labels (n), as src/formats/idx.c loads them."""
    images = read_idx(f"{data_dir}/t10k-images-idx3-ubyte", 0x00000803, 3)
    labels = read_idx(f"{data_dir}/t10k-labels-idx1-ubyte", 0x00000801, 1)
    if images.shape[0] != labels.shape[0]:
        raise Unsupported(f"{data_dir}: {images.shape[0]} test images but {labels.shape[0]} labels")
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255)
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


def run_moe(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Mismatch(f"{' '.join(cmd)} failed (exit {r.returncode}): "
                       f"{r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def moe_eval_accuracy(moe, checkpoint, data_dir, batch):
    cmd = [moe, "eval", "--checkpoint", checkpoint, "--data", data_dir, "--batch", str(batch)]
    m = re.search(r"^test_accuracy=([0-9.]+)$", run_moe(cmd), re.M)
    if not m:
        raise Mismatch(f"{' '.join(cmd)} printed no test_accuracy=")
    return m.group(1)


def compare_layers(moe, meta, t, blocks):
    """Each block's y from `moe layer-run` on the block input against this script's."""
    layer_meta = {k: meta[k] for k in LAYER_META if k in meta}
    with tempfile.TemporaryDirectory() as tmp:
        w, x, out = (os.path.join(tmp, n) for n in ("w.safetensors", "x.safetensors", "out.safetensors"))
        for i, (xn, y, gap) in enumerate(blocks):
            write_safetensors(w, block_params(t, i), layer_meta)
            write_safetensors(x, {"x": xn}, {})
            run_moe([moe, "layer-run", "--weights", w, "--input", x, "--out", out])
            y_c = read_safetensors(out)[1]["y"]
            sure = gap >= NEAR_TIE
            err = float((y_c - y)[sure].norm() / y[sure].norm().clamp(min=1e-30))
            print(f"block {i}: moe layer-run y vs pytorch, {int(sure.sum())} of {len(sure)} tokens "
                  f"(the rest near a routing tie): relative error {err:.2e}")
            if err > LAYER_RTOL:
                raise Mismatch(f"block {i}: the MoE layer's output differs from moe layer-run's by {err:.2e} "
                               f"(relative), more than {LAYER_RTOL:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--data", required=True,
                    help="directory with t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte")
    ap.add_argument("--moe", help="the moe binary: compare with `moe layer-run` and `moe eval`")
    ap.add_argument("--batch", type=int, default=500,
                    help="tokens per forward, as moe eval --batch (default 500)")
    args = ap.parse_args()
    if args.batch <= 0:
        ap.error("--batch must be > 0")
    try:
        meta, tensors, dtypes = read_safetensors(args.checkpoint)
        cfg = Config.from_meta(meta, args.checkpoint)
        print(f"{args.checkpoint}: {cfg}")
        check_tensors(cfg, tensors, dtypes)
        x, labels = load_test_split(args.data)
        if x.shape[1] != cfg.in_dim:
            raise Unsupported(f"the model takes {cfg.in_dim} features, the data has {x.shape[1]}")
        params = {n: t for n, t in tensors.items() if n in cfg.expected_tensors()}
        hits = near_ties = 0
        first_blocks = []
        with torch.no_grad():
            for s in range(0, x.shape[0], args.batch):
                logits, gap, blocks = model_forward(cfg, params, x[s:s + args.batch])
                first_blocks = first_blocks or blocks
                top2 = torch.topk(logits, 2, dim=1).values
                hits += int((logits.argmax(dim=1) == labels[s:s + args.batch]).sum())
                near_ties += int(((top2[:, 0] - top2[:, 1] < NEAR_TIE) | (gap < NEAR_TIE)).sum())
        n = x.shape[0]
        torch_acc = f"{hits / n:.4f}"
        print(f"pytorch: test_accuracy={torch_acc} ({hits}/{n}; {near_ties} near ties below {NEAR_TIE:g})")
        if not args.moe:
            return 0
        compare_layers(args.moe, meta, params, first_blocks)
        moe_acc = moe_eval_accuracy(args.moe, args.checkpoint, args.data, args.batch)
        print(f"moe eval: test_accuracy={moe_acc}")
        differ = round(abs(float(moe_acc) - hits / n) * n)
        if moe_acc == torch_acc:
            print("agree: ok")
        elif differ <= near_ties:
            print(f"agree within near ties: about {differ} prediction(s) differ, "
                  f"{near_ties} sample(s) are near ties: ok")
        else:
            raise Mismatch(f"accuracies differ: pytorch {torch_acc}, moe eval {moe_acc} "
                           f"(about {differ} predictions, only {near_ties} near ties)")
        return 0
    except (Unsupported, OSError) as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return 2
    except Mismatch as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
