/* FlexMoE in training (moe_flex_trainer, moe.h; DESIGN 3.4): after every step each block's
 * all-gathered counts go to a RECOMPILE trigger thread, which runs the scheduler and policy maker on
 * its own copy of the placement (the placement as it will be once its earlier decisions have landed)
 * and hands the new placement back; it lands delta_launch + 1 steps later. Rank 0's decisions are the
 * ones applied, on every rank at the same step (which metrics a trigger sees depends on timing). A
 * placement lands by moving, point to point, the weights and optimizer state of every expert a rank
 * newly holds from the holder nearest in rank number, then laying out each rank's rows anew. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "flex/wire.h"

#define NREF 5 /* expert tensors of a block: fc1 and fc2 weights and biases, fc3 */

typedef struct {
  float *p[NREF], *m[NREF], *v[NREF], *g[NREF]; /* each tensor's rows: parameters, moments, gradients */
  size_t n[NREF];                                /* one row's floats */
  int nt;
} block_rows;

struct moe_flex_trainer {
  int L, W, E, Ev, me;
  const moe_dist *dist;
  moe__flex_env env;
  moe_flex_env penv;
  moe__flex_policy pol;
  moe__flex_table *decided; /* (L) the trigger's placements */
  moe__flex_table *blocks;  /* (L) expert parallelism's blocks: the ratio without replicas */
  moe__flex_plan plan;
  moe_recompile *rc;
  int32_t *metrics;         /* (L W E) */
  double *agree;            /* (3 + L W Ev) rank 0's decision */
  int payload;              /* 3 + L W Ev */
  moe__flex_op *forced;     /* the test hook's operations, at steps forced_at */
  int64_t *forced_at;
  int nforced, fcap;
  moe_flex_stats stats;
};

/* The ratio without replicas and with them, over the blocks' mean. */
static void book_balance(moe_flex_trainer *t, const moe_model_t *m) {
  double with = 0, without = 0;
  int64_t *Ie = malloc(sizeof *Ie * (size_t)t->E);
  if (!Ie) return;
  for (int b = 0; b < t->L; b++) {
    const moe_layer_stats *ls = moe_model_layer_stats(m, b);
    for (int e = 0; e < t->E; e++) Ie[e] = ls->expert_counts[e];
    with += moe__flex_balance(&m->layers[b].st->flex->t, Ie) / t->L;
    without += moe__flex_balance(&t->blocks[b], Ie) / t->L;
  }
  free(Ie);
  t->stats.steps++;
  t->stats.balance_sum += with;
  t->stats.balance_blocks_sum += without;
  t->stats.balance_last = with;
}

/* The trigger thread: the policy over each block's counts, on the placement as decided so far. */
static int trigger(const moe_metrics *mt, moe_adjustment *out, void *user) {
  moe_flex_trainer *t = user;
  int changed = 0, ops[3] = {0};
  int64_t *Isrc = malloc(sizeof *Isrc * (size_t)t->W * t->E);
  if (!Isrc) return 0;
  for (int b = 0; b < t->L; b++) {
    for (int i = 0; i < t->W * t->E; i++) Isrc[i] = mt->counts[(size_t)b * t->W * t->E + i];
    if (moe__flex_schedule(&t->decided[b], Isrc, &t->env, &t->pol, &t->plan) != MOE_OK) continue;
    for (int i = 0; i < t->plan.nops; i++) ops[t->plan.ops[i].kind]++;
    changed |= t->plan.nops > 0;
  }
  free(Isrc);
  if (!changed) return 0;
  for (int k = 0; k < 3; k++) out->capacity[k] = ops[k];
  for (int b = 0; b < t->L; b++)
    memcpy(out->capacity + 3 + (size_t)b * t->W * t->Ev, t->decided[b].slot, sizeof(int) * (size_t)t->W * t->Ev);
  out->set_placement = 1;
  return 1;
}

