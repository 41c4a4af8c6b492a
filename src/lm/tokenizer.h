/* The byte-level BPE tokenizer's state and the helpers its three files share: tokenizer.c (the
 * pre-tokenizer, encode, decode), tokenizer_train.c (learning merges) and tokenizer_json.c (Hugging
 * Face tokenizer.json). */
#ifndef MOE_LM_TOKENIZER_H
#define MOE_LM_TOKENIZER_H

#include "lm/tokenizer_map.h"
#include "moe.h"

struct moe_tokenizer {
  int32_t vocab;            /* ids 0 .. vocab - 1 */
  char **bytes;             /* (vocab) each id's bytes: what decode writes */
  int32_t *len;             /* (vocab) */
  uint8_t *added;           /* (vocab) 1 for added tokens (<|endoftext|>): whole strings, never merged */
  uint8_t *special;         /* (vocab) the added token's "special" flag */
  int32_t byte_id[256];     /* the id of each single byte */
  int32_t n_merges;
  int32_t (*merges)[3];     /* (n_merges) left, right, merged id, in rank order */
  moe__tok_map pair_rank;   /* the 8 bytes (left, right) -> rank */
  moe__tok_map by_bytes;    /* a byte-level token's bytes -> id (added tokens are not in it) */
  int ignore_merges;        /* HF's model.ignore_merges: a pre-token that is a token is that token */
};

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
/* The id GPT-2's vocabulary gives byte b: the rank of its code point among the 256. */
int moe__tok_byte_rank(int b);
/* pretok.c: GPT-2's pre-tokenizer (its regex over UTF-8 with Unicode classes), one per caller. next: the
 * end of the pre-token that starts at byte i of s (n bytes), called for i = 0 and then each end in turn. */
typedef struct moe__pretok moe__pretok;
moe_status moe__pretok_new(moe__pretok **out);
void moe__pretok_free(moe__pretok *p);
size_t moe__pretok_next(moe__pretok *p, const unsigned char *s, size_t n, size_t i);

#endif
