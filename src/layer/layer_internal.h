/* The layer's private parts. A forward is a sequence of stages over one routing plan:
 *
 *   router (router.c)      x -> probabilities, top-k, losses             -> plan.top_e, plan.top_w
 *   placement (placement.c)  top-k -> capacity, a row for each assignment  -> the rest of the plan
 *   dispatch (dispatch.c) x -> xs (rows, D), the plan's rows
 *   send (a transport)   xs -> gx, the rows of this process's experts
 *   experts (a source)   gx -> gout
 *   recv (the transport) gout -> out
 *   combine (dispatch.c) out -> y
 *
 * and backward the mirror image. Two small interfaces carry what varies: how tokens move between the
 * dispatch rows and the experts (moe__transport: in process, an all-to-all-v, static dispatch's fixed
 * exchanges), and where the experts' weights come from (moe__expert_src: the layer's own parameters,
 * inner MoE layers, an expert cache). The stages read the plan and name their buffers; the state below
 * only keeps what backward must read. */
#ifndef MOE_LAYER_INTERNAL_H
#define MOE_LAYER_INTERNAL_H

#include "base/arena.h"
#include "kernels/gemm.h"
#include "layer/plan.h"
#include "layer/stages.h"
#include "moe.h"

void moe__weights_bind(const moe_layer_t *l, float *base, moe__weights *w);


/* The FFN experts' activations (sources/ffn.c), kept for backward: for `rows` rows from one base, and
 * scratch for the groups' GEMM list and weights. */
typedef struct {
  float *a1, *a3, *h;  /* (rows, H) fc1 pre-activation, fc3 output (swiglu), activation */
  uint16_t *xb;        /* (rows, D) bf16 expert inputs */
  uint16_t *hb;        /* (rows, H) bf16 activation; backward: da1 */
  uint16_t *db;        /* (rows, D) backward: dout */
  uint16_t *d3b;       /* (rows, H) swiglu backward: da3 */
  moe__gemm *gemms;    /* (3 ng) the GEMM list */
  void *w;             /* (ng) moe__expert_w: each group's weights */
  char *state;         /* (ng) the expert cache's bookkeeping */
  int *order;          /* (ng) */
} moe__ffn;
/* The activations of rows [r, ...) of f. */
moe__ffn moe__ffn_at(const moe_layer_t *l, const moe__ffn *f, int r);

/* Where the experts' weights come from. alloc makes the activations of `rows` rows of ng groups (bytes:
 * what they take of the work arena); forward computes the groups with the activations f (side work,
 * when not NULL, runs alongside its first GEMMs: only a source with `alongside` is given any); backward
 * takes dy (rows, D) of the same groups and activations to dx, adding weight gradients; NULL:
 * inference only. */
typedef struct {
  const char *name;
  int alongside;
  size_t (*bytes)(const moe_layer_t *l, int ng, int rows);
  moe_status (*alloc)(moe_layer_t *l, int ng, int rows, moe__ffn *f);
  moe_status (*forward)(moe_layer_t *l, const moe__groups *g, const moe__ffn *f, const moe__side_work *side);
  moe_status (*backward)(moe_layer_t *l, const moe__groups *g, const moe__ffn *f, const float *dy, float daux,
                         float dz, float *dx);
} moe__expert_src;
extern const moe__expert_src moe__experts_own;   /* sources/ffn.c */
extern const moe__expert_src moe__experts_inner; /* sources/inner.c */

/* How tokens move between the dispatch rows and the experts' groups. */
typedef struct {
  const char *name;
  int in_place; /* the groups are the dispatch rows: no buffers of its own, send and recv move nothing */
  /* before routing: routing workspace bytes for T tokens (and what the view needs to know) */
  moe_status (*begin)(moe_layer_t *l, int T, size_t *route_bytes);
  /* the tokens placement runs over; fills stat_counts */
  moe_status (*view)(moe_layer_t *l, moe__view *v);
  /* after placement: the groups (ng, grows, goffs; the size exchange) */
  moe_status (*groups)(moe_layer_t *l);
  size_t (*work_bytes)(const moe_layer_t *l);
  moe_status (*alloc)(moe_layer_t *l); /* gx, gout, xr */
  /* micro-batch i's rows of rows (rows, D) -> g, its first row on the experts' side, called for
   * i = 0, 1, ... in turn: on return they are there, and the next micro-batch's may be on their way
   * already. way 0: the forward's inputs, or backward's output gradients; way 1: backward's second
   * stream, the forward's inputs again (plan.slotted). recv: back, from g (on return they may be on
   * their way: finish waits for them) */
  moe_status (*send)(moe_layer_t *l, int way, int i, const float *rows, float *g);
  moe_status (*recv)(moe_layer_t *l, int i, const float *g, float *rows);
  /* after the last micro-batch, and after a failure: waits for every exchange started (NULL: none) */
  moe_status (*finish)(moe_layer_t *l);
  /* before a forward's or backward's first exchange: `mine` is this process's checks; a failure on any
   * rank is returned on every rank (NULL: one process, mine) */
  moe_status (*agree)(moe_layer_t *l, moe_status mine);
} moe__transport;
extern const moe__transport moe__transport_local;  /* transports/local.c */
extern const moe__transport moe__transport_a2a;    /* transports/alltoall.c: dynamic dispatch, all-to-all-v (Linear or 2DH) */
extern const moe__transport moe__transport_static; /* transports/static_exchange.c: static dispatch's fixed exchanges */
extern const moe__transport moe__transport_flex;   /* flex/transport.c: all-to-all-v over FlexMoE's replicas */


