/* A tokenizer from GGUF metadata (tokenizer_gguf.h): the tokenizer.json a Hugging Face model of the same
 * vocabulary has, built in memory and read by tokenizer_json.c.
 *   "gpt2": byte-level BPE; tokens (byte-level strings), token types (control tokens and user-defined
 *     ones are added tokens, special or not), merges ("left right"), the pre-tokenizer by its
 *     tokenizer.ggml.pre name (tokenizer_gguf_pre.c), ByteLevel's decoder.
 *   "llama": SentencePiece BPE as Llama 2's tokenizer.json has it: " " replaced by "▁" (and "▁"
 *     prepended unless tokenizer.ggml.add_space_prefix is false), byte fallback to <0xNN>, unknown
 *     tokens fused; the merges are those transformers derives from the SentencePiece scores (every
 *     split of a token into two tokens, by the token's score, highest first, then by the ids).
 * The BOS and EOS ids are added by MOE_TOKENIZER_ADD_SPECIAL as tokenizer.ggml.add_bos_token /
 * add_eos_token say (default: BOS for "llama" only, as llama.cpp). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm/tokenizer.h"
#include "lm/tokenizer_gguf.h"

#define MAX_TOKENS (1 << 28)

typedef struct {
  const moe_gguf *g;
  const char *path;
  int32_t n;
  const char **tok;
  int64_t *type;
  float *score;
  int spm; /* "llama" */
} vocab;

static void vocab_free(vocab *v) {
  free(v->tok);
  free(v->type);
  free(v->score);
}

static moe_status read_vocab(vocab *v) {
  moe_gguf_vtype et;
  uint64_t n;
  MOE_CHECK(moe_gguf_get_arr(v->g, "tokenizer.ggml.tokens", &et, &n));
  MOE_TRY(et == MOE_GGUFV_STRING && n > 0 && n < MAX_TOKENS, MOE_ERR_FORMAT,
          "%s: tokenizer.ggml.tokens is an array of %llu %s, want 1 to %d strings", v->path, (unsigned long long)n,
          moe_gguf_vtype_name(et), MAX_TOKENS - 1);
  v->n = (int32_t)n;
  v->tok = calloc(n, sizeof *v->tok);
  v->type = malloc(n * sizeof *v->type);
  v->score = calloc(n, sizeof *v->score);
  MOE_TRY(v->tok && v->type && v->score, MOE_ERR_NOMEM, "%s: out of memory (%llu tokens)", v->path, (unsigned long long)n);
  for (uint64_t i = 0; i < n; i++) {
    size_t len;
    MOE_CHECK(moe_gguf_get_arr_str(v->g, "tokenizer.ggml.tokens", i, &v->tok[i], &len));
    MOE_TRY(len == strlen(v->tok[i]) && len > 0, MOE_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu] is empty or holds a "
            "NUL byte", v->path, (unsigned long long)i);
    v->type[i] = MOE__TOK_NORMAL;
  }
  static const char *const arrays[2] = {"tokenizer.ggml.token_type", "tokenizer.ggml.scores"};
  for (int k = 0; k < 2; k++) {
    if (moe_gguf_find_key(v->g, arrays[k]) < 0) {
      MOE_TRY(k == 0 || !v->spm, MOE_ERR_MISSING, "%s: no %s (a \"llama\" tokenizer merges by them)", v->path,
              arrays[k]);
      continue;
    }
    MOE_CHECK(moe_gguf_get_arr(v->g, arrays[k], &et, &n));
    MOE_TRY(n == (uint64_t)v->n, MOE_ERR_FORMAT, "%s: %s has %llu entries, tokenizer.ggml.tokens %d", v->path,
            arrays[k], (unsigned long long)n, v->n);
    MOE_CHECK(k == 0 ? moe_gguf_get_arr_int(v->g, arrays[k], v->type, n)
                     : moe_gguf_get_arr_f32(v->g, arrays[k], v->score, n));
  }
  for (int32_t i = 0; i < v->n; i++)
    MOE_TRY(v->type[i] >= MOE__TOK_NORMAL && v->type[i] <= MOE__TOK_BYTE, MOE_ERR_FORMAT,
            "%s: tokenizer.ggml.token_type[%d] is %lld, want 1 to 6", v->path, i, (long long)v->type[i]);
  return MOE_OK;
}

/* Whether token i is an added token of tokenizer.json (a whole string matched in the text), and
 * whether it is in model.vocab. */
