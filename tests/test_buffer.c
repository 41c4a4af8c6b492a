/* Expert buffering: a layer whose experts stay in a lazily opened safetensors file and pass through
 * K slots gives the same outputs, bit for bit, as the all-resident layer, for every K and policy, over
 * several batches (so that evictions happen), in f32 and in bf16, whether the file stores the expert
 * matrices as F32 or BF16; the loader reports what the policy implies; resident memory is K slots,
 * and a bf16 slot holds the matrices at 2 bytes a value (about half an f32 slot). */
#include <stdlib.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "run_cli.h"
#include "sources/cache_reader.h"
#include "synth.h"
#include "test.h"

/* Writes l's parameters and options to path, the expert matrices stored as dt (F32 or BF16). */
static moe_status save_layer(const moe_layer_t *l, moe_dtype dt, const char *path) {
  moe_layer_t as = *l; /* the same tensors under another dtype: the writer reads cfg.dtype only */
  as.cfg.dtype = dt;
  moe_st_writer *w;
  moe_status st = moe_st_writer_new(&w);
  if (st == MOE_OK) st = moe_layer_save_params(&as, w);
  if (st == MOE_OK) st = moe_st_writer_save(w, path);
  moe_st_writer_free(w);
  return st;
}

/* Rounds a (n) to bf16 in place, so that storing it as BF16 loses nothing. */
static void bf16_exact(float *a, size_t n) {
  uint16_t *b = malloc(n * 2 + 2);
  moe_bf16_from_f32(b, a, n);
  moe_bf16_to_f32(a, b, n);
  free(b);
}

/* The bytes of one slot of a cache opened for c: matrices at the dtype's size, biases at 4, each
 * tensor padded to 64 bytes. */
static size_t slot_bytes(const moe_layer_config *c) {
  size_t m = c->dtype == MOE_DT_BF16 ? 2 : 4, HD = (size_t)c->H * c->D;
#define PAD64(b) (((b) + 63) & ~(size_t)63)
  return PAD64(HD * m) * (c->act == MOE_ACT_RELU ? 2 : 3) +
         (c->expert_bias ? PAD64((size_t)c->H * 4) * (c->act == MOE_ACT_SWIGLU_OAI ? 2 : 1) + PAD64((size_t)c->D * 4) : 0);
#undef PAD64
}

/* A layer of dtype dt whose file stores the expert matrices as fdt, served through K slots for every
 * K and policy over several batches, equals the all-resident layer of dtype dt bit for bit (an f32
 * layer reading a BF16 file is given bf16-exact weights, which the file then holds exactly). */
static void check_equals_all_resident(int *failed_, moe_dtype dt, moe_dtype fdt, moe_act act) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16; c.H = 24; c.E = 8; c.top_k = 2; c.act = act; c.threads = 2; c.dtype = dt;
  c.swiglu_limit = 0.5f; /* swiglu_oai: some values clamp */
  moe_layer_t full;
  ASSERT_OK(moe_layer_init(&full, &c));
  moe_layer_init_params(&full, 3);
  for (int i = 0; act == MOE_ACT_SWIGLU_OAI && i < full.nparams; i++) /* biases that count, fc3's too */
    if (full.info[i].ndim == 2 && !strncmp(full.info[i].name, "experts.", 8))
      for (size_t j = 0; j < full.info[i].numel; j++) full.params[full.info[i].offset + j] = 0.01f * (float)(j % 7) - 0.03f;
  float *g = moe_layer_param(&full, "gate.weight");
  for (int i = 0; i < c.E * c.D; i++) g[i] *= 4.0f; /* uneven routing: some experts idle per batch */
  if (dt == MOE_DT_F32 && fdt == MOE_DT_BF16)
    for (int i = 0; i < full.nparams; i++)
      if (full.info[i].ndim == 3) bf16_exact(full.params + full.info[i].offset, full.info[i].numel);
  moe_layer_params_changed(&full);
  char path[512], name[64];
  snprintf(name, sizeof name, "buffer_w_%s_%s_%s.safetensors", moe_compute_dtype_name(dt), moe_dtype_name(fdt),
           moe_act_name(act));
  test_tmp_path(name, path, sizeof path);
  ASSERT_OK(save_layer(&full, fdt, path));
  moe_st *f;
  ASSERT_OK(moe_st_open_lazy(&f, path));
  moe_tensor_view v;
  ASSERT_OK(moe_st_get(f, "experts.fc1.weight", &v));
  ASSERT_EQ_INT(v.dtype, fdt);
  enum { T = 12, BATCHES = 6 };
  float x[BATCHES][T * 16], y0[T * 16], y1[T * 16];
  uint64_t s = 11;
  for (int b = 0; b < BATCHES; b++)
    for (int i = 0; i < T * 16; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x[b][i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
    }
  const moe_cache_policy pol[5] = {MOE_CACHE_LIFO, MOE_CACHE_LRU, MOE_CACHE_FIFO, MOE_CACHE_LFU, MOE_CACHE_LFRU};
  for (int K = 1; K <= c.E; K++)
    for (int p = 0; p < 5; p++) {
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
      if (!same)
        FAIL_("%s layer, %s file, K=%d policy %s: buffered output differs from the all-resident one",
              moe_compute_dtype_name(dt), moe_dtype_name(fdt), K, moe_cache_policy_name(pol[p]));
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
      ASSERT_EQ_INT(cs.expert_bytes, slot_bytes(&c));
      ASSERT_EQ_INT(cs.dtype, dt);
    }
  moe_st_close(f);
  moe_layer_free(&full);
}

