/* Expert buffering for the language model (moe.h, moe serve --cache K): each MoE layer of a loaded
 * model is swapped for one with external experts, served by an expert cache of K slots over the
 * checkpoint's model.safetensors (Mixtral's tensor per expert, read lazily); the experts' parameters
 * are freed. The outputs are the all-resident model's, bit for bit (sources/cache.c computes each expert with
 * the same kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_gguf.h"
#include "lm_stream.h"

/* Layer i's gate ref, and its experts' refs (whose data go away with the old layer). */
static void retarget_refs(moe_lm_t *m, int i, moe_layer_t *l) {
  char gate[96], experts[96];
  snprintf(gate, sizeof gate, "model.layers.%d.block_sparse_moe.gate.weight", i);
  snprintf(experts, sizeof experts, "model.layers.%d.block_sparse_moe.experts.", i);
  for (int r = 0; r < m->nrefs; r++) {
    moe_tensor_ref *ref = &m->refs[r];
    if (!strcmp(ref->name, gate)) ref->data = moe_layer_param(l, "gate.weight"), ref->grad = moe_layer_grad(l, "gate.weight");
    else if (!strncmp(ref->name, experts, strlen(experts))) ref->data = ref->grad = NULL;
  }
}

/* Layer i with its experts from x->caches[i]. */
static moe_status buffer_layer(moe_lm_t *m, int i, int K, moe_cache_policy p, moe_lm_experts *x) {
  moe_layer_config lc = m->layers[i].cfg;
  lc.external_experts = 1;
  char prefix[96];
  snprintf(prefix, sizeof prefix, "model.layers.%d.block_sparse_moe.experts.", i);
  MOE_CHECK(moe_expert_cache_open(&x->caches[i], x->file, prefix, &lc, K, p));
  moe_layer_t l;
  MOE_CHECK(moe_layer_init(&l, &lc));
  memcpy(moe_layer_param(&l, "gate.weight"), moe_layer_param(&m->layers[i], "gate.weight"),
         (size_t)lc.E * lc.D * sizeof(float));
  moe_layer_params_changed(&l);
  moe_status st = moe_layer_set_expert_cache(&l, x->caches[i]);
  if (st != MOE_OK) return moe_layer_free(&l), st;
  moe_layer_free(&m->layers[i]);
  m->layers[i] = l;
  retarget_refs(m, i, &m->layers[i]);
  return MOE_OK;
}

moe_status moe_lm_buffer_experts(moe_lm_t *m, const char *dir, int K, moe_cache_policy p, moe_lm_experts *x) {
  MOE_TRY(m && m->layers && dir && x, MOE_ERR_ARG, "moe_lm_buffer_experts: NULL argument");
  MOE_TRY(m->cfg.family == MOE_LM_MIXTRAL, MOE_ERR_ARG,
          "moe_lm_buffer_experts: expert buffering reads Mixtral's expert tensors (block_sparse_moe.experts.<e>.w1); "
          "a %s model is not supported", moe_lm_family_name(m->cfg.family));
  MOE_TRY(!moe__lm_gguf_is(dir), MOE_ERR_ARG,
          "moe_lm_buffer_experts: %s: expert buffering reads a checkpoint directory's model.safetensors; GGUF files "
          "are not supported", dir);
  memset(x, 0, sizeof *x);
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  MOE_CHECK(moe_st_open_lazy(&x->file, path));
  x->n = m->cfg.n_layers;
  x->caches = calloc((size_t)x->n, sizeof *x->caches);
  moe_status st = x->caches ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert caches: out of memory");
  for (int i = 0; i < x->n && st == MOE_OK; i++) st = buffer_layer(m, i, K, p, x);
  if (st != MOE_OK) moe_lm_experts_free(x); /* the layers swapped so far stay, without their caches: m is only to free */
  return st;
}

void moe_lm_experts_free(moe_lm_experts *x) {
  for (int i = 0; x->caches && i < x->n; i++) moe_expert_cache_free(x->caches[i]);
  free(x->caches);
  moe__lm_prefetch_free(x->prefetch);
  moe_st_close(x->file);
  memset(x, 0, sizeof *x);
}
