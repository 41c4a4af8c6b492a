/* The layer's plug-ins (DESIGN 3.2-3.4): the tables of functions a transport, an expert source and a
 * policy give, chosen once at init (layer.c), each over its own state (self) and what the layer hands
 * it by name (moe__env, the plan, its buffers); and the layer's accessors for the features that reach
 * their plug-in's state through the public API. A forward is these stages over one routing plan:
 *
 *   router     (router.c)     x (T, D)        -> probabilities, top-k, losses -> plan.top_e, plan.top_w
 *   placement  (placement.c)  top-k, the transport's view -> capacity, a row per assignment -> the plan
 *   dispatch   (dispatch.c)   x               -> xs (rows, D)
 *   send       (transport)    xs              -> gx (grows, D), the rows of this process's experts
 *   experts    (source)       gx              -> gout
 *   recv       (transport)    gout            -> out (rows, D)
 *   combine    (dispatch.c)   out, plan.top_w -> y (T, D)
 *
 * and backward the mirror image. The layer's own state (layer.c) keeps only what backward must read. */
#ifndef MOE_LAYER_PLUGINS_H
#define MOE_LAYER_PLUGINS_H

#include "base/arena.h"
#include "kernels/gemm.h"
#include "layer/plan.h"
#include "layer/stages.h"
#include "moe.h"

/* l's tensors in base (its parameters or its gradients) by name (layer.c). */
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
/* The activations of rows [r, ...) of f (layer.c). */
moe__ffn moe__ffn_at(const moe_layer_t *l, const moe__ffn *f, int r);

/* What the layer hands its transport and its expert source at each call, in place of itself: the public
 * layer (configuration, parameter table, parameters and gradients, inner layers), the resolved thread
 * count, the two workspaces (route: the router's and the plan's, sized before routing; work: the
 * dispatch's and the experts', sized after), where exchanges are booked, and the adaptive setup's r
 * for this step (Tutel's sharding with parallel_r auto; -1 otherwise). */
typedef struct {
  const moe_layer_t *l;
  int threads;
  moe__arena *route, *work;
  moe_comm_stats *comm;
  int setup_r;
} moe__env;

/* The experts' side of a moving transport: the groups' inputs, outputs and input gradients (grows, D),
 * or one micro-batch's (plan.slotted); all NULL for a transport in place. */
typedef struct {
  float *gx, *gout, *gdx;
} moe__expert_bufs;

/* Where the experts' weights come from (DESIGN 3.3). init makes the source's own state (self) for layer
 * l, given its transport's (NULL: the source keeps none); params_changed marks what it derives from
 * the parameters stale; alloc makes the activations of `rows` rows of ng groups from env.work (bytes:
 * what they take of it); forward computes the groups with the activations f (side work, when not NULL,
 * runs alongside its first GEMMs: only a source with `alongside` is given any); backward takes dy
 * (rows, D) of the same groups and activations to dx, adding weight gradients (NULL: inference only);
 * losses adds the source's own losses of the last forward (NULL: none). */
typedef struct {
  const char *name;
  int alongside;
  moe_status (*init)(const moe_layer_t *l, void *transport, void **self);
  void (*free)(void *self);
  void (*params_changed)(void *self);
  size_t (*bytes)(void *self, const moe__env *env, int ng, int rows);
  moe_status (*alloc)(void *self, const moe__env *env, int ng, int rows, moe__ffn *f);
  moe_status (*forward)(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g, const moe__ffn *f,
                        const moe__side_work *side);
  moe_status (*backward)(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                         const moe__ffn *f, const float *dy, float daux, float dz, float *dx);
  void (*losses)(void *self, float *aux, float *z);
} moe__expert_src;
extern const moe__expert_src moe__experts_own;   /* sources/ffn.c */
extern const moe__expert_src moe__experts_inner; /* sources/inner.c */
extern const moe__expert_src moe__experts_quant; /* sources/quant.c: experts in a quantized GGUF type */
/* Experts in GGUF types computed from one weight pointer per expert and projection (sources/quant.c): the
 * layer's quantized experts (pointers into its stacks) and an expert cache's slots of a file's bytes.
 * t: fc1's, fc2's and fc3's types (fc3's is fc1's without one); xq, xq3, hq: the input rows quantized for
 * fc1 and for fc3 (xq when their formats agree) and the hidden rows for fc2, from the work arena. */