/* Seconds of the fastest of 3 runs of an exchange of `rows` rows of D floats with every other rank. */
static moe_status time_a2a(const moe_flex_trainer *t, int rows, int D, float *buf, double *s) {
  int c[4 * MOE__FLEX_MAX_RANKS];
  for (int q = 0; q < t->W; q++) c[q] = c[2 * t->W + q] = q == t->me ? 0 : rows, c[t->W + q] = c[3 * t->W + q] = q * rows;
  *s = INFINITY;
  for (int k = 0; k < 3; k++) {
    double t0 = moe__now();
    MOE_CHECK(moe__dist_alltoallv_rows(t->dist, buf, c, c + t->W, buf + (size_t)t->W * rows * D, c + 2 * t->W,
                                       c + 3 * t->W, D));
    *s = fmin(*s, moe__now() - t0);
  }
  return MOE_OK;
}

/* latency and bandwidth from (bytes, seconds), the seconds the mean over ranks so that every rank
 * fits the same; a fit that fails (noise: a slope <= 0) falls back to the largest sample's rate. */
static moe_status fit_link(const moe_flex_trainer *t, const double *x, double *s, int n, moe__flex_link *out) {
  MOE_CHECK(moe_dist_allreduce(t->dist, s, n));
  for (int i = 0; i < n; i++) s[i] /= t->W;
  if (moe__flex_fit(x, s, n, out) != MOE_OK || out->lat < 0) *out = (moe__flex_link){0, x[n - 1] / s[n - 1]};
  return MOE_OK;
}

/* Start-up profile (P3 1.5): tokens per second of the experts' GEMMs (forward and backward: 6 GEMMs
 * of D x H per token, 9 with swiglu), and the all-to-all's and the all-reduce's latency and bandwidth
 * fitted over 4 sizes each. */
static moe_status profile(moe_flex_trainer *t, const moe_layer_config *c) {
  double flops = moe_sgemm_gflops(256, c->threads, 3) * 1e9;
  double per_token = 2.0 * (c->act == MOE_ACT_SWIGLU ? 9 : 6) * c->D * c->H;
  int sizes[4] = {1, 16, 64, 256}, D = c->D, W = t->W;
  float *buf = calloc((size_t)2 * W * 256 * D, sizeof *buf);
  MOE_TRY(buf, MOE_ERR_NOMEM, "replicas: profiling buffers");
  double x[4], s[4];
  moe__flex_link a2a, ar;
  moe_status st = MOE_OK;
  for (int i = 0; st == MOE_OK && i < 4; i++) {
    x[i] = 4.0 * D * sizes[i];
    st = time_a2a(t, sizes[i], D, buf, &s[i]);
  }
  if (st == MOE_OK) st = fit_link(t, x, s, 4, &a2a);
  for (int i = 0; st == MOE_OK && i < 4; i++) {
    int n = sizes[i] * D;
    x[i] = 2.0 * (W - 1) / W * 4.0 * n;
    s[i] = INFINITY;
    for (int k = 0; st == MOE_OK && k < 3; k++) {
      double t0 = moe__now();
      st = moe__dist_allreduce_f32(t->dist, buf, n);
      s[i] = fmin(s[i], moe__now() - t0);
    }
  }
  if (st == MOE_OK) st = fit_link(t, x, s, 4, &ar);
  free(buf);
  MOE_CHECK(st);
  double tps = flops / per_token;
  MOE_CHECK(moe_dist_allreduce(t->dist, &tps, 1)); /* the mean: every rank plans alike */
  t->penv = (moe_flex_env){.tps = tps / W, .a2a_lat = a2a.lat, .a2a_bw = a2a.bw, .ar_lat = ar.lat, .ar_bw = ar.bw,
                           .token_bytes = 4.0 * D,
                           .expert_bytes = (double)moe__flex_expert_floats(c) * 4};
  t->env = moe__flex_env_of(&t->penv);
  return MOE_OK;
}

/* Block b's expert tensors: their rows in the parameters, the gradients and the optimizer's moments
 * (o may be NULL, or hold no second moment). */