TEST(buffer_equals_all_resident) { check_equals_all_resident(failed_, MOE_DT_F32, MOE_DT_F32, MOE_ACT_SWIGLU); }
/* bf16 slots: read as they are from a BF16 file, rounded (RNE) from an F32 one, as the layer's copies */
TEST(buffer_bf16_equals_all_resident) { check_equals_all_resident(failed_, MOE_DT_BF16, MOE_DT_BF16, MOE_ACT_SWIGLU); }
TEST(buffer_bf16_from_f32_file_equals_all_resident) {
  check_equals_all_resident(failed_, MOE_DT_BF16, MOE_DT_F32, MOE_ACT_SWIGLU);
}
/* an f32 layer widens a BF16 file */
TEST(buffer_f32_from_bf16_file_equals_all_resident) {
  check_equals_all_resident(failed_, MOE_DT_F32, MOE_DT_BF16, MOE_ACT_SWIGLU);
}
/* gpt-oss's clamped SwiGLU: fc3.bias in the slot too */
TEST(buffer_swiglu_oai_equals_all_resident) {
  check_equals_all_resident(failed_, MOE_DT_F32, MOE_DT_F32, MOE_ACT_SWIGLU_OAI);
}

/* A layer of 8 experts (uneven routing: some idle on x) saved to a file, and the same layer with external
 * experts through a cache of 8 slots over that file; y0 the all-resident output on x, `used` an expert
 * x runs, idle[] two it does not. */
typedef struct {
  moe_layer_t full, lb;
  moe_st *f;
  moe_expert_cache *cache;
  float x[3 * 16], y0[3 * 16];
  int used, idle[2], active;
} prefetch_case;

static void prefetch_case_open(int *failed_, prefetch_case *p, const char *file) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16; c.H = 24; c.E = 8; c.top_k = 2; c.threads = 2;
  ASSERT_OK(moe_layer_init(&p->full, &c));
  moe_layer_init_params(&p->full, 5);
  float *g = moe_layer_param(&p->full, "gate.weight");
  for (int i = 0; i < c.E * c.D; i++) g[i] *= 4.0f; /* uneven routing: some experts idle */
  moe_layer_params_changed(&p->full);
  char path[512];
  ASSERT_OK(save_layer(&p->full, MOE_DT_F32, test_tmp_path(file, path, sizeof path)));
  for (int i = 0; i < 3 * 16; i++) p->x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
  moe_layer_stats st;
  ASSERT_OK(moe_layer_forward(&p->full, p->x, 3, p->y0, NULL, &st));
  int ni = 0;
  p->used = -1, p->active = 0;
  for (int e = 0; e < c.E; e++)
    if (st.expert_counts[e] > 0) p->used = p->used < 0 ? e : p->used, p->active++;
    else if (ni < 2) p->idle[ni++] = e;
  ASSERT(p->used >= 0 && ni == 2);
  ASSERT_OK(moe_st_open_lazy(&p->f, path));
  moe_layer_config cb = c;
  cb.external_experts = 1;
  ASSERT_OK(moe_layer_init(&p->lb, &cb));
  memcpy(p->lb.params, p->full.params, p->lb.numel * 4); /* the gate */
  ASSERT_OK(moe_expert_cache_open(&p->cache, p->f, "experts.", &cb, c.E, MOE_CACHE_LRU));
  ASSERT_OK(moe_layer_set_expert_cache(&p->lb, p->cache));
}

