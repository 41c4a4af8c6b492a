/* Decision and cost models for micro-batch pipelining and memory reuse in the MoE layer (MPipeMoE,
 * DIGEST P4) and Tutel's dictionary of setups (DIGEST P2 1.7). Pure functions and small state with
 * init/free, no dependence on the layer, so the layer and the simulator call the same models.
 *
 * Notation (P4 Table I): B tokens per batch, M model dim, H hidden dim, n micro-batches, b tokens of
 * one micro-batch. Tensors: T_DI dispatched input (B, M), T_M middle (B, H), T_DO dispatched output (B, M). */
#ifndef MOE_PIPE_MODEL_H
#define MOE_PIPE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- memory-reuse strategies (P4 Table II) ---- */

typedef enum {
  MOE__REUSE_NONE, /* every partition kept: no reuse */
  MOE__REUSE_S1,   /* T_DI offloaded, T_M offloaded */
  MOE__REUSE_S2,   /* T_DI re-communicated, T_M offloaded */
  MOE__REUSE_S3,   /* T_DI offloaded, T_M recomputed */
  MOE__REUSE_S4,   /* T_DI re-communicated, T_M recomputed */
  MOE__REUSE_COUNT
} moe__reuse;
extern const char *const moe__reuse_names[MOE__REUSE_COUNT]; /* "none", "s1", ..., "s4" */

#define MOE__REUSE_BIT(s) (1u << (s))
#define MOE__REUSE_ALL ((1u << MOE__REUSE_COUNT) - 1u)
/* On a CPU, offloading to host memory copies within the same memory and saves nothing, so only the
 * strategies that restore by re-communication and recomputation apply. */
#define MOE__REUSE_CPU (MOE__REUSE_BIT(MOE__REUSE_NONE) | MOE__REUSE_BIT(MOE__REUSE_S4))

/* ---- memory model (P4 Eqs. 1-6), in elements: multiply by the element size for bytes ---- */

typedef struct {
  double B, M, H;
  double gate_experts;  /* Eq. 1's E (the gate's E x M parameters); 0 leaves the gate out */
  double local_experts; /* experts whose 2 H M parameters this rank holds */
} moe__mem_shape;

/* Buffers kept per tensor class under reuse (P4 1.6 ambiguity 1: both variants of Eq. 5 compute). */
typedef struct {
  int di, m, dout;
} moe__reuse_bufs;
extern const moe__reuse_bufs moe__bufs_text;    /* T_DI 2, T_M 1, T_DO 2: the paper's text, libmoe's layout */
extern const moe__reuse_bufs moe__bufs_uniform; /* 2, 2, 2: the authors' memory helper */

double moe__mem_states(const moe__mem_shape *s);   /* Eq. 1: 4 (E M + experts 2 H M), Adam */
double moe__mem_act(const moe__mem_shape *s);      /* Eq. 2: 4 B M + B H */
double moe__mem_buf(const moe__mem_shape *s);      /* Eq. 3: B M + B H (sequential gradients) */
double moe__mem_buf_pipe(const moe__mem_shape *s); /* Eq. 4: 2 B M + B H (= the reusable activations) */
/* Eq. 5: what reuse with n >= 1 partitions saves of the activations (and equally of the gradient buffers). */
double moe__mem_saved(const moe__mem_shape *s, int n, moe__reuse_bufs k);
/* Eq. 6: phi = 2 saved / (M_ms + M_act + M_buf^pipe). */
double moe__mem_phi(const moe__mem_shape *s, int n, moe__reuse_bufs k);

/* Tokens in part i (0 <= i < n, n >= 1) of a count split into n parts of ceil(count / n), the last ones
 * smaller (P4 ambiguity 4): part 0 is the largest. */
size_t moe__pipe_part(size_t count, int n, int i);
/* Rows of the largest micro-batch when each of the per-source counts is split into n parts. */
size_t moe__pipe_rows_max(const size_t *counts, int ncounts, int n);

/* High-water marks, in bytes, of the T_DI, T_M and T_DO pools. */
typedef struct {
  size_t di, m, dout;
} moe__pools;
/* For B rows in n micro-batches of at most b rows each: without reuse every partition is kept (B rows
 * per pool); with reuse (S1-S4) moe__bufs_text's buffers of b rows, never more buffers than partitions. */
moe_status moe__pipe_pools(size_t B, size_t b, size_t M, size_t H, int n, moe__reuse s, size_t elem,
                           moe__pools *out);

/* ---- performance model (P4 Eqs. 7-10) ---- */

/* Relative speeds of a stream while others run (P4 Fig. 3): computation's, communication's while only
 * computation runs, communication's and memory copies' while all three run. Each in (0, 1]. */
typedef struct {
  double sigma, mu_comp, mu_all, eta_all;
} moe__interference;
/* sigma 1, mu 0.8, eta 0.8: the digest's CPU choice (P4 ambiguity 5). */
moe__interference moe__interference_default(void);

