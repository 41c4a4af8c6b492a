/* Runs a tokenizer.json's steps (tokenizer_hf.h) as Hugging Face's tokenizers library does: the
 * normalizers over a stretch of text between added tokens, the pre-tokenizers over its pieces, BPE
 * over characters with byte fallback and unknown tokens, and the decoders over token strings. Text is
 * bytes: Unicode normalization and lowercasing work on the valid UTF-8 and keep other bytes as they
 * are; patterns (PCRE2, Unicode classes) match nothing inside invalid UTF-8. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "internal.h"
#include "lm/tokenizer_hf.h"

/* A growable byte string. */
typedef struct {
  char *p;
  size_t n, cap;
} str;

static int put(str *s, const void *b, size_t n) {
  if (s->n + n > s->cap) {
    size_t cap = 2 * s->cap + n + 64;
    char *p = realloc(s->p, cap);
    if (!p) return 0;
    s->p = p;
    s->cap = cap;
  }
  if (n) memcpy(s->p + s->n, b, n);
  s->n += n;
  return 1;
}

/* Pieces: spans [start, end) of a byte string. */
typedef struct {
  str bytes;
  size_t (*span)[2];
  size_t n, cap;
} pieces;

static int add_piece(pieces *p, size_t start, size_t end) {
  if (start == end) return 1; /* empty pieces go, as in HF */
  if (p->n == p->cap) {
    size_t cap = 2 * p->cap + 16;
    size_t(*s)[2] = realloc(p->span, cap * sizeof *s);
    if (!s) return 0;
    p->span = s;
    p->cap = cap;
  }
  p->span[p->n][0] = start;
  p->span[p->n++][1] = end;
  return 1;
}

/* Spans of one piece, each a match of the pattern or not, in order (HF's find_matches). */
typedef struct {
  size_t (*span)[2];
  uint8_t *match;
  size_t n, cap;
} marks;

static int mark(marks *m, size_t a, size_t b, int match) {
  if (a == b) return 1;
  if (m->n == m->cap) {
    size_t cap = 2 * m->cap + 16;
    size_t(*s)[2] = realloc(m->span, cap * sizeof *s);
    if (s) m->span = s;
    uint8_t *k = s ? realloc(m->match, cap) : NULL;
    if (!k) return 0;
    m->match = k;
    m->cap = cap;
  }
  m->span[m->n][0] = a;
  m->span[m->n][1] = b;
  m->match[m->n++] = (uint8_t)match;
  return 1;
}

struct moe__tok_scratch {
  str norm[2];
  pieces pcs[2];
  marks mk;
  pcre2_match_data *md;
  int match_error; /* PCRE2's error when a match failed (not for want of a match) */
};

moe__tok_scratch *moe__tok_scratch_new(void) {
  moe__tok_scratch *sc = calloc(1, sizeof *sc);
  if (sc && !(sc->md = pcre2_match_data_create(1, NULL))) {
    free(sc);
    return NULL;
  }
  return sc;
}

void moe__tok_scratch_free(moe__tok_scratch *sc) {
  if (!sc) return;
  for (int i = 0; i < 2; i++) {
    free(sc->norm[i].p);
    free(sc->pcs[i].bytes.p);
    free(sc->pcs[i].span);
  }
  free(sc->mk.span);
  free(sc->mk.match);
  pcre2_match_data_free(sc->md);
  free(sc);
}

/* The length of the UTF-8 character at s (n > 0 bytes left); 1 for a byte that does not start one. */
static size_t char_len(const unsigned char *s, size_t n) {
  utf8proc_int32_t cp;
  utf8proc_ssize_t l = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &cp);
  return l > 0 ? (size_t)l : 1;
}

