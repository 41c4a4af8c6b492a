/* The language model under expert parallelism (cfg.moe.dist, W ranks): rank r holds experts
 * [r E/W, (r+1) E/W) of every layer, or with parallel_r (Tutel's sharded layout) its shard of every
 * expert, the other parameters replicated. Checkpoints are the one-process
 * model's, whatever W: saving gathers every rank's experts and rank 0 writes; loading is moe_lm_load's
 * (each rank reads its own tensors by name). A vector in the order of a model's refs (its parameters
 * or Adam's moments) maps to and from the one-process order by the same names. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "internal.h"
#include "lm_dist.h"
#include "lm_family.h"
#include "lm_gptoss.h"

/* The one-process model of m's configuration (every expert; zero parameters). */
static moe_status whole_init(const moe_lm_t *m, moe_lm_t *whole) {
  moe_lm_config c = m->cfg;
  c.moe.dist = NULL;
  return moe_lm_init(whole, &c);
}

/* Where each of m's refs starts in the one-process order (woff, m->nrefs) and in m's (loff). */
static moe_status offsets(const moe_lm_t *m, size_t **woff, size_t **loff, size_t *wn) {
  moe_lm_t w;
  MOE_CHECK(whole_init(m, &w));
  size_t *all = calloc((size_t)w.nrefs, sizeof *all);
  *woff = malloc((size_t)m->nrefs * sizeof **woff);
  *loff = malloc((size_t)m->nrefs * sizeof **loff);
  moe_status st = all && *woff && *loff ? MOE_OK : MOE_ERR_NOMEM;
  for (int i = 1; st == MOE_OK && i < w.nrefs; i++) all[i] = all[i - 1] + w.refs[i - 1].numel;
  size_t at = 0;
  for (int i = 0; st == MOE_OK && i < m->nrefs; i++) {
    const moe_tensor_ref *r = moe__ref_find(w.refs, w.nrefs, m->refs[i].name);
    (*woff)[i] = r ? all[r - w.refs] : 0; /* every name of a rank's model is the whole one's */
    (*loff)[i] = at;
    at += m->refs[i].numel;
  }
  *wn = w.numel;
  free(all);
  moe_lm_free(&w);
  if (st != MOE_OK) {
    free(*woff);
    free(*loff);
    MOE_TRY(0, st, "language model: out of memory for the offsets of %d tensors", m->nrefs);
  }
  return MOE_OK;
}

/* Whether r is one of gpt-oss's stacked expert tensors (every expert of a layer, the rank's E/W of them
 * under expert parallelism): the converted gate/up/down and down_proj_bias. */
static int stacked_ref(const moe_lm_t *m, const moe_tensor_ref *r) {
  const char *b = strstr(r->name, ".mlp.experts.down_proj_bias");
  return moe__gptoss_converted(m->cfg.family, r->name) || (m->cfg.family == MOE_LM_GPT_OSS && b && !b[27]);
}

/* Whether r is a routed expert's tensor; *down: its down projection (fc2, (D, H)). */
static int expert_ref(const moe_lm_t *m, const moe_tensor_ref *r, int *down) {
  int e, j;
  *down = 0;
  if (stacked_ref(m, r)) return 1;
  if (!moe__lm_expert_of(m->cfg.family, r->name, &e, &j)) return 0;
  *down = moe__lm_family(m->cfg.family)->fc[j] == 1;
  return 1;
}

/* Whether m's experts are sharded (every rank a slice of each) rather than owned whole. */
static int sharded(const moe_lm_t *m) {
  return moe_dist_size(m->cfg.moe.dist) > 1 && m->cfg.moe.parallel_r != MOE_PARALLEL_OFF;
}

void moe__lm_part_of(const moe_lm_t *m, const moe_tensor_ref *r, moe__lm_part *p) {
  *p = (moe__lm_part){*r, 1, r->numel, 0, 0};
  int w2;
  if (moe_dist_size(m->cfg.moe.dist) > 1 && !sharded(m) && stacked_ref(m, r)) { /* rows [q E/W, (q + 1) E/W) of the stacked tensor */
    size_t per = r->numel / (size_t)r->shape[0];
    p->whole.shape[0] = m->cfg.moe.E;
    p->whole.numel = per * (size_t)m->cfg.moe.E;
    p->first = per * (size_t)r->shape[0] * (size_t)moe_dist_rank(m->cfg.moe.dist);
    return;
  }
  if (!sharded(m) || !expert_ref(m, r, &w2)) return;
  const moe_dist *d = m->cfg.moe.dist;
  int64_t H = m->cfg.moe.H, D = m->cfg.moe.D, W = moe_dist_size(d), q = moe_dist_rank(d);
  int64_t lo = H * q / W, hi = H * (q + 1) / W;
  p->whole.shape[0] = w2 ? D : H;
  p->whole.shape[1] = w2 ? H : D;
  p->whole.numel = (size_t)(H * D);
  if (w2) *p = (moe__lm_part){p->whole, (size_t)D, (size_t)(hi - lo), (size_t)lo, (size_t)H};
  else p->first = (size_t)(lo * D);
}

