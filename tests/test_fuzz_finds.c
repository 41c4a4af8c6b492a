/* Regressions for what fuzzing (fuzz/) found. */
#include "lm_check.h"
#include "test.h"

/* Saves m with *field = value in the metadata only (the tensors stay m's). */
static moe_status save_claiming(const char *path, moe_model_t *m, int *field, int value) {
  int keep = *field;
  *field = value;
  moe_status st = moe_checkpoint_save(path, m, NULL, NULL);
  *field = keep;
  return st;
}

/* A checkpoint whose metadata claims a far larger model than its tensors hold (fuzz_checkpoint: a
 * 12 KB file saying H = 1000000 kept the loader allocating and initializing for 40 s before its first
 * shape check) is refused before the model is allocated, by both loaders. */
TEST(fuzz_checkpoint_metadata_larger_than_file) {
  moe_model_config c;
  moe_model_config_default(&c);
  c.in_dim = 6, c.classes = 3, c.moe.D = 4, c.moe.H = 4, c.moe.E = 2, c.moe.top_k = 1, c.moe.threads = 1;
  moe_model_t m, big;
  ASSERT_OK(moe_model_init(&m, &c));
  moe_model_init_params(&m, 1);
  char path[256];
  test_tmp_path("fuzz_big_meta.st", path, sizeof path);
  int *fields[3] = {&m.cfg.moe.H, &m.cfg.in_dim, &m.cfg.moe.E};
  const char *says[3] = {"H 1000000", "in_dim 1000000", "E 1000000"};
  int bad = 0;
  for (int i = 0; i < 3 && !bad; i++) {
    moe_status saved = save_claiming(path, &m, fields[i], 1000000);
    moe_status load = moe_checkpoint_load(path, &big, NULL, NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", moe_last_error());
    moe_status k1 = moe_checkpoint_load_serving(path, &big, 1, MOE_CACHE_LRU, -1);
    moe_status k0 = moe_checkpoint_load_serving(path, &big, 0, MOE_CACHE_LRU, -1);
    bad = saved || load != MOE_ERR_FORMAT || k1 != MOE_ERR_FORMAT || k0 != MOE_ERR_FORMAT || !strstr(msg, says[i]);
    if (bad)
      fprintf(stderr, "  claiming %s: save %s, load %s (%s), serving K=1 %s, K=0 %s\n", says[i], moe_status_name(saved),
              moe_status_name(load), msg, moe_status_name(k1), moe_status_name(k0));
  }
  moe_status saved = moe_checkpoint_save(path, &m, NULL, NULL); /* the true metadata still loads */
  moe_model_free(&m);
  ASSERT(!bad);
  ASSERT_OK(saved);
  ASSERT_OK(moe_checkpoint_load(path, &big, NULL, NULL));
  moe_model_free(&big);
}

/* fuzz_trace: a 45-byte trace naming expert 65535 made the anticorr placement ask for a 32 GiB
 * correlation matrix (and E^2 N steps); it is refused with the limit named, greedy still places. */
TEST(fuzz_placement_anticorr_expert_limit) {
  char path[256];
  test_tmp_path("fuzz_e65535.csv", path, sizeof path);
  FILE *f = fopen(path, "w");
  ASSERT(f);
  fputs("step,layer,expert,tokens\n0,0,65535,1\n1,0,3,2\n", f);
  ASSERT(fclose(f) == 0);
  moe_trace t;
  ASSERT_OK(moe_trace_load(&t, path, 0));
  static int dev[65536];
  moe_status anti = moe_placement_fit(&t, 0, 0, t.steps, 2, MOE_PLACEMENT_ANTICORR, 0.5, dev);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", moe_last_error());
  moe_status greedy = moe_placement_fit(&t, 0, 0, t.steps, 2, MOE_PLACEMENT_GREEDY, 0.5, dev);
  moe_trace_free(&t);
  ASSERT_STATUS(anti, MOE_ERR_ARG);
  if (!strstr(msg, "at most 4096 experts, the trace has 65536")) FAIL_("message: %s", msg);
  ASSERT_OK(greedy);
  ASSERT(dev[65535] == 1 && dev[3] == 0);
}

/* config.json integers far outside int (fuzz_checkpoint: "num_hidden_layers": 4.8e17 was cast to int
 * before its range check, undefined behaviour) are errors naming the field; so are such layer numbers
 * in mlp_only_layers and DeepSeek's counts that may be 0. */
TEST(fuzz_lm_config_huge_integers) {
  static const struct { const char *family, *field, *value, *want; } cases[] = {
      {"deepseek_v3", "num_hidden_layers", "4.77778e17", "\"num_hidden_layers\" must be a positive integer"},
      {"deepseek_v3", "first_k_dense_replace", "-3e18", "\"first_k_dense_replace\" must be a non-negative integer"},
      {"qwen3_moe", "mlp_only_layers", "[1e30]", "\"mlp_only_layers\" entry 1e+30 is not a layer"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[512];
    moe_lm_config c;
    ASSERT(lm_patched(cases[i].family, cases[i].field, cases[i].value, NULL, dir, sizeof dir));
    moe_status st = moe_lm_read_config(dir, &c);
    if (st != MOE_ERR_FORMAT || !strstr(moe_last_error(), cases[i].want))
      FAIL_("%s %s=%s: status %d, '%s'", cases[i].family, cases[i].field, cases[i].value, st, moe_last_error());
  }
}
