/* The router alongside the experts (sample-assignment caching, DynaMoE 4.2): with cached experts
 * the layer runs the router's chunks in the same schedule as the experts' first GEMMs. Fed the
 * router's own choices, it gives the no-cache results bit for bit (outputs, losses, input and
 * parameter gradients) over router chunks, threads, dispatch, router kind, activation, dtype and
 * expert parallelism (one rank); fed
 * other experts, it follows them with the gate's weights, checked against a double-precision
 * evaluation; where the placement needs the gate's scores it does not overlap. */
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "fdcheck.h"
#include "layer_ref.h"
#include "test.h"

enum { T = 300, D = 16, H = 24, E = 6, K = 2 }; /* T spans five router chunks */

typedef struct {
  float y[T * D], dx[T * D];
  float *grads;
  float aux, z;
  int32_t experts[T * K], fresh[T * K];
  float weights[T * K];
  int overlapped;
} run_out;

/* One forward and backward (loss: y . y / 2 plus the balance and z losses), optionally with cached
 * experts; the stats copied into o. */
static int run(moe_layer_t *l, const float *x, const int32_t *cache, run_out *o) {
  moe_layer_stats st;
  if (cache && moe_layer_set_cached_experts(l, cache, T) != MOE_OK) return 0;
  if (moe_layer_forward(l, x, T, o->y, NULL, &st) != MOE_OK) return 0;
  o->aux = st.aux_loss;
  o->z = st.z_loss;
  o->overlapped = st.router_overlapped;
  memcpy(o->experts, st.experts, sizeof o->experts);
  memcpy(o->fresh, st.fresh, sizeof o->fresh);
  memcpy(o->weights, st.weights, sizeof o->weights);
  moe_layer_zero_grad(l);
  if (moe_layer_backward(l, o->y, 0.1f, 0.01f, NULL, NULL, o->dx) != MOE_OK) return 0;
  o->grads = malloc(l->numel * 4);
  if (o->grads) memcpy(o->grads, l->grads, l->numel * 4);
  return o->grads != NULL;
}

static int same_run(const run_out *a, const run_out *b, size_t numel) {
  return !memcmp(a->y, b->y, sizeof a->y) && !memcmp(a->dx, b->dx, sizeof a->dx) &&
         !memcmp(a->grads, b->grads, numel * 4) && a->aux == b->aux && a->z == b->z &&
         !memcmp(a->experts, b->experts, sizeof a->experts) && !memcmp(a->fresh, b->fresh, sizeof a->fresh) &&
         !memcmp(a->weights, b->weights, sizeof a->weights);
}

static void config(moe_layer_config *c, int variant, int threads) {
  moe_layer_config_default(c);
  c->D = D; c->H = H; c->E = E; c->top_k = K; c->threads = threads;
  c->dispatch = (moe_dispatch)(variant & 1);
  if (variant & 2) { /* cosine router, swiglu experts without biases, bf16 */
    c->router = MOE_ROUTER_COSINE;
    c->act = MOE_ACT_SWIGLU;
    c->proj_dim = 8;
    c->expert_bias = 0;
    c->dtype = MOE_DT_BF16;
  }
  c->capacity_setting = 2.0f; /* static: room for every assignment of these tokens */
}

TEST(overlap_cached_router_matches_no_cache_bitwise) {
  static float x[T * D], x2[T * D];
  uint64_t rng = 11;
  fd_fill(&rng, x, T * D, -1, 1);
  fd_fill(&rng, x2, T * D, -2, 2);
  moe_dist *one; /* expert parallelism over one rank: the same exchanges and collectives, no mpirun */
  int argc = 0;
  char **argv = NULL;
  ASSERT_OK(moe_dist_init(&one, &argc, &argv));
  for (int variant = 0; variant < 6; variant++)
    for (int threads = 1; threads <= 3; threads += 2) {
      moe_layer_config c;
      config(&c, variant % 4, threads);
      if (variant >= 4) c.dist = one;
      moe_layer_t l;
      ASSERT_OK(moe_layer_init(&l, &c));
      moe_layer_init_params(&l, 3 + variant);
      static run_out plain, other, cached;
      ASSERT(run(&l, x, NULL, &plain));
      ASSERT(run(&l, x2, NULL, &other)); /* the workspace now holds another batch's routing */
      free(other.grads);
      ASSERT(run(&l, x, plain.fresh, &cached));
      int ok = !plain.overlapped && cached.overlapped && same_run(&plain, &cached, l.numel);
      free(plain.grads);
      free(cached.grads);
      moe_layer_free(&l);
      if (!ok) FAIL_("variant %d, threads %d: overlapped %d/%d or results differ", variant, threads,
                     plain.overlapped, cached.overlapped);
    }
  moe_dist_finalize(one);
}