void moe__lm_part_copy(const moe__lm_part *p, const float *src, float *dst, int to_whole) {
  for (size_t i = 0; i < p->runs; i++) {
    size_t local = i * p->len, whole = p->first + i * p->stride;
    memcpy(dst + (to_whole ? whole : local), src + (to_whole ? local : whole), p->len * 4);
  }
}

size_t moe_lm_whole_numel(const moe_lm_t *m) {
  int W = moe_dist_size(m->cfg.moe.dist), El = sharded(m) ? m->cfg.moe.E : m->cfg.moe.E / W;
  if (m->cfg.family == MOE_LM_GPT_OSS) El = m->cfg.moe.E; /* its stacked experts count whole below */
  size_t n = (size_t)moe__lm_moe_layers(&m->cfg) * (m->cfg.moe.E - El) * 3 * m->cfg.moe.H * m->cfg.moe.D; /* others' */
  for (int i = 0; i < m->nrefs; i++) { /* and every ref whole (a shard counts as its whole tensor) */
    moe__lm_part p;
    moe__lm_part_of(m, &m->refs[i], &p);
    n += p.whole.numel;
  }
  return n;
}

moe_status moe_lm_gather(const moe_lm_t *m, const float *local, float *whole) {
  MOE_TRY(m && m->st && local && whole, MOE_ERR_ARG, "moe_lm_gather: NULL argument");
  const moe_dist *d = m->cfg.moe.dist;
  if (moe_dist_size(d) < 2) {
    memcpy(whole, local, m->numel * 4);
    return MOE_OK;
  }
  size_t *woff, *loff, wn;
  MOE_CHECK(offsets(m, &woff, &loff, &wn));
  memset(whole, 0, wn * 4);
  int down;
  for (int i = 0; i < m->nrefs; i++) /* a sum of zeros and one rank's values: the replicated ones rank 0's */
    if (expert_ref(m, &m->refs[i], &down) || moe_dist_rank(d) == 0) {
      moe__lm_part p;
      moe__lm_part_of(m, &m->refs[i], &p);
      moe__lm_part_copy(&p, local + loff[i], whole + woff[i], 1);
    }
  free(woff);
  free(loff);
  MOE_TRY(wn <= INT32_MAX, MOE_ERR_ARG, "moe_lm_gather: %zu floats are too many for one exchange", wn);
  return moe__dist_allreduce_f32(d, whole, (int)wn);
}

moe_status moe_lm_scatter(const moe_lm_t *m, const float *whole, float *local) {
  MOE_TRY(m && m->st && local && whole, MOE_ERR_ARG, "moe_lm_scatter: NULL argument");
  if (moe_dist_size(m->cfg.moe.dist) < 2) {
    memcpy(local, whole, m->numel * 4);
    return MOE_OK;
  }
  size_t *woff, *loff, wn;
  MOE_CHECK(offsets(m, &woff, &loff, &wn));
  for (int i = 0; i < m->nrefs; i++) {
    moe__lm_part p;
    moe__lm_part_of(m, &m->refs[i], &p);
    moe__lm_part_copy(&p, whole + woff[i], local + loff[i], 0);
  }
  free(woff);
  free(loff);
  return MOE_OK;
}

/* The one-process model with every rank's parameters (a collective). */
static moe_status whole_of(const moe_lm_t *m, moe_lm_t *whole) {
  memset(whole, 0, sizeof *whole);
  float *local = malloc(m->numel * 4), *all = malloc(moe_lm_whole_numel(m) * 4);
  moe_status st = local && all ? MOE_OK : MOE_ERR_NOMEM;
  for (size_t i = 0, at = 0; st == MOE_OK && i < (size_t)m->nrefs; at += m->refs[i].numel, i++)
    memcpy(local + at, m->refs[i].data, m->refs[i].numel * 4);
  if (st == MOE_OK) st = moe_lm_gather(m, local, all);
  if (st == MOE_OK) st = whole_init(m, whole);
  for (size_t i = 0, at = 0; st == MOE_OK && i < (size_t)whole->nrefs; at += whole->refs[i].numel, i++)
    memcpy(whole->refs[i].data, all + at, whole->refs[i].numel * 4);
  free(local);
  free(all);
  if (st != MOE_OK && whole->st) moe_lm_free(whole);
  MOE_TRY(st != MOE_ERR_NOMEM, st, "language model: out of memory for the %zu parameters of every rank",
          moe_lm_whole_numel(m));
  return st;
}

moe_status moe__lm_save_ranks(const moe_lm_t *m, const char *dir) {
  moe_lm_t w;
  MOE_CHECK(whole_of(m, &w));
  moe_status st = moe_dist_rank(m->cfg.moe.dist) == 0 ? moe_lm_save(&w, dir) : MOE_OK;
  moe_lm_free(&w);
  return st;
}
