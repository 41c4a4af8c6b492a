/* The routers and shared experts of open models (DESIGN 4.1b) beyond the fixtures and the gradient
 * checks: DeepSeek-V3's aux-loss-free balancing of the selection bias, the configuration's errors,
 * and the options through a layer file. */
#include <stdlib.h>
#include <string.h>

#include "test.h"

static void open_config(moe_layer_config *c) {
  moe_layer_config_default(c);
  c->D = 8;
  c->H = 12;
  c->E = 8;
  c->top_k = 2;
  c->act = MOE_ACT_SWIGLU;
  c->score = MOE_SCORE_SIGMOID;
  c->select_bias = 1;
  c->n_group = 4;
  c->topk_group = 2;
  c->group_score = MOE_GROUP_TOP2_SUM;
  c->routed_scale = 2.5f;
  c->normalize_topk = 1;
  c->shared_H = 6;
  c->threads = 1;
}

static void fill(float *a, size_t n, uint64_t seed, float scale) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    a[i] = scale * ((float)(seed >> 40) * 0x1.0p-24f * 2.0f - 1.0f);
  }
}

static int max_count(const moe_layer_stats *s, int E) {
  int m = 0;
  for (int e = 0; e < E; e++) m = s->expert_counts[e] > m ? s->expert_counts[e] : m;
  return m;
}

/* One step of the rule moves each bias by exactly -gamma, +gamma or 0 by its count against the mean;
 * repeated on a skewed router it evens the load out. */
TEST(select_bias_balancing_moves_and_evens_the_load) {
  moe_layer_config c;
  open_config(&c);
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &c));
  moe_layer_init_params(&l, 3);
  float *gw = moe_layer_param(&l, "gate.weight");
  for (int d = 0; d < c.D; d++) gw[d] += 2.0f; /* expert 0 takes most tokens */
  enum { T = 64 };
  float x[T * 8], y[T * 8], before[8];
  fill(x, T * 8, 9, 1.0f);
  for (int i = 0; i < T * 8; i++) x[i] += 0.5f;
  ASSERT_STATUS(moe_layer_balance_bias(&l, 0.1f), MOE_ERR_STATE); /* no forward yet */
  moe_layer_stats s;
  ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &s));
  int first_max = max_count(&s, c.E);
  float *b = moe_layer_param(&l, "gate.select_bias");
  memcpy(before, b, sizeof before);
  ASSERT_OK(moe_layer_balance_bias(&l, 0.1f));
  int moved = 0;
  for (int e = 0; e < c.E; e++) {
    float want = before[e] + (s.expert_counts[e] * c.E > T * c.top_k ? -0.1f : s.expert_counts[e] * c.E < T * c.top_k ? 0.1f : 0.0f);
    if (b[e] != want) FAIL_("expert %d (count %d of %d): bias %g, want %g", e, s.expert_counts[e], T * c.top_k, b[e], want);
    moved += b[e] != before[e];
  }
  ASSERT(moved > 0);
  for (int step = 0; step < 60; step++) {
    ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &s));
    ASSERT_OK(moe_layer_balance_bias(&l, 0.02f));
  }
  ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &s));
  int last_max = max_count(&s, c.E);
  if (!(last_max < first_max && last_max <= T * c.top_k / c.E * 2))
    FAIL_("the largest expert load went from %d to %d (mean %d)", first_max, last_max, T * c.top_k / c.E);
  moe_layer_free(&l);
}

/* Each bad option is refused naming the field. */
TEST(open_routing_config_errors_name_the_field) {
  static const struct { const char *field; int what; } cases[] = {
      {"n_group", 0}, {"topk_group", 1}, {"top_k", 2}, {"shared_gate", 3}, {"routed_scale", 4}, {"score", 5},
      {"group_score", 6}, {"shared_H", 7}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moe_layer_config c;
    open_config(&c);
    switch (cases[i].what) {
    case 0: c.n_group = 3; break;               /* does not divide E = 8 */
    case 1: c.topk_group = 5; break;            /* more than n_group */
    case 2: c.top_k = 5; break;                 /* 2 groups of 2 experts: 4 candidates */
    case 3: c.shared_H = 0; c.shared_gate = 1; break;
    case 4: c.routed_scale = 0; break;
    case 5: c.score = (moe_score)7; break;
    case 6: c.group_score = (moe_group_score)9; break;
    case 7: c.shared_H = -1; break;
    }
    moe_layer_t l;
    ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
    if (!strstr(moe_last_error(), cases[i].field)) FAIL_("case %zu: '%s' does not name %s", i, moe_last_error(), cases[i].field);
  }
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 4, c.H = 4, c.E = 4;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &c));
  ASSERT_STATUS(moe_layer_balance_bias(&l, 0.1f), MOE_ERR_STATE); /* no select_bias */
  moe_layer_free(&l);
}

/* A layer file keeps the options (metadata) and the tensors (select bias, shared experts) and gives the
 * same outputs. */
