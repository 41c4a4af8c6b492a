/* The public entry points: a template rendered over a JSON context, and a model's chat template
 * (tokenizer_config.json, or a GGUF file's tokenizer.chat_template) rendered over a conversation with
 * its special tokens. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "chat/chat_render.h"
#include "lm/lm_gguf.h"
#include "lm/tokenizer_gguf.h"

static const cj_limits DEFAULT_LIMITS = {256u << 20, 50u * 1000 * 1000, 1u << 20, 200};

moe_status moe__chat_render(const char *tmpl, size_t n, const cJSON *context, int64_t now, const cj_limits *lim,
                            char **out, size_t *len) {
  *out = NULL;
  if (len) *len = 0;
  /* On the heap: what a longjmp comes back to must not be a local changed after setjmp. */
  cj_ctx *c = calloc(1, sizeof *c);
  MOE_TRY(c, MOE_ERR_NOMEM, "chat template: out of memory");
  *c = (cj_ctx){.tmpl = tmpl, .tmpl_len = n, .now = now, .lim = lim ? *lim : DEFAULT_LIMITS, .status = MOE_ERR_FORMAT};
  if (setjmp(c->fail)) {
    moe_status st = c->status;
    cj_free_all(c);
    free(c);
    return st;
  }
  size_t ntok;
  cj_tok *toks = cj_lex(c, &ntok);
  cj_list prog = cj_parse(c, toks, ntok);
  c->status = MOE_ERR_VALUE;
  cj_env *env = cj_env_new(c, NULL);
  cj_set_globals(c, env);
  cj_map builtins = env->vars; /* a copy: the context's own names go after these */
  for (const cJSON *e = context ? context->child : NULL; e; e = e->next) {
    cj_str name = cj_cstr(e->string);
    if (cj_map_get(&builtins, name.s, name.n) || cj_str_eq(name, "namespace"))
      cj_fail(c, SIZE_MAX, "the context's '%s' is a built-in name", e->string);
    cj_env_set(c, env, name, cj_from_json(c, e)); /* a name twice: the last value, as JSON.parse */
  }
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  cj_exec_block(c, &prog, env, &b);
  char *s = malloc(b.n + 1);
  if (!s) cj_fail(c, SIZE_MAX, "out of memory (%zu bytes of output)", b.n);
  memcpy(s, b.s, b.n + 1);
  *out = s;
  if (len) *len = b.n;
  cj_free_all(c);
  free(c);
  return MOE_OK;
}

void moe_free(void *p) { free(p); }

moe_status moe_chat_template_render(const char *tmpl, const char *context_json, int64_t now, char **out, size_t *len) {
  MOE_TRY(tmpl && out, MOE_ERR_ARG, "moe_chat_template_render: NULL template or output");
  *out = NULL;
  cJSON *ctx = NULL;
  if (context_json && *context_json) {
    const char *end = NULL;
    ctx = cJSON_ParseWithOpts(context_json, &end, 1);
    if (!ctx || !cJSON_IsObject(ctx)) {
      size_t at = ctx ? 0 : (size_t)(cJSON_GetErrorPtr() - context_json);
      cJSON_Delete(ctx);
      return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                        "chat template context: not a JSON object (byte %zu)", at);
    }
  }
  moe_status st = moe__chat_render(tmpl, strlen(tmpl), ctx, now, NULL, out, len);
  cJSON_Delete(ctx);
  return st;
}

/* The whole file, NUL-terminated; its size checked before it is read. */
static moe_status read_file(const char *path, char **out) {
  FILE *f = fopen(path, "rb");
  MOE_TRY(f, MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat s;
  if (fstat(fileno(f), &s) || !S_ISREG(s.st_mode) || s.st_size > (64 << 20)) {
    fclose(f);
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: not a regular file of at most 64 MiB", path);
  }
  char *buf = malloc((size_t)s.st_size + 1);
  size_t got = buf ? fread(buf, 1, (size_t)s.st_size, f) : 0;
  fclose(f);
  if (!buf || got != (size_t)s.st_size) {
    free(buf);
    return moe__error(buf ? MOE_ERR_IO : MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: cannot read %lld bytes", path,
                      (long long)s.st_size);
  }
  buf[got] = 0;
  *out = buf;
  return MOE_OK;
}

/* The config's chat_template: a string, or the "default" of a list of {name, template}. */
static const char *template_of(const cJSON *cfg) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
  if (cJSON_IsString(t)) return t->valuestring;
  const cJSON *e;
  if (!cJSON_IsArray(t)) return NULL;
  cJSON_ArrayForEach(e, t) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name"), *tm = cJSON_GetObjectItemCaseSensitive(e, "template");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tm)) return tm->valuestring;
  }
  return NULL;
}

