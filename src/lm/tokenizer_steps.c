/* Reads a tokenizer.json's normalizer, pre_tokenizer, decoder and post_processor into steps (see
 * tokenizer_hf.h) as Hugging Face's tokenizers library reads them. Sequences are flattened; the
 * pre-tokenizers Digits and Punctuation become Splits with the pattern they stand for, ByteLevel a
 * prefix space and GPT-2's Split. Any other type, or a field with a value we do not run, is an error
 * naming the field and its value. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm/tokenizer_hf.h"

#define FMT(...) moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, __VA_ARGS__)
#define NOMEM(path) moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path)

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust's char::is_ascii_punctuation or a Unicode punctuation character, one at a time. */
static const char PUNCT_PATTERN[] = "[\\p{P}!-/:-@\\[-`{-~]";

static const char *type_of(const cJSON *o) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
  return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

typedef struct {
  moe__tok_step *s;
  int n;
} steps;

static moe__tok_step *push(steps *v, step_kind kind) {
  moe__tok_step *s = realloc(v->s, (size_t)(v->n + 1) * sizeof *s);
  if (!s) return NULL;
  v->s = s;
  memset(&s[v->n], 0, sizeof *s);
  s[v->n].kind = kind;
  return &s[v->n++];
}

static moe_status compile(const char *path, const char *where, const char *pat, int literal, pcre2_code **re) {
  int err;
  PCRE2_SIZE at;
  uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &err, &at, NULL);
  if (!*re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(err, msg, sizeof msg);
    return FMT("%s: %s: the pattern \"%.80s\" does not compile (at offset %zu: %s)", path, where, pat, (size_t)at,
               (char *)msg);
  }
  pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* PCRE2's interpreter runs it where JIT is missing */
  return MOE_OK;
}

/* {"String": s} or {"Regex": r} into st->re. */
static moe_status pattern(const char *path, const char *where, const cJSON *o, moe__tok_step *st) {
  const cJSON *p = get(o, "pattern"), *s = get(p, "String"), *r = get(p, "Regex");
  MOE_TRY(cJSON_IsString(s) || cJSON_IsString(r), MOE_ERR_FORMAT,
          "%s: %s.pattern is not {\"String\": ...} or {\"Regex\": ...}", path, where);
  return compile(path, where, cJSON_IsString(s) ? s->valuestring : r->valuestring, cJSON_IsString(s), &st->re);
}

/* A string member into *dst (copied); dflt when absent or null. */
static moe_status text(const char *path, const char *where, const cJSON *o, const char *key, const char *dflt,
                       char **dst, size_t *len) {
  const cJSON *x = get(o, key);
  MOE_TRY(!x || cJSON_IsNull(x) || cJSON_IsString(x), MOE_ERR_FORMAT, "%s: %s.%s is not a string", path, where, key);
  const char *s = cJSON_IsString(x) ? x->valuestring : dflt;
  MOE_TRY(s, MOE_ERR_FORMAT, "%s: %s.%s is missing", path, where, key);
  *dst = strdup(s);
  MOE_TRY(*dst, MOE_ERR_NOMEM, "%s: out of memory", path);
  *len = strlen(s);
  return MOE_OK;
}

static int flag(const cJSON *o, const char *key, int dflt) {
  const cJSON *x = get(o, key);
  return cJSON_IsBool(x) ? cJSON_IsTrue(x) : dflt;
}

/* A Sequence's members, each read by `one` with its place in the field's name. */
typedef moe_status (*reader)(const char *path, const char *where, const cJSON *o, steps *v, moe_tokenizer *t);

static moe_status sequence(const char *path, const char *where, const cJSON *o, const char *key, steps *v,
                           moe_tokenizer *t, reader one) {
  const cJSON *items = get(o, key), *it;
  MOE_TRY(cJSON_IsArray(items), MOE_ERR_FORMAT, "%s: %s.%s is missing or not an array", path, where, key);
  int i = 0;
  cJSON_ArrayForEach(it, items) {
    char w[256];
    snprintf(w, sizeof w, "%s.%s[%d]", where, key, i++);
    MOE_CHECK(one(path, w, it, v, t));
  }
  return MOE_OK;
}

static moe_status unsupported(const char *path, const char *where, const cJSON *o, const char *supported) {
  const char *ty = type_of(o);
  if (!ty) return FMT("%s: %s has no \"type\"", path, where);
  return FMT("%s: %s is of type \"%.60s\": not supported (only %s)", path, where, ty, supported);
}

