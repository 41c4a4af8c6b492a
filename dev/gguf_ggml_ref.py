#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_ggml_ref.gguf with llama.cpp's own Python package (gguf-py, its GGUFWriter
and numpy quantizers), the independent reference of tests/test_gguf.c's gguf_llama_cpp_reference:
  x                 F32 [256, 2]: weight-like values
  q8_0, q4_0        x quantized by gguf-py (Q8_0 bit-exact with ggml's quantize_row_q8_0_ref)
  q4_k, q5_k, q6_k  random blocks (finite f16 scales), as no quantizer of theirs is in gguf-py
  <name>.deq        F32: gguf-py's dequantization of each
usage: /usr/bin/python3 dev/gguf_ggml_ref.py LLAMA_CPP_DIR (a llama.cpp checkout: its gguf-py/ is used;
numpy needed; sentencepiece, which gguf-py imports for vocabularies, is stubbed). Same bytes each run."""
import os, sys, types

sys.path.insert(0, os.path.join(sys.argv[1], "gguf-py"))
sys.modules.setdefault("sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))
import numpy as np  # noqa: E402
import gguf  # noqa: E402

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gguf_ggml_ref.gguf")
T = gguf.GGMLQuantizationType
rng = np.random.RandomState(41)
x = (rng.randn(2, 256) * 0.05).astype(np.float32)


def random_blocks(qtype, rows):
    """rows x 256 values' worth of random blocks, each f16 field made finite (its exponent below 31)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    b = rng.randint(0, 256, size=(rows, 256 // 256, size), dtype=np.uint8)
    halves = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}[qtype]
    for h in halves:
        hi = b[..., h + 1]
        b[..., h + 1] = np.where((hi & 0x7C) == 0x7C, hi & 0xFB, hi)
    return b.reshape(rows, size)


w = gguf.GGUFWriter(out, "llama")
w.add_uint32("llama.expert_count", 8)
w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a"])
w.add_tensor("x", x)
for name, qtype in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_k", T.Q4_K), ("q5_k", T.Q5_K), ("q6_k", T.Q6_K)):
    q = gguf.quants.quantize(x, qtype) if qtype in (T.Q8_0, T.Q4_0) else random_blocks(qtype, 2)
    w.add_tensor(name, q, raw_dtype=qtype)
    w.add_tensor(name + ".deq", gguf.quants.dequantize(q, qtype).astype(np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
