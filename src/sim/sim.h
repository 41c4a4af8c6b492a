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

/* The experts' kinds of GEMM: the forward's x W^T, backward's dout W and the weight gradients
 * dout^T h; each at Hockney's r_inf (FLOP/s) and n_1/2 (rows of the per-expert side: M, or the inner K
 * of a weight gradient). NN's are gemm_flops and half_rows, the others' default to them (flops 0). */
typedef enum { MOE__SIM_NT, MOE__SIM_NN, MOE__SIM_TN } moe__sim_kind;
typedef struct {
  double flops, half_rows;
} moe__sim_gemm;

struct moe_sim_config {
  int nodes, dpn;                            /* devices = nodes * dpn */
  double intra_bw, intra_lat, inter_bw, inter_lat, host_bw; /* bytes/s and s */
  double gemm_flops, half_rows, mem_bytes;   /* r_inf, n_1/2 of each expert's GEMM; mem_bytes 0: unchecked */
  moe__sim_gemm nt, tn;                      /* the other kinds (moe__sim_kind) */
  double mem_bw;                             /* bytes/s of the memory-bound passes; 0: left out */
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
  char *serve_trace;                         /* a serving run over this trace (serve.c), or NULL */
  int cache_k;                               /* its expert slots per layer, 0: every expert resident */
  moe_cache_policy cache_policy;
  double fetch_bw;                           /* bytes/s from the slow memory the experts are read from */
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

/* The layer's passes outside the experts' GEMMs, in bytes (dtype_bytes each element): a device's
 * token side (the finiteness check, the router's logits, softmax, top-k and loss sums, the dispatch
 * gather and the combine; backward their gradients) for `sent` of its tokens' assignments kept, by
 * part of the step, and
 * the expert side (biases, activation and their gradients) for `rows` received. Seconds at mem_bw. */
typedef enum { MOE__SIM_BEFORE, MOE__SIM_AFTER, MOE__SIM_FIRST, MOE__SIM_LAST } moe__sim_part; /* forward's
                                                        before and after the experts, backward's first and last */
double moe__sim_token_bytes(const moe_sim_config *c, double sent, moe__sim_part part);
double moe__sim_expert_bytes(const moe_sim_config *c, double rows, int backward);
/* Seconds of `gemms` GEMMs of one kind with `rows` rows in all on the per-expert side, each D x H. */
double moe__sim_gemm_s(const moe_sim_config *c, moe__sim_kind k, double rows, double gemms);
/* Seconds of the router's three GEMMs (T x E x D: logits, their weight gradient and input gradient). */
double moe__sim_router_s(const moe_sim_config *c);

/* moe_sim_calibrate's measurements as a config's rates (the rest zero): every GEMM kind, mem_bw, and
 * intra_bw and intra_lat of the exchange among d's ranks on one node. Every rank calls it. */
moe_status moe__sim_calibrate(const moe_dist *d, int threads, moe_sim_config *c);

#define MOE__SIM_SERVE_MAX_STEPS 16384 /* a serving run's (moe_sim_serve): the per-step misses cost steps^2 / 2
                                           steps of moe_cachesim */

/* The largest device's high-water mark in bytes: pipe_model.h's states (Eq. 1, `local` experts) and
 * pools for the rows it receives, in n micro-batches under the config's reuse. */
moe_status moe__sim_memory(const moe_sim_config *c, const int64_t *send, int n, int local, double *bytes);

#endif