/* The matches of re in s (n bytes) and the text between them, into m. Empty matches are skipped. */
static int find_matches(moe__tok_scratch *sc, const pcre2_code *re, const char *s, size_t n) {
  marks *m = &sc->mk;
  m->n = 0;
  size_t prev = 0, at = 0;
  while (at < n) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, 0, sc->md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* JIT's stack ran out: the interpreter keeps its own on the heap */
      rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_JIT, sc->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      sc->match_error = rc;
      return 0;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    if (ov[1] == ov[0]) { /* an empty match: look again one character on */
      at = ov[0] + char_len((const unsigned char *)s + ov[0], n - ov[0]);
      continue;
    }
    if (!mark(m, prev, ov[0], 0) || !mark(m, ov[0], ov[1], 1)) return 0;
    prev = at = ov[1];
  }
  return mark(m, prev, n, 0);
}

/* ---- normalizers ---- */

static int is_space(utf8proc_int32_t c) {
  if (c == ' ' || (c >= 9 && c <= 13) || c == 0x85) return 1;
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

/* Unicode normalization (opt: utf8proc's) or lowercasing (opt 0) of the valid UTF-8 runs of s. */
static int unicode(const char *s, size_t n, int opt, str *out) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t j = i; /* the valid run [i, j) */
    utf8proc_int32_t cp;
    utf8proc_ssize_t l;
    while (j < n && (l = utf8proc_iterate(u + j, (utf8proc_ssize_t)(n - j), &cp)) > 0) {
      if (!opt) {
        utf8proc_uint8_t b[4];
        if (!put(out, b, (size_t)utf8proc_encode_char(utf8proc_tolower(cp), b))) return 0;
      }
      j += (size_t)l;
    }
    if (opt && j > i) {
      utf8proc_uint8_t *d = NULL;
      utf8proc_ssize_t m = utf8proc_map(u + i, (utf8proc_ssize_t)(j - i), &d, (utf8proc_option_t)opt);
      int ok = m >= 0 && put(out, d, (size_t)m);
      free(d);
      if (!ok) return 0;
    }
    if (j < n && !put(out, u + j, 1)) return 0; /* a byte that is not UTF-8 */
    i = j + (j < n);
  }
  return 1;
}

/* Every match of st->re in s replaced by st->with. */
static int replace(moe__tok_scratch *sc, const moe__tok_step *st, const char *s, size_t n, str *out) {
  if (!find_matches(sc, st->re, s, n)) return 0;
  for (size_t i = 0; i < sc->mk.n; i++) {
    const size_t *sp = sc->mk.span[i];
    if (!(sc->mk.match[i] ? put(out, st->with, st->with_len) : put(out, s + sp[0], sp[1] - sp[0]))) return 0;
  }
  return 1;
}

static int strip(const moe__tok_step *st, const char *s, size_t n, str *out) {
  const unsigned char *u = (const unsigned char *)s;
  size_t a = 0, b = n;
  utf8proc_int32_t cp;
  utf8proc_ssize_t l;
  while (st->a && a < b && (l = utf8proc_iterate(u + a, (utf8proc_ssize_t)(b - a), &cp)) > 0 && is_space(cp)) a += (size_t)l;
  while (st->b && b > a) { /* back to the start of the last character */
    size_t k = b - 1;
    while (k > a && (u[k] & 0xc0) == 0x80 && b - k < 4) k--;
    if ((l = utf8proc_iterate(u + k, (utf8proc_ssize_t)(b - k), &cp)) <= 0 || (size_t)l != b - k || !is_space(cp)) break;
    b = k;
  }
  return put(out, s + a, b - a);
}

