/* BPE: the tokenizer's state, added tokens, encoding by merge rank, decoding. GPT-2's byte-level BPE
 * runs here alone (GPT-2's pre-tokenizer in pretok.c); a Hugging Face file's normalizers,
 * pre-tokenizers and decoders run in tokenizer_pipeline.c. Training is in tokenizer_train.c,
 * tokenizer.json in tokenizer_json.c. */
#include "lm/tokenizer_hf.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
  t->strip = calloc((size_t)vocab, 1);
  if (!t->bytes || !t->len || !t->added || !t->special || !t->strip) {
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
  if (added) {
    int32_t *a = realloc(t->added_ids, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a) return 0;
    t->added_ids = a;
    a[t->n_added++] = id;
    return 1;
  }
  if (len == 1) t->byte_id[(unsigned char)bytes[0]] = id;
  return moe__tok_map_put(&t->by_bytes, bytes, len, id, &isnew) != NULL;
}

int moe__tok_add_merge(moe_tokenizer *t, int32_t left, int32_t right, int32_t merged) {
  int32_t key[2] = {left, right}, (*m)[3] = t->merges;
  int isnew;
  if (t->n_merges == t->merges_cap) { /* doubling: files have hundreds of thousands of merges */
    int32_t cap = 2 * t->merges_cap + 64;
    m = realloc(t->merges, (size_t)cap * sizeof *m);
    if (!m) return 0;
    t->merges = m;
    t->merges_cap = cap;
  }
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
  free(t->strip);
  free(t->added_ids);
  free(t->post);
  moe__tok_hf_free(t->hf);
  free(t->merges);
  moe__tok_map_free(&t->pair_rank);
  moe__tok_map_free(&t->by_bytes);
  free(t);
}

int32_t moe_tokenizer_vocab_size(const moe_tokenizer *t) { return t->vocab; }

int moe__tok_round_trips(const moe_tokenizer *t) {
  int strips = 0;
  for (int32_t i = 0; i < t->vocab; i++) strips |= t->strip[i];
  return !t->hf && !strips;
}

int32_t moe_tokenizer_token_id(const moe_tokenizer *t, const char *token) {
  for (int32_t k = 0; k < t->n_added; k++) {
    int32_t i = t->added_ids[k];
    if ((size_t)t->len[i] == strlen(token) && !memcmp(t->bytes[i], token, (size_t)t->len[i])) return i;
  }
  const int64_t *v = moe__tok_map_get(&t->by_bytes, token, strlen(token));
  return v ? (int32_t)*v : -1;
}

const char *moe_tokenizer_token_bytes(const moe_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->vocab) return NULL;
  *len = (size_t)t->len[id];
  return t->bytes[id];
}

/* ---- encode ---- */

/* The rank of the pair (a, b), or -1. */
static int64_t pair_rank(const moe_tokenizer *t, int32_t a, int32_t b) {
  const int64_t *r = moe__tok_map_get(&t->pair_rank, (int32_t[2]){a, b}, 8);
  return r ? *r : -1;
}

/* A min-heap of pairs by (rank, position of the left symbol): the lowest rank first, leftmost among
 * equals, as Hugging Face's BPE merges. */
typedef struct {
  int64_t rank;
  size_t pos;
} pair_at;

