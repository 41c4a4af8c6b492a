/* FlexMoE (DIGEST P3): replicas of hot experts. The vExpert placement table, the Expand / Shrink /
 * Migrate primitives with the transfers they need, locality-first routing (Algorithm 3, erratum
 * applied), the balance ratio (Eq. 6), the cost model (Eqs. 5, 7-9), the scheduler and policy maker
 * (Algorithms 1 and 2) and the replica groups' gradient all-reduce schedule. Pure functions over small
 * tables with no dependence on the layer: every rank runs them on the same all-gathered counts and gets
 * the same answer, and a simulator over a recorded trace calls the same code.
 *
 * Notation: W ranks, E logical experts, E_v slots per rank. n[e][g] = replicas of e on rank g (slots of
 * e on g; they share weights), n_e = sum over g. Token counts are int64. */
#ifndef MOE_FLEX_H
#define MOE_FLEX_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define MOE__FLEX_MAX_RANKS 64 /* as expert parallelism (MOE__EP_MAX_RANKS) */

/* ---- the vExpert placement table (P3 1.1) ---- */

typedef struct {
  int W, Ev, E;
  size_t state_bytes; /* one expert's weights + optimizer state: what Expand and Migrate copy */
  int *slot;          /* (W, Ev): the expert in slot s of rank g, -1 when empty */
  int *n;             /* (E, W): replicas of e on g, kept in step with slot */
} moe__flex_table;

/* The initial placement: the W * E_v slots in rank-major order, slot i holding expert
 * floor(i * E / (W * E_v)). With E_v = E / W that is expert parallelism's block ownership (rank g holds
 * experts [g E/W, (g+1) E/W)); a larger E_v repeats each rank's own experts (shared weights, no copy).
 * Needs 1 <= W <= MOE__FLEX_MAX_RANKS, E >= 1 and W * E_v >= E. */
moe_status moe__flex_table_init(moe__flex_table *t, int W, int Ev, int E, size_t state_bytes);
void moe__flex_table_free(moe__flex_table *t);
/* dst gets a copy of src (allocated: dst is overwritten, not freed). */
moe_status moe__flex_table_clone(moe__flex_table *dst, const moe__flex_table *src);
/* src's slots and counts into dst, which has src's W, E_v and E (no allocation). */
void moe__flex_table_assign(moe__flex_table *dst, const moe__flex_table *src);
/* t's slots from `slots` (W x E_v, rank-major) and its counts from them (moe__flex_table_check says
 * whether the slots are valid). */
void moe__flex_table_set_slots(moe__flex_table *t, const int *slots);
/* The invariants of P3 1.1: every slot empty or a valid expert, the counts n equal to a recount of the
 * slots, every expert with at least one replica. MOE_ERR_STATE naming the first violation. */
moe_status moe__flex_table_check(const moe__flex_table *t);
static inline int moe__flex_count(const moe__flex_table *t, int e, int g) { return t->n[(size_t)e * t->W + g]; }
int moe__flex_replicas(const moe__flex_table *t, int e); /* n_e */
/* The ranks holding e, ascending, into ranks (room for W); returns how many. */
int moe__flex_ranks(const moe__flex_table *t, int e, int *ranks);

/* The row of e among the distinct experts rank g holds, ascending (how a rank lays out its experts'
 * parameters): the number of experts below e that g holds. */
int moe__flex_row_on(const moe__flex_table *t, int g, int e);

/* Room for `need` elements of `elem` bytes in *p (capacity *cap), grown by doubling. */
moe_status moe__flex_reserve(void **p, int *cap, int need, size_t elem);

/* ---- primitives (P3 1.2) and the data they move ---- */

typedef struct {
  int src, dst, expert;
  size_t bytes;
} moe__flex_xfer;

typedef struct {
  moe__flex_xfer *x;
  int n, cap;
} moe__flex_xfers; /* zeroed = empty */
void moe__flex_xfers_free(moe__flex_xfers *l);

/* Expand(e, dst): one more replica of e in a free slot of rank dst. Appends to out the copy of e's state
 * from a source replica, unless dst already holds e (then the slots share weights: no traffic). The
 * source is the holder of e nearest to dst in rank number (ties to the lower rank): under the usual
 * block mapping of ranks to nodes the nearest rank is most often on dst's node (the fast link), and
 * different destinations draw on different sources. MOE_ERR_ARG when dst has no free slot. */
moe_status moe__flex_expand(moe__flex_table *t, int e, int dst, moe__flex_xfers *out);
/* Shrink(e, g): frees one slot of e on g (the last such slot). A tag: no traffic. MOE_ERR_ARG when g
 * holds no replica of e or e has only one replica. */
moe_status moe__flex_shrink(moe__flex_table *t, int e, int g);
/* Migrate(a on i, b on j): a slot of a on rank i and a slot of b on rank j swap experts. Appends a's
 * state i -> j unless j already holds a, and b's state j -> i unless i already holds b. */