TEST(open_routing_layer_file_round_trip) {
  moe_layer_config c;
  open_config(&c);
  c.shared_gate = 1;
  c.group_score = MOE_GROUP_MAX;
  moe_layer_t a, b;
  ASSERT_OK(moe_layer_init(&a, &c));
  moe_layer_init_params(&a, 5);
  fill(moe_layer_param(&a, "gate.select_bias"), 8, 11, 0.2f);
  char path[512];
  test_tmp_path("open_routing.safetensors", path, sizeof path);
  moe_st_writer *w;
  ASSERT_OK(moe_st_writer_new(&w));
  ASSERT_OK(moe_layer_save_params(&a, w));
  ASSERT_OK(moe_st_writer_save(w, path));
  moe_st_writer_free(w);
  moe_st *f;
  ASSERT_OK(moe_st_open(&f, path));
  ASSERT_OK(moe_layer_load(&b, f, NULL));
  moe_st_close(f);
  ASSERT_EQ_INT(b.cfg.score, MOE_SCORE_SIGMOID);
  ASSERT_EQ_INT(b.cfg.select_bias, 1);
  ASSERT_EQ_INT(b.cfg.n_group, 4);
  ASSERT_EQ_INT(b.cfg.topk_group, 2);
  ASSERT_EQ_INT(b.cfg.group_score, MOE_GROUP_MAX);
  ASSERT(b.cfg.routed_scale == 2.5f);
  ASSERT_EQ_INT(b.cfg.shared_H, 6);
  ASSERT_EQ_INT(b.cfg.shared_gate, 1);
  enum { T = 16 };
  float x[T * 8], ya[T * 8], yb[T * 8];
  fill(x, T * 8, 13, 1.0f);
  ASSERT_OK(moe_layer_forward(&a, x, T, ya, NULL, NULL));
  ASSERT_OK(moe_layer_forward(&b, x, T, yb, NULL, NULL));
  ASSERT(!memcmp(ya, yb, sizeof ya));
  moe_layer_free(&a);
  moe_layer_free(&b);
}

/* DeepSeek-V3's sequence-wise balance loss: its config errors (negative alpha or seq_len, hierarchical
 * experts), a forward whose tokens are not whole sequences, a layer file keeping seq_aux_alpha and seq_len,
 * and the loss's invariances: permuting the tokens inside a sequence leaves it, as sum_i f_i P_i is a
 * sum over each sequence's tokens. */
TEST(open_routing_seq_aux_loss) {
  moe_layer_config c;
  for (int what = 0; what < 3; what++) {
    open_config(&c);
    c.seq_aux_alpha = what == 0 ? -0.1f : 0.1f;
    c.seq_len = what == 1 ? -4 : 4;
    if (what == 2) c.inner_experts = 2, c.inner_top_k = 1;
    moe_layer_t l;
    ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
    ASSERT(strstr(moe_last_error(), "seq_aux_alpha") != NULL);
  }
  open_config(&c);
  c.seq_aux_alpha = 0.5f;
  c.seq_len = 4;
  moe_layer_t a, b;
  ASSERT_OK(moe_layer_init(&a, &c));
  moe_layer_init_params(&a, 9);
  enum { T = 8 };
  float x[T * 8], xp[T * 8], y[T * 8];
  fill(x, T * 8, 17, 1.0f);
  moe_layer_stats s1, s2;
  ASSERT_STATUS(moe_layer_forward(&a, x, 6, y, NULL, &s1), MOE_ERR_ARG); /* 6 tokens, sequences of 4 */
  ASSERT(strstr(moe_last_error(), "seq_len 4") != NULL);
  ASSERT_OK(moe_layer_forward(&a, x, T, y, NULL, &s1));
  memcpy(xp, x, sizeof x); /* tokens 0 and 3 swapped: the same sequences */
  memcpy(xp, x + 3 * 8, 8 * 4);
  memcpy(xp + 3 * 8, x, 8 * 4);
  ASSERT_OK(moe_layer_forward(&a, xp, T, y, NULL, &s2));
  ASSERT(s1.seq_aux_loss > 0);
  ASSERT_NEAR(s2.seq_aux_loss, s1.seq_aux_loss, 1e-6);
  memcpy(xp, x, sizeof x); /* tokens 0 and 4 swapped: other sequences */
  memcpy(xp, x + 4 * 8, 8 * 4);
  memcpy(xp + 4 * 8, x, 8 * 4);
  ASSERT_OK(moe_layer_forward(&a, xp, T, y, NULL, &s2));
  ASSERT(fabs(s2.seq_aux_loss - s1.seq_aux_loss) > 1e-6);
  char path[512];
  test_tmp_path("seq_aux.safetensors", path, sizeof path);
  moe_st_writer *w;
  ASSERT_OK(moe_st_writer_new(&w));
  ASSERT_OK(moe_layer_save_params(&a, w));
  ASSERT_OK(moe_st_writer_save(w, path));
  moe_st_writer_free(w);
  moe_st *f;
  ASSERT_OK(moe_st_open(&f, path));
  ASSERT_OK(moe_layer_load(&b, f, NULL));
  moe_st_close(f);
  ASSERT(b.cfg.seq_aux_alpha == 0.5f && b.cfg.seq_len == 4);
  moe_layer_free(&a);
  moe_layer_free(&b);
}
