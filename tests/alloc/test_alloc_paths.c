/* Allocation-failure injection through every public path that allocates: each call below is run
 * with its 1st, 2nd, ... allocation failing until it succeeds, and must give MOE_ERR_NOMEM with a
 * message every time, without crashing; the ASan build's leak checker sees what a failure leaks.
 * Each path prints how many failures it injected. */
#include <dirent.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_fail.h"
#include "internal.h"
#include "moe_plot.h"
#include "test.h"

enum { T = 6, D = 8, B = 5, IN = 12, CLASSES = 3 };

/* Everything a path may set up, use and free; free_all returns it to zero. */
static struct {
  moe_layer_config lc;
  moe_model_config mc;
  moe_layer_t l;
  moe_model_t m;
  moe_optim_t o;
  moe_dataset d;
  moe_st *f;
  moe_st_writer *w;
  moe_trace t;
  moe_heatmap h;
  moe_recompile *r;
  moe_lm_t lm;
  moe_lm_cache *kv;
  moe_tokenizer *tok;
  moe_trainer *tr;
  int32_t *ids;
  int have_l, have_m, have_o, have_lm, serving_k;
  float x[B * IN], y[T * D], dx[T * D];
  uint8_t labels[B];
  char dir[192], ck[256], layer_st[256], out[256], trace[256], images[256], labels_idx[256], placement[256];
  char lm_dir[256], tok_json[256];
} fx;

static long injected; /* over the tests, for the summary line */

static void free_all(void) {
  if (fx.have_l) moe_layer_free(&fx.l);
  if (fx.have_m) moe_model_free(&fx.m);
  if (fx.have_o) moe_optim_free(&fx.o);
  moe_dataset_free(&fx.d);
  moe_st_close(fx.f);
  moe_st_writer_free(fx.w);
  moe_trace_free(&fx.t);
  moe_heatmap_free(&fx.h);
  moe_recompile_free(fx.r);
  moe_lm_cache_free(fx.kv);
  moe_trainer_free(fx.tr); /* before the model it trains */
  free(fx.ids);
  if (fx.have_lm) moe_lm_free(&fx.lm);
  moe_tokenizer_free(fx.tok);
  fx.tr = NULL, fx.ids = NULL;
  fx.have_l = fx.have_m = fx.have_o = fx.have_lm = 0;
  fx.f = NULL, fx.w = NULL, fx.r = NULL, fx.kv = NULL, fx.tok = NULL;
}

/* Runs the path; 0 if it failed (printed), else prints and adds up its injected failures (none for
 * a call that allocates nothing, such as a backward after its forward). */
static int run(const char *name, moe_status (*setup)(void), moe_status (*op)(void)) {
  for (int i = 0; i < B * IN; i++) fx.x[i] = (float)((i * 37) % 19) / 9.0f - 1.0f;
  for (int i = 0; i < B; i++) fx.labels[i] = (uint8_t)(i % CLASSES);
  alloc_path p = {name, setup, op, free_all};
  long n = alloc_fail_run(&p);
  if (n < 0) return 0;
  printf("  %s: %ld allocation failures injected\n", name, n);
  injected += n;
  return 1;
}
#define RUN(name, setup, op) do { if (!run(name, setup, op)) FAIL_("path %s failed (above)", name); } while (0)

/* Whether fx.dir holds a file whose name starts with prefix (a temp file a failed save left). */
static int left_behind(const char *prefix) {
  DIR *dir = opendir(fx.dir);
  struct dirent *e;
  int found = 0;
  while (dir && (e = readdir(dir)))
    if (!strncmp(e->d_name, prefix, strlen(prefix)) && strcmp(e->d_name, prefix)) found = 1;
  if (dir) closedir(dir);
  return found;
}

