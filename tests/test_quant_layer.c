/* The layer with quantized experts (src/sources/quant.c, moe_layer_quantize_experts and
 * moe_layer_bind_experts): against a float64 reference that quantizes the activations as the kernels
 * do (per block, the input rows and then the hidden rows) and multiplies the dequantized weights, and
 * against the fp32 layer whose experts are those dequantized weights (the difference is then the
 * activations' quantization); decode (one token per forward) and prefill (all at once), and one or two
 * threads, give the same bits; bound bytes give what the layer's own quantization gives; what a
 * quantized layer cannot do is refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels/quant.h"
#include "test.h"

enum { D = 256, H = 256, E = 3, T = 7 };

static moe_layer_config config(moe_act act, int k) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = D, c.H = H, c.E = E, c.top_k = k, c.act = act, c.threads = 2;
  return c;
}

static void random_x(float *x, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) x[i] = moe__uniform(&seed) * (1 + (i % 7));
}

/* The biases nonzero, so that their place is checked too. */
static void random_biases(moe_layer_t *l, uint64_t seed) {
  const char *names[3] = {"experts.fc1.bias", "experts.fc2.bias", "experts.fc3.bias"}; /* fc3's: swiglu_oai */
  for (int i = 0; i < 3; i++) {
    float *b = moe_layer_param(l, names[i]);
    const moe_param_info *p = moe_layer_param_find(l, names[i]);
    for (size_t j = 0; b && j < p->numel; j++) b[j] = 0.1f * moe__uniform(&seed);
  }
}

/* A row of activations quantized as the kernels do, and its values read back. */
static void quantized_values(moe_gguf_type t, const float *x, double *out, int n) {
  uint8_t *a = malloc(moe__act_bytes(t, n));
  float *v = malloc((size_t)n * 4);
  moe__act_quantize(t, x, a, n);
  moe__act_dequantize(t, a, v, n); /* against the fields and the Q8_0 codec in test_quant_gemv.c */
  for (int i = 0; i < n; i++) out[i] = v[i];
  free(a), free(v);
}

/* The layer's activation of a1 and a3 in float64: relu, swiglu, or gpt-oss's clamped swiglu_oai with
 * the config's alpha and limit. */
static double ref_act(const moe_layer_config *c, double a1, double a3) {
  if (c->act == MOE_ACT_RELU) return a1 > 0 ? a1 : 0;
  if (c->act == MOE_ACT_SWIGLU) return a1 / (1 + exp(-a1)) * a3;
  double lim = c->swiglu_limit, g = a1 < lim ? a1 : lim, u = a3 < -lim ? -lim : a3 > lim ? lim : a3;
  return (u + 1) * g / (1 + exp(-c->swiglu_alpha * g));
}

/* Expert e's output for x in float64 over the dequantized weights w1, w2, w3 (fp32 layout) and the
 * biases b[0..2] of fc1, fc2, fc3 (each may be NULL), with x and the hidden row quantized per block first. */
static void ref_expert(const moe_gguf_type t[3], const moe_layer_config *c, const float *w1, const float *w2,
                       const float *w3, const float *const b[3], int e, const float *x, double *out) {
  static double xq[D], xq3[D], hq[H];
  static float h[H];
  quantized_values(t[0], x, xq, D); /* for fc1; for fc3 in its type's format; h for fc2 */
  quantized_values(t[2], x, xq3, D);
  for (int j = 0; j < H; j++) {
    double a1 = b[0] ? b[0][e * H + j] : 0, a3 = b[2] ? b[2][e * H + j] : 0;
    for (int d = 0; d < D; d++) {
      a1 += (double)w1[((size_t)e * H + j) * D + d] * xq[d];
      if (w3) a3 += (double)w3[((size_t)e * H + j) * D + d] * xq3[d];
    }
    h[j] = (float)ref_act(c, a1, a3);
  }
  quantized_values(t[1], h, hq, H);
  for (int d = 0; d < D; d++) {
    double s = b[1] ? b[1][e * D + d] : 0;
    for (int j = 0; j < H; j++) s += (double)w2[((size_t)e * D + d) * H + j] * hq[j];
    out[d] = s;
  }
}

/* The layer's fp32 experts replaced by their quantized-then-dequantized values (fc1, fc2, fc3 in t[0],
 * t[1], t[2]); their bytes into bytes[i] when not NULL (malloc'd). */
