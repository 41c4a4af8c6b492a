/* A tokenizer.json (and its tokenizer_config.json) as llama.cpp's tokenizer.ggml.* keys, the way its
 * converter writes them (tokenizer_gguf.h): byte-level vocabularies as "gpt2" with their merges and the
 * pre-tokenizer's llama.cpp name, byte-fallback ones (Llama 2, Mistral) as "llama" with scores that
 * rank the merges (a token's score: minus the rank of the first merge that makes it), token types,
 * the BOS / EOS / unknown / padding ids (tokenizer_config.json's tokens, else config.json's ids),
 * add_bos_token / add_eos_token and the chat template. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "formats/json.h"
#include "lm/tokenizer.h"
#include "lm/tokenizer_gguf.h"

#define MAX_FILE_BYTES ((size_t)1 << 28)
#define UNREACHED_SCORE -1e9f /* a token no merge makes */

typedef struct {
  const char *path;       /* the tokenizer.json */
  const cJSON *root, *cfg; /* cfg: tokenizer_config.json or NULL */
  const cJSON *model_cfg;  /* the directory's config.json (its bos/eos_token_id) or NULL */
  const moe_tokenizer *t;
  int32_t n;              /* tokens written, padding included */
  char **names;           /* (n) token strings as the files spell them (owned: padding, joined merges) */
  int32_t *type;
  float *score;
  int spm;
} tok_out;

/* The strings of every id: model.vocab's keys, added_tokens' contents, [PAD<i>] up to n. */
static moe_status name_tokens(tok_out *o) {
  const cJSON *it, *model = cJSON_GetObjectItemCaseSensitive(o->root, "model");
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(model, "vocab")) {
    int32_t id = (int32_t)it->valuedouble; /* checked by moe_tokenizer_load */
    free(o->names[id]);
    o->names[id] = strdup(it->string);
    MOE_TRY(o->names[id], MOE_ERR_NOMEM, "%s: out of memory", o->path);
  }
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o->root, "added_tokens")) {
    int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
    free(o->names[id]);
    o->names[id] = strdup(cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring);
    MOE_TRY(o->names[id], MOE_ERR_NOMEM, "%s: out of memory", o->path);
  }
  for (int32_t id = o->t->vocab; id < o->n; id++) {
    char pad[32];
    snprintf(pad, sizeof pad, "[PAD%d]", id);
    MOE_TRY(o->names[id] = strdup(pad), MOE_ERR_NOMEM, "%s: out of memory", o->path);
  }
  return MOE_OK;
}

static int is_byte_token(const char *s) {
  return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && strspn(s + 3, "0123456789ABCDEFabcdef") >= 2;
}

static void type_tokens(tok_out *o, int32_t unk) {
  for (int32_t id = 0; id < o->n; id++)
    o->type[id] = id >= o->t->vocab ? MOE__TOK_UNUSED
                  : id == unk ? MOE__TOK_UNKNOWN
                  : o->t->added[id] ? (o->t->special[id] ? MOE__TOK_CONTROL : MOE__TOK_USER_DEFINED)
                  : o->spm && is_byte_token(o->names[id]) ? MOE__TOK_BYTE
                  : MOE__TOK_NORMAL;
}

/* "llama": each token's score from the first merge that makes it (the tokenizer's merges in rank
 * order), so that ranking every split by score gives the merges back. */
static void score_tokens(tok_out *o) {
  for (int32_t id = 0; id < o->n; id++)
    o->score[id] = o->type[id] == MOE__TOK_NORMAL && o->t->len[id] > 1 ? UNREACHED_SCORE : 0;
  for (int32_t k = o->t->n_merges - 1; k >= 0; k--) o->score[o->t->merges[k][2]] = -(float)(k + 1);
}

/* A token named in tokenizer_config.json (a string or {"content": ...}), or -1. */
static int32_t config_id(const tok_out *o, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o->cfg, key);
  if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
  return cJSON_IsString(x) ? moe_tokenizer_token_id(o->t, x->valuestring) : -1;
}

/* config.json's id for key (a number in [0, n)), or -1; the first of a list. */
static int32_t model_config_id(const tok_out *o, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o->model_cfg, key);
  if (cJSON_IsArray(x)) x = cJSON_GetArrayItem(x, 0);
  return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < o->t->vocab && x->valuedouble == (int32_t)x->valuedouble
             ? (int32_t)x->valuedouble : -1;
}