static void rows_of(const moe_model_t *m, const moe_optim_t *o, int b, block_rows *r) {
  char prefix[48];
  snprintf(prefix, sizeof prefix, "blocks.%d.moe.experts.", b);
  size_t off = 0, n = strlen(prefix);
  *r = (block_rows){0};
  for (int i = 0; i < m->nrefs; off += m->refs[i++].numel) {
    const moe_tensor_ref *ref = &m->refs[i];
    if (strncmp(ref->name, prefix, n) || r->nt == NREF) continue;
    r->p[r->nt] = ref->data, r->g[r->nt] = ref->grad;
    r->m[r->nt] = o && o->m ? o->m + off : NULL;
    r->v[r->nt] = o && o->v ? o->v + off : NULL;
    r->n[r->nt++] = ref->numel / (size_t)ref->shape[0];
  }
}

/* Row j of the state (parameters, then the moments present) to or from a packed row. */
static size_t pack(const block_rows *r, int j, float *x, int out) {
  size_t k = 0;
  for (int i = 0; i < r->nt; i++) {
    float *a[3] = {r->p[i], r->m[i], r->v[i]};
    for (int q = 0; q < 3; q++) {
      if (!a[q]) continue;
      float *row = a[q] + (size_t)j * r->n[i];
      if (x) memcpy(out ? x + k : row, out ? row : x + k, r->n[i] * 4);
      k += r->n[i];
    }
  }
  return k;
}

/* The holder of e in t nearest to g in rank number (ties to the lower rank), as Expand's source. */
static int source_of(const moe__flex_table *t, int e, int g) {
  int src = -1;
  for (int h = 0; h < t->W; h++)
    if (moe__flex_count(t, e, h) && (src < 0 || abs(h - g) < abs(src - g))) src = h;
  return src;
}

/* Whether rank g holds e under nt and not under ot: a copy it needs. */
static int needs(const moe__flex_table *nt, const moe__flex_table *ot, int e, int g) {
  return moe__flex_count(nt, e, g) && !moe__flex_count(ot, e, g);
}

/* nt's slots from `slots` and its counts from them. */
static void set_slots(moe__flex_table *nt, const int *slots) {
  memcpy(nt->slot, slots, sizeof(int) * (size_t)nt->W * nt->Ev);
  memset(nt->n, 0, sizeof(int) * (size_t)nt->E * nt->W);
  for (int i = 0; i < nt->W * nt->Ev; i++)
    if (slots[i] >= 0 && slots[i] < nt->E) nt->n[(size_t)slots[i] * nt->W + i / nt->Ev]++;
}

/* Block b takes the placement `slots` (W x E_v): the copies its ranks need (each from the old holder
 * nearest in rank number), exchanged in one all-to-all-v of rows of one expert's state (weights and
 * moments), then each rank's rows laid out anew: its old row where it held the expert already, the
 * received one otherwise, zeros past its experts (which AdamW leaves at zero). */
