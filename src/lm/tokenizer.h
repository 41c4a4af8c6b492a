/* The BPE tokenizer's state and the helpers its files share: tokenizer.c (added tokens, encode,
 * decode), tokenizer_train.c (learning merges), tokenizer_json.c (Hugging Face tokenizer.json),
 * tokenizer_steps.c (reading a file's normalizers, pre-tokenizers, decoders and post-processor) and
 * tokenizer_pipeline.c (running them, and BPE over characters with byte fallback). GPT-2's byte-level
 * BPE with nothing else (libmoe's own files, GPT-2's) runs without any of the pipeline: hf is NULL. */
#ifndef MOE_LM_TOKENIZER_H
#define MOE_LM_TOKENIZER_H

#include "lm/tokenizer_map.h"
#include "moe.h"

typedef struct cJSON cJSON;

typedef struct moe__tok_hf moe__tok_hf;

struct moe_tokenizer {
  int32_t vocab;            /* ids 0 .. vocab - 1 */
  char **bytes;             /* (vocab) each id's bytes: what decode writes */
  int32_t *len;             /* (vocab) */
  uint8_t *added;           /* (vocab) 1 for added tokens (<|endoftext|>): whole strings, never merged */
  uint8_t *special;         /* (vocab) the added token's "special" flag */
  int32_t *added_ids;       /* (n_added) the added tokens' ids, in the order they were set */
  int32_t n_added;
  int32_t byte_id[256];     /* the id of each single byte */
  int32_t n_merges;
  int32_t (*merges)[3];     /* (n_merges) left, right, merged id, in rank order */
  int32_t merges_cap;       /* room in merges */
  moe__tok_map pair_rank;   /* the 8 bytes (left, right) -> rank */
  moe__tok_map by_bytes;    /* a byte-level token's bytes -> id (added tokens are not in it) */
  int ignore_merges;        /* HF's model.ignore_merges: a pre-token that is a token is that token */
  uint8_t *strip;           /* (vocab) an added token's MOE__TOK_LSTRIP | RSTRIP | SINGLE_WORD */
  int32_t *post;            /* the post-processor's ids around the text (-1 stands for the text) */
  int n_post;               /* 0: no post-processor adds ids */
  moe__tok_hf *hf;          /* the rest of a Hugging Face pipeline; NULL: GPT-2's byte-level BPE */
};

enum { MOE__TOK_LSTRIP = 1, MOE__TOK_RSTRIP = 2, MOE__TOK_SINGLE_WORD = 4 };

/* An empty tokenizer with room for `vocab` ids (bytes NULL); NULL when out of memory. */
moe_tokenizer *moe__tok_alloc(int32_t vocab);
/* Gives id its bytes (copied), registers byte-level tokens in by_bytes; 0 when out of memory. */
int moe__tok_set(moe_tokenizer *t, int32_t id, const char *bytes, size_t len, int added, int special);
/* Appends merge (left, right) -> merged at the next rank; 0 when out of memory. A pair given twice
 * keeps its first rank. */
int moe__tok_add_merge(moe_tokenizer *t, int32_t left, int32_t right, int32_t merged);

/* GPT-2's bytes_to_unicode: the code point that stands for byte b in token strings. */
int moe__tok_byte_char(int b);
/* The byte a code point stands for, or -1. */
int moe__tok_char_byte(uint32_t cp);
/* tokenizer_json.c: the bytes a token string stands for (GPT-2's characters, UTF-8 of code points below
 * 0x800) into out (room for strlen(s)); their count, or -1 when a character is not one of the 256. */
long moe__tok_string_bytes(const char *s, char *out);
/* The id GPT-2's vocabulary gives byte b: the rank of its code point among the 256. */
int moe__tok_byte_rank(int b);
/* pretok.c: GPT-2's pre-tokenizer (its regex over UTF-8 with Unicode classes), one per caller. next: the
 * end of the pre-token that starts at byte i of s (n bytes), called for i = 0 and then each end in turn. */
typedef struct moe__pretok moe__pretok;
moe_status moe__pretok_new(moe__pretok **out);
void moe__pretok_free(moe__pretok *p);
size_t moe__pretok_next(moe__pretok *p, const unsigned char *s, size_t n, size_t i);

/* Whether decode(encode(x)) == x for every byte string x encoded without ADD_SPECIAL: GPT-2's
 * byte-level BPE alone, without added-token options (the fuzz targets check it). */
int moe__tok_round_trips(const moe_tokenizer *t);
/* The ids BPE gives one pre-token w of n bytes, starting from the symbols out[0 .. m) (room for n) and
 * merging the lowest-ranked adjacent pair everywhere, again and again; returns the count. */
size_t moe__tok_merge(const moe_tokenizer *t, int32_t *out, size_t m);

/* ---- tokenizer_steps.c / tokenizer_pipeline.c: the rest of a Hugging Face tokenizer.json ---- */
/* Reads root's normalizer, pre_tokenizer, decoder and post_processor into t (t->hf made here; the
 * vocabulary already read); MOE_ERR_FORMAT naming the field and value for anything not supported. */
moe_status moe__tok_read_pipeline(const char *path, const cJSON *root, moe_tokenizer *t, int byte_level);
/* Whether root's pre_tokenizer has ByteLevel (then the vocabulary is made of its byte characters). */
int moe__tok_pipeline_byte_level(const cJSON *root);
/* Whether a file read with this pipeline needs none of it (GPT-2's byte-level BPE alone). */
int moe__tok_pipeline_is_gpt2(const moe__tok_hf *hf);
void moe__tok_hf_free(moe__tok_hf *hf);
/* Pre-tokenizes one stretch of text between added tokens (s, n bytes; at_start: it begins the text):
 * the normalizers, then the pre-tokenizers; *pieces gets count spans [start, end) of *buf. The
 * buffers are sc's, valid until its next use. */
typedef struct moe__tok_scratch moe__tok_scratch;
moe__tok_scratch *moe__tok_scratch_new(void);
void moe__tok_scratch_free(moe__tok_scratch *sc);
moe_status moe__tok_pretokenize(const moe_tokenizer *t, moe__tok_scratch *sc, const char *s, size_t n, int at_start,
                                const char **buf, const size_t (**pieces)[2], size_t *count);
/* BPE over the characters of a pre-token w (n bytes) in a vocabulary of strings: each character's id,
 * else its bytes' <0xNN> tokens (byte fallback), else the unknown token (consecutive ones fused when
 * fuse_unk); then the merges. out has room for n; the count in *m. */
moe_status moe__tok_bpe_chars(const moe_tokenizer *t, const unsigned char *w, size_t n, int32_t *out, size_t *m);
/* The decoders over ids: the text into a new buffer *out of *len bytes. */
moe_status moe__tok_decode_hf(const moe_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);
/* Whether decoding is the tokens' bytes one after another (byte-level files: ByteLevel decoder only). */
int moe__tok_decode_is_concat(const moe_tokenizer *t);

#endif
