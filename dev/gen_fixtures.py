#!/usr/bin/python3
"""Generate the PyTorch reference fixtures of libmoe's MoE layer (docs/DESIGN.md 4.1).

For every case below this writes three safetensors files into <outdir>/<case>/:
  w.safetensors    the layer's weights (F32) and its options in __metadata__
                   (top_k, capacity_setting, activation, normalize_topk, dispatch, priority, router);
  x.safetensors    the inputs: x (T,D), dy (T,D), daux (1), dz (1), dspec (T*k,D), all F32;
  ref.safetensors  what the layer must produce: y, aux_loss, z_loss, spec, expert_counts (I32),
                   dropped (I32), capacity (I32), grad.x and grad.<weight> for every weight.
Inputs are drawn in float32 from a fixed per-case seed (so the C side sees exactly these values); the
reference is computed in float64 by moe_reference() below, gradients by autograd of
  L = sum(dy*y) + daux*aux_loss + dz*z_loss + sum(dspec*spec),
then stored as float32. Rerunning gives identical bytes. Needs python3-torch and numpy only (the
safetensors writer is the small one below).

Usage: /usr/bin/python3 dev/gen_fixtures.py [outdir]   (default: <repo>/tests/fixtures)
       add --check to also run the slower self-checks (finite-difference gradient check).
"""
import json
import math
import os
import struct
import sys
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors writer


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, numpy array of dtype float32, int32 or uint8). Writes atomically."""
    codes = {np.dtype(np.float32): ("F32", "<f4"), np.dtype(np.int32): ("I32", "<i4"), np.dtype(np.uint8): ("U8", "u1")}
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors:
        a = np.asarray(a)
        code, le = codes[a.dtype]
        b = np.ascontiguousarray(a.astype(le)).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)  # data starts at a multiple of 8
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# the reference layer


def capacity_from_setting(setting, k, T, E, max_count):
    """C of DESIGN 4.1 for dispatch=static. setting is the decimal string of capacity_setting;
    the ceil is taken exactly (Fraction), and must agree with float32/float64 arithmetic."""
    x = Fraction(setting)
    if x > 0:
        c = math.ceil(x * k * T / E)
    elif x == 0:
        return max_count
    else:
        c = math.ceil(-x * k * T / E)
    # the C side computes this in float: make sure the fixture doesn't depend on rounding
    xf = abs(float(setting))
    c64 = math.ceil(xf * k * T / E)
    c32 = math.ceil(float(np.float32(np.float32(xf) * np.float32(k) * np.float32(T) / np.float32(E))))
    assert c == c64 == c32, f"capacity {setting} k={k} T={T} E={E}: ceil depends on rounding"
    return c if x > 0 else min(max_count, c)


def gate_logits(w, x, cfg):
    """Router logits (T,E): linear x Wg^T + bg, or the cosine router."""
    if cfg["router"] == "linear":
        logits = x @ w["gate.weight"].t()
        if "gate.bias" in w:
            logits = logits + w["gate.bias"]
        return logits
    p = x @ w["gate.proj.weight"].t() + w["gate.proj.bias"]
    pn = p / p.norm(dim=1, keepdim=True).clamp_min(1e-12)
    m = w["gate.weight"]
    mn = m / m.norm(dim=1, keepdim=True).clamp_min(1e-12)
    scale = torch.exp(torch.clamp(w["gate.logit_scale"], max=math.log(100.0)))
    return scale * (pn @ mn.t())


def swiglu_oai(gate, up, alpha, limit):
    """gpt-oss's clamped SwiGLU (transformers' GptOssExperts): gate clamped above at limit, up to
    [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate); torch's clamp gives 0 gradient where it clamps."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


def oai_of(cfg):
    """The clamped SwiGLU's alpha and limit as the C side holds them (float32 values), or {}."""
    if cfg["activation"] != "swiglu_oai":
        return {}
    return {"alpha": float(np.float32(cfg["swiglu_alpha"])), "limit": float(np.float32(cfg["swiglu_limit"]))}


