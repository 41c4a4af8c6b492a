/* The tokenizer as a Hugging Face tokenizer.json. Saving writes libmoe's own: a BPE model with the
 * ByteLevel pre-tokenizer and decoder, the vocabulary (token strings in GPT-2's byte characters), the
 * merges as "left right" strings and the added tokens. Loading takes BPE files from libmoe or Hugging
 * Face: byte-level vocabularies (a ByteLevel pre-tokenizer: GPT-2, Llama 3, Qwen, DeepSeek-V3, gpt-oss)
 * held as bytes, others (Llama 2, Mistral: byte fallback) as strings; merges as strings or [left, right]
 * pairs; added tokens with their lstrip/rstrip/single_word; the normalizers, pre-tokenizers, decoders
 * and post-processor read by tokenizer_steps.c. It refuses, naming the field and value, what it would
 * encode differently: other models, BPE dropout, subword prefixes and suffixes. A directory stands for
 * its tokenizer.json, with its tokenizer_config.json's add_bos_token / add_eos_token when present. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "formats/json.h"
#include "lm/lm_gguf.h"
#include "lm/tokenizer_gguf.h"
#include "lm/tokenizer_hf.h"

#define BAD(st, ...) moe__error((st), __FILE__, __LINE__, __VA_ARGS__)
#define MAX_FILE_BYTES ((size_t)1 << 28)

/* ---- save ---- */

/* The token string of n bytes (GPT-2's characters, UTF-8) into out (room for 2 n + 1). */
static void token_string(const char *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) {
    int c = moe__tok_byte_char((unsigned char)b[i]);
    if (c < 0x80) {
      *out++ = (char)c;
    } else {
      *out++ = (char)(0xc0 | (c >> 6));
      *out++ = (char)(0x80 | (c & 0x3f));
    }
  }
  *out = 0;
}

/* The ByteLevel pre-tokenizer's or decoder's settings into o. */
static int byte_level(cJSON *o) {
  return o && cJSON_AddStringToObject(o, "type", "ByteLevel") && cJSON_AddFalseToObject(o, "add_prefix_space") &&
         cJSON_AddTrueToObject(o, "trim_offsets") && cJSON_AddTrueToObject(o, "use_regex");
}

/* Every vocabulary entry (byte-level tokens into vocab, added tokens into added) and every merge. */
static int add_tokens(const moe_tokenizer *t, cJSON *vocab, cJSON *added, cJSON *merges, char *s) {
  for (int32_t i = 0; i < t->vocab; i++) {
    if (!t->added[i]) {
      token_string(t->bytes[i], (size_t)t->len[i], s);
      if (!cJSON_AddNumberToObject(vocab, s, i)) return 0;
      continue;
    }
    cJSON *a = cJSON_CreateObject();
    if (!a || !cJSON_AddItemToArray(added, a)) return cJSON_Delete(a), 0;
    memcpy(s, t->bytes[i], (size_t)t->len[i]);
    s[t->len[i]] = 0;
    if (!cJSON_AddNumberToObject(a, "id", i) || !cJSON_AddStringToObject(a, "content", s) ||
        !cJSON_AddFalseToObject(a, "single_word") || !cJSON_AddFalseToObject(a, "lstrip") ||
        !cJSON_AddFalseToObject(a, "rstrip") || !cJSON_AddFalseToObject(a, "normalized") ||
        !cJSON_AddBoolToObject(a, "special", t->special[i]))
      return 0;
  }
  for (int32_t m = 0; m < t->n_merges; m++) {
    const int32_t *g = t->merges[m];
    token_string(t->bytes[g[0]], (size_t)t->len[g[0]], s);
    size_t l = strlen(s);
    s[l] = ' ';
    token_string(t->bytes[g[1]], (size_t)t->len[g[1]], s + l + 1);
    cJSON *str = cJSON_CreateString(s);
    if (!str || !cJSON_AddItemToArray(merges, str)) return cJSON_Delete(str), 0;
  }
  return 1;
}

/* The JSON text of the tokenizer; NULL when out of memory. Every part hangs from root as soon as it is
 * made, so that one cJSON_Delete frees all. */