/* The cache's stats, then everything freed. */
static moe_expert_cache_stats prefetch_case_close(prefetch_case *p) {
  moe_expert_cache_stats cs;
  moe_expert_cache_get_stats(p->cache, &cs);
  moe_expert_cache_free(p->cache);
  moe_layer_free(&p->lb);
  moe_layer_free(&p->full);
  moe_st_close(p->f);
  return cs;
}

/* A forward drops the queued prefetches of experts it does not run: with the loader held until then,
 * prefetching one expert the batch runs and two it does not reads only the batch's experts (each once),
 * and the output is the all-resident layer's. */
TEST(buffer_forward_drops_unneeded_prefetches) {
  static prefetch_case p;
  prefetch_case_open(failed_, &p, "buffer_prefetch.safetensors");
  if (*failed_) return;
  float y1[3 * 16];
  moe__expert_cache_hold_loads(p.cache);
  ASSERT_OK(moe_expert_cache_prefetch(p.cache, (int[3]){p.idle[0], p.used, p.idle[1]}, 3));
  moe_status fs = moe_layer_forward(&p.lb, p.x, 3, y1, NULL, NULL);
  moe_expert_cache_stats cs = prefetch_case_close(&p);
  ASSERT_OK(fs);
  ASSERT(!memcmp(p.y0, y1, sizeof y1));
  if (cs.loads != p.active || cs.misses != p.active - 1 || cs.prefetches != 3)
    FAIL_("%d experts active, one prefetched among them: %lld loads (want %d), %lld misses, %lld prefetches",
          p.active, (long long)cs.loads, p.active, (long long)cs.misses, (long long)cs.prefetches);
}

/* The rule of MOE_PREFETCH_AUTO: a read ahead pays when p min(r, w) > (1 - p) max(r - w, 0). */
TEST(buffer_prefetch_pays_rule) {
  ASSERT(!moe__prefetch_pays(0.66, 0.45, 0.03)); /* a 352 MB expert off a 0.8 GB/s disk: not at 2 in 3 */
  ASSERT(moe__prefetch_pays(0.95, 0.45, 0.03));  /* 0.95 x 0.03 > 0.05 x 0.42 */
  ASSERT(!moe__prefetch_pays(0.9, 0.45, 0.03));  /* 0.9 x 0.03 < 0.1 x 0.42 */
  ASSERT(moe__prefetch_pays(0.1, 0.001, 0.01));  /* the read hides in the compute: any precision above 0 */
  ASSERT(!moe__prefetch_pays(0.0, 0.001, 0.01));
  ASSERT(!moe__prefetch_pays(0.9, 0.0, 0.01));   /* nothing measured yet */
  ASSERT(!moe__prefetch_pays(0.9, 0.01, 0.0));
}

/* MOE_PREFETCH_AUTO with its costs fixed (moe__expert_cache_set_costs): nothing is read ahead before a
 * forward has scored a prediction; at precision 1/2, a read that hides in the compute is read ahead and
 * one ten times longer than the compute is not (each counted in prefetch_skipped); the predictions are
 * scored all the same, and the outputs are the all-resident layer's. */