static int normalize_step(moe__tok_scratch *sc, const moe__tok_step *st, const char *s, size_t n, str *out) {
  switch (st->kind) {
  case STEP_PREPEND: return !n || (put(out, st->text, st->text_len) && put(out, s, n));
  case STEP_REPLACE: return replace(sc, st, s, n, out);
  case STEP_NFC: return unicode(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
  case STEP_NFKC: return unicode(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
  case STEP_NFD: return unicode(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, out);
  case STEP_NFKD: return unicode(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
  case STEP_LOWERCASE: return unicode(s, n, 0, out);
  default: return strip(st, s, n, out);
  }
}

/* ---- pre-tokenizers ---- */

/* The marked spans of one piece (at offset base in the output's bytes) into out as HF's
 * SplitDelimiterBehavior keeps them. */
static int keep_spans(const marks *m, keep_kind keep, int invert, size_t base, pieces *out) {
  size_t first = out->n;
  int prev = 0;
  for (size_t i = 0; i < m->n; i++) {
    size_t a = base + m->span[i][0], b = base + m->span[i][1];
    int match = m->match[i] ^ invert, last = out->n > first;
    if (keep == KEEP_WITH_NEXT && match && i + 1 < m->n && !(m->match[i + 1] ^ invert)) { /* joins the next span */
      if (!add_piece(out, a, base + m->span[++i][1])) return 0;
      prev = 0;
      continue;
    }
    if (keep == KEEP_REMOVED && match) {
      prev = match;
      continue;
    }
    if (last && ((keep == KEEP_WITH_PREVIOUS && match && !prev) || (keep == KEEP_CONTIGUOUS && match == prev)))
      out->span[out->n - 1][1] = b;
    else if (!add_piece(out, a, b))
      return 0;
    prev = match;
  }
  return 1;
}

/* Appends the bytes of one piece after a pre-tokenizer that rewrites it (prefix space, Metaspace). */
static int rewrite(const moe__tok_step *st, const char *s, size_t n, int first, str *out) {
  if (st->kind == STEP_PREFIX_SPACE) return (n && s[0] == ' ') || put(out, " ", 1) ? put(out, s, n) : 0;
  /* Metaspace: spaces become the replacement, which is prepended as the scheme says. */
  int starts = (n && s[0] == ' ') || (n >= st->text_len && !memcmp(s, st->text, st->text_len));
  if (!starts && (st->a == 2 || (st->a == 1 && first)) && !put(out, st->text, st->text_len)) return 0;
  for (size_t i = 0; i < n; i++)
    if (!(s[i] == ' ' ? put(out, st->text, st->text_len) : put(out, s + i, 1))) return 0;
  return 1;
}

/* The occurrences of a literal in s as marked spans. */
static int find_literal(marks *m, const char *lit, size_t ln, const char *s, size_t n) {
  m->n = 0;
  size_t prev = 0;
  for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), lit, ln)); p += ln) {
    size_t at = (size_t)(p - s);
    if (!mark(m, prev, at, 0) || !mark(m, at, at + ln, 1)) return 0;
    prev = at + ln;
  }
  return mark(m, prev, n, 0);
}

/* One pre-tokenizer over every piece of in into out; *at_start stays 1 while out's first piece begins
 * the text. */
static int pre_step(moe__tok_scratch *sc, const moe__tok_step *st, const pieces *in, pieces *out, int *at_start) {
  out->bytes.n = out->n = 0;
  for (size_t i = 0; i < in->n; i++) {
    const char *s = in->bytes.p + in->span[i][0];
    size_t n = in->span[i][1] - in->span[i][0], base = out->bytes.n, had = out->n;
    if (st->kind == STEP_SPLIT) {
      if (!put(&out->bytes, s, n) || !find_matches(sc, st->re, s, n) ||
          !keep_spans(&sc->mk, st->keep, st->invert, base, out))
        return 0;
    } else {
      if (!rewrite(st, s, n, *at_start && i == 0, &out->bytes)) return 0;
      const char *r = out->bytes.p + base;
      size_t rn = out->bytes.n - base;
      if (st->kind == STEP_METASPACE && st->b) {
        if (!find_literal(&sc->mk, st->text, st->text_len, r, rn) || !keep_spans(&sc->mk, KEEP_WITH_NEXT, 0, base, out))
          return 0;
      } else if (!add_piece(out, base, base + rn)) {
        return 0;
      }
    }
    if (i == 0) *at_start = *at_start && out->n > had && out->span[had][0] == base;
  }
  return 1;
}

