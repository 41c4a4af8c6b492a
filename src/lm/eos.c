/* The ids that end generation (moe_lm_eos_ids): what Hugging Face's generate stops at for a checkpoint
 * directory, from its config.json, generation_config.json and tokenizer_config.json; for a GGUF file,
 * from its tokenizer.ggml.* keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/json.h"
#include "internal.h"
#include "lm_gguf.h"

typedef struct {
  int32_t *ids;
  int n, cap, vocab;
} eos_set;

static moe_status add(eos_set *s, int32_t id, const char *path, const char *field) {
  for (int i = 0; i < s->n; i++)
    if (s->ids[i] == id) return MOE_OK;
  MOE_TRY(s->n < s->cap, MOE_ERR_ARG, "%s: \"%s\": more than the %d end ids there is room for", path, field, s->cap);
  s->ids[s->n++] = id;
  return MOE_OK;
}

/* Adds the id e holds (*st: room for it); 0 when e is not a token id. */
static int add_value(eos_set *s, const cJSON *e, const char *path, const char *field, moe_status *st) {
  double x = cJSON_IsNumber(e) ? e->valuedouble : -1;
  if (x < 0 || x >= s->vocab || x != (int32_t)x) return 0;
  if (*st == MOE_OK) *st = add(s, (int32_t)x, path, field);
  return 1;
}

/* field of dir/name, an id or a list of ids in [0, vocab) (absent or null: none); a file absent: none. */
static moe_status add_ids(eos_set *s, const char *dir, const char *name, const char *field, int required) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!required && access(path, F_OK)) return MOE_OK;
  cJSON *r, *e;
  MOE_CHECK(moe__json_read(path, name, 1 << 20, &r));
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, field);
  int ok = !v || cJSON_IsNull(v) || cJSON_IsNumber(v) || cJSON_IsArray(v);
  moe_status st = MOE_OK;
  if (cJSON_IsNumber(v)) ok = add_value(s, v, path, field, &st);
  else if (cJSON_IsArray(v)) cJSON_ArrayForEach(e, v) if (!(ok = add_value(s, e, path, field, &st))) break;
  char *text = ok ? NULL : cJSON_PrintUnformatted(v);
  cJSON_Delete(r);
  if (!ok) {
    moe_status bad = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: \"%s\" %.60s is not a token id in [0, %d) or a list of them",
                                path, field, text ? text : "?", s->vocab);
    free(text);
    return bad;
  }
  return st;
}

/* tokenizer_config.json's eos_token (a string, or an added token's {"content": ...}) by its id in t. */
static moe_status add_eos_token(eos_set *s, const char *dir, const moe_tokenizer *t) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  if (!t || access(path, F_OK)) return MOE_OK;
  cJSON *r;
  MOE_CHECK(moe__json_read(path, "tokenizer_config.json", 64 << 20, &r)); /* chat templates make it large */
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "eos_token");
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  moe_status st = MOE_OK;
  if (cJSON_IsString(v)) {
    int32_t id = moe_tokenizer_token_id(t, v->valuestring);
    if (id < 0 || id >= s->vocab)
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: \"eos_token\" \"%.60s\" is %s", path, v->valuestring,
                      id < 0 ? "not a token of the tokenizer" : "an id the model does not have");
    else st = add(s, id, path, "eos_token");
  } else if (v && !cJSON_IsNull(v))
    st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: \"eos_token\" must be a string or {\"content\": string}", path);
  cJSON_Delete(r);
  return st;
}

/* A GGUF file's tokenizer.ggml.eos_token_id and eot_token_id (the end of a chat turn), when there. */
static moe_status add_gguf_ids(eos_set *s, const char *path) {
  moe_gguf *g;
  MOE_CHECK(moe_gguf_open(&g, path));
  static const char *const keys[2] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
  moe_status st = MOE_OK;
  for (int i = 0; i < 2 && st == MOE_OK; i++) {
    uint32_t id;
    if (moe_gguf_find_key(g, keys[i]) < 0 || (st = moe_gguf_get_u32(g, keys[i], &id)) != MOE_OK) continue;
    st = id < (uint32_t)s->vocab ? add(s, (int32_t)id, path, keys[i])
                                 : moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: %s %u is not a token id in [0, %d)",
                                              path, keys[i], id, s->vocab);
  }
  moe_gguf_close(g);
  return st;
}

moe_status moe_lm_eos_ids(const char *dir, const moe_tokenizer *t, int vocab, int32_t *eos, int cap, int *n) {
  MOE_TRY(dir && eos && n && cap >= 1 && vocab >= 1, MOE_ERR_ARG, "moe_lm_eos_ids: bad argument");
  eos_set s = {eos, 0, cap, vocab};
  *n = 0;
  if (moe__lm_gguf_is(dir)) {
    MOE_CHECK(add_gguf_ids(&s, dir));
  } else {
    MOE_CHECK(add_ids(&s, dir, "config.json", "eos_token_id", 1));
    MOE_CHECK(add_ids(&s, dir, "generation_config.json", "eos_token_id", 0));
    MOE_CHECK(add_eos_token(&s, dir, t));
  }
  int32_t eot = t ? moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT) : -1;
  if (eot >= 0 && eot < vocab) MOE_CHECK(add(&s, eot, dir, MOE_TOKENIZER_EOT));
  *n = s.n;
  return MOE_OK;
}