static void dequantized_experts_typed(moe_layer_t *l, const moe_gguf_type t[3], uint8_t **bytes) {
  const char *names[3] = {"experts.fc1.weight", "experts.fc2.weight", "experts.fc3.weight"};
  for (int i = 0; i < 3; i++) {
    const moe_param_info *p = moe_layer_param_find(l, names[i]);
    if (!p) continue;
    uint8_t *b = malloc(p->numel / (size_t)moe_gguf_type_block(t[i]) * moe_gguf_type_block_bytes(t[i]));
    moe_gguf_quantize(t[i], l->params + p->offset, b, (int64_t)p->numel);
    moe_gguf_dequantize(t[i], b, l->params + p->offset, (int64_t)p->numel);
    if (bytes) bytes[i] = b;
    else free(b);
  }
  moe_layer_params_changed(l);
}
static void dequantized_experts(moe_layer_t *l, moe_gguf_type t) {
  const moe_gguf_type ts[3] = {t, t, t};
  dequantized_experts_typed(l, ts, NULL);
}

static const moe_gguf_type kTypes[] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_0, MOE_GGUF_Q4_K, MOE_GGUF_Q6_K,
                                       MOE_GGUF_Q5_K, MOE_GGUF_MXFP4, MOE_GGUF_BF16, MOE_GGUF_F16};
#define NTYPES 8

/* Every type with relu, swiglu and gpt-oss's swiglu_oai (with fc3's bias; a limit that clamps) (k 1
 * and 2 among them; one with static dispatch): the float64
 * reference (up to float rounding and the rare hidden value it moves across a rounding boundary: within
 * 2e-5 of the sum over slots of |weight| (|output| + 1); 1.8e-6 at most here), and the fp32 layer with
 * the dequantized experts (the activations' quantization: within 3% in norm; 0.7-1.8% here). */
TEST(quant_layer_matches_references) {
  float *x = malloc(T * D * 4), *yq = malloc(T * D * 4), *yf = malloc(T * D * 4);
  double out[D];
  random_x(x, T * D, 1);
  for (int ti = 0; ti < NTYPES; ti++)
    for (int ai = 0; ai < 3; ai++) {
        int k = (ai + ti) % 2 + 1; /* each type with every activation, and each activation with k 1 and 2 */
        moe_gguf_type ty = kTypes[ti];
        moe_act act = ai == 2 ? MOE_ACT_SWIGLU_OAI : ai ? MOE_ACT_SWIGLU : MOE_ACT_RELU;
        moe_layer_config c = config(act, k);
        c.swiglu_limit = 0.02f; /* about the size of a1 and a3 here: some clamped, some not */
        if (ti == 2 && ai) c.dispatch = MOE_DISPATCH_STATIC, c.capacity_setting = 0; /* padded groups, none dropped */
        moe_layer_t q, f;
        ASSERT_OK(moe_layer_init(&q, &c));
        ASSERT_OK(moe_layer_init(&f, &c));
        moe_layer_init_params(&q, 7 + (uint64_t)ti);
        random_biases(&q, 3);
        memcpy(f.params, q.params, q.numel * 4);
        dequantized_experts(&f, ty);
        ASSERT_OK(moe_layer_quantize_experts(&q, ty));
        ASSERT_EQ_INT(q.cfg.expert_type, ty);
        moe_layer_stats sq, sf;
        ASSERT_OK(moe_layer_forward(&q, x, T, yq, NULL, &sq));
        ASSERT_OK(moe_layer_forward(&f, x, T, yf, NULL, &sf));
        ASSERT(memcmp(sq.experts, sf.experts, T * k * 4) == 0); /* the same gate */
        double err = 0, norm = 0;
        for (int i = 0; i < T * D; i++) err += (yq[i] - yf[i]) * (double)(yq[i] - yf[i]), norm += (double)yf[i] * yf[i];
        if (!(sqrt(err / norm) < 0.03))
          FAIL_("%s %s k=%d: relative distance to the fp32 layer %.4g", moe_gguf_type_name(ty), moe_act_name(act), k,
                sqrt(err / norm));
        const float *w1 = moe_layer_param(&f, "experts.fc1.weight"), *w2 = moe_layer_param(&f, "experts.fc2.weight"),
                    *w3 = moe_layer_param(&f, "experts.fc3.weight");
        const float *const b[3] = {moe_layer_param(&f, "experts.fc1.bias"), moe_layer_param(&f, "experts.fc2.bias"),
                                   moe_layer_param(&f, "experts.fc3.bias")};
        const moe_gguf_type ts[3] = {ty, ty, ty};
        for (int t = 0; t < T; t++) {
          double want[D] = {0}, mag[D] = {0};
          for (int j = 0; j < k; j++) {
            int e = sq.experts[t * k + j];
            double g = sq.weights[t * k + j];
            ref_expert(ts, &c, w1, w2, w3, b, e, x + t * D, out);
            for (int d = 0; d < D; d++) want[d] += g * out[d], mag[d] += fabs(g) * (fabs(out[d]) + 1);
          }
          for (int d = 0; d < D; d++)
            if (fabs(yq[t * D + d] - want[d]) > 2e-5 * mag[d])
              FAIL_("%s %s k=%d token %d column %d: %.9g, float64 %.9g", moe_gguf_type_name(ty), moe_act_name(act), k,
                    t, d, yq[t * D + d], want[d]);
        }
        moe_layer_free(&q), moe_layer_free(&f);
      }
  free(x), free(yq), free(yf);
}

