/* FlexMoE in training (moe_flex_trainer, moe.h; DESIGN 3.4): after every step each block's
 * all-gathered counts go to a RECOMPILE trigger thread, which runs the scheduler and policy maker on
 * its own copy of the placement (the placement as it will be once its earlier decisions have landed)
 * and hands the new placement back; it lands delta_launch + 1 steps later. Rank 0's decisions are the
 * ones applied, on every rank at the same step (which metrics a trigger sees depends on timing). A
 * placement lands through land.c: the weights and optimizer state of every expert a rank newly holds
 * come from the holder nearest in rank number in one all-to-all-v, then each rank's rows are laid out
 * anew. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "flex/wire.h"

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
    with += moe__flex_balance(&moe__flex_of(&m->layers[b])->t, Ie) / t->L;
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

/* Block b of m takes the placement `slots`, its optimizer state with it. */
static moe_status land(moe_flex_trainer *t, moe_model_t *m, moe_optim_t *o, int b, const int *slots) {
  moe__flex_rows r;
  moe__flex_rows_of(m, o, b, &r);
  return moe__flex_land(&m->layers[b], &r, slots, &t->stats.bytes_moved);
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
  MOE_TRY(c->dist && c->replica_slots > 0 && moe__flex_of(&m->layers[0]), MOE_ERR_ARG,
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
    st = moe__flex_table_clone(&t->decided[b], &moe__flex_of(&m->layers[b])->t);
    if (st == MOE_OK) st = moe__flex_table_init(&t->blocks[b], t->W, c->E / t->W, c->E, 0);
  }
  if (st == MOE_OK) st = parse_forced(t, ops);
  if (st == MOE_OK) st = check_forced(t);
  if (st == MOE_OK) st = moe_flex_profile(c, &t->penv);
  t->env = moe__flex_env_of(&t->penv);
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
      MOE_CHECK(moe__flex_table_clone(&nt, &moe__flex_of(&m->layers[b])->t));
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
    for (size_t i = 0; i < WE; i++) t->metrics[(size_t)b * WE + i] = (int32_t)moe__flex_of(&m->layers[b])->Isrc[i];
  int n = t->L * t->W * t->E > t->payload ? t->L * t->W * t->E : t->payload;
  moe_metrics mt = {.iter = step, .loss = loss, .experts = n, .counts = t->metrics};
  return moe_recompile_push(t->rc, &mt);
}