static int is_added(const vocab *v, int32_t i) {
  return v->type[i] == MOE__TOK_CONTROL || v->type[i] == MOE__TOK_UNKNOWN || v->type[i] == MOE__TOK_USER_DEFINED;
}
static int in_model(const vocab *v, int32_t i) {
  return !is_added(v, i) || (v->spm && v->type[i] != MOE__TOK_USER_DEFINED); /* Llama 2 has <unk>, <s> in both */
}

static int add_ids(const vocab *v, cJSON *model_vocab, cJSON *added) {
  for (int32_t i = 0; i < v->n; i++) {
    if (in_model(v, i) && !cJSON_AddNumberToObject(model_vocab, v->tok[i], i)) return 0;
    if (!is_added(v, i)) continue;
    cJSON *a = cJSON_CreateObject();
    int special = v->type[i] != MOE__TOK_USER_DEFINED;
    if (!a || !cJSON_AddItemToArray(added, a)) return cJSON_Delete(a), 0;
    if (!cJSON_AddNumberToObject(a, "id", i) || !cJSON_AddStringToObject(a, "content", v->tok[i]) ||
        !cJSON_AddFalseToObject(a, "single_word") || !cJSON_AddFalseToObject(a, "lstrip") ||
        !cJSON_AddFalseToObject(a, "rstrip") || !cJSON_AddBoolToObject(a, "normalized", !special) ||
        !cJSON_AddBoolToObject(a, "special", special))
      return 0;
  }
  return 1;
}

static moe_status gpt2_merges(const vocab *v, cJSON *merges) {
  moe_gguf_vtype et;
  uint64_t n;
  if (moe_gguf_find_key(v->g, "tokenizer.ggml.merges") < 0) return MOE_OK; /* gguf-py leaves an empty list out */
  MOE_CHECK(moe_gguf_get_arr(v->g, "tokenizer.ggml.merges", &et, &n));
  MOE_TRY(et == MOE_GGUFV_STRING, MOE_ERR_FORMAT, "%s: tokenizer.ggml.merges is an array of %s, want strings", v->path,
          moe_gguf_vtype_name(et));
  for (uint64_t i = 0; i < n; i++) {
    const char *s;
    MOE_CHECK(moe_gguf_get_arr_str(v->g, "tokenizer.ggml.merges", i, &s, NULL));
    cJSON *m = cJSON_CreateString(s);
    MOE_TRY(m && cJSON_AddItemToArray(merges, m), MOE_ERR_NOMEM, "%s: out of memory", v->path);
  }
  return MOE_OK;
}

typedef struct {
  float score;
  int32_t merged, left, right;
} candidate;

static int by_rank(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->merged != y->merged) return x->merged < y->merged ? -1 : 1;
  if (x->left != y->left) return x->left < y->left ? -1 : 1;
  return (x->right > y->right) - (x->right < y->right);
}

/* Every split of a normal token into two vocabulary tokens, ranked by the token's score. */
static moe_status spm_merges(const vocab *v, cJSON *merges) {
  moe__tok_map ids = {0};
  candidate *c = NULL;
  size_t n = 0, cap = 0;
  moe_status st = MOE_OK;
  int isnew;
  for (int32_t i = 0; i < v->n && st == MOE_OK; i++)
    if (in_model(v, i) && !moe__tok_map_put(&ids, v->tok[i], strlen(v->tok[i]), i, &isnew))
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", v->path);
  for (int32_t i = 0; i < v->n && st == MOE_OK; i++) {
    const char *s = v->tok[i];
    size_t len = strlen(s);
    if (v->type[i] != MOE__TOK_NORMAL) continue;
    for (size_t b = 1; b < len && st == MOE_OK; b++) {
      if (((unsigned char)s[b] & 0xc0) == 0x80) continue; /* inside a UTF-8 character */
      const int64_t *l = moe__tok_map_get(&ids, s, b), *r = moe__tok_map_get(&ids, s + b, len - b);
      if (!l || !r) continue;
      if (n == cap) {
        candidate *g = realloc(c, (cap = cap ? 2 * cap : 4096) * sizeof *c);
        if (!g) {
          st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", v->path);
          break;
        }
        c = g;
      }
      c[n++] = (candidate){v->score[i], i, (int32_t)*l, (int32_t)*r};
    }
  }
  if (st == MOE_OK && n) qsort(c, n, sizeof *c, by_rank);
  for (size_t k = 0; k < n && st == MOE_OK; k++) {
    cJSON *pair = cJSON_CreateArray(), *l = cJSON_CreateString(v->tok[c[k].left]), *r = cJSON_CreateString(v->tok[c[k].right]);
    int ok = pair && l && r && cJSON_AddItemToArray(pair, l) && (l = NULL, cJSON_AddItemToArray(pair, r)) &&
             (r = NULL, cJSON_AddItemToArray(merges, pair));
    if (!ok) {
      cJSON_Delete(pair), cJSON_Delete(l), cJSON_Delete(r);
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", v->path);
    }
  }
  free(c);
  moe__tok_map_free(&ids);
  return st;
}