TEST(buffer_prefetch_auto_reads_what_pays) {
  static prefetch_case p;
  prefetch_case_open(failed_, &p, "buffer_prefetch_auto.safetensors");
  if (*failed_) return;
  float y1[3 * 16], y2[3 * 16];
  ASSERT_STATUS(moe_expert_cache_set_prefetch(p.cache, (moe_prefetch_mode)7), MOE_ERR_ARG); /* kept: ON */
  ASSERT(strstr(moe_last_error(), "mode 7 is not"));
  ASSERT_OK(moe_expert_cache_set_prefetch(p.cache, MOE_PREFETCH_AUTO));
  moe__expert_cache_set_costs(p.cache, 0.01, 1.0);
  moe_expert_cache_stats a, b, c;
  moe_status st = moe_expert_cache_prefetch(p.cache, (int[2]){p.idle[0], p.used}, 2); /* no precision yet */
  moe_expert_cache_get_stats(p.cache, &a);
  if (st == MOE_OK) st = moe_layer_forward(&p.lb, p.x, 3, y1, NULL, NULL); /* scores 1 of 2 */
  if (st == MOE_OK) st = moe_expert_cache_prefetch(p.cache, &p.idle[1], 1); /* hides in the compute */
  moe_expert_cache_get_stats(p.cache, &b);
  moe__expert_cache_set_costs(p.cache, 10.0, 1.0);
  if (st == MOE_OK) st = moe_expert_cache_prefetch(p.cache, &p.idle[0], 1); /* 0.5 x 1 < 0.5 x 9 */
  if (st == MOE_OK) st = moe_layer_forward(&p.lb, p.x, 3, y2, NULL, NULL);
  c = prefetch_case_close(&p);
  ASSERT_OK(st);
  ASSERT(!memcmp(p.y0, y1, sizeof y1) && !memcmp(p.y0, y2, sizeof y2));
  ASSERT_EQ_INT(a.prefetches, 0);
  ASSERT_EQ_INT(a.prefetch_skipped, 2);
  ASSERT_EQ_INT(b.predicted, 2);
  ASSERT_EQ_INT(b.predicted_hit, 1);
  ASSERT_EQ_INT(b.prefetches, 1);
  ASSERT_EQ_INT(b.prefetch_skipped, 2);
  ASSERT_EQ_INT(c.prefetches, 1);
  ASSERT_EQ_INT(c.prefetch_skipped, 3);
  ASSERT_EQ_INT(c.predicted, 3); /* the third prediction (it replaced the second) scored at the second forward */
  ASSERT(c.read_seconds > 0 && c.loads >= p.active);
}

/* A bf16 slot takes the matrices at 2 bytes and the biases at 4: about half an f32 slot, exactly
 * when the tensors fill whole 64-byte lines; a cache serves only a layer of its dtype. */
