#!/usr/bin/python3
"""Generate the PyTorch reference fixtures of libmoe's MoE layer in bf16 expert mode.

For every case below this writes into <outdir>/<case>/ the three files of dev/gen_fixtures.py, with
these differences:
  w.safetensors    experts.fc1.weight, experts.fc2.weight, experts.fc3.weight are stored as BF16 (raw
                   bfloat16 bits, little-endian); the router and the biases stay F32; __metadata__ holds
                   gen_fixtures' options plus "dtype": "bf16";
  x.safetensors    x, dy, daux, dz, dspec as F32, except that case xbf16_* stores x as BF16;
  ref.safetensors  the same names as gen_fixtures' (y, aux_loss, z_loss, spec, expert_counts, dropped,
                   capacity, grad.x, grad.<weight>), F32/I32; the weight gradients are those of the fp32
                   master weights, which equal their bf16 copies here; and fp32.y, fp32.grad.x: the
                   fp32 layer's (DESIGN 4.1) on the same stored weights and inputs.
Inputs are drawn as gen_fixtures draws them, then the expert weights (and x in xbf16_*) are rounded to
bfloat16 and those values are what is stored and what the reference uses.

Semantics (the C side implements exactly this): the router, softmax, top-k, capacity, drops, aux and z
losses and the combine are gen_fixtures' fp32 semantics. Only the expert FFNs change. With
bf(t) = t.to(torch.bfloat16).to(t.dtype) (round to nearest even; a float64 value is rounded to float32
first, as the C side holds it), per expert e over the rows xs routed to it:
  forward   xb = bf(xs), Wib = bf(Wi_e);  a1 = xb W1b^T + b1;  h = act(a1)  (swiglu: a3 = xb W3b^T,
            h = silu(a1) * a3);  hb = bf(h);  out = hb W2b^T + b2;  y = the combine of out.
  backward  dout = cotangent of out (combine weight * dy + the spec cotangent);  doutb = bf(dout);
            dW2 = doutb^T hb;  db2 = sum dout;  dh = doutb W2b;  da1 = dh * act'(a1)  (swiglu:
            da1 = dh * a3 * silu'(a1), da3 = dh * silu(a1));  db1 = sum da1;  da1b = bf(da1),
            da3b = bf(da3);  dW1 = da1b^T xb, dW3 = da3b^T xb;  dxs = da1b W1b (+ da3b W3b);
            grad.x = the router's fp32 gradient + dxs scattered back to the tokens.
The biases, db1, db2 and the activation's argument a1 are never rounded. Everything after the rounding
points is computed in float64 and stored as float32. Rerunning gives identical bytes.

Self-checks run on every case: with bf the identity the reference equals gen_fixtures'
moe_reference_grads; the rounded expert pass written out per expert over its routed rows matches the
autograd one; routing margins as in gen_fixtures. Each case prints the bf16-vs-fp32 relative differences
of y, grad.x and the expert weight gradients (same stored weights on both sides).

Usage: /usr/bin/python3 dev/gen_bf16_fixtures.py [outdir]   (default: <repo>/tests/fixtures/bf16)
"""
import contextlib
import json
import math
import os
import struct
import sys
from fractions import Fraction

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as G  # noqa: E402

BF16_WEIGHTS = ("experts.fc1.weight", "experts.fc2.weight", "experts.fc3.weight")