static void paths_init(void) {
  test_tmp_path("alloc", fx.dir, sizeof fx.dir);
  mkdir(fx.dir, 0700);
  snprintf(fx.ck, sizeof fx.ck, "%s/ck.st", fx.dir);
  snprintf(fx.layer_st, sizeof fx.layer_st, "%s/layer.st", fx.dir);
  snprintf(fx.out, sizeof fx.out, "%s/out", fx.dir);
  snprintf(fx.trace, sizeof fx.trace, "%s/t.csv", fx.dir);
  snprintf(fx.images, sizeof fx.images, "%s/images", fx.dir);
  snprintf(fx.labels_idx, sizeof fx.labels_idx, "%s/labels", fx.dir);
  snprintf(fx.placement, sizeof fx.placement, "%s/placement.json", fx.dir);
  snprintf(fx.lm_dir, sizeof fx.lm_dir, "%s/lm", fx.dir);
  snprintf(fx.tok_json, sizeof fx.tok_json, "%s/tokenizer.json", fx.dir);
}

/* ---- layers ---- */

static moe_status layer_init(void) {
  moe_status st = moe_layer_init(&fx.l, &fx.lc);
  fx.have_l = st == MOE_OK;
  if (st == MOE_OK) moe_layer_init_params(&fx.l, 7);
  return st;
}
static moe_status layer_forward(void) {
  moe_layer_stats s;
  return moe_layer_forward(&fx.l, fx.x, T, fx.y, NULL, &s);
}
static moe_status layer_forwarded(void) {
  MOE_CHECK(layer_init());
  return layer_forward();
}
static moe_status layer_backward(void) {
  return moe_layer_backward(&fx.l, fx.y, 0.01f, 0.001f, NULL, NULL, fx.dx);
}
static moe_status layer_save(void) {
  moe_st_writer *w;
  MOE_CHECK(moe_st_writer_new(&w));
  moe_status st = moe_layer_save_params(&fx.l, w);
  if (st == MOE_OK) st = moe_st_writer_save(w, fx.layer_st);
  moe_st_writer_free(w);
  MOE_CHECK(st);
  MOE_CHECK(moe_st_writer_new(&w));
  st = moe_layer_save_grads(&fx.l, w, "grad.");
  if (st == MOE_OK) st = moe_st_writer_save(w, fx.out);
  moe_st_writer_free(w);
  return st;
}
static moe_status layer_load(void) {
  moe_layer_t l;
  moe_st *f;
  MOE_CHECK(moe_st_open(&f, fx.layer_st));
  moe_status st = moe_layer_load(&l, f, NULL);
  if (st == MOE_OK) moe_layer_free(&l);
  moe_st_close(f);
  return st;
}

static moe_status set_capacity(void) {
  const int32_t cap[4] = {2, 3, 1, 4};
  return moe_layer_set_expert_capacity(&fx.l, cap, T);
}
static moe_status gflops(void) { /* a benchmark: 0 when it cannot measure */
  return moe_sgemm_gflops(16, 1, 1) > 0 ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "0 GFLOP/s");
}

static void layer_paths(int *failed_, const char *variant) {
  char name[96];
  moe_layer_config c = fx.lc;
  snprintf(name, sizeof name, "layer_init[%s]", variant);
  RUN(name, NULL, layer_init);
  snprintf(name, sizeof name, "layer_forward[%s]", variant);
  RUN(name, layer_init, layer_forward);
  snprintf(name, sizeof name, "layer_backward[%s]", variant);
  RUN(name, layer_forwarded, layer_backward);
  snprintf(name, sizeof name, "layer_save[%s]", variant);
  RUN(name, layer_forwarded, layer_save);
  ASSERT(!left_behind("layer.st"));
  if (c.dispatch == MOE_DISPATCH_STATIC) RUN("layer_set_expert_capacity", layer_init, set_capacity);
  if (c.inner_experts) return; /* moe_layer_load reads flat layers */
  snprintf(name, sizeof name, "layer_load[%s]", variant);
  RUN(name, NULL, layer_load);
}

static void layer_config(void) {
  moe_layer_config_default(&fx.lc);
  fx.lc.D = D, fx.lc.H = 16, fx.lc.E = 4, fx.lc.top_k = 2, fx.lc.threads = 1;
}

