"""The language model (moe_lm_t: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3 checkpoints in Hugging Face's
layout) and the continuous-batching engine (moe_engine) from Python, with numpy arrays in and out.
LM.generate runs the loop `moe generate` runs (the prompt through the KV cache, then moe_lm_sample one
token at a time from the request's splitmix64 generator), so the same seed gives the same tokens."""
import ctypes as C

import numpy as np

from . import _structs as S
from ._lib import Owner, check, fail, lib, text

_P, _I32, _F32 = C.POINTER, C.POINTER(C.c_int32), C.POINTER(C.c_float)
_LM = _P(S.LM)
for _name, (_res, _args) in {
        "moe_lm_read_config": (C.c_int, [C.c_char_p, _P(S.LMConfig)]),
        "moe_lm_load": (C.c_int, [_LM, C.c_char_p, _P(S.LMConfig)]),
        "moe_lm_stream_config_default": (None, [_P(S.LMStreamConfig)]),
        "moe_lm_load_streaming": (C.c_int, [_LM, C.c_char_p, _P(S.LMConfig), _P(S.LMStreamConfig), _P(S.LMExperts)]),
        "moe_lm_experts_free": (None, [_P(S.LMExperts)]),
        "moe_cache_policy_parse": (C.c_int, [C.c_char_p, C.c_char_p, _P(C.c_int)]),
        "moe_lm_placement_parse": (C.c_int, [C.c_char_p, C.c_char_p, _P(C.c_int)]),
        "moe_prefetch_mode_parse": (C.c_int, [C.c_char_p, C.c_char_p, _P(C.c_int)]),
        "moe_trace_load": (C.c_int, [_P(S.Trace), C.c_char_p, C.c_int]),
        "moe_trace_free": (None, [_P(S.Trace)]),
        "moe_expert_cache_get_stats": (None, [C.c_void_p, _P(S.ExpertCacheStats)]),
        "moe_lm_free": (None, [_LM]),
        "moe_lm_config_default": (None, [_P(S.LMConfig)]),
        "moe_lm_init": (C.c_int, [_LM, _P(S.LMConfig)]),
        "moe_lm_init_params": (None, [_LM, C.c_uint64]),
        "moe_lm_save": (C.c_int, [_LM, C.c_char_p]),
        "moe_lm_eos_ids": (C.c_int, [C.c_char_p, C.c_void_p, C.c_int, _I32, C.c_int, _P(C.c_int)]),
        "moe_lm_forward": (C.c_int, [_LM, _I32, _I32, C.c_int, C.c_int, C.c_void_p]),
        "moe_lm_logits": (_F32, [_LM]),
        "moe_lm_cache_new": (C.c_int, [_P(C.c_void_p), _LM, C.c_int]),
        "moe_lm_cache_free": (None, [C.c_void_p]),
        "moe_lm_decode": (C.c_int, [_LM, C.c_void_p, _I32, C.c_int]),
        "moe_lm_sample": (C.c_int, [_F32, C.c_int, C.c_float, C.c_float, _P(C.c_uint64), _I32]),
        "moe_lm_logprobs": (C.c_int, [_F32, C.c_int, C.c_int32, C.c_int, _F32, _I32, _F32]),
        "moe_engine_new": (C.c_int, [_P(C.c_void_p), _LM, _P(S.EngineConfig)]),
        "moe_engine_submit": (C.c_int, [C.c_void_p, _P(S.EngineParams), _P(C.c_void_p)]),
        "moe_engine_wait": (None, [C.c_void_p, C.c_void_p, C.c_int, _P(S.EngineState)]),
        "moe_engine_release": (None, [C.c_void_p, C.c_void_p]),
        "moe_engine_get_stats": (None, [C.c_void_p, _P(S.EngineStats)]),
        "moe_engine_free": (None, [C.c_void_p])}.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


def _ids(tokens, vocab, what):
    a = np.ascontiguousarray(tokens, dtype=np.int32)
    if a.size == 0 or a.min() < 0 or a.max() >= vocab:
        raise fail("MOE_ERR_ARG", f"{what}: want token ids in [0, {vocab}), got {a.tolist()[:8]}")
    return a