static char *to_json(const moe_tokenizer *t) {
  size_t maxlen = 0;
  for (int32_t i = 0; i < t->vocab; i++) maxlen = (size_t)t->len[i] > maxlen ? (size_t)t->len[i] : maxlen;
  char *s = malloc(4 * maxlen + 2), *text = NULL; /* two token strings and a space */
  cJSON *root = cJSON_CreateObject();
  int ok = s && root && cJSON_AddStringToObject(root, "version", "1.0") && cJSON_AddNullToObject(root, "truncation") &&
           cJSON_AddNullToObject(root, "padding");
  cJSON *added = ok ? cJSON_AddArrayToObject(root, "added_tokens") : NULL;
  ok = added && cJSON_AddNullToObject(root, "normalizer") &&
       byte_level(cJSON_AddObjectToObject(root, "pre_tokenizer")) && cJSON_AddNullToObject(root, "post_processor") &&
       byte_level(cJSON_AddObjectToObject(root, "decoder"));
  cJSON *model = ok ? cJSON_AddObjectToObject(root, "model") : NULL;
  ok = model && cJSON_AddStringToObject(model, "type", "BPE") && cJSON_AddNullToObject(model, "dropout") &&
       cJSON_AddNullToObject(model, "unk_token") && cJSON_AddNullToObject(model, "continuing_subword_prefix") &&
       cJSON_AddNullToObject(model, "end_of_word_suffix") && cJSON_AddFalseToObject(model, "fuse_unk") &&
       cJSON_AddFalseToObject(model, "byte_fallback") && cJSON_AddBoolToObject(model, "ignore_merges", t->ignore_merges);
  cJSON *vocab = ok ? cJSON_AddObjectToObject(model, "vocab") : NULL;
  cJSON *merges = vocab ? cJSON_AddArrayToObject(model, "merges") : NULL;
  if (merges && add_tokens(t, vocab, added, merges, s)) text = cJSON_Print(root);
  cJSON_Delete(root);
  free(s);
  return text;
}

moe_status moe_tokenizer_save(const moe_tokenizer *t, const char *path) {
  MOE_TRY(t && path, MOE_ERR_ARG, "moe_tokenizer_save: NULL argument");
  MOE_TRY(moe__tok_round_trips(t) && !t->n_post, MOE_ERR_ARG, "%s: moe_tokenizer_save writes byte-level BPE tokenizers "
          "without normalizers, post-processors or added-token options; this one was read with them", path);
  char *text = to_json(t);
  MOE_TRY(text, MOE_ERR_NOMEM, "%s: out of memory writing the tokenizer", path);
  size_t n = strlen(text);
  text[n] = '\n'; /* cJSON_Print leaves no final newline; its NUL becomes one */
  moe_status st = moe_write_file_atomic(path, text, n + 1);
  free(text);
  return st;
}
/* ---- load ---- */

/* The bytes a token string stands for (GPT-2's characters, UTF-8 of code points below 0x800) into out
 * (room for strlen(s)); their count, or -1 when a character is not one of the 256. */
long moe__tok_string_bytes(const char *s, char *out) {
  const unsigned char *p = (const unsigned char *)s;
  long n = 0;
  while (*p) {
    uint32_t c = *p++;
    if (c >= 0xc0 && c < 0xe0 && (*p & 0xc0) == 0x80) c = ((c & 0x1f) << 6) | (*p++ & 0x3f);
    else if (c >= 0x80) return -1;
    int b = moe__tok_char_byte(c);
    if (b < 0) return -1;
    out[n++] = (char)b;
  }
  return n;
}

/* A short rendering of a JSON value for messages. */
static const char *show(const cJSON *x, char *buf, int n) {
  if (!x) return "absent";
  const cJSON *type = cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, "type") : NULL;
  if (cJSON_IsString(type)) snprintf(buf, (size_t)n, "of type \"%.60s\"", type->valuestring);
  else if (!cJSON_PrintPreallocated((cJSON *)x, buf, n, 0)) snprintf(buf, (size_t)n, "a long %s", cJSON_IsArray(x) ? "array" : "value");
  return buf;
}

/* Settings we take only at their default (absent and null count as the default too), and why. */
typedef struct {
  const char *part, *field, *want; /* want: "false", "true", "0" or "" (an empty string) */
  const char *why;
} setting;