moe_status moe__tok_pretokenize(const moe_tokenizer *t, moe__tok_scratch *sc, const char *s, size_t n, int at_start,
                                const char **buf, const size_t (**pcs)[2], size_t *count) {
  const moe__tok_hf *hf = t->hf;
  int ok = 1, k = 0;
  for (int i = 0; ok && i < hf->n_norm; i++, k ^= 1) {
    sc->norm[k].n = 0;
    ok = normalize_step(sc, &hf->norm[i], s, n, &sc->norm[k]);
    s = sc->norm[k].p, n = sc->norm[k].n;
  }
  pieces *in = &sc->pcs[0];
  in->bytes.n = in->n = 0;
  ok = ok && put(&in->bytes, s, n) && add_piece(in, 0, n);
  for (int i = 0; ok && i < hf->n_pre; i++) {
    pieces *out = in == &sc->pcs[0] ? &sc->pcs[1] : &sc->pcs[0];
    ok = pre_step(sc, &hf->pre[i], in, out, &at_start);
    in = out;
  }
  if (!ok && sc->match_error) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(sc->match_error, msg, sizeof msg);
    sc->match_error = 0;
    MOE_TRY(0, MOE_ERR_VALUE, "moe_tokenizer_encode: a pattern of the tokenizer failed on the text: %s", (char *)msg);
  }
  MOE_TRY(ok, MOE_ERR_NOMEM, "moe_tokenizer_encode: out of memory (pre-tokenizer)");
  *buf = in->bytes.p;
  *pcs = (const size_t(*)[2])in->span;
  *count = in->n;
  return MOE_OK;
}

/* ---- the model: BPE over characters ---- */

moe_status moe__tok_bpe_chars(const moe_tokenizer *t, const unsigned char *w, size_t n, int32_t *out, size_t *m) {
  const moe__tok_hf *hf = t->hf;
  const int64_t *whole = t->ignore_merges ? moe__tok_map_get(&t->by_bytes, w, n) : NULL;
  if (whole) {
    out[0] = (int32_t)*whole;
    *m = 1;
    return MOE_OK;
  }
  size_t k = 0;
  for (size_t i = 0, l; i < n; i += l) {
    l = char_len(w + i, n - i);
    const int64_t *id = moe__tok_map_get(&t->by_bytes, w + i, l);
    int bytes = hf->byte_fallback;
    for (size_t j = 0; bytes && !id && j < l; j++) bytes = hf->byte_tok[w[i + j]] >= 0;
    if (id) {
      out[k++] = (int32_t)*id;
    } else if (bytes) {
      for (size_t j = 0; j < l; j++) out[k++] = hf->byte_tok[w[i + j]];
    } else if (hf->unk >= 0) {
      if (!hf->fuse_unk || !k || out[k - 1] != hf->unk) out[k++] = hf->unk;
    } else {
      MOE_TRY(0, MOE_ERR_VALUE, "moe_tokenizer_encode: no token for the character \"%.*s\" (byte fallback off or "
              "incomplete, and no model.unk_token)", (int)l, (const char *)w + i);
    }
  }
  *m = moe__tok_merge(t, out, k);
  return MOE_OK;
}

/* ---- decoders: over token strings (pieces of one buffer) ---- */

