"""Tokenizers (moe_tokenizer): libmoe's own byte-level BPE and Hugging Face tokenizer.json files of real
models (Qwen3, DeepSeek-V3, gpt-oss, Llama 2, Llama 3: normalizers, pre-tokenizers, byte fallback,
added tokens, post-processors, decoders; DESIGN 4.5), with the same ids as Hugging Face's tokenizers."""
import ctypes as C

import numpy as np

from ._lib import check, lib, text

SPECIAL, ADD_SPECIAL = 1, 2  # MOE_TOKENIZER_SPECIAL, MOE_TOKENIZER_ADD_SPECIAL
_I32 = C.POINTER(C.c_int32)
for _name, (_res, _args) in {
        "moe_tokenizer_load": (C.c_int, [C.POINTER(C.c_void_p), C.c_char_p]),
        "moe_tokenizer_train": (C.c_int, [C.POINTER(C.c_void_p), C.c_char_p, C.c_size_t, C.c_int32]),
        "moe_tokenizer_save": (C.c_int, [C.c_void_p, C.c_char_p]),
        "moe_tokenizer_free": (None, [C.c_void_p]),
        "moe_tokenizer_vocab_size": (C.c_int32, [C.c_void_p]),
        "moe_tokenizer_encode_alloc": (C.c_int, [C.c_void_p, C.c_char_p, C.c_size_t, C.c_int, C.POINTER(_I32),
                                                 C.POINTER(C.c_size_t)]),
        "moe_tokenizer_decode_alloc": (C.c_int, [C.c_void_p, _I32, C.c_size_t, C.POINTER(C.c_void_p),
                                                 C.POINTER(C.c_size_t)]),
        "moe_tokenizer_token_id": (C.c_int32, [C.c_void_p, C.c_char_p])}.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args
lib.moe_free.restype, lib.moe_free.argtypes = None, [C.c_void_p]


class Tokenizer:
    """Tokenizer(path): a tokenizer.json, or a directory holding it (and tokenizer_config.json, whose
    add_bos_token / add_eos_token choose what add_special adds). Tokenizer.train(text, vocab_size):
    libmoe's byte-level BPE trained on text."""

    def __init__(self, path=None, _handle=None):
        self._t = _handle
        if _handle is None:
            t = C.c_void_p()
            check(lib.moe_tokenizer_load(C.byref(t), text(path)))
            self._t = t

    @classmethod
    def train(cls, corpus, vocab_size):
        b = corpus.encode() if isinstance(corpus, str) else bytes(corpus)
        t = C.c_void_p()
        check(lib.moe_tokenizer_train(C.byref(t), b, len(b), vocab_size))
        return cls(_handle=t)

    @property
    def vocab_size(self):
        return lib.moe_tokenizer_vocab_size(self._t)

    def encode(self, s, special=False, add_special=False):
        """The ids of s (str or bytes) as an int32 array; special: added tokens written in the text are
        their ids; add_special: the post-processor's BOS/EOS, as HF's add_special_tokens=True."""
        b = s.encode() if isinstance(s, str) else bytes(s)
        ids, n = _I32(), C.c_size_t()
        check(lib.moe_tokenizer_encode_alloc(self._t, b, len(b), (SPECIAL if special else 0) |
                                             (ADD_SPECIAL if add_special else 0), C.byref(ids), C.byref(n)))
        try:
            return np.ctypeslib.as_array(ids, shape=(n.value,)).copy() if n.value else np.zeros(0, np.int32)
        finally:
            lib.moe_free(ids)

    def decode_bytes(self, ids):
        a = np.ascontiguousarray(ids, dtype=np.int32)
        out, n = C.c_void_p(), C.c_size_t()
        check(lib.moe_tokenizer_decode_alloc(self._t, a.ctypes.data_as(_I32), a.size, C.byref(out), C.byref(n)))
        try:
            return C.string_at(out.value, n.value)
        finally:
            lib.moe_free(out)

    def decode(self, ids):
        """The text of ids (bytes that are not UTF-8 as U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_id(self, token):
        """The id of an added token's string (or a token by its text), or -1."""
        return lib.moe_tokenizer_token_id(self._t, text(token))

    def save(self, path):
        check(lib.moe_tokenizer_save(self._t, text(path)))

    def __del__(self):
        if getattr(self, "_t", None):
            lib.moe_tokenizer_free(self._t)
            self._t = None