TEST(alloc_fail_layer) {
  paths_init();
  layer_config();
  layer_paths(failed_, "dynamic");
  if (*failed_) return;
  layer_config();
  fx.lc.dispatch = MOE_DISPATCH_STATIC, fx.lc.priority = MOE_PRIORITY_SCORE;
  fx.lc.router = MOE_ROUTER_COSINE, fx.lc.proj_dim = 4, fx.lc.act = MOE_ACT_SWIGLU;
  layer_paths(failed_, "static cosine swiglu");
  if (*failed_) return;
  layer_config();
  fx.lc.dtype = MOE_DT_BF16, fx.lc.pipeline = 2, fx.lc.memory_reuse = MOE_REUSE_S4;
  layer_paths(failed_, "bf16 pipeline s4");
  if (*failed_) return;
  layer_config();
  fx.lc.inner_experts = 2, fx.lc.inner_top_k = 1;
  layer_paths(failed_, "hierarchical");
  RUN("sgemm_gflops", NULL, gflops);
}

/* ---- models, optimizers, checkpoints ---- */

static void model_config(moe_dtype dt) {
  moe_model_config_default(&fx.mc);
  fx.mc.in_dim = IN, fx.mc.classes = CLASSES, fx.mc.blocks = 1; /* 2: twice the header */
  fx.mc.moe.D = D, fx.mc.moe.H = 16, fx.mc.moe.E = 4, fx.mc.moe.top_k = 2, fx.mc.moe.threads = 1;
  fx.mc.moe.dtype = dt;
}
static moe_status model_init(void) {
  moe_status st = moe_model_init(&fx.m, &fx.mc);
  fx.have_m = st == MOE_OK;
  if (st == MOE_OK) moe_model_init_params(&fx.m, 3);
  return st;
}
static moe_status model_forward(void) {
  moe_model_stats s;
  return moe_model_forward(&fx.m, fx.x, fx.labels, B, &s);
}
static moe_status model_forwarded(void) {
  MOE_CHECK(model_init());
  return model_forward();
}
static moe_status model_backward(void) {
  return moe_model_backward(&fx.m);
}
static moe_status optim_init(void) {
  moe_optim_config c;
  moe_optim_config_default(&c);
  moe_status st = moe_optim_init(&fx.o, &c, &fx.m);
  fx.have_o = st == MOE_OK;
  return st;
}
static moe_status trained(void) { /* a model after one step, with its Adam state */
  MOE_CHECK(model_forwarded());
  MOE_CHECK(model_backward());
  MOE_CHECK(optim_init());
  moe_optim_step(&fx.o, &fx.m, 0.01f);
  return MOE_OK;
}
static moe_status checkpoint_save(void) {
  moe_train_state ts = {.epoch = 1, .step = 1, .seed = 5};
  snprintf(ts.extra, sizeof ts.extra, "batch=%d", B);
  return moe_checkpoint_save(fx.ck, &fx.m, &fx.o, &ts);
}
static moe_status checkpoint_load(void) {
  moe_train_state ts;
  moe_status st = moe_checkpoint_load(fx.ck, &fx.m, &fx.o, &ts);
  fx.have_m = fx.have_o = st == MOE_OK;
  return st;
}
static moe_status load_serving(void) {
  moe_status st = moe_checkpoint_load_serving(fx.ck, &fx.m, fx.serving_k, MOE_CACHE_LRU, -1);
  fx.have_m = st == MOE_OK;
  return st;
}
static moe_status served(void) {
  MOE_CHECK(load_serving());
  return MOE_OK;
}
static moe_status serving_forward(void) {
  moe_model_stats s;
  return moe_model_forward(&fx.m, fx.x, NULL, B, &s);
}

static void model_paths(int *failed_, const char *variant) {
  char name[96];
  snprintf(name, sizeof name, "model_init[%s]", variant);
  RUN(name, NULL, model_init);
  snprintf(name, sizeof name, "model_forward[%s]", variant);
  RUN(name, model_init, model_forward);
  snprintf(name, sizeof name, "model_backward[%s]", variant);
  RUN(name, model_forwarded, model_backward);
  snprintf(name, sizeof name, "optim_init[%s]", variant);
  RUN(name, model_init, optim_init);
  snprintf(name, sizeof name, "checkpoint_save[%s]", variant);
  RUN(name, trained, checkpoint_save);
  ASSERT(!left_behind("ck.st"));
  snprintf(name, sizeof name, "checkpoint_load[%s]", variant);
  RUN(name, NULL, checkpoint_load);
  for (fx.serving_k = 0; fx.serving_k < 2; fx.serving_k++) {
    snprintf(name, sizeof name, "checkpoint_load_serving[%s, K=%d]", variant, fx.serving_k);
    RUN(name, NULL, load_serving);
    snprintf(name, sizeof name, "serving_forward[%s, K=%d]", variant, fx.serving_k);
    RUN(name, served, serving_forward);
  }
}