static int hex(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* The byte a "<0xNN>" token stands for, or -1. */
static int fallback_byte(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>' || hex(s[3]) < 0 || hex(s[4]) < 0) return -1;
  return hex(s[3]) * 16 + hex(s[4]);
}

/* Appends a run of fallback bytes as one token: the bytes when they are UTF-8, else U+FFFD for each. */
static int flush_bytes(str *run, pieces *out) {
  if (!run->n) return 1;
  size_t base = out->bytes.n;
  int utf8 = utf8proc_decompose((const utf8proc_uint8_t *)run->p, (utf8proc_ssize_t)run->n, NULL, 0, 0) >= 0;
  int ok = utf8 ? put(&out->bytes, run->p, run->n) : 1;
  for (size_t i = 0; ok && !utf8 && i < run->n; i++) ok = put(&out->bytes, "\xef\xbf\xbd", 3);
  run->n = 0;
  return ok && add_piece(out, base, out->bytes.n);
}

static int decode_step(moe__tok_scratch *sc, const moe__tok_step *st, const pieces *in, pieces *out) {
  out->bytes.n = out->n = 0;
  str run = {0};
  int ok = 1;
  for (size_t i = 0; ok && i < in->n; i++) {
    const char *s = in->bytes.p + in->span[i][0];
    size_t n = in->span[i][1] - in->span[i][0], base = out->bytes.n;
    int b;
    switch (st->kind) {
    case STEP_REPLACE: ok = replace(sc, st, s, n, &out->bytes); break;
    case STEP_BYTE_FALLBACK:
      if ((b = fallback_byte(s, n)) >= 0) {
        ok = put(&run, (char[1]){(char)b}, 1);
        continue;
      }
      ok = flush_bytes(&run, out) && put(&out->bytes, s, n);
      base = out->bytes.n - n;
      break;
    case STEP_FUSE: ok = put(&out->bytes, s, n); break;
    case STEP_STRIP: {
      size_t a = 0, e = n, c = st->text_len;
      for (int k = 0; k < st->a && e - a >= c && !memcmp(s + a, st->text, c); k++) a += c;
      for (int k = 0; k < st->b && e - a >= c && !memcmp(s + e - c, st->text, c); k++) e -= c;
      ok = put(&out->bytes, s + a, e - a);
      break;
    }
    default: /* Metaspace: the replacement back to spaces; the first token loses the space prepended */
      for (size_t j = 0; ok && j < n;) {
        int rep = n - j >= st->text_len && !memcmp(s + j, st->text, st->text_len);
        if (!(rep && i == 0 && j == 0 && st->a)) ok = rep ? put(&out->bytes, " ", 1) : put(&out->bytes, s + j, 1);
        j += rep ? st->text_len : 1;
      }
    }
    if (ok && st->kind != STEP_FUSE) ok = out->bytes.n == base || add_piece(out, base, out->bytes.n);
  }
  ok = ok && flush_bytes(&run, out);
  if (ok && st->kind == STEP_FUSE) ok = add_piece(out, 0, out->bytes.n);
  free(run.p);
  return ok;
}

int moe__tok_decode_is_concat(const moe_tokenizer *t) { return !t->hf || t->hf->byte_level; }

moe_status moe__tok_decode_hf(const moe_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
  moe__tok_scratch *sc = moe__tok_scratch_new();
  pieces *in = sc ? &sc->pcs[0] : NULL;
  int ok = sc != NULL, plain = !t->hf->n_dec; /* no decoder: the tokens joined by spaces, as HF does */
  for (size_t i = 0; ok && i < n; i++) {
    size_t base = in->bytes.n;
    ok = (!plain || !i || put(&in->bytes, " ", 1)) && put(&in->bytes, t->bytes[ids[i]], (size_t)t->len[ids[i]]) &&
         add_piece(in, base, in->bytes.n);
  }
  for (int i = 0; ok && i < t->hf->n_dec; i++) {
    pieces *out = in == &sc->pcs[0] ? &sc->pcs[1] : &sc->pcs[0];
    ok = decode_step(sc, &t->hf->dec[i], in, out);
    in = out;
  }
  str s = {0};
  for (size_t i = 0; ok && i < in->n; i++) ok = put(&s, in->bytes.p + in->span[i][0], in->span[i][1] - in->span[i][0]);
  moe__tok_scratch_free(sc);
  if (!ok) free(s.p);
  MOE_TRY(ok, MOE_ERR_NOMEM, "moe_tokenizer_decode: out of memory");
  *text = s.p;
  *len = s.n;
  return MOE_OK;
}