static moe_status land(moe_flex_trainer *t, moe_model_t *m, moe_optim_t *o, int b, const int *slots) {
  moe__flex_layer *f = m->layers[b].st->flex;
  moe__flex_table nt = {0}, *ot = &f->t;
  MOE_CHECK(moe__flex_table_clone(&nt, ot));
  set_slots(&nt, slots);
  moe_status st = moe__flex_table_check(&nt);
  block_rows r;
  rows_of(m, o, b, &r);
  int width = (int)pack(&r, 0, NULL, 0), W = t->W, me = t->me, ns = 0, nr = 0, moved = 0;
  int c[4 * MOE__FLEX_MAX_RANKS] = {0}, *sc = c, *sd = c + W, *rc = c + 2 * W, *rd = c + 3 * W;
  for (int g = 0; g < W; g++)
    for (int e = 0; e < t->E; e++)
      if (needs(&nt, ot, e, g)) {
        int src = source_of(ot, e, g);
        sc[g] += src == me;
        rc[src] += g == me;
        moved++;
      }
  for (int q = 0; q < W; q++) sd[q] = ns, ns += sc[q], rd[q] = nr, nr += rc[q];
  float *sbuf = malloc(4 * (size_t)width * (ns + 1)), *rbuf = malloc(4 * (size_t)width * (nr + 1));
  float *old = malloc(4 * (size_t)width * t->Ev);
  if (st == MOE_OK && (!sbuf || !rbuf || !old))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: %d expert states to move", ns + nr);
  float *at = sbuf;
  for (int g = 0; st == MOE_OK && g < W; g++) /* in the order the receivers read: experts ascending */
    for (int e = 0; e < t->E; e++)
      if (needs(&nt, ot, e, g) && source_of(ot, e, g) == me) at += pack(&r, moe__flex_row_on(ot, me, e), at, 1);
  if (st == MOE_OK) st = moe__dist_alltoallv_rows(t->dist, sbuf, sc, sd, rbuf, rc, rd, width);
  if (st == MOE_OK) {
    for (int j = 0; j < f->nh; j++) pack(&r, j, old + (size_t)width * j, 1);
    for (int j = 0, h = 0; h < t->E; h++) { /* the new rows, experts ascending */
      if (!moe__flex_count(&nt, h, me)) continue;
      const float *from = moe__flex_count(ot, h, me) ? old + (size_t)width * moe__flex_row_on(ot, me, h)
                                                     : rbuf + (size_t)width * rd[source_of(ot, h, me)]++;
      pack(&r, j++, (float *)from, 0);
    }
    moe__flex_table_assign(ot, &nt);
    moe__flex_layer_sync_held(f);
    for (int i = 0; i < r.nt; i++) {
      size_t lo = (size_t)f->nh * r.n[i], n = (size_t)t->Ev * r.n[i] - lo;
      memset(r.p[i] + lo, 0, n * 4);
      memset(r.g[i] + lo, 0, n * 4);
      if (r.m[i]) memset(r.m[i] + lo, 0, n * 4);
      if (r.v[i]) memset(r.v[i] + lo, 0, n * 4);
    }
    t->stats.bytes_moved += 4.0 * width * moved;
    moe_layer_params_changed(&m->layers[b]);
  }
  free(sbuf), free(rbuf), free(old);
  moe__flex_table_free(&nt);
  return st;
}

/* The test hook's operations: "STEP:expand:E:G", "STEP:shrink:E:G" or "STEP:migrate:A:I:B:J",
 * separated by commas; on every block. */
static moe_status parse_forced(moe_flex_trainer *t, const char *spec) {
  for (const char *p = spec; p && *p;) {
    long long at;
    char kind[16];
    int a = -1, g = -1, b = -1, h = -1, used = 0;
    int n = sscanf(p, "%lld:%15[a-z]:%d:%d%n", &at, kind, &a, &g, &used);
    if (n == 4 && !strcmp(kind, "migrate")) {
      int more = 0;
      n += sscanf(p + used, ":%d:%d%n", &b, &h, &more) == 2 ? 2 : 0;
      used += more;
    }
    moe__flex_kind k = !strcmp(kind, "expand") ? MOE__FLEX_EXPAND : !strcmp(kind, "shrink") ? MOE__FLEX_SHRINK
                                                                                            : MOE__FLEX_MIGRATE;
    MOE_TRY(n == (k == MOE__FLEX_MIGRATE ? 6 : 4) && at >= 0 && (k != MOE__FLEX_MIGRATE || !strcmp(kind, "migrate")),
            MOE_ERR_ARG, "replica operations: bad entry at '%s' (want STEP:expand:E:G, STEP:shrink:E:G or "
            "STEP:migrate:A:I:B:J)", p);
    int cap = t->fcap;
    MOE_CHECK(moe__flex_reserve((void **)&t->forced, &t->fcap, t->nforced + 1, sizeof *t->forced));
    MOE_CHECK(moe__flex_reserve((void **)&t->forced_at, &cap, t->nforced + 1, sizeof *t->forced_at));
    t->forced[t->nforced] = (moe__flex_op){.kind = k, .e = a, .g = g, .b = b, .h = h};
    t->forced_at[t->nforced++] = at;
    p += used;
    MOE_TRY(!*p || *p == ',', MOE_ERR_ARG, "replica operations: bad entry at '%s'", p);
    p += *p == ',';
  }
  return MOE_OK;
}

