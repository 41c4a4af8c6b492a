/* Byte-level BPE (GPT-2's scheme): the pre-tokenizer, encoding by merge rank, decoding, and the
 * tokenizer's state. Training is in tokenizer_train.c, tokenizer.json in tokenizer_json.c. */
#include "lm/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- GPT-2's byte <-> character table ---- */

/* The 188 bytes that stand for themselves: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. */
static int printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

int moe__tok_byte_char(int b) {
  if (printable(b)) return b;
  int k = 0; /* the others get 256, 257, ... in byte order */
  for (int c = 0; c < b; c++) k += !printable(c);
  return 256 + k;
}

int moe__tok_char_byte(uint32_t cp) {
  if (cp < 256) return printable((int)cp) ? (int)cp : -1;
  for (int b = 0, k = 0; b < 256; b++)
    if (!printable(b) && 256 + k++ == (int)cp) return b;
  return -1;
}

int moe__tok_byte_rank(int b) { /* the 188 printable characters (their own code points) come first */
  int r = printable(b) ? 0 : 188;
  for (int c = 0; c < b; c++) r += printable(c) == printable(b);
  return r;
}

/* ---- state ---- */

moe_tokenizer *moe__tok_alloc(int32_t vocab) {
  moe_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->vocab = vocab;
  t->bytes = calloc((size_t)vocab, sizeof *t->bytes);
  t->len = calloc((size_t)vocab, sizeof *t->len);
  t->added = calloc((size_t)vocab, 1);
  t->special = calloc((size_t)vocab, 1);
  if (!t->bytes || !t->len || !t->added || !t->special) {
    moe_tokenizer_free(t);
    return NULL;
  }
  return t;
}

int moe__tok_set(moe_tokenizer *t, int32_t id, const char *bytes, size_t len, int added, int special) {
  int isnew;
  t->bytes[id] = malloc(len ? len : 1);
  if (!t->bytes[id]) return 0;
  memcpy(t->bytes[id], bytes, len);
  t->len[id] = (int32_t)len;
  t->added[id] = (uint8_t)added;
  t->special[id] = (uint8_t)special;
  if (added) return 1;
  if (len == 1) t->byte_id[(unsigned char)bytes[0]] = id;
  return moe__tok_map_put(&t->by_bytes, bytes, len, id, &isnew) != NULL;
}

int moe__tok_add_merge(moe_tokenizer *t, int32_t left, int32_t right, int32_t merged) {
  int32_t key[2] = {left, right}, (*m)[3] = realloc(t->merges, (size_t)(t->n_merges + 1) * sizeof *m);
  int isnew;
  if (!m) return 0;
  t->merges = m;
  if (!moe__tok_map_put(&t->pair_rank, key, sizeof key, t->n_merges, &isnew)) return 0;
  if (!isnew) return 1;
  m[t->n_merges][0] = left;
  m[t->n_merges][1] = right;
  m[t->n_merges++][2] = merged;
  return 1;
}

void moe_tokenizer_free(moe_tokenizer *t) {
  if (!t) return;
  for (int32_t i = 0; t->bytes && i < t->vocab; i++) free(t->bytes[i]);
  free(t->bytes);
  free(t->len);
  free(t->added);
  free(t->special);
  free(t->merges);
  moe__tok_map_free(&t->pair_rank);
  moe__tok_map_free(&t->by_bytes);
  free(t);
}

int32_t moe_tokenizer_vocab_size(const moe_tokenizer *t) { return t->vocab; }

int32_t moe_tokenizer_token_id(const moe_tokenizer *t, const char *token) {
  for (int32_t i = 0; i < t->vocab; i++)
    if (t->added[i] && (size_t)t->len[i] == strlen(token) && !memcmp(t->bytes[i], token, (size_t)t->len[i])) return i;
  const int64_t *v = moe__tok_map_get(&t->by_bytes, token, strlen(token));
  return v ? (int32_t)*v : -1;
}

const char *moe_tokenizer_token_bytes(const moe_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->vocab) return NULL;
  *len = (size_t)t->len[id];
  return t->bytes[id];
}

/* ---- encode ---- */

/* The ids of one pre-token w (n bytes) into out (room for n): its bytes, then the lowest-ranked
 * adjacent pair merged everywhere, again and again. Returns the count. */
static size_t bpe_word(const moe_tokenizer *t, const unsigned char *w, size_t n, int32_t *out) {
  const int64_t *whole = t->ignore_merges ? moe__tok_map_get(&t->by_bytes, w, n) : NULL;
  if (whole) {
    out[0] = (int32_t)*whole;
    return 1;
  }
  for (size_t i = 0; i < n; i++) out[i] = t->byte_id[w[i]];
  for (size_t m = n;;) {
    int64_t best = INT64_MAX;
    for (size_t i = 0; i + 1 < m; i++) {
      const int64_t *r = moe__tok_map_get(&t->pair_rank, (int32_t[2]){out[i], out[i + 1]}, 8);
      if (r && *r < best) best = *r;
    }
    if (best == INT64_MAX) return m;
    const int32_t *mg = t->merges[best];
    size_t j = 0;
    for (size_t i = 0; i < m; j++)
      if (i + 1 < m && out[i] == mg[0] && out[i + 1] == mg[1]) {
        out[j] = mg[2];
        i += 2;
      } else {
        out[j] = out[i++];
      }
    m = j;
  }
}