typedef struct {
  moe_gguf_type t[3];
  uint8_t *xq, *xq3, *hq;
} moe__qffn;
size_t moe__qffn_bytes(const moe_layer_config *c, const moe_gguf_type t[3], int rows);
void moe__qffn_alloc(moe__arena *a, const moe_layer_config *c, const moe_gguf_type t[3], int rows, moe__qffn *q);
/* The groups active[0..nact) of g, increasing and none with rows between them, with f's a1 (a3) h:
 * group e's weights at w[e][0..2] (fc1, fc2, fc3 rows in ggml's layout), its biases at b[e][0..2] (fc1's H,
 * fc2's D, fc3's H values; b NULL, or an entry NULL: none), each expert's own (the layer's stacks, or a
 * cache's slots). Every output is one dot product: the same bits for any subset of groups, split or
 * thread count. */
void moe__qffn_forward(const moe__qffn *q, const moe_layer_t *l, const moe__groups *g, const moe__ffn *f,
                       const uint8_t *const (*w)[3], const float *const (*b)[3], const int *active, int nact, int nt);
/* Whether configuration c can have its experts in GGUF type `type` (kernels for it, D and H whole
 * blocks, f32 dtype, one process, no inner experts, pipeline 1; external experts: an expert cache's slots
 * in stored types); `what` starts the error. */
/* rows: which weights' rows are of that type: MOE__ROWS_D (fc1 and fc3, D long), MOE__ROWS_H (fc2, H
 * long), or both; their lengths must be whole blocks of the type. */
enum { MOE__ROWS_D = 1, MOE__ROWS_H = 2 };
moe_status moe__expert_type_check(const moe_layer_config *c, int type, int rows, const char *what);

/* How tokens move between the dispatch rows and the experts' groups (DESIGN 3.2). init makes the
 * transport's own state (self: its exchanges' tickets, staging, rank blocks and permutations; NULL:
 * none) for layer l, free frees it. */
typedef struct {
  const char *name;
  int in_place; /* the groups are the dispatch rows: no buffers of its own, send and recv move nothing */
  moe_status (*init)(const moe_layer_t *l, void **self);
  void (*free)(void *self);
  /* before routing: routing workspace bytes for T tokens (and what the view needs to know) */
  moe_status (*begin)(void *self, const moe__env *env, int T, size_t *route_bytes);
  /* the tokens placement runs over, from this process's (v on entry) */
  moe_status (*view)(void *self, const moe__env *env, const moe__plan *p, moe__view *v);
  /* after placement: the plan's groups (ng, grows, goffs, gkey; the size exchange) */
  moe_status (*groups)(void *self, const moe__env *env, moe__plan *p);
  size_t (*work_bytes)(void *self, const moe__env *env, const moe__plan *p);
  moe_status (*alloc)(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b);
  /* micro-batch i's rows of rows (rows, D) -> g, its first row on the experts' side, called for
   * i = 0, 1, ... in turn: on return they are there, and the next micro-batch's may be on their way
   * already. way 0: the forward's inputs, or backward's output gradients; way 1: backward's second
   * stream, the forward's inputs again (plan.slotted). recv: back, from g (on return they may be on
   * their way: finish waits for them) */
  moe_status (*send)(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *rows,
                     float *g);
  moe_status (*recv)(void *self, const moe__env *env, const moe__plan *p, int i, const float *g, float *rows);
  /* after the last micro-batch, and after a failure: waits for every exchange started (NULL: none) */
  moe_status (*finish)(void *self, const moe__env *env, const moe__plan *p);
  /* before a forward's or backward's first exchange: `mine` is this process's checks; a failure on any
   * rank is returned on every rank (NULL: one process, mine) */
  moe_status (*agree)(void *self, const moe__env *env, moe_status mine);
  /* How the expert tensors lie over the ranks (NULL: this process holds them whole): expert tensor p's
   * whole shape (E, A, B) into w, and element j of the whole tensor's index in this rank's, or -1 when
   * another rank holds it (moe_layer_init_params draws the whole tensor, so every rank count makes the
   * same model). */
  void (*whole)(void *self, const moe_layer_t *l, const moe_param_info *p, int64_t w[3]);
  long long (*local)(void *self, const moe_layer_t *l, const moe_param_info *p, size_t j);
  /* moe_layer_reduce_grads: the expert gradients summed over the ranks holding copies (NULL: none) */
  moe_status (*reduce_grads)(void *self, moe_layer_t *l);
} moe__transport;
extern const moe__transport moe__transport_local;  /* transports/local.c */
extern const moe__transport moe__transport_a2a;    /* transports/alltoall.c: dynamic dispatch, all-to-all-v (Linear or 2DH) */
extern const moe__transport moe__transport_static; /* transports/static_exchange.c: static dispatch's fixed exchanges */

