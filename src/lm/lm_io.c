/* Hugging Face Mixtral checkpoints for the language model: config.json, one safetensors file or the
 * shards of an index, F32/BF16/F16 tensors. The model's reference table carries the HF names and
 * shapes (an expert's w1/w2/w3 are slices of the layer's stacked tensors), so loading and saving walk
 * it and nothing here knows the layout. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "formats/json.h"
#include "lm_dist.h"

#define INDEX_JSON "model.safetensors.index.json"
#define MAX_SHARDS 4096

static void path_in(char *buf, size_t n, const char *dir, const char *file) { snprintf(buf, n, "%s/%s", dir, file); }

/* An integer field: absent leaves *out as it is (unless required). */
static moe_status get_int(const char *path, const cJSON *root, const char *key, int required, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  MOE_TRY(v || !required, MOE_ERR_MISSING, "%s: no \"%s\"", path, key);
  if (!v || cJSON_IsNull(v)) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v) && v->valuedouble == (int)v->valuedouble && v->valuedouble > 0 &&
              v->valuedouble <= INT32_MAX,
          MOE_ERR_FORMAT, "%s: \"%s\" must be a positive integer", path, key);
  *out = (int)v->valuedouble;
  return MOE_OK;
}

static moe_status get_float(const char *path, const cJSON *root, const char *key, float *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v) && isfinite((float)v->valuedouble), MOE_ERR_FORMAT, "%s: \"%s\" must be a finite number",
          path, key);
  *out = (float)v->valuedouble;
  return MOE_OK;
}

static moe_status get_bool(const char *path, const cJSON *root, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsBool(v), MOE_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
  *out = cJSON_IsTrue(v);
  return MOE_OK;
}