def bf(t):
    """Round to bfloat16 (nearest even) and back to t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


def identity(t):
    return t


# ----------------------------------------------------------------------------------------------
# the bf16 expert pass


class RoundedMatmul(torch.autograd.Function):
    """rnd(a) @ rnd(b); backward rounds the incoming gradient g: grad_a = rnd(g) rnd(b)^T,
    grad_b = rnd(a)^T rnd(g). Batched over a leading dimension, no broadcasting."""

    @staticmethod
    def forward(ctx, a, b, rnd):
        ar, br = rnd(a), rnd(b)
        ctx.save_for_backward(ar, br)
        ctx.rnd = rnd
        return ar @ br

    @staticmethod
    def backward(ctx, g):
        ar, br = ctx.saved_tensors
        gr = ctx.rnd(g)
        return gr @ br.transpose(-1, -2), ar.transpose(-1, -2) @ gr, None


def expert_outputs_bf16(w, x, act, rnd=bf, alpha=None, limit=None):
    """gen_fixtures.expert_outputs with the bf16 rounding points of the docstring: (E, T, D), dense over
    all experts (rounding is per element, and unselected entries get zero cotangent). alpha, limit:
    swiglu_oai's."""
    E = w["experts.fc1.weight"].shape[0]
    xe = x.expand(E, *x.shape)

    def mm(a, name):  # a (E, T, n) times the transpose of weight (E, m, n)
        return RoundedMatmul.apply(a, w[name].transpose(1, 2), rnd)

    a1 = mm(xe, "experts.fc1.weight")
    if "experts.fc1.bias" in w:
        a1 = a1 + w["experts.fc1.bias"][:, None, :]
    if act == "relu":
        h = F.relu(a1)
    elif act == "gelu":
        h = F.gelu(a1)  # exact (erf) GELU
    elif act == "silu":
        h = F.silu(a1)
    elif act == "swiglu":
        h = F.silu(a1) * mm(xe, "experts.fc3.weight")
    elif act == "swiglu_oai":
        a3 = mm(xe, "experts.fc3.weight")
        if "experts.fc3.bias" in w:
            a3 = a3 + w["experts.fc3.bias"][:, None, :]
        h = G.swiglu_oai(a1, a3, alpha, limit)
    else:
        raise ValueError(act)
    out = mm(h, "experts.fc2.weight")
    if "experts.fc2.bias" in w:
        out = out + w["experts.fc2.bias"][:, None, :]
    return out


@contextlib.contextmanager
def experts_from(fn):
    """Make gen_fixtures' moe_reference (and moe_reference_grads) compute the expert outputs with
    fn(w, x, act) in place of gen_fixtures.expert_outputs."""
    saved = G.expert_outputs
    G.expert_outputs = fn
    try:
        yield
    finally:
        G.expert_outputs = saved


def bf16_reference_grads(w, x, cfg, dy, daux, dz, dspec, rnd=bf):
    """gen_fixtures.moe_reference_grads with the bf16 expert pass (rnd = identity gives the fp32 one)."""
    with experts_from(lambda w_, x_, act, **oai: expert_outputs_bf16(w_, x_, act, rnd, **oai)):
        return G.moe_reference_grads(w, x, cfg, dy, daux, dz, dspec)


# ----------------------------------------------------------------------------------------------
# self-checks


def max_diff(a, b):
    """Largest |a - b|, relative to max(1, largest |b|)."""
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max())) if b.numel() else 0.0


def rel_norm(a, b):
    return float((a - b).norm() / b.norm())


def check_identity(w, x, cfg, dy, daux, dz, dspec):
    """With bf replaced by the identity the bf16 reference is gen_fixtures' fp32 one. Returns the
    largest difference over y, the losses, spec and every gradient."""
    r1, g1 = bf16_reference_grads(w, x, cfg, dy, daux, dz, dspec, rnd=identity)
    r0, g0 = G.moe_reference_grads(w, x, cfg, dy, daux, dz, dspec)
    err = max(max_diff(r1[n].detach(), r0[n].detach()) for n in ("y", "aux_loss", "z_loss", "spec"))
    err = max([err] + [max_diff(g1[n], g0[n]) for n in g0])
    assert err < 1e-12, f"identity-rounding check: {err}"
    return err, r0, g0


def act_and_derivative(act, a):
    """act(a) and act'(a) written out (for swiglu: silu and silu')."""
    if act == "relu":
        return torch.clamp_min(a, 0), (a > 0).to(a.dtype)
    if act == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(a / math.sqrt(2.0)))
        return a * cdf, cdf + a * torch.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)
    s = torch.sigmoid(a)
    return a * s, s * (1.0 + a * (1.0 - s))