def expert_outputs(w, x, act, alpha=None, limit=None):
    """out[e, t] = expert e applied to every token: (E, T, D). Dense over all experts (the reference
    needs no efficiency; unselected entries get zero cotangent so the gradients are unaffected).
    alpha, limit: swiglu_oai's."""
    a = torch.einsum("td,ehd->eth", x, w["experts.fc1.weight"])
    if "experts.fc1.bias" in w:
        a = a + w["experts.fc1.bias"][:, None, :]
    if act == "relu":
        h = torch.relu(a)
    elif act == "gelu":
        h = 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))  # exact GELU
    elif act == "silu":
        h = a * torch.sigmoid(a)
    elif act == "swiglu":
        g = torch.einsum("td,ehd->eth", x, w["experts.fc3.weight"])
        h = a * torch.sigmoid(a) * g
    elif act == "swiglu_oai":
        u = torch.einsum("td,ehd->eth", x, w["experts.fc3.weight"])
        if "experts.fc3.bias" in w:
            u = u + w["experts.fc3.bias"][:, None, :]
        h = swiglu_oai(a, u, alpha, limit)
    else:
        raise ValueError(act)
    out = torch.einsum("eth,edh->etd", h, w["experts.fc2.weight"])
    if "experts.fc2.bias" in w:
        out = out + w["experts.fc2.bias"][:, None, :]
    return out


def shared_output(w, x, act):
    """The shared experts' output (T,D): a dense FFN of every token (no biases), scaled per token by
    sigmoid(x . shared.gate.weight) when the layer has that gate (Qwen2-MoE's shared_expert_gate)."""
    a = x @ w["shared.fc1.weight"].t()
    if act == "swiglu":
        h = F.silu(a) * (x @ w["shared.fc3.weight"].t())
    else:
        h = {"relu": torch.relu, "silu": F.silu, "gelu": lambda v: 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))}[act](a)
    out = h @ w["shared.fc2.weight"].t()
    if "shared.gate.weight" in w:
        out = torch.sigmoid(x @ w["shared.gate.weight"].t()) * out
    return out


