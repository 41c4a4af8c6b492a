/* Expert buffering: a layer whose experts stay in a lazily opened safetensors file and pass through
 * K slots gives the same outputs, bit for bit, as the all-resident layer, for every K and policy, over
 * several batches (so that evictions happen); the loader reports what the policy implies; resident
 * memory is K experts. */
#include <stdlib.h>
#include <unistd.h>

#include "test.h"

/* Writes l's parameters and options to path. */
static moe_status save_layer(const moe_layer_t *l, const char *path) {
  moe_st_writer *w;
  moe_status st = moe_st_writer_new(&w);
  if (st == MOE_OK) st = moe_layer_save_params(l, w);
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  return st;
}

TEST(buffer_equals_all_resident) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16; c.H = 24; c.E = 8; c.top_k = 2; c.act = MOE_ACT_SWIGLU; c.threads = 2;
  moe_layer_t full;
  ASSERT_OK(moe_layer_init(&full, &c));
  moe_layer_init_params(&full, 3);
  float *g = moe_layer_param(&full, "gate.weight");
  for (int i = 0; i < c.E * c.D; i++) g[i] *= 4.0f; /* uneven routing: some experts idle per batch */
  char path[512];
  test_tmp_path("buffer_w.safetensors", path, sizeof path);
  ASSERT_OK(save_layer(&full, path));
  moe_st *f;
  ASSERT_OK(moe_st_open_lazy(&f, path));
  enum { T = 12, BATCHES = 6 };
  float x[BATCHES][T * 16], y0[T * 16], y1[T * 16];
  uint64_t s = 11;
  for (int b = 0; b < BATCHES; b++)
    for (int i = 0; i < T * 16; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x[b][i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
    }
  const moe_cache_policy pol[3] = {MOE_CACHE_LIFO, MOE_CACHE_LRU, MOE_CACHE_FIFO};
  for (int K = 1; K <= c.E; K++)
    for (int p = 0; p < 3; p++) {
      moe_layer_config cb = c;
      cb.external_experts = 1;
      moe_layer_t lb;
      ASSERT_OK(moe_layer_init(&lb, &cb));
      ASSERT_EQ_INT(lb.nparams, 2); /* the gate only */
      memcpy(lb.params, full.params, lb.numel * 4); /* gate.weight, gate.bias come first in both */
      moe_expert_cache *cache;
      ASSERT_OK(moe_expert_cache_open(&cache, f, "experts.", &cb, K, pol[p]));
      ASSERT_OK(moe_layer_set_expert_cache(&lb, cache));
      int64_t active = 0;
      int same = 1;
      int32_t counts[BATCHES * 8];
      for (int b = 0; b < BATCHES; b++) {
        moe_layer_stats st;
        ASSERT_OK(moe_layer_forward(&full, x[b], T, y0, NULL, &st));
        for (int e = 0; e < c.E; e++) active += st.expert_counts[e] > 0;
        memcpy(counts + b * 8, st.expert_counts, sizeof(int32_t) * 8);
        ASSERT_OK(moe_layer_forward(&lb, x[b], T, y1, NULL, &st));
        same &= !memcmp(y0, y1, sizeof y0);
      }
      moe_expert_cache_stats cs;
      moe_expert_cache_get_stats(cache, &cs);
      moe_expert_cache_free(cache);
      moe_layer_free(&lb);
      if (!same) FAIL_("K=%d policy %s: buffered output differs from the all-resident one", K, moe_cache_policy_name(pol[p]));
      ASSERT_EQ_INT(cs.accesses, active);
      /* the cache misses exactly what the simulator of the same policy predicts for this trace */
      moe_trace tr = {.steps = BATCHES, .layers = 1, .experts = 8, .tokens = counts};
      int64_t acc_sim, miss_sim;
      ASSERT_OK(moe_cachesim(&tr, 0, 0, BATCHES, pol[p], K, &acc_sim, &miss_sim));
      ASSERT_EQ_INT(acc_sim, cs.accesses);
      if (miss_sim != cs.misses)
        FAIL_("K=%d %s: the cache missed %lld times, the simulator says %lld", K, moe_cache_policy_name(pol[p]),
              (long long)cs.misses, (long long)miss_sim);
      ASSERT(cs.misses >= (K < c.E ? K : 1) && cs.misses <= cs.accesses);
      if (K == c.E) ASSERT(cs.misses <= c.E); /* everything fits: each expert loads once */
      ASSERT_EQ_INT(cs.resident_bytes, (size_t)K * cs.expert_bytes);
      ASSERT(cs.expert_bytes >= (size_t)(3 * 24 * 16 + 24 + 16) * 4);
    }
  moe_st_close(f);
  moe_layer_free(&full);
}