TEST(buffer_bf16_slot_bytes) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16; c.H = 32; c.E = 4; c.act = MOE_ACT_SWIGLU; c.threads = 1;
  moe_layer_t full;
  ASSERT_OK(moe_layer_init(&full, &c));
  moe_layer_init_params(&full, 8);
  char path[512];
  test_tmp_path("buffer_bytes.safetensors", path, sizeof path);
  ASSERT_OK(save_layer(&full, MOE_DT_F32, path));
  moe_st *f;
  ASSERT_OK(moe_st_open_lazy(&f, path));
  size_t bytes[2];
  moe_expert_cache *cache[2];
  moe_layer_t lb[2];
  for (int i = 0; i < 2; i++) {
    moe_layer_config cb = c;
    cb.external_experts = 1;
    cb.dtype = i ? MOE_DT_BF16 : MOE_DT_F32;
    ASSERT_OK(moe_layer_init(&lb[i], &cb));
    ASSERT_OK(moe_expert_cache_open(&cache[i], f, "experts.", &cb, 3, MOE_CACHE_LRU));
    moe_expert_cache_stats cs;
    moe_expert_cache_get_stats(cache[i], &cs);
    ASSERT_EQ_INT(cs.dtype, cb.dtype);
    ASSERT_EQ_INT(cs.resident_bytes, 3 * cs.expert_bytes);
    bytes[i] = cs.expert_bytes;
  }
  size_t HD = 32 * 16, bias = (32 + 16) * 4;
  ASSERT_EQ_INT(bytes[0], 3 * HD * 4 + bias);
  ASSERT_EQ_INT(bytes[1], 3 * HD * 2 + bias);
  ASSERT(2 * bytes[1] > bytes[0] && 2 * bytes[1] < bytes[0] + 2 * bias); /* half, but for the biases */
  /* a cache holds one dtype: the other layer's is refused */
  ASSERT_STATUS(moe_layer_set_expert_cache(&lb[1], cache[0]), MOE_ERR_SHAPE);
  ASSERT_STATUS(moe_layer_set_expert_cache(&lb[0], cache[1]), MOE_ERR_SHAPE);
  ASSERT_OK(moe_layer_set_expert_cache(&lb[1], cache[1]));
  for (int i = 0; i < 2; i++) {
    moe_layer_free(&lb[i]);
    moe_expert_cache_free(cache[i]);
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

/* A small model of dtype dt for the serving tests. */
static void small_model(moe_model_config *c, moe_dtype dt) {
  moe_model_config_default(c);
  c->in_dim = 20; c->classes = 5; c->blocks = 2;
  c->moe.D = 16; c->moe.H = 24; c->moe.E = 6; c->moe.top_k = 2; c->moe.act = MOE_ACT_GELU; c->moe.threads = 2;
  c->moe.dtype = dt;
}

enum { B = 40 };
static float bx[B * 20];
static uint8_t by[B];

static void serving_batch(void) {
  uint64_t s = 9;
  for (int i = 0; i < B * 20; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    bx[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
  }
  for (int i = 0; i < B; i++) by[i] = (uint8_t)(i % 5);
}

/* Forward of the batch: the stats and predictions of m, which is freed. */
static moe_status serve_batch(moe_model_t *m, moe_model_stats *st, int32_t *pred) {
  moe_status s = MOE_OK;
  for (int rep = 0; rep < 2 && s == MOE_OK; rep++) s = moe_model_forward(m, bx, by, B, st); /* reloads, too */
  if (s == MOE_OK) memcpy(pred, moe_model_predictions(m), sizeof(int32_t) * B);
  return s;
}

/* A checkpoint of a model of dtype dt served with K slots per block (K = 0: all resident) gives the
 * losses and predictions of the model moe_checkpoint_load gives, bit for bit, for every K; backward is
 * refused with buffered experts. */
static void check_serving_equals_loaded(int *failed_, moe_dtype dt) {
  moe_model_config c;
  small_model(&c, dt);
  moe_model_t m;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 5);
  char path[512], name[64];
  snprintf(name, sizeof name, "buffer_model_%s.safetensors", moe_compute_dtype_name(dt));
  test_tmp_path(name, path, sizeof path);
  ASSERT_OK(moe_checkpoint_save(path, &m, NULL, NULL));
  moe_model_free(&m);
  serving_batch();
  moe_model_t full;
  ASSERT_OK(moe_checkpoint_load(path, &full, NULL, NULL));
  ASSERT_EQ_INT(full.layers[0].cfg.dtype, dt);
  moe_model_stats sf;
  int32_t pf[B], ps[B];
  moe_status st = serve_batch(&full, &sf, pf);
  moe_model_free(&full);
  ASSERT_OK(st);
  for (int K = 0; K <= c.moe.E; K++) {
    moe_model_t sv;
    ASSERT_OK(moe_checkpoint_load_serving(path, &sv, K, MOE_CACHE_LIFO, -1));
    ASSERT_EQ_INT(sv.layers[1].cfg.dtype, dt);
    moe_model_stats ss;
    st = serve_batch(&sv, &ss, ps);
    int same = st == MOE_OK && ss.loss == sf.loss && ss.aux == sf.aux && !memcmp(pf, ps, sizeof pf);
    moe_status bw = moe_model_backward(&sv);
    moe_expert_cache_stats cs = {0};
    if (K) moe_expert_cache_get_stats(sv.caches[0], &cs);
    ASSERT_EQ_INT(!K, !sv.caches && !sv.file); /* all resident: nothing left open */
    moe_model_free(&sv);
    ASSERT_OK(st);
    if (!same) FAIL_("%s, K=%d: served loss %.9g, loaded %.9g", moe_compute_dtype_name(dt), K, ss.loss, sf.loss);
    if (!K) continue;
    ASSERT(bw != MOE_OK);
    ASSERT_EQ_INT(cs.resident_bytes, (size_t)K * cs.expert_bytes);
    ASSERT_EQ_INT(cs.dtype, dt);
  }
  moe_model_t bad;
  ASSERT_STATUS(moe_checkpoint_load_serving("/nonexistent.safetensors", &bad, 2, MOE_CACHE_LIFO, -1), MOE_ERR_IO);
  ASSERT_STATUS(moe_checkpoint_load_serving(path, &bad, -1, MOE_CACHE_LIFO, -1), MOE_ERR_ARG);
  ASSERT_STATUS(moe_checkpoint_load_serving(path, &bad, c.moe.E + 1, MOE_CACHE_LIFO, -1), MOE_ERR_ARG);
  ASSERT_STATUS(moe_checkpoint_load_serving(path, &bad, 2, MOE_CACHE_LIFO, MOE_DT_F16), MOE_ERR_ARG);
}

TEST(buffer_model_serving_equals_loaded) { check_serving_equals_loaded(failed_, MOE_DT_F32); }
TEST(buffer_model_serving_bf16_equals_loaded) { check_serving_equals_loaded(failed_, MOE_DT_BF16); }

/* The same bf16-exact expert weights in an F32 checkpoint and in a BF16 one (a bf16 model's) serve
 * alike in either compute dtype, through the cache or all resident: as bf16 (F32 rounded, BF16 as
 * is) and as f32 (BF16 widened). */
TEST(buffer_serving_bf16_and_f32_checkpoints_agree) {
  moe_model_config c;
  small_model(&c, MOE_DT_F32);
  moe_model_t m, mb;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 6);
  for (int i = 0; i < m.nrefs; i++)
    if (m.refs[i].ndim == 3) bf16_exact(m.refs[i].data, m.refs[i].numel); /* the expert matrices */
  char pf[512], pb[512];
  test_tmp_path("buffer_ck_f32.safetensors", pf, sizeof pf);
  test_tmp_path("buffer_ck_bf16.safetensors", pb, sizeof pb);
  ASSERT_OK(moe_checkpoint_save(pf, &m, NULL, NULL));
  c.moe.dtype = MOE_DT_BF16;
  ASSERT_OK(moe_model_init(&mb, &c));
  ASSERT_EQ_INT(mb.nrefs, m.nrefs);
  for (int i = 0; i < m.nrefs; i++) memcpy(mb.refs[i].data, m.refs[i].data, m.refs[i].numel * 4);
  ASSERT_OK(moe_checkpoint_save(pb, &mb, NULL, NULL));
  moe_model_free(&mb);
  moe_model_free(&m);
  moe_st *f;
  moe_tensor_view v;
  ASSERT_OK(moe_st_open_lazy(&f, pb));
  moe_status st = moe_st_get(f, "blocks.1.moe.experts.fc2.weight", &v);
  moe_st_close(f);
  ASSERT_OK(st);
  ASSERT_EQ_INT(v.dtype, MOE_DT_BF16);
  serving_batch();
  const moe_dtype dts[2] = {MOE_DT_BF16, MOE_DT_F32};
  for (int d = 0; d < 2; d++) {
    moe_model_stats s0, s1;
    int32_t p0[B], p1[B];
    ASSERT_OK(moe_checkpoint_load_serving(pf, &m, 0, MOE_CACHE_LIFO, dts[d])); /* F32, all resident */
    ASSERT_EQ_INT(m.layers[0].cfg.dtype, dts[d]);
    st = serve_batch(&m, &s0, p0);
    moe_model_free(&m);
    ASSERT_OK(st);
    const int Ks[3] = {0, 2, 6};
    for (int file = 0; file < 2; file++)
      for (int k = 0; k < 3; k++) {
        ASSERT_OK(moe_checkpoint_load_serving(file ? pb : pf, &m, Ks[k], MOE_CACHE_FIFO, dts[d]));
        ASSERT_EQ_INT(m.layers[1].cfg.dtype, dts[d]);
        st = serve_batch(&m, &s1, p1);
        moe_model_free(&m);
        ASSERT_OK(st);
        if (s1.loss != s0.loss || s1.aux != s0.aux || memcmp(p0, p1, sizeof p0))
          FAIL_("--dtype %s, %s checkpoint, K=%d: loss %.9g, the F32 checkpoint all resident %.9g",
                moe_compute_dtype_name(dts[d]), file ? "BF16" : "F32", Ks[k], s1.loss, s0.loss);
      }
  }
}

