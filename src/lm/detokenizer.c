/* Text token by token (moe_detokenizer_*). A tokenizer whose decode is its tokens' bytes one after
 * another gives each token's bytes, an incomplete character kept for the next. Another (SentencePiece
 * pieces, byte fallback, Strip decoders) decodes a window of its last tokens twice, with and without the
 * new ones, and gives the difference (vLLM's incremental detokenizing): decoders that treat the text's
 * first token apart (Metaspace dropping its space) see the same first token in both, so the difference
 * is what the new tokens add to the whole text's decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "internal.h"
#include "lm/tokenizer.h"

struct moe_detokenizer {
  const moe_tokenizer *t;
  int concat;       /* decode is the tokens' bytes one after another */
  char held[4];     /* concat: the start of a character that the next token's bytes complete */
  size_t nheld;
  int32_t *ids;     /* window: the ids from the last text's start on, ids [0, shown) already given */
  size_t n, shown, cap;
  char *out;        /* the text given by the last call */
  size_t cap_out;
};

moe_status moe_detokenizer_new(moe_detokenizer **out, const moe_tokenizer *t) {
  MOE_TRY(out && t, MOE_ERR_ARG, "moe_detokenizer_new: NULL argument");
  MOE_TRY(*out = calloc(1, sizeof **out), MOE_ERR_NOMEM, "moe_detokenizer_new: out of memory");
  (*out)->t = t;
  (*out)->concat = moe__tok_decode_is_concat(t);
  return MOE_OK;
}

void moe_detokenizer_free(moe_detokenizer *d) {
  if (!d) return;
  free(d->ids);
  free(d->out);
  free(d);
}

/* Room for n bytes of text in d->out. */
static moe_status out_room(moe_detokenizer *d, size_t n) {
  if (n + 1 <= d->cap_out) return MOE_OK;
  char *p = realloc(d->out, n + 1);
  MOE_TRY(p, MOE_ERR_NOMEM, "moe_detokenizer: out of memory for %zu bytes of text", n);
  d->out = p, d->cap_out = n + 1;
  return MOE_OK;
}

/* The token's bytes after the held ones, as UTF-8; an incomplete character at the end held unless final. */
static moe_status push_bytes(moe_detokenizer *d, const char *b, size_t k, int final, const char **text, size_t *len) {
  char *raw = malloc(d->nheld + k + 1);
  moe_status st = raw ? out_room(d, 3 * (d->nheld + k)) : MOE_ERR_NOMEM;
  if (st == MOE_OK) {
    memcpy(raw, d->held, d->nheld);
    if (k) memcpy(raw + d->nheld, b, k);
    size_t used, n = d->nheld + k;
    *len = moe__utf8_clean(raw, n, final, d->out, &used);
    d->nheld = n - used; /* at most 3: the start of a 4-byte character */
    memcpy(d->held, raw + used, d->nheld);
    *text = d->out;
  }
  free(raw);
  MOE_TRY(st == MOE_OK, st, "moe_detokenizer: out of memory for a token's %zu bytes", k);
  return MOE_OK;
}

/* 1 when decoded text may still change with the next tokens: it ends in U+FFFD (a byte-fallback run not
 * yet UTF-8) or in the start of a character. */
static int unfinished(const char *s, size_t n) {
  if (n >= 3 && !memcmp(s + n - 3, "\xef\xbf\xbd", 3)) return 1;
  char tmp[12];
  size_t from = n > 3 ? n - 3 : 0, used;
  moe__utf8_clean(s + from, n - from, 0, tmp, &used);
  return used < n - from;
}

/* What ids [shown, n) add to the window's text (all of them when final, else only once it is finished). */
static moe_status push_window(moe_detokenizer *d, int final, const char **text, size_t *len) {
  char *before = NULL, *after = NULL;
  size_t nb = 0, na = 0;
  *text = "", *len = 0;
  moe_status st = moe_tokenizer_decode_alloc(d->t, d->ids, d->shown, &before, &nb);
  if (st == MOE_OK) st = moe_tokenizer_decode_alloc(d->t, d->ids, d->n, &after, &na);
  if (st == MOE_OK && (final || !unfinished(after, na))) {
    size_t from = nb <= na ? nb : na, used;
    st = out_room(d, 3 * (na - from));
    if (st == MOE_OK) {
      *len = moe__utf8_clean(after + from, na - from, 1, d->out, &used);
      *text = d->out;
      if (d->n > d->shown) /* the window starts where it was */
        memmove(d->ids, d->ids + d->shown, (d->n - d->shown) * sizeof *d->ids);
      d->n -= d->shown, d->shown = d->n;
    }
  }
  free(before), free(after);
  return st;
}