/* Measured speeds: comp in multiply-adds per second (one b x M x H GEMM is b H M), comm and mem in
 * elements per second (all-to-all volume, host copies). mem is needed only by S1-S3. */
typedef struct {
  double comp, comm, mem;
} moe__speeds;

/* Eq. 10 summed over forward and backward, in seconds for b tokens. */
moe_status moe__reuse_cost(moe__reuse s, double b, double M, double H, const moe__speeds *w,
                           const moe__interference *f, double *seconds);
/* The strategy in `allowed` (MOE__REUSE_BIT set) with the least cost; ties go to the lower strategy.
 * NONE, when allowed, always wins (it restores nothing, at the same interference as S4): a caller that
 * wants the memory saved leaves it out. *cost may be NULL. */
moe_status moe__reuse_select(unsigned allowed, double b, double M, double H, const moe__speeds *w,
                             const moe__interference *f, moe__reuse *out, double *cost);

/* Eq. 10 for the layer's strategies on a CPU, in moe_reuse order (none, S4, S2, S3): offloading to
 * host memory keeps the tensor where it is, at no cost, so P4's S2 (T_DI re-communicated, T_M
 * offloaded) is the layer's S2 (T_M kept) and P4's S3 (T_DI offloaded, T_M recomputed) its S3. comm
 * may be INFINITY (one process: nothing moves). */
moe_status moe__reuse_costs_cpu(double b, double M, double H, double comp, double comm, double cost[4]);

/* ---- a map from 64-bit keys to 64-bit values (open addressing, linear probing) ---- */

typedef struct {
  uint64_t *keys; /* key + 1; 0 marks an empty slot */
  uint64_t *vals;
  size_t cap, len;
} moe__u64map;

/* A zeroed struct is an empty map. Returns 1 and sets *val if key is present. */
int moe__u64map_get(const moe__u64map *m, uint64_t key, uint64_t *val);
/* Inserts or replaces; grows (doubling) at half full. Keys below UINT64_MAX. */
moe_status moe__u64map_put(moe__u64map *m, uint64_t key, uint64_t val);
void moe__u64map_free(moe__u64map *m);
/* An adaptive search's trial of slot k took `seconds`: counts the run in runs (its count before in
 * *before, may be NULL) and keeps the fastest time in secs. */
moe_status moe__trial_record(moe__u64map *runs, moe__u64map *secs, uint64_t k, double seconds, uint64_t *before);
/* A double stored in a map value, bit for bit, and back. */
static inline uint64_t moe__u64_of_double(double d) {
  uint64_t v;
  __builtin_memcpy(&v, &d, sizeof v);
  return v;
}
static inline double moe__double_of_u64(uint64_t v) {
  double d;
  __builtin_memcpy(&d, &v, sizeof d);
  return d;
}

/* ---- adaptive granularity (P4 Algorithm 1, with the find-by-n erratum) ---- */

/* The cost (seconds) of one step of B tokens in n micro-batches: one trial of searchBestGran. Under
 * expert parallelism, B is the global max of received tokens and the cost the max over ranks, so every
 * rank picks the same n. */
typedef moe_status (*moe__gran_cost_fn)(void *user, size_t B, int n, double *seconds);

#define MOE__GRAN_MAX_CAND 16

typedef struct {
  size_t lo, hi;
  int n;
} moe__gran_range;

typedef struct {
  int cand[MOE__GRAN_MAX_CAND]; /* candidate n, increasing */
  int ncand;
  /* Disjoint ranges sorted by lo, at most one per n. At most ncand of them, so a fixed sorted array with
   * binary search replaces the paper's balanced BST: no nodes, no rebalancing, inserts shift <= 16. */
  moe__gran_range ranges[MOE__GRAN_MAX_CAND];
  int nranges;
  moe__u64map cache; /* B -> n */
  moe__gran_cost_fn cost;
  void *user;
  int64_t searches, trials, conflicts; /* searchBestGran calls, cost calls, widenings refused */
} moe__gran;

/* cand NULL: {1, 2, 4, 8, 16} (the digest's choice). Otherwise 1..16 distinct increasing values >= 1. */
moe_status moe__gran_init(moe__gran *g, const int *cand, int ncand, moe__gran_cost_fn cost, void *user);
/* The n for B: the cache, else the range holding B, else a search (every candidate tried, the
 * cheapest kept, ties to the smaller n), whose n's range is widened to B unless that would overlap a
 * neighbour (then only the cache remembers B). */
moe_status moe__gran_get(moe__gran *g, size_t B, int *n);
/* Whether B's n is known without a search (the cache or a range), and then which. */
int moe__gran_known(const moe__gran *g, size_t B, int *n);
void moe__gran_free(moe__gran *g);