static moe_status read_config(const char *path, const cJSON *r, moe_lm_config *c) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(r, "model_type");
  MOE_TRY(!mt || (cJSON_IsString(mt) && !strcmp(mt->valuestring, "mixtral")), MOE_ERR_FORMAT,
          "%s: \"model_type\" is %s, want \"mixtral\"", path, cJSON_IsString(mt) ? mt->valuestring : "not a string");
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "hidden_act");
  MOE_TRY(!act || (cJSON_IsString(act) && !strcmp(act->valuestring, "silu")), MOE_ERR_FORMAT,
          "%s: \"hidden_act\" must be \"silu\" (SwiGLU experts)", path);
  MOE_CHECK(get_int(path, r, "vocab_size", 1, &c->vocab));
  MOE_CHECK(get_int(path, r, "hidden_size", 1, &c->moe.D));
  MOE_CHECK(get_int(path, r, "intermediate_size", 1, &c->moe.H));
  MOE_CHECK(get_int(path, r, "num_hidden_layers", 1, &c->n_layers));
  MOE_CHECK(get_int(path, r, "num_attention_heads", 1, &c->n_heads));
  c->n_kv_heads = c->n_heads;
  MOE_CHECK(get_int(path, r, "num_key_value_heads", 0, &c->n_kv_heads));
  c->head_dim = c->moe.D / c->n_heads;
  MOE_CHECK(get_int(path, r, "head_dim", 0, &c->head_dim));
  MOE_CHECK(get_int(path, r, "max_position_embeddings", 0, &c->max_seq));
  MOE_CHECK(get_int(path, r, "num_local_experts", 1, &c->moe.E));
  MOE_CHECK(get_int(path, r, "num_experts_per_tok", 1, &c->moe.top_k));
  MOE_CHECK(get_float(path, r, "rope_theta", &c->rope_theta));
  MOE_CHECK(get_int(path, r, "sliding_window", 0, &c->sliding_window));
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling"), *ty = NULL;
  if (cJSON_IsObject(rs) && !cJSON_IsString(ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type")))
    ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
  MOE_TRY(!rs || cJSON_IsNull(rs), MOE_ERR_FORMAT, "%s: \"rope_scaling\" of type %s is not supported (only null)",
          path, cJSON_IsString(ty) ? ty->valuestring : "(none given)");
  MOE_CHECK(get_float(path, r, "rms_norm_eps", &c->rms_eps));
  MOE_CHECK(get_float(path, r, "router_aux_loss_coef", &c->aux_coef));
  int with_aux = 0;
  MOE_CHECK(get_bool(path, r, "output_router_logits", &with_aux));
  if (!with_aux) c->aux_coef = 0; /* transformers adds the balance loss only then */
  c->tie_embeddings = 0;
  return get_bool(path, r, "tie_word_embeddings", &c->tie_embeddings);
}

moe_status moe_lm_read_config(const char *dir, moe_lm_config *c) {
  MOE_TRY(dir && c, MOE_ERR_ARG, "moe_lm_read_config: NULL argument");
  char path[4096];
  path_in(path, sizeof path, dir, "config.json");
  cJSON *root;
  MOE_CHECK(moe__json_read(path, "config", (size_t)1 << 26, &root));
  moe_lm_config_default(c);
  moe_status st = cJSON_IsObject(root) ? read_config(path, root, c)
                                       : moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: not a JSON object", path);
  cJSON_Delete(root);
  return st;
}

/* The checkpoint's files, opened lazily: one, or the index's shards, with the index to find them. */
typedef struct {
  cJSON *index;   /* weight_map of the index, or NULL for one file */
  int n;
  char **names;   /* (n) shard file names */
  moe_st **files; /* (n) */
} shards;

static void shards_close(shards *s) {
  for (int i = 0; i < s->n; i++) {
    moe_st_close(s->files[i]);
    free(s->names[i]);
  }
  free(s->files);
  free(s->names);
  cJSON_Delete(s->index);
}

static moe_status shard_open(shards *s, const char *dir, const char *name) {
  char path[4096];
  MOE_TRY(!strchr(name, '/'), MOE_ERR_FORMAT, "%s/" INDEX_JSON ": shard '%s' is not a file name in the directory", dir,
          name);
  MOE_TRY(s->n < MAX_SHARDS, MOE_ERR_FORMAT, "%s/" INDEX_JSON ": more than %d shards", dir, MAX_SHARDS);
  if (!s->n) {
    s->names = calloc(MAX_SHARDS, sizeof *s->names);
    s->files = calloc(MAX_SHARDS, sizeof *s->files);
    MOE_TRY(s->names && s->files, MOE_ERR_NOMEM, "out of memory");
  }
  path_in(path, sizeof path, dir, name);
  s->names[s->n] = strdup(name);
  MOE_TRY(s->names[s->n], MOE_ERR_NOMEM, "out of memory");
  s->n++;
  return moe_st_open_lazy(&s->files[s->n - 1], path);
}

static moe_status shards_open(shards *s, const char *dir) {
  memset(s, 0, sizeof *s);
  char path[4096];
  path_in(path, sizeof path, dir, INDEX_JSON);
  if (access(path, F_OK) != 0) return shard_open(s, dir, "model.safetensors");
  cJSON *root;
  MOE_CHECK(moe__json_read(path, "index", (size_t)1 << 26, &root));
  s->index = root;
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map"), *it;
  MOE_TRY(cJSON_IsObject(map), MOE_ERR_FORMAT, "%s: no \"weight_map\" object", path);
  cJSON_ArrayForEach(it, map) {
    MOE_TRY(cJSON_IsString(it), MOE_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", path, it->string);
    int seen = 0;
    for (int i = 0; i < s->n && !seen; i++) seen = !strcmp(s->names[i], it->valuestring);
    if (!seen) MOE_CHECK(shard_open(s, dir, it->valuestring));
  }
  return MOE_OK;
}

/* The file holding tensor `name`. */
static moe_status shard_of(const shards *s, const char *dir, const char *name, moe_st **f) {
  if (!s->index) {
    *f = s->files[0];
    return MOE_OK;
  }
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s->index, "weight_map"), name);
  MOE_TRY(v, MOE_ERR_MISSING, "%s/" INDEX_JSON ": no tensor '%s' in weight_map", dir, name);
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], v->valuestring)) *f = s->files[i];
  return MOE_OK;
}

/* IEEE half to float, exactly. */
static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return h & 0x8000 ? -v : v;
}

static moe_status read_tensor(const moe_st *f, const moe_tensor_ref *r) {
  moe_tensor_view v;
  MOE_CHECK(moe_st_get(f, r->name, &v));
  MOE_CHECK(moe__st_expect_shape(f, &v, r->name, r->ndim, r->shape));
  if (v.dtype == MOE_DT_F16) {
    uint16_t *h = malloc(r->numel * 2 + 1);
    MOE_TRY(h, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_st_path(f), r->name);
    moe_status st = moe_st_read(f, &v, 0, r->numel * 2, h);
    for (size_t i = 0; st == MOE_OK && i < r->numel; i++) r->data[i] = half_to_float(h[i]);
    free(h);
    MOE_CHECK(st);
  } else {
    MOE_TRY(v.dtype == MOE_DT_F32 || v.dtype == MOE_DT_BF16, MOE_ERR_DTYPE,
            "%s: tensor '%s' is %s, want F32, BF16 or F16", moe_st_path(f), r->name, moe_dtype_name(v.dtype));
    MOE_CHECK(moe_st_view_f32(f, &v, 0, r->numel, r->data));
  }
  return moe__st_expect_finite(f, &v, 0, r->data, r->numel);
}

