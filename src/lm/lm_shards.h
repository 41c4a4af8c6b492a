/* A checkpoint directory's safetensors files (lm_shards.c): its one model.safetensors, or the shards
 * model.safetensors.index.json names, each opened lazily (moe_st_open_lazy: its header) once, on its
 * first tensor or all at open. Shared by reference: the resident loader holds it for a load, and each
 * streamed layer's expert cache or converter's expert reader takes a reference (moe__lm_shards_files),
 * so the files stay open, one descriptor each, until the last of them is freed. */
#ifndef MOE_LM_SHARDS_H
#define MOE_LM_SHARDS_H

#include "moe.h"
#include "sources/cache_reader.h"

#define MOE_LM_INDEX_JSON "model.safetensors.index.json"

typedef struct {
  char *dir;
  void *index;    /* the index's JSON (its weight_map), or NULL for one file */
  int n;          /* files named (the index's distinct shards, or 1) */
  char **names;   /* (n) file names in dir */
  moe_st **files; /* (n) each, or NULL until its first tensor */
  int refs;
} moe__lm_shards;

/* dir's files; all: open each now (a missing or malformed one is an error here). *out NULL on an error. */
moe_status moe__lm_shards_open(moe__lm_shards **out, const char *dir, int all);
void moe__lm_shards_release(moe__lm_shards *s);
/* The file holding tensor `name` into *f, opened now if it was not (an error names the shard and the
 * tensor); a name the index lacks is an error naming both, and with one file every name is its. */
moe_status moe__lm_shard_of(moe__lm_shards *s, const char *name, moe_st **f);
/* s as the expert readers' files (cache_reader.h), taking a reference that fs's release drops. */
void moe__lm_shards_files(moe__lm_shards *s, moe__st_files *fs);

#endif