TEST(alloc_fail_model) {
  paths_init();
  model_config(MOE_DT_F32);
  model_paths(failed_, "f32");
  if (*failed_) return;
  model_config(MOE_DT_BF16);
  fx.mc.loss = MOE_LOSS_SPECIFICATION;
  model_paths(failed_, "bf16 specification");
  if (*failed_) return;
  model_config(MOE_DT_F32); /* static dispatch with per-expert capacities, which checkpoints keep */
  fx.mc.moe.dispatch = MOE_DISPATCH_STATIC;
  ASSERT_OK(trained());
  const int32_t cap[4] = {2, 3, 1, 4};
  ASSERT_OK(moe_layer_set_expert_capacity(&fx.m.layers[0], cap, B));
  ASSERT_OK(checkpoint_save());
  free_all();
  RUN("checkpoint_load[static, capacities]", NULL, checkpoint_load);
}

/* ---- files: safetensors, IDX, atomic writes ---- */

static moe_status st_open(void) {
  moe_st *f;
  MOE_CHECK(moe_st_open(&f, fx.ck));
  moe_st_close(f);
  return MOE_OK;
}
static moe_status st_lazy_views(void) { /* lazy: the BF16 tensors widened from the file */
  moe_st *f;
  MOE_CHECK(moe_st_open_lazy(&f, fx.ck));
  moe_status st = MOE_OK;
  for (int i = 0; st == MOE_OK && i < moe_st_count(f); i++) {
    moe_tensor_view v;
    st = moe_st_at(f, i, &v);
    if (st == MOE_OK && (v.dtype == MOE_DT_F32 || v.dtype == MOE_DT_BF16)) st = moe__st_scan_finite(f, &v);
  }
  moe_st_close(f);
  return st;
}
static moe_status st_write(void) {
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const int32_t b[3] = {7, 8, 9};
  const int64_t sa[2] = {2, 3}, sb[1] = {3};
  moe_st_writer *w;
  MOE_CHECK(moe_st_writer_new(&w));
  moe_status st = moe_st_writer_add_f32(w, "a", MOE_DT_BF16, 2, sa, a);
  if (st == MOE_OK) st = moe_st_writer_add(w, "b", MOE_DT_I32, 1, sb, b);
  if (st == MOE_OK) st = moe_st_writer_meta(w, "k", "v");
  if (st == MOE_OK) st = moe_st_writer_meta(w, "k", "w");
  if (st == MOE_OK) st = moe_st_writer_save(w, fx.out);
  moe_st_writer_free(w);
  return st;
}
static moe_status write_atomic(void) {
  return moe_write_file_atomic(fx.out, "hello\n", 6);
}
static moe_status dataset_load(void) {
  return moe_dataset_load_idx(&fx.d, fx.images, fx.labels_idx);
}

static int write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(p, 1, n, f) == n;
  return (f && fclose(f) == 0) && ok;
}

TEST(alloc_fail_files) {
  paths_init();
  model_config(MOE_DT_BF16);
  ASSERT_OK(trained());
  ASSERT_OK(checkpoint_save());
  free_all();
  RUN("st_open", NULL, st_open);
  RUN("st_open_lazy + scan", NULL, st_lazy_views);
  RUN("st_writer", NULL, st_write);
  RUN("write_file_atomic", NULL, write_atomic);
  ASSERT(!left_behind("out"));
  const uint8_t lab[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 0, 2};
  uint8_t img[16 + 3 * 4] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
  for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(i * 9);
  ASSERT(write_bytes(fx.labels_idx, lab, sizeof lab) && write_bytes(fx.images, img, sizeof img));
  RUN("dataset_load_idx", NULL, dataset_load);
}