/* An optional policy the layer consults at fixed points of a step (the adaptive setup: Tutel's dictionary
 * of r, n and the all-to-all, and MPipeMoE's memory reuse choice). begin: a forward's start, before
 * routing; pick: after placement, the micro-batches n (when they are adaptive) and r (-1: not chosen
 * here); reuse: memory_reuse AUTO's strategy for this forward, given the workspace each would reserve
 * (bytes: none, S2, S3, S4); measure: what this forward's experts did (multiply-adds, seconds) and its
 * exchanges (elements, seconds), for reuse; reconfigured: moe_layer_set_pipeline changed the setting;
 * backward: a backward's start, before its first exchange; time: a forward or backward that began at
 * t0 has ended; trial: whether this step tries a setup; max_micro: the most micro-batches pick chooses
 * (the route workspace is sized for them). A layer without one runs n = 1 for pipeline 0 and S4 for
 * memory_reuse AUTO. */
typedef struct {
  moe_status (*init)(const moe_layer_t *l, void **self);
  void (*free)(void *self);
  moe_status (*begin)(void *self, const moe_layer_t *l);
  moe_status (*pick)(void *self, const moe_layer_t *l, const moe__plan *p, int *n, int *r);
  moe_status (*reuse)(void *self, const moe_layer_t *l, const moe__plan *p, const size_t bytes[4], moe_reuse *out);
  void (*measure)(void *self, const moe_layer_t *l, double madds, double secs, double elems, double comm_secs);
  void (*reconfigured)(void *self);
  moe_status (*backward)(void *self, const moe_layer_t *l);
  void (*time)(void *self, double t0);
  int (*trial)(const void *self);
  int max_micro;
} moe__policy;

/* A layer's plug-ins, chosen once at init (src/wiring/layer_init.c). */
typedef struct {
  const moe__transport *tr;
  const moe__expert_src *src; /* NULL: external experts, given later with the cache */
  const moe__policy *pol;     /* NULL: none */
} moe__plugins;
/* moe_layer_init with these plug-ins: the parameter table, the workspaces and the plug-ins' state, not
 * the inner layers of a hierarchical layer (l->inner is made, zeroed, for the caller to initialize). */
moe_status moe__layer_init(moe_layer_t *l, const moe_layer_config *cfg, const moe__plugins *pl);
/* Whether a configuration shards every expert over the ranks (Tutel's parallel_r set, with dist). */
int moe__layer_sharded(const moe_layer_config *c);

/* The layer's plug-ins, for the features that reach them through the public API (layer.c): the state
 * of l's transport when it is t, of its source when it is src, of its policy (NULL otherwise); a
 * source for external experts (the expert cache) and its state, or none (NULL). */