/* moe infer --dtype: the dtype and the fast tier (slots x bytes per slot) in the JSON and the text;
 * bf16 slots are about half the f32 ones; an unknown dtype is refused. */
static cJSON *infer_json(int *failed, const char *ck, const char *extra) {
  char out[512], args[2048], err[4096], text[8192];
  test_tmp_path("buffer_infer.json", out, sizeof out);
  snprintf(args, sizeof args, "infer --checkpoint '%s' --data '%s' --batch 50 --threads 2 --json %s", ck,
           synth_data_dir(), extra);
  if (run_moe(NULL, args, out, err, sizeof err)) {
    fprintf(stderr, "  moe %s: %s\n", args, err);
    *failed = 1;
    return NULL;
  }
  test_read_text(out, text, sizeof text);
  cJSON *j = cJSON_Parse(text);
  if (!j) fprintf(stderr, "  moe %s: not JSON: %s\n", args, text), *failed = 1;
  return j;
}

static double num(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

TEST(buffer_cli_infer_dtype) {
  moe_model_config c;
  moe_model_config_default(&c);
  c.in_dim = 144; c.classes = 10; c.blocks = 2;
  c.moe.D = 16; c.moe.H = 32; c.moe.E = 4; c.moe.top_k = 2; c.moe.threads = 2;
  moe_model_t m;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 12);
  char ck[512];
  test_tmp_path("buffer_infer.safetensors", ck, sizeof ck);
  ASSERT_OK(moe_checkpoint_save(ck, &m, NULL, NULL));
  moe_model_free(&m);
  const char *runs[4] = {"--cache 2 --dtype bf16", "--dtype bf16", "--cache 2 --dtype f32", "--cache 2"};
  cJSON *j[4];
  for (int i = 0; i < 4; i++) {
    j[i] = infer_json(failed_, ck, runs[i]);
    if (!j[i]) return;
  }
  double slot16 = 2 * 16 * 32 * 2 + (32 + 16) * 4, slot32 = 2 * 16 * 32 * 4 + (32 + 16) * 4;
  const char *dt[4] = {"bf16", "bf16", "f32", "f32"};
  const double slot[4] = {slot16, slot16, slot32, slot32}, slots[4] = {2, 4, 2, 2};
  for (int i = 0; i < 4; i++) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j[i], "dtype");
    if (!cJSON_IsString(d) || strcmp(d->valuestring, dt[i])) FAIL_("%s: dtype is not %s", runs[i], dt[i]);
    ASSERT_EQ_INT(num(j[i], "expert_slot_bytes"), slot[i]);
    ASSERT_EQ_INT(num(j[i], "cache_slots"), slots[i]);
    ASSERT_EQ_INT(num(j[i], "resident_expert_bytes"), 2 * slots[i] * slot[i]);
    ASSERT_EQ_INT(num(j[i], "all_expert_bytes"), 2 * 4 * slot[i]);
  }
  ASSERT_EQ_INT(num(j[0], "accuracy") * 1e4, num(j[1], "accuracy") * 1e4); /* buffered = all resident */
  ASSERT_EQ_INT(num(j[2], "accuracy") * 1e4, num(j[3], "accuracy") * 1e4);
  for (int i = 0; i < 4; i++) cJSON_Delete(j[i]);
  /* the text names the dtype and the fast tier */
  char out[512], args[2048], err[4096], text[4096];
  test_tmp_path("buffer_infer.txt", out, sizeof out);
  snprintf(args, sizeof args, "infer --checkpoint '%s' --data '%s' --cache 2 --dtype bf16", ck, synth_data_dir());
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  test_read_text(out, text, sizeof text);
  const char *want = "experts bf16: fast tier 2 slots x 0.0021 MiB (2240 bytes) = 0.0043 MiB per block, 0.0085 MiB "
                     "over 2 blocks\n";
  if (!strstr(text, want)) FAIL_("output: %s", text);
  snprintf(args, sizeof args, "infer --checkpoint '%s' --data '%s' --dtype fp8", ck, synth_data_dir());
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "--dtype") && strstr(err, "fp8"));
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
  ASSERT_OK(save_layer(&full, MOE_DT_F32, path));
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
