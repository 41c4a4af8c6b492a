/* The library's view of the ranks (internal): a communicator and the collectives that expert
 * parallelism needs. dist_mpi.c implements it over MPI; dist_none.c is the one-process stub, whose
 * collectives are copies, so callers are the same code either way. */
#ifndef MOE_DIST_H
#define MOE_DIST_H

#include "internal.h"

struct moe_dist {
  int rank, size;
  int owns_mpi;  /* this moe_dist called MPI_Init */
  int thread_ok; /* MPI lets a second thread make the calls (MPI_THREAD_SERIALIZED): the stream may run */
  void *comm;    /* the MPI state (dist_mpi.c), NULL for one process without MPI */
  struct moe__stream *stream; /* the communication thread (comm_stream.c), started on first use */
  void (*stream_free)(struct moe_dist *d); /* stops and frees it (set with it: the ranks' code names no stream) */
};

/* Each rank sends sendcounts[q] ints to rank q (contiguous, in rank order) and receives
 * recvcounts[s] from rank s. Counts and displacements in elements. */
moe_status moe__dist_alltoallv_i32(const moe_dist *d, const int32_t *send, const int *sendcounts,
                                   const int *sdispls, int32_t *recv, const int *recvcounts,
                                   const int *rdispls);
/* The token exchange: counts and displacements in rows of `width` floats (one MPI datatype of a row,
 * so that no count in floats can overflow an int). */
moe_status moe__dist_alltoallv_rows(const moe_dist *d, const float *send, const int *sendcounts,
                                    const int *sdispls, float *recv, const int *recvcounts,
                                    const int *rdispls, int width);
/* The same exchange made from the communication thread: it sleeps between progress polls where a
 * blocking MPI call would spin, so that the experts' GEMMs keep the cores while it waits. */
moe_status moe__dist_alltoallv_rows_polled(const moe_dist *d, const float *send, const int *sendcounts,
                                           const int *sdispls, float *recv, const int *recvcounts,
                                           const int *rdispls, int width);
/* Static dispatch's exchanges of (E, C, D) buffers whose block r (counts[r] floats, in rank order)
 * holds rank r's experts: rank r gets the sum over ranks of their block r; and every rank gets the
 * concatenation of every rank's block (rank r sends counts[r] floats). */
moe_status moe__dist_reduce_scatter_f32(const moe_dist *d, const float *send, float *recv, const int *counts);
moe_status moe__dist_allgather_f32(const moe_dist *d, const float *send, float *recv, const int *counts);
/* In-place sum of n floats over ranks. */
moe_status moe__dist_allreduce_f32(const moe_dist *d, float *a, int n);

/* Tutel's dictionary switches the token exchange's algorithm per step (adapt/layer_setup.c): the 2DH
 * grid moe_dist_set_a2a(2DH) made, its ranks per node and nodes (0 when there is none) and the algorithm
 * in use, and a switch between Linear and 2DH that keeps the grid (2DH needs one). Local: no exchange. */
int moe__dist_a2a_grid(const moe_dist *d, int *nodes, moe_a2a *now);
moe_status moe__dist_a2a_use(const moe_dist *d, moe_a2a algo);

/* A sub-communicator of d's ranks (FlexMoE's replica groups, src/flex/grads.c): every rank of d calls
 * moe__dist_group_split at the same point (a collective over d), member nonzero on the ranks that join;
 * *out is the group, its ranks in d's order, on members and NULL on the others. The all-reduce is a
 * collective over the group's ranks only. Free every group before d (NULL is fine). */
typedef struct moe__dist_group moe__dist_group;
moe_status moe__dist_group_split(const moe_dist *d, int member, moe__dist_group **out);
moe_status moe__dist_group_allreduce_f32(moe__dist_group *g, float *a, int n);
void moe__dist_group_free(moe__dist_group *g);

#endif
