/* The tokenizer in GGUF metadata (llama.cpp's tokenizer.ggml.* keys): tokenizer_gguf.c builds the
 * equivalent Hugging Face tokenizer.json in memory from a file's keys and reads it as tokenizer_json.c
 * reads files; tokenizer_gguf_write.c writes the keys from a tokenizer.json. The pre-tokenizers of the
 * byte-level ("gpt2") vocabularies go by llama.cpp's names (tokenizer.ggml.pre), each standing for the
 * regexes of its models' tokenizer.json (tokenizer_gguf_pre.c). */
#ifndef MOE_LM_TOKENIZER_GGUF_H
#define MOE_LM_TOKENIZER_GGUF_H

#include "moe.h"

typedef struct cJSON cJSON;

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { MOE__TOK_NORMAL = 1, MOE__TOK_UNKNOWN = 2, MOE__TOK_CONTROL = 3, MOE__TOK_USER_DEFINED = 4,
       MOE__TOK_UNUSED = 5, MOE__TOK_BYTE = 6 };

/* moe_tokenizer_load of a GGUF file (path). */
moe_status moe__tok_gguf_load(moe_tokenizer **out, const char *path);
/* Sets the tokenizer.ggml.* keys of the tokenizer.json at `tokenizer` (a file, or a directory with its
 * tokenizer_config.json) in w: "gpt2" for byte-level BPE (its pre-tokenizer named as llama.cpp does),
 * "llama" for byte-fallback vocabularies of strings (scores from the merges' ranks); padded with
 * [PAD<i>] tokens up to `vocab` ids (0: none). MOE_ERR_FORMAT naming the file and what has no GGUF form. */
moe_status moe__tok_gguf_write(moe_gguf_writer *w, const char *tokenizer, int vocab);
/* The same with the tokenizer already loaded from `tokenizer` (t = moe_tokenizer_load of it). */
moe_status moe__tok_gguf_write_loaded(moe_gguf_writer *w, const char *tokenizer, const moe_tokenizer *t, int vocab);

/* The pre-tokenizer (a tokenizer.json "pre_tokenizer" object) and normalizer (or NULL) of llama.cpp's
 * pre name, and whether its models' BPE ignores merges; MOE_ERR_FORMAT naming `file` and the name when
 * it is not one libmoe knows. */
moe_status moe__tok_gguf_pre(const char *file, const char *pre, cJSON **pre_tokenizer, cJSON **normalizer,
                             int *ignore_merges);
/* The pre name whose pre-tokenizer is the tokenizer.json's `pre_tokenizer` (compared by its Split
 * regexes and ByteLevel's use_regex), or NULL. */
const char *moe__tok_gguf_pre_name(const cJSON *pre_tokenizer);

/* The tokenizer_config.json a GGUF file's metadata stands for (chat templates render with it):
 * chat_template from tokenizer.chat_template, bos_token / eos_token / unk_token / pad_token the strings
 * of their ids; *out a new object. */
moe_status moe__tok_gguf_chat_config(const char *path, cJSON **out);

/* tokenizer_json.c: a tokenizer from a parsed tokenizer.json (path names it in errors). */
moe_status moe__tok_from_json(const char *path, const cJSON *root, moe_tokenizer **out);

#endif
