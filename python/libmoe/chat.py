"""Chat templates: a Hugging Face chat_template rendered as transformers.js renders it (libmoe's
moe_chat_template_render, include/moe.h; DESIGN 4.9)."""
import ctypes as C
import json

from ._lib import check, lib, text

for _name, _args in (("moe_chat_template_render", [C.c_char_p, C.c_char_p, C.c_int64]),
                     ("moe_chat_template_render_config", [C.c_char_p, C.c_char_p, C.c_int, C.c_int64])):
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = C.c_int, _args + [C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]
lib.moe_free.restype, lib.moe_free.argtypes = None, [C.c_void_p]


def _call(fn, *args):
    out, n = C.c_void_p(), C.c_size_t()
    check(fn(*args, C.byref(out), C.byref(n)))
    try:
        return C.string_at(out.value, n.value).decode("utf-8", errors="surrogateescape")
    finally:
        lib.moe_free(out)


def render_chat_template(template, context=None, now=None):
    """The text of `template` (a str) over `context` (a dict of its variables: messages,
    add_generation_prompt, bos_token, tools, ...); now: strftime_now's time in seconds since 1970 UTC
    (None: the clock). Raises MoeError naming the construct and line:col the renderer refuses."""
    ctx = json.dumps(context or {}, ensure_ascii=False).encode()
    return _call(lib.moe_chat_template_render, template.encode(), ctx, -1 if now is None else int(now))


def render_chat(tokenizer, conversation, add_generation_prompt=False, now=None):
    """A model's chat template (tokenizer: its tokenizer_config.json or the directory holding it) over
    `conversation` (a list of messages, or a dict with "messages" and other variables), with the
    config's special tokens."""
    conv = json.dumps(conversation, ensure_ascii=False).encode()
    return _call(lib.moe_chat_template_render_config, text(tokenizer), conv, int(bool(add_generation_prompt)),
                 -1 if now is None else int(now))
