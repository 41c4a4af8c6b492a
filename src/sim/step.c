/* The simulated step: routed traffic, all-to-all cost over the two-level topology, and the
 * discrete-event schedule of the streams (DESIGN 4.6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

moe_status moe__sim_route(const moe_sim_config *c, int64_t *per_expert) {
  double *w = malloc(sizeof *w * (size_t)c->E), sum = 0;
  MOE_TRY(w, MOE_ERR_NOMEM, "simulator: routing of %d experts", c->E);
  for (int e = 0; e < c->E; e++) sum += w[e] = c->load ? c->load[e] : pow(e + 1.0, -c->zipf);
  /* Largest remainder, ties to the lower expert: the counts sum to T k exactly. */
  int64_t total = (int64_t)c->T * c->k, left = total;
  for (int e = 0; e < c->E; e++) {
    w[e] = w[e] / sum * (double)total;
    per_expert[e] = (int64_t)floor(w[e]);
    left -= per_expert[e];
    w[e] -= (double)per_expert[e];
  }
  for (; left > 0; left--) {
    int best = 0;
    for (int e = 1; e < c->E; e++)
      if (w[e] > w[best]) best = e;
    per_expert[best]++, w[best] = -1;
  }
  free(w);
  if (c->cf > 0) {
    int64_t cap = (int64_t)ceil(c->cf * (double)total / c->E);
    for (int e = 0; e < c->E; e++)
      if (per_expert[e] > cap || c->padded) per_expert[e] = cap;
  }
  return MOE_OK;
}

/* alpha-beta: m messages of latency lat and the bytes over bandwidth bw. */
static double link(int m, double lat, double bytes, double bw) { return m * lat + (m > 0 ? bytes / bw : 0); }

int moe__sim_msgs(const moe_sim_config *c, moe__a2a a) {
  return c->dpn - 1 + (a == MOE__A2A_2DH ? c->nodes - 1 : moe__sim_devices(c) - c->dpn);
}

static int any_sent(int W, const double *bytes) {
  for (int g = 0; g < W; g++)
    for (int h = 0; h < W; h++)
      if (h != g && bytes[(size_t)g * W + h] > 0) return 1;
  return 0;
}

double moe__sim_a2a(const moe_sim_config *c, moe__a2a a, const double *bytes) {
  int W = moe__sim_devices(c), P = c->dpn;
  double worst = 0;
  /* The busier direction of each node's NIC: inter-node bytes out of and into it. */
  double nic = 0;
  for (int node = 0; node < c->nodes; node++) {
    double out = 0, in = 0;
    for (int g = node * P; g < (node + 1) * P; g++)
      for (int h = 0; h < W; h++)
        if (h / P != node) out += bytes[(size_t)g * W + h], in += bytes[(size_t)h * W + g];
    nic = fmax(nic, fmax(out, in));
  }
  int m_intra = P - 1, m_inter = a == MOE__A2A_2DH ? c->nodes - 1 : W - P;
  if (!any_sent(W, bytes)) return 0; /* nothing leaves any device (r = 0): no exchange is made */
  for (int g = 0; g < W; g++) {
    /* Intra-node bytes out of and into g: Linear, those for g's node; 2DH's first phase, every byte
     * that changes local index (it goes to the device of its destination's local index first). */
    double out = 0, in = 0;
    for (int h = 0; h < W; h++) {
      int intra = a == MOE__A2A_2DH ? h % P != g % P : h / P == g / P && h != g;
      if (intra) out += bytes[(size_t)g * W + h];
    }
    if (a == MOE__A2A_2DH) {
      for (int s = g / P * P; s < g / P * P + P; s++)
        for (int h = g % P; s % P != g % P && h < W; h += P) in += bytes[(size_t)s * W + h];
    } else {
      for (int s = g / P * P; s < g / P * P + P; s++)
        if (s != g) in += bytes[(size_t)s * W + g];
    }
    double t_intra = link(m_intra, c->intra_lat, fmax(out, in), c->intra_bw);
    double t_inter = c->nodes > 1 ? link(m_inter, c->inter_lat, nic, c->inter_bw) : 0;
    worst = fmax(worst, a == MOE__A2A_2DH ? t_intra + t_inter : fmax(t_intra, t_inter));
  }
  return worst;
}

/* The streams of all devices (collective all-to-alls keep one communication clock). */
typedef struct {
  int W;
  double comm;          /* when the communication stream is free */
  double busy;          /* its busy time */
  double *comp, *copy;  /* (W) when each device's compute and copy streams are free */
} streams;

/* One pass over n micro-batches: the communication stream runs X1 X2 Y1 X3 Y2 ... Xn Y(n-1) Yn
 * (P4's S1 S2 R1 S3 R2 ...), micro-batch i's compute runs between its X and its Y, after `ready` (its
 * restored tensors, (n, W), or NULL); offload (seconds per device, (n, W), or NULL) is copied out on
 * the copy stream after the compute. x, y: (n) all-to-all seconds; work: (n, W) compute seconds. */