def check_rows(w, x, cfg, r, grads, dy, daux, dz, dspec):
    """The bf16 expert pass of the docstring, per expert over its routed (kept) rows, against the
    autograd result: out against spec, every expert weight and bias gradient, and grad.x against the
    router's gradient (moe_reference with the expert outputs held constant) plus the scattered dxs."""
    T, D = x.shape
    k, act, oai = cfg["top_k"], cfg["activation"], G.oai_of(cfg)
    spec = r["spec"].detach().reshape(T, k, D)
    combine = r["combine"].detach()
    dsp = dspec.reshape(T, k, D)
    get = lambda n, e: w[n][e] if n in w else None  # noqa: E731
    dx = torch.zeros_like(x)
    err = 0.0
    for e in range(w["experts.fc1.weight"].shape[0]):
        t, j = ((r["topk_idx"] == e) & r["keep"]).nonzero(as_tuple=True)
        xb = bf(x[t])
        W1b, W2b = bf(w["experts.fc1.weight"][e]), bf(w["experts.fc2.weight"][e])
        b1, b2 = get("experts.fc1.bias", e), get("experts.fc2.bias", e)
        a1 = xb @ W1b.t() + (b1 if b1 is not None else 0.0)
        f, fp = act_and_derivative(act, a1)
        if act in ("swiglu", "swiglu_oai"):
            W3b, b3 = bf(w["experts.fc3.weight"][e]), get("experts.fc3.bias", e)
            a3 = xb @ W3b.t() + (b3 if b3 is not None else 0.0)
            h = f * a3
        else:
            h = f
        if act == "swiglu_oai":  # written out: the clamps' masks pass the bounds, as torch's clamp
            L, al = oai["limit"], oai["alpha"]
            g, u = torch.clamp(a1, max=L), torch.clamp(a3, -L, L)
            s = torch.sigmoid(al * g)
            f = g * s  # the gate part; h = (u + 1) f
            fp = (s + al * g * s * (1 - s)) * (a1 <= L).to(a1.dtype)
            h = (u + 1) * f
        hb = bf(h)
        out = hb @ W2b.t() + (b2 if b2 is not None else 0.0)
        err = max(err, max_diff(out, spec[t, j]))

        dout = combine[t, j, None] * dy[t] + dsp[t, j]
        doutb = bf(dout)
        dh = doutb @ W2b
        da1 = dh * (a3 * fp if act == "swiglu" else (u + 1) * fp if act == "swiglu_oai" else fp)
        da1b = bf(da1)
        mine = {"experts.fc2.weight": doutb.t() @ hb, "experts.fc2.bias": dout.sum(0),
                "experts.fc1.weight": da1b.t() @ xb, "experts.fc1.bias": da1.sum(0)}
        dxs = da1b @ W1b
        if act in ("swiglu", "swiglu_oai"):
            da3 = dh * f * ((a3.abs() <= oai["limit"]).to(a3.dtype) if oai else 1.0)
            da3b = bf(da3)
            mine["experts.fc3.weight"] = da3b.t() @ xb
            mine["experts.fc3.bias"] = da3.sum(0)
            dxs = dxs + da3b @ W3b
        for n, g in mine.items():
            if n in grads:
                err = max(err, max_diff(g, grads[n][e]))
        dx.index_add_(0, t, dxs)

    outs = expert_outputs_bf16(w, x, act, **oai).detach()
    with experts_from(lambda w_, x_, act_, **kw: outs):
        _, g_router = G.moe_reference_grads(w, x, cfg, dy, daux, dz, dspec)
    err = max(err, max_diff(g_router["x"] + dx, grads["x"]))
    assert err < 1e-10, f"per-row check: {err}"
    return err


# ----------------------------------------------------------------------------------------------
# cases and files


def case(name, seed, **kw):
    """gen_fixtures.case with T = 48 (a few rows per expert) and x_bf16 (store x as BF16) by default."""
    return G.case(name, seed, **dict(dict(T=48, x_bf16=False), **kw))


CASES = [
    case("relu_k2_cap1_index_static", 201, dispatch="static"),
    case("gelu_k1_dynamic", 202, act="gelu", k=1),
    case("silu_k3_dynamic", 203, act="silu", k=3),
    case("drops_swiglu_k2_cap075_score_static", 204, act="swiglu", cap="0.75", dispatch="static",
         priority="score"),
    case("cosine_gelu_k2_dynamic", 205, act="gelu", router="cosine"),
    case("nobias_silu_k2_cap1_score_static", 206, act="silu", bias=False, dispatch="static",
         priority="score"),
    case("xbf16_swiglu_k1_dynamic", 207, act="swiglu", k=1, x_bf16=True),
    case("odd_gelu_k3_capneg_index_static", 208, act="gelu", k=3, cap="-1.25", dispatch="static",
         T=41, D=10, H=14, E=5),
    case("swiglu_oai_k2_cap1_static", 209, act="swiglu_oai", dispatch="static", normalize=True, swiglu_limit="0.75"),
]

ST_CODES = {torch.float32: ("F32", "<f4"), torch.bfloat16: ("BF16", "<u2")}