/* The chat template: a string, or the "default" one of a list of {name, template}. */
static const char *chat_template(const cJSON *cfg) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *it;
  if (cJSON_IsString(x)) return x->valuestring;
  cJSON_ArrayForEach(it, x) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name"), *t = cJSON_GetObjectItemCaseSensitive(it, "template");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(t)) return t->valuestring;
  }
  return NULL;
}

static moe_status set_ids(moe_gguf_writer *w, const tok_out *o, int32_t unk) {
  const moe_tokenizer *t = o->t;
  int add_bos = t->n_post > 0 && t->post[0] >= 0, add_eos = t->n_post > 0 && t->post[t->n_post - 1] >= 0;
  int32_t ids[4] = {add_bos ? t->post[0] : config_id(o, "bos_token"),
                    add_eos ? t->post[t->n_post - 1] : config_id(o, "eos_token"), unk, config_id(o, "pad_token")};
  static const char *const keys[4] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
  if (ids[0] < 0) ids[0] = model_config_id(o, "bos_token_id"); /* as llama.cpp's SpecialVocab falls back */
  if (ids[1] < 0) ids[1] = model_config_id(o, "eos_token_id");
  for (int i = 0; i < 4; i++)
    if (ids[i] >= 0) MOE_CHECK(moe_gguf_writer_set_u32(w, keys[i], (uint32_t)ids[i]));
  MOE_CHECK(moe_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos));
  MOE_CHECK(moe_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos));
  const char *tmpl = chat_template(o->cfg);
  return tmpl ? moe_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl) : MOE_OK;
}

/* The merges as "left right" strings (tokenizer.json has them so, or as pairs). */
static moe_status set_merges(moe_gguf_writer *w, const tok_out *o) {
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o->root, "model"), "merges"), *m;
  int n = cJSON_GetArraySize(merges), k = 0;
  char **s = calloc(n ? (size_t)n : 1, sizeof *s);
  MOE_TRY(s, MOE_ERR_NOMEM, "%s: out of memory", o->path);
  moe_status st = MOE_OK;
  cJSON_ArrayForEach(m, merges) {
    const char *l = cJSON_IsArray(m) ? cJSON_GetArrayItem(m, 0)->valuestring : m->valuestring;
    const char *r = cJSON_IsArray(m) ? cJSON_GetArrayItem(m, 1)->valuestring : "";
    size_t len = strlen(l) + strlen(r) + 2;
    if (!(s[k] = malloc(len))) {
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", o->path);
      break;
    }
    snprintf(s[k++], len, cJSON_IsArray(m) ? "%s %s" : "%s%s", l, r);
  }
  if (st == MOE_OK) st = moe_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)s, (uint64_t)n);
  for (int i = 0; i < k; i++) free(s[i]);
  free(s);
  return st;
}

/* Whether the Llama 2 tokenizer prepends "▁" (its normalizer's Prepend, or a Metaspace pre-tokenizer
 * that does); MOE_ERR_FORMAT for other byte-fallback pipelines. */
static moe_status space_prefix(const tok_out *o, int *prefix) {
  const cJSON *norm = cJSON_GetObjectItemCaseSensitive(o->root, "normalizer");
  const cJSON *pre = cJSON_GetObjectItemCaseSensitive(o->root, "pre_tokenizer"), *it;
  *prefix = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(norm, "normalizers")) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "Prepend")) *prefix = 1;
  }
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pre, "type");
  if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "Metaspace")) {
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(pre, "prepend_scheme");
    *prefix = !cJSON_IsString(sch) || strcmp(sch->valuestring, "never");
  } else {
    MOE_TRY(!pre || cJSON_IsNull(pre), MOE_ERR_FORMAT, "%s: a byte-fallback tokenizer with a %s pre_tokenizer has no "
            "GGUF form (llama's has none, or Metaspace)", o->path, cJSON_IsString(ty) ? ty->valuestring : "non-Metaspace");
  }
  return MOE_OK;
}