/* An optional bool key, else def. */
static moe_status get_flag(const moe_gguf *g, const char *key, int def, int *out) {
  *out = def;
  return moe_gguf_find_key(g, key) < 0 ? MOE_OK : moe_gguf_get_bool(g, key, out);
}

/* An optional token id key in [0, n), else -1. */
static moe_status get_id(const vocab *v, const char *key, int32_t *out) {
  *out = -1;
  if (moe_gguf_find_key(v->g, key) < 0) return MOE_OK;
  uint32_t id;
  MOE_CHECK(moe_gguf_get_u32(v->g, key, &id));
  MOE_TRY(id < (uint32_t)v->n, MOE_ERR_FORMAT, "%s: %s is %u, beyond the %d tokens", v->path, key, id, v->n);
  *out = (int32_t)id;
  return MOE_OK;
}

static const char SPM_NORMALIZER[] = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\u2581\"},"
                                     "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\u2581\"}]}";
static const char SPM_DECODER[] = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
                                  "\"\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
                                  "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}";
static const char GPT2_DECODER[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
                                   "\"use_regex\":false}";

/* Adds item under key of o (deleting it when that fails); 0 when out of memory. */
static int put(cJSON *o, const char *key, cJSON *item) {
  if (item && cJSON_AddItemToObject(o, key, item)) return 1;
  cJSON_Delete(item);
  return 0;
}

/* A Sequence of SPM_NORMALIZER or SPM_DECODER; without a space prefix the normalizer only replaces
 * spaces (its Prepend, entry 0, out) and the decoder strips nothing (its Strip, entry 3, out). */
static cJSON *spm_part(const char *json, const char *list, int drop, int prefix) {
  cJSON *x = cJSON_Parse(json);
  if (x && !prefix) cJSON_DeleteItemFromArray(cJSON_GetObjectItemCaseSensitive(x, list), drop);
  return x;
}

static moe_status build_json(const vocab *v, cJSON *root) {
  cJSON *model = cJSON_CreateObject(), *mv = cJSON_CreateObject(), *merges = cJSON_CreateArray(),
        *added = cJSON_CreateArray();
  int ok = put(root, "model", model) && put(model, "vocab", mv) && put(model, "merges", merges) &&
           put(root, "added_tokens", added) && cJSON_AddStringToObject(model, "type", "BPE");
  if (!ok) {
    if (!cJSON_GetObjectItemCaseSensitive(root, "model")) cJSON_Delete(mv), cJSON_Delete(merges), cJSON_Delete(added);
    else if (!cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) cJSON_Delete(added);
  }
  MOE_TRY(ok && add_ids(v, mv, added), MOE_ERR_NOMEM, "%s: out of memory", v->path);
  if (!v->spm) {
    const char *pre;
    MOE_CHECK(moe_gguf_get_str(v->g, "tokenizer.ggml.pre", &pre));
    cJSON *p, *norm;
    int ignore;
    MOE_CHECK(moe__tok_gguf_pre(v->path, pre, &p, &norm, &ignore));
    ok = put(root, "pre_tokenizer", p) && (!norm || put(root, "normalizer", norm)) &&
         put(root, "decoder", cJSON_Parse(GPT2_DECODER)) && cJSON_AddBoolToObject(model, "ignore_merges", ignore);
    if (!ok && !cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) cJSON_Delete(norm);
    MOE_TRY(ok, MOE_ERR_NOMEM, "%s: out of memory", v->path);
    return gpt2_merges(v, merges);
  }
  int prefix;
  int32_t unk;
  MOE_CHECK(get_flag(v->g, "tokenizer.ggml.add_space_prefix", 1, &prefix));
  MOE_CHECK(get_id(v, "tokenizer.ggml.unknown_token_id", &unk));
  ok = put(root, "normalizer", spm_part(SPM_NORMALIZER, "normalizers", 0, prefix)) &&
       put(root, "decoder", spm_part(SPM_DECODER, "decoders", 3, prefix)) &&
       cJSON_AddTrueToObject(model, "byte_fallback") && cJSON_AddTrueToObject(model, "fuse_unk") &&
       (unk < 0 || cJSON_AddStringToObject(model, "unk_token", v->tok[unk]));
  MOE_TRY(ok, MOE_ERR_NOMEM, "%s: out of memory", v->path);
  return spm_merges(v, merges);
}

/* ADD_SPECIAL's ids: [BOS] text [EOS] as add_bos_token / add_eos_token say. */
static moe_status set_post(const vocab *v, moe_tokenizer *t) {
  int add_bos, add_eos;
  int32_t bos, eos;
  MOE_CHECK(get_flag(v->g, "tokenizer.ggml.add_bos_token", v->spm, &add_bos));
  MOE_CHECK(get_flag(v->g, "tokenizer.ggml.add_eos_token", 0, &add_eos));
  MOE_CHECK(get_id(v, "tokenizer.ggml.bos_token_id", &bos));
  MOE_CHECK(get_id(v, "tokenizer.ggml.eos_token_id", &eos));
  MOE_TRY(!add_bos || bos >= 0, MOE_ERR_MISSING, "%s: tokenizer.ggml.add_bos_token is true but there is no "
          "tokenizer.ggml.bos_token_id", v->path);
  MOE_TRY(!add_eos || eos >= 0, MOE_ERR_MISSING, "%s: tokenizer.ggml.add_eos_token is true but there is no "
          "tokenizer.ggml.eos_token_id", v->path);
  int32_t *p = realloc(t->post, 3 * sizeof *p);
  MOE_TRY(p, MOE_ERR_NOMEM, "%s: out of memory", v->path);
  t->post = p;
  t->n_post = 0;
  if (add_bos) p[t->n_post++] = bos;
  p[t->n_post++] = -1;
  if (add_eos) p[t->n_post++] = eos;
  if (t->n_post == 1) t->n_post = 0; /* nothing around the text */
  return MOE_OK;
}

/* The tokenizer.json of g's tokenizer into *root (a new object), its vocabulary into v. */
static moe_status gguf_json(moe_gguf *g, vocab *v, cJSON **root) {
  *v = (vocab){g, moe_gguf_path(g), 0, NULL, NULL, NULL, 0};
  *root = NULL;
  const char *model;
  MOE_CHECK(moe_gguf_get_str(g, "tokenizer.ggml.model", &model));
  MOE_TRY(!strcmp(model, "gpt2") || !strcmp(model, "llama"), MOE_ERR_FORMAT,
          "%s: tokenizer.ggml.model \"%s\" is not supported (gpt2 or llama)", v->path, model);
  v->spm = !strcmp(model, "llama");
  MOE_CHECK(read_vocab(v));
  MOE_TRY(*root = cJSON_CreateObject(), MOE_ERR_NOMEM, "%s: out of memory", v->path);
  return build_json(v, *root);
}

moe_status moe__tok_gguf_load(moe_tokenizer **out, const char *path) {
  *out = NULL;
  moe_gguf *g;
  MOE_CHECK(moe_gguf_open(&g, path));
  vocab v;
  cJSON *root;
  moe_status st = gguf_json(g, &v, &root);
  if (st == MOE_OK) st = moe__tok_from_json(v.path, root, out);
  if (st == MOE_OK) st = set_post(&v, *out);
  if (st != MOE_OK && *out) {
    moe_tokenizer_free(*out);
    *out = NULL;
  }
  cJSON_Delete(root);
  vocab_free(&v);
  moe_gguf_close(g);
  return st;
}

/* cfg[key] = the text of token id (string s): a "gpt2" vocabulary token's string stands for bytes
 * (GPT-2's characters); left out when those are not text (a NUL, not the 256 characters). */
static moe_status add_token_text(const moe_gguf *g, cJSON *cfg, const char *key, uint32_t id, const char *s) {
  const char *model = NULL;
  int64_t type = MOE__TOK_NORMAL;
  moe_gguf_get_str(g, "tokenizer.ggml.model", &model);
  if (moe_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
    moe_gguf_vtype et;
    uint64_t n;
    int64_t *types = NULL;
    MOE_CHECK(moe_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n));
    MOE_TRY(id < n && (types = malloc(n * sizeof *types)), id < n ? MOE_ERR_NOMEM : MOE_ERR_FORMAT,
            "%s: tokenizer.ggml.token_type: %s", moe_gguf_path(g), id < n ? "out of memory" : "fewer entries than tokens");
    moe_status st = moe_gguf_get_arr_int(g, "tokenizer.ggml.token_type", types, n);
    type = types[id];
    free(types);
    MOE_CHECK(st);
  }
  char *text = malloc(strlen(s) + 1);
  MOE_TRY(text, MOE_ERR_NOMEM, "%s: out of memory", moe_gguf_path(g));
  long n = (long)strlen(s);
  if (model && !strcmp(model, "gpt2") && type != MOE__TOK_CONTROL && type != MOE__TOK_USER_DEFINED &&
      type != MOE__TOK_UNKNOWN)
    n = moe__tok_string_bytes(s, text);
  else
    memcpy(text, s, (size_t)n);
  int ok = n <= 0 || memchr(text, 0, (size_t)n) ? 1 : (text[n] = 0, cJSON_AddStringToObject(cfg, key, text) != NULL);
  free(text);
  MOE_TRY(ok, MOE_ERR_NOMEM, "%s: out of memory", moe_gguf_path(g));
  return MOE_OK;
}