def write_safetensors_bf16(path, tensors, metadata=None):
    """gen_fixtures.write_safetensors for (name, torch tensor) pairs of dtype float32 or bfloat16
    (stored as BF16: the raw bits). Every tensor must land aligned to its element size."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors:
        code, le = ST_CODES[t.dtype]
        raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        b = raw.numpy().astype(le).tobytes()
        assert off % t.element_size() == 0, f"{path}: {name} would be misaligned"
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def generate(c, outdir):
    cfg = G.cfg_of(c)
    w32, x32, dy32, daux32, dz32, dspec32 = G.make_inputs(c)
    w32 = {n: bf(t) if n in BF16_WEIGHTS else t for n, t in w32.items()}
    if c["x_bf16"]:
        x32 = bf(x32)
    d = lambda t: t.to(torch.float64)  # noqa: E731
    w = {n: d(t) for n, t in w32.items()}
    x, dy, dspec = d(x32), d(dy32), d(dspec32)
    daux, dz = float(daux32), float(dz32)

    r, grads = bf16_reference_grads(w, x, cfg, dy, daux, dz, dspec)

    # self-checks
    id_err, r0, g0 = check_identity(w, x, cfg, dy, daux, dz, dspec)
    with torch.no_grad():
        assert torch.equal(r0["topk_idx"], r["topk_idx"]) and torch.equal(r0["keep"], r["keep"])
    row_err = check_rows(w, x, cfg, r, grads, dy, daux, dz, dspec)
    lg, pg = G.routing_margins(r, cfg)
    assert lg > 1e-4 and pg > 2e-5, f"{c['name']}: routing too close to a tie ({lg}, {pg})"
    with torch.no_grad():  # the same routing when computed in float32, as the C side does
        r32 = G.moe_reference(w32, x32, cfg)
        assert torch.equal(r32["topk_idx"], r["topk_idx"]) and torch.equal(r32["keep"], r["keep"])
    if c["dispatch"] == "static" and Fraction(c["cap"]) > 0:
        assert r["dropped"] > 0, f"{c['name']}: static case with capacity {c['cap']} drops nothing"
    ey, ex = rel_norm(r["y"].detach(), r0["y"].detach()), rel_norm(grads["x"], g0["x"])
    ew = max(rel_norm(grads[n], g0[n]) for n in BF16_WEIGHTS if n in w)

    cd = os.path.join(outdir, c["name"])
    os.makedirs(cd, exist_ok=True)
    write_safetensors_bf16(os.path.join(cd, "w.safetensors"),
                           [(n, t.to(torch.bfloat16) if n in BF16_WEIGHTS else t) for n, t in w32.items()],
                           dict(G.metadata_of(c), dtype="bf16"))
    write_safetensors_bf16(os.path.join(cd, "x.safetensors"),
                           [("x", x32.to(torch.bfloat16) if c["x_bf16"] else x32), ("dy", dy32),
                            ("daux", daux32), ("dz", dz32), ("dspec", dspec32)])
    ref = G.reference_tensors(r, grads, w32) + [("fp32.y", G.f32(r0["y"])), ("fp32.grad.x", G.f32(g0["x"]))]
    G.write_safetensors(os.path.join(cd, "ref.safetensors"), ref)

    print(f"{c['name']:36s} T={c['T']:2d} D={c['D']:2d} H={c['H']:2d} E={c['E']} k={c['k']} "
          f"cap={c['cap']:>5s} {c['dispatch']:7s} C={r['capacity']:2d} dropped={r['dropped']:2d} "
          f"margins={lg:.1e}/{pg:.1e} | identity {id_err:.1e} rows {row_err:.1e} | "
          f"bf16 vs fp32: y {ey:.2e} grad.x {ex:.2e} grad.W {ew:.2e}")


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = argv[0] if argv else os.path.join(root, "tests", "fixtures", "bf16")
    torch.set_num_threads(1)  # one reduction order: identical bytes on every rerun
    os.makedirs(outdir, exist_ok=True)
    for c in CASES:
        generate(c, outdir)
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("Reference outputs and gradients of the MoE layer in bf16 expert mode (bf16 expert weights "
                "and GEMM operands, fp32 router), computed in float64 with PyTorch and stored as float32.\n"
                "Made by `/usr/bin/python3 dev/gen_bf16_fixtures.py` (python3-torch 1.13, numpy); "
                "rerunning gives identical bytes.\n")


if __name__ == "__main__":
    main(sys.argv[1:])
