/* Tutel's adaptive parallelism r (internal): the sharded layout (shard.c), the work each rank does
 * under an r (its tasks, shard.c), the weight source that gathers the tasks' weights and scatters their
 * gradients back to the shards (shard.c), and the token flows (shard/transport.c).
 *
 * Every expert e has a range of ranks and is cut into slices of its hidden dimension H:
 *   r = 0:      ranks [0, W), one slice (all of H): every rank computes every expert on its own tokens;
 *   r >= 1:     W > E: ranks [W e / E, W (e + 1) / E), n of them, cut into min(r, n, H) sub-groups of
 *               consecutive ranks, sub-group j computing slice j of H (MP) on the rows sent to it (DP);
 *               W <= E: rank floor(e W / E) alone, all of H (expert parallelism).
 * A source rank s sends its rows of expert e to one member of every slice's sub-group: member s mod g
 * (g its size), which is s itself at r = 0. The slices' outputs are partial sums over H: the source
 * adds them (slice 0 alone adds fc2's bias). A task is one (expert, slice) of a rank; a rank's tasks all
 * have the same width (one task when W > E and r >= 1, whole experts otherwise). */
#ifndef MOE_SHARD_H
#define MOE_SHARD_H

#include "adapt/pipe_model.h"
#include "layer/plugins.h"

typedef struct {
  int e, j;   /* expert, slice (slice 0 adds fc2's bias) */
  int h0, h1; /* its rows of H */
} moe__task;

/* r clipped to [0, ceil(W/E)]. */
int moe__shard_clip(int W, int E, int r);
/* Expert e's slices under r and the member of slice j's sub-group that source rank s sends to. */
int moe__shard_slices(int W, int E, int H, int r, int e);
int moe__shard_member(int W, int E, int H, int r, int e, int j, int s);
/* Rank p's tasks under r into t (at least E entries), ascending (e, j); their number. */
int moe__shard_tasks(int W, int E, int H, int r, int p, moe__task *t);

struct moe__shard_s {
  int r;               /* asked: MOE_PARALLEL_AUTO or >= 0 */
  int r_now;           /* this forward's, clipped (-1 before the first) */
  int nt;              /* this rank's tasks under r_now */
  moe__task *tasks;    /* (E) */
  moe_layer_t cl;      /* the tasks' weights gathered: a one-process layer of nt experts of their width */
  int cl_r;            /* the r cl is built for (-1: none) */
  moe__arena work;     /* cl's activations */
  /* the token exchange (shard/transport.c), in the route arena */
  int32_t *K;          /* (W, E) kept rows per expert of every rank */
  int *cnt;            /* (4 W) send counts, send displacements, receive counts, receive displacements */
  int32_t *seg;        /* segments (row of xs, row of the send staging, rows, expert) then (row of the
                        * receive staging, row of the groups, rows) */
  int nsend, nrecv;    /* segments of each kind */
  int srows;           /* rows this rank sends (its rows repeated once per slice) */
  float *sbuf;         /* (srows, D) send staging, in the work arena (two when slotted: one a way) */
  float *back;         /* the rows the way back's local sums go to, once every exchange is in (finish) */
  int bwd_done;        /* micro-batches of this backward done (the gradients go back after the last) */
  float *wbuf;         /* (wcap) the weights' exchange, sent then received */
  size_t wcap;
  moe__tickets tk;     /* the exchanges posted on the communication thread */
  float *xr;           /* (grows, D) receive staging (two when slotted) */
};
typedef struct moe__shard_s moe__shard;

/* The layout (shard.c): for an expert tensor of a sharded layer, its whole shape as (E, A, B), the
 * axis (1 or 2) split over the ranks and rank q's range [lo, hi) of it; 0 for tensors not split. */
int moe__shard_axis(const moe_layer_t *l, const moe_param_info *p, int q, int64_t whole[3], int *lo, int *hi);
/* Element j of tensor p whole: its index in this rank's shard, or -1 when another rank holds it. */
long long moe__shard_local(const moe_layer_t *l, const moe_param_info *p, size_t j);
/* The sharded state of layer l (its transport's), or NULL when it is not sharded. */
moe__shard *moe__shard_of(const moe_layer_t *l);
/* This forward's r (clipped): the rank's tasks, and the tasks' layer when r changed. */
moe_status moe__shard_use(moe__shard *sh, const moe_layer_config *c, int r);
/* Tensor p of l (params' or grads' layout: src, this rank's): rank 0 gets it whole at dst (collective;
 * the other ranks' dst is not read), and this rank's part of it from whole (a copy when not split). */
moe_status moe__shard_gather_tensor(const moe_layer_t *l, const moe_param_info *p, const float *src, float *dst);
void moe__shard_take_tensor(const moe_layer_t *l, const moe_param_info *p, const float *whole, float *dst);
/* The tasks' weights gathered from the shards into cl (grads 0: before a forward's experts), or their
 * gradients added back to the shards (1: after a backward's); a collective, made while no exchange
 * is in flight. */
moe_status moe__shard_weights(moe__shard *sh, const moe__env *env, int grads);
/* The state (the transport's, which the source shares), made at init; freed with the layer. */
moe_status moe__shard_new(const moe_layer_t *l, void **self);
void moe__shard_free(void *self);

extern const moe__expert_src moe__experts_shard;    /* shard.c */
extern const moe__transport moe__transport_shard;   /* shard/transport.c */

#endif