static const setting SETTINGS[] = {
    {"model", "dropout", "0", "BPE dropout is not supported"},
    {"model", "continuing_subword_prefix", "", "subword prefixes are not supported"},
    {"model", "end_of_word_suffix", "", "end-of-word suffixes are not supported"},
};

static int is_default(const cJSON *x, const char *want) {
  if (!x || cJSON_IsNull(x)) return 1;
  if (!strcmp(want, "false")) return cJSON_IsFalse(x);
  if (!strcmp(want, "true")) return cJSON_IsTrue(x);
  if (!strcmp(want, "0")) return cJSON_IsNumber(x) && x->valuedouble == 0;
  return cJSON_IsString(x) && !*x->valuestring;
}

static moe_status check_settings(const char *path, const cJSON *model) {
  char v[128];
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
  MOE_TRY(!type || (cJSON_IsString(type) && !strcmp(type->valuestring, "BPE")), MOE_ERR_FORMAT,
          "%s: model.type is %s: only \"BPE\" models are supported", path, show(type, v, sizeof v));
  for (size_t i = 0; i < sizeof SETTINGS / sizeof *SETTINGS; i++) {
    const setting *s = &SETTINGS[i];
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, s->field);
    MOE_TRY(is_default(x, s->want), MOE_ERR_FORMAT, "%s: %s.%s is %s: %s", path, s->part, s->field,
            show(x, v, sizeof v), s->why);
  }
  static const char *FLAGS[] = {"ignore_merges", "byte_fallback", "fuse_unk"};
  for (int i = 0; i < 3; i++) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, FLAGS[i]);
    MOE_TRY(!x || cJSON_IsNull(x) || cJSON_IsBool(x), MOE_ERR_FORMAT, "%s: model.%s is %s, not a boolean", path,
            FLAGS[i], show(x, v, sizeof v));
  }
  return MOE_OK;
}

/* The vocabulary's ids: names[id] (the token string), added[id] (1 for added tokens, 2 when also
 * special), strip[id] (an added token's MOE__TOK_* options), over ids 0 .. *vocab - 1 without a gap. */
typedef struct {
  int32_t vocab;
  const char **names;
  uint8_t *added, *strip, *in_vocab; /* in_vocab: an added token that model.vocab has too */
} numbering;

/* An id in [0, 2^28) from x, or -1. */
static int32_t token_id(const cJSON *x) {
  return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < (1 << 28) && x->valuedouble == floor(x->valuedouble)
             ? (int32_t)x->valuedouble : -1;
}

static moe_status number_ids(const char *path, const cJSON *vocab, const cJSON *added, numbering *nb) {
  char v[128];
  const cJSON *it;
  int32_t n = 0;
  cJSON_ArrayForEach(it, vocab) {
    int32_t id = token_id(it);
    MOE_TRY(id >= 0, MOE_ERR_FORMAT, "%s: model.vocab[\"%.80s\"] is %s, not a token id", path, it->string, show(it, v, sizeof v));
    n = id + 1 > n ? id + 1 : n;
  }
  int k = 0;
  cJSON_ArrayForEach(it, added) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
    int32_t id = token_id(cJSON_GetObjectItemCaseSensitive(it, "id"));
    MOE_TRY(id >= 0 && cJSON_IsString(c) && *c->valuestring, MOE_ERR_FORMAT,
            "%s: added_tokens[%d] is %s: not an object with an \"id\" and a non-empty \"content\"", path, k,
            show(it, v, sizeof v));
    n = id + 1 > n ? id + 1 : n;
    k++;
  }
  nb->vocab = n;
  nb->names = calloc(n ? (size_t)n : 1, sizeof *nb->names);
  nb->added = calloc(n ? (size_t)n : 1, 1);
  nb->strip = calloc(n ? (size_t)n : 1, 1);
  nb->in_vocab = calloc(n ? (size_t)n : 1, 1);
  MOE_TRY(nb->names && nb->added && nb->strip && nb->in_vocab, MOE_ERR_NOMEM, "%s: out of memory (vocabulary of %d)", path, n);
  cJSON_ArrayForEach(it, vocab) {
    int32_t id = token_id(it);
    MOE_TRY(!nb->names[id], MOE_ERR_FORMAT, "%s: model.vocab gives id %d to both \"%.80s\" and \"%.80s\"", path, id,
            nb->names[id], it->string);
    nb->names[id] = it->string;
  }
  k = 0;
  cJSON_ArrayForEach(it, added) {
    const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
    int32_t id = token_id(cJSON_GetObjectItemCaseSensitive(it, "id"));
    MOE_TRY(!nb->added[id] && (!nb->names[id] || !strcmp(nb->names[id], c)), MOE_ERR_FORMAT,
            "%s: added_tokens[%d] (\"%.80s\") has id %d, which is already \"%.80s\"", path, k, c, id, nb->names[id]);
    nb->in_vocab[id] = nb->names[id] != NULL;
    nb->names[id] = c;
    nb->added[id] = 1 + cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
    nb->strip[id] = (uint8_t)(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "lstrip")) * MOE__TOK_LSTRIP |
                              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "rstrip")) * MOE__TOK_RSTRIP |
                              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "single_word")) * MOE__TOK_SINGLE_WORD);
    k++;
  }
  for (int32_t id = 0; id < n; id++)
    MOE_TRY(nb->names[id], MOE_ERR_FORMAT, "%s: no token has id %d (model.vocab and added_tokens must number 0 .. %d)",
            path, id, n - 1);
  MOE_TRY(n > 0, MOE_ERR_FORMAT, "%s: model.vocab is empty", path);
  return MOE_OK;
}