void *moe__layer_transport(const moe_layer_t *l, const moe__transport *t);
void *moe__layer_source(const moe_layer_t *l, const moe__expert_src *src);
void *moe__layer_policy(const moe_layer_t *l);
void moe__layer_set_source(moe_layer_t *l, const moe__expert_src *src, void *self);
/* Makes src l's expert source (its state from src->init, the old source's freed; nothing when it is
 * already), its state in *self. */
moe_status moe__layer_replace_source(moe_layer_t *l, const moe__expert_src *src, void **self);
/* For tests: what l's last forward left (its plan, the experts' activations) and the bytes its two
 * workspaces hold. */
typedef struct {
  const moe__plan *plan;
  const moe__ffn *ffn;
  size_t route_cap, work_cap;
} moe__layer_peek;
moe__layer_peek moe__layer_inspect(const moe_layer_t *l);





/* sources/ffn.c: the FFN over groups of rows, for the sources that compute FFNs (own weights, the cache).
 * One expert's weights; the bf16 copies of the matrices are read instead when cfg.dtype is bf16. */
typedef struct {
  const float *w1, *b1, *w2, *b2, *w3;
  const uint16_t *w1h, *w2h, *w3h;
  const float *b3; /* swiglu_oai with expert_bias: fc3's bias, else NULL */
} moe__expert_w;
size_t moe__ffn_bytes(void *self, const moe__env *env, int ng, int rows);
moe_status moe__ffn_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f);
/* Forward of groups [e0, e1) of g with activations f, group e's weights at w[e]; side work (or NULL)
 * runs alongside the first GEMMs. */
moe_status moe__ffn_forward(const moe__env *env, const moe__groups *g, const moe__ffn *f, int e0, int e1,
                            const moe__expert_w *w, const moe__side_work *side);

/* transports/alltoall.c: expert parallelism, over at most MOE__EP_MAX_RANKS ranks (per-rank bookkeeping on the stack;
 * moe_layer_init refuses more); the exchanges' bookkeeping shared by both moving transports. */
#define MOE__EP_MAX_RANKS 64
size_t moe__ep_route_bytes(const moe_layer_config *cfg);
/* The counts of the view over all ranks (the stats, and what the capacity is computed from). */
moe_status moe__ep_global_counts(const moe__env *env, moe__view *v);
/* A transport's view: this process's tokens, with the counts over all ranks. */
moe_status moe__ep_view(void *self, const moe__env *env, const moe__plan *p, moe__view *v);
/* Every rank learns whether any failed its checks before the exchanges (a rank that returned early
 * would leave the others waiting in them): mine, or an error naming the first rank that failed. */
moe_status moe__ep_agree(void *self, const moe__env *env, moe_status mine);
/* Books one exchange: its time since t0 and the bytes this rank sent to others. */
void moe__ep_book(const moe__env *env, double t0, double bytes);
/* The exchanges a moving transport has posted on the communication thread (tickets): each way's next
 * micro-batch's exchange in, and the last one posted. finish waits for them all (the stream runs in
 * order: the last done, all are), booking the wait as time in exchanges, and forgets them. */
typedef struct {
  uint64_t next[2], last;
} moe__tickets;
moe_status moe__tickets_finish(moe__tickets *t, const moe__env *env);
/* A transport's self of nothing but fields from calloc, and its free. */
moe_status moe__ep_self_new(size_t bytes, void **self);
void moe__ep_self_free(void *self);

/* The block layout of expert parallelism (transports/alltoall.c): rank q holds experts [q E/W, (q+1) E/W)
 * (the transports' whole and local). */
void moe__ep_whole(void *self, const moe_layer_t *l, const moe_param_info *p, int64_t w[3]);
long long moe__ep_local(void *self, const moe_layer_t *l, const moe_param_info *p, size_t j);


#endif