/* A Replace step (a normalizer or a decoder: the same fields): its pattern and content. */
static moe_status replace(const char *path, const char *where, const cJSON *o, steps *v) {
  moe__tok_step *st = push(v, STEP_REPLACE);
  MOE_TRY(st, MOE_ERR_NOMEM, "%s: out of memory", path);
  MOE_CHECK(pattern(path, where, o, st));
  return text(path, where, o, "content", NULL, &st->with, &st->with_len);
}

/* ---- normalizers ---- */

static moe_status normalizer(const char *path, const char *where, const cJSON *o, steps *v, moe_tokenizer *t) {
  const char *ty = type_of(o);
  static const char *UNICODE[] = {"NFC", "NFKC", "NFD", "NFKD", "Lowercase"};
  static const step_kind KINDS[] = {STEP_NFC, STEP_NFKC, STEP_NFD, STEP_NFKD, STEP_LOWERCASE};
  if (!o || cJSON_IsNull(o)) return MOE_OK;
  if (ty && !strcmp(ty, "Sequence")) return sequence(path, where, o, "normalizers", v, t, normalizer);
  for (int i = 0; ty && i < 5; i++)
    if (!strcmp(ty, UNICODE[i])) return push(v, KINDS[i]) ? MOE_OK : NOMEM(path);
  moe__tok_step *st = NULL;
  if (ty && !strcmp(ty, "Prepend")) {
    MOE_TRY(st = push(v, STEP_PREPEND), MOE_ERR_NOMEM, "%s: out of memory", path);
    return text(path, where, o, "prepend", NULL, &st->text, &st->text_len);
  }
  if (ty && !strcmp(ty, "Replace")) return replace(path, where, o, v);
  if (ty && !strcmp(ty, "Strip")) {
    MOE_TRY(st = push(v, STEP_STRIP), MOE_ERR_NOMEM, "%s: out of memory", path);
    st->a = flag(o, "strip_left", 1);
    st->b = flag(o, "strip_right", 1);
    return MOE_OK;
  }
  return unsupported(path, where, o, "Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD, Lowercase, Strip");
}

/* ---- pre-tokenizers ---- */

