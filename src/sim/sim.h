/* The simulator's internals (moe simulate, DESIGN 4.6): the config, the routed traffic, the all-to-all
 * cost over the two-level topology and the discrete-event step. The policies it reports are the
 * runtime's own (src/adapt/pipe_model.h, src/flex/flex.h), called, not copied. */
#ifndef MOE_SIM_H
#define MOE_SIM_H

#include <stdint.h>

#include "adapt/pipe_model.h"
#include "internal.h"

/* The traffic is a dense devices x devices table (O(W^2) per all-to-all): 4,096 devices is 128 MiB. */
#define MOE__SIM_MAX_DEVICES 4096

struct moe_sim_config {
  int nodes, dpn;                            /* devices = nodes * dpn */
  double intra_bw, intra_lat, inter_bw, inter_lat, host_bw; /* bytes/s and s */
  double gemm_flops, half_rows, mem_bytes;   /* r_inf, n_1/2 of each expert's GEMM; mem_bytes 0: unchecked */
  int T, D, H, E, k, elem;                   /* tokens per device, model dim, hidden, experts, top-k, bytes */
  double cf;                                 /* capacity factor, 0: no capacity (nothing dropped) */
  double zipf;                               /* routing skew when load is NULL */
  double *load;                              /* (E) relative expert loads, or NULL */
  int pipeline;                              /* micro-batches, 0: Algorithm 1 ("auto") */
  moe__a2a a2a;
  moe__reuse reuse;
  int flex;
  int r;                                     /* Tutel's parallelism degree (parallel.c) */
  int padded;                                /* "dispatch": "static": every expert's capacity travels */
  int local;                                 /* GEMMs (experts or shards) per device: set by moe__sim_parallel */
};

static inline int moe__sim_devices(const moe_sim_config *c) { return c->nodes * c->dpn; }

/* Tokens each device routes to each expert (E): T k split by the loads (largest remainder), then cut
 * to the capacity ceil(cf T k / E) when cf > 0, or padded to it (static dispatch). Every device
 * routes alike. */
moe_status moe__sim_route(const moe_sim_config *c, int64_t *per_expert);

/* Tutel's degree r (parallel.c): the largest, W/E (1 when E >= W); and for r, the traffic send
 * (W x W, tokens), the config each device computes with (H / r per GEMM, its GEMM count) and the
 * weights' all-gather and gradients' reduce-scatter in seconds. */
int moe__sim_r_max(const moe_sim_config *c);
moe_status moe__sim_parallel(const moe_sim_config *c, const int64_t *per_expert, int r, int64_t *send,
                             moe_sim_config *dev, double *gather_s);

/* Seconds of one all-to-all in which device g sends bytes[g W + h] to h (collective: the slowest
 * device's time). Linear: each device's W - 1 messages, the intra-node ones over its own link, the
 * inter-node ones over its node's NIC, shared by the node's devices; 2DH: an intra-node phase, then an
 * inter-node phase between devices of the same local index. */
double moe__sim_a2a(const moe_sim_config *c, moe__a2a a, const double *bytes);
/* Messages each device sends in one all-to-all: Linear W - 1, 2DH (P - 1) + (nodes - 1). */
int moe__sim_msgs(const moe_sim_config *c, moe__a2a a);

typedef struct {
  double step, comm;           /* the step; the communication stream's busy time */
  double comp_max, comp_min;   /* expert compute of the busiest and the least busy device */
  int slowest;
  double a2a1;                 /* one all-to-all of the whole batch (n = 1) */
} moe__sim_times;

/* One step of forward + backward with send[g W + h] tokens from g to h in n micro-batches under
 * all-to-all a, then `tail` seconds of replica all-reduce on the communication stream. */
moe_status moe__sim_step(const moe_sim_config *c, const int64_t *send, int n, moe__a2a a, double tail,
                         moe__sim_times *out);

/* The largest device's high-water mark in bytes: pipe_model.h's states (Eq. 1, `local` experts) and
 * pools for the rows it receives, in n micro-batches under the config's reuse. */
moe_status moe__sim_memory(const moe_sim_config *c, const int64_t *send, int n, int local, double *bytes);

#endif