/* ---- Tutel's dictionary of optimal setups (P2 1.7) ---- */

typedef enum { MOE__A2A_LINEAR, MOE__A2A_2DH } moe__a2a;

typedef struct {
  int r;     /* adaptive parallelism: 0 = DP, 1..ceil(W/E) = EP+DP+MP */
  int d;     /* pipelining degree (micro-batches) */
  moe__a2a a;
} moe__setup;

/* The cost (seconds) of one step at this capacity with setup s: one trial. */
typedef moe_status (*moe__setup_cost_fn)(void *user, size_t capacity, const moe__setup *s, double *seconds);

#define MOE__SETUP_MAX_DEG 4
typedef struct {
  size_t window; /* R: capacities c with the same floor(c / R) share an entry */
  int r_max;     /* ceil(W / E), or 1 without the search over r */
  int search_r;  /* 0: r stays 1 (a layer without switchable parallelism) */
  int deg[MOE__SETUP_MAX_DEG], ndeg; /* the degrees tried: 1, 2, 4, 8 unless limited */
  moe__a2a algo[2];
  int nalgo;                         /* the algorithms tried: Linear, 2DH unless limited */
  moe__u64map map;
  double *memo; /* (r_max + 1) costs of one (d, a) search; NaN = not tried */
  moe__setup_cost_fn cost;
  void *user;
  int64_t trials;
  double margin; /* a setup tried later replaces the best so far only when this much faster (init: 0.03) */
} moe__setup_dict;

/* world, experts >= 1; window 0 means 128. */
moe_status moe__setup_dict_init(moe__setup_dict *t, int world, int experts, int search_r, size_t window,
                                moe__setup_cost_fn cost, void *user);
/* Only these degrees (1 to 4 increasing values >= 1) and algorithms (1 or 2, distinct) are tried: a
 * setup the layer cannot run is never offered. Before the first get. */
moe_status moe__setup_dict_limit(moe__setup_dict *t, const int *deg, int ndeg, const moe__a2a *algo, int nalgo);
/* The paper's trials per key for this dictionary: (log_1.5 ceil(W/E) + 2) per (degree, algorithm) when r
 * is searched, else 1. */
double moe__setup_dict_bound(const moe__setup_dict *t);
/* The setup for this capacity: the dictionary's entry, else found by trials and remembered. */
moe_status moe__setup_dict_get(moe__setup_dict *t, size_t capacity, moe__setup *out);
void moe__setup_dict_free(moe__setup_dict *t);

/* ---- the dictionary of a layer (parallel_r, pipeline or the all-to-all adaptive): its trials online ---- */

/* The trials are the layer's own steps: a setup the search asks for and has no cost for stops the
 * search (pending); the next MOE__AUTO_REPS steps run it (the first warms the workspace, the fastest
 * counts) and the search starts again, the costs measured so far answered from the table, until it
 * completes and the dictionary remembers its entry. The key is floor(capacity / MOE__AUTO_ROWS), the
 * capacity the same on every rank (global counts), and a step's cost the mean over ranks of its
 * forward + backward seconds (a sum over ranks: identical everywhere), so every rank picks alike. */
#define MOE__AUTO_ROWS 128
#define MOE__AUTO_REPS 2
#define MOE__AUTO_MAX_N 8
typedef struct moe__auto_pipe_s {
  moe__setup_dict dict;
  moe__u64map runs, secs; /* (key, r, degree, algorithm) -> trial steps run, the fastest one's seconds */
  moe__setup want;        /* the setup the search waits for (want.d 0: none) */
  moe__setup now;         /* this step's */
  int trial;              /* this step tries a setup for the search */
  uint64_t key;           /* this step's key */
  size_t capacity;        /* this step's capacity */
  double acc;             /* the current trial's seconds so far (its forward, its backward) */
  int64_t measured;       /* distinct setups tried: the trials of P2 1.7 */
  unsigned space;         /* what the layer searched, and its fixed n, when made (adapt/layer_setup.c) */
  char note[256];         /* what the entries do not offer, and why (adapt/layer_setup.c) */
} moe__auto_pipe;

/* search_r over [0, ceil(W/E)] (else r 1), and the degrees and algorithms of moe__setup_dict_limit. */
moe_status moe__auto_pipe_init(moe__auto_pipe *a, int W, int E, int search_r, const int *deg, int ndeg,
                               const moe__a2a *algo, int nalgo);
/* The setup of a step at this capacity: the entry, or a trial's setup while the search runs (a->trial). */
moe_status moe__auto_pipe_pick(moe__auto_pipe *a, size_t capacity, moe__setup *s);
/* A trial step's cost (the mean over ranks of its seconds); nothing outside a trial. */
moe_status moe__auto_pipe_record(moe__auto_pipe *a, double seconds);
void moe__auto_pipe_free(moe__auto_pipe *a);

#endif