/* Every id's bytes into t (t->vocab ids): a byte-level vocabulary's tokens as the bytes they stand
 * for, others' as their strings. */
static moe_status fill_vocab(const char *path, moe_tokenizer *t, const numbering *nb, int byte_level) {
  char *buf = NULL;
  for (int32_t id = 0; id < t->vocab; id++) {
    const char *s = nb->names[id];
    size_t len = strlen(s);
    char *b = realloc(buf, len + 1);
    if (!b) free(buf); /* realloc keeps the old block when it fails */
    MOE_TRY(b, MOE_ERR_NOMEM, "%s: out of memory", path);
    buf = b;
    long n = nb->added[id] || !byte_level ? (long)len : moe__tok_string_bytes(s, buf);
    if (nb->added[id] || !byte_level) memcpy(buf, s, len);
    t->strip[id] = nb->strip[id];
    const int64_t *dup = n > 0 && !nb->added[id] ? moe__tok_map_get(&t->by_bytes, buf, (size_t)n) : NULL;
    moe_status st =
        n <= 0 && (byte_level || !nb->added[id]) ? moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                            "%s: model.vocab: token \"%.80s\" (id %d) is not made of ByteLevel's 256 byte characters "
                            "(only byte-level BPE vocabularies are supported)", path, s, id)
        : dup ? moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: model.vocab: token \"%.80s\" appears twice (ids %d and %d)",
                           path, s, (int)*dup, id)
        : !moe__tok_set(t, id, buf, (size_t)n, nb->added[id] != 0, nb->added[id] == 2)
            ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path)
            : MOE_OK;
    /* An added token in model.vocab too is also the model's (BPE can make it). */
    long nv = st == MOE_OK && nb->in_vocab[id] ? (byte_level ? moe__tok_string_bytes(s, buf) : (long)len) : 0;
    int isnew;
    if (nv > 0 && !moe__tok_map_put(&t->by_bytes, buf, (size_t)nv, id, &isnew))
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
    if (st != MOE_OK) {
      free(buf);
      return st;
    }
  }
  free(buf);
  for (int b = 0; b < 256 && byte_level; b++) {
    char s[3];
    token_string((char[1]){(char)b}, 1, s);
    MOE_TRY(t->byte_id[b] >= 0, MOE_ERR_FORMAT, "%s: model.vocab has no token for the byte 0x%02x (\"%s\")", path, b, s);
  }
  return MOE_OK;
}

/* The id of a token string (of a byte-level vocabulary when byte_level), or -1. */
static int32_t lookup(const moe_tokenizer *t, const char *s, char *buf, long *n, int byte_level) {
  *n = byte_level ? moe__tok_string_bytes(s, buf) : (long)strlen(s);
  if (!byte_level) memcpy(buf, s, (size_t)*n);
  const int64_t *v = *n > 0 ? moe__tok_map_get(&t->by_bytes, buf, (size_t)*n) : NULL;
  return v ? (int32_t)*v : -1;
}