/* Ref r from f: the whole tensor, or under the sharded layout this rank's part of it (lm_dist.h). */
static moe_status read_part(const moe_lm_t *m, const moe_st *f, const moe_tensor_ref *r) {
  moe__lm_part p;
  moe__lm_part_of(m, r, &p);
  if (p.whole.numel == r->numel) return read_tensor(f, r);
  p.whole.data = malloc(p.whole.numel * 4);
  MOE_TRY(p.whole.data, MOE_ERR_NOMEM, "%s: out of memory for tensor '%s'", moe_st_path(f), r->name);
  moe_status st = read_tensor(f, &p.whole);
  if (st == MOE_OK) moe__lm_part_copy(&p, p.whole.data, r->data, 0);
  free(p.whole.data);
  return st;
}

/* The config's sizes against the tensors that carry them, before anything of their size is allocated:
 * a config.json that does not fit its weights is an error naming the field and its value, not gigabytes
 * allocated (a shard's header alone is read). The last layer and expert vouch for the counts. */
static moe_status check_sizes(const shards *s, const char *dir, const moe_lm_config *c) {
  int64_t D = c->moe.D, hd = c->head_dim;
  char names[5][128];
  snprintf(names[0], 128, "model.embed_tokens.weight");
  snprintf(names[1], 128, "model.layers.%d.self_attn.q_proj.weight", c->n_layers - 1);
  snprintf(names[2], 128, "model.layers.%d.self_attn.k_proj.weight", c->n_layers - 1);
  snprintf(names[3], 128, "model.layers.%d.block_sparse_moe.gate.weight", c->n_layers - 1);
  snprintf(names[4], 128, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", c->n_layers - 1, c->moe.E - 1);
  const struct { const char *rows; int64_t nrows; } want[5] = {
      {"\"vocab_size\"", c->vocab},
      {"\"num_attention_heads\" x \"head_dim\"", c->n_heads * hd},
      {"\"num_key_value_heads\" x \"head_dim\"", c->n_kv_heads * hd},
      {"\"num_local_experts\"", c->moe.E},
      {"\"intermediate_size\"", c->moe.H},
  };
  for (int i = 0; i < 5; i++) {
    moe_st *f = NULL;
    moe_tensor_view v;
    moe_status st = shard_of(s, dir, names[i], &f);
    if (st == MOE_OK) st = moe_st_get(f, names[i], &v);
    MOE_TRY(st == MOE_OK, MOE_ERR_SHAPE,
            "%s/config.json: \"num_hidden_layers\" %d and \"num_local_experts\" %d ask for tensor '%s': %s", dir,
            c->n_layers, c->moe.E, names[i], moe_last_error());
    MOE_TRY(v.ndim == 2 && v.shape[0] == want[i].nrows, MOE_ERR_SHAPE,
            "%s/config.json: %s is %lld, but tensor '%s' in %s has %lld rows", dir, want[i].rows,
            (long long)want[i].nrows, names[i], moe_st_path(f), v.ndim ? (long long)v.shape[0] : 0LL);
    MOE_TRY(v.shape[1] == D, MOE_ERR_SHAPE, "%s/config.json: \"hidden_size\" is %lld, but tensor '%s' in %s has %lld columns",
            dir, (long long)D, names[i], moe_st_path(f), (long long)v.shape[1]);
  }
  return MOE_OK;
}

moe_status moe_lm_load(moe_lm_t *m, const char *dir, const moe_lm_config *c) {
  MOE_TRY(m && dir, MOE_ERR_ARG, "moe_lm_load: NULL argument");
  memset(m, 0, sizeof *m);
  moe_lm_config own;
  if (!c) {
    MOE_CHECK(moe_lm_read_config(dir, &own));
    c = &own;
  }
  shards s;
  moe_status st = shards_open(&s, dir);
  if (st == MOE_OK) st = check_sizes(&s, dir, c);
  if (st == MOE_OK) st = moe_lm_init(m, c);
  if (st != MOE_OK) {
    shards_close(&s);
    return st;
  }
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    moe_st *f = NULL;
    st = shard_of(&s, dir, m->refs[i].name, &f);
    if (st == MOE_OK) st = read_part(m, f, &m->refs[i]);
  }
  shards_close(&s);
  if (st != MOE_OK) {
    moe_lm_free(m);
    return st;
  }
  moe_lm_params_changed(m);
  return MOE_OK;
}

