#!/usr/bin/python3
"""PyTorch float64 re-implementations of three Hugging Face MoE language-model families beside Mixtral
(dev/mixtral_ref.py), without the transformers package, and the fixtures of libmoe's language model for
them. Written from transformers' modeling files, read at these commits of huggingface/transformers:

  models/qwen2_moe/modeling_qwen2_moe.py  00a3f9386614dde0dc41cf4e9b8d0abd3af0671d (4.52 era)
  models/qwen3_moe/modeling_qwen3_moe.py  00d4b3d2142cb4ced2f51b90614b5d26bc045015 (4.56 era)
  models/olmoe/modeling_olmoe.py          00dcc6dda6f6d8e69541a6b51f97986a80242367 (4.53 era)
  models/{qwen2_moe,qwen3_moe,olmoe}/configuration_*.py  008e574391258935f3ecc3035c882e73bbcac419

What each family does differently from Mixtral (everything else is mixtral_ref.py's: RMSNorm, rotary
embeddings with rotate_half, causal GQA, softmax -> top-k routing, SwiGLU experts, the balance loss):
  Qwen2-MoE  q/k/v projections with biases (o_proj without); Qwen2MoeSparseMoeBlock adds to the routed
             output shared_expert(x) (a SwiGLU MLP of shared_expert_intermediate_size) scaled per token
             by sigmoid(shared_expert_gate(x)) (Linear(D, 1), no bias); the top-k renormalized only with
             norm_topk_prob; layer i is the sparse block when i is not in mlp_only_layers and
             (i + 1) % decoder_sparse_step == 0, else a dense Qwen2MoeMLP of intermediate_size.
  Qwen3-MoE  q_norm and k_norm: RMSNorm over head_dim of each head of q and k (after the projection,
             before RoPE); head_dim given; no biases, no shared expert; norm_topk_prob, decoder_sparse_step
             and mlp_only_layers as Qwen2-MoE.
  OLMoE      q_norm over the whole projected q (hidden_size) and k_norm over the whole k (n_kv heads x
             head_dim), then, with clip_qkv, q, k and v clamped to [-clip_qkv, clip_qkv]; head_dim is
             hidden_size / num_attention_heads; every layer sparse; norm_topk_prob false by default.
The balance loss is load_balancing_loss_func over the router logits of the sparse layers only (dense
layers return none), added times router_aux_loss_coef when output_router_logits. OlmoeForCausalLM adds
no router z-loss (its config's router_z_loss_coef is unused by transformers), so neither does this.

For each case it draws a tiny random model, writes it as a Hugging Face checkpoint directory in the
family's layout (config.json and model.safetensors, F32, the family's tensor names) and computes in
float64 the logits, the losses and by autograd the gradient of every parameter into ref.safetensors
(tokens, targets with -100 ignored, logits, loss, ce, aux, grad.<name>), as mixtral_ref.py does.
A case is drawn again with the next seed when a token's k-th and (k+1)-th router probabilities are
within 1e-3, or a clamped value lies within 1e-4 of clip_qkv (fp32 and fp64 must take the same side).

Usage: /usr/bin/python3 dev/lm_families_ref.py [outdir]   (default: <repo>/tests/fixtures/lm)
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import write_safetensors  # noqa: E402
from mixtral_ref import load_balancing_loss, rms_norm, rope_cos_sin, rotate_half  # noqa: E402

ARCH = {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}

CASES = [
    # name, family, seed, config (HF config.json fields), batch, length
    ("qwen2_moe", "qwen2_moe", 31, dict(vocab_size=48, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                        num_experts_per_tok=2, moe_intermediate_size=16,
                                        shared_expert_intermediate_size=20, norm_topk_prob=False,
                                        decoder_sparse_step=1, mlp_only_layers=[1], rope_theta=10000.0,
                                        rms_norm_eps=1e-6, router_aux_loss_coef=0.02, tie_word_embeddings=False),
     2, 7),
    ("qwen3_moe", "qwen3_moe", 37, dict(vocab_size=40, hidden_size=24, intermediate_size=28, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                                        num_experts_per_tok=2, moe_intermediate_size=12, norm_topk_prob=True,
                                        decoder_sparse_step=1, mlp_only_layers=[0], rope_theta=1000000.0,
                                        rms_norm_eps=1e-6, router_aux_loss_coef=0.03, tie_word_embeddings=True),
     2, 6),
    ("olmoe", "olmoe", 41, dict(vocab_size=40, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                norm_topk_prob=False, clip_qkv=1.25, rope_theta=10000.0, rms_norm_eps=1e-5,
                                router_aux_loss_coef=0.01, tie_word_embeddings=False),
     2, 7),
]


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def is_sparse(c, i):
    """The decoder layer's choice in Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer (OLMoE: always)."""
    return i not in c.get("mlp_only_layers", []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0


def hf_config(family, c):
    """config.json as transformers writes it for the family."""
    full = dict(architectures=[ARCH[family]], model_type=family, hidden_act="silu", max_position_embeddings=64,
                initializer_range=0.02, attention_dropout=0.0, output_router_logits=True, use_cache=True,
                eos_token_id=2, torch_dtype="float32", transformers_version="4.52.0", rope_scaling=None)
    if family == "qwen2_moe":
        full.update(use_sliding_window=False, sliding_window=4096, max_window_layers=28, bos_token_id=1, qkv_bias=True)
    if family == "qwen3_moe":
        full.update(use_sliding_window=False, sliding_window=None, max_window_layers=3, attention_bias=False,
                    bos_token_id=1)
    if family == "olmoe":
        full.update(attention_bias=False, pad_token_id=1)
    full.update(c)
    return full


def mlp_shapes(prefix, D, H):
    return [(prefix + "gate_proj.weight", (H, D)), (prefix + "up_proj.weight", (H, D)),
            (prefix + "down_proj.weight", (D, H))]


def param_shapes(family, c):
    """(name, shape) of every parameter in the order of the modules' definitions."""
    D, V, hd = c["hidden_size"], c["vocab_size"], head_dim(c)
    qd, kvd = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", (D,)), (a + "q_proj.weight", (qd, D)), (a + "k_proj.weight", (kvd, D)),
                (a + "v_proj.weight", (kvd, D))]
        if family == "qwen2_moe":
            out += [(a + "q_proj.bias", (qd,)), (a + "k_proj.bias", (kvd,)), (a + "v_proj.bias", (kvd,))]
        if family == "qwen3_moe":
            out += [(a + "q_norm.weight", (hd,)), (a + "k_norm.weight", (hd,))]
        if family == "olmoe":
            out += [(a + "q_norm.weight", (qd,)), (a + "k_norm.weight", (kvd,))]
        out += [(a + "o_proj.weight", (D, qd)), (p + "post_attention_layernorm.weight", (D,))]
        if is_sparse(c, i):
            E = c["num_experts"]
            H = c["intermediate_size"] if family == "olmoe" else c["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (E, D)))
            for e in range(E):
                out += mlp_shapes(p + f"mlp.experts.{e}.", D, H)
            if family == "qwen2_moe":
                out += mlp_shapes(p + "mlp.shared_expert.", D, c["shared_expert_intermediate_size"])
                out.append((p + "mlp.shared_expert_gate.weight", (1, D)))
        else:
            out += mlp_shapes(p + "mlp.", D, c["intermediate_size"])
    out.append(("model.norm.weight", (D,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D)))
    return out


def swiglu_mlp(p, prefix, x):
    """Qwen2MoeMLP / Qwen3MoeMLP / OlmoeMLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""
    return (F.silu(x @ p[prefix + "gate_proj.weight"].T) * (x @ p[prefix + "up_proj.weight"].T)) @ \
        p[prefix + "down_proj.weight"].T


def attention(family, c, p, x, cos, sin, clip_margin):
    B, T, _ = x.shape
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    q, k, v = (x @ p[f"self_attn.{n}_proj.weight"].T for n in "qkv")
    if family == "qwen2_moe":
        q, k, v = q + p["self_attn.q_proj.bias"], k + p["self_attn.k_proj.bias"], v + p["self_attn.v_proj.bias"]
    if family == "olmoe":  # the whole projections, then the clamp
        q, k = rms_norm(q, p["self_attn.q_norm.weight"], eps), rms_norm(k, p["self_attn.k_norm.weight"], eps)
        lim = c.get("clip_qkv")
        if lim is not None:
            for t in (q, k, v):
                clip_margin.append(float((t.detach().abs() - lim).abs().min()))
            q, k, v = q.clamp(-lim, lim), k.clamp(-lim, lim), v.clamp(-lim, lim)
    q, k, v = q.view(B, T, nh, hd), k.view(B, T, nkv, hd), v.view(B, T, nkv, hd)
    if family == "qwen3_moe":  # each head over head_dim
        q, k = rms_norm(q, p["self_attn.q_norm.weight"], eps), rms_norm(k, p["self_attn.k_norm.weight"], eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # HF repeat_kv
    s = q @ k.transpose(2, 3) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, nh * hd)
    return o @ p["self_attn.o_proj.weight"].T


def sparse_moe(family, c, p, x, margins):
    """The family's sparse block: returns the output and the router logits (N, E)."""
    B, T, D = x.shape
    E, k = c["num_experts"], c["num_experts_per_tok"]
    h = x.reshape(-1, D)
    logits = h @ p["mlp.gate.weight"].T
    w = torch.softmax(logits, dim=1)
    top = torch.sort(w.detach(), dim=1, descending=True).values
    margins.append(float((top[:, k - 1] - top[:, k]).min()) if k < E else 1.0)
    w, sel = torch.topk(w, k, dim=-1)
    if c.get("norm_topk_prob", False):
        w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        tok, slot = torch.where(sel == e)
        if len(tok):
            out = out.index_add(0, tok, swiglu_mlp(p, f"mlp.experts.{e}.", h[tok]) * w[tok, slot, None])
    if family == "qwen2_moe":
        out = out + torch.sigmoid(h @ p["mlp.shared_expert_gate.weight"].T) * swiglu_mlp(p, "mlp.shared_expert.", h)
    return out.reshape(B, T, D), logits


def forward(family, c, params, tokens, targets):
    """Logits (B, T, V), ce, aux, loss, the smallest routing margin and clamp margin, in float64."""
    T, L = tokens.shape[1], c["num_hidden_layers"]
    cos, sin = rope_cos_sin(T, head_dim(c), c["rope_theta"])
    eps = c["rms_norm_eps"]
    x = params["model.embed_tokens.weight"][tokens]
    gate_logits, margins, clip_margin = [], [], [1.0]
    for i in range(L):
        p = {n[len(f"model.layers.{i}."):]: t for n, t in params.items() if n.startswith(f"model.layers.{i}.")}
        x = x + attention(family, c, p, rms_norm(x, p["input_layernorm.weight"], eps), cos, sin, clip_margin)
        xn = rms_norm(x, p["post_attention_layernorm.weight"], eps)
        if is_sparse(c, i):
            y, gl = sparse_moe(family, c, p, xn, margins)
            gate_logits.append(gl)
        else:
            y = swiglu_mlp(p, "mlp.", xn)
        x = x + y
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
    logits = x @ head.T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    aux = load_balancing_loss(dict(num_local_experts=c["num_experts"], num_experts_per_tok=c["num_experts_per_tok"]),
                              gate_logits)
    return logits, ce, aux, ce + c["router_aux_loss_coef"] * aux, min(margins), min(clip_margin)


def draw(family, c, seed, B, T):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(family, c):
        if name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            router = name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight")
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1]) * (2.0 if router else 1.0)
        params[name] = t.float()
    tokens = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets[0, -1] = -100  # an ignored position
    return params, tokens, targets