/* x and the gate's weights on a grid of 1/64 (|x| < 8, |w| <= 1): each product a multiple of 2^-12 and
 * every partial sum under 2^11, so the router's logits are exact in any order of summation, and one
 * token's logits are the same bits whether a GEMV or a GEMM computed them (without AVX-512 the
 * router's products are the BLAS's, whose order depends on the number of rows). */
static void exact_router(moe_layer_t *l, float *x, int n) {
  float *w = moe_layer_param(l, "gate.weight");
  for (int i = 0; i < E * D; i++) w[i] = roundf(w[i] * 64 > 64 ? 64 : w[i] * 64 < -64 ? -64 : w[i] * 64) / 64;
  for (int i = 0; i < n; i++) x[i] = roundf(x[i] * 64) / 64;
}

/* Decode (one token a forward: GEMVs) and prefill (all tokens: the tiled products), one thread or
 * two: the same bits. */
TEST(quant_layer_decode_equals_prefill) {
  float *x = malloc(T * D * 4), *y = malloc(T * D * 4), *y1 = malloc(T * D * 4);
  random_x(x, T * D, 2);
  for (int ti = 0; ti < NTYPES; ti++) {
    moe_layer_config c = config(ti % 2 ? MOE_ACT_SWIGLU : MOE_ACT_RELU, 2);
    moe_layer_t l;
    ASSERT_OK(moe_layer_init(&l, &c));
    moe_layer_init_params(&l, 11);
    random_biases(&l, 4);
    exact_router(&l, x, T * D);
    ASSERT_OK(moe_layer_quantize_experts(&l, kTypes[ti]));
    ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, NULL));
    for (int t = 0; t < T; t++) {
      moe_layer_set_threads(&l, 1 + t % 2);
      ASSERT_OK(moe_layer_forward(&l, x + t * D, 1, y1 + t * D, NULL, NULL));
    }
    for (int i = 0; i < T * D; i++)
      if (memcmp(&y[i], &y1[i], 4))
        FAIL_("%s: token %d column %d: prefill %.9g, decode %.9g", moe_gguf_type_name(kTypes[ti]), i / D, i % D, y[i], y1[i]);
    moe_layer_free(&l);
  }
  free(x), free(y), free(y1);
}

/* A layer made with expert_type and given the bytes (ggml's layout: the (E, H, D) tensors' rows) gives
 * the bits of the layer that quantized the same fp32 experts itself; and the quantized copy follows
 * the parameters after moe_layer_params_changed. */