/* Merge k, given as "left right" or as [left, right], into t. */
static moe_status read_merge(const char *path, moe_tokenizer *t, const cJSON *m, int k, int byte_level) {
  char v[128];
  const cJSON *l = cJSON_GetArrayItem(m, 0), *r = cJSON_GetArrayItem(m, 1);
  int pair = cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(l) && cJSON_IsString(r);
  const char *sp = cJSON_IsString(m) ? strchr(m->valuestring, ' ') : NULL;
  MOE_TRY(pair || (sp && !strchr(sp + 1, ' ')), MOE_ERR_FORMAT,
          "%s: model.merges[%d] is %s: neither \"left right\" nor [\"left\", \"right\"]", path, k, show(m, v, sizeof v));
  char *split = pair ? NULL : strdup(m->valuestring);
  const char *left = pair ? l->valuestring : split, *right = pair ? r->valuestring : split ? split + (sp - m->valuestring) + 1 : NULL;
  char *buf = left && right ? malloc(strlen(left) + strlen(right) + 1) : NULL;
  moe_status st = MOE_OK;
  if (!buf) {
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  } else {
    if (split) split[sp - m->valuestring] = 0;
    long na, nb;
    int32_t a = lookup(t, left, buf, &na, byte_level), b = lookup(t, right, buf + (na > 0 ? na : 0), &nb, byte_level);
    const int64_t *c = a >= 0 && b >= 0 ? moe__tok_map_get(&t->by_bytes, buf, (size_t)(na + nb)) : NULL;
    if (a < 0 || b < 0)
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: model.merges[%d]: \"%.80s\" is not in model.vocab", path,
                      k, a < 0 ? left : right);
    else if (!c)
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                      "%s: model.merges[%d]: the merge of \"%.80s\" and \"%.80s\" is not in model.vocab", path, k, left, right);
    else if (!moe__tok_add_merge(t, a, b, (int32_t)*c))
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  }
  free(split);
  free(buf);
  return st;
}

/* The model's byte fallback, unknown token and fuse_unk into the pipeline. */
static moe_status model_options(const char *path, const cJSON *model, const numbering *nb, moe_tokenizer *t) {
  moe__tok_hf *hf = t->hf;
  hf->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
  hf->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
  memset(hf->byte_tok, 0xff, sizeof hf->byte_tok);
  for (int b = 0; b < 256 && !hf->byte_level; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    const int64_t *id = moe__tok_map_get(&t->by_bytes, name, 6);
    if (id) hf->byte_tok[b] = (int32_t)*id;
  }
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
  if (!unk || cJSON_IsNull(unk)) return MOE_OK;
  MOE_TRY(cJSON_IsString(unk), MOE_ERR_FORMAT, "%s: model.unk_token is not a string", path);
  for (int32_t id = 0; id < nb->vocab && hf->unk < 0; id++)
    if (!strcmp(nb->names[id], unk->valuestring)) hf->unk = id;
  MOE_TRY(hf->unk >= 0, MOE_ERR_FORMAT, "%s: model.unk_token \"%.80s\" is not in model.vocab", path, unk->valuestring);
  return MOE_OK;
}