/* The forced operations in step order on a copy of the placement: one that does not apply is an
 * error now, on every rank alike, rather than a failure of one landing later. */
static moe_status check_forced(moe_flex_trainer *t) {
  moe__flex_table c = {0};
  moe__flex_xfers x = {0};
  MOE_CHECK(moe__flex_table_clone(&c, &t->decided[0]));
  moe_status st = MOE_OK;
  int64_t last = -1;
  for (int i = 0; st == MOE_OK && i < t->nforced; i++) {
    if (t->forced_at[i] < last)
      st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "replica operations: step %lld after step %lld: list them in "
                      "step order", (long long)t->forced_at[i], (long long)last);
    last = t->forced_at[i];
    if (st == MOE_OK) st = moe__flex_apply(&c, &t->forced[i], &x);
    if (st != MOE_OK) {
      char why[256];
      snprintf(why, sizeof why, "%s", moe_last_error());
      st = moe__error(st, __FILE__, __LINE__, "replica operation %d (at step %lld): %s", i + 1,
                      (long long)t->forced_at[i], why);
    }
  }
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&c);
  return st;
}

moe_status moe_flex_trainer_new(moe_flex_trainer **out, moe_model_t *m, double threshold, int horizon,
                                int delta_launch, const char *ops) {
  MOE_TRY(out && m, MOE_ERR_ARG, "moe_flex_trainer_new: NULL argument");
  const moe_layer_config *c = &m->cfg.moe;
  MOE_TRY(c->dist && c->replica_slots > 0 && m->layers[0].st->flex, MOE_ERR_ARG,
          "replicas: the model's layers have no replica slots (replica_slots = 0 or one process)");
  MOE_TRY(threshold >= 1, MOE_ERR_ARG, "replicas: balance threshold %g is below 1", threshold);
  moe_flex_trainer *t = calloc(1, sizeof *t);
  MOE_TRY(t, MOE_ERR_NOMEM, "replicas: out of memory");
  *t = (moe_flex_trainer){.L = m->cfg.blocks, .W = moe_dist_size(c->dist), .E = c->E, .Ev = c->replica_slots,
                          .me = moe_dist_rank(c->dist), .dist = c->dist, .pol = moe__flex_policy_default()};
  t->pol.threshold = threshold;
  if (horizon > 0) t->pol.horizon = horizon;
  t->payload = 3 + t->L * t->W * t->Ev;
  int n = t->L * t->W * t->E > t->payload ? t->L * t->W * t->E : t->payload;
  t->decided = calloc((size_t)t->L, sizeof *t->decided);
  t->blocks = calloc((size_t)t->L, sizeof *t->blocks);
  t->metrics = calloc((size_t)n, sizeof *t->metrics);
  t->agree = calloc((size_t)t->payload, sizeof *t->agree);
  moe_status st = t->decided && t->blocks && t->metrics && t->agree
                      ? MOE_OK : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "replicas: tables of %d blocks", t->L);
  for (int b = 0; st == MOE_OK && b < t->L; b++) {
    st = moe__flex_table_clone(&t->decided[b], &m->layers[b].st->flex->t);
    if (st == MOE_OK) st = moe__flex_table_init(&t->blocks[b], t->W, c->E / t->W, c->E, 0);
  }
  if (st == MOE_OK) st = parse_forced(t, ops);
  if (st == MOE_OK) st = check_forced(t);
  if (st == MOE_OK) st = profile(t, c);
  if (st == MOE_OK) st = moe_recompile_new(&t->rc, n, delta_launch, trigger, t);
  if (st != MOE_OK) {
    moe_flex_trainer_free(t);
    return st;
  }
  *out = t;
  return MOE_OK;
}

