#!/usr/bin/env python3
"""Checks that llama.cpp's Python package (gguf-py) reads a file `moe quantize` wrote as libmoe meant it:
every metadata entry of SRC is in OUT with the same value (general.file_type and
general.quantization_version aside), every tensor has SRC's name and shape, and gguf-py's dequantization
of it is within the type's bound of SRC's values (relative RMS; the bounds of tests/test_quant.c).
usage: /usr/bin/python3 dev/check_gguf_py.py LLAMA_CPP_DIR SRC.gguf OUT.gguf   (exit 1 on a difference)"""
import os, sys, types

sys.path.insert(0, os.path.join(sys.argv[1], "gguf-py"))
sys.modules.setdefault("sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))
import numpy as np  # noqa: E402
import gguf  # noqa: E402

T = gguf.GGMLQuantizationType
BOUND = {T.F32: 0, T.F16: 0.0003, T.BF16: 0.0025, T.Q8_0: 0.009, T.Q6_K: 0.028, T.Q5_K: 0.053, T.Q4_K: 0.105,
         T.Q4_0: 0.14}
src, out = gguf.GGUFReader(sys.argv[2]), gguf.GGUFReader(sys.argv[3])


def values(f):
    return [bytes(f.parts[i]) for i in f.data]


def floats(t):
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)


bad = 0
for name, f in src.fields.items():
    if name.startswith("GGUF.") or name in ("general.file_type", "general.quantization_version"):
        continue
    g = out.fields.get(name)
    if g is None or g.types != f.types or values(g) != values(f):
        print(f"metadata {name}: differs or missing")
        bad += 1
out_t = {t.name: t for t in out.tensors}
for t in src.tensors:
    o = out_t.get(t.name)
    if o is None or list(o.shape) != list(t.shape):
        print(f"tensor {t.name}: missing or another shape")
        bad += 1
        continue
    x, y = floats(t), floats(o)
    err = float(np.sqrt(((y - x) ** 2).sum() / max((x ** 2).sum(), 1e-30)))
    ok = o.tensor_type in BOUND and err <= BOUND[o.tensor_type]
    print(f"{t.name:40s} {o.tensor_type.name:6s} relative RMS error {err:.5f} {'ok' if ok else 'TOO LARGE'}")
    bad += not ok
sys.exit(1 if bad else 0)
