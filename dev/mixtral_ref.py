#!/usr/bin/python3
"""A PyTorch re-implementation of Hugging Face's Mixtral (MixtralForCausalLM: RMSNorm, rotary embeddings
with rotate_half, causal grouped-query attention, the sparse MoE block with softmax -> top-k ->
renormalize routing and SwiGLU experts w2(silu(w1 x) * w3 x), load_balancing_loss_func over all
layers' router logits), without the transformers package, and the fixtures of libmoe's language model.

It draws a small random model, writes it as a Hugging Face checkpoint directory (config.json and
model.safetensors, F32, HF tensor names) and computes in float64 the logits, the losses and, by
autograd, the gradient of loss = cross_entropy + router_aux_loss_coef * aux for every parameter:
ref.safetensors holds tokens and targets (I32; -100 is ignored as in HF), logits, loss, ce, aux and
grad.<name> (F32). tests/test_lm.c loads the directory and compares. Rerunning gives identical bytes.
A case is drawn again with the next seed when some token's k-th and (k+1)-th router probabilities
are closer than 1e-3 (routing is discontinuous: fp32 and fp64 must pick the same experts).

Usage: /usr/bin/python3 dev/mixtral_ref.py [outdir]   (default: <repo>/tests/fixtures/lm)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import write_safetensors  # noqa: E402  (the F32/I32 writer, by hand: no safetensors package)

CASES = [
    # name, seed, config (HF config.json fields), batch, length
    ("mixtral", 19, dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                         num_experts_per_tok=2, rope_theta=10000.0, rms_norm_eps=1e-5,
                         router_aux_loss_coef=0.02, tie_word_embeddings=False), 2, 8),
    ("mixtral_tied", 23, dict(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=4, num_local_experts=3,
                              num_experts_per_tok=2, rope_theta=500.0, rms_norm_eps=1e-6,
                              router_aux_loss_coef=0.05, tie_word_embeddings=True), 2, 5),
]


def hf_config(c):
    """config.json as transformers writes it for MixtralForCausalLM."""
    full = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_act="silu",
                max_position_embeddings=64, initializer_range=0.02, attention_dropout=0.0,
                sliding_window=None, output_router_logits=True, bos_token_id=1, eos_token_id=2,
                torch_dtype="float32")
    full.update(c)
    return full


def param_shapes(c):
    """(name, shape) of every parameter in HF order."""
    D, V, H, hd = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["head_dim"]
    qd, kvd = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (D,)), (p + "self_attn.q_proj.weight", (qd, D)),
                (p + "self_attn.k_proj.weight", (kvd, D)), (p + "self_attn.v_proj.weight", (kvd, D)),
                (p + "self_attn.o_proj.weight", (D, qd)), (p + "post_attention_layernorm.weight", (D,)),
                (p + "block_sparse_moe.gate.weight", (c["num_local_experts"], D))]
        for j in range(c["num_local_experts"]):
            e = p + f"block_sparse_moe.experts.{j}."
            out += [(e + "w1.weight", (H, D)), (e + "w2.weight", (D, H)), (e + "w3.weight", (H, D))]
    out.append(("model.norm.weight", (D,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D)))
    return out


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_cos_sin(T, hd, theta):
    """As HF's MixtralRotaryEmbedding: inv_freq and the angles in float32, cat(freqs, freqs)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    ang = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat((ang, ang), dim=-1).double()
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attention(c, p, x, cos, sin):
    B, T, _ = x.shape
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = (x @ p["self_attn.q_proj.weight"].T).view(B, T, nh, hd).transpose(1, 2)
    k = (x @ p["self_attn.k_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
    v = (x @ p["self_attn.v_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # HF repeat_kv
    s = q @ k.transpose(2, 3) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, nh * hd)
    return o @ p["self_attn.o_proj.weight"].T


def sparse_moe(c, p, x, margins):
    """MixtralSparseMoeBlock: returns the output and the router logits (N, E)."""
    B, T, D = x.shape
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    h = x.reshape(-1, D)
    logits = h @ p["block_sparse_moe.gate.weight"].T
    w = torch.softmax(logits, dim=1)
    top = torch.sort(w.detach(), dim=1, descending=True).values
    margins.append(float((top[:, k - 1] - top[:, k]).min()) if k < E else 1.0)
    w, sel = torch.topk(w, k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        tok, slot = torch.where(sel == e)
        if len(tok) == 0:
            continue
        q = f"block_sparse_moe.experts.{e}."
        xe = h[tok]
        ye = (F.silu(xe @ p[q + "w1.weight"].T) * (xe @ p[q + "w3.weight"].T)) @ p[q + "w2.weight"].T
        out = out.index_add(0, tok, ye * w[tok, slot, None])
    return out.reshape(B, T, D), logits


def load_balancing_loss(c, gate_logits):
    """HF load_balancing_loss_func without an attention mask: the layers' logits concatenated."""
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    logits = torch.cat(gate_logits, dim=0)
    w = torch.softmax(logits, dim=-1)
    _, sel = torch.topk(w, k, dim=-1)
    mask = F.one_hot(sel, E).double()
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = w.mean(dim=0)
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E


def forward(c, params, tokens, targets):
    """Logits (B, T, V), ce, aux, loss and the smallest routing margin, all in float64."""
    T, L = tokens.shape[1], c["num_hidden_layers"]
    cos, sin = rope_cos_sin(T, c["head_dim"], c["rope_theta"])
    eps = c["rms_norm_eps"]
    x = params["model.embed_tokens.weight"][tokens]
    gate_logits, margins = [], []
    for i in range(L):
        p = {n[len(f"model.layers.{i}."):]: t for n, t in params.items() if n.startswith(f"model.layers.{i}.")}
        x = x + attention(c, p, rms_norm(x, p["input_layernorm.weight"], eps), cos, sin)
        y, gl = sparse_moe(c, p, rms_norm(x, p["post_attention_layernorm.weight"], eps), margins)
        x = x + y
        gate_logits.append(gl)
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
    logits = x @ head.T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    aux = load_balancing_loss(c, gate_logits)
    return logits, ce, aux, ce + c["router_aux_loss_coef"] * aux, min(margins)


def draw(c, seed, B, T):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(c):
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1]) * (2.0 if "gate" in name else 1.0)
        params[name] = t.float()
    tokens = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets[0, -1] = -100  # an ignored position
    return params, tokens, targets


def generate(name, seed, c, B, T, outdir):
    while True:
        params, tokens, targets = draw(c, seed, B, T)
        p64 = {n: t.double().requires_grad_() for n, t in params.items()}
        logits, ce, aux, loss, margin = forward(c, p64, tokens, targets)
        if margin > 1e-3:
            break
        seed += 1000
    loss.backward()
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), [(n, t.numpy()) for n, t in params.items()],
                      {"format": "pt"})
    f32 = lambda t: t.detach().float().numpy()
    ref = [("tokens", tokens.int().numpy()), ("targets", targets.int().numpy()), ("logits", f32(logits)),
           ("loss", f32(loss.reshape(1))), ("ce", f32(ce.reshape(1))), ("aux", f32(aux.reshape(1)))]
    ref += [("grad." + n, f32(t.grad)) for n, t in p64.items()]
    write_safetensors(os.path.join(d, "ref.safetensors"), ref, {"seed": seed, "margin": f"{margin:.6f}"})
    print(f"{name}: seed {seed}, loss {loss.item():.6f} (ce {ce.item():.6f}, aux {aux.item():.6f}), "
          f"routing margin {margin:.4f}")


def main(argv):
    outdir = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "fixtures", "lm")
    torch.use_deterministic_algorithms(True)
    for name, seed, c, B, T in CASES:
        generate(name, seed, c, B, T, outdir)


if __name__ == "__main__":
    main(sys.argv)
