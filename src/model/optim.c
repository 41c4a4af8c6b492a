/* Optimizers over a parameter table (a model's or a language model's refs, in their order): AdamW
 * (decoupled weight decay on matrices) and SGD with momentum; and the learning-rate schedule (linear
 * warm-up, cosine decay). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "internal.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

const char *moe_opt_name(moe_opt_kind k) { return k == MOE_OPT_SGD ? "sgd" : "adam"; }

moe_status moe_opt_parse(const char *s, const char *field, moe_opt_kind *out) {
  static const char *const names[] = {"adam", "sgd"};
  int v;
  MOE_CHECK(moe__parse_name(s, field, names, 2, &v));
  *out = (moe_opt_kind)v;
  return MOE_OK;
}

void moe_optim_config_default(moe_optim_config *c) {
  memset(c, 0, sizeof *c);
  c->kind = MOE_OPT_ADAM;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = 1e-8f;
  c->momentum = 0.9f;
}

moe_status moe_optim_init(moe_optim_t *o, const moe_optim_config *c, const moe_model_t *m) {
  return moe_optim_init_n(o, c, m->numel);
}

moe_status moe_optim_init_n(moe_optim_t *o, const moe_optim_config *c, size_t numel) {
  memset(o, 0, sizeof *o);
  MOE_TRY((unsigned)c->kind <= MOE_OPT_SGD, MOE_ERR_ARG, "optimizer: unknown kind %d", c->kind);
  MOE_TRY(c->weight_decay >= 0 && isfinite(c->weight_decay), MOE_ERR_ARG, "optimizer: weight_decay must be >= 0");
  o->cfg = *c;
  o->n = numel;
  o->m = moe__calloc_big(o->n ? o->n : 1, 4);
  o->v = c->kind == MOE_OPT_ADAM ? moe__calloc_big(o->n ? o->n : 1, 4) : NULL;
  if (!o->m || (c->kind == MOE_OPT_ADAM && !o->v)) {
    moe_optim_free(o);
    MOE_TRY(0, MOE_ERR_NOMEM, "optimizer: cannot allocate state for %zu parameters", numel);
  }
  return MOE_OK;
}

void moe_optim_free(moe_optim_t *o) {
  free(o->m);
  free(o->v);
  memset(o, 0, sizeof *o);
}

int moe_param_decays(const moe_tensor_ref *r) { return r->ndim >= 2 && !strstr(r->name, "bias"); }

enum { BLK = 256,         /* elements per block: the denominators of a block stay in L1 */
       PAR_MIN = 1 << 16 }; /* below this many parameters, threads cost more than they give */

/* s[i] = sqrtf(s[i]): vsqrtps where the build has AVX-512, since sqrtf's errno check keeps the
 * compiler from vectorizing it; both are correctly rounded, so the bits are the same. */
static void sqrt_block(float *s, int n) {
  int i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_sqrt_ps(_mm512_loadu_ps(s + i)));
#endif
  for (; i < n; i++) s[i] = sqrtf(s[i]);
}

typedef struct {
  const moe_optim_config *c;
  float lr, bc1, bc2;
} step_consts;

/* Updates n parameters p from their gradients g and state mo, v (NULL for SGD) with weight decay wd,
 * then zeroes g when `zero` (each block while it is in L1, saving the next step a pass). Returns 0
 * when every updated value is finite (x - x is 0 then, NaN otherwise): the finiteness check rides on
 * the pass that writes them. simd: the arrays do not overlap, which the compiler cannot know; each
 * element is computed as a scalar loop would compute it. */