def choice_values(scores, w, cfg):
    """What the top-k is chosen on (transformers' DeepSeek-V3 get_topk_indices, and DeepSeek-V2's
    group_limited_greedy with the max group score): the scores plus the selection bias, and with
    groups, the topk_group groups of best group score kept and the others' values set to 0.0."""
    c = scores.detach()
    if "gate.select_bias" in w:
        c = c + w["gate.select_bias"].detach()
    G = cfg.get("n_group", 0)
    if G:
        T, E = c.shape
        g = c.view(T, G, E // G)
        gs = g.max(dim=-1).values if cfg["group_score"] == "max" else g.topk(2, dim=-1).values.sum(dim=-1)
        order = torch.sort(-gs, dim=1, stable=True).indices[:, :cfg["topk_group"]]
        keep = torch.zeros(T, G, dtype=torch.bool)
        keep[torch.arange(T)[:, None], order] = True
        c = c.masked_fill(~keep[:, :, None].expand(T, G, E // G).reshape(T, E), 0.0)
    return c


def moe_reference(w, x, cfg):
    """The MoE layer of DESIGN 4.1, differentiable (float64 tensors in, autograd-ready tensors out).

    w: dict name -> tensor; x: (T,D); cfg: dict with top_k, capacity_setting (decimal string),
    activation, normalize_topk (bool or None = auto), dispatch, priority, router.
    Returns y (T,D), aux_loss, z_loss (scalars), spec (T*k,D), plus routing information:
    logits, probs, topk_idx (T,k), combine (T,k), keep (T,k) bool, expert_counts (E), capacity, dropped.
    """
    T, D = x.shape
    k = cfg["top_k"]
    logits = gate_logits(w, x, cfg)
    E = logits.shape[1]
    sigmoid = cfg.get("score", "softmax") == "sigmoid"
    probs = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=1)  # the scores

    # top-k: k largest choice values, ties to the lower expert id (stable sort), indices not differentiable
    with torch.no_grad():
        order = torch.sort(-choice_values(probs, w, cfg), dim=1, stable=True).indices
    topk_idx = order[:, :k]
    combine = torch.gather(probs, 1, topk_idx)
    normalize = cfg["normalize_topk"] if cfg["normalize_topk"] is not None else (k > 1)
    if normalize:
        combine = combine / combine.sum(dim=1, keepdim=True)
    combine = combine * float(cfg.get("routed_scale", "1"))

    # capacity: slot-major placement, token order by index or by top probability (highest first)
    counts = torch.bincount(topk_idx.reshape(-1), minlength=E)
    max_count = int(counts.max()) if T > 0 else 0
    if cfg["dispatch"] == "static":
        C = capacity_from_setting(cfg["capacity_setting"], k, T, E, max_count)
    else:
        C = max_count  # dynamic never drops
    if cfg["priority"] == "score":
        top = probs.detach()[torch.arange(T), topk_idx[:, 0]]
        token_order = torch.sort(-top, stable=True).indices.tolist()
    else:
        token_order = list(range(T))
    keep = torch.zeros(T, k, dtype=torch.bool)
    fill = [0] * E
    for j in range(k):
        for t in token_order:
            e = int(topk_idx[t, j])
            if cfg["dispatch"] == "dynamic" or fill[e] < C:
                keep[t, j] = True
                fill[e] += 1
    dropped = int((~keep).sum())

    # experts and combine
    outs = expert_outputs(w, x, cfg["activation"], **oai_of(cfg))  # (E, T, D)
    sel = outs[topk_idx, torch.arange(T)[:, None]]  # (T, k, D): out_{e_j}(x[t])
    spec = sel * keep[:, :, None].to(sel.dtype)
    y = (combine[:, :, None] * spec).sum(dim=1)
    if "shared.fc1.weight" in w:
        y = y + shared_output(w, x, cfg["activation"])

    # losses
    frac = torch.bincount(topk_idx[:, 0], minlength=E).to(probs.dtype) / T  # constant
    balance = probs / probs.sum(dim=1, keepdim=True) if sigmoid else probs  # sigmoid: normalized per token
    aux_loss = E * (balance.mean(dim=0) * frac).sum()
    z_loss = (torch.logsumexp(logits, dim=1) ** 2).mean()

    return {
        "y": y, "aux_loss": aux_loss, "z_loss": z_loss, "spec": spec.reshape(T * k, D),
        "logits": logits, "probs": probs, "topk_idx": topk_idx,
        **({"choice": choice_values(probs, w, cfg)} if "gate.select_bias" in w or cfg.get("n_group") else {}),
        **({"select_bias": w["gate.select_bias"].detach()} if "gate.select_bias" in w else {}), "combine": combine, "keep": keep,
        "expert_counts": counts, "capacity": C, "dropped": dropped,
    }


def moe_reference_grads(w, x, cfg, dy, daux, dz, dspec):
    """Forward plus gradients of L = <dy,y> + daux*aux + dz*z + <dspec,spec> w.r.t. x and every weight.
    All tensors float64. Returns (forward dict, {"x": dx, name: dW})."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in w.items()}
    xl = x.detach().clone().requires_grad_(True)
    r = moe_reference(leaves, xl, cfg)
    L = (dy * r["y"]).sum() + daux * r["aux_loss"] + dz * r["z_loss"] + (dspec * r["spec"]).sum()
    names = list(leaves)
    gs = torch.autograd.grad(L, [xl] + [leaves[n] for n in names], allow_unused=True)
    grads = {"x": gs[0]}
    for n, g in zip(names, gs[1:]):
        grads[n] = g if g is not None else torch.zeros_like(leaves[n])
    return r, grads


# ----------------------------------------------------------------------------------------------
# cases

BASE = dict(T=24, D=12, H=16, E=6, P=8, k=2, cap="1.0", act="relu", dispatch="dynamic",
            priority="index", normalize=None, router="linear", bias=True,
            gate_scale=2.5, gate_bias_scale=1.0, logit_scale=None, score="softmax", select_bias=False,
            n_group=0, topk_group=0, group_score="max", routed_scale="1", shared_H=0, shared_gate=False,
            swiglu_alpha="1.702", swiglu_limit="7")


def case(name, seed, **kw):
    c = dict(BASE)
    c.update(kw)
    c["name"], c["seed"] = name, seed
    return c


CASES = [
    case("relu_k1_cap1_index_static", 101, k=1, dispatch="static"),
    case("relu_k2_cap1_index_static", 102, dispatch="static"),
    case("relu_k2_cap0_index_static", 103, cap="0", dispatch="static"),
    case("relu_k2_capneg_index_static", 104, cap="-1.25", dispatch="static"),
    case("relu_k2_cap1_score_static", 105, dispatch="static", priority="score"),
    case("gelu_k2_cap1_index_dynamic", 106, act="gelu"),
    case("gelu_k3_capneg_score_static", 107, act="gelu", k=3, cap="-1.25", dispatch="static",
         priority="score"),
    case("gelu_k3_cap1_index_dynamic", 108, act="gelu", k=3),
    case("swiglu_k2_cap1_score_static", 109, act="swiglu", dispatch="static", priority="score"),
    case("swiglu_k1_cap0_index_dynamic", 110, act="swiglu", k=1, cap="0"),
    case("swiglu_k3_cap1_index_dynamic", 111, act="swiglu", k=3),
    case("silu_k2_cap1_index_dynamic", 112, act="silu"),
    case("relu_k2_nonorm_dynamic", 113, normalize=False),
    case("gelu_k1_norm_static", 114, act="gelu", k=1, normalize=True, dispatch="static"),
    case("cosine_gelu_k2_dynamic", 115, act="gelu", router="cosine"),
    case("cosine_relu_k2_cap1_static", 116, router="cosine", dispatch="static"),
    case("nobias_relu_k2_dynamic", 117, bias=False),
    case("drops_silu_k2_cap05_score_static", 118, act="silu", cap="0.5", dispatch="static",
         priority="score"),
    # extras
    case("relu_k2_capneg_loose_index_static", 122, cap="-2.5", dispatch="static"),  # C = max count
    case("relu_k6_dense_dynamic", 119, k=6),  # k = E: the dense softmax mixture
    case("odd_gelu_k2_cap1_index_static", 120, act="gelu", dispatch="static", T=17, D=10, H=14, E=5,
         gate_scale=2.0, gate_bias_scale=0.6),  # C = ceil(6.8) = 7; sizes not multiples of 4/8/16
    case("cosine_swiglu_k1_clamp_dynamic", 121, act="swiglu", k=1, router="cosine",
         logit_scale=4.75),  # s > ln 100: the scale is clamped, grad.gate.logit_scale is 0
    # the routers and shared experts of open models (DESIGN 4.1b)
    case("qwen2moe_shared_gate_swiglu_dynamic", 123, act="swiglu", k=2, normalize=False, bias=False,
         shared_H=20, shared_gate=True),
    case("dsv3_sigmoid_groups_top2_bias_scale_dynamic", 124, act="swiglu", E=8, k=3, normalize=True,
         bias=False, score="sigmoid", select_bias=True, n_group=4, topk_group=2, group_score="top2_sum",
         routed_scale="2.5", shared_H=12),
    case("dsv2_softmax_groups_max_static", 125, E=8, k=2, normalize=False, dispatch="static",
         n_group=4, topk_group=2, group_score="max", routed_scale="1.5"),
    case("sigmoid_nonorm_shared_relu_score_static", 126, E=6, k=2, normalize=False, score="sigmoid",
         dispatch="static", priority="score", shared_H=10, shared_gate=True),
    # gpt-oss's experts: the clamped SwiGLU with fc1/fc3/fc2 biases, the router with its bias and the
    # softmax over the k selected logits (normalize_topk); small limits so that the clamps bite
    case("gptoss_swiglu_oai_k2_dynamic", 127, act="swiglu_oai", k=2, normalize=True, swiglu_limit="1.25"),
    case("swiglu_oai_k3_cap1_score_static", 128, act="swiglu_oai", k=3, dispatch="static", priority="score",
         swiglu_alpha="2.5", swiglu_limit="0.875"),
    case("swiglu_oai_nobias_k1_dynamic", 129, act="swiglu_oai", k=1, bias=False),
]


def make_inputs(c):
    """All inputs of a case, drawn in float32 from torch.manual_seed(seed)."""
    torch.manual_seed(c["seed"])
    T, D, H, E, P, k = c["T"], c["D"], c["H"], c["E"], c["P"], c["k"]
    f = torch.float32

    def randn(*s):
        return torch.randn(*s, dtype=f)

    w = {}
    if c["router"] == "linear":
        w["gate.weight"] = randn(E, D) * (c["gate_scale"] / math.sqrt(D))
        if c["bias"]:
            w["gate.bias"] = randn(E) * c["gate_bias_scale"]
    else:
        w["gate.weight"] = randn(E, P)
        w["gate.proj.weight"] = randn(P, D) * (1.0 / math.sqrt(D))
        w["gate.proj.bias"] = randn(P) * 0.2
        s = c["logit_scale"] if c["logit_scale"] is not None else math.log(1 / 0.07)
        w["gate.logit_scale"] = torch.tensor([s], dtype=f)
    w["experts.fc1.weight"] = randn(E, H, D) * (1.0 / math.sqrt(D))
    if c["bias"]:
        w["experts.fc1.bias"] = randn(E, H) * 0.1
    w["experts.fc2.weight"] = randn(E, D, H) * (1.0 / math.sqrt(H))
    if c["bias"]:
        w["experts.fc2.bias"] = randn(E, D) * 0.1
    if c["act"] in ("swiglu", "swiglu_oai"):
        w["experts.fc3.weight"] = randn(E, H, D) * (1.0 / math.sqrt(D))
    if c["act"] == "swiglu_oai" and c["bias"]:
        w["experts.fc3.bias"] = randn(E, H) * 0.1
    if c["select_bias"]:
        w["gate.select_bias"] = randn(E) * 0.3
    if c["shared_H"]:
        Hs = c["shared_H"]
        w["shared.fc1.weight"] = randn(Hs, D) * (1.0 / math.sqrt(D))
        if c["act"] == "swiglu":
            w["shared.fc3.weight"] = randn(Hs, D) * (1.0 / math.sqrt(D))
        w["shared.fc2.weight"] = randn(D, Hs) * (1.0 / math.sqrt(Hs))
        if c["shared_gate"]:
            w["shared.gate.weight"] = randn(1, D) * (1.0 / math.sqrt(D))
    x = randn(T, D)
    dy = randn(T, D)
    daux = torch.rand(1, dtype=f) + 0.5
    dz = torch.rand(1, dtype=f) * 0.5 + 0.1
    dspec = randn(T * k, D)
    return w, x, dy, daux, dz, dspec


def cfg_of(c):
    return {"top_k": c["k"], "capacity_setting": c["cap"], "activation": c["act"],
            "normalize_topk": c["normalize"], "dispatch": c["dispatch"], "priority": c["priority"],
            "router": c["router"], "score": c["score"], "n_group": c["n_group"],
            "topk_group": c["topk_group"], "group_score": c["group_score"],
            "routed_scale": c["routed_scale"], "swiglu_alpha": c["swiglu_alpha"],
            "swiglu_limit": c["swiglu_limit"]}


def metadata_of(c):
    norm = c["normalize"] if c["normalize"] is not None else c["k"] > 1
    m = {"top_k": str(c["k"]), "capacity_setting": c["cap"], "activation": c["act"],
            "normalize_topk": "true" if norm else "false", "dispatch": c["dispatch"],
            "priority": c["priority"], "router": c["router"]}
    if c["score"] != "softmax":
        m["score"] = c["score"]
    if c["n_group"]:
        m.update(n_group=str(c["n_group"]), topk_group=str(c["topk_group"]), group_score=c["group_score"])
    if c["routed_scale"] != "1":
        m["routed_scale"] = c["routed_scale"]
    if c["act"] == "swiglu_oai":
        m.update(swiglu_alpha=c["swiglu_alpha"], swiglu_limit=c["swiglu_limit"])
    return m


def routing_margins(r, cfg):
    """Smallest gaps that the routing decisions depend on, so float32 rounding on the C side cannot
    flip them: between adjacent sorted logits (or choice values, with a selection bias or groups)
    among the top k+1 of each token, and (priority=score) relative gap between adjacent sorted top
    probabilities."""
    logits = r["choice"] if "choice" in r else r["logits"].detach()
    k, E = cfg["top_k"], logits.shape[1]
    s = torch.sort(logits, dim=1, descending=True).values[:, :min(k + 1, E)]
    lg = float((s[:, :-1] - s[:, 1:]).min()) if s.shape[1] > 1 else math.inf
    G = cfg.get("n_group", 0)
    if G and G > cfg["topk_group"]:  # the kept groups: the gap at the topk_group boundary
        c = r["probs"].detach() + (r["select_bias"] if "select_bias" in r else 0)
        g = c.view(c.shape[0], G, -1)
        gs = g.max(dim=-1).values if cfg["group_score"] == "max" else g.topk(2, dim=-1).values.sum(dim=-1)
        gs = torch.sort(gs, dim=1, descending=True).values
        n = cfg["topk_group"]
        lg = min(lg, float((gs[:, n - 1] - gs[:, n]).min()))
    pg = math.inf
    if cfg["priority"] == "score":
        top = torch.sort(r["probs"].detach().max(dim=1).values, descending=True).values
        pg = float(((top[:-1] - top[1:]) / top[:-1]).min())
    return lg, pg


def f32(t):
    return t.detach().to(torch.float32).reshape(t.shape).numpy() if t.dim() else \
        t.detach().to(torch.float32).reshape(1).numpy()


def i32(v):
    return np.asarray(v, dtype=np.int32).reshape(-1)


def reference_tensors(r, grads, weight_names):
    """ref.safetensors of one case: the outputs, the routing counts, and the gradients of x and of
    every weight."""
    ref = [("y", f32(r["y"])), ("aux_loss", f32(r["aux_loss"])), ("z_loss", f32(r["z_loss"])),
           ("spec", f32(r["spec"])), ("expert_counts", i32(r["expert_counts"].numpy())),
           ("dropped", i32([r["dropped"]])), ("capacity", i32([r["capacity"]])),
           ("grad.x", f32(grads["x"]))]
    return ref + [("grad." + n, f32(grads[n])) for n in weight_names]


def check_dense(w, x, cfg):
    """k = E, dynamic, normalized: y must equal the dense softmax mixture sum_e probs[t,e] out_e(x[t])."""
    cfg = dict(cfg, top_k=w["experts.fc1.weight"].shape[0], normalize_topk=True, dispatch="dynamic")
    r = moe_reference(w, x, cfg)
    dense = torch.einsum("te,etd->td", r["probs"], expert_outputs(w, x, cfg["activation"], **oai_of(cfg)))
    err = float((dense - r["y"]).abs().max())
    assert err < 1e-12, f"dense mixture check: {err}"


def check_loops(w, x, cfg, r):
    """A naive per-assignment loop version of y, spec and the losses, against moe_reference."""
    T, D = x.shape
    k = cfg["top_k"]
    y = torch.zeros(T, D, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            if not r["keep"][t, j]:
                assert float(r["spec"][t * k + j].abs().max()) == 0.0
                continue
            e = int(r["topk_idx"][t, j])
            a = w["experts.fc1.weight"][e] @ x[t]
            if "experts.fc1.bias" in w:
                a = a + w["experts.fc1.bias"][e]
            h = {"relu": lambda v: torch.clamp_min(v, 0), "gelu": lambda v: F.gelu(v),
                 "silu": F.silu, "swiglu": F.silu, "swiglu_oai": F.silu}[cfg["activation"]](a)
            if cfg["activation"] == "swiglu":
                h = h * (w["experts.fc3.weight"][e] @ x[t])
            if cfg["activation"] == "swiglu_oai":  # written out: min, max, the sigmoid of alpha g
                u = w["experts.fc3.weight"][e] @ x[t] + (w["experts.fc3.bias"][e] if "experts.fc3.bias" in w else 0)
                p = oai_of(cfg)
                g = torch.minimum(a, torch.tensor(p["limit"], dtype=a.dtype))
                u = torch.maximum(torch.minimum(u, torch.tensor(p["limit"], dtype=a.dtype)),
                                  torch.tensor(-p["limit"], dtype=a.dtype))
                h = (u + 1) * g / (1 + torch.exp(-p["alpha"] * g))
            o = w["experts.fc2.weight"][e] @ h
            if "experts.fc2.bias" in w:
                o = o + w["experts.fc2.bias"][e]
            assert float((o - r["spec"][t * k + j]).abs().max()) < 1e-12
            y[t] += r["combine"][t, j] * o
    if "shared.fc1.weight" in w:
        y = y + shared_output(w, x, cfg["activation"])
    assert float((y - r["y"]).abs().max()) < 1e-12, "loop check of y"
    lse = torch.logsumexp(r["logits"], 1)
    assert abs(float((lse ** 2).mean() - r["z_loss"])) < 1e-12
    E = r["probs"].shape[1]
    bal = r["probs"] / r["probs"].sum(1, keepdim=True) if cfg.get("score") == "sigmoid" else r["probs"]
    aux = sum(float(bal[:, e].mean()) * float((r["topk_idx"][:, 0] == e).double().mean())
              for e in range(E)) * E
    assert abs(aux - float(r["aux_loss"])) < 1e-12


def check_fd(w, x, cfg, dy, daux, dz, dspec):
    """Central finite differences of L on a few entries of x and of every weight (slow-ish)."""
    _, grads = moe_reference_grads(w, x, cfg, dy, daux, dz, dspec)

    def L(ww, xx):
        r = moe_reference(ww, xx, cfg)
        return float((dy * r["y"]).sum() + daux * r["aux_loss"] + dz * r["z_loss"]
                     + (dspec * r["spec"]).sum())
    gen = torch.Generator().manual_seed(0)
    h = 1e-6
    for name in ["x"] + list(w):
        base = x if name == "x" else w[name]
        for _ in range(4):
            i = int(torch.randint(base.numel(), (1,), generator=gen))
            plus, minus = base.clone(), base.clone()
            plus.view(-1)[i] += h
            minus.view(-1)[i] -= h
            if name == "x":
                fd = (L(w, plus) - L(w, minus)) / (2 * h)
            else:
                fd = (L(dict(w, **{name: plus}), x) - L(dict(w, **{name: minus}), x)) / (2 * h)
            g = float(grads[name].reshape(-1)[i])
            assert abs(fd - g) <= 1e-6 * max(1.0, abs(g)), f"fd {name}[{i}]: {fd} vs {g}"


def clamp_margin(w, x, limit):
    """The smallest distance of a gate or up pre-activation (every expert, every token) to a clamp bound."""
    def pre(n):
        v = torch.einsum("td,ehd->eth", x, w[f"experts.{n}.weight"])
        return v + w[f"experts.{n}.bias"][:, None, :] if f"experts.{n}.bias" in w else v
    return min(float((pre("fc1") - limit).abs().min()), float((pre("fc3").abs() - limit).abs().min()))


def generate(c, outdir, full_check):
    cfg = cfg_of(c)
    w32, x32, dy32, daux32, dz32, dspec32 = make_inputs(c)
    d = lambda t: t.to(torch.float64)
    w = {n: d(t) for n, t in w32.items()}
    x, dy, dspec = d(x32), d(dy32), d(dspec32)
    daux, dz = float(daux32), float(dz32)

    r, grads = moe_reference_grads(w, x, cfg, dy, daux, dz, dspec)

    # self-checks (cheap)
    with torch.no_grad():
        check_loops(w, x, cfg, r)
        if c["name"] == "relu_k6_dense_dynamic":
            check_dense(w, x, cfg)
    lg, pg = routing_margins(r, cfg)
    assert lg > 1e-4 and pg > 2e-5, f"{c['name']}: routing too close to a tie ({lg}, {pg})"
    if cfg["activation"] == "swiglu_oai":  # float32 must clamp the same values: none near a bound
        assert clamp_margin(w, x, oai_of(cfg)["limit"]) > 1e-4, f"{c['name']}: a value too close to the clamp"
    with torch.no_grad():  # the same routing when computed in float32, as the C side does
        r32 = moe_reference(w32, x32, cfg)
        assert torch.equal(r32["topk_idx"], r["topk_idx"]) and torch.equal(r32["keep"], r["keep"])
    if full_check:
        check_fd(w, x, cfg, dy, daux, dz, dspec)
    note = ""
    if c["priority"] == "score":
        r2 = moe_reference(w, x, dict(cfg, priority="index"))
        note = " (score != index)" if not torch.equal(r2["keep"], r["keep"]) else " (same as index)"

    cd = os.path.join(outdir, c["name"])
    os.makedirs(cd, exist_ok=True)
    write_safetensors(os.path.join(cd, "w.safetensors"),
                      [(n, t.numpy()) for n, t in w32.items()], metadata_of(c))
    write_safetensors(os.path.join(cd, "x.safetensors"),
                      [("x", x32.numpy()), ("dy", dy32.numpy()), ("daux", daux32.numpy()),
                       ("dz", dz32.numpy()), ("dspec", dspec32.numpy())])
    write_safetensors(os.path.join(cd, "ref.safetensors"), reference_tensors(r, grads, w32))

    print(f"{c['name']:36s} T={c['T']:2d} D={c['D']:2d} H={c['H']:2d} E={c['E']} k={c['k']} "
          f"cap={c['cap']:>5s} {c['dispatch']:7s} C={r['capacity']:2d} dropped={r['dropped']:2d} "
          f"counts={r['expert_counts'].tolist()} margins={lg:.1e}/{pg:.1e}{note}")
    return r


def main(argv):
    full_check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = args[0] if args else os.path.join(root, "tests", "fixtures")
    torch.set_num_threads(1)  # one reduction order: identical bytes on every rerun
    os.makedirs(outdir, exist_ok=True)
    for c in CASES:
        r = generate(c, outdir, full_check)
        if c["dispatch"] == "static" and Fraction(c["cap"]) > 0 or c["name"].startswith("drops"):
            assert r["dropped"] > 0, f"{c['name']}: static case with capacity {c['cap']} drops nothing"
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("Reference outputs and gradients of the MoE layer (DESIGN 4.1), computed in float64 with "
                "PyTorch autograd and stored as float32.\n"
                "Made by `/usr/bin/python3 dev/gen_fixtures.py` (python3-torch 1.13, numpy); rerunning "
                "gives identical bytes.\n")


if __name__ == "__main__":
    main(sys.argv[1:])
