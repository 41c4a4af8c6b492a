#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_lm/<family>.gguf with llama.cpp's own converter (convert_hf_to_gguf.py:
its Model classes for MixtralForCausalLM, OlmoeForCausalLM and DeepseekV2ForCausalLM /
DeepseekV3ForCausalLM (DeepseekV2Model, deepseek2), F32) from the fixtures tests/fixtures/lm/<family>/,
the independent reference of tests/test_gguf_lm.c's gguf_lm_llama_cpp_files_give_the_hf_logits and
tests/test_gguf_deepseek.c (names, shapes, llama's q/k permutation, DeepSeek's keys as llama.cpp writes
them; for deepseek_v2 and deepseek_v3 that converter drops n_group/topk_group and V3's mscale, which
llama.cpp's graph does not compute). The fixtures have no tokenizer (set_vocab writes none) and their weights are read here (no
safetensors package needed). Qwen3-MoE is not in the February 2025 converter, and
the Qwen2-MoE fixture's dense layer (mlp_only_layers) has no name in its qwen2moe.
usage: /usr/bin/python3 dev/gguf_lm_llama_cpp.py LLAMA_CPP_DIR (numpy and torch needed; sentencepiece
and tqdm, which the converter imports, are stubbed). Same bytes each run."""
import os, sys, types
from pathlib import Path

llama = sys.argv[1]
sys.path.insert(0, os.path.join(llama, "gguf-py"))
sys.path.insert(0, llama)
sys.modules.setdefault("sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))


class _Bar:  # tqdm's progress bar, which gguf-py's writer imports: silent
    def __init__(self, *a, **k): pass
    def update(self, n): pass
    def close(self): pass


sys.modules.setdefault("tqdm", types.SimpleNamespace(tqdm=_Bar))
sys.argv = sys.argv[:1]
import torch  # noqa: E402
for _t in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):  # dtypes torch 1.13 lacks: names only
    if not hasattr(torch, _t):                                             # (the fixtures are F32)
        setattr(torch, _t, torch.uint8)
import gguf  # noqa: E402
import convert_hf_to_gguf as conv  # noqa: E402

root = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def get_tensors(self):
    """The fixture's model.safetensors (F32) read here: the converter's reader needs the safetensors package."""
    import json, struct
    import numpy as np
    raw = (self.dir_model / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    for name, info in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        yield name, torch.from_numpy(np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(info["shape"]).copy())


def set_vocab(self):
    """No tokenizer: the fixtures have none (libmoe's tests of GGUF tokenizers use real ones)."""


for fam, arch in (("mixtral", "MixtralForCausalLM"), ("olmoe", "OlmoeForCausalLM"),
                  ("deepseek_v2_lite", "DeepseekV2ForCausalLM"), ("deepseek_v2", "DeepseekV2ForCausalLM"),
                  ("deepseek_v3", "DeepseekV3ForCausalLM")):
    cls = conv.Model.from_model_architecture(arch)
    cls.set_vocab, cls.get_tensors = set_vocab, get_tensors
    out = root / "gguf_lm" / f"{fam}.gguf"
    out.parent.mkdir(exist_ok=True)
    m = cls(dir_model=root / "lm" / fam, ftype=gguf.LlamaFileType.ALL_F32, fname_out=out, model_name=fam)
    if fam == "olmoe":  # this converter writes rms_norm_eps twice for OLMoE (its own 1e-5, the fixture's too)
        assert m.hparams.pop("rms_norm_eps") == 1e-5
    m.write()
    print(out)