moe_status moe__flex_migrate(moe__flex_table *t, int a, int i, int b, int j, moe__flex_xfers *out);

typedef enum { MOE__FLEX_EXPAND, MOE__FLEX_SHRINK, MOE__FLEX_MIGRATE } moe__flex_kind;
/* expand: e to rank g; shrink: e on g; migrate: e on g with b on h. */
typedef struct {
  moe__flex_kind kind;
  int e, g, b, h;
} moe__flex_op;
/* Applies op to t (every rank applies the same ops at the same step), appending its transfers. */
moe_status moe__flex_apply(moe__flex_table *t, const moe__flex_op *op, moe__flex_xfers *out);

/* ---- locality-first routing (P3 Algorithm 3, erratum applied) ---- */

/* Isrc (W, E): tokens of rank g for expert e, all-gathered. r (W, E, W): r[(g E + e) W + h] tokens of
 * rank g for expert e that e's replicas on rank h compute. For each expert, its I_e tokens are first
 * apportioned to the ranks as capacities C_h proportional to n[e][h] (largest remainder, ties to the
 * lower rank: sum C_h = I_e exactly). Rank g keeps min(C_g, Isrc[g][e]) locally and apportions the rest
 * over the other ranks in proportion to their spare capacity max(0, C_h - Isrc[h][e]), again by largest
 * remainder with ties to the lower rank. Since sum C_h = I_e the spare capacity always covers the
 * excess, so every rank h computes exactly C_h tokens up to the rounding of each source's share. Counts
 * must be >= 0 with I_e <= INT32_MAX (MOE_ERR_VALUE otherwise). */
moe_status moe__flex_route(const moe__flex_table *t, const int64_t *Isrc, int64_t *r);

/* ---- balance ratio (Eq. 6) and cost model (Eqs. 5, 7-9) ---- */

/* seconds = lat + x / bw for x > 0, 0 for x = 0 (x in bytes, or tokens for computation). */
typedef struct {
  double lat, bw;
} moe__flex_link;
double moe__flex_link_time(moe__flex_link l, double x);
/* Least squares of seconds on x over n >= 2 samples: the intercept is lat, the inverse slope bw.
 * MOE_ERR_VALUE unless the samples are finite, the x not all equal and the slope positive. */
moe_status moe__flex_fit(const double *x, const double *seconds, int n, moe__flex_link *out);

typedef struct {
  moe__flex_link compute;              /* tokens of one expert, forward + backward: bw is TPS (Eq. 7) */
  int rate_n;                          /* > 0: the TPS by rows per expert replaces compute.bw */
  double rate_rows[MOE_FLEX_RATE_BUCKETS], rate_tps[MOE_FLEX_RATE_BUCKETS];
  moe__flex_link a2a_intra, a2a_inter; /* bytes between two ranks of one node, of two nodes (Eq. 8) */
  int ranks_per_node;                  /* g and h share a node iff g / rpn == h / rpn; 0: one node */
  moe__flex_link allreduce;            /* bytes each rank sends in a ring all-reduce (Eq. 9) */
  double token_bytes;                  /* one token's row: d_model * sizeof(dtype) (DIGEST P3 4.3) */
  double grad_bytes;                   /* one expert's gradients */
} moe__flex_env;

/* Eq. 6 from the merged counts Ie (E): max over ranks of the load over its mean, each expert's tokens
 * split evenly over its replicas (rank g computes Ie * n[e][g] / n_e; routing realizes it up to
 * rounding). 1 when there are no tokens. */
double moe__flex_balance(const moe__flex_table *t, const int64_t *Ie);
/* Eq. 7 for one expert computing `rows` tokens on a rank: compute.lat + rows / TPS(rows), 0 for none.
 * TPS(rows) is compute.bw without a rate profile; with one, the per-row seconds 1 / rate_tps
 * interpolated linearly in log2(rows) between the two profiled sizes around rows, the end size's
 * outside them. */
double moe__flex_compute_time(const moe__flex_env *env, double rows);
/* Eq. 5: the modelled step time of the layer, max over ranks g of
 *   sum over e on g of moe__flex_compute_time(tokens g computes for e)       (Eq. 7)
 * + 4 * sum over h != g of link(h, g)(token_bytes * tokens g computes for h)  (Eq. 8, per-GPU sum)
 * + sum over e on g held by m > 1 ranks of allreduce(2 (m-1)/m grad_bytes)    (Eq. 9, once per expert
 *   and rank: DIGEST P3 4.7),
 * with the tokens routed by moe__flex_route from Isrc (W, E). per_rank (W) may be NULL. */
moe_status moe__flex_cost(const moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                          double *per_rank, double *T);
/* Time of the transfers l->x[from ..] one after another over their links (an upper bound: the queue
 * runs disjoint pairs concurrently, P3 1.7). */
