/* Learning byte-level BPE merges from a text (moe_tokenizer_train). The text is cut into pre-tokens
 * (GPT-2's regex, pretok.c), counted once per distinct word; then each step merges the most
 * frequent adjacent pair of symbols over all words (ties: the smaller left id, then the smaller right
 * id). Pair counts are kept up to date incrementally: a merge revisits only the words that hold the
 * pair (each pair lists its words) and a max-heap holds the pairs, its stale entries fixed when they
 * reach the top (counts only fall, except for the new symbol's pairs, which are pushed). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm/tokenizer.h"

typedef struct {
  int32_t *sym;   /* the word's symbols (ids), into the shared pool */
  int32_t n;
  int64_t count;  /* occurrences in the text */
} word;

typedef struct {
  int32_t a, b;
  int64_t count;
  int32_t *words, nw, cw; /* the words that hold (or held) the pair, each once */
} pair;

typedef struct {
  int64_t count;
  int32_t a, b, p;
} heap_item;

typedef struct {
  word *w;
  int32_t nw;
  pair *p;
  int32_t np, cp;
  moe__tok_map index; /* (a, b) -> pair */
  heap_item *h;
  size_t nh, ch;
} trainer;

/* Whether x comes out of the heap before y. */
static int before(const heap_item *x, const heap_item *y) {
  if (x->count != y->count) return x->count > y->count;
  return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static int heap_push(trainer *T, heap_item it) {
  if (T->nh == T->ch) {
    size_t c = T->ch ? 2 * T->ch : 1024;
    heap_item *h = realloc(T->h, c * sizeof *h);
    if (!h) return 0;
    T->h = h;
    T->ch = c;
  }
  size_t i = T->nh++;
  for (; i && before(&it, &T->h[(i - 1) / 2]); i = (i - 1) / 2) T->h[i] = T->h[(i - 1) / 2];
  T->h[i] = it;
  return 1;
}

static heap_item heap_pop(trainer *T) {
  heap_item top = T->h[0], last = T->h[--T->nh];
  size_t i = 0;
  for (size_t c; (c = 2 * i + 1) < T->nh; i = c) {
    if (c + 1 < T->nh && before(&T->h[c + 1], &T->h[c])) c++;
    if (!before(&T->h[c], &last)) break;
    T->h[i] = T->h[c];
  }
  if (T->nh) T->h[i] = last;
  return top;
}

/* Adds delta to pair (a, b) as found in word w, creating the pair when new; lists w under it when
 * `list` (a pair the word did not hold before). */
static int count_pair(trainer *T, int32_t a, int32_t b, int32_t w, int64_t delta, int list) {
  int32_t key[2] = {a, b};
  int isnew;
  int64_t *v = moe__tok_map_put(&T->index, key, sizeof key, T->np, &isnew);
  if (!v) return 0;
  if (isnew) {
    if (T->np == T->cp) {
      int32_t c = T->cp ? 2 * T->cp : 4096;
      pair *p = realloc(T->p, (size_t)c * sizeof *p);
      if (!p) return 0;
      T->p = p;
      T->cp = c;
    }
    T->p[T->np++] = (pair){a, b, 0, NULL, 0, 0};
  }
  pair *p = &T->p[*v];
  p->count += delta;
  if (list && (!p->nw || p->words[p->nw - 1] != w)) {
    if (p->nw == p->cw) {
      int32_t c = p->cw ? 2 * p->cw : 4;
      int32_t *ws = realloc(p->words, (size_t)c * sizeof *ws);
      if (!ws) return 0;
      p->words = ws;
      p->cw = c;
    }
    p->words[p->nw++] = w;
  }
  return 1;
}

/* Adds sign * the word's count to each of its adjacent pairs, listing the word under those with symbol
 * c (all of them when c < 0). */
static int count_word(trainer *T, int32_t w, int sign, int32_t c) {
  const word *x = &T->w[w];
  for (int32_t i = 0; i + 1 < x->n; i++) {
    int32_t a = x->sym[i], b = x->sym[i + 1];
    if (!count_pair(T, a, b, w, sign * x->count, sign > 0 && (c < 0 || a == c || b == c))) return 0;
  }
  return 1;
}

/* Replaces every (a, b) of word x by c, left to right. */
static void merge_word(word *x, int32_t a, int32_t b, int32_t c) {
  int32_t j = 0;
  for (int32_t i = 0; i < x->n; j++)
    if (i + 1 < x->n && x->sym[i] == a && x->sym[i + 1] == b) {
      x->sym[j] = c;
      i += 2;
    } else {
      x->sym[j] = x->sym[i++];
    }
  x->n = j;
}

/* Whether word w holds (a, b). */
static int holds(const word *x, int32_t a, int32_t b) {
  for (int32_t i = 0; i + 1 < x->n; i++)
    if (x->sym[i] == a && x->sym[i + 1] == b) return 1;
  return 0;
}

/* Merges pair p into the new symbol c, updating the counts of the words that hold it and pushing the
 * pairs this created. */
static int apply_merge(trainer *T, int32_t p, int32_t c) {
  int32_t a = T->p[p].a, b = T->p[p].b, first_new = T->np;
  int32_t *ws = T->p[p].words, nw = T->p[p].nw;
  T->p[p].words = NULL;
  T->p[p].nw = T->p[p].cw = 0;
  int ok = 1;
  for (int32_t k = 0; ok && k < nw; k++) {
    if (!holds(&T->w[ws[k]], a, b)) continue;
    ok = count_word(T, ws[k], -1, c);
    merge_word(&T->w[ws[k]], a, b, c);
    ok = ok && count_word(T, ws[k], +1, c);
  }
  free(ws);
  for (int32_t q = first_new; ok && q < T->np; q++)
    ok = heap_push(T, (heap_item){T->p[q].count, T->p[q].a, T->p[q].b, q});
  return ok;
}

/* The text's distinct pre-tokens as words of byte ids, with their counts. */
static moe_status split_words(trainer *T, const moe_tokenizer *t, const unsigned char *s, size_t n,
                              int32_t **pool) {
  moe__tok_map counts = {0};
  moe__pretok *pre;
  MOE_CHECK(moe__pretok_new(&pre));
  for (size_t i = 0, j; i < n; i = j) {
    j = moe__pretok_next(pre, s, n, i);
    int isnew;
    int64_t *v = moe__tok_map_put(&counts, s + i, j - i, 0, &isnew);
    if (!v) {
      moe__pretok_free(pre);
      moe__tok_map_free(&counts);
      return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_tokenizer_train: out of memory counting words");
    }
    ++*v;
  }
  moe__pretok_free(pre);
  T->w = malloc((counts.n ? counts.n : 1) * sizeof *T->w);
  *pool = malloc((counts.keys_len ? counts.keys_len : 1) * sizeof **pool);
  if (!T->w || !*pool) {
    moe__tok_map_free(&counts);
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_tokenizer_train: out of memory (%zu words)", counts.n);
  }
  int32_t *at = *pool;
  for (size_t k = 0; k < counts.n; k++) {
    const unsigned char *key = (const unsigned char *)moe__tok_map_key(&counts, k);
    word *x = &T->w[T->nw++];
    x->sym = at;
    x->n = (int32_t)counts.entries[k].len;
    x->count = counts.entries[k].val;
    for (int32_t i = 0; i < x->n; i++) x->sym[i] = t->byte_id[key[i]];
    at += x->n;
  }
  moe__tok_map_free(&counts);
  return MOE_OK;
}

/* The merges, learned into t (its 256 byte tokens set) until it has `merges` of them or no pair is
 * left. */
static moe_status learn(trainer *T, moe_tokenizer *t, int32_t merges) {
  for (int32_t w = 0; w < T->nw; w++)
    MOE_TRY(count_word(T, w, +1, -1), MOE_ERR_NOMEM, "moe_tokenizer_train: out of memory counting pairs");
  for (int32_t q = 0; q < T->np; q++)
    MOE_TRY(heap_push(T, (heap_item){T->p[q].count, T->p[q].a, T->p[q].b, q}), MOE_ERR_NOMEM,
            "moe_tokenizer_train: out of memory (pair heap)");
  while (t->n_merges < merges && T->nh) {
    heap_item top = heap_pop(T);
    int64_t now = T->p[top.p].count;
    if (now != top.count) { /* stale: it fell since it was pushed */
      MOE_TRY(now <= 0 || heap_push(T, (heap_item){now, top.a, top.b, top.p}), MOE_ERR_NOMEM,
              "moe_tokenizer_train: out of memory (pair heap)");
      continue;
    }
    if (now <= 0) continue;
    int32_t c = 256 + t->n_merges;
    size_t la = (size_t)t->len[top.a], lb = (size_t)t->len[top.b];
    char *joined = malloc(la + lb);
    int ok = joined != NULL;
    if (ok) {
      memcpy(joined, t->bytes[top.a], la);
      memcpy(joined + la, t->bytes[top.b], lb);
      ok = moe__tok_set(t, c, joined, la + lb, 0, 0) && moe__tok_add_merge(t, top.a, top.b, c) &&
           apply_merge(T, top.p, c);
    }
    free(joined);
    MOE_TRY(ok, MOE_ERR_NOMEM, "moe_tokenizer_train: out of memory at merge %d", t->n_merges);
  }
  return MOE_OK;
}

moe_status moe_tokenizer_train(moe_tokenizer **out, const char *text, size_t n, int32_t vocab_size) {
  MOE_TRY(out && (text || !n), MOE_ERR_ARG, "moe_tokenizer_train: NULL argument");
  *out = NULL;
  MOE_TRY(n <= INT32_MAX, MOE_ERR_ARG, "moe_tokenizer_train: %zu bytes of text, more than 2^31 - 1", n);
  MOE_TRY(vocab_size >= 257, MOE_ERR_ARG,
          "moe_tokenizer_train: vocab_size %d is below 257 (256 byte tokens and %s)", vocab_size,
          MOE_TOKENIZER_EOT);
  moe_tokenizer *t = moe__tok_alloc(vocab_size);
  MOE_TRY(t, MOE_ERR_NOMEM, "moe_tokenizer_train: out of memory (vocabulary of %d)", vocab_size);
  int ok = 1;
  for (int b = 0; ok && b < 256; b++) ok = moe__tok_set(t, moe__tok_byte_rank(b), (char[1]){(char)b}, 1, 0, 0);
  trainer T = {0};
  int32_t *pool = NULL;
  moe_status st = ok ? split_words(&T, t, (const unsigned char *)text, n, &pool)
                     : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_tokenizer_train: out of memory");
  if (st == MOE_OK) st = learn(&T, t, vocab_size - 257);
  for (int32_t q = 0; q < T.np; q++) free(T.p[q].words);
  free(T.p);
  free(T.h);
  free(T.w);
  free(pool);
  moe__tok_map_free(&T.index);
  if (st == MOE_OK) { /* fewer merges than asked when the text ran out of pairs */
    int32_t eot = 256 + t->n_merges;
    t->vocab = eot + 1;
    if (!moe__tok_set(t, eot, MOE_TOKENIZER_EOT, strlen(MOE_TOKENIZER_EOT), 1, 1))
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_tokenizer_train: out of memory");
  }
  if (st != MOE_OK) {
    moe_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MOE_OK;
}
