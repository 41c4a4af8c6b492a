#!/usr/bin/python3
"""PyTorch float64 re-implementation of DeepSeek-V2 / V2-Lite / V3 (without the transformers package) and
the fixtures of libmoe's language model for them, drawn and written by dev/lm_families_ref.py's generate.
Written from these files:

  DeepSeek's modeling_deepseek.py, shipped with the checkpoints (deepseek-ai/DeepSeek-V2-Lite and
    deepseek-ai/DeepSeek-V3 on the Hugging Face hub; read as copied into public repositories, e.g.
    intel/auto-round@3fc2c52a6b4c007f50778fd55a16de0806d5d447): DeepseekV2Attention, MoEGate, DeepseekV2MoE,
    DeepseekV2YarnRotaryEmbedding, yarn_get_mscale, apply_rotary_pos_emb
  huggingface/transformers src/transformers/models/deepseek_v3/modeling_deepseek_v3.py
    @00b676f8f0489b88652a31d70751cc540dd06305 (4.56 era): DeepseekV3Attention, DeepseekV3TopkRouter,
    apply_rotary_pos_emb_interleave, and configuration_deepseek_v3.py's defaults
  transformers' modeling_rope_utils._compute_yarn_parameters (4.57 era, with "truncate")

Where they differ this follows DeepSeek's code:
  * the rotary embedding turns adjacent pairs (2i, 2i + 1) of q_pe and k_pe: DeepSeek's
    apply_rotary_pos_emb views the last dim as (d/2, 2), transposes and then uses rotate_half, which gives
    the same dot products; transformers does this when config.rope_interleave (default true), else plain
    rotate_half (the rotate_half case here);
  * YaRN: inv_freq mixes freq / factor and freq by a linear ramp between the floored and ceiled correction
    dims; cos and sin times yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    (defaults mscale 1, mscale_all_dim 0); softmax_scale = qk_head_dim^-0.5, times
    yarn_get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is not 0;
  * q_a_layernorm and kv_a_layernorm are RMSNorms of eps 1e-6 (their default), not rms_norm_eps;
  * the router: scores softmax (V2) or sigmoid (V3) of the fp32 logits; greedy top-k, or group-limited
    (group score: the best expert's for group_limited_greedy, the sum of the best two of scores plus
    e_score_correction_bias for noaux_tc; the other groups' values set to 0), the combine weights the
    chosen experts' scores (without the bias), divided by their sum + 1e-20 when top_k > 1 and
    norm_topk_prob; V2 multiplies by routed_scaling_factor only without that normalization, V3 always;
  * layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0, else a dense MLP of
    intermediate_size; the MoE adds the shared experts (one MLP of n_shared_experts x
    moe_intermediate_size, no gate);
  * no balance loss: DeepSeek's training-time aux_loss_alpha sequence loss is not part of inference, and
    transformers adds none (aux is 0 in the fixtures).
A case is drawn again with the next seed when a token's k-th and (k+1)-th selection values, or its
topk_group-th and next group scores, are within 1e-3 (fp32 and fp64 must choose alike).

Usage: /usr/bin/python3 dev/deepseek_ref.py [outdir]   (default: <repo>/tests/fixtures/lm)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_families_ref import generate, swiglu_mlp, mlp_shapes  # noqa: E402
from mixtral_ref import rms_norm, rotate_half  # noqa: E402

ARCH = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
LATENT_EPS = 1e-6

BASE = dict(vocab_size=40, hidden_size=32, intermediate_size=24, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=8, v_head_dim=5, moe_intermediate_size=10,
            rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
CASES = [
    # name, family, seed, config (HF config.json fields over BASE), batch, length
    ("deepseek_v2_lite", "deepseek_v2", 43,
     dict(num_hidden_layers=3, q_lora_rank=None, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
          first_k_dense_replace=1, moe_layer_freq=1, topk_method="greedy", n_group=1, topk_group=1,
          scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.5, rope_scaling=None), 2, 7),
    ("deepseek_v2", "deepseek_v2", 47,
     dict(num_hidden_layers=3, q_lora_rank=12, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1,
          first_k_dense_replace=1, moe_layer_freq=1, topk_method="group_limited_greedy", n_group=3, topk_group=2,
          scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=2.0,
          rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                            mscale=0.707, mscale_all_dim=0.707)), 2, 7),
    ("deepseek_v3", "deepseek_v3", 53,
     dict(num_hidden_layers=3, q_lora_rank=12, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
          first_k_dense_replace=1, topk_method="noaux_tc", n_group=4, topk_group=2, scoring_func="sigmoid",
          norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
          rope_scaling=dict(type="yarn", factor=8.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1,
                            mscale=1.0, mscale_all_dim=0.8)), 2, 7),
    # DeepSeek's sequence-wise balance loss, each batch row a sequence: libmoe's moe.seq_aux_alpha, which a
    # caller sets (not config.json: the key below is not written there)
    ("deepseek_v2_seq_aux", "deepseek_v2", 61,
     dict(num_hidden_layers=2, q_lora_rank=None, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1,
          first_k_dense_replace=0, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
          routed_scaling_factor=1.0, rope_scaling=None, libmoe_seq_aux_alpha=0.25), 2, 6),
    ("deepseek_v3_rotate_half", "deepseek_v3", 59,
     dict(num_hidden_layers=2, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=None,
          first_k_dense_replace=0, topk_method="noaux_tc", n_group=2, topk_group=1, scoring_func="sigmoid",
          norm_topk_prob=True, routed_scaling_factor=1.5, rope_interleave=False, rope_scaling=None), 2, 6),
]


def is_moe(c, i):
    """DeepseekV2DecoderLayer's choice."""
    return i >= c.get("first_k_dense_replace", 0) and i % c.get("moe_layer_freq", 1) == 0


