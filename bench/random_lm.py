"""A random language model in a Hugging Face layout (config.json, model.safetensors, the tokenizer's
files), for speed comparisons where the weights' values do not matter (bench/vs_llamacpp.sh,
bench/stream_budget.sh): Mixtral, Qwen2-MoE or Qwen3-MoE, normal weights of std 0.02 and unit norms,
from a fixed seed, in F32 or BF16; also OLMoE, gpt-oss (its fused experts with biases, attention sinks; with
--sliding-window W its layers alternate a W-token window and full attention, without it all are full) and
DeepSeek-V2 (latent attention: keys and values of --head-dim beside a rotary part half as wide, a kv
latent of --kv-lora-rank, default D/4; no dense layer, no shared expert, softmax routing renormalized). --pool draws every tensor from one block of 2^26 normals at random
offsets instead (a file of tens of GB in minutes; the values repeat, which changes no timing). --vocab V
without --tokenizer: no tokenizer files. numpy only; the safetensors file is written by hand (its format:
an 8-byte header length, a JSON header, the data).
usage: python3 bench/random_lm.py OUT_DIR (--tokenizer DIR | --vocab V)
       [--family mixtral|qwen2_moe|qwen3_moe|olmoe|gpt_oss|deepseek_v2]
       [--layers L] [--model D] [--heads NH] [--kv-heads NKV] [--head-dim HD] [--experts E] [--top-k K]
       [--hidden H] [--dtype f32|bf16] [--pool] [--max-pos P] [--sliding-window W] [--kv-lora-rank R]"""
import argparse
import json
import os
import shutil
import struct

import numpy as np


def tensors(a, vocab):
    """(name, shape) of every parameter, in HF order."""
    D, hd = a.model, a.head_dim
    q, kv = a.heads * hd, a.kv_heads * hd
    yield "model.embed_tokens.weight", (vocab, D)
    for i in range(a.layers):
        p = "model.layers.%d." % i
        yield p + "input_layernorm.weight", (D,)
        if a.family in ("gpt_oss", "deepseek_v2"):
            yield from other_layer(a, p)
            continue
        for n, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + "self_attn.%s_proj.weight" % n, (rows, D)
            if a.family == "qwen2_moe":
                yield p + "self_attn.%s_proj.bias" % n, (rows,)
        if a.family == "qwen3_moe":
            yield p + "self_attn.q_norm.weight", (hd,)
            yield p + "self_attn.k_norm.weight", (hd,)
        if a.family == "olmoe":  # the whole projected q and k
            yield p + "self_attn.q_norm.weight", (q,)
            yield p + "self_attn.k_norm.weight", (kv,)
        yield p + "self_attn.o_proj.weight", (D, q)
        yield p + "post_attention_layernorm.weight", (D,)
        if a.family == "mixtral":
            yield p + "block_sparse_moe.gate.weight", (a.experts, D)
            for e in range(a.experts):
                x = p + "block_sparse_moe.experts.%d." % e
                yield x + "w1.weight", (a.hidden, D)
                yield x + "w2.weight", (D, a.hidden)
                yield x + "w3.weight", (a.hidden, D)
        else:
            yield p + "mlp.gate.weight", (a.experts, D)
            for e in range(a.experts):
                x = p + "mlp.experts.%d." % e
                yield x + "gate_proj.weight", (a.hidden, D)
                yield x + "up_proj.weight", (a.hidden, D)
                yield x + "down_proj.weight", (D, a.hidden)
            if a.family in ("qwen3_moe", "olmoe"):
                continue
            x = p + "mlp.shared_expert."
            yield x + "gate_proj.weight", (a.hidden, D)
            yield x + "up_proj.weight", (a.hidden, D)
            yield x + "down_proj.weight", (D, a.hidden)
            yield p + "mlp.shared_expert_gate.weight", (1, D)
    yield "model.norm.weight", (D,)
    yield "lm_head.weight", (vocab, D)


def other_layer(a, p):
    """(name, shape) of a gpt-oss or DeepSeek-V2 layer past its input norm."""
    D, hd, E, H = a.model, a.head_dim, a.experts, a.hidden
    if a.family == "gpt_oss":
        q, kv = a.heads * hd, a.kv_heads * hd
        for n, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + "self_attn.%s_proj.weight" % n, (rows, D)
            yield p + "self_attn.%s_proj.bias" % n, (rows,)
        yield p + "self_attn.o_proj.weight", (D, q)
        yield p + "self_attn.o_proj.bias", (D,)
        yield p + "self_attn.sinks", (a.heads,)
        yield p + "post_attention_layernorm.weight", (D,)
        yield p + "mlp.router.weight", (E, D)
        yield p + "mlp.router.bias", (E,)
        x = p + "mlp.experts."
        yield x + "gate_up_proj", (E, D, 2 * H)
        yield x + "gate_up_proj_bias", (E, 2 * H)
        yield x + "down_proj", (E, H, D)
        yield x + "down_proj_bias", (E, D)
        return
    rope, r = hd // 2, a.kv_lora_rank
    yield p + "self_attn.q_proj.weight", (a.heads * (hd + rope), D)
    yield p + "self_attn.kv_a_proj_with_mqa.weight", (r + rope, D)
    yield p + "self_attn.kv_a_layernorm.weight", (r,)
    yield p + "self_attn.kv_b_proj.weight", (a.heads * 2 * hd, r)
    yield p + "self_attn.o_proj.weight", (D, a.heads * hd)
    yield p + "post_attention_layernorm.weight", (D,)
    yield p + "mlp.gate.weight", (E, D)
    for e in range(E):
        x = p + "mlp.experts.%d." % e
        yield x + "gate_proj.weight", (H, D)
        yield x + "up_proj.weight", (H, D)
        yield x + "down_proj.weight", (D, H)