def _eos_ids(path, vocab):
    """config.json's and generation_config.json's eos_token_id (moe_lm_eos_ids without a tokenizer)."""
    ids, n = (C.c_int32 * 16)(), C.c_int()
    check(lib.moe_lm_eos_ids(text(path), None, vocab, ids, 16, C.byref(n)))
    return list(ids[:n.value])


def _size(v):
    """Bytes from an int or a string: a number with K, M, G or T (powers of 1024; "B" or "iB" may follow)."""
    if isinstance(v, int):
        n = v
    else:
        s, mult = str(v).strip(), 1
        for suffix in ("iB", "B"):
            s = s[:-len(suffix)] if s.endswith(suffix) else s
        if s and s[-1].upper() in "KMGT":
            mult, s = 1024 ** ("KMGT".index(s[-1].upper()) + 1), s[:-1]
        try:
            n = int(float(s) * mult)
        except ValueError:
            n = 0
    if n < 1:
        raise fail("MOE_ERR_ARG", f"memory_budget: want a size in bytes (or with K, M, G, T), got {v!r}")
    return n


class LM(Owner):
    """A checkpoint directory (config.json and model.safetensors, or shards with their index) or a GGUF
    file loaded by moe_lm_load. threads: 0 = all cores; dtype "bf16": the experts' GEMMs in bf16. eos: the ids that end
    generation (default: config.json's and generation_config.json's eos_token_id). memory_budget (bytes, or "8G"):
    the experts streamed from the checkpoint into caches of at most that size (moe_lm_load_streaming; policy lifo,
    lru, fifo, lfu or lfru; prefetch of the next layer's predicted experts: "auto" where it pays, True or "on"
    always, False or "off" never); placement "miss-cost" with
    placement_trace (a trace CSV of this model) places the slots across the layers by their simulated misses;
    pin_from (a trace CSV) pins each layer's most used experts (pin per layer, 0: half its slots). The outputs
    do not change."""
    _free = lib.moe_lm_free

    def __del__(self):  # the model, then the experts' caches it reads from
        Owner.__del__(self)
        if getattr(self, "_x", None) is not None:
            lib.moe_lm_experts_free(C.byref(self._x))
            self._x = None

    def __init__(self, path, threads=0, dtype="f32", eos=None, memory_budget=None, policy="lru", prefetch="auto",
                 placement="equal", placement_trace=None, pin_from=None, pin=0):
        cfg = S.LMConfig()
        check(lib.moe_lm_read_config(text(path), C.byref(cfg)))
        cfg.moe.threads = threads
        d = C.c_int()
        check(lib.moe_dtype_parse(text(dtype), b"dtype", C.byref(d)))
        cfg.moe.dtype = d.value
        self._c = self._x = None
        m = S.LM()
        if memory_budget is None:
            check(lib.moe_lm_load(C.byref(m), text(path), C.byref(cfg)))
        else:
            sc, x, pol, place = S.LMStreamConfig(), S.LMExperts(), C.c_int(), C.c_int()
            lib.moe_lm_stream_config_default(C.byref(sc))
            check(lib.moe_cache_policy_parse(text(policy), b"policy", C.byref(pol)))
            check(lib.moe_lm_placement_parse(text(placement), b"placement", C.byref(place)))
            mode = C.c_int()
            check(lib.moe_prefetch_mode_parse(text({True: "on", False: "off"}.get(prefetch, prefetch)), b"prefetch",
                                              C.byref(mode)))
            sc.budget, sc.policy, sc.prefetch = _size(memory_budget), pol.value, mode.value
            sc.placement, sc.pin = place.value, pin
            traces = [S.Trace(), S.Trace()]  # read for the load only
            try:
                for t, p, field in zip(traces, (placement_trace, pin_from), ("placement_trace", "pin_trace")):
                    if p is not None:
                        check(lib.moe_trace_load(C.byref(t), text(p), cfg.moe.E))
                        setattr(sc, field, C.cast(C.pointer(t), C.c_void_p))
                check(lib.moe_lm_load_streaming(C.byref(m), text(path), C.byref(cfg), C.byref(sc), C.byref(x)))
            finally:
                for t in traces:
                    lib.moe_trace_free(C.byref(t))
            self._x = x
        self._c = m
        self.eos = list(eos) if eos is not None else _eos_ids(path, self.vocab)

    def expert_stats(self):
        """With memory_budget: each MoE layer's cache stats as a dict (layer, slots, accesses, misses, loads,
        bytes_read, stall_seconds, read_seconds, prefetches, prefetch_skipped, prefetch_used, predicted,
        predicted_hit, actual, resident_bytes, pinned); [] without."""
        out = []
        for i in range(self._x.n if self._x is not None else 0):
            if not self._x.caches[i]:
                continue
            st = S.ExpertCacheStats()
            lib.moe_expert_cache_get_stats(self._x.caches[i], C.byref(st))
            d = {k: getattr(st, k) for k, _ in S.ExpertCacheStats._fields_ if k not in ("dtype", "expert_bytes")}
            out.append(dict(layer=i, **d))
        return out

    @classmethod
    def create(cls, vocab, context, layers=2, model=128, heads=4, kv_heads=2, experts=8, top_k=2, hidden=256,
               family="mixtral", seed=1, threads=0, eos=()):
        """A new model as `moe train --task lm` makes one with these flags (--vocab being the tokenizer's
        size, --context the longest sequence): moe_lm_init, then moe_lm_init_params(seed)."""
        fams = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
        if family not in fams or model % heads:
            raise fail("MOE_ERR_ARG", f"LM.create: family {family!r} (one of {fams}), model {model} a multiple "
                                      f"of heads {heads}")
        c = S.LMConfig()
        lib.moe_lm_config_default(C.byref(c))
        c.vocab, c.n_layers, c.n_heads, c.n_kv_heads, c.max_seq = vocab, layers, heads, kv_heads, context
        c.moe.D, c.moe.H, c.moe.E, c.moe.top_k, c.moe.threads = model, hidden, experts, top_k, threads
        c.head_dim, c.family = model // heads, fams.index(family)
        c.qkv_bias = family == "qwen2_moe"
        c.qk_norm = 1 if family == "qwen3_moe" else 2 if family == "olmoe" else 0
        c.moe.shared_H = hidden if family == "qwen2_moe" else 0
        c.moe.shared_gate = family == "qwen2_moe"
        if family == "olmoe":
            c.moe.normalize_topk = 0
        self = cls.__new__(cls)
        self._c = None
        m = S.LM()
        check(lib.moe_lm_init(C.byref(m), C.byref(c)))
        self._c = m
        lib.moe_lm_init_params(C.byref(m), seed)
        self.eos = list(eos)
        return self

    def save(self, path):
        """A Hugging Face directory (config.json, model.safetensors; moe_lm_save)."""
        check(lib.moe_lm_save(C.byref(self._c), text(path)))

    vocab = property(lambda self: self._c.cfg.vocab)
    max_seq = property(lambda self: self._c.cfg.max_seq)
    family = property(lambda self: ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2",
                                    "deepseek_v3")[self._c.cfg.family])

    def logits(self, tokens):
        """(B, T, vocab) float32 logits of a full forward of tokens (B, T) (or (T,))."""
        a = _ids(tokens, self.vocab, "tokens")
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        B, T = a2.shape
        check(lib.moe_lm_forward(C.byref(self._c), a2.ctypes.data_as(_I32), None, B, T, None))
        out = np.ctypeslib.as_array(lib.moe_lm_logits(C.byref(self._c)), shape=(B, T, self.vocab)).copy()
        return out[0] if a.ndim == 1 else out

    def stream(self, prompt, max_tokens=32, temperature=1.0, top_p=1.0, seed=0, ignore_eos=False, logprobs=False):
        """Yields the new tokens one at a time (with logprobs: (token, its log-probability under the
        model's distribution, the logits at temperature 1)), as moe generate prints them."""
        ids = _ids(prompt, self.vocab, "prompt").reshape(-1)
        if len(ids) + max_tokens > self.max_seq:
            raise fail("MOE_ERR_ARG", f"the prompt ({len(ids)} tokens) and max_tokens {max_tokens} exceed the "
                                      f"model's context of {self.max_seq}")
        kv = C.c_void_p()
        check(lib.moe_lm_cache_new(C.byref(kv), C.byref(self._c), 1))
        try:
            m, V = C.byref(self._c), self.vocab
            rng, nxt = C.c_uint64(seed), C.c_int32()
            check(lib.moe_lm_decode(m, kv, ids.ctypes.data_as(_I32), len(ids)))
            row = len(ids) - 1
            for k in range(max_tokens):
                logits = lib.moe_lm_logits(m)
                row_ptr = C.cast(C.addressof(logits.contents) + 4 * row * V, _F32)
                check(lib.moe_lm_sample(row_ptr, V, temperature, top_p, C.byref(rng), C.byref(nxt)))
                t = nxt.value
                if not ignore_eos and t in self.eos:
                    return
                lp = C.c_float()
                if logprobs:
                    check(lib.moe_lm_logprobs(row_ptr, V, t, 0, C.byref(lp), None, None))
                if k + 1 < max_tokens:
                    one = np.array([t], dtype=np.int32)
                    check(lib.moe_lm_decode(m, kv, one.ctypes.data_as(_I32), 1))
                row = 0
                yield (t, lp.value) if logprobs else t
        finally:
            lib.moe_lm_cache_free(kv)

    def generate(self, prompt, max_tokens=32, temperature=1.0, top_p=1.0, seed=0, ignore_eos=False, logprobs=False):
        """The new tokens (a list; with logprobs, (tokens, their log-probabilities))."""
        out = list(self.stream(prompt, max_tokens, temperature, top_p, seed, ignore_eos, logprobs))
        return ([t for t, _ in out], [p for _, p in out]) if logprobs else out


