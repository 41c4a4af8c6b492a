/* A checkpoint directory's safetensors files (lm_shards.h): the index's weight_map says which shard
 * holds each tensor; a shard is opened lazily once and kept (one descriptor) while any holder of s
 * remains. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "formats/json.h"
#include "lm_shards.h"

#define MAX_SHARDS 4096

void moe__lm_shards_release(moe__lm_shards *s) {
  if (!s || --s->refs) return;
  for (int i = 0; i < s->n; i++) {
    moe_st_close(s->files[i]);
    free(s->names[i]);
  }
  free(s->files), free(s->names), free(s->dir);
  cJSON_Delete(s->index);
  free(s);
}

/* Names file `name` of dir as the next file (not opened yet). */
static moe_status add_file(moe__lm_shards *s, const char *name) {
  MOE_TRY(!strchr(name, '/'), MOE_ERR_FORMAT, "%s/" MOE_LM_INDEX_JSON ": shard '%s' is not a file name in the directory",
          s->dir, name);
  MOE_TRY(s->n < MAX_SHARDS, MOE_ERR_FORMAT, "%s/" MOE_LM_INDEX_JSON ": more than %d shards", s->dir, MAX_SHARDS);
  if (!s->n) {
    s->names = calloc(MAX_SHARDS, sizeof *s->names);
    s->files = calloc(MAX_SHARDS, sizeof *s->files);
    MOE_TRY(s->names && s->files, MOE_ERR_NOMEM, "out of memory");
  }
  MOE_TRY(s->names[s->n] = strdup(name), MOE_ERR_NOMEM, "out of memory");
  s->n++;
  return MOE_OK;
}

/* The first tensor the index says file i holds (for an error opening it), or NULL. */
static const char *first_tensor(const moe__lm_shards *s, int i) {
  const cJSON *it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(s->index, "weight_map"))
    if (!strcmp(it->valuestring, s->names[i])) return it->string;
  return NULL;
}

/* File i, opened if it is not yet; `what`: the tensor it is opened for (NULL: the index's first of it),
 * for the error. */
static moe_status open_file(moe__lm_shards *s, int i, const char *what) {
  if (s->files[i]) return MOE_OK;
  if (!what && s->index) what = first_tensor(s, i);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", s->dir, s->names[i]);
  moe_status st = moe_st_open_lazy(&s->files[i], path);
  MOE_TRY(st == MOE_OK || !what, st, "shard '%s' of tensor '%s' (%s/" MOE_LM_INDEX_JSON "): %s", s->names[i], what,
          s->dir, moe_last_error());
  return st;
}

/* Whether dir has an index (its checkpoint is sharded). */
static int indexed(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" MOE_LM_INDEX_JSON, dir);
  return access(path, F_OK) == 0;
}

static moe_status read_index(moe__lm_shards *s) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" MOE_LM_INDEX_JSON, s->dir);
  if (!indexed(s->dir)) return add_file(s, "model.safetensors");
  cJSON *root;
  MOE_CHECK(moe__json_read(path, "index", (size_t)1 << 26, &root));
  s->index = root;
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map"), *it;
  MOE_TRY(cJSON_IsObject(map), MOE_ERR_FORMAT, "%s: no \"weight_map\" object", path);
  cJSON_ArrayForEach(it, map) {
    MOE_TRY(cJSON_IsString(it), MOE_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", path, it->string);
    int seen = 0;
    for (int i = 0; i < s->n && !seen; i++) seen = !strcmp(s->names[i], it->valuestring);
    if (!seen) MOE_CHECK(add_file(s, it->valuestring));
  }
  return MOE_OK;
}

moe_status moe__lm_shards_open(moe__lm_shards **out, const char *dir, int all) {
  *out = NULL; /* on an error too: the caller may release it */
  moe__lm_shards *s = calloc(1, sizeof *s);
  MOE_TRY(s, MOE_ERR_NOMEM, "%s: out of memory", dir);
  s->refs = 1;
  moe_status st = (s->dir = strdup(dir)) ? read_index(s) : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory");
  for (int i = 0; st == MOE_OK && all && i < s->n; i++) st = open_file(s, i, NULL);
  if (st != MOE_OK) {
    moe__lm_shards_release(s);
    return st;
  }
  *out = s;
  return MOE_OK;
}

/* The index of the file holding `name`, or -1 when the index does not name it. */
static int file_index(const moe__lm_shards *s, const char *name) {
  if (!s->index) return 0;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s->index, "weight_map"), name);
  for (int i = 0; v && i < s->n; i++)
    if (!strcmp(s->names[i], v->valuestring)) return i;
  return -1;
}

moe_status moe__lm_shard_of(moe__lm_shards *s, const char *name, moe_st **f) {
  int i = file_index(s, name);
  MOE_TRY(i >= 0, MOE_ERR_MISSING, "%s/" MOE_LM_INDEX_JSON ": no tensor '%s' in weight_map", s->dir, name);
  MOE_CHECK(open_file(s, i, name));
  *f = s->files[i];
  return MOE_OK;
}

static moe_status files_of(void *ctx, const char *name, int required, const moe_st **f) {
  moe__lm_shards *s = ctx;
  moe_st *file;
  *f = NULL;
  if (!required && file_index(s, name) < 0) return MOE_OK; /* the index names no such tensor */
  MOE_CHECK(moe__lm_shard_of(s, name, &file));
  *f = required || moe_st_has(file, name) ? file : NULL;
  return MOE_OK;
}

static void files_release(void *ctx) { moe__lm_shards_release(ctx); }

void moe__lm_shards_files(moe__lm_shards *s, moe__st_files *fs) {
  s->refs++;
  *fs = (moe__st_files){s, files_of, files_release};
}