moe_status moe__tok_gguf_chat_config(const char *path, cJSON **out) {
  moe_gguf *g;
  *out = NULL;
  MOE_CHECK(moe_gguf_open(&g, path));
  cJSON *cfg = cJSON_CreateObject();
  moe_status st = cfg ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  const char *tmpl;
  if (st == MOE_OK && moe_gguf_find_key(g, "tokenizer.chat_template") >= 0 &&
      (st = moe_gguf_get_str(g, "tokenizer.chat_template", &tmpl)) == MOE_OK && !cJSON_AddStringToObject(cfg, "chat_template", tmpl))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  static const char *const keys[4][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                                         {"tokenizer.ggml.eos_token_id", "eos_token"},
                                         {"tokenizer.ggml.unknown_token_id", "unk_token"},
                                         {"tokenizer.ggml.padding_token_id", "pad_token"}};
  moe_gguf_vtype et;
  uint64_t n = 0;
  if (st == MOE_OK && moe_gguf_find_key(g, "tokenizer.ggml.tokens") >= 0)
    st = moe_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n);
  for (int k = 0; st == MOE_OK && n && k < 4; k++) {
    uint32_t id;
    const char *s;
    if (moe_gguf_find_key(g, keys[k][0]) < 0) continue;
    st = moe_gguf_get_u32(g, keys[k][0], &id);
    if (st == MOE_OK && id >= n) st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: %s is %u, beyond the %llu tokens",
                                                 path, keys[k][0], id, (unsigned long long)n);
    if (st == MOE_OK) st = moe_gguf_get_arr_str(g, "tokenizer.ggml.tokens", id, &s, NULL);
    if (st == MOE_OK) st = add_token_text(g, cfg, keys[k][1], id, s);
  }
  moe_gguf_close(g);
  if (st != MOE_OK) cJSON_Delete(cfg);
  else *out = cfg;
  return st;
}

