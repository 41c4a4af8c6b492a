/* Tutel's adaptive parallelism of degree r (DIGEST P2 1.3) as simulated traffic, per-device work and
 * the weights' all-gather. Each expert spans m = W/E devices (1 when E >= W: E/W experts each) that
 * own its weights in shards (ZeRO-3 layout, so switching r moves nothing). r = 0 (DP): every device
 * all-gathers every expert and computes its own tokens; no token exchange. 1 <= r <= m (EP+DP+MP):
 * an expert's devices form r model-parallel shards of H/r columns, each held by ceil(m/r) replicas
 * that all-gather it; a token goes to one replica of every shard (the gate result repeated r times),
 * and r partial outputs come back to be summed. Backward reduce-scatters what forward gathered. */
#include <math.h>
#include <string.h>

#include "sim/sim.h"

int moe__sim_r_max(const moe_sim_config *c) {
  int W = moe__sim_devices(c);
  return c->E >= W ? 1 : W / c->E;
}

/* Ring all-gather of `bytes` over g devices, then its reduce-scatter in backward: 2 (g - 1) messages
 * and 2 (g - 1) / g of the bytes, within a node when the g devices are (an expert's m are adjacent). */
static double gather_time(const moe_sim_config *c, int g, double bytes, int in_node) {
  if (g <= 1) return 0;
  double lat = in_node ? c->intra_lat : c->inter_lat, bw = in_node ? c->intra_bw : c->inter_bw;
  return 2 * ((g - 1) * lat + (double)(g - 1) / g * bytes / bw);
}

moe_status moe__sim_parallel(const moe_sim_config *c, const int64_t *per_expert, int r, int64_t *send,
                             moe_sim_config *dev, double *gather_s) {
  int W = moe__sim_devices(c), m = moe__sim_r_max(c), E = c->E;
  MOE_TRY(r >= 0 && r <= m, MOE_ERR_ARG, "simulator: parallelism degree r %d, want 0 to %d (W/E)", r, m);
  memset(send, 0, sizeof *send * (size_t)W * W);
  *dev = *c;
  double expert_bytes = 2.0 * c->D * c->H * c->elem;
  if (r == 0) {
    int64_t rows = 0;
    for (int e = 0; e < E; e++) rows += per_expert[e];
    for (int g = 0; g < W; g++) send[(size_t)g * W + g] = rows;
    dev->local = E;
    *gather_s = gather_time(c, W, E * expert_bytes, c->nodes == 1);
    return MOE_OK;
  }
  if (m == 1) { /* E >= W: block placement, device h holds experts [h E/W, (h+1) E/W) */
    for (int g = 0; g < W; g++)
      for (int e = 0; e < E; e++) send[(size_t)g * W + e / (E / W)] += per_expert[e];
    dev->local = E / W;
    *gather_s = 0;
    return MOE_OK;
  }
  /* Shard s's replica j of expert e is device e m + min(s reps + j, m - 1): when r does not divide m
   * the last devices take two parts, the cost of an uneven split. Source g uses replica g % reps. */
  int reps = (m + r - 1) / r;
  for (int g = 0; g < W; g++)
    for (int e = 0; e < E; e++)
      for (int s = 0; s < r; s++) {
        int j = g % reps, slot = s * reps + j < m ? s * reps + j : m - 1;
        send[(size_t)g * W + (size_t)e * m + slot] += per_expert[e];
      }
  dev->H = (c->H + r - 1) / r, dev->local = 1;
  *gather_s = gather_time(c, reps, expert_bytes / r, m <= c->dpn);
  return MOE_OK;
}