TEST(buffer_rejects_bad_setups) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 4; c.H = 4; c.E = 4; c.external_experts = 1;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &c));
  float x[4 * 4] = {0}, y[4 * 4];
  ASSERT_STATUS(moe_layer_forward(&l, x, 4, y, NULL, NULL), MOE_ERR_STATE); /* no cache attached */
  moe_layer_free(&l);
  c.dispatch = MOE_DISPATCH_STATIC;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  /* a file without the expert tensors */
  char path[512];
  test_tmp_path("buffer_bad.safetensors", path, sizeof path);
  moe_st_writer *w;
  ASSERT_OK(moe_st_writer_new(&w));
  int64_t shp[1] = {4};
  ASSERT_OK(moe_st_writer_add(w, "other", MOE_DT_F32, 1, shp, x));
  ASSERT_OK(moe_st_writer_save(w, path));
  moe_st_writer_free(w);
  moe_st *f;
  ASSERT_OK(moe_st_open_lazy(&f, path));
  moe_expert_cache *cache = NULL;
  c.dispatch = MOE_DISPATCH_DYNAMIC;
  ASSERT_STATUS(moe_expert_cache_open(&cache, f, "experts.", &c, 2, MOE_CACHE_LIFO), MOE_ERR_MISSING);
  ASSERT(strstr(moe_last_error(), "experts.fc1.weight"));
  ASSERT_STATUS(moe_expert_cache_open(&cache, f, "experts.", &c, 0, MOE_CACHE_LIFO), MOE_ERR_ARG);
  ASSERT_STATUS(moe_expert_cache_open(&cache, f, "experts.", &c, 2, MOE_CACHE_BELADY), MOE_ERR_ARG);
  moe_st_close(f);
}

/* A checkpoint served with K slots per block gives the losses and predictions of the fully loaded
 * model, bit for bit, for every K; backward is refused. */