moe_status moe_detokenizer_push(moe_detokenizer *d, int32_t id, const char **text, size_t *len) {
  MOE_TRY(d && text && len, MOE_ERR_ARG, "moe_detokenizer_push: NULL argument");
  size_t k;
  const char *b = moe_tokenizer_token_bytes(d->t, id, &k);
  MOE_TRY(b, MOE_ERR_VALUE, "moe_detokenizer_push: %d is not a token id (the vocabulary has %d)", id,
          moe_tokenizer_vocab_size(d->t));
  if (d->concat) return push_bytes(d, b, k, 0, text, len);
  if (d->n == d->cap) {
    size_t cap = d->cap ? 2 * d->cap : 16;
    int32_t *p = realloc(d->ids, cap * sizeof *p);
    MOE_TRY(p, MOE_ERR_NOMEM, "moe_detokenizer_push: out of memory for %zu ids", cap);
    d->ids = p, d->cap = cap;
  }
  d->ids[d->n++] = id;
  return push_window(d, 0, text, len);
}

/* Whether id is a byte-fallback token ("<0x80>" to "<0xBF>") of a byte that continues a character. */
static int continuation_byte(const moe_tokenizer *t, int32_t id) {
  size_t k;
  const char *b = moe_tokenizer_token_bytes(t, id, &k);
  unsigned v;
  return b && k == 6 && !memcmp(b, "<0x", 3) && b[5] == '>' && sscanf(b + 3, "%2x", &v) == 1 && v >= 0x80 && v < 0xC0;
}

/* The window: the last of the context's ids, shown, so that the next token's text is what it adds after
 * them (a SentencePiece piece keeps its space). A few ids cover a byte-fallback run of one character. */
#define FOLLOW_IDS 6

moe_status moe_detokenizer_follow(moe_detokenizer *d, const int32_t *ids, size_t n) {
  MOE_TRY(d && (ids || !n), MOE_ERR_ARG, "moe_detokenizer_follow: NULL argument");
  d->nheld = d->n = d->shown = 0;
  if (d->concat || !n) return MOE_OK;
  size_t k = n < FOLLOW_IDS ? n : FOLLOW_IDS;
  for (size_t i = n - k; i < n; i++)
    MOE_TRY(ids[i] >= 0 && ids[i] < moe_tokenizer_vocab_size(d->t), MOE_ERR_VALUE,
            "moe_detokenizer_follow: %d is not a token id (the vocabulary has %d)", ids[i], moe_tokenizer_vocab_size(d->t));
  /* the window starts at a character: a byte-fallback run cut after its first byte would not be UTF-8,
   * and its decoders give every byte of such a run as U+FFFD, the ones that follow too */
  while (k > 1 && continuation_byte(d->t, ids[n - k])) k--;
  if (k > d->cap) {
    int32_t *p = realloc(d->ids, FOLLOW_IDS * sizeof *p);
    MOE_TRY(p, MOE_ERR_NOMEM, "moe_detokenizer_follow: out of memory");
    d->ids = p, d->cap = FOLLOW_IDS;
  }
  memcpy(d->ids, ids + n - k, k * sizeof *ids);
  d->n = d->shown = k;
  return MOE_OK;
}

moe_status moe_detokenizer_flush(moe_detokenizer *d, const char **text, size_t *len) {
  MOE_TRY(d && text && len, MOE_ERR_ARG, "moe_detokenizer_flush: NULL argument");
  moe_status st = d->concat ? push_bytes(d, "", 0, 1, text, len) : push_window(d, 1, text, len);
  d->nheld = d->n = d->shown = 0;
  return st;
}