def hf_config(family, c):
    full = dict(architectures=[ARCH[family]], model_type=family, hidden_act="silu", max_position_embeddings=64,
                initializer_range=0.02, attention_dropout=0.0, attention_bias=False, use_cache=True, bos_token_id=0,
                eos_token_id=1, torch_dtype="float32", transformers_version="4.56.0", aux_loss_alpha=0.001,
                seq_aux=True, pretraining_tp=1)
    if family == "deepseek_v3":
        full.update(num_nextn_predict_layers=1, ep_size=1)
    full.update(BASE)
    full.update({k: v for k, v in c.items() if not k.startswith("libmoe_")})
    return full


def param_shapes(family, c):
    """(name, shape) of every parameter in the order of DeepSeek's module definitions."""
    c = hf_config(family, c)
    D, V, nh = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    dn, dr, dv, r, qr = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"], c["q_lora_rank"]
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", (D,)))
        if qr is None:
            out.append((a + "q_proj.weight", (nh * (dn + dr), D)))
        else:
            out += [(a + "q_a_proj.weight", (qr, D)), (a + "q_a_layernorm.weight", (qr,)),
                    (a + "q_b_proj.weight", (nh * (dn + dr), qr))]
        out += [(a + "kv_a_proj_with_mqa.weight", (r + dr, D)), (a + "kv_a_layernorm.weight", (r,)),
                (a + "kv_b_proj.weight", (nh * (dn + dv), r)), (a + "o_proj.weight", (D, nh * dv)),
                (p + "post_attention_layernorm.weight", (D,))]
        if is_moe(c, i):
            E, H = c["n_routed_experts"], c["moe_intermediate_size"]
            for e in range(E):
                out += mlp_shapes(p + f"mlp.experts.{e}.", D, H)
            out.append((p + "mlp.gate.weight", (E, D)))
            if c["topk_method"] == "noaux_tc":
                out.append((p + "mlp.gate.e_score_correction_bias", (E,)))
            if c.get("n_shared_experts"):
                out += mlp_shapes(p + "mlp.shared_experts.", D, H * c["n_shared_experts"])
        else:
            out += mlp_shapes(p + "mlp.", D, c["intermediate_size"])
    out.append(("model.norm.weight", (D,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D)))
    return out


