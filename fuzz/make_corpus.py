#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into fuzz/corpus/<target>/: real files made by the moe
CLI (tiny checkpoints, their trace and placement) and by hand (IDX, JSON). usage: make_corpus.py MOE
(the moe binary of a build, e.g. build/moe). Run again after a format changes; the output is small."""
import json, os, shutil, struct, subprocess, sys, tempfile

import numpy as np

moe = os.path.abspath(sys.argv[1])
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
tmp = tempfile.mkdtemp()

def put(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)

def run(*args):
    subprocess.run([moe, *args], check=True, stdout=subprocess.DEVNULL, cwd=tmp)

def idx(n, h, w, seed):  # (labels file, images file) of n h x w images, labels 0-9
    pix = bytes((seed * 31 + i * 17) % 256 for i in range(n * h * w))
    return (struct.pack(">II", 0x801, n) + bytes((seed + i) % 10 for i in range(n)),
            struct.pack(">IIII", 0x803, n, h, w) + pix)

def read(name):
    with open(os.path.join(tmp, name), "rb") as f:
        return f.read()

shutil.rmtree(root, ignore_errors=True)
# A data set for the CLI, and the IDX seeds: the fuzz_idx input is k, k bytes of labels, then images.
data = os.path.join(tmp, "data")
os.makedirs(data)
for split, n in (("train", 32), ("t10k", 16)):
    lab, img = idx(n, 4, 4, n)
    open(os.path.join(data, f"{split}-labels-idx1-ubyte"), "wb").write(lab)
    open(os.path.join(data, f"{split}-images-idx3-ubyte"), "wb").write(img)
for i, (n, h, w) in enumerate(((3, 2, 2), (5, 4, 3), (1, 1, 1))):
    lab, img = idx(n, h, w, i)
    put("idx", f"seed{i}", bytes([len(lab)]) + lab + img)

# Checkpoints (f32 + adam, bf16 + sgd with hierarchical experts, dynamic capacities): checkpoint and
# safetensors seeds.
small = ["--data", data, "--hidden", "4", "--model", "4", "--epochs", "1", "--batch", "8", "--augment", "0"]
run("train", *small, "--experts", "4", "--blocks", "2", "--checkpoint", "f32.st", "--trace", "trace.csv")
run("train", *small, "--experts", "2", "--dtype", "bf16", "--optimizer", "sgd", "--activation", "swiglu",
    "--checkpoint", "bf16.st")
run("train", *small, "--experts", "2", "--hier-experts", "2", "--checkpoint", "hier.st")
run("train", *small, "--experts", "2", "--capacity", "dynamic", "--dispatch", "static", "--checkpoint", "cap.st")
for name in ("f32.st", "bf16.st", "hier.st", "cap.st"):
    put("checkpoint", name, read(name))
    put("safetensors", name, read(name))
# The language-model families' checkpoints (fuzz_checkpoint reads an input starting with '{' as
# config.json, NUL, model.safetensors): the fixtures' config.json alone (their weights are the fixtures'),
# and tiny models of each family whole, drawn by the fixture generators.
dev = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev")
sys.path.insert(0, dev)
import deepseek_ref, lm_families_ref, mixtral_ref  # noqa: E402
from gen_fixtures import write_safetensors  # noqa: E402
fixtures = os.path.join(dev, "..", "tests", "fixtures", "lm")
for fam in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3"):
    with open(os.path.join(fixtures, fam, "config.json"), "rb") as f:
        put("checkpoint", f"lm_{fam}.json", f.read())
tiny_lm = {}  # family -> (config, safetensors bytes), for the GGUF seeds
tiny = dict(vocab_size=8, hidden_size=8, intermediate_size=4, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, num_experts_per_tok=2, rope_theta=10000.0, rms_norm_eps=1e-5,
            router_aux_loss_coef=0.01, tie_word_embeddings=False)
for fam in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
    c = dict(tiny)
    if fam == "mixtral":
        c.update(head_dim=4, num_local_experts=2)
        shapes, config = mixtral_ref.param_shapes(c), mixtral_ref.hf_config(c)
    else:
        c.update(num_experts=2, moe_intermediate_size=4, shared_expert_intermediate_size=4, mlp_only_layers=[1],
                 head_dim=4, clip_qkv=2.0)
        for k in {"qwen2_moe": ("head_dim", "clip_qkv"), "qwen3_moe": ("shared_expert_intermediate_size", "clip_qkv"),
                  "olmoe": ("head_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
                            "mlp_only_layers")}[fam]:
            del c[k]
        shapes, config = lm_families_ref.param_shapes(fam, c), lm_families_ref.hf_config(fam, c)
    path = os.path.join(tmp, f"{fam}.safetensors")
    write_safetensors(path, [(n, np.full(s, 0.5, np.float32)) for n, s in shapes], {"format": "pt"})
    put("checkpoint", f"lm_{fam}_tiny", json.dumps(config, sort_keys=True).encode() + b"\0" + read(path))
    tiny_lm[fam] = (config, read(path))
# gpt-oss: the fixtures' configs (dense and MXFP4 experts), and tiny models whole, the MXFP4 one's experts as
# blocks and scales (rows of 32 values: D = H = 32).
import gpt_oss_ref  # noqa: E402
for name in ("gpt_oss", "gpt_oss_mxfp4"):
    with open(os.path.join(fixtures, name, "config.json"), "rb") as f:
        put("checkpoint", f"lm_{name}.json", f.read())
for name, D in (("gpt_oss", 8), ("gpt_oss_mxfp4", 32)):
    c = dict(tiny, hidden_size=D, intermediate_size=D, head_dim=4, num_local_experts=2, sliding_window=2,
             swiglu_alpha=1.702, swiglu_limit=7.0, attention_bias=True, router_aux_loss_coef=0.9)
    tensors = []
    for n, s in gpt_oss_ref.param_shapes(c):
        if D == 32 and n.endswith(("gate_up_proj", "down_proj")):
            rows = 2 * D if n.endswith("gate_up_proj") else D
            tensors += [(n + "_blocks", np.full((2, rows, 1, 16), 0x21, np.uint8)),
                        (n + "_scales", np.full((2, rows, 1), 126, np.uint8))]
        else:
            tensors.append((n, np.full(s, 0.5, np.float32)))
    path = os.path.join(tmp, f"{name}.safetensors")
    write_safetensors(path, tensors, {"format": "pt"})
    config = gpt_oss_ref.hf_config(c, mxfp4=D == 32)
    put("checkpoint", f"lm_{name}_tiny", json.dumps(config, sort_keys=True).encode() + b"\0" + read(path))
for fam in ("deepseek_v2", "deepseek_v3"):  # latent attention, a dense first layer, YaRN on V3
    c = dict(deepseek_ref.BASE, vocab_size=8, hidden_size=8, intermediate_size=4, num_attention_heads=2,
             num_key_value_heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
             moe_intermediate_size=4, num_hidden_layers=2, q_lora_rank=4 if fam == "deepseek_v3" else None,
             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
             topk_method="noaux_tc" if fam == "deepseek_v3" else "greedy", n_group=2, topk_group=1,
             scoring_func="sigmoid" if fam == "deepseek_v3" else "softmax", norm_topk_prob=True,
             routed_scaling_factor=2.0, rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=16,
                                                          mscale_all_dim=1.0) if fam == "deepseek_v3" else None)
    shapes, config = deepseek_ref.param_shapes(fam, c), deepseek_ref.hf_config(fam, c)
    path = os.path.join(tmp, f"{fam}.safetensors")
    write_safetensors(path, [(n, np.full(s, 0.5, np.float32)) for n, s in shapes], {"format": "pt"})
    put("checkpoint", f"lm_{fam}_tiny", json.dumps(config, sort_keys=True).encode() + b"\0" + read(path))

# Traces: the CLI's, and a hand-written one with CRLF and a gap in the steps.
put("trace", "train.csv", read("trace.csv"))
run("trace", "--checkpoint", "f32.st", "--data", data, "--batch", "4", "--out", "infer.csv")
put("trace", "infer.csv", read("infer.csv"))
put("trace", "crlf.csv", b"step,layer,expert,tokens\r\n0,0,1,3\r\n0,1,7,2\r\n4,0,0,9\r\n")
put("trace", "expert65535.csv", b"step,layer,expert,tokens\n0,0,65535,1\n1,0,3,2\n")  # once 32 GiB in anticorr

# Placements of the trace: 8 experts on 2 devices (the target asks for layers 0 and 1).
lines = ["step,layer,expert,tokens"] + [f"{s},{l},{e},{1 + (s * 7 + e * 3 + l) % 5}"
                                         for s in range(6) for l in range(2) for e in range(8) if (s + e) % 3]
open(os.path.join(tmp, "t8.csv"), "w").write("\n".join(lines) + "\n")
put("trace", "t8.csv", read("t8.csv"))
for m in ("greedy", "anticorr"):
    run("placement", "--trace", "t8.csv", "--devices", "2", "--method", m, "--layer", "all", "--out", f"{m}.json")
    put("placement", f"{m}.json", read(f"{m}.json"))
    put("json", f"{m}.json", read(f"{m}.json"))

# A tokenizer trained on the tokenizer tests' sample (300 ids).
sample = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer_sample.txt")
run("tokenizer", "train", "--data", sample, "--vocab", "300", "--out", "tok300.json")
put("tokenizer", "sample300.json", read("tok300.json"))

# JSON: a safetensors header, and the value kinds.
ck = read("f32.st")
put("json", "header.json", ck[8:8 + struct.unpack("<Q", ck[:8])[0]])
put("json", "kinds.json", b' {"a": [1, -2.5e-3, true, false, null], "s": "\\u00e9\\n\\"", "o": {}} \n')
# moe serve's request bodies: text and ids prompts, every field, a character split at the end.
put("completion", "text.json", b'{"prompt": "the cat", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stream": true}')
put("completion", "ids.json", b'{"prompt": [1, 2, 3], "max_tokens": 60}')
put("completion", "utf8.json", b'{"prompt": "caf\xc3\xa9 \xe2\x82", "model": "moe", "stream": false}')
put("completion", "fields.json", b'{"prompt": [4], "ignore_eos": true, "user": "u", "n": 1, "echo": false, "stop": ["t", "cat"], "logit_bias": {}, "presence_penalty": 0}')
shutil.rmtree(tmp)

# tokenizer_json: small hand-made tokenizer.json files of each kind the loader takes (a few KB each).
def tokenizer_json_seeds(put):
    import json
    bl = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    chars = {b: chr(b) for b in bl}
    chars.update({b: chr(256 + k) for k, b in enumerate(b for b in range(256) if b not in chars)})
    def byte_vocab(extra):  # GPT-2's 256 byte characters, then extra tokens made of them
        v = {chars[b]: i for i, b in enumerate(sorted(range(256), key=lambda b: (b not in bl, b)))}
        for t in extra:
            v[t] = len(v)
        return v
    G = "\u0120"  # GPT-2's character for the space
    added = lambda *ts: [dict(id=i, content=c, special=s, lstrip=l, rstrip=r, single_word=w, normalized=False)
                         for i, c, s, l, r, w in ts]
    bl_model = lambda extra, merges, **kw: dict(type="BPE", vocab=byte_vocab(extra), merges=merges, **kw)
    byte_level = lambda regex: {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": regex}
    split = lambda rx, b="Isolated": {"type": "Split", "pattern": {"Regex": rx}, "behavior": b, "invert": False}
    files = {
        "gpt2.json": dict(added_tokens=added((259, "<|endoftext|>", True, False, False, False)), normalizer=None,
                          pre_tokenizer=byte_level(True), post_processor=byte_level(True), decoder=byte_level(True),
                          model=bl_model([G + "t", G + "th", "<|endoftext|>"], [G + " t", [G + "t", "h"]])),
        "llama3.json": dict(added_tokens=added((258, "<|begin_of_text|>", True, False, False, False)), normalizer={"type": "NFC"},
                            pre_tokenizer={"type": "Sequence", "pretokenizers": [split(
                                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), byte_level(False)]},
                            post_processor={"type": "Sequence", "processors": [byte_level(True), {
                                "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                                "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [258]}}}]},
                            decoder=byte_level(True), model=bl_model(["Th", "The"], ["T h", ["Th", "e"]], ignore_merges=True)),
        "deepseek.json": dict(added_tokens=added((257, "<\uff5cbegin\u2581of\u2581sentence\uff5c>", True, False, False, False)),
                              normalizer={"type": "Sequence", "normalizers": []},
                              pre_tokenizer={"type": "Sequence", "pretokenizers": [split("\\p{N}{1,3}"), split("[\u4e00-\u9fa5]+"),
                                             split("\\s+(?!\\S)|\\s+", "MergedWithNext"), byte_level(False)]},
                              decoder=byte_level(True), model=bl_model(["ab"], ["a b"])),
        "llama2.json": dict(added_tokens=added((0, "<unk>", True, False, False, False), (1, "<s>", True, False, False, False),
                                               (2, "</s>", True, False, False, False), (9, "<mask>", False, True, True, False)),
                            normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
                            pre_tokenizer=None,
                            post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}],
                                            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
                            decoder={"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                     {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                            model=dict(type="BPE", unk_token="<unk>", fuse_unk=True, byte_fallback=True, vocab={
                                "<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "\u2581": 6, "a": 7,
                                "\u2581a": 8, "<mask>": 9, "T": 10, "h": 11, "e": 12, "\u2581T": 13}, merges=["\u2581 a", "\u2581 T"])),
        # Gemma 3's form: " " -> "▁" without Prepend, a Split on " " (a no-op after it), merges as pairs,
        # non-special added tokens, one added token past the vocabulary, no Strip decoder
        "gemma3.json": dict(added_tokens=added((0, "<pad>", True, False, False, False), (1, "<eos>", True, False, False, False),
                                               (2, "<bos>", True, False, False, False), (3, "<unk>", True, False, False, False),
                                               (4, "<start_of_turn>", True, False, False, False), (5, "<unused0>", False, False, False, False),
                                               (6, "\n\n", False, False, False, False), (17, "<image_soft_token>", True, False, False, False)),
                            normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                            pre_tokenizer={"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
                            post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}],
                                            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
                            decoder={"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                     {"type": "ByteFallback"}, {"type": "Fuse"}]},
                            model=dict(type="BPE", unk_token="<unk>", fuse_unk=True, byte_fallback=True, ignore_merges=False, vocab={
                                "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 4, "<unused0>": 5, "\n\n": 6,
                                "<0x0A>": 7, "<0xF0>": 8, "<0x9F>": 9, "\u2581": 10, "T": 11, "h": 12, "e": 13, "Th": 14, "The": 15,
                                "\u2581\u2581": 16}, merges=[["T", "h"], ["Th", "e"], ["\u2581", "\u2581"]])),
        "metaspace.json": dict(added_tokens=added((0, "<pad>", True, False, False, False), (1, "[X]", False, False, False, True)),
                               normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                           {"type": "Strip", "strip_left": True, "strip_right": True}]},
                               pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                              {"type": "Punctuation", "behavior": "Contiguous"},
                                              {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]},
                               post_processor={"type": "RobertaProcessing", "sep": ["</s>", 3], "cls": ["<s>", 2]},
                               decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
                               model=dict(type="BPE", unk_token="<unk>", vocab={"<pad>": 0, "[X]": 1, "<s>": 2, "</s>": 3, "<unk>": 4,
                                          "\u2581": 5, "t": 6, "h": 7, "e": 8, "\u2581t": 9, "1": 10, ".": 11}, merges=["\u2581 t"])),
    }
    for name, j in files.items():
        put("tokenizer_json", name, json.dumps(j, ensure_ascii=False).encode())

tokenizer_json_seeds(put)


# gguf_lm: each family's tiny model as a GGUF file (moe convert --type q8_0: its rows of 8 go to F16),
# gpt-oss's MXFP4 fixture as MXFP4,
# and a Mixtral-shaped one with each kind of tokenizer of the tokenizer_json seeds as tokenizer.ggml.*
# keys (gpt2 and llama3: byte-level "gpt2" with pre gpt-2 / llama-bpe; llama2: byte fallback, "llama").
def gguf_lm_seeds():
    global tmp
    tmp = tempfile.mkdtemp()
    def checkpoint(name, config, weights, tokenizer=None):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        open(os.path.join(d, "config.json"), "w").write(json.dumps(config, sort_keys=True))
        open(os.path.join(d, "model.safetensors"), "wb").write(weights)
        if tokenizer:
            open(os.path.join(d, "tokenizer.json"), "wb").write(tokenizer)
        return name
    for fam, (config, weights) in tiny_lm.items():
        run("convert", checkpoint(fam, config, weights), f"{fam}.gguf", "--type", "q8_0")
        put("gguf_lm", f"{fam}.gguf", read(f"{fam}.gguf"))
    # gpt-oss: the MXFP4 fixture with llama.cpp's swiglu_limit 7, its experts (and other matrices) MXFP4
    with open(os.path.join(fixtures, "gpt_oss_mxfp4", "config.json")) as f:
        config = dict(json.load(f), swiglu_limit=7.0)
    with open(os.path.join(fixtures, "gpt_oss_mxfp4", "model.safetensors"), "rb") as f:
        run("convert", checkpoint("gpt_oss", config, f.read()), "gpt_oss.gguf", "--type", "mxfp4")
    put("gguf_lm", "gpt_oss.gguf", read("gpt_oss.gguf"))
    toks = {}
    tokenizer_json_seeds(lambda target, name, data: toks.__setitem__(name, data))
    for name in ("gpt2.json", "llama3.json", "llama2.json"):
        t = json.loads(toks[name])
        vocab = 1 + max(list(t["model"]["vocab"].values()) + [a["id"] for a in t["added_tokens"]])
        c = dict(tiny, head_dim=4, num_local_experts=2, vocab_size=vocab)
        path = os.path.join(tmp, f"tok_{name}.safetensors")
        write_safetensors(path, [(n, np.full(s, 0.5, np.float32)) for n, s in mixtral_ref.param_shapes(c)], {"format": "pt"})
        gguf = "tok_" + name.replace(".json", ".gguf")
        run("convert", checkpoint(gguf + ".d", mixtral_ref.hf_config(c), read(path), toks[name]), gguf)
        put("gguf_lm", gguf, read(gguf))
    shutil.rmtree(tmp)

gguf_lm_seeds()