static int before(pair_at a, pair_at b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(pair_at *h, size_t *n, pair_at x) {
  size_t i = (*n)++;
  for (; i && before(x, h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
  h[i] = x;
}

static pair_at heap_pop(pair_at *h, size_t *n) {
  pair_at top = h[0], x = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && before(h[c + 1], h[c])) c++;
    if (!before(h[c], x)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = x;
  return top;
}

/* Long words: the same merges in O(m log m) with a heap over a linked list of symbols (the scan
 * below is quadratic: a run of 100,000 letters took seconds). 0 when out of memory. */
static int merge_heap(const moe_tokenizer *t, int32_t *out, size_t *m) {
  size_t n = *m, hn = 0, *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
  pair_at *h = malloc(n * 2 * sizeof *h); /* at most n - 1 pairs at first, then 2 per merge (n - 1) */
  if (!next || !prev || !h) {
    free(next), free(prev), free(h);
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    next[i] = i + 1, prev[i] = i - 1; /* n and SIZE_MAX: none */
    int64_t r = i + 1 < n ? pair_rank(t, out[i], out[i + 1]) : -1;
    if (r >= 0) heap_push(h, &hn, (pair_at){r, i});
  }
  while (hn) {
    pair_at x = heap_pop(h, &hn);
    size_t p = x.pos, q = next[p];
    if (out[p] < 0 || q >= n || pair_rank(t, out[p], out[q]) != x.rank) continue; /* gone or changed */
    out[p] = t->merges[x.rank][2];
    out[q] = -1;
    next[p] = next[q];
    if (next[q] < n) prev[next[q]] = p;
    int64_t r;
    if (prev[p] < n && (r = pair_rank(t, out[prev[p]], out[p])) >= 0) heap_push(h, &hn, (pair_at){r, prev[p]});
    if (next[p] < n && (r = pair_rank(t, out[p], out[next[p]])) >= 0) heap_push(h, &hn, (pair_at){r, p});
  }
  size_t j = 0;
  for (size_t i = 0; i < n; i = next[i]) out[j++] = out[i];
  *m = j;
  free(next), free(prev), free(h);
  return 1;
}

size_t moe__tok_merge(const moe_tokenizer *t, int32_t *out, size_t m) {
  if (m > 64 && merge_heap(t, out, &m)) return m;
  for (;;) { /* lowest rank first, every occurrence left to right (GPT-2's encoder) */
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

/* The ids of one pre-token w (n bytes) of a byte-level vocabulary into out (room for n): its bytes,
 * then the merges. Returns the count. */
static size_t bpe_word(const moe_tokenizer *t, const unsigned char *w, size_t n, int32_t *out) {
  const int64_t *whole = t->ignore_merges ? moe__tok_map_get(&t->by_bytes, w, n) : NULL;
  if (whole) {
    out[0] = (int32_t)*whole;
    return 1;
  }
  for (size_t i = 0; i < n; i++) out[i] = t->byte_id[w[i]];
  return moe__tok_merge(t, out, n);
}

/* The ids being written: the caller's array (room for cap, fixed) or one grown as needed. */
typedef struct {
  int32_t *ids;
  size_t k, cap;
  int grow;
} id_buf;

static moe_status room(id_buf *b, size_t more) {
  if (b->k + more <= b->cap) return MOE_OK;
  MOE_TRY(b->grow, MOE_ERR_ARG, "moe_tokenizer_encode: the ids need more room than the %zu given (this tokenizer can "
          "give more ids than the text has bytes: use moe_tokenizer_encode_alloc)", b->cap);
  size_t cap = 2 * b->cap + more + 256;
  int32_t *p = realloc(b->ids, cap * sizeof *p);
  MOE_TRY(p, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (%zu ids)", cap);
  b->ids = p;
  b->cap = cap;
  return MOE_OK;
}

/* A pre-token's ids, remembered per encode call (a text repeats its words), and the pre-tokenizers. */
typedef struct {
  moe__pretok *pre;       /* GPT-2's, for the plain path */
  moe__tok_scratch *sc;   /* a Hugging Face pipeline's */
  moe__tok_map index;     /* pre-token bytes -> offset in ids */
  int32_t *ids;           /* at each offset: the count, then the ids */
  size_t n, cap;
} word_cache;

static moe_status word_ids(const moe_tokenizer *t, word_cache *c, const unsigned char *w, size_t n, id_buf *b) {
  int isnew;
  int64_t *off = moe__tok_map_put(&c->index, w, n, (int64_t)c->n, &isnew);
  MOE_TRY(off, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (word cache)");
  if (isnew) {
    if (c->n + n + 1 > c->cap) {
      size_t cap = 2 * c->cap + n + 1024;
      int32_t *p = realloc(c->ids, cap * sizeof *p);
      MOE_TRY(p, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (word cache of %zu ids)", cap);
      c->ids = p;
      c->cap = cap;
    }
    size_t m = 0;
    if (!t->hf || t->hf->byte_level) m = bpe_word(t, w, n, c->ids + c->n + 1);
    else MOE_CHECK(moe__tok_bpe_chars(t, w, n, c->ids + c->n + 1, &m));
    c->ids[c->n] = (int32_t)m;
    c->n += m + 1;
  }
  const int32_t *ids = c->ids + *off;
  MOE_CHECK(room(b, (size_t)ids[0]));
  memcpy(b->ids + b->k, ids + 1, (size_t)ids[0] * sizeof *ids);
  b->k += (size_t)ids[0];
  return MOE_OK;
}

/* One stretch of text between added tokens (at_start: it begins the text). */
static moe_status encode_plain(const moe_tokenizer *t, word_cache *c, const unsigned char *s, size_t n, int at_start,
                               id_buf *b) {
  if (!t->hf) {
    if (!c->pre) MOE_CHECK(moe__pretok_new(&c->pre));
    for (size_t i = 0, j; i < n; i = j) {
      j = moe__pretok_next(c->pre, s, n, i);
      MOE_CHECK(word_ids(t, c, s + i, j - i, b));
    }
    return MOE_OK;
  }
  MOE_TRY(c->sc || (c->sc = moe__tok_scratch_new()), MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory");
  const char *buf;
  const size_t(*pcs)[2];
  size_t count;
  MOE_CHECK(moe__tok_pretokenize(t, c->sc, (const char *)s, n, at_start, &buf, &pcs, &count));
  for (size_t i = 0; i < count; i++)
    MOE_CHECK(word_ids(t, c, (const unsigned char *)buf + pcs[i][0], pcs[i][1] - pcs[i][0], b));
  return MOE_OK;
}

/* Where each added token next occurs in the text, so that the text is searched once per occurrence. */
typedef struct {
  int32_t id;
  size_t at; /* its next occurrence at or after the last search's start; the text's length when none */
  size_t from; /* where that search started */
} added_at;

/* Whether the character before byte a and the one at byte b of text (n bytes) are not word characters
 * (letters, digits, '_'): where a single_word added token may match. */
static int word_char(utf8proc_int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  return c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static int alone(const char *text, size_t n, size_t a, size_t b) {
  const unsigned char *u = (const unsigned char *)text;
  utf8proc_int32_t c;
  size_t k = a;
  while (k > 0 && a - k < 4 && (u[k - 1] & 0xc0) == 0x80) k--;
  if (a > 0 && k > 0 && utf8proc_iterate(u + k - 1, (utf8proc_ssize_t)(a - k + 1), &c) > 0 && word_char(c)) return 0;
  return !(b < n && utf8proc_iterate(u + b, (utf8proc_ssize_t)(n - b), &c) > 0 && word_char(c));
}

/* The added token that occurs first in text[i, n) (the longest of those starting there), or -1; its
 * offset in *at (n when none). */
static int32_t next_added(const moe_tokenizer *t, added_at *a, int na, const char *text, size_t n, size_t i,
                          size_t *at) {
  int32_t best = -1;
  *at = n;
  for (int k = 0; k < na; k++) {
    if (a[k].at < i || a[k].from > i) { /* passed over (or never searched): search again from i */
      const char *tok = t->bytes[a[k].id], *p = text + i;
      size_t len = (size_t)t->len[a[k].id];
      while ((p = memmem(p, n - (size_t)(p - text), tok, len)) && (t->strip[a[k].id] & MOE__TOK_SINGLE_WORD) &&
             !alone(text, n, (size_t)(p - text), (size_t)(p - text) + len))
        p++;
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

static int space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The post-processor's ids around the text's (b->ids[0 .. b->k)). */
static moe_status add_special(const moe_tokenizer *t, id_buf *b) {
  int before = 0;
  while (before < t->n_post && t->post[before] >= 0) before++;
  MOE_CHECK(room(b, (size_t)t->n_post));
  memmove(b->ids + before, b->ids, b->k * sizeof *b->ids);
  memcpy(b->ids, t->post, (size_t)before * sizeof *b->ids);
  b->k += (size_t)before;
  for (int i = before + 1; i < t->n_post; i++) b->ids[b->k++] = t->post[i];
  return MOE_OK;
}

static moe_status encode(const moe_tokenizer *t, const char *text, size_t n, int flags, id_buf *b) {
  MOE_TRY(t && (text || !n), MOE_ERR_ARG, "moe_tokenizer_encode: NULL argument");
  /* Added tokens: the special ones when asked, the others always (as HF's split_special_tokens). */
  int na = 0, special = flags & MOE_TOKENIZER_SPECIAL;
  added_at *a = malloc((t->n_added ? (size_t)t->n_added : 1) * sizeof *a);
  MOE_TRY(a, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory");
  for (int32_t i = 0; i < t->n_added; i++)
    if (special || !t->special[t->added_ids[i]]) a[na++] = (added_at){t->added_ids[i], 0, SIZE_MAX};
  word_cache c = {0};
  moe_status st = MOE_OK;
  for (size_t i = 0; i < n && st == MOE_OK;) {
    size_t at = n, end = n;
    int32_t id = next_added(t, a, na, text, n, i, &at);
    if (id >= 0) { /* lstrip and rstrip: the token takes the white space beside it */
      end = at + (size_t)t->len[id];
      while ((t->strip[id] & MOE__TOK_LSTRIP) && at > i && space(text[at - 1])) at--;
      while ((t->strip[id] & MOE__TOK_RSTRIP) && end < n && space(text[end])) end++;
    }
    st = encode_plain(t, &c, (const unsigned char *)text + i, at - i, i == 0, b);
    if (st == MOE_OK && id >= 0 && (st = room(b, 1)) == MOE_OK) b->ids[b->k++] = id;
    i = end;
  }
  if (st == MOE_OK && (flags & MOE_TOKENIZER_ADD_SPECIAL) && t->n_post) st = add_special(t, b);
  free(a);
  moe__pretok_free(c.pre);
  moe__tok_scratch_free(c.sc);
  moe__tok_map_free(&c.index);
  free(c.ids);
  return st;
}

moe_status moe_tokenizer_encode(const moe_tokenizer *t, const char *text, size_t n, int flags, int32_t *ids,
                                size_t *n_ids) {
  MOE_TRY(ids && n_ids, MOE_ERR_ARG, "moe_tokenizer_encode: NULL argument");
  id_buf b = {ids, 0, n, 0};
  moe_status st = encode(t, text, n, flags, &b);
  *n_ids = b.k;
  return st;
}

moe_status moe_tokenizer_encode_alloc(const moe_tokenizer *t, const char *text, size_t n, int flags, int32_t **ids,
                                      size_t *n_ids) {
  MOE_TRY(ids && n_ids, MOE_ERR_ARG, "moe_tokenizer_encode_alloc: NULL argument");
  id_buf b = {NULL, 0, 0, 1};
  moe_status st = room(&b, n + 1);
  if (st == MOE_OK) st = encode(t, text, n, flags, &b);
  if (st != MOE_OK) {
    free(b.ids);
    b.ids = NULL;
    b.k = 0;
  }
  *ids = b.ids;
  *n_ids = b.k;
  return st;
}

/* ---- decode ---- */

/* The ids checked, and the bytes of their tokens one after another in *need. */
static moe_status check_ids(const moe_tokenizer *t, const int32_t *ids, size_t n, size_t *need) {
  *need = 0;
  for (size_t i = 0; i < n; i++) {
    MOE_TRY(ids[i] >= 0 && ids[i] < t->vocab, MOE_ERR_VALUE,
            "moe_tokenizer_decode: ids[%zu] = %d is not a token id (the vocabulary has %d)", i, ids[i], t->vocab);
    *need += (size_t)t->len[ids[i]];
  }
  return MOE_OK;
}

/* The tokens' bytes one after another into out (room for them). */
static void concat(const moe_tokenizer *t, const int32_t *ids, size_t n, char *out) {
  for (size_t i = 0, k = 0; i < n; k += (size_t)t->len[ids[i++]]) memcpy(out + k, t->bytes[ids[i]], (size_t)t->len[ids[i]]);
}

moe_status moe_tokenizer_decode(const moe_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                                size_t *len) {
  MOE_TRY(t && (ids || !n) && len, MOE_ERR_ARG, "moe_tokenizer_decode: NULL argument");
  size_t need;
  MOE_CHECK(check_ids(t, ids, n, &need));
  if (!moe__tok_decode_is_concat(t)) { /* the file's decoders */
    char *text;
    MOE_CHECK(moe__tok_decode_hf(t, ids, n, &text, len));
    int fits = *len <= cap && (out || !*len);
    if (fits && *len) memcpy(out, text, *len);
    free(text);
    MOE_TRY(fits, MOE_ERR_ARG, "moe_tokenizer_decode: the text needs %zu bytes, the buffer holds %zu", *len, cap);
    return MOE_OK;
  }
  *len = need;
  MOE_TRY(need <= cap && (out || !need), MOE_ERR_ARG,
          "moe_tokenizer_decode: the text needs %zu bytes, the buffer holds %zu", need, cap);
  concat(t, ids, n, out);
  return MOE_OK;
}

moe_status moe_tokenizer_decode_alloc(const moe_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
  MOE_TRY(t && (ids || !n) && out && len, MOE_ERR_ARG, "moe_tokenizer_decode_alloc: NULL argument");
  *out = NULL;
  size_t need;
  MOE_CHECK(check_ids(t, ids, n, &need));
  char *text = NULL;
  if (moe__tok_decode_is_concat(t)) {
    MOE_TRY(text = malloc(need + 1), MOE_ERR_NOMEM, "moe_tokenizer_decode_alloc: out of memory for %zu bytes", need);
    concat(t, ids, n, text);
    *len = need;
  } else { /* the file's decoders, once */
    MOE_CHECK(moe__tok_decode_hf(t, ids, n, &text, len));
    char *p = realloc(text, *len + 1); /* room for the NUL */
    if (!p) free(text);
    MOE_TRY(text = p, MOE_ERR_NOMEM, "moe_tokenizer_decode_alloc: out of memory for %zu bytes", *len);
  }
  text[*len] = 0;
  *out = text;
  return MOE_OK;
}