struct moe__layer_state {
  moe__arena route; /* router and plan: sized from T, k, E, P */
  moe__arena work;  /* dispatch and expert tensors: sized after routing (rows, capacity) */
  int have_fwd;     /* a forward ran and backward has not consumed it yet */
  int threads;      /* resolved thread count */
  const float *x;   /* (T, D) the forward's input, the caller's: the router's backward reads it */
  const moe__transport *tr;
  const moe__expert_src *src;
  moe__router r;
  moe__plan p;
  moe__ffn f;       /* the experts' activations: every micro-batch's, or one shared (memory reuse) */
  float *xs, *out;  /* (rows, D) dispatch rows: expert inputs and outputs */
  float *gx, *gout, *gdx; /* (grows, D) a moving transport's expert side: inputs, outputs, input gradients */
  float *xr;        /* (grows, D) its staging buffer (all-to-all-v: rows in source order) */
  uint64_t tk_next[2], tk_last; /* all-to-all-v on the communication thread: each way's next
                                 * micro-batch's exchange in, and the last exchange posted (tickets) */
  moe__dispatch dsp;     /* the dispatch's own tensors */
  float inner_aux, inner_z; /* hierarchical: sums over the inner layers */
  moe_layer_stats *inner_stats; /* hierarchical: each inner layer's last forward (they run at once) */
  /* memory_reuse AUTO: the strategy chosen (-1: not yet), and what the steps so far measured: the
   * experts' multiply-adds and seconds in forward, the exchanges' elements and seconds */
  int reuse_pick;
  double reuse_meas[4];
  moe_comm_stats comm;      /* exchanges since the last reset */
  struct moe__flex_layer *flex; /* replica_slots > 0: the placement table and its routing (flex/transport.c) */
  struct moe__auto_pipe_s *ap; /* the layer's dictionary of setups (r, n, all-to-all), when any is adaptive (adapt/pipe_model.h) */
  /* bf16 experts (cfg.dtype): bf16 copies of the parameters (only the expert weights are filled),
   * refreshed before a forward after the parameters changed */
  uint16_t *wbf; /* (numel), at the parameters' offsets */
  int wbf_stale;
  struct moe__shard_s *sh; /* Tutel's adaptive parallelism r (parallel_r set, with dist): shard.h */
};




/* sources/ffn.c: the FFN over groups of rows, for the sources that compute FFNs (own weights, the cache).
 * One expert's weights; the bf16 copies of the matrices are read instead when cfg.dtype is bf16. */
typedef struct {
  const float *w1, *b1, *w2, *b2, *w3;
  const uint16_t *w1h, *w2h, *w3h;
} moe__expert_w;
size_t moe__ffn_bytes(const moe_layer_t *l, int ng, int rows);
moe_status moe__ffn_alloc(moe_layer_t *l, int ng, int rows, moe__ffn *f);
/* Forward of groups [e0, e1) of g with activations f, group e's weights at w[e]; side work (or NULL)
 * runs alongside the first GEMMs. */
moe_status moe__ffn_forward(moe_layer_t *l, const moe__groups *g, const moe__ffn *f, int e0, int e1,
                            const moe__expert_w *w, const moe__side_work *side);

/* transports/alltoall.c: expert parallelism, over at most MOE__EP_MAX_RANKS ranks (per-rank bookkeeping on the stack;
 * moe_layer_init refuses more); the exchanges' bookkeeping shared by both moving transports. */
#define MOE__EP_MAX_RANKS 64
size_t moe__ep_route_bytes(const moe_layer_t *l);
/* The counts of the view over all ranks (the stats, and what the capacity is computed from). */
moe_status moe__ep_global_counts(moe_layer_t *l, moe__view *v);
/* Every rank learns whether any failed its checks before the exchanges (a rank that returned early
 * would leave the others waiting in them): mine, or an error naming the first rank that failed. */
moe_status moe__ep_agree(moe_layer_t *l, moe_status mine);
/* Books one exchange: its time since t0 and the bytes this rank sent to others. */
void moe__ep_book(moe_layer_t *l, double t0, double bytes);

/* flex/transport.c: FlexMoE's replicas (cfg.replica_slots > 0). The initial placement (each rank's own block
 * of experts), freed with the layer; the row of this rank's expert tensors holding expert e, or -1;
 * the replicas' gradients summed over the ranks holding them (moe_layer_reduce_grads). */
moe_status moe__flex_layer_init(moe_layer_t *l);
void moe__flex_layer_free(moe_layer_t *l);
int moe__flex_row(const moe_layer_t *l, int e);
moe_status moe__flex_reduce_grads(moe_layer_t *l);


#endif