static float update(const step_consts *k, float wd, float *p, float *g, float *mo, float *v, size_t n, int zero) {
  const moe_optim_config *c = k->c;
  float bad = 0, den[BLK];
  for (size_t b = 0; b < n; b += BLK) {
    int nb = n - b < BLK ? (int)(n - b) : BLK;
    float *pb = p + b, *mb = mo + b, *gb = g + b;
    if (c->kind == MOE_OPT_ADAM) {
      float *vb = v + b;
#pragma omp simd
      for (int j = 0; j < nb; j++) {
        mb[j] = c->beta1 * mb[j] + (1.0f - c->beta1) * gb[j];
        vb[j] = c->beta2 * vb[j] + (1.0f - c->beta2) * gb[j] * gb[j];
        den[j] = vb[j] / k->bc2;
      }
      sqrt_block(den, nb);
#pragma omp simd reduction(+ : bad)
      for (int j = 0; j < nb; j++) {
        float mh = mb[j] / k->bc1;
        pb[j] -= k->lr * (mh / (den[j] + c->eps) + wd * pb[j]);
        bad += (pb[j] - pb[j]) + (mb[j] - mb[j]) + (vb[j] - vb[j]);
      }
    } else {
#pragma omp simd reduction(+ : bad)
      for (int j = 0; j < nb; j++) {
        mb[j] = c->momentum * mb[j] + gb[j] + wd * pb[j];
        pb[j] -= k->lr * mb[j];
        bad += (pb[j] - pb[j]) + (mb[j] - mb[j]);
      }
    }
    if (zero) memset(gb, 0, (size_t)nb * sizeof *gb);
  }
  return bad;
}

/* One update of every ref, the flattened parameters split evenly over nt threads (one parallel
 * region for all tensors; a tensor may be shared by two threads), the gradients zeroed when `zero`.
 * Returns whether every updated parameter and state value is finite. */
static int step_all(moe_optim_t *o, moe_tensor_ref *refs, int nrefs, float lr, int nt, int zero) {
  const moe_optim_config *c = &o->cfg;
  o->step++;
  step_consts k = {c, lr, 1.0f - powf(c->beta1, (float)o->step), 1.0f - powf(c->beta2, (float)o->step)};
  size_t total = 0;
  for (int i = 0; i < nrefs; i++) total += refs[i].numel;
  int bad = 0;
#pragma omp parallel num_threads(nt) reduction(| : bad) if (total >= PAR_MIN)
  {
    size_t t = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
    size_t lo = total * t / T / 16 * 16, hi = t + 1 == T ? total : total * (t + 1) / T / 16 * 16;
    size_t off = 0; /* of ref i */
    for (int i = 0; i < nrefs && off < hi; off += refs[i++].numel) {
      size_t a = lo > off ? lo - off : 0, e = hi - off < refs[i].numel ? hi - off : refs[i].numel;
      if (a >= e) continue;
      moe_tensor_ref *r = &refs[i];
      float wd = moe_param_decays(r) ? c->weight_decay : 0.0f;
      float *v = o->v ? o->v + off + a : NULL;
      bad |= update(&k, wd, r->data + a, r->grad + a, o->m + off + a, v, e - a, zero) != 0;
    }
  }
  return !bad;
}

/* The step over a model's refs; returns whether everything it wrote is finite. */
static int step_model(moe_optim_t *o, moe_model_t *m, float lr, int zero) {
  int finite = step_all(o, m->refs, m->nrefs, lr, moe__threads(m->cfg.moe.threads), zero);
  for (int i = 0; i < m->cfg.blocks; i++) moe_layer_params_changed(&m->layers[i]); /* bf16 copies */
  return finite;
}

void moe_optim_step(moe_optim_t *o, moe_model_t *m, float lr) { (void)step_model(o, m, lr, 0); }

moe_status moe_optim_step_checked(moe_optim_t *o, moe_model_t *m, float lr) {
  /* the scan that names the first bad value only when the update saw one; the ranks agree either way */
  return moe__model_check_finite(m, o, !step_model(o, m, lr, 1));
}

void moe_optim_step_refs(moe_optim_t *o, moe_tensor_ref *refs, int nrefs, float lr, int threads) {
  (void)step_all(o, refs, nrefs, lr, moe__threads(threads), 0);
}

float moe_lr_schedule(float base, int64_t s, int64_t warmup, int64_t total) {
  if (s < warmup) return base * (float)(s + 1) / (float)warmup;
  if (total <= warmup) return base;
  double p = (double)(s - warmup) / (double)(total - warmup);
  if (p > 1) p = 1;
  return (float)(base * 0.5 * (1.0 + cos(M_PI * p)));
}