/* A float as the shortest decimal that reads back as the same float ("1e-05", not 9.99999974737875e-06). */
static cJSON *float_json(float x) {
  char buf[32];
  for (int p = 6; p <= 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)x);
    if (strtof(buf, NULL) == x) break;
  }
  return cJSON_CreateRaw(buf);
}

/* Adds item under key, or deletes it and clears *ok (cJSON's adds fail silently when out of memory,
 * which would write a config.json with fields missing). */
static void add(cJSON *o, const char *key, cJSON *item, int *ok) {
  if (item && o && cJSON_AddItemToObject(o, key, item)) return;
  cJSON_Delete(item);
  *ok = 0;
}

static char *config_json(const moe_lm_config *c) {
  cJSON *r = cJSON_CreateObject(), *arch = cJSON_CreateArray();
  int ok = arch && cJSON_AddItemToArray(arch, cJSON_CreateString("MixtralForCausalLM")) && arch->child;
  add(r, "architectures", arch, &ok);
  add(r, "model_type", cJSON_CreateString("mixtral"), &ok);
  add(r, "hidden_act", cJSON_CreateString("silu"), &ok);
  add(r, "torch_dtype", cJSON_CreateString("float32"), &ok);
  const struct { const char *key; int v; } ints[] = {
      {"vocab_size", c->vocab},           {"hidden_size", c->moe.D},
      {"intermediate_size", c->moe.H},    {"num_hidden_layers", c->n_layers},
      {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads},
      {"head_dim", c->head_dim},          {"max_position_embeddings", c->max_seq},
      {"num_local_experts", c->moe.E},    {"num_experts_per_tok", c->moe.top_k},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) add(r, ints[i].key, cJSON_CreateNumber(ints[i].v), &ok);
  add(r, "rope_theta", float_json(c->rope_theta), &ok);
  add(r, "rms_norm_eps", float_json(c->rms_eps), &ok);
  add(r, "router_aux_loss_coef", float_json(c->aux_coef), &ok);
  add(r, "output_router_logits", cJSON_CreateBool(c->aux_coef > 0), &ok);
  add(r, "tie_word_embeddings", cJSON_CreateBool(c->tie_embeddings), &ok);
  add(r, "sliding_window", c->sliding_window ? cJSON_CreateNumber(c->sliding_window) : cJSON_CreateNull(), &ok);
  add(r, "attention_dropout", cJSON_CreateNumber(0), &ok);
  char *text = ok ? cJSON_Print(r) : NULL;
  cJSON_Delete(r);
  return text;
}

moe_status moe_lm_save(const moe_lm_t *m, const char *dir) {
  MOE_TRY(m && m->st && dir, MOE_ERR_ARG, "moe_lm_save: NULL argument");
  if (moe_dist_size(m->cfg.moe.dist) > 1) return moe__lm_save_ranks(m, dir);
  MOE_TRY(mkdir(dir, 0755) == 0 || errno == EEXIST, MOE_ERR_IO, "%s: cannot create the directory: %s", dir,
          strerror(errno));
  char path[4096];
  moe_st_writer *w;
  MOE_CHECK(moe_st_writer_new(&w));
  moe_status st = moe_st_writer_meta(w, "format", "pt");
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    const moe_tensor_ref *r = &m->refs[i];
    st = moe_st_writer_add_f32(w, r->name, MOE_DT_F32, r->ndim, r->shape, r->data);
  }
  path_in(path, sizeof path, dir, "model.safetensors");
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  MOE_CHECK(st);
  path_in(path, sizeof path, dir, INDEX_JSON);
  MOE_TRY(unlink(path) == 0 || errno == ENOENT, MOE_ERR_IO, "%s: cannot remove the old index: %s", path,
          strerror(errno));
  char *text = config_json(&m->cfg);
  MOE_TRY(text, MOE_ERR_NOMEM, "out of memory for config.json");
  path_in(path, sizeof path, dir, "config.json");
  st = moe_write_file_atomic(path, text, strlen(text));
  free(text);
  return st;
}