static moe_status write_keys(moe_gguf_writer *w, tok_out *o) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(o->root, "model");
  int byte_level = moe__tok_pipeline_byte_level(o->root);
  o->spm = !byte_level && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
  MOE_TRY(byte_level || o->spm, MOE_ERR_FORMAT, "%s: neither byte-level nor byte-fallback BPE: no GGUF tokenizer "
          "type (gpt2 or llama) fits", o->path);
  MOE_CHECK(name_tokens(o));
  const cJSON *unk_tok = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
  int32_t unk = cJSON_IsString(unk_tok) ? moe_tokenizer_token_id(o->t, unk_tok->valuestring) : -1;
  if (unk < 0) unk = config_id(o, "unk_token");
  type_tokens(o, unk);
  MOE_CHECK(moe_gguf_writer_set_str(w, "tokenizer.ggml.model", o->spm ? "llama" : "gpt2"));
  if (!o->spm) {
    const char *pre = moe__tok_gguf_pre_name(cJSON_GetObjectItemCaseSensitive(o->root, "pre_tokenizer"));
    MOE_TRY(pre, MOE_ERR_FORMAT, "%s: its pre_tokenizer is none of the pre-tokenizers libmoe names for llama.cpp "
            "(gpt-2, olmo, llama-bpe, qwen2, deepseek-v3, gpt-4o)", o->path);
    MOE_CHECK(moe_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre));
  }
  MOE_CHECK(moe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)o->names, (uint64_t)o->n));
  if (o->spm) {
    score_tokens(o);
    MOE_CHECK(moe_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", o->score, (uint64_t)o->n));
  }
  MOE_CHECK(moe_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", o->type, (uint64_t)o->n));
  if (!o->spm) MOE_CHECK(set_merges(w, o));
  MOE_CHECK(set_ids(w, o, unk));
  if (!o->spm) return MOE_OK;
  int prefix;
  MOE_CHECK(space_prefix(o, &prefix));
  return moe_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", prefix);
}

moe_status moe__tok_gguf_write_loaded(moe_gguf_writer *w, const char *tokenizer, const moe_tokenizer *t, int vocab) {
  struct stat sb;
  int dir = stat(tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode);
  size_t len = strlen(tokenizer) + 32;
  char *json = malloc(len), *cfgp = malloc(len), *mcfgp = malloc(len);
  cJSON *root = NULL, *cfg = NULL, *mcfg = NULL;
  tok_out o = {0};
  moe_status st = json && cfgp && mcfgp ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory");
  if (st == MOE_OK) {
    snprintf(json, len, dir ? "%s/tokenizer.json" : "%s", tokenizer);
    snprintf(cfgp, len, "%s/tokenizer_config.json", tokenizer);
    snprintf(mcfgp, len, "%s/config.json", tokenizer);
    st = moe__json_read(json, "tokenizer", MAX_FILE_BYTES, &root);
  }
  if (st == MOE_OK && dir && stat(cfgp, &sb) == 0) st = moe__json_read(cfgp, "tokenizer config", MAX_FILE_BYTES, &cfg);
  if (st == MOE_OK && dir && stat(mcfgp, &sb) == 0) st = moe__json_read(mcfgp, "config", MAX_FILE_BYTES, &mcfg);
  if (st == MOE_OK && vocab > 0 && t->vocab > vocab)
    st = moe__error(MOE_ERR_SHAPE, __FILE__, __LINE__, "%s: the tokenizer has %d tokens, more than the model's vocabulary "
                    "of %d", json, t->vocab, vocab);
  if (st == MOE_OK) {
    o = (tok_out){json, root, cfg, mcfg, t, vocab > t->vocab ? vocab : t->vocab, NULL, NULL, NULL, 0};
    o.names = calloc((size_t)o.n, sizeof *o.names);
    o.type = calloc((size_t)o.n, sizeof *o.type);
    o.score = calloc((size_t)o.n, sizeof *o.score);
    st = o.names && o.type && o.score ? write_keys(w, &o) : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory");
  }
  for (int32_t i = 0; o.names && i < o.n; i++) free(o.names[i]);
  free(o.names), free(o.type), free(o.score);
  cJSON_Delete(root), cJSON_Delete(cfg), cJSON_Delete(mcfg);
  free(json), free(cfgp), free(mcfgp);
  return st;
}

moe_status moe__tok_gguf_write(moe_gguf_writer *w, const char *tokenizer, int vocab) {
  moe_tokenizer *t;
  MOE_CHECK(moe_tokenizer_load(&t, tokenizer)); /* what runs it: every check, the post-processor's ids */
  moe_status st = moe__tok_gguf_write_loaded(w, tokenizer, t, vocab);
  moe_tokenizer_free(t);
  return st;
}