class Engine:
    """The continuous-batching engine over an LM (which it uses until closed): submit several requests,
    then stream or collect each one's tokens; each gets the tokens it would get alone."""

    def __init__(self, lm, slots=8):
        self.lm = lm
        eos = (C.c_int32 * max(1, len(lm.eos)))(*lm.eos)
        self._eos = eos
        cfg = S.EngineConfig(slots, None, C.cast(eos, _I32), len(lm.eos), None, None, None)
        e = C.c_void_p()
        check(lib.moe_engine_new(C.byref(e), C.byref(lm._c), C.byref(cfg)))
        self._e, self._reqs = e, []

    def submit(self, prompt, max_tokens=32, temperature=1.0, top_p=1.0, seed=0, ignore_eos=False):
        """Queues a request; returns its handle for stream() / result()."""
        ids = _ids(prompt, self.lm.vocab, "prompt").reshape(-1)
        p = S.EngineParams(ids.ctypes.data_as(_I32), len(ids), max_tokens, temperature, top_p, seed, int(ignore_eos),
                           None, 0, 0, 0)
        r = C.c_void_p()
        check(lib.moe_engine_submit(self._e, C.byref(p), C.byref(r)))
        self._reqs.append(r)
        return r

    def stream(self, r):
        """Yields r's tokens as the engine makes them; then releases r."""
        st, have = S.EngineState(), 0
        try:
            while True:
                lib.moe_engine_wait(self._e, r, have, C.byref(st))
                for i in range(have, st.n):
                    yield st.tokens[i]
                have = st.n
                if st.done:
                    if st.done < 0:
                        raise fail("MOE_ERR_STATE", "engine request failed: " + st.error.decode(errors="replace"))
                    return
        finally:
            self.release(r)

    def result(self, r):
        return list(self.stream(r))

    def release(self, r):
        if r in self._reqs:
            self._reqs.remove(r)
            lib.moe_engine_release(self._e, r)

    def stats(self):
        s = S.EngineStats()
        lib.moe_engine_get_stats(self._e, C.byref(s))
        return {k: getattr(s, k) for k, _ in S.EngineStats._fields_}

    def close(self):
        """Releases the requests not yet streamed, finishes those under way, and ends the engine."""
        if self._e:
            for r in list(self._reqs):
                self.release(r)
            lib.moe_engine_free(self._e)
            self._e = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