/* A pre-token's ids, remembered per encode call (a text repeats its words), and the pre-tokenizer. */
typedef struct {
  moe__pretok *pre;
  moe__tok_map index; /* pre-token bytes -> offset in ids */
  int32_t *ids;       /* at each offset: the count, then the ids */
  size_t n, cap;
} word_cache;

static moe_status encode_plain(const moe_tokenizer *t, word_cache *c, const unsigned char *s, size_t n,
                               int32_t *ids, size_t *k) {
  for (size_t i = 0, j; i < n; i = j) {
    j = moe__pretok_next(c->pre, s, n, i);
    int isnew;
    int64_t *off = moe__tok_map_put(&c->index, s + i, j - i, (int64_t)c->n, &isnew);
    MOE_TRY(off, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (word cache)");
    if (isnew) {
      if (c->n + (j - i) + 1 > c->cap) {
        size_t cap = 2 * c->cap + (j - i) + 1024;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        MOE_TRY(p, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (word cache of %zu ids)", cap);
        c->ids = p;
        c->cap = cap;
      }
      size_t m = bpe_word(t, s + i, j - i, c->ids + c->n + 1);
      c->ids[c->n] = (int32_t)m;
      c->n += m + 1;
    }
    const int32_t *w = c->ids + *off;
    memcpy(ids + *k, w + 1, (size_t)w[0] * sizeof *ids);
    *k += (size_t)w[0];
  }
  return MOE_OK;
}

/* Where each added token next occurs in the text, so that the text is searched once per occurrence. */
typedef struct {
  int32_t id;
  size_t at; /* its next occurrence at or after the last search's start; the text's length when none */
  size_t from; /* where that search started */
} added_at;

/* The added token that occurs first in text[i, n) (the longest of those starting there), or -1; its
 * offset in *at (n when none). */
static int32_t next_added(const moe_tokenizer *t, added_at *a, int na, const char *text, size_t n, size_t i,
                          size_t *at) {
  int32_t best = -1;
  *at = n;
  for (int k = 0; k < na; k++) {
    if (a[k].at < i || a[k].from > i) { /* passed over (or never searched): search again from i */
      const char *p = memmem(text + i, n - i, t->bytes[a[k].id], (size_t)t->len[a[k].id]);
      a[k].at = p ? (size_t)(p - text) : n;
      a[k].from = i;
    }
    if (a[k].at < *at || (a[k].at == *at && a[k].at < n && t->len[a[k].id] > t->len[best])) {
      best = a[k].id;
      *at = a[k].at;
    }
  }
  return best;
}

moe_status moe_tokenizer_encode(const moe_tokenizer *t, const char *text, size_t n, int special,
                                int32_t *ids, size_t *n_ids) {
  MOE_TRY(t && (text || !n) && ids && n_ids, MOE_ERR_ARG, "moe_tokenizer_encode: NULL argument");
  int na = 0;
  for (int32_t id = 0; special && id < t->vocab; id++) na += t->added[id];
  added_at *a = malloc((na ? (size_t)na : 1) * sizeof *a);
  MOE_TRY(a, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory");
  for (int32_t id = 0, k = 0; special && id < t->vocab; id++)
    if (t->added[id]) a[k++] = (added_at){id, 0, SIZE_MAX};
  word_cache c = {0};
  moe_status st = moe__pretok_new(&c.pre);
  *n_ids = 0;
  for (size_t i = 0; i < n && st == MOE_OK;) {
    size_t at = n;
    int32_t id = next_added(t, a, na, text, n, i, &at);
    st = encode_plain(t, &c, (const unsigned char *)text + i, at - i, ids, n_ids);
    i = at;
    if (id >= 0) {
      ids[(*n_ids)++] = id;
      i += (size_t)t->len[id];
    }
  }
  free(a);
  moe__pretok_free(c.pre);
  moe__tok_map_free(&c.index);
  free(c.ids);
  return st;
}

/* ---- decode ---- */

moe_status moe_tokenizer_decode(const moe_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                                size_t *len) {
  MOE_TRY(t && (ids || !n) && len, MOE_ERR_ARG, "moe_tokenizer_decode: NULL argument");
  size_t need = 0;
  for (size_t i = 0; i < n; i++) {
    MOE_TRY(ids[i] >= 0 && ids[i] < t->vocab, MOE_ERR_VALUE,
            "moe_tokenizer_decode: ids[%zu] = %d is not a token id (the vocabulary has %d)", i, ids[i], t->vocab);
    need += (size_t)t->len[ids[i]];
  }
  *len = need;
  MOE_TRY(need <= cap && (out || !need), MOE_ERR_ARG,
          "moe_tokenizer_decode: the text needs %zu bytes, the buffer holds %zu", need, cap);
  for (size_t i = 0, k = 0; i < n; k += (size_t)t->len[ids[i++]]) memcpy(out + k, t->bytes[ids[i]], (size_t)t->len[ids[i]]);
  return MOE_OK;
}