def config(a, vocab):
    arch = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "olmoe": "OlmoeForCausalLM", "gpt_oss": "GptOssForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM"}
    c = {"architectures": [arch[a.family]],
         "model_type": a.family, "vocab_size": vocab, "hidden_size": a.model, "num_hidden_layers": a.layers,
         "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "max_position_embeddings": a.max_pos,
         "rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": False, "num_experts_per_tok": a.top_k}
    if a.family == "mixtral":
        c.update(intermediate_size=a.hidden, num_local_experts=a.experts, sliding_window=None)
    elif a.family == "olmoe":
        c.update(intermediate_size=a.hidden, num_experts=a.experts, norm_topk_prob=False, clip_qkv=None)
    elif a.family == "gpt_oss":
        full = not a.sliding_window
        c.update(intermediate_size=a.hidden, num_local_experts=a.experts, experts_per_token=a.top_k,
                 head_dim=a.head_dim, attention_bias=True, sliding_window=a.sliding_window or 128, rope_scaling=None,
                 layer_types=["full_attention" if full or i % 2 else "sliding_attention" for i in range(a.layers)],
                 swiglu_alpha=1.702, swiglu_limit=7.0)
    elif a.family == "deepseek_v2":
        c.update(intermediate_size=a.hidden, moe_intermediate_size=a.hidden, n_routed_experts=a.experts,
                 n_shared_experts=None, first_k_dense_replace=0, moe_layer_freq=1, kv_lora_rank=a.kv_lora_rank,
                 q_lora_rank=None, qk_nope_head_dim=a.head_dim, qk_rope_head_dim=a.head_dim // 2,
                 v_head_dim=a.head_dim, topk_method="greedy", scoring_func="softmax", n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=1.0, rope_scaling=None, num_key_value_heads=a.heads)
    elif a.family == "qwen3_moe":
        c.update(moe_intermediate_size=a.hidden, intermediate_size=a.hidden, num_experts=a.experts, head_dim=a.head_dim,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        c.update(moe_intermediate_size=a.hidden, intermediate_size=a.hidden, num_experts=a.experts,
                 shared_expert_intermediate_size=a.hidden, norm_topk_prob=False, decoder_sparse_step=1,
                 mlp_only_layers=[])
    return c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--tokenizer")
    p.add_argument("--family", default="mixtral",
                   choices=["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2"])
    for flag, v in (("layers", 8), ("model", 1024), ("heads", 16), ("kv-heads", 8), ("head-dim", 0), ("experts", 8),
                    ("top-k", 2), ("hidden", 1792), ("vocab", 0), ("max-pos", 4096), ("sliding-window", 0),
                    ("kv-lora-rank", 0)):
        p.add_argument("--" + flag, type=int, default=v)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--pool", action="store_true")
    a = p.parse_args()
    a.head_dim = a.head_dim or a.model // a.heads
    a.kv_lora_rank = a.kv_lora_rank or a.model // 4
    if bool(a.tokenizer) == bool(a.vocab):
        p.error("one of --tokenizer and --vocab")
    vocab = a.vocab
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer:
        with open(os.path.join(a.tokenizer, "tokenizer.json")) as f:
            tok = json.load(f)
        vocab = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok.get("added_tokens", []))]) + 1
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    names = list(tensors(a, vocab))
    esize = 2 if a.dtype == "bf16" else 4
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for n, shape in names:
        size = esize * int(np.prod(shape))
        header[n] = {"dtype": a.dtype.upper(), "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    rng = np.random.default_rng(0)

    def encode(x):  # the file's bytes: F32, or BF16 (the high half of each float, rounded to nearest even)
        x = np.ascontiguousarray(x, "<f4")
        if esize == 2:
            u = x.view("<u4")
            x = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        return x.tobytes()

    pool = encode(rng.standard_normal(1 << 26, np.float32) * 0.02) if a.pool else None
    tmp = os.path.join(a.out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n, shape in names:
            size = esize * int(np.prod(shape))
            if n.endswith("norm.weight"):
                f.write(encode(np.ones(shape, np.float32)))
            elif pool is None:
                f.write(encode(rng.standard_normal(shape, np.float32) * 0.02))
            else:  # whole values from a random place in the pool, wrapping around
                at = int(rng.integers(0, len(pool) // esize)) * esize
                while size:
                    k = min(size, len(pool) - at)
                    f.write(memoryview(pool)[at:at + k])
                    size, at = size - k, 0
    os.replace(tmp, os.path.join(a.out, "model.safetensors"))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a, vocab), f, indent=1)
    print("%s: %s, %d parameters" % (a.out, a.family, sum(int(np.prod(s)) for _, s in names)))


main()