double moe__flex_xfer_time(const moe__flex_env *env, const moe__flex_xfers *l, int from);

/* The model's terms from moe_flex_env (moe.h): one link for every pair of ranks (one node). */
moe__flex_env moe__flex_env_of(const moe_flex_env *e);
/* MOE_ERR_ARG unless its rates are > 0 and its latencies and sizes >= 0. */
moe_status moe__flex_check_env(const moe_flex_env *e);

/* ---- scheduler and policy maker (P3 Algorithms 1 and 2) ---- */

typedef struct {
  double threshold; /* balance ratio above which the policy maker runs */
  int horizon;      /* K: a plan is kept only if K * (t0 - t1) exceeds its transfers' time */
  int max_plans;    /* bound on the plans of one step (Expand/Shrink pairs, then Migrates); 0: W * E_v */
} moe__flex_policy;
/* threshold 1.2, K = 10. The paper gives neither (a "predetermined threshold"); both are DIGEST P3's
 * choices (4.4, 4.6). Why 1.2: the step waits for the slowest rank, so the ratio is the compute part of
 * the step over that of a balanced placement; 1.2 lets the slowest rank run 20% over the mean, and
 * under it a plan could save at most 1 - 1/1.2 = 17% of the compute, which copies and one more
 * all-reduce per replica group rarely repay. */
moe__flex_policy moe__flex_policy_default(void);

typedef struct {
  moe__flex_op *ops; /* in order of application */
  int nops, cap;
  moe__flex_xfers xfers;
  double ratio0, ratio1, t0, t1; /* balance ratio and modelled step time before and after */
} moe__flex_plan;                /* zeroed = empty */
void moe__flex_plan_free(moe__flex_plan *p);
/* What the plan did, for moe_flex_step (moe.h). */
moe_flex_step moe__flex_step_of(const moe__flex_plan *p, const moe__flex_env *env);

/* Algorithm 2: e0 = argmax I_e / n_e over the experts on the slowest rank (the largest modelled time;
 * ties to the lower rank, then the lower id). Every replica (e1, g) with e1 != e0 and n_e1 >= 2 is a
 * candidate for Shrink(e1, g) + Expand(e0, g) (the freed slot takes e0, so every rank keeps E_v
 * replicas); the candidate with the largest gain K (t0 - t1) - transfer time is returned in ops[0]
 * (shrink) and ops[1] (expand), *nops = 2, if that gain is positive; else *nops = 0. Ties go to the
 * smaller I_e1 / n_e1 (the paper's argmin), then the lower e1, then the lower g.
 * Where this departs from the paper: the paper takes e0 over all experts and evaluates its argmin e1 at
 * an unnamed slot (DIGEST P3 4.5: on the busiest rank). Eq. 5's T is the slowest rank's time, which a
 * replica of an expert held elsewhere cannot shorten (with tied or spread hot experts the global argmax
 * often is elsewhere); and the busiest rank often holds e0 already, where a freed slot changes nothing. */
moe_status moe__flex_make_plan(const moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                               const moe__flex_policy *p, moe__flex_op ops[2], int *nops);
/* Algorithm 1, one step: while the balance ratio exceeds the threshold, apply the policy maker's plan
 * (stop when it returns none); then Migrates while one pays off, each the swap with the largest gain
 * K (t0 - t1) - transfer time that removes a rank from a replica group without adding one to another
 * (DIGEST P3 4.6). Applies the ops to t and records them, their transfers and the ratios and times
 * before and after in plan (cleared first). */
moe_status moe__flex_schedule(moe__flex_table *t, const int64_t *Isrc, const moe__flex_env *env,
                              const moe__flex_policy *p, moe__flex_plan *plan);

/* ---- gradient all-reduce of the replica groups (P3 1.7) ---- */

typedef struct {
  int expert, n;
  int ranks[MOE__FLEX_MAX_RANKS]; /* ascending */
} moe__flex_group;
/* The experts held by more than one rank, in ascending logical id, with their ranks: the order every
 * rank issues the all-reduces in (the same order everywhere, so no two ranks wait on each other).
 * rank >= 0 keeps the groups holding that rank (its own calls), -1 all. out has room for E. */
moe_status moe__flex_sync_groups(const moe__flex_table *t, int rank, moe__flex_group *out, int *n);
/* The replica groups merged by their ranks (what training all-reduces, one communicator and one sum
 * per set): set_of (E) gets each expert's set, -1 for an expert held by one rank; masks (room for E)
 * each set's ranks (bit g: rank g). Sets are numbered by their lowest expert, so issuing them in
 * that order keeps P3 1.7's ascending order. Returns the number of sets. */
int moe__flex_rank_sets(const moe__flex_table *t, int *set_of, uint64_t *masks);

#endif