TEST(buffer_model_serving_equals_loaded) {
  moe_model_config c;
  moe_model_config_default(&c);
  c.in_dim = 20; c.classes = 5; c.blocks = 2;
  c.moe.D = 16; c.moe.H = 24; c.moe.E = 6; c.moe.top_k = 2; c.moe.act = MOE_ACT_GELU; c.moe.threads = 2;
  moe_model_t m;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 5);
  char path[512];
  test_tmp_path("buffer_model.safetensors", path, sizeof path);
  ASSERT_OK(moe_checkpoint_save(path, &m, NULL, NULL));
  moe_model_free(&m);
  enum { B = 40 };
  float x[B * 20];
  uint8_t y[B];
  uint64_t s = 9;
  for (int i = 0; i < B * 20; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
  for (int i = 0; i < B; i++) y[i] = (uint8_t)(i % 5);
  moe_model_t full;
  ASSERT_OK(moe_checkpoint_load(path, &full, NULL, NULL));
  moe_model_stats sf;
  int32_t pf[B];
  ASSERT_OK(moe_model_forward(&full, x, y, B, &sf));
  memcpy(pf, moe_model_predictions(&full), sizeof pf);
  moe_model_free(&full);
  for (int K = 1; K <= c.moe.E; K++) {
    moe_model_t sv;
    ASSERT_OK(moe_checkpoint_load_serving(path, &sv, K, MOE_CACHE_LIFO));
    moe_model_stats ss;
    moe_status st = MOE_OK;
    for (int rep = 0; rep < 2 && st == MOE_OK; rep++) st = moe_model_forward(&sv, x, y, B, &ss);
    int same = st == MOE_OK && ss.loss == sf.loss && ss.aux == sf.aux &&
               !memcmp(pf, moe_model_predictions(&sv), sizeof pf);
    moe_status bw = moe_model_backward(&sv);
    moe_expert_cache_stats cs;
    moe_expert_cache_get_stats(sv.caches[0], &cs);
    moe_model_free(&sv);
    ASSERT_OK(st);
    if (!same) FAIL_("K=%d: served loss %.9g, loaded %.9g", K, ss.loss, sf.loss);
    ASSERT(bw != MOE_OK);
    ASSERT_EQ_INT(cs.resident_bytes, (size_t)K * cs.expert_bytes);
  }
  moe_model_t bad;
  ASSERT_STATUS(moe_checkpoint_load_serving("/nonexistent.safetensors", &bad, 2, MOE_CACHE_LIFO), MOE_ERR_IO);
}

/* A load that fails (the file shrank) is reported, and nothing of it stays: once the file is back,
 * the next batches reload and equal the all-resident layer. */
TEST(buffer_recovers_from_a_failed_load) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 8; c.H = 8; c.E = 4; c.top_k = 2; c.threads = 1;
  moe_layer_t full;
  ASSERT_OK(moe_layer_init(&full, &c));
  moe_layer_init_params(&full, 4);
  char path[512], save[600];
  test_tmp_path("buffer_fail.safetensors", path, sizeof path);
  snprintf(save, sizeof save, "%s.keep", path);
  ASSERT_OK(save_layer(&full, path));
  moe_st *f;
  ASSERT_OK(moe_st_open_lazy(&f, path));
  moe_layer_config cb = c;
  cb.external_experts = 1;
  moe_layer_t lb;
  ASSERT_OK(moe_layer_init(&lb, &cb));
  memcpy(lb.params, full.params, lb.numel * 4);
  moe_expert_cache *cache;
  ASSERT_OK(moe_expert_cache_open(&cache, f, "experts.", &cb, 4, MOE_CACHE_LIFO));
  ASSERT_OK(moe_layer_set_expert_cache(&lb, cache));
  float x[16 * 8], y0[16 * 8], y1[16 * 8];
  for (int i = 0; i < 16 * 8; i++) x[i] = (float)((i * 13) % 17) / 8.5f - 1.0f;
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && truncate -s 200 '%s'", path, save, path);
  ASSERT_EQ_INT(system(cmd), 0);
  ASSERT_STATUS(moe_layer_forward(&lb, x, 16, y1, NULL, NULL), MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "expert cache"));
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", save, path);
  ASSERT_EQ_INT(system(cmd), 0);
  ASSERT_OK(moe_layer_forward(&full, x, 16, y0, NULL, NULL));
  ASSERT_OK(moe_layer_forward(&lb, x, 16, y1, NULL, NULL));
  ASSERT(!memcmp(y0, y1, sizeof y0));
  /* a cache opened for another layer shape is refused */
  moe_layer_config other = cb;
  other.H = 16;
  moe_layer_t lo;
  ASSERT_OK(moe_layer_init(&lo, &other));
  ASSERT_STATUS(moe_layer_set_expert_cache(&lo, cache), MOE_ERR_SHAPE);
  moe_layer_free(&lo);
  moe_expert_cache_free(cache);
  moe_layer_free(&lb);
  moe_layer_free(&full);
  moe_st_close(f);
}
