/* Expert buffering for the language model (moe.h, moe serve --cache K): each MoE layer of a loaded
 * model is swapped for one with external experts, served by an expert cache of K slots over the
 * checkpoint's model.safetensors or the shards of its index (read lazily: the family's tensor per
 * expert, or gpt-oss's fused tensors, lm_stream.c's moe__lm_open_cache); the experts' parameters are
 * freed. The outputs are the all-resident model's, bit for bit (sources/cache.c computes each expert
 * with the same kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_gguf.h"
#include "lm_stream.h"

/* Ref pointers into old layer o moved to the same tensor of l (same name, same offset in it), or NULL
 * where l has no such tensor (the experts, left in the file). */
static void retarget(float **p, const moe_layer_t *o, float *obase, moe_layer_t *l, float *lbase) {
  if (!*p || !obase || *p < obase || *p >= obase + o->numel) return;
  size_t at = (size_t)(*p - obase);
  for (int k = 0; k < o->nparams; k++) {
    const moe_param_info *in = &o->info[k];
    if (at < in->offset || at >= in->offset + in->numel) continue;
    const moe_param_info *to = moe_layer_param_find(l, in->name);
    *p = to ? lbase + to->offset + (at - in->offset) : NULL;
    return;
  }
}

/* MoE layer i with its experts from x->caches[i]: a layer with external experts taking the old one's
 * other tensors (router, biases, shared experts), and the model's refs moved to them. */
static moe_status buffer_layer(moe_lm_t *m, moe__lm_shards *files, int i, int K, moe_cache_policy p,
                               moe_lm_experts *x) {
  moe_layer_t *o = &m->layers[i];
  moe_layer_config lc = o->cfg;
  lc.external_experts = 1;
  MOE_CHECK(moe__lm_open_cache(m, x, files, i, &lc, K, p));
  moe_layer_t l;
  MOE_CHECK(moe_layer_init(&l, &lc));
  for (int k = 0; k < l.nparams; k++) {
    const moe_param_info *from = moe_layer_param_find(o, l.info[k].name);
    if (from) memcpy(l.params + l.info[k].offset, o->params + from->offset, l.info[k].numel * sizeof(float));
  }
  moe_layer_params_changed(&l);
  moe_status st = moe_layer_set_expert_cache(&l, x->caches[i]);
  if (st != MOE_OK) return moe_layer_free(&l), st;
  for (int r = 0; r < m->nrefs; r++) {
    retarget(&m->refs[r].data, o, o->params, &l, l.params);
    retarget(&m->refs[r].grad, o, o->grads, &l, l.grads);
  }
  moe_layer_free(o);
  *o = l;
  return MOE_OK;
}

moe_status moe_lm_buffer_experts(moe_lm_t *m, const char *dir, int K, moe_cache_policy p, moe_lm_experts *x) {
  MOE_TRY(m && m->layers && dir && x, MOE_ERR_ARG, "moe_lm_buffer_experts: NULL argument");
  MOE_TRY(!moe__lm_gguf_is(dir), MOE_ERR_ARG,
          "moe_lm_buffer_experts: %s: expert buffering reads a checkpoint directory's safetensors files; GGUF files "
          "are not supported", dir);
  MOE_TRY(!m->cfg.moe.dist, MOE_ERR_ARG, "moe_lm_buffer_experts: one process only (no expert parallelism)");
  memset(x, 0, sizeof *x);
  moe__lm_shards *files = NULL;
  x->n = m->cfg.n_layers;
  x->caches = calloc((size_t)x->n, sizeof *x->caches);
  moe_status st = x->caches ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert caches: out of memory");
  if (st == MOE_OK) st = moe__lm_shards_open(&files, dir, 0);
  for (int i = 0; i < x->n && st == MOE_OK; i++)
    if (!moe_lm_layer_dense(&m->cfg, i)) st = buffer_layer(m, files, i, K, p, x);
  moe__lm_shards_release(files); /* the caches hold them */
  if (st != MOE_OK) moe_lm_experts_free(x); /* the layers swapped so far stay, without their caches: m is only to free */
  return st;
}

void moe_lm_experts_free(moe_lm_experts *x) {
  for (int i = 0; x->caches && i < x->n; i++) moe_expert_cache_free(x->caches[i]);
  free(x->caches);
  moe__lm_prefetch_free(x->prefetch);
  memset(x, 0, sizeof *x);
}