/* ---- serving analysis: traces, cache simulation, placement, heatmaps; RECOMPILE ---- */

static moe_status trace_load(void) {
  return moe_trace_load(&fx.t, fx.trace, 0);
}
static moe_status cachesim(void) {
  int64_t acc, miss;
  for (int p = MOE_CACHE_LIFO; p <= MOE_CACHE_BELADY; p++)
    MOE_CHECK(moe_cachesim(&fx.t, 1, 0, fx.t.steps, (moe_cache_policy)p, 2, &acc, &miss));
  return MOE_OK;
}
static moe_status placement(void) {
  int dev[4];
  double mx, avg;
  for (int m = MOE_PLACEMENT_GREEDY; m <= MOE_PLACEMENT_ANTICORR; m++) {
    MOE_CHECK(moe_placement_fit(&fx.t, 0, 0, fx.t.steps, 2, (moe_placement_method)m, 0.5, dev));
    MOE_CHECK(moe_placement_eval(&fx.t, 0, 0, fx.t.steps, 2, dev, &mx, &avg, NULL));
  }
  return moe_placement_load(fx.placement, 1, 4, 2, dev);
}
static moe_status heatmap(void) {
  MOE_CHECK(moe_heatmap_build(&fx.h, &fx.t, -1, 3));
  MOE_CHECK(moe_heatmap_write_png(&fx.h, fx.out));
  return moe_heatmap_write_svg(&fx.h, fx.out);
}
static int trigger(const moe_metrics *m, moe_adjustment *out, void *user) {
  (void)user;
  out->set_top_k = 1, out->top_k = m->iter % 2 + 1;
  return 1;
}
static moe_status recompile(void) {
  const int32_t counts[4] = {3, 1, 0, 2};
  const moe_adjustment *adj;
  int has;
  MOE_CHECK(moe_recompile_new(&fx.r, 4, 0, trigger, NULL));
  for (int64_t i = 0; i < 3; i++) {
    MOE_CHECK(moe_recompile_begin(fx.r, i, &adj, &has));
    MOE_CHECK(moe_recompile_push(fx.r, &(moe_metrics){.iter = i, .loss = 1, .experts = 4, .counts = counts}));
  }
  return MOE_OK;
}

TEST(alloc_fail_serving) {
  paths_init();
  const char *csv = "step,layer,expert,tokens\n0,0,1,3\n0,1,2,1\n1,0,0,2\n1,1,3,5\n2,0,2,1\n2,1,1,4\n3,0,3,2\n";
  const char *json = "{\"devices\": 2, \"layers\": [{\"layer\": 1, \"expert_device\": [0, 1, 1, 0]}]}";
  ASSERT(write_bytes(fx.trace, csv, strlen(csv)) && write_bytes(fx.placement, json, strlen(json)));
  RUN("trace_load", NULL, trace_load);
  RUN("cachesim", trace_load, cachesim);
  RUN("placement fit, eval, load", trace_load, placement);
  RUN("heatmap build, png, svg", trace_load, heatmap);
  RUN("recompile", NULL, recompile);
  printf("  alloc_fail: %ld allocation failures injected so far\n", injected);
}

/* ---- the language model and the tokenizer ---- */

enum { LM_B = 2, LM_T = 5 };
static const int32_t lm_tokens[LM_B * LM_T] = {1, 5, 9, 2, 7, 3, 3, 8, 0, 6};
static const int32_t lm_targets[LM_B * LM_T] = {5, 9, 2, 7, -1, 3, 8, 0, 6, 4};

