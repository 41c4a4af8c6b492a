#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_gguf.c into fuzz/corpus/gguf/ and the GGUF fixture of
tests/test_gguf.c: small GGUF v3 files laid out here with struct from the specification (ggml's
docs/gguf.md), independently of libmoe's writer, then converted by `moe quantize` to every type with a
codec. usage: gguf_corpus.py MOE (the moe binary of a build, e.g. build/moe). Rerunning gives the same
bytes."""
import os, shutil, struct, subprocess, sys

moe = os.path.abspath(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, "..", "fuzz", "corpus", "gguf")
fixture = os.path.join(here, "..", "tests", "fixtures", "gguf_spec.gguf")

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(PACK[t], v)


def gguf(kvs, tensors, align=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne list, ggml type id, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + value(t, v)
    off, data = 0, b""
    for name, ne, ty, raw in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ty, off)
        raw += b"\0" * (-len(raw) % align)
        data += raw
        off += len(raw)
    return out + b"\0" * (-len(out) % align) + data


def f32(xs):
    return b"".join(struct.pack("<f", x) for x in xs)


def f16(xs):
    return b"".join(struct.pack("<e", x) for x in xs)


# Every value type, an array of each scalar type, an array of arrays, alignment 64.
kvs = [("general.architecture", STRING, "llama"), ("general.alignment", U32, 64),
       ("t.u8", U8, 200), ("t.i8", I8, -100), ("t.u16", U16, 60000), ("t.i16", I16, -30000),
       ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000), ("t.f32", F32, 0.25), ("t.bool", BOOL, True),
       ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -2**62), ("t.f64", F64, -1.5),
       ("t.str", STRING, "h\u00e9llo"), ("t.arr_i32", ARRAY, (I32, [-1, 0, 7])),
       ("t.arr_f32", ARRAY, (F32, [0.5, -2.0])), ("t.arr_bool", ARRAY, (BOOL, [True, False])),
       ("t.arr_str", ARRAY, (STRING, ["a", "", "bc"])),
       ("t.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["x"])]))]
q8 = b""
for r in range(2):  # Q8_0: d = 0.5 (f16), q = i - 16 + r
    q8 += f16([0.5]) + bytes((i - 16 + r) & 255 for i in range(32))
spec = gguf(kvs, [("t.f32", [4, 2], 0, f32([0.5 * i for i in range(8)])),
                  ("t.f16", [8], 1, f16([i - 4 for i in range(8)])),
                  ("t.q8_0", [32, 2], 8, q8)], align=64)

# A weight matrix 256 wide (every block size divides it) with a norm, to quantize.
w = [((i * 37) % 101 - 50) / 500 for i in range(256 * 2)]
plain = gguf([("general.architecture", STRING, "llama"), ("llama.expert_count", U32, 2)],
             [("blk.0.ffn_gate_exps.weight", [256, 1, 2], 0, f32(w)), ("blk.0.ffn_norm.weight", [256], 0, f32(w[:256]))])

shutil.rmtree(corpus, ignore_errors=True)
os.makedirs(corpus)
with open(fixture, "wb") as f:
    f.write(spec)
for name, data in (("spec.gguf", spec), ("plain.gguf", plain)):
    with open(os.path.join(corpus, name), "wb") as f:
        f.write(data)
for ty in ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "F16", "BF16"):
    subprocess.run([moe, "quantize", os.path.join(corpus, "plain.gguf"), os.path.join(corpus, ty.lower() + ".gguf"),
                    "--type", ty], check=True, stdout=subprocess.DEVNULL)