/* JSON text of x written atomically to dir/name. */
static moe_status write_json(const cJSON *x, const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = cJSON_Print(x);
  MOE_TRY(text, MOE_ERR_NOMEM, "%s: out of memory", path);
  moe_status st = moe_write_file_atomic(path, text, strlen(text));
  free(text);
  return st;
}

moe_status moe_tokenizer_gguf_to_hf(const char *path, const char *dir) {
  MOE_TRY(path && dir, MOE_ERR_ARG, "moe_tokenizer_gguf_to_hf: NULL argument");
  moe_gguf *g;
  MOE_CHECK(moe_gguf_open(&g, path));
  vocab v;
  cJSON *root = NULL, *cfg = NULL;
  moe_status st = gguf_json(g, &v, &root);
  moe_tokenizer *t = NULL;
  if (st == MOE_OK) st = moe__tok_from_json(v.path, root, &t); /* what it writes reads back */
  moe_tokenizer_free(t);
  int add_bos = 0, add_eos = 0;
  if (st == MOE_OK) st = get_flag(g, "tokenizer.ggml.add_bos_token", v.spm, &add_bos);
  if (st == MOE_OK) st = get_flag(g, "tokenizer.ggml.add_eos_token", 0, &add_eos);
  if (st == MOE_OK) st = moe__tok_gguf_chat_config(path, &cfg);
  if (st == MOE_OK && (!cJSON_AddBoolToObject(cfg, "add_bos_token", add_bos) ||
                       !cJSON_AddBoolToObject(cfg, "add_eos_token", add_eos)))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", path);
  if (st == MOE_OK) st = write_json(root, dir, "tokenizer.json");
  if (st == MOE_OK) st = write_json(cfg, dir, "tokenizer_config.json");
  cJSON_Delete(root), cJSON_Delete(cfg);
  vocab_free(&v);
  moe_gguf_close(g);
  return st;
}