moe_status moe__tok_from_json(const char *path, const cJSON *root, moe_tokenizer **out) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  MOE_TRY(cJSON_IsObject(model), MOE_ERR_MISSING, "%s: no \"model\" object (not a tokenizer.json?)", path);
  MOE_CHECK(check_settings(path, model));
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  MOE_TRY(cJSON_IsObject(vocab), MOE_ERR_MISSING, "%s: model.vocab is missing or not an object", path);
  MOE_TRY(cJSON_IsArray(merges), MOE_ERR_MISSING, "%s: model.merges is missing or not an array", path);
  MOE_TRY(!added || cJSON_IsNull(added) || cJSON_IsArray(added), MOE_ERR_FORMAT, "%s: added_tokens is not an array", path);
  int byte_level = moe__tok_pipeline_byte_level(root);
  numbering nb = {0};
  moe_tokenizer *t = NULL;
  moe_status st = number_ids(path, vocab, added, &nb);
  if (st == MOE_OK && !(t = moe__tok_alloc(nb.vocab)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory (vocabulary of %d)", path, nb.vocab);
  if (st == MOE_OK) {
    memset(t->byte_id, 0xff, sizeof t->byte_id);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    st = fill_vocab(path, t, &nb, byte_level);
  }
  const cJSON *m;
  int k = 0;
  cJSON_ArrayForEach(m, merges) {
    if (st != MOE_OK) break;
    st = read_merge(path, t, m, k++, byte_level);
  }
  if (st == MOE_OK) st = moe__tok_read_pipeline(path, root, t, byte_level);
  if (st == MOE_OK) st = model_options(path, model, &nb, t);
  if (st == MOE_OK && moe__tok_pipeline_is_gpt2(t->hf)) { /* GPT-2's byte-level BPE alone: the plain path */
    moe__tok_hf_free(t->hf);
    t->hf = NULL;
  }
  free(nb.names);
  free(nb.added);
  free(nb.strip);
  free(nb.in_vocab);
  if (st != MOE_OK) {
    moe_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MOE_OK;
}

static moe_status load_file(moe_tokenizer **out, const char *path) {
  cJSON *root;
  MOE_CHECK(moe__json_read(path, "tokenizer", MAX_FILE_BYTES, &root));
  moe_status st = cJSON_IsObject(root) ? moe__tok_from_json(path, root, out)
                                       : moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: not a JSON object", path);
  cJSON_Delete(root);
  return st;
}

/* A token named by tokenizer_config.json (a string, or an object with its "content"), or -1 for none. */
static moe_status config_token(const char *path, const cJSON *cfg, const char *key, const moe_tokenizer *t, int32_t *id) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
  *id = -1;
  if (!x || cJSON_IsNull(x)) return MOE_OK;
  MOE_TRY(cJSON_IsString(x), MOE_ERR_FORMAT, "%s: %s is not a string or an object with a \"content\"", path, key);
  *id = moe_tokenizer_token_id(t, x->valuestring);
  MOE_TRY(*id >= 0, MOE_ERR_FORMAT, "%s: %s \"%.80s\" is not a token of the tokenizer", path, key, x->valuestring);
  return MOE_OK;
}

/* tokenizer_config.json's add_bos_token / add_eos_token, when either is given, replace the
 * post-processor by [bos_token] text [eos_token] as transformers' Llama tokenizers do. */
static moe_status apply_config(const char *path, moe_tokenizer *t) {
  cJSON *cfg;
  MOE_CHECK(moe__json_read(path, "tokenizer config", MAX_FILE_BYTES, &cfg));
  const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
  const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
  int32_t bos = -1, eos = -1;
  moe_status st = MOE_OK;
  if (cJSON_IsBool(ab) || cJSON_IsBool(ae)) {
    if (cJSON_IsTrue(ab)) st = config_token(path, cfg, "bos_token", t, &bos);
    if (st == MOE_OK && cJSON_IsTrue(ae)) st = config_token(path, cfg, "eos_token", t, &eos);
    int32_t *p = st == MOE_OK ? realloc(t->post, 3 * sizeof *p) : NULL;
    if (st == MOE_OK && !p) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
    if (p) {
      t->post = p;
      t->n_post = 0;
      if (bos >= 0) p[t->n_post++] = bos;
      p[t->n_post++] = -1;
      if (eos >= 0) p[t->n_post++] = eos;
    }
  }
  cJSON_Delete(cfg);
  return st;
}

moe_status moe_tokenizer_load(moe_tokenizer **out, const char *path) {
  MOE_TRY(out && path, MOE_ERR_ARG, "moe_tokenizer_load: NULL argument");
  *out = NULL;
  if (moe__lm_gguf_is(path)) return moe__tok_gguf_load(out, path);
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return load_file(out, path);
  size_t n = strlen(path) + 32;
  char *file = malloc(n);
  MOE_TRY(file, MOE_ERR_NOMEM, "%s: out of memory", path);
  snprintf(file, n, "%s/tokenizer.json", path);
  moe_status st = load_file(out, file);
  snprintf(file, n, "%s/tokenizer_config.json", path);
  if (st == MOE_OK && stat(file, &sb) == 0) st = apply_config(file, *out);
  if (st != MOE_OK) {
    moe_tokenizer_free(*out);
    *out = NULL;
  }
  free(file);
  return st;
}