/* The router's results do not depend on the thread count: it runs in fixed chunks of tokens. */
TEST(overlap_router_bits_independent_of_threads) {
  static float x[T * D];
  uint64_t rng = 12;
  fd_fill(&rng, x, T * D, -1, 1);
  static run_out r[2];
  for (int i = 0; i < 2; i++) {
    moe_layer_config c;
    config(&c, 2, 1 + 2 * i);
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 9);
    ASSERT(run(&l, x, NULL, &r[i]));
    moe_layer_free(&l);
  }
  ASSERT(r[0].aux == r[1].aux && r[0].z == r[1].z);
  ASSERT(!memcmp(r[0].fresh, r[1].fresh, sizeof r[0].fresh) && !memcmp(r[0].weights, r[1].weights, sizeof r[0].weights));
  free(r[0].grads);
  free(r[1].grads);
}

/* y of token t for experts te (k) in double: the gate's softmax over all experts, its probabilities of
 * te renormalized, the experts' FFNs; adds the softmax to psum (E) and logsumexp^2 to *lse2. */
static void reference_y(moe_layer_t *l, const float *xt, const int32_t *te, double *y, double *psum, double *lse2) {
  double p[E], psel = 0, out[D];
  double lse = ref_gate_softmax(l, xt, p);
  for (int e = 0; e < E; e++) psum[e] += p[e];
  *lse2 += lse * lse;
  for (int j = 0; j < K; j++) psel += p[te[j]];
  for (int i = 0; i < D; i++) y[i] = 0;
  for (int j = 0; j < K; j++) {
    ref_expert(l, te[j], xt, out);
    for (int i = 0; i < D; i++) y[i] += p[te[j]] / psel * out[i];
  }
}

/* ... and the losses: the balance loss counts the cached slot-0 experts, the z-loss is the gate's. */
TEST(overlap_follows_other_cached_experts) {
  static float x[T * D], x2[T * D], y[T * D], ref[T * D];
  uint64_t rng = 13;
  fd_fill(&rng, x, T * D, -1, 1);
  fd_fill(&rng, x2, T * D, -2, 2);
  for (int d = 0; d < 2; d++) {
    moe_layer_config c;
    config(&c, d, 3);
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 21);
    int32_t cache[T * K];
    for (int t = 0; t < T; t++) cache[t * K] = t % E, cache[t * K + 1] = (t % E + 1 + (t / E) % (E - 1)) % E; /* distinct */
    moe_layer_stats st;
    ASSERT_OK(moe_layer_forward(&l, x2, T, y, NULL, &st)); /* the workspace holds another batch's routing */
    ASSERT_OK(moe_layer_set_cached_experts(&l, cache, T));
    ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &st));
    ASSERT(st.router_overlapped && st.dropped == 0);
    ASSERT(!memcmp(st.experts, cache, sizeof cache));
    double psum[E] = {0}, lse2 = 0, top1[E] = {0}, aux = 0;
    for (int t = 0; t < T; t++) {
      double yt[D];
      reference_y(&l, x + (size_t)t * D, cache + (size_t)t * K, yt, psum, &lse2);
      for (int i = 0; i < D; i++) ref[(size_t)t * D + i] = (float)yt[i];
      top1[cache[t * K]] += 1;
    }
    for (int e = 0; e < E; e++) aux += psum[e] / T * top1[e] / T;
    ASSERT(tensors_close("y", y, ref, T * D, 1e-5, 1e-6));
    ASSERT_NEAR(st.aux_loss, E * aux, 1e-5 * E * aux);
    ASSERT_NEAR(st.z_loss, lse2 / T, 1e-5 * lse2 / T);
    moe_layer_free(&l);
  }
}

/* Placement by score reads the gate's probabilities before the experts, and a layer of inner layers has
 * no GEMMs of its own to overlap: both still follow the cache, one phase after the other. */
TEST(overlap_not_where_placement_needs_scores) {
  static float x[T * D], y[T * D];
  uint64_t rng = 14;
  fd_fill(&rng, x, T * D, -1, 1);
  int32_t cache[T * K];
  for (int t = 0; t < T; t++) cache[t * K] = 1, cache[t * K + 1] = 0;
  for (int hier = 0; hier < 2; hier++) {
    moe_layer_config c;
    config(&c, 0, 2);
    if (hier) {
      c.inner_experts = 2;
      c.inner_top_k = 1;
    } else {
      c.priority = MOE_PRIORITY_SCORE;
    }
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 5);
    moe_layer_stats st;
    ASSERT_OK(moe_layer_set_cached_experts(&l, cache, T));
    ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &st));
    ASSERT(!st.router_overlapped);
    ASSERT_EQ_INT(st.expert_counts[1], T);
    ASSERT_EQ_INT(st.expert_counts[0], T);
    moe_layer_free(&l);
  }
}