def write_case(d, config, tensors, tokens, targets, logits, losses, grads, meta):
    """A fixture directory d: config.json; model.safetensors of tensors [(name, numpy array)]; ref.safetensors
    with the tokens, targets, logits, loss, ce and aux (losses) and grad.<name> of grads [(name, tensor)],
    as float32, and meta as its __metadata__."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    f32 = lambda t: t.detach().float().numpy()
    loss, ce, aux = losses
    ref = [("tokens", tokens.int().numpy()), ("targets", targets.int().numpy()), ("logits", f32(logits)),
           ("loss", f32(loss.reshape(1))), ("ce", f32(ce.reshape(1))), ("aux", f32(aux.reshape(1)))]
    ref += [("grad." + n, f32(g)) for n, g in grads]
    write_safetensors(os.path.join(d, "ref.safetensors"), ref, meta)


def generate(name, family, seed, c, B, T, outdir):
    while True:
        params, tokens, targets = draw(family, c, seed, B, T)
        p64 = {n: t.double().requires_grad_() for n, t in params.items()}
        logits, ce, aux, loss, margin, clip_margin = forward(family, c, p64, tokens, targets)
        if margin > 1e-3 and clip_margin > 1e-4:
            break
        seed += 1000
    loss.backward()
    write_case(os.path.join(outdir, name), hf_config(family, c), [(n, t.numpy()) for n, t in params.items()], tokens,
               targets, logits, (loss, ce, aux), [(n, t.grad) for n, t in p64.items()],
               {"seed": seed, "margin": f"{margin:.6f}"})
    print(f"{name}: seed {seed}, loss {loss.item():.6f} (ce {ce.item():.6f}, aux {aux.item():.6f}), "
          f"routing margin {margin:.4f}, clamp margin {clip_margin:.4f}")


def main(argv):
    outdir = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "fixtures", "lm")
    torch.use_deterministic_algorithms(True)
    for name, family, seed, c, B, T in CASES:
        generate(name, family, seed, c, B, T, outdir)


if __name__ == "__main__":
    main(sys.argv)