static void pass(streams *s, int n, const double *x, const double *y, const double *work, const double *ready,
                 const double *offload, double *done /* (n, W) */) {
  int W = s->W;
  for (int j = 0; j <= n; j++) {
    if (j < n) { /* X_j, then its compute */
      s->comm += x[j], s->busy += x[j];
      for (int g = 0; g < W; g++) {
        double t = fmax(s->comp[g], s->comm);
        if (ready) t = fmax(t, ready[(size_t)j * W + g]);
        s->comp[g] = done[(size_t)j * W + g] = t + work[(size_t)j * W + g];
        if (offload) s->copy[g] = fmax(s->copy[g], s->comp[g]) + offload[(size_t)j * W + g];
      }
    }
    if (j >= 1) { /* Y_(j-1): a collective, after every device's compute of that micro-batch */
      double t = s->comm;
      for (int g = 0; g < W; g++) t = fmax(t, done[(size_t)(j - 1) * W + g]);
      s->comm = t + y[j - 1], s->busy += y[j - 1];
    }
  }
}

/* A kind's rates: its own where the config gives them, else gemm_flops and gemm_half_rows. */
static moe__sim_gemm kind(const moe_sim_config *c, moe__sim_kind k) {
  const moe__sim_gemm *g = k == MOE__SIM_NT ? &c->nt : k == MOE__SIM_TN ? &c->tn : NULL;
  return g && g->flops > 0 ? *g : (moe__sim_gemm){c->gemm_flops, c->half_rows};
}

double moe__sim_gemm_s(const moe_sim_config *c, moe__sim_kind k, double rows, double gemms) {
  moe__sim_gemm g = kind(c, k);
  return 2.0 * c->D * c->H * (rows + g.half_rows * gemms) / g.flops;
}

double moe__sim_router_s(const moe_sim_config *c) { return 3 * 2.0 * c->T * c->E * c->D / kind(c, MOE__SIM_NT).flops; }

/* Elements read plus written, counted pass by pass from the layer's loops (dispatch.c, router.c,
 * sources/ffn.c), for each part of a step (moe__sim_part): before the experts, x's check (T D), the
 * logits' GEMM reading x (T D), logits, softmax, k top-k scans and the loss sums over T E ((6 + k)
 * T E) and the gather (2 a D); after them the combine (a D in, T D out); backward, first dout and the
 * weights' dot products (3 a D), last dx (T D + a D), the router's gradient over T E (6) and its
 * GEMMs reading x and updating dx (3 T D). */
double moe__sim_token_bytes(const moe_sim_config *c, double sent, moe__sim_part part) {
  double TD = (double)c->T * c->D, TE = (double)c->T * c->E, aD = sent * c->D;
  static const double td[4] = {2, 1, 0, 4}, ad[4] = {2, 1, 3, 1};
  double te[4] = {6.0 + c->k, 0, 0, 6};
  return (td[part] * TD + ad[part] * aD + te[part] * TE) * c->elem;
}

/* Forward: the fc1 bias and the activation over rows H (read and write each), the fc2 bias over rows
 * D; backward: the activation's gradient (a1 and dh in, dh out) and the two bias gradients' sums. */
double moe__sim_expert_bytes(const moe_sim_config *c, double rows, int backward) {
  double rH = rows * c->H, rD = rows * c->D;
  return (backward ? 4 * rH + rD : 4 * rH + 2 * rD) * c->elem;
}

static double at_bw(const moe_sim_config *c, double bytes) { return c->mem_bw > 0 ? bytes / c->mem_bw : 0; }

/* The token side's part p (the same on every device: the busiest's `sent`), not overlapped: the
 * compute and communication streams wait for the latest, then run it; the copy stream goes on. */
static void token_part(streams *s, const moe_sim_config *c, double sent, moe__sim_part p, double *total) {
  double t = 0;
  if (c->mem_bw > 0) {
    double router = moe__sim_router_s(c); /* its forward GEMM before the experts, its two gradients last */
    t = moe__sim_token_bytes(c, sent, p) / c->mem_bw + (p == MOE__SIM_BEFORE ? router / 3 : p == MOE__SIM_LAST ?
                                                        2 * router / 3 : 0);
  }
  double at = s->comm;
  for (int g = 0; g < s->W; g++) at = fmax(at, s->comp[g]);
  s->comm = at + t;
  for (int g = 0; g < s->W; g++) s->comp[g] = at + t;
  *total += t;
}