static const char *KEEP_NAMES[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

static moe_status behavior(const char *path, const char *where, const cJSON *o, moe__tok_step *st) {
  const cJSON *b = get(o, "behavior");
  if (!b || cJSON_IsNull(b)) return MOE_OK; /* Isolated */
  for (int k = 0; cJSON_IsString(b) && k < 5; k++)
    if (!strcmp(b->valuestring, KEEP_NAMES[k])) {
      st->keep = (keep_kind)k;
      return MOE_OK;
    }
  return FMT("%s: %s.behavior is %s%.60s%s: not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, "
             "Contiguous", path, where, cJSON_IsString(b) ? "\"" : "", cJSON_IsString(b) ? b->valuestring : "not a string",
             cJSON_IsString(b) ? "\"" : "");
}

/* Metaspace's replacement (default U+2581): never empty (decoding searches for it, encoding puts it
 * for each space; an empty one found a fuzzed decoder looping for ever). */
static moe_status replacement(const char *path, const char *where, const cJSON *o, moe__tok_step *st) {
  MOE_CHECK(text(path, where, o, "replacement", "\xe2\x96\x81", &st->text, &st->text_len));
  MOE_TRY(st->text_len > 0, MOE_ERR_FORMAT, "%s: %s.replacement is empty", path, where);
  return MOE_OK;
}

/* Metaspace's prepend_scheme (or the older add_prefix_space) into st->a: 0 never, 1 first, 2 always. */
static moe_status prepend_scheme(const char *path, const char *where, const cJSON *o, moe__tok_step *st) {
  const cJSON *p = get(o, "prepend_scheme");
  st->a = flag(o, "add_prefix_space", 1) ? 2 : 0;
  if (!p || cJSON_IsNull(p)) return MOE_OK;
  static const char *NAMES[] = {"never", "first", "always"};
  for (int k = 0; cJSON_IsString(p) && k < 3; k++)
    if (!strcmp(p->valuestring, NAMES[k])) {
      st->a = k;
      return MOE_OK;
    }
  return FMT("%s: %s.prepend_scheme is %.60s: not \"first\", \"always\" or \"never\"", path, where,
             cJSON_IsString(p) ? p->valuestring : "not a string");
}

static moe_status split_with(const char *path, const char *where, const char *pat, moe__tok_step *st) {
  return compile(path, where, pat, 0, &st->re);
}

static moe_status pre_tokenizer(const char *path, const char *where, const cJSON *o, steps *v, moe_tokenizer *t) {
  const char *ty = type_of(o);
  moe__tok_step *st = NULL;
  if (!o || cJSON_IsNull(o)) return MOE_OK;
  if (ty && !strcmp(ty, "Sequence")) return sequence(path, where, o, "pretokenizers", v, t, pre_tokenizer);
  MOE_TRY(!v->n || v->s[v->n - 1].kind != STEP_BYTE_LEVEL, MOE_ERR_FORMAT,
          "%s: %s follows a ByteLevel pre-tokenizer: not supported (ByteLevel must come last)", path, where);
  if (ty && !strcmp(ty, "Split")) {
    MOE_TRY(st = push(v, STEP_SPLIT), MOE_ERR_NOMEM, "%s: out of memory", path);
    st->invert = flag(o, "invert", 0);
    MOE_CHECK(behavior(path, where, o, st));
    return pattern(path, where, o, st);
  }
  if (ty && !strcmp(ty, "Digits")) {
    MOE_TRY(st = push(v, STEP_SPLIT), MOE_ERR_NOMEM, "%s: out of memory", path);
    return split_with(path, where, flag(o, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+", st);
  }
  if (ty && !strcmp(ty, "Punctuation")) {
    MOE_TRY(st = push(v, STEP_SPLIT), MOE_ERR_NOMEM, "%s: out of memory", path);
    MOE_CHECK(behavior(path, where, o, st));
    return split_with(path, where, PUNCT_PATTERN, st);
  }
  if (ty && !strcmp(ty, "Metaspace")) {
    MOE_TRY(st = push(v, STEP_METASPACE), MOE_ERR_NOMEM, "%s: out of memory", path);
    st->b = flag(o, "split", 1);
    MOE_CHECK(prepend_scheme(path, where, o, st));
    return replacement(path, where, o, st);
  }
  if (ty && !strcmp(ty, "ByteLevel")) {
    if (flag(o, "add_prefix_space", 0)) MOE_TRY(push(v, STEP_PREFIX_SPACE), MOE_ERR_NOMEM, "%s: out of memory", path);
    if (flag(o, "use_regex", 1)) {
      MOE_TRY(st = push(v, STEP_SPLIT), MOE_ERR_NOMEM, "%s: out of memory", path);
      MOE_CHECK(split_with(path, where, GPT2_PATTERN, st));
      st->a = 1; /* marks GPT-2's split */
    }
    /* A marker that ByteLevel came (removed once the pipeline is read): nothing may follow it. */
    MOE_TRY(push(v, STEP_BYTE_LEVEL), MOE_ERR_NOMEM, "%s: out of memory", path);
    return MOE_OK;
  }
  return unsupported(path, where, o, "Sequence, Split, ByteLevel, Metaspace, Digits, Punctuation");
}

/* ---- decoders ---- */

static moe_status count(const char *path, const char *where, const cJSON *o, const char *key, int *dst) {
  const cJSON *x = get(o, key);
  MOE_TRY(!x || (cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= 1024 && x->valuedouble == (int)x->valuedouble),
          MOE_ERR_FORMAT, "%s: %s.%s is not a count in [0, 1024]", path, where, key);
  *dst = x ? (int)x->valuedouble : 0;
  return MOE_OK;
}

static moe_status decoder(const char *path, const char *where, const cJSON *o, steps *v, moe_tokenizer *t) {
  const char *ty = type_of(o);
  moe__tok_step *st = NULL;
  if (!o || cJSON_IsNull(o)) return MOE_OK;
  if (ty && !strcmp(ty, "Sequence")) return sequence(path, where, o, "decoders", v, t, decoder);
  static const char *SIMPLE[] = {"ByteLevel", "ByteFallback", "Fuse"};
  static const step_kind KINDS[] = {STEP_BYTE_LEVEL, STEP_BYTE_FALLBACK, STEP_FUSE};
  for (int i = 0; ty && i < 3; i++)
    if (!strcmp(ty, SIMPLE[i])) return push(v, KINDS[i]) ? MOE_OK : NOMEM(path);
  if (ty && !strcmp(ty, "Replace")) return replace(path, where, o, v);
  if (ty && !strcmp(ty, "Strip")) {
    MOE_TRY(st = push(v, STEP_STRIP), MOE_ERR_NOMEM, "%s: out of memory", path);
    MOE_CHECK(count(path, where, o, "start", &st->a));
    MOE_CHECK(count(path, where, o, "stop", &st->b));
    MOE_CHECK(text(path, where, o, "content", NULL, &st->text, &st->text_len));
    MOE_TRY(st->text_len > 0, MOE_ERR_FORMAT, "%s: %s.content is empty", path, where);
    return MOE_OK;
  }
  if (ty && !strcmp(ty, "Metaspace")) {
    MOE_TRY(st = push(v, STEP_META_DECODE), MOE_ERR_NOMEM, "%s: out of memory", path);
    MOE_CHECK(prepend_scheme(path, where, o, st));
    return replacement(path, where, o, st);
  }
  return unsupported(path, where, o, "Sequence, ByteLevel, ByteFallback, Metaspace, Fuse, Strip, Replace");
}

/* ---- post-processor: the ids it puts around the text (t->post, -1 for the text) ---- */

static moe_status add_post(const char *path, moe_tokenizer *t, int32_t id) {
  int32_t *p = realloc(t->post, (size_t)(t->n_post + 1) * sizeof *p);
  MOE_TRY(p, MOE_ERR_NOMEM, "%s: out of memory", path);
  t->post = p;
  p[t->n_post++] = id;
  return MOE_OK;
}

static moe_status post_id(const char *path, const char *where, moe_tokenizer *t, const cJSON *x) {
  MOE_TRY(cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < t->vocab && x->valuedouble == (int32_t)x->valuedouble,
          MOE_ERR_FORMAT, "%s: %s is not a token id (the vocabulary has %d)", path, where, t->vocab);
  return add_post(path, t, (int32_t)x->valuedouble);
}

static moe_status template_item(const char *path, const char *where, const cJSON *item, const cJSON *specials,
                                moe_tokenizer *t) {
  const cJSON *sp = get(item, "SpecialToken"), *seq = get(item, "Sequence");
  if (seq) {
    const cJSON *id = get(seq, "id");
    MOE_TRY(cJSON_IsString(id) && !strcmp(id->valuestring, "A"), MOE_ERR_FORMAT,
            "%s: %s.Sequence.id is not \"A\" (only single sequences are encoded)", path, where);
    return add_post(path, t, -1);
  }
  const cJSON *name = get(sp, "id");
  MOE_TRY(cJSON_IsString(name), MOE_ERR_FORMAT, "%s: %s is neither {\"SpecialToken\": {\"id\": ...}} nor "
          "{\"Sequence\": ...}", path, where);
  const cJSON *ids = get(get(specials, name->valuestring), "ids"), *x;
  MOE_TRY(cJSON_IsArray(ids), MOE_ERR_FORMAT, "%s: %s names \"%.80s\", which post_processor.special_tokens does not "
          "give ids", path, where, name->valuestring);
  int k = 0;
  cJSON_ArrayForEach(x, ids) {
    char w[300];
    snprintf(w, sizeof w, "post_processor.special_tokens[\"%.80s\"].ids[%d]", name->valuestring, k++);
    MOE_CHECK(post_id(path, w, t, x));
  }
  return MOE_OK;
}

static moe_status post_processor(const char *path, const char *where, const cJSON *o, steps *v, moe_tokenizer *t) {
  const char *ty = type_of(o);
  if (!o || cJSON_IsNull(o) || (ty && !strcmp(ty, "ByteLevel"))) return MOE_OK; /* ByteLevel: offsets only */
  if (ty && !strcmp(ty, "Sequence")) return sequence(path, where, o, "processors", v, t, post_processor);
  MOE_TRY(!t->n_post, MOE_ERR_FORMAT, "%s: %s: a second post-processor that adds tokens is not supported", path, where);
  if (ty && !strcmp(ty, "TemplateProcessing")) {
    const cJSON *single = get(o, "single"), *specials = get(o, "special_tokens"), *it;
    MOE_TRY(cJSON_IsArray(single), MOE_ERR_FORMAT, "%s: %s.single is missing or not an array", path, where);
    int i = 0;
    cJSON_ArrayForEach(it, single) {
      char w[300];
      snprintf(w, sizeof w, "%s.single[%d]", where, i++);
      MOE_CHECK(template_item(path, w, it, specials, t));
    }
    return MOE_OK;
  }
  if (ty && (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing"))) {
    char w[300];
    snprintf(w, sizeof w, "%s.cls[1]", where);
    MOE_CHECK(post_id(path, w, t, cJSON_GetArrayItem(get(o, "cls"), 1)));
    MOE_CHECK(add_post(path, t, -1));
    snprintf(w, sizeof w, "%s.sep[1]", where);
    return post_id(path, w, t, cJSON_GetArrayItem(get(o, "sep"), 1));
  }
  return unsupported(path, where, o, "Sequence, TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel");
}

/* ---- the whole ---- */

static int has_byte_level(const cJSON *o) {
  const char *ty = type_of(o);
  if (ty && !strcmp(ty, "ByteLevel")) return 1;
  const cJSON *it, *items = ty && !strcmp(ty, "Sequence") ? get(o, "pretokenizers") : NULL;
  cJSON_ArrayForEach(it, items) if (has_byte_level(it)) return 1;
  return 0;
}

int moe__tok_pipeline_byte_level(const cJSON *root) { return has_byte_level(get(root, "pre_tokenizer")); }

int moe__tok_pipeline_is_gpt2(const moe__tok_hf *hf) {
  return hf->byte_level && hf->gpt2_split && hf->n_pre == 1 && !hf->n_norm && hf->unk < 0 && !hf->byte_fallback;
}

static void free_steps(moe__tok_step *s, int n) {
  for (int i = 0; i < n; i++) {
    free(s[i].text);
    free(s[i].with);
    pcre2_code_free(s[i].re);
  }
  free(s);
}

void moe__tok_hf_free(moe__tok_hf *hf) {
  if (!hf) return;
  free_steps(hf->norm, hf->n_norm);
  free_steps(hf->pre, hf->n_pre);
  free_steps(hf->dec, hf->n_dec);
  free(hf);
}

/* Decoders a vocabulary runs: byte-level ones only ByteLevel (their tokens are bytes already), others
 * anything but ByteLevel. */
static moe_status check_decoders(const char *path, const moe__tok_hf *hf) {
  for (int i = 0; i < hf->n_dec; i++) {
    int bl = hf->dec[i].kind == STEP_BYTE_LEVEL;
    MOE_TRY(bl == hf->byte_level, MOE_ERR_FORMAT,
            hf->byte_level ? "%s: decoder: a decoder other than ByteLevel with a ByteLevel pre-tokenizer is not supported"
                           : "%s: decoder: ByteLevel without a ByteLevel pre-tokenizer is not supported", path);
  }
  return MOE_OK;
}

moe_status moe__tok_read_pipeline(const char *path, const cJSON *root, moe_tokenizer *t, int byte_level) {
  moe__tok_hf *hf = calloc(1, sizeof *hf);
  MOE_TRY(hf, MOE_ERR_NOMEM, "%s: out of memory", path);
  t->hf = hf;
  hf->byte_level = byte_level;
  hf->unk = -1;
  steps norm = {0}, pre = {0}, dec = {0}, none = {0};
  moe_status st = normalizer(path, "normalizer", get(root, "normalizer"), &norm, t);
  hf->norm = norm.s, hf->n_norm = norm.n;
  if (st == MOE_OK) st = pre_tokenizer(path, "pre_tokenizer", get(root, "pre_tokenizer"), &pre, t);
  /* The ByteLevel marker goes: the vocabulary being bytes already does its mapping. */
  if (pre.n && pre.s[pre.n - 1].kind == STEP_BYTE_LEVEL) pre.n--;
  hf->pre = pre.s, hf->n_pre = pre.n;
  hf->gpt2_split = pre.n == 1 && pre.s[0].a == 1;
  if (st == MOE_OK) st = decoder(path, "decoder", get(root, "decoder"), &dec, t);
  hf->dec = dec.s, hf->n_dec = dec.n;
  if (st == MOE_OK) st = post_processor(path, "post_processor", get(root, "post_processor"), &none, t);
  return st == MOE_OK ? check_decoders(path, hf) : st;
}
