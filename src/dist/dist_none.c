/* moe_dist without MPI: rank 0 of 1, collectives are copies (see dist.h). */
#include <stdlib.h>
#include <string.h>

#include "dist.h"

int moe_dist_has_mpi(void) { return 0; }

moe_status moe_dist_set_a2a(moe_dist *d, moe_a2a algo, int ranks_per_node) {
  (void)d;
  MOE_TRY((unsigned)algo <= MOE_A2A_2DH, MOE_ERR_ARG, "unknown all-to-all algorithm %d", algo);
  MOE_TRY(ranks_per_node >= 0, MOE_ERR_ARG, "ranks per node must be >= 0, got %d", ranks_per_node);
  return MOE_OK;
}

moe_status moe_dist_init(moe_dist **out, int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  moe_dist *d = calloc(1, sizeof *d);
  MOE_TRY(d, MOE_ERR_NOMEM, "moe_dist_init: out of memory");
  d->size = 1;
  *out = d;
  return MOE_OK;
}

void moe_dist_finalize(moe_dist *d) { free(d); }

moe_status moe_dist_allreduce(const moe_dist *d, double *a, int n) {
  (void)d, (void)a, (void)n;
  return MOE_OK;
}

moe_status moe__dist_allreduce_f32(const moe_dist *d, float *a, int n) {
  (void)d, (void)a, (void)n;
  return MOE_OK;
}

moe_status moe_dist_gather(const moe_dist *d, const float *a, int n, float *out) {
  (void)d;
  if (n) memcpy(out, a, (size_t)n * sizeof *a);
  return MOE_OK;
}

moe_status moe__dist_alltoallv_i32(const moe_dist *d, const int32_t *send, const int *sendcounts,
                                   const int *sdispls, int32_t *recv, const int *recvcounts,
                                   const int *rdispls) {
  (void)d, (void)recvcounts;
  if (sendcounts[0]) memcpy(recv + rdispls[0], send + sdispls[0], (size_t)sendcounts[0] * sizeof *send);
  return MOE_OK;
}

moe_status moe__dist_alltoallv_rows(const moe_dist *d, const float *send, const int *sendcounts,
                                    const int *sdispls, float *recv, const int *recvcounts,
                                    const int *rdispls, int width) {
  (void)d, (void)recvcounts;
  size_t w = (size_t)width;
  if (sendcounts[0]) memcpy(recv + rdispls[0] * w, send + sdispls[0] * w, (size_t)sendcounts[0] * w * sizeof *send);
  return MOE_OK;
}

moe_status moe__dist_alltoallv_rows_polled(const moe_dist *d, const float *send, const int *sendcounts,
                                           const int *sdispls, float *recv, const int *recvcounts,
                                           const int *rdispls, int width) {
  return moe__dist_alltoallv_rows(d, send, sendcounts, sdispls, recv, recvcounts, rdispls, width);
}

moe_status moe__dist_reduce_scatter_f32(const moe_dist *d, const float *send, float *recv, const int *counts) {
  (void)d;
  if (counts[0]) memcpy(recv, send, (size_t)counts[0] * sizeof *send);
  return MOE_OK;
}

moe_status moe__dist_allgather_f32(const moe_dist *d, const float *send, float *recv, const int *counts) {
  (void)d;
  if (counts[0]) memcpy(recv, send, (size_t)counts[0] * sizeof *send);
  return MOE_OK;
}

int moe_dist_rank(const moe_dist *d) { return d ? d->rank : 0; }
int moe_dist_size(const moe_dist *d) { return d ? d->size : 1; }

void moe_dist_abort(const moe_dist *d, int code) { (void)d, (void)code; }

int moe__dist_a2a_grid(const moe_dist *d, int *nodes, moe_a2a *now) {
  (void)d;
  *nodes = 0;
  *now = MOE_A2A_LINEAR;
  return 0;
}

moe_status moe__dist_a2a_use(const moe_dist *d, moe_a2a algo) {
  (void)d;
  MOE_TRY(algo == MOE_A2A_LINEAR, MOE_ERR_STATE, "2DH all-to-all: no grid of nodes without MPI");
  return MOE_OK;
}

struct moe__dist_group {
  int unused; /* one process: a group of itself, whose sum is its own */
};

moe_status moe__dist_group_split(const moe_dist *d, int member, moe__dist_group **out) {
  (void)d;
  *out = member ? calloc(1, sizeof **out) : NULL;
  MOE_TRY(*out || !member, MOE_ERR_NOMEM, "a communicator of a rank group: out of memory");
  return MOE_OK;
}

moe_status moe__dist_group_allreduce_f32(moe__dist_group *g, float *a, int n) {
  (void)g, (void)a, (void)n;
  return MOE_OK;
}

void moe__dist_group_free(moe__dist_group *g) { free(g); }