TEST(quant_layer_bound_bytes) {
  float *x = malloc(T * D * 4), *y = malloc(T * D * 4), *yb = malloc(T * D * 4);
  random_x(x, T * D, 3);
  moe_gguf_type ty = MOE_GGUF_Q4_K;
  moe_layer_config c = config(MOE_ACT_SWIGLU, 2);
  moe_layer_t q, b;
  ASSERT_OK(moe_layer_init(&q, &c));
  moe_layer_init_params(&q, 5);
  random_biases(&q, 6);
  c.expert_type = ty;
  ASSERT_OK(moe_layer_init(&b, &c));
  ASSERT(!moe_layer_param_find(&b, "experts.fc1.weight") && moe_layer_param_find(&b, "experts.fc1.bias"));
  for (int i = 0; i < b.nparams; i++) /* the gate and the biases */
    memcpy(b.params + b.info[i].offset, moe_layer_param(&q, b.info[i].name), b.info[i].numel * 4);
  ASSERT_STATUS(moe_layer_forward(&b, x, T, yb, NULL, NULL), MOE_ERR_STATE); /* nothing bound yet */
  ASSERT(strstr(moe_last_error(), "moe_layer_bind_experts"));
  size_t n = (size_t)E * H * D, bytes = n / 256 * 144;
  uint8_t *w[3];
  const char *names[3] = {"experts.fc1.weight", "experts.fc2.weight", "experts.fc3.weight"};
  for (int i = 0; i < 3; i++) {
    w[i] = malloc(bytes);
    ASSERT_OK(moe_gguf_quantize(ty, moe_layer_param(&q, names[i]), w[i], (int64_t)n));
  }
  ASSERT_STATUS(moe_layer_bind_experts(&b, ty, w[0], w[1], NULL), MOE_ERR_ARG); /* swiglu needs fc3 */
  ASSERT_OK(moe_layer_bind_experts(&b, ty, w[0], w[1], w[2]));
  ASSERT_OK(moe_layer_quantize_experts(&q, ty));
  ASSERT_OK(moe_layer_forward(&q, x, T, y, NULL, NULL));
  ASSERT_OK(moe_layer_forward(&b, x, T, yb, NULL, NULL));
  ASSERT(memcmp(y, yb, T * D * 4) == 0);
  ASSERT_STATUS(moe_layer_quantize_experts(&b, ty), MOE_ERR_STATE); /* it has no fp32 experts */
  moe_st_writer *sw;
  ASSERT_OK(moe_st_writer_new(&sw));
  ASSERT_STATUS(moe_layer_save_params(&b, sw), MOE_ERR_STATE); /* nor any to save */
  ASSERT_OK(moe_layer_save_params(&q, sw));                     /* its fp32 master */
  moe_st_writer_free(sw);
  /* new fp32 weights: quantized again at the next forward, as the bytes made from them are */
  float *w1 = moe_layer_param(&q, "experts.fc1.weight");
  for (size_t i = 0; i < n; i += 3) w1[i] *= -0.5f;
  moe_layer_params_changed(&q);
  ASSERT_OK(moe_gguf_quantize(ty, w1, w[0], (int64_t)n));
  ASSERT_OK(moe_layer_forward(&q, x, T, y, NULL, NULL));
  ASSERT_OK(moe_layer_forward(&b, x, T, yb, NULL, NULL));
  ASSERT(memcmp(y, yb, T * D * 4) == 0);
  moe_layer_free(&q), moe_layer_free(&b);
  for (int i = 0; i < 3; i++) free(w[i]);
  free(x), free(y), free(yb);
}

/* What quantized experts cannot do is an error naming it. */
TEST(quant_layer_refusals) {
  moe_layer_config c = config(MOE_ACT_RELU, 2);
  moe_layer_t l;
  float x[D], y[D], dx[D];
  random_x(x, D, 4);
  ASSERT_OK(moe_layer_init(&l, &c));
  moe_layer_init_params(&l, 1);
  ASSERT_OK(moe_layer_quantize_experts(&l, MOE_GGUF_Q8_0));
  ASSERT_OK(moe_layer_forward(&l, x, 0, y, NULL, NULL)); /* no tokens: nothing to do */
  ASSERT_OK(moe_layer_forward(&l, x, 1, y, NULL, NULL));
  ASSERT_STATUS(moe_layer_backward(&l, y, 0, 0, NULL, NULL, dx), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "Q8_0") && strstr(moe_last_error(), "inference only"));
  ASSERT_STATUS(moe_layer_set_pipeline(&l, 2, MOE_REUSE_NONE), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "Q8_0"));
  ASSERT_STATUS(moe_layer_quantize_experts(&l, MOE_GGUF_F32), MOE_ERR_ARG); /* no kernel */
  ASSERT_STATUS(moe_layer_quantize_experts(&l, (moe_gguf_type)6), MOE_ERR_ARG); /* Q5_0: no codec here */
  moe_layer_param(&l, "experts.fc2.weight")[5] = NAN; /* not a value of any type: named, and no experts left */
  ASSERT_STATUS(moe_layer_quantize_experts(&l, MOE_GGUF_Q4_K), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "experts.fc2.weight") && strstr(moe_last_error(), "value 5"));
  ASSERT_STATUS(moe_layer_forward(&l, x, 1, y, NULL, NULL), MOE_ERR_STATE);
  moe_layer_free(&l);
  struct {
    const char *why;
    void (*set)(moe_layer_config *);
  } bad[] = {
      {"pipeline", NULL}, {"inner_experts", NULL}, {"dtype", NULL}, {"block", NULL}, {"expert_type", NULL}};
  for (int i = 0; i < 5; i++) {
    moe_layer_config b = config(MOE_ACT_RELU, 2);
    b.expert_type = MOE_GGUF_Q4_K;
    if (i == 0) b.pipeline = 2;
    if (i == 1) b.inner_experts = 2, b.inner_top_k = 1;
    if (i == 2) b.dtype = MOE_DT_BF16;
    if (i == 3) b.D = 128;
    if (i == 4) b.expert_type = -2;
    ASSERT_STATUS(moe_layer_init(&l, &b), MOE_ERR_ARG);
    if (!strstr(moe_last_error(), bad[i].why)) FAIL_("case %d: '%s' does not name %s", i, moe_last_error(), bad[i].why);
  }
  /* the default (-1) and F32 are the fp32 experts: they train */
  c.expert_type = MOE_GGUF_F32;
  ASSERT_OK(moe_layer_init(&l, &c));
  ASSERT(moe_layer_param_find(&l, "experts.fc1.weight"));
  moe_layer_free(&l);
}