static moe_lm_family lm_family; /* the language model's family for the paths below */
static moe_lm_config lm_config(void) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 11, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 4, c.max_seq = 8;
  c.moe.D = 8, c.moe.H = 12, c.moe.E = 4, c.moe.top_k = 2, c.moe.threads = 1;
  c.aux_coef = 0.01f;
  c.family = lm_family;
  if (lm_family == MOE_LM_QWEN2_MOE) { /* biases, the shared expert, a dense layer */
    c.qkv_bias = 1, c.moe.shared_H = 6, c.moe.shared_gate = 1, c.dense_H = 10;
    c.dense_layers[0] = 2;
  }
  if (lm_family == MOE_LM_OLMOE) c.qk_norm = MOE_QK_NORM_FULL, c.clip_qkv = 0.5f; /* norms, clamp */
  return c;
}
static moe_status lm_init(void) {
  moe_lm_config c = lm_config();
  MOE_CHECK(moe_lm_init(&fx.lm, &c));
  fx.have_lm = 1;
  moe_lm_init_params(&fx.lm, 3);
  return MOE_OK;
}
static moe_status lm_forward(void) { return moe_lm_forward(&fx.lm, lm_tokens, lm_targets, LM_B, LM_T, NULL); }
static moe_status lm_forwarded(void) {
  MOE_CHECK(lm_init());
  return lm_forward();
}
static moe_status lm_backward(void) { return moe_lm_backward(&fx.lm); }
static moe_status lm_save(void) { return moe_lm_save(&fx.lm, fx.lm_dir); }
static moe_status lm_load(void) {
  moe_lm_config c;
  MOE_CHECK(moe_lm_read_config(fx.lm_dir, &c));
  c.moe.threads = 1;
  MOE_CHECK(moe_lm_load(&fx.lm, fx.lm_dir, &c));
  fx.have_lm = 1;
  return MOE_OK;
}
static moe_status lm_decode(void) {
  MOE_CHECK(moe_lm_cache_new(&fx.kv, &fx.lm, LM_B));
  MOE_CHECK(moe_lm_decode(&fx.lm, fx.kv, lm_tokens, 3));
  return moe_lm_decode(&fx.lm, fx.kv, lm_tokens + 3, 1);
}

static const char tok_text[] = "the cat sat on the mat; the cat's hat.\n\tThe end 1961 <|endoftext|> \xc3\xa9";
static moe_status tok_train(void) { return moe_tokenizer_train(&fx.tok, tok_text, sizeof tok_text - 1, 270); }
static moe_status tok_save(void) { return moe_tokenizer_save(fx.tok, fx.tok_json); }
static moe_status tok_load(void) { return moe_tokenizer_load(&fx.tok, fx.tok_json); }
static moe_status tok_round_trip(void) {
  int32_t ids[sizeof tok_text];
  char back[sizeof tok_text];
  size_t n, len;
  MOE_CHECK(moe_tokenizer_encode(fx.tok, tok_text, sizeof tok_text - 1, 1, ids, &n));
  return moe_tokenizer_decode(fx.tok, ids, n, back, sizeof back, &len);
}

/* Hugging Face files with the whole pipeline: normalizers, byte fallback, post-processor, decoders
 * (Llama 2's kind), and Metaspace, Digits, Punctuation, NFKC, Lowercase (the fuzz seeds). */
static moe_status hf_load(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/../../fuzz/corpus/tokenizer_json/%s", test_fixture_dir(), name);
  return moe_tokenizer_load(&fx.tok, path);
}
static moe_status tok_load_spm(void) { return hf_load("llama2.json"); }
static moe_status tok_load_meta(void) { return hf_load("metaspace.json"); }
static moe_status tok_hf_round_trip(void) {
  int32_t *ids = NULL;
  char back[4 * sizeof tok_text];
  size_t n, len;
  MOE_CHECK(moe_tokenizer_encode_alloc(fx.tok, tok_text, sizeof tok_text - 1, 3, &ids, &n));
  moe_status st = moe_tokenizer_decode(fx.tok, ids, n, back, sizeof back, &len);
  free(ids);
  return st;
}

