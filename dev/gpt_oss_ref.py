#!/usr/bin/python3
"""A PyTorch float64 re-implementation of Hugging Face's gpt-oss (GptOssForCausalLM), without the transformers
package, and the fixtures of libmoe's language model for it (tests/fixtures/lm/gpt_oss*/), in the style of
dev/lm_families_ref.py, whose fixture writer it shares. Written from transformers' files, read at these commits
of huggingface/transformers:

  models/gpt_oss/modeling_gpt_oss.py       00d4b3d2142cb4ced2f51b90614b5d26bc045015
  models/gpt_oss/configuration_gpt_oss.py  02b8f42b4240dddea1b27c45d2dc95fb2682f841
  integrations/mxfp4.py                    0189b1d09a03a87ec4f59831acb93cc1832d14e7 (convert_moe_packed_tensors)

What gpt-oss does (beside what every family does: RMSNorm, pre-norm blocks, GQA, tied or untied head):
  attention  q/k/v/o projections with biases (attention_bias); head_dim given, not hidden_size / heads; the
             rotary embedding on the two halves of each head (_apply_rotary_emb: rotate_half's convention);
             each head's learned `sinks` logit concatenated to its scaled, masked scores, the softmax taken
             over both and the sink's column dropped (eager_attention_forward); layer_types: a
             "sliding_attention" layer sees its own key and the sliding_window - 1 before it (masking_utils'
             kv_idx > q_idx - sliding_window), a "full_attention" layer all earlier ones.
  router     logits = x W^T + b (GptOssTopKRouter), the top-k logits softmaxed among themselves.
  experts    gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] ((E, D, 2H): x @ W, not W^T), gate the even
             columns, up the odd ones; gate clamped above at swiglu_limit, up to [-limit, limit];
             (up + 1) * gate * sigmoid(alpha gate) @ down_proj[e] ((E, H, D)) + down_proj_bias[e], weighted.
  loss       cross-entropy, and with output_router_logits true (gpt_oss_aux) router_aux_loss_coef times
             load_balancing_loss_func over what GptOssModel records as router_logits: GptOssTopKRouter's
             output 0, its scores (the top-k softmax scattered into zeros), which that function softmaxes
             again over all experts (the layers concatenated, no attention mask).
  rope       plain rotary embeddings with "rope_scaling": null (gpt_oss, gpt_oss_mxfp4), or YaRN as
             modeling_rope_utils._compute_yarn_parameters computes it (gpt_oss_yarn: the releases' kind of
             rope_scaling, truncate false, factor = max_position_embeddings / original_max_position_embeddings
             so that both of transformers' readings of the factor agree): inv_freq blended between the
             interpolated and extrapolated frequencies by a linear ramp over the correction range (not
             rounded to whole dimensions when truncate is false), cos and sin times 0.1 ln(factor) + 1.

The model is drawn small and random and written as a Hugging Face checkpoint directory (config.json,
model.safetensors with the HF names and layout); ref.safetensors holds the float64 logits, loss and every
parameter's gradient under its HF name, and the fused experts' gradients also in libmoe's layout under the
names the library holds them (mlp.experts.fc1.weight (E, H, D) = gate_up's even columns transposed, fc3 the
odd ones, fc1.bias / fc3.bias the even / odd bias entries, fc2.weight (E, D, H) = down_proj transposed).
The expert matrices are drawn as MXFP4 values (a 4-bit e2m1 value times a power of two per 32 along the
input dimension), so that gpt_oss_mxfp4/ holds the same model with its experts as the checkpoints store them
(gate_up_proj_blocks / _scales, down_proj_blocks / _scales, quantization_config mxfp4) and the same reference.
A case is drawn again (next seed) when a token's k-th and (k+1)-th router logits are within 0.04 (fp32, fp64 and
the bf16 experts' test must route alike) or a gate or up value of a routed token lies within 1e-4 of a clamp
bound (fp32 and fp64 must take the same side).

Usage: /usr/bin/python3 dev/gpt_oss_ref.py [outdir]   (default: <repo>/tests/fixtures/lm)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import swiglu_oai  # noqa: E402
from lm_families_ref import write_case  # noqa: E402
from mixtral_ref import rms_norm, rope_cos_sin  # noqa: E402

CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=12, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_theta=10000.0,
              rms_norm_eps=1e-5, swiglu_alpha=1.702, swiglu_limit=1.5, attention_bias=True,
              tie_word_embeddings=False, router_aux_loss_coef=0.9)
YARN = dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096, beta_fast=32.0,
                               beta_slow=1.0, truncate=False), max_position_embeddings=16384)
SEED, B, T = 53, 2, 9  # T > 2 sliding_window: the window cuts the context, also in the cached decode test
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def hf_config(c, mxfp4=False):
    """config.json as a gpt-oss release has it (its experts_per_token and initial_context_length included)."""
    full = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_act="silu",
                max_position_embeddings=64, initializer_range=0.02, attention_dropout=0.0, output_router_logits=False,
                use_cache=True, eos_token_id=2, pad_token_id=1, torch_dtype="float32", transformers_version="4.56.0",
                rope_scaling=None, experts_per_token=c["num_experts_per_tok"], initial_context_length=4096)
    if mxfp4:
        full["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    full.update(c)
    return full


def param_shapes(c):
    """(name, shape) of every parameter, in the order of the modules' definitions."""
    D, V, hd, E, H = c["hidden_size"], c["vocab_size"], c["head_dim"], c["num_local_experts"], c["intermediate_size"]
    qd, kvd = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out += [(p + "input_layernorm.weight", (D,)), (a + "sinks", (c["num_attention_heads"],)),
                (a + "q_proj.weight", (qd, D)), (a + "q_proj.bias", (qd,)), (a + "k_proj.weight", (kvd, D)),
                (a + "k_proj.bias", (kvd,)), (a + "v_proj.weight", (kvd, D)), (a + "v_proj.bias", (kvd,)),
                (a + "o_proj.weight", (D, qd)), (a + "o_proj.bias", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                (p + "mlp.router.weight", (E, D)), (p + "mlp.router.bias", (E,)),
                (p + "mlp.experts.gate_up_proj", (E, D, 2 * H)), (p + "mlp.experts.gate_up_proj_bias", (E, 2 * H)),
                (p + "mlp.experts.down_proj", (E, H, D)), (p + "mlp.experts.down_proj_bias", (E, D))]
    return out + [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]


def apply_rotary(x, cos, sin):
    """_apply_rotary_emb: the first and second halves of each head, cos and sin of half a head."""
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def attention(c, i, p, x, cos, sin):
    Bn, Tn, _ = x.shape
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q, k, v = (x @ p[f"self_attn.{n}_proj.weight"].T + p[f"self_attn.{n}_proj.bias"] for n in "qkv")
    q = q.view(Bn, Tn, nh, hd).transpose(1, 2)
    k = k.view(Bn, Tn, nkv, hd).transpose(1, 2)
    v = v.view(Bn, Tn, nkv, hd).transpose(1, 2)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # repeat_kv
    s = q @ k.transpose(2, 3) * hd ** -0.5
    qi, ki = torch.arange(Tn)[:, None], torch.arange(Tn)[None, :]
    masked = ki > qi
    if c["layer_types"][i] == "sliding_attention":
        masked = masked | ~(ki > qi - c["sliding_window"])
    s = s.masked_fill(masked, float("-inf"))
    sinks = p["self_attn.sinks"].reshape(1, -1, 1, 1).expand(Bn, -1, Tn, 1)
    combined = torch.cat([s, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1)[..., :-1]  # the sink's column dropped
    o = (probs @ v).transpose(1, 2).reshape(Bn, Tn, nh * hd)
    return o @ p["self_attn.o_proj.weight"].T + p["self_attn.o_proj.bias"]


def moe(c, p, x, margins):
    """GptOssMLP's training path: the router, then each hit expert over its tokens, weighted and summed."""
    Bn, Tn, D = x.shape
    k, limit, alpha = c["num_experts_per_tok"], c["swiglu_limit"], c["swiglu_alpha"]
    h = x.reshape(-1, D)
    logits = h @ p["mlp.router.weight"].T + p["mlp.router.bias"]
    srt = torch.sort(logits.detach(), dim=1, descending=True).values
    margins["route"] = min(margins["route"], float((srt[:, k - 1] - srt[:, k]).min()))
    top, idx = torch.topk(logits, k, dim=-1)
    scores = torch.zeros_like(logits).scatter(1, idx, torch.softmax(top, dim=1))
    margins["scores"].append(scores)
    out = torch.zeros_like(h)
    for e in range(c["num_local_experts"]):
        tok = torch.where((idx == e).any(dim=1))[0]
        if not len(tok):
            continue
        gu = h[tok] @ p["mlp.experts.gate_up_proj"][e] + p["mlp.experts.gate_up_proj_bias"][e]
        gate, up = gu[..., ::2], gu[..., 1::2]
        margins["clamp"] = min(margins["clamp"], float((gate.detach() - limit).abs().min()),
                               float((up.detach().abs() - limit).abs().min()))
        margins["clamped"] += int((gate > limit).sum() + (up.abs() > limit).sum())
        y = swiglu_oai(gate, up, alpha, limit) @ p["mlp.experts.down_proj"][e] + p["mlp.experts.down_proj_bias"][e]
        out = out.index_add(0, tok, y * scores[tok, e, None])
    return out.reshape(Bn, Tn, D)


def yarn_cos_sin(T, dim, base, rs):
    """_compute_yarn_parameters (inv_freq in float32) and the rotary embedding's cos and sin times the
    attention factor; no mscale keys, so the factor is 0.1 ln(factor) + 1."""
    f, orig = rs["factor"], rs["original_max_position_embeddings"]

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = corr_dim(rs["beta_fast"]), corr_dim(rs["beta_slow"])
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra = 1 - ramp  # where the extrapolated (unscaled) frequency is kept
    inv = (1.0 / (f * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    emb = torch.cat((ang, ang), dim=-1).double()
    att = 0.1 * math.log(f) + 1.0
    return emb.cos() * att, emb.sin() * att


def forward(c, params, tokens, targets):
    Tn, eps, hd = tokens.shape[1], c["rms_norm_eps"], c["head_dim"]
    if c.get("rope_scaling"):
        cos, sin = yarn_cos_sin(Tn, hd, c["rope_theta"], c["rope_scaling"])
    else:
        cos, sin = rope_cos_sin(Tn, hd, c["rope_theta"])  # angles in float32 as transformers forms them
    cos, sin = cos[:, : hd // 2], sin[:, : hd // 2]
    x = params["model.embed_tokens.weight"][tokens]
    margins = {"route": math.inf, "clamp": math.inf, "clamped": 0, "scores": []}
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p = {n[len(pre):]: t for n, t in params.items() if n.startswith(pre)}
        x = x + attention(c, i, p, rms_norm(x, p["input_layernorm.weight"], eps), cos, sin)
        x = x + moe(c, p, rms_norm(x, p["post_attention_layernorm.weight"], eps), margins)
    logits = rms_norm(x, params["model.norm.weight"], eps) @ params["lm_head.weight"].T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    margins["aux"] = balance_loss(c, margins.pop("scores"))
    return logits, ce, margins


def balance_loss(c, scores):
    """load_balancing_loss_func (no attention mask) over the layers' recorded router outputs."""
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    routing = torch.softmax(torch.cat(scores, dim=0), dim=-1)
    _, sel = torch.topk(routing, k, dim=-1)
    tokens_per_expert = F.one_hot(sel, E).double().mean(dim=0)
    return (tokens_per_expert * routing.mean(dim=0).unsqueeze(0)).sum() * E


def mxfp4_draw(g, rows, K):
    """MXFP4 blocks and scales as the checkpoints store them (rows, K / 32, 16) and (rows, K / 32) of uint8,
    and their values (rows, K) as convert_moe_packed_tensors dequantizes them: value 2i of a block from the
    low nibble of byte i, 2i + 1 from the high one, times 2^(scale - 127)."""
    G = K // 32
    nib = torch.randint(0, 16, (rows, G, 32), generator=g)
    scales = torch.randint(127 - 5, 127 - 2, (rows, G), generator=g)
    blocks = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)
    vals = torch.tensor(FP4)[nib] * torch.pow(2.0, (scales - 127).float())[..., None]
    return blocks.numpy(), scales.to(torch.uint8).numpy(), vals.reshape(rows, K)


def draw(c, seed):
    """Parameters (HF layout, float32), the experts' MXFP4 tensors, tokens and targets."""
    g = torch.Generator().manual_seed(seed)
    E, H, D = c["num_local_experts"], c["intermediate_size"], c["hidden_size"]
    params, packed = {}, {}
    for name, shape in param_shapes(c):
        if name.endswith("gate_up_proj") or name.endswith("down_proj"):
            pre = name[: -len("gate_up_proj")] if name.endswith("gate_up_proj") else name[: -len("down_proj")]
            kind = "gate_up_proj" if name.endswith("gate_up_proj") else "down_proj"
            rows, K = (2 * H, D) if kind == "gate_up_proj" else (D, H)
            blocks, scales, vals = mxfp4_draw(g, E * rows, K)
            packed[pre + kind + "_blocks"] = blocks.reshape(E, rows, K // 32, 16)
            packed[pre + kind + "_scales"] = scales.reshape(E, rows, K // 32)
            t = vals.reshape(E, rows, K).transpose(1, 2).contiguous()  # convert_moe_packed_tensors' transpose
        elif name.endswith("sinks"):
            t = torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1]) * (2.0 if name.endswith("router.weight") else 1.0)
        params[name] = t.float()
    tokens = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    targets[0, -1] = -100  # an ignored position
    return params, packed, tokens, targets


def libmoe_grads(grads):
    """The fused experts' gradients in the layout libmoe holds them (its names), beside the HF ones."""
    out = []
    for n, gr in grads:
        out.append((n, gr))
        if n.endswith("mlp.experts.gate_up_proj"):
            pre = n[: -len("gate_up_proj")]
            out += [(pre + "fc1.weight", gr[..., 0::2].transpose(1, 2)), (pre + "fc3.weight", gr[..., 1::2].transpose(1, 2))]
        elif n.endswith("mlp.experts.gate_up_proj_bias"):
            pre = n[: -len("gate_up_proj_bias")]
            out += [(pre + "fc1.bias", gr[:, 0::2]), (pre + "fc3.bias", gr[:, 1::2])]
        elif n.endswith("mlp.experts.down_proj"):
            out.append((n[: -len("down_proj")] + "fc2.weight", gr.transpose(1, 2)))
    return out


def main(argv):
    outdir = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "fixtures", "lm")
    torch.use_deterministic_algorithms(True)
    one_case(outdir, CONFIG, "gpt_oss")
    one_case(outdir, dict(CONFIG, **YARN), "gpt_oss_yarn")
    one_case(outdir, dict(CONFIG, output_router_logits=True), "gpt_oss_aux")


def one_case(outdir, c, name):
    """Draws the case c (from SEED on, until its margins hold) and writes it as name/ (and, for the plain
    case, name_mxfp4/ with the experts as the checkpoints store them)."""
    seed = SEED
    while True:
        params, packed, tokens, targets = draw(c, seed)
        p64 = {n: t.double().requires_grad_() for n, t in params.items()}
        logits, ce, margins = forward(c, p64, tokens, targets)
        if margins["route"] > 0.04 and margins["clamp"] > 1e-4:
            break
        seed += 1000
    aux = margins["aux"] if c.get("output_router_logits") else torch.zeros(1, dtype=torch.float64)
    loss = ce + c["router_aux_loss_coef"] * aux if c.get("output_router_logits") else ce
    loss.backward()
    grads = libmoe_grads([(n, t.grad) for n, t in p64.items()])
    meta = {"seed": seed, "margin": f"{margins['route']:.6f}"}
    dense = [(n, t.numpy()) for n, t in params.items()]
    write_case(os.path.join(outdir, name), hf_config(c), dense, tokens, targets, logits, (loss, ce, aux), grads, meta)
    if not c.get("rope_scaling") and not c.get("output_router_logits"):
        fused = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
        quant = [(n, a) for n, a in dense if not n.endswith(fused)] + sorted(packed.items())
        write_case(os.path.join(outdir, name + "_mxfp4"), hf_config(c, mxfp4=True), quant, tokens, targets, logits,
                   (ce, ce, aux), grads, meta)
    assert margins["clamped"] > 0, "no value clamps: the clamped SwiGLU is not exercised"
    print(f"{name}: seed {seed}, loss {loss.item():.6f}, routing margin {margins['route']:.4f}, "
          f"clamp margin {margins['clamp']:.4f}, {margins['clamped']} values clamped")


if __name__ == "__main__":
    main(sys.argv)