/* Experts bound with a type per projection (moe_layer_bind_experts_typed: a Q4_K gate, a Q6_K down
 * projection, a BF16 up projection whose activations are fp32, not Q8_K) against the float64 reference
 * that quantizes each projection's input for its own type; decode and prefill the same bits;
 * moe_layer_expert_type names each; a type without kernels is refused naming it. */
TEST(quant_layer_mixed_types) {
  float *x = malloc(T * D * 4), *y = malloc(T * D * 4), *y1 = malloc(T * D * 4);
  random_x(x, T * D, 8);
  const moe_gguf_type ts[3] = {MOE_GGUF_Q4_K, MOE_GGUF_Q6_K, MOE_GGUF_BF16};
  moe_layer_config c = config(MOE_ACT_SWIGLU, 2);
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &c));
  moe_layer_init_params(&l, 9);
  random_biases(&l, 10);
  exact_router(&l, x, T * D);
  uint8_t *w[3];
  dequantized_experts_typed(&l, ts, w);
  const moe_gguf_type bad[3] = {MOE_GGUF_Q4_K, MOE_GGUF_F32, MOE_GGUF_Q4_K};
  ASSERT_STATUS(moe_layer_bind_experts_typed(&l, bad, w[0], w[1], w[2]), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "F32"));
  ASSERT_OK(moe_layer_bind_experts_typed(&l, ts, w[0], w[1], w[2]));
  for (int fc = 1; fc <= 3; fc++) ASSERT(moe_layer_expert_type(&l, fc) == ts[fc - 1]);
  moe_layer_stats st;
  ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, &st));
  const float *w1 = moe_layer_param(&l, "experts.fc1.weight"), *w2 = moe_layer_param(&l, "experts.fc2.weight"),
              *w3 = moe_layer_param(&l, "experts.fc3.weight");
  const float *const b[3] = {moe_layer_param(&l, "experts.fc1.bias"), moe_layer_param(&l, "experts.fc2.bias"), NULL};
  double out[D];
  for (int t = 0; t < T; t++) {
    double want[D] = {0}, mag[D] = {0};
    for (int j = 0; j < 2; j++) {
      ref_expert(ts, &c, w1, w2, w3, b, st.experts[t * 2 + j], x + t * D, out);
      for (int d = 0; d < D; d++) want[d] += st.weights[t * 2 + j] * out[d], mag[d] += fabs(st.weights[t * 2 + j]) * (fabs(out[d]) + 1);
    }
    for (int d = 0; d < D; d++)
      if (fabs(y[t * D + d] - want[d]) > 2e-5 * mag[d]) FAIL_("token %d column %d: %.9g, float64 %.9g", t, d, y[t * D + d], want[d]);
  }
  for (int t = 0; t < T; t++) ASSERT_OK(moe_layer_forward(&l, x + t * D, 1, y1 + t * D, NULL, NULL));
  for (int i = 0; i < T * D; i++)
    if (memcmp(&y[i], &y1[i], 4)) FAIL_("token %d column %d: prefill %.9g, decode %.9g", i / D, i % D, y[i], y1[i]);
  moe_layer_free(&l);
  for (int i = 0; i < 3; i++) free(w[i]);
  free(x), free(y), free(y1);
}