def yarn_get_mscale(scale=1.0, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rotary(c, T):
    """cos, sin (T, dr) as DeepseekV2RotaryEmbedding / DeepseekV2YarnRotaryEmbedding: inv_freq and the
    angles in float32, cat(freqs, freqs), then the YaRN attention factor."""
    dim, base, rs = c["qk_rope_head_dim"], c["rope_theta"], c.get("rope_scaling")
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv, att = 1.0 / pos_freqs, 1.0
    if rs:
        f, orig = rs["factor"], rs.get("original_max_position_embeddings", 4096)
        fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        low, high = max(math.floor(corr_dim(fast)), 0), min(math.ceil(corr_dim(slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        mask = 1.0 - ramp  # DeepSeek's inv_freq_mask: 1 where the frequency is kept
        inv = (1.0 / (f * pos_freqs)) * (1 - mask) + (1.0 / pos_freqs) * mask
        att = yarn_get_mscale(f, rs.get("mscale", 1)) / yarn_get_mscale(f, rs.get("mscale_all_dim", 0))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    emb = torch.cat((ang, ang), dim=-1).double()
    return emb.cos() * att, emb.sin() * att


def rope(c, x, cos, sin):
    """DeepSeek's apply_rotary_pos_emb on (B, h, T, d): pairs de-interleaved first unless rope_interleave is
    false (transformers' other branch)."""
    if c.get("rope_interleave", True):
        b, h, s, d = x.shape
        x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return x * cos + rotate_half(x) * sin


def attention(c, p, x, cos, sin):
    B, T, _ = x.shape
    nh, dn, dr, dv, r = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"],
                         c["kv_lora_rank"])
    if c["q_lora_rank"] is None:
        q = x @ p["self_attn.q_proj.weight"].T
    else:
        qa = rms_norm(x @ p["self_attn.q_a_proj.weight"].T, p["self_attn.q_a_layernorm.weight"], LATENT_EPS)
        q = qa @ p["self_attn.q_b_proj.weight"].T
    q = q.view(B, T, nh, dn + dr).transpose(1, 2)
    q_nope, q_pe = torch.split(q, [dn, dr], dim=-1)
    ckv = x @ p["self_attn.kv_a_proj_with_mqa.weight"].T
    latent, k_pe = torch.split(ckv, [r, dr], dim=-1)
    k_pe = k_pe.view(B, T, 1, dr).transpose(1, 2)
    kv = rms_norm(latent, p["self_attn.kv_a_layernorm.weight"], LATENT_EPS) @ p["self_attn.kv_b_proj.weight"].T
    kv = kv.view(B, T, nh, dn + dv).transpose(1, 2)
    k_nope, v = torch.split(kv, [dn, dv], dim=-1)
    q_pe, k_pe = rope(c, q_pe, cos, sin), rope(c, k_pe, cos, sin)
    query = torch.cat((q_nope, q_pe), dim=-1)
    key = torch.cat((k_nope, k_pe.expand(B, nh, T, dr)), dim=-1)
    scale = (dn + dr) ** -0.5
    rs = c.get("rope_scaling")
    if rs and rs.get("mscale_all_dim", 0):
        m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
        scale = scale * m * m
    s = query @ key.transpose(2, 3) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, nh * dv)
    return o @ p["self_attn.o_proj.weight"].T


def margin_of(values, n):
    """The smallest gap between each row's n-th and (n+1)-th largest value."""
    if n >= values.shape[1]:
        return 1.0
    top = torch.sort(values, dim=1, descending=True).values
    return float((top[:, n - 1] - top[:, n]).min())


def gate(family, c, p, h, margins):
    """MoEGate / DeepseekV3TopkRouter: the chosen experts (N, k) and their combine weights."""
    E, k, method = c["n_routed_experts"], c["num_experts_per_tok"], c["topk_method"]
    logits = h @ p["mlp.gate.weight"].T
    scores = logits.sigmoid() if c["scoring_func"] == "sigmoid" else logits.softmax(dim=-1)
    choice = scores.detach().clone()
    if method == "noaux_tc":
        choice = choice + p["mlp.gate.e_score_correction_bias"].detach()
    G = c.get("n_group") or 1
    if method in ("group_limited_greedy", "noaux_tc") and G > 1:
        grouped = choice.view(-1, G, E // G)
        gs = grouped.max(dim=-1).values if method == "group_limited_greedy" else grouped.topk(2, dim=-1)[0].sum(-1)
        margins.append(margin_of(gs, c["topk_group"]))
        gidx = torch.topk(gs, k=c["topk_group"], dim=-1)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        choice = choice.masked_fill(~smask.bool(), 0.0)
    margins.append(margin_of(choice, k))
    idx = torch.topk(choice, k=k, dim=-1)[1]
    w = scores.gather(1, idx)
    seq_aux = None
    alpha = c.get("libmoe_seq_aux_alpha", 0)
    if alpha:  # per batch row: f_i = E / (k T) x its tokens choosing i, P_i = the mean normalized score
        B, T = h.shape[0] // c["seq_len"], c["seq_len"]
        chosen = torch.zeros_like(scores).scatter_(1, idx, 1.0).view(B, T, E)
        f = chosen.sum(dim=1) * (E / (k * T))
        P = (scores / scores.sum(dim=1, keepdim=True)).view(B, T, E).mean(dim=1)
        seq_aux = alpha * (f * P).sum(dim=1).mean()
    normed = k > 1 and c["norm_topk_prob"]
    if normed:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    if family == "deepseek_v3" or not normed:
        w = w * c["routed_scaling_factor"]
    return idx, w, seq_aux


def moe(family, c, p, x, margins):
    B, T, D = x.shape
    h = x.reshape(-1, D)
    idx, w, seq_aux = gate(family, c, p, h, margins)
    if seq_aux is not None:
        c["seq_aux_terms"].append(seq_aux)
    out = torch.zeros_like(h)
    for e in range(c["n_routed_experts"]):
        tok, slot = torch.where(idx == e)
        if len(tok):
            out = out.index_add(0, tok, swiglu_mlp(p, f"mlp.experts.{e}.", h[tok]) * w[tok, slot, None])
    if c.get("n_shared_experts"):
        out = out + swiglu_mlp(p, "mlp.shared_experts.", h)
    return out.reshape(B, T, D)


def forward(family, c, params, tokens, targets):
    """Logits, ce, aux (0), loss, the smallest routing margin and 1.0 (no clamp), in float64."""
    c = dict(hf_config(family, c), libmoe_seq_aux_alpha=c.get("libmoe_seq_aux_alpha", 0), seq_aux_terms=[],
             seq_len=tokens.shape[1])
    T, eps = tokens.shape[1], c["rms_norm_eps"]
    cos, sin = rotary(c, T)
    x = params["model.embed_tokens.weight"][tokens]
    margins = [1.0]
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p = {n[len(pre):]: t for n, t in params.items() if n.startswith(pre)}
        x = x + attention(c, p, rms_norm(x, p["input_layernorm.weight"], eps), cos, sin)
        xn = rms_norm(x, p["post_attention_layernorm.weight"], eps)
        x = x + (moe(family, c, p, xn, margins) if is_moe(c, i) else swiglu_mlp(p, "mlp.", xn))
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
    logits = x @ head.T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    aux = torch.zeros((), dtype=torch.float64)
    loss = ce + sum(c["seq_aux_terms"]) if c["seq_aux_terms"] else ce
    return logits, ce, aux, loss, min(margins), 1.0


def main(argv):
    outdir = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "fixtures", "lm")
    torch.use_deterministic_algorithms(True)
    for name, family, seed, c, B, T in CASES:
        generate(name, family, seed, dict(BASE, **c), B, T, outdir, (param_shapes, forward, hf_config))


if __name__ == "__main__":
    main(sys.argv)
