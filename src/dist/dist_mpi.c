/* moe_dist over MPI (see dist.h). Errors are fatal in MPI by default (every rank aborts); the
 * wrappers still check return codes so that an MPI_ERRORS_RETURN handler gets a clear message. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

#define COMM(d) (*(MPI_Comm *)(d)->comm)
#define MPI_TRY(call, what)                                                            \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    MOE_TRY(rc_ == MPI_SUCCESS, MOE_ERR_IO, "MPI %s failed on rank %d (error %d)", what, \
            d->rank, rc_);                                                             \
  } while (0)

int moe_dist_has_mpi(void) { return 1; }

/* Started by an MPI launcher (Open MPI's mpirun, or a PMI/PMIx one such as srun)? */
static int launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* One process without MPI: collectives are copies (as in dist_none.c). */
#define ONE(d) ((d)->comm == NULL)

moe_status moe_dist_init(moe_dist **out, int *argc, char ***argv) {
  moe_dist *d = calloc(1, sizeof *d);
  MPI_Comm *c = malloc(sizeof *c);
  if (!d || !c) {
    free(d);
    free(c);
    MOE_TRY(0, MOE_ERR_NOMEM, "moe_dist_init: out of memory");
  }
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && !launched()) { /* not under mpirun: one process, and MPI stays uninitialized */
    free(c);
    d->size = 1;
    *out = d;
    return MOE_OK;
  }
  if (!inited) {
    if (MPI_Init(argc, argv) != MPI_SUCCESS) {
      free(d);
      free(c);
      MOE_TRY(0, MOE_ERR_IO, "MPI_Init failed");
    }
    d->owns_mpi = 1;
  }
  *c = MPI_COMM_WORLD;
  d->comm = c;
  MPI_Comm_rank(*c, &d->rank);
  MPI_Comm_size(*c, &d->size);
  *out = d;
  return MOE_OK;
}

void moe_dist_finalize(moe_dist *d) {
  if (!d) return;
  if (ONE(d)) {
    free(d);
    return;
  }
  if (d->owns_mpi) MPI_Finalize();
  free(d->comm);
  free(d);
}

moe_status moe_dist_allreduce(const moe_dist *d, double *a, int n) {
  if (ONE(d)) return MOE_OK;
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_DOUBLE, MPI_SUM, COMM(d)), "Allreduce");
  return MOE_OK;
}

moe_status moe__dist_allreduce_f32(const moe_dist *d, float *a, int n) {
  if (ONE(d)) return MOE_OK;
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, MPI_SUM, COMM(d)), "Allreduce");
  return MOE_OK;
}

moe_status moe_dist_gather(const moe_dist *d, const float *a, int n, float *out) {
  if (ONE(d)) {
    if (n) memcpy(out, a, (size_t)n * sizeof *a);
    return MOE_OK;
  }
  int *counts = d->rank == 0 ? malloc(sizeof(int) * 2 * (size_t)d->size) : NULL;
  MOE_TRY(d->rank != 0 || counts, MOE_ERR_NOMEM, "moe_dist_gather: out of memory");
  int *displs = counts ? counts + d->size : NULL;
  int rc = MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, COMM(d));
  if (rc == MPI_SUCCESS && counts) {
    displs[0] = 0;
    for (int i = 1; i < d->size; i++) displs[i] = displs[i - 1] + counts[i - 1];
  }
  if (rc == MPI_SUCCESS) rc = MPI_Gatherv(a, n, MPI_FLOAT, out, counts, displs, MPI_FLOAT, 0, COMM(d));
  free(counts);
  MPI_TRY(rc, "Gatherv");
  return MOE_OK;
}

moe_status moe__dist_alltoallv_i32(const moe_dist *d, const int32_t *send, const int *sendcounts,
                                   const int *sdispls, int32_t *recv, const int *recvcounts,
                                   const int *rdispls) {
  if (ONE(d)) {
    if (sendcounts[0]) memcpy(recv + rdispls[0], send + sdispls[0], (size_t)sendcounts[0] * sizeof *send);
    return MOE_OK;
  }
  MPI_TRY(MPI_Alltoallv(send, sendcounts, sdispls, MPI_INT32_T, recv, recvcounts, rdispls, MPI_INT32_T, COMM(d)),
          "Alltoallv (sizes)");
  return MOE_OK;
}

moe_status moe__dist_alltoallv_f32(const moe_dist *d, const float *send, const int *sendcounts,
                                   const int *sdispls, float *recv, const int *recvcounts,
                                   const int *rdispls) {
  if (ONE(d)) {
    if (sendcounts[0]) memcpy(recv + rdispls[0], send + sdispls[0], (size_t)sendcounts[0] * sizeof *send);
    return MOE_OK;
  }
  MPI_TRY(MPI_Alltoallv(send, sendcounts, sdispls, MPI_FLOAT, recv, recvcounts, rdispls, MPI_FLOAT, COMM(d)),
          "Alltoallv (tokens)");
  return MOE_OK;
}

int moe_dist_rank(const moe_dist *d) { return d ? d->rank : 0; }
int moe_dist_size(const moe_dist *d) { return d ? d->size : 1; }

void moe_dist_abort(const moe_dist *d, int code) {
  if (d && !ONE(d) && d->size > 1) MPI_Abort(COMM(d), code);
}