TEST(alloc_fail_language_model) {
  paths_init();
  static const moe_lm_family fams[] = {MOE_LM_MIXTRAL, MOE_LM_QWEN2_MOE, MOE_LM_OLMOE};
  for (int f = 0; f < 3; f++) {
    lm_family = fams[f];
    fprintf(stderr, "  language model of family %s\n", moe_lm_family_name(lm_family));
    RUN("lm_init", NULL, lm_init);
    RUN("lm_forward", lm_init, lm_forward);
    RUN("lm_backward", lm_forwarded, lm_backward);
    RUN("lm_save", lm_init, lm_save);
    ASSERT(!left_behind("model.safetensors") && !left_behind("config.json"));
    RUN("lm_read_config + lm_load", NULL, lm_load);
    RUN("lm_cache_new + decode", lm_init, lm_decode);
  }
  RUN("tokenizer_train", NULL, tok_train);
  RUN("tokenizer_save", tok_train, tok_save);
  RUN("tokenizer_load", NULL, tok_load);
  RUN("tokenizer encode + decode", tok_train, tok_round_trip);
  RUN("tokenizer_load (Hugging Face pipeline)", NULL, tok_load_spm);
  RUN("tokenizer_load (Metaspace, NFKC)", NULL, tok_load_meta);
  RUN("tokenizer encode_alloc + decode (pipeline)", tok_load_spm, tok_hf_round_trip);
  RUN("tokenizer encode_alloc + decode (Metaspace)", tok_load_meta, tok_hf_round_trip);
  printf("  alloc_fail: %ld allocation failures injected so far\n", injected);
}

/* ---- the trainer over the language model ---- */

enum { TR_N = 60 };
static int32_t tr_stream[TR_N];
static int tr_adjust; /* the paths' trainers run DynaMoE's adjustments (static dispatch) */

static moe_status tr_lm(void) {
  for (int i = 0; i < TR_N; i++) tr_stream[i] = (i * 7 + i / 5) % 11;
  moe_lm_config c = lm_config();
  if (tr_adjust) c.moe.dispatch = MOE_DISPATCH_STATIC;
  MOE_CHECK(moe_lm_init(&fx.lm, &c));
  fx.have_lm = 1;
  moe_lm_init_params(&fx.lm, 3);
  return MOE_OK;
}
static moe_trainer_config tr_config(void) {
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  c.context = 4, c.batch = 2, c.eval_windows = 3, c.steps = 8, c.eval_every = 1, c.checkpoint = fx.lm_dir;
  c.on_nan = MOE_ON_NAN_SKIP;
  c.adjust.dynamic_capacity = c.adjust.cache_assignments = tr_adjust;
  return c;
}
static moe_status tr_new(void) {
  moe_trainer_config c = tr_config();
  moe_train_model m;
  MOE_CHECK(moe_train_lm(&m, &fx.lm, fx.tok, tr_stream, TR_N, tr_stream, TR_N, &c));
  return moe_trainer_new(&fx.tr, &c, &m);
}
static moe_status tr_ready(void) {
  MOE_CHECK(tr_lm());
  return tr_new();
}
static moe_status tr_step(void) { return moe_trainer_step(fx.tr, NULL); } /* with an evaluation and a checkpoint */
static moe_status tr_saved(void) { /* a checkpoint of step 1, and a new trainer of the same model */
  MOE_CHECK(tr_ready());
  MOE_CHECK(moe_trainer_step(fx.tr, NULL));
  moe_trainer_free(fx.tr);
  fx.tr = NULL;
  return tr_new();
}
static moe_status tr_resume(void) { return moe_trainer_resume(fx.tr, fx.lm_dir); }
static moe_status tr_state_read(void) {
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  moe_layer_config l = fx.lm.cfg.moe;
  return moe_trainer_state_read(fx.lm_dir, &c, &l, NULL);
}
static moe_status tr_stream_encode(void) {
  size_t n;
  return moe_lm_stream_encode(fx.tok, tok_text, sizeof tok_text - 1, &fx.ids, &n);
}

TEST(alloc_fail_trainer) {
  paths_init();
  RUN("lm_stream_encode", tok_train, tr_stream_encode);
  for (tr_adjust = 0; tr_adjust < 2; tr_adjust++) {
    fprintf(stderr, "  trainer%s\n", tr_adjust ? " with dynamic capacity and assignment caching" : "");
    RUN("train_lm + trainer_new", tr_lm, tr_new);
    RUN("trainer_step (evaluation, checkpoint)", tr_ready, tr_step);
    ASSERT(!left_behind("trainer_state.safetensors"));
    RUN("trainer_state_read", tr_saved, tr_state_read);
    RUN("trainer_resume", tr_saved, tr_resume);
  }
  printf("  alloc_fail: %ld allocation failures injected so far\n", injected);
}