void moe_flex_trainer_free(moe_flex_trainer *t) {
  if (!t) return;
  moe_recompile_free(t->rc); /* the trigger thread first: it reads the tables */
  for (int b = 0; b < t->L && t->decided; b++) moe__flex_table_free(&t->decided[b]);
  for (int b = 0; b < t->L && t->blocks; b++) moe__flex_table_free(&t->blocks[b]);
  moe__flex_plan_free(&t->plan);
  free(t->decided), free(t->blocks), free(t->metrics), free(t->agree), free(t->forced), free(t->forced_at);
  free(t);
}

void moe_flex_trainer_env(const moe_flex_trainer *t, moe_flex_env *env) { *env = t->penv; }
void moe_flex_trainer_stats(const moe_flex_trainer *t, moe_flex_stats *s) { *s = t->stats; }

/* The forced operations of this step, applied to every block's placement. */
static moe_status land_forced(moe_flex_trainer *t, moe_model_t *m, moe_optim_t *o, int64_t step) {
  for (int i = 0; i < t->nforced; i++) {
    if (t->forced_at[i] != step) continue;
    for (int b = 0; b < t->L; b++) {
      moe__flex_table nt = {0};
      moe__flex_xfers x = {0};
      MOE_CHECK(moe__flex_table_clone(&nt, &m->layers[b].st->flex->t));
      moe_status st = moe__flex_apply(&nt, &t->forced[i], &x);
      if (st == MOE_OK) st = land(t, m, o, b, nt.slot);
      moe__flex_xfers_free(&x);
      moe__flex_table_free(&nt);
      MOE_CHECK(st);
    }
    int64_t *count[3] = {&t->stats.expands, &t->stats.shrinks, &t->stats.migrates};
    (*count[t->forced[i].kind])++;
    t->stats.placements++;
  }
  return MOE_OK;
}

moe_status moe_flex_trainer_begin(moe_flex_trainer *t, moe_model_t *m, moe_optim_t *o, int64_t step) {
  if (t->nforced) return land_forced(t, m, o, step); /* the hook replaces the policy */
  const moe_adjustment *adj;
  int has;
  MOE_CHECK(moe_recompile_begin(t->rc, step, &adj, &has));
  memset(t->agree, 0, sizeof *t->agree * (size_t)t->payload);
  if (has && adj->set_placement && t->me == 0) /* rank 0's decision, on every rank */
    for (int i = 0; i < t->payload; i++) t->agree[i] = adj->capacity[i] + (i < 3 ? 0 : 1); /* slots + 1: -1 is 0 */
  MOE_CHECK(moe_dist_allreduce(t->dist, t->agree, t->payload));
  if (t->agree[0] + t->agree[1] + t->agree[2] == 0) return MOE_OK; /* no decision (one has operations) */
  int *slots = malloc(sizeof *slots * (size_t)t->W * t->Ev);
  MOE_TRY(slots, MOE_ERR_NOMEM, "replicas: out of memory");
  moe_status st = MOE_OK;
  for (int b = 0; st == MOE_OK && b < t->L; b++) {
    for (int i = 0; i < t->W * t->Ev; i++) slots[i] = (int)t->agree[3 + (size_t)b * t->W * t->Ev + i] - 1;
    st = land(t, m, o, b, slots);
  }
  free(slots);
  t->stats.expands += (int64_t)t->agree[0], t->stats.shrinks += (int64_t)t->agree[1];
  t->stats.migrates += (int64_t)t->agree[2];
  t->stats.placements++;
  return st;
}

moe_status moe_flex_trainer_push(moe_flex_trainer *t, const moe_model_t *m, int64_t step, double loss) {
  book_balance(t, m);
  if (t->nforced) return MOE_OK;
  size_t WE = (size_t)t->W * t->E;
  for (int b = 0; b < t->L; b++)
    for (size_t i = 0; i < WE; i++) t->metrics[(size_t)b * WE + i] = (int32_t)m->layers[b].st->flex->Isrc[i];
  int n = t->L * t->W * t->E > t->payload ? t->L * t->W * t->E : t->payload;
  moe_metrics mt = {.iter = step, .loss = loss, .experts = n, .counts = t->metrics};
  return moe_recompile_push(t->rc, &mt);
}