static void put(cJSON *ctx, const char *key, cJSON *v) {
  if (cJSON_GetObjectItemCaseSensitive(ctx, key)) cJSON_ReplaceItemInObjectCaseSensitive(ctx, key, v);
  else cJSON_AddItemToObject(ctx, key, v);
}

struct moe_chat_template {
  char path[4096]; /* where it came from, for errors */
  cJSON *cfg;      /* tokenizer_config.json's object (or a GGUF's, as one) */
  const char *tmpl; /* its chat_template, inside cfg */
};

void moe_chat_template_free(moe_chat_template *t) {
  if (t) cJSON_Delete(t->cfg);
  free(t);
}

moe_status moe_chat_template_load(moe_chat_template **out, const char *tokenizer) {
  MOE_TRY(out && tokenizer, MOE_ERR_ARG, "moe_chat_template_load: NULL argument");
  *out = NULL;
  moe_chat_template *t = calloc(1, sizeof *t);
  MOE_TRY(t, MOE_ERR_NOMEM, "moe_chat_template_load: out of memory");
  struct stat s;
  int dir = stat(tokenizer, &s) == 0 && S_ISDIR(s.st_mode);
  snprintf(t->path, sizeof t->path, dir ? "%s/tokenizer_config.json" : "%s", tokenizer);
  moe_status st = MOE_OK;
  if (!dir && moe__lm_gguf_is(t->path)) { /* a GGUF file: its tokenizer.chat_template and special tokens */
    st = moe__tok_gguf_chat_config(t->path, &t->cfg);
  } else {
    char *text = NULL;
    st = read_file(t->path, &text);
    t->cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
  }
  if (st == MOE_OK && !cJSON_IsObject(t->cfg))
    st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: not a JSON object", t->path);
  if (st == MOE_OK && !(t->tmpl = template_of(t->cfg)))
    st = moe__error(MOE_ERR_MISSING, __FILE__, __LINE__, "%s: no chat_template (a string, or a list with a \"default\")",
                    t->path);
  if (st != MOE_OK) return moe_chat_template_free(t), st;
  *out = t;
  return MOE_OK;
}

moe_status moe_chat_template_render_config(const char *tokenizer, const char *conversation_json,
                                           int add_generation_prompt, int64_t now, char **out, size_t *len) {
  MOE_TRY(tokenizer && conversation_json && out, MOE_ERR_ARG, "moe_chat_template_render_config: NULL argument");
  *out = NULL;
  moe_chat_template *t;
  MOE_CHECK(moe_chat_template_load(&t, tokenizer));
  moe_status st = moe_chat_template_apply(t, conversation_json, add_generation_prompt, now, out, len);
  moe_chat_template_free(t);
  return st;
}

moe_status moe_chat_template_apply(const moe_chat_template *t, const char *conversation_json,
                                   int add_generation_prompt, int64_t now, char **out, size_t *len) {
  MOE_TRY(t && conversation_json && out, MOE_ERR_ARG, "moe_chat_template_apply: NULL argument");
  *out = NULL;
  const cJSON *cfg = t->cfg;
  cJSON *conv = cJSON_Parse(conversation_json), *ctx = cJSON_CreateObject();
  if (!cJSON_IsArray(conv) && !(cJSON_IsObject(conv) && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(conv, "messages")))) {
    cJSON_Delete(conv);
    cJSON_Delete(ctx);
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                      "conversation: not a JSON list of messages, nor an object with \"messages\"");
  }
  /* As transformers.js's apply_chat_template: tools and documents none unless given, the standard
   * special tokens that are set (strings, or {"content": ...} objects), then the conversation's. */
  static const char *const SPECIAL[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                        "cls_token", "mask_token"};
  put(ctx, "messages", cJSON_CreateArray());
  put(ctx, "add_generation_prompt", cJSON_CreateBool(add_generation_prompt));
  put(ctx, "tools", cJSON_CreateNull());
  put(ctx, "documents", cJSON_CreateNull());
  const cJSON *e;
  for (size_t i = 0; i < sizeof SPECIAL / sizeof *SPECIAL; i++) {
    e = cJSON_GetObjectItemCaseSensitive(cfg, SPECIAL[i]);
    const cJSON *content = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "content") : e;
    if (cJSON_IsString(content) && content->valuestring[0]) put(ctx, SPECIAL[i], cJSON_CreateString(content->valuestring));
  }
  if (cJSON_IsArray(conv)) {
    put(ctx, "messages", cJSON_Duplicate(conv, 1));
  } else {
    cJSON_ArrayForEach(e, conv) put(ctx, e->string, cJSON_Duplicate(e, 1));
  }
  moe_status st = moe__chat_render(t->tmpl, strlen(t->tmpl), ctx, now, NULL, out, len);
  if (st != MOE_OK) moe__error(st, __FILE__, __LINE__, "%s: %s", t->path, moe_last_error());
  cJSON_Delete(conv);
  cJSON_Delete(ctx);
  return st;
}