moe_status moe__sim_step(const moe_sim_config *c, const int64_t *send, int n, moe__a2a a, double tail,
                         moe__sim_times *out) {
  int W = moe__sim_devices(c);
  size_t WW = (size_t)W * W, nW = (size_t)n * W;
  double *bytes = malloc(sizeof(double) * WW), *x = calloc(2 * (size_t)n, sizeof(double));
  double *buf = calloc(6 * nW + 2 * (size_t)W, sizeof(double));
  if (!bytes || !x || !buf) {
    free(bytes), free(x), free(buf);
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "simulator: a step of %d devices x %d micro-batches", W, n);
  }
  double *xb = x + n; /* backward's X: its gradient all-to-all, plus re-communicating T_DI (S2, S4) */
  double *fw = buf, *bw = fw + nW, *off = bw + nW, *ready = off + nW, *done = ready + nW;
  streams s = {W, 0, 0, done + 2 * nW, done + 2 * nW + W};
  int recomm = c->reuse == MOE__REUSE_S2 || c->reuse == MOE__REUSE_S4;
  int recomp = c->reuse == MOE__REUSE_S3 || c->reuse == MOE__REUSE_S4;
  /* Offloaded per token: T_M (H) under S2, T_DI (M) under S3. */
  double off_elems = c->reuse == MOE__REUSE_S2 ? c->H : c->reuse == MOE__REUSE_S3 ? c->D : 0;
  for (int i = 0; i < n; i++) {
    for (size_t p = 0; p < WW; p++)
      bytes[p] = (double)moe__pipe_part((size_t)send[p], n, i) * c->D * c->elem;
    x[i] = moe__sim_a2a(c, a, bytes);
    xb[i] = x[i] * (recomm ? 2 : 1);
    for (int h = 0; h < W; h++) {
      int64_t recv = 0;
      for (int g = 0; g < W; g++) recv += send[(size_t)g * W + h];
      /* Micro-batch i computes its run of the local experts, each GEMM costing its kind's n_1/2 more:
       * forward x W1^T, h W2^T (+ S3/S4's recomputed first); backward dout W2, da1 W1 and the weight
       * gradients dout^T h, da1^T x, whose small side is the inner one. */
      double rows = (double)moe__pipe_part((size_t)recv, n, i), g = (double)moe__pipe_part((size_t)c->local, n, i);
      double nt = moe__sim_gemm_s(c, MOE__SIM_NT, rows, g);
      fw[(size_t)i * W + h] = 2 * nt + at_bw(c, moe__sim_expert_bytes(c, rows, 0));
      bw[(size_t)i * W + h] = (recomp ? nt : 0) + 2 * moe__sim_gemm_s(c, MOE__SIM_NN, rows, g) +
                              2 * moe__sim_gemm_s(c, MOE__SIM_TN, rows, g) + at_bw(c, moe__sim_expert_bytes(c, rows, 1));
      off[(size_t)i * W + h] = off_elems > 0 ? rows * off_elems * c->elem / c->host_bw : 0;
    }
  }
  double sent = 0, tok = 0; /* the most any device routes: its row of send */
  for (int g = 0; g < W; g++) {
    double r = 0;
    for (int h = 0; h < W; h++) r += (double)send[(size_t)g * W + h];
    sent = fmax(sent, r);
  }
  out->a2a1 = n == 1 ? x[0] : 0;
  token_part(&s, c, sent, MOE__SIM_BEFORE, &tok);
  pass(&s, n, x, x, fw, NULL, off_elems > 0 ? off : NULL, done);
  token_part(&s, c, sent, MOE__SIM_AFTER, &tok);
  /* Backward: offloaded tensors come back on the copy stream, in micro-batch order. */
  for (int g = 0; g < W; g++) {
    s.copy[g] = fmax(s.copy[g], s.comm);
    for (int i = 0; i < n; i++) ready[(size_t)i * W + g] = s.copy[g] += off[(size_t)i * W + g];
  }
  token_part(&s, c, sent, MOE__SIM_FIRST, &tok);
  pass(&s, n, xb, x, bw, ready, NULL, done + nW);
  token_part(&s, c, sent, MOE__SIM_LAST, &tok);
  s.comm += tail, s.busy += tail;
  out->step = s.comm, out->comm = s.busy, out->comp_max = 0, out->comp_min = INFINITY, out->slowest = 0;
  for (int g = 0; g < W; g++) {
    double t = tok;
    for (int i = 0; i < n; i++) t += fw[(size_t)i * W + g] + bw[(size_t)i * W + g];
    if (t > out->comp_max) out->comp_max = t, out->slowest = g;
    out->comp_min = fmin(out->comp_min, t);
  }
  free(bytes), free(x), free(buf);
  return MOE_OK;
}

moe_status moe__sim_memory(const moe_sim_config *c, const int64_t *send, int n, int local, double *bytes) {
  int W = moe__sim_devices(c);
  *bytes = 0;
  for (int h = 0; h < W; h++) {
    size_t B = 0;
    for (int g = 0; g < W; g++) B += (size_t)send[(size_t)g * W + h];
    moe__mem_shape sh = {(double)B, c->D, c->H, c->E, local};
    moe__pools p;
    MOE_CHECK(moe__pipe_pools(B, moe__pipe_part(B, n, 0), (size_t)c->D, (size_t)c->H, n, c->reuse,
                              (size_t)c->elem, &p));
    *bytes = fmax(*bytes, moe__mem_states(&sh) * c->elem + (double)(p.di + p.m + p.dout));
  }
  return MOE_OK;
}
