/* moe_dist over MPI (see dist.h), with two all-to-all algorithms for the token exchange:
 *   Linear: MPI_Alltoallv over all ranks;
 *   2DH (Tutel, appendix Algorithm 2): an intra-node all-to-all that gathers, on local rank l', every
 *   chunk bound for a rank with local index l', then an inter-node all-to-all among the ranks with
 *   local index l'. The printed StrideMemcpy index is not a permutation when ranks per node differ
 *   from the node count (DESIGN 3b); the reorder here is the block transpose written out: chunks are
 *   packed (destination local index, destination node) for phase 1 and (destination node, source
 *   local index) for phase 2, which lands them in source-rank order.
 * Not under an MPI launcher, a moe_dist is one process and MPI is never initialized. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "dist.h"

typedef struct {
  MPI_Comm world, node, cross; /* node: ranks of my node; cross: ranks with my local index */
  int G, N;                    /* ranks per node, nodes (2DH) */
  moe_a2a algo;
  float *buf;                  /* 2DH staging, grown when needed */
  size_t cap;
  int *cnt;                    /* 2DH counts: (8 W) */
  MPI_Datatype row;            /* a row of row_width floats: the unit of the token exchange's counts */
  int row_width;               /* 0: none made yet */
} mpi_state;

#define ST(d) ((mpi_state *)(d)->comm)
#define ONE(d) ((d)->comm == NULL) /* one process without MPI: collectives are copies */
#define MPI_TRY(call, what)                                                                 \
  do {                                                                                      \
    int rc_ = (call);                                                                       \
    MOE_TRY(rc_ == MPI_SUCCESS, MOE_ERR_IO, "MPI %s failed on rank %d (error %d)", what,  \
            d->rank, rc_);                                                                  \
  } while (0)

int moe_dist_has_mpi(void) { return 1; }

/* Started by an MPI launcher (Open MPI's mpirun, or a PMI/PMIx one such as srun)? */
static int launched(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"); }

moe_status moe_dist_init(moe_dist **out, int *argc, char ***argv) {
  moe_dist *d = calloc(1, sizeof *d);
  MOE_TRY(d, MOE_ERR_NOMEM, "moe_dist_init: out of memory");
  d->size = 1;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && !launched()) { /* not under mpirun: one process, and MPI stays uninitialized */
    *out = d;
    return MOE_OK;
  }
  mpi_state *m = calloc(1, sizeof *m);
  int level = MPI_THREAD_SINGLE; /* SERIALIZED lets the communication thread make the exchanges */
  if (!m || (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &level) != MPI_SUCCESS)) {
    free(m);
    free(d);
    MOE_TRY(0, m ? MOE_ERR_IO : MOE_ERR_NOMEM, "moe_dist_init: %s", m ? "MPI_Init failed" : "out of memory");
  }
  d->owns_mpi = !inited;
  if (inited) MPI_Query_thread(&level);
  d->thread_ok = level >= MPI_THREAD_SERIALIZED;
  m->world = MPI_COMM_WORLD;
  m->node = m->cross = MPI_COMM_NULL;
  d->comm = m;
  MPI_Comm_rank(m->world, &d->rank);
  MPI_Comm_size(m->world, &d->size);
  *out = d;
  return MOE_OK;
}

static void free_grid(mpi_state *m) {
  if (m->node != MPI_COMM_NULL) MPI_Comm_free(&m->node);
  if (m->cross != MPI_COMM_NULL) MPI_Comm_free(&m->cross);
  m->node = m->cross = MPI_COMM_NULL;
}

void moe_dist_finalize(moe_dist *d) {
  if (!d) return;
  if (d->stream_free) d->stream_free(d); /* its thread may still make MPI calls */
  if (!ONE(d)) {
    mpi_state *m = ST(d);
    free_grid(m);
    if (m->row_width) MPI_Type_free(&m->row);
    free(m->buf);
    free(m->cnt);
    free(m);
    if (d->owns_mpi) MPI_Finalize();
  }
  free(d);
}

moe_status moe_dist_set_a2a(moe_dist *d, moe_a2a algo, int ranks_per_node) {
  MOE_TRY((unsigned)algo <= MOE_A2A_2DH, MOE_ERR_ARG, "unknown all-to-all algorithm %d", algo);
  MOE_TRY(ranks_per_node >= 0, MOE_ERR_ARG, "ranks per node must be >= 0, got %d", ranks_per_node);
  if (ONE(d)) return MOE_OK;
  mpi_state *m = ST(d);
  free_grid(m);
  m->algo = MOE_A2A_LINEAR; /* until 2DH is fully set up */
  if (algo == MOE_A2A_LINEAR) return MOE_OK;
  int G = ranks_per_node;
  if (!G) { /* the real nodes: ranks sharing memory, which must be consecutive and equal in number */
    MPI_Comm shared;
    MPI_TRY(MPI_Comm_split_type(m->world, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &shared), "Comm_split_type");
    MPI_Comm_size(shared, &G);
    MPI_Comm_free(&shared);
  }
  MOE_TRY(d->size % G == 0, MOE_ERR_ARG, "2DH all-to-all: %d ranks do not split into nodes of %d", d->size, G);
  m->G = G;
  m->N = d->size / G;
  MPI_TRY(MPI_Comm_split(m->world, d->rank / G, d->rank % G, &m->node), "Comm_split (node)");
  MPI_TRY(MPI_Comm_split(m->world, d->rank % G, d->rank / G, &m->cross), "Comm_split (cross)");
  free(m->cnt);
  m->cnt = malloc(sizeof(int) * 8 * (size_t)d->size);
  MOE_TRY(m->cnt, MOE_ERR_NOMEM, "2DH all-to-all: out of memory");
  m->algo = MOE_A2A_2DH;
  return MOE_OK;
}

moe_status moe_dist_allreduce(const moe_dist *d, double *a, int n) {
  if (ONE(d)) return MOE_OK;
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_DOUBLE, MPI_SUM, ST(d)->world), "Allreduce");
  return MOE_OK;
}

moe_status moe__dist_allreduce_f32(const moe_dist *d, float *a, int n) {
  if (ONE(d)) return MOE_OK;
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, MPI_SUM, ST(d)->world), "Allreduce");
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
  int rc = MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, ST(d)->world);
  if (rc == MPI_SUCCESS && counts) {
    displs[0] = 0;
    for (int i = 1; i < d->size; i++) displs[i] = displs[i - 1] + counts[i - 1];
  }
  if (rc == MPI_SUCCESS) rc = MPI_Gatherv(a, n, MPI_FLOAT, out, counts, displs, MPI_FLOAT, 0, ST(d)->world);
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
  MPI_TRY(MPI_Alltoallv(send, sendcounts, sdispls, MPI_INT32_T, recv, recvcounts, rdispls, MPI_INT32_T,
                        ST(d)->world), "Alltoallv (sizes)");
  return MOE_OK;
}

/* Completes a nonblocking collective for the communication thread. Open MPI's blocking wait spins on
 * a core; polling with short sleeps leaves the cores to the experts' GEMMs while the kernel's socket
 * buffers keep the link busy between polls. */
static int wait_polled(MPI_Request *r) {
  const struct timespec nap = {0, 50000}; /* 50 us */
  for (;;) {
    int done = 0, rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    nanosleep(&nap, NULL);
  }
}

/* MPI_Alltoall of ints and MPI_Alltoallv of floats, blocking or (polled) for the communication thread. */
static int a2a_int(int polled, const int *send, int n, int *recv, MPI_Comm c) {
  if (!polled) return MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, c);
  MPI_Request r;
  int rc = MPI_Ialltoall(send, n, MPI_INT, recv, n, MPI_INT, c, &r);
  return rc != MPI_SUCCESS ? rc : wait_polled(&r);
}

static int a2av_rows(int polled, const float *send, const int *sc, const int *sd, float *recv, const int *rc,
                     const int *rd, MPI_Datatype row, MPI_Comm c) {
  if (!polled) return MPI_Alltoallv(send, sc, sd, row, recv, rc, rd, row, c);
  MPI_Request r;
  int e = MPI_Ialltoallv(send, sc, sd, row, recv, rc, rd, row, c, &r);
  return e != MPI_SUCCESS ? e : wait_polled(&r);
}

/* The datatype of a row of `width` floats: the last one made is kept (a layer's rows are D wide). Made
 * only on the caller's thread while no exchange is in flight, or on the communication thread. */
static MPI_Datatype row_type(mpi_state *m, int width) {
  if (m->row_width != width) {
    if (m->row_width) MPI_Type_free(&m->row);
    MPI_Type_contiguous(width, MPI_FLOAT, &m->row);
    MPI_Type_commit(&m->row);
    m->row_width = width;
  }
  return m->row;
}

static moe_status grow(const moe_dist *d, size_t n) {
  mpi_state *m = ST(d);
  if (n <= m->cap) return MOE_OK;
  float *b = realloc(m->buf, n * sizeof *b);
  MOE_TRY(b, MOE_ERR_NOMEM, "2DH all-to-all: cannot allocate %zu floats of staging", n);
  m->buf = b;
  m->cap = n;
  return MOE_OK;
}

/* 2DH: phase 1 inside the node, phase 2 across nodes, straight into recv when each node's sources
 * sit together there in rank order (rdispls of the whole batch), else through staging and then to
 * each source's rdispl (a micro-batch's rows, with other micro-batches' rows between them). */
static moe_status alltoallv_2dh(const moe_dist *d, const float *send, const int *sc, const int *sd, float *recv,
                                const int *rc, const int *rd, int width, int polled) {
  mpi_state *m = ST(d);
  int W = d->size, G = m->G, N = m->N;
  size_t w = (size_t)width; /* counts and displacements are in rows of w floats */
  int *c1s = m->cnt, *c1r = c1s + W;              /* (G, N) chunk sizes sent / received in phase 1 */
  int *s1 = c1r + W, *d1 = s1 + G, *r1 = d1 + G, *e1 = r1 + G; /* phase 1 per local peer */
  int *s2 = e1 + G, *d2 = s2 + N, *r2 = d2 + N, *e2 = r2 + N;  /* phase 2 per node */
  size_t total = 0, total1 = 0;
  for (int q = 0; q < W; q++) total += (size_t)sc[q];
  for (int l = 0; l < G; l++)
    for (int n = 0; n < N; n++) c1s[l * N + n] = sc[n * G + l]; /* to (node n, local l) */
  MPI_TRY(a2a_int(polled, c1s, N, c1r, m->node), "Alltoall (2DH sizes)");
  for (int l = 0; l < G; l++) {
    s1[l] = r1[l] = 0;
    for (int n = 0; n < N; n++) {
      s1[l] += c1s[l * N + n];
      r1[l] += c1r[l * N + n];
    }
    d1[l] = l ? d1[l - 1] + s1[l - 1] : 0;
    e1[l] = l ? e1[l - 1] + r1[l - 1] : 0;
    total1 += (size_t)r1[l];
  }
  int together = 1;
  size_t totalr = 0;
  for (int q = 0; q < W; q++) {
    together &= q % G == 0 || rd[q] == rd[q - 1] + rc[q - 1];
    totalr += (size_t)rc[q];
  }
  MOE_CHECK(grow(d, (total + 2 * total1 + (together ? 0 : totalr)) * w));
  float *p1 = m->buf, *q1 = p1 + total * w, *p2 = q1 + total1 * w, *p3 = p2 + total1 * w;
  size_t o = 0; /* pack by (destination local index, destination node) */
  for (int l = 0; l < G; l++)
    for (int n = 0; n < N; n++) {
      memcpy(p1 + o * w, send + (size_t)sd[n * G + l] * w, (size_t)sc[n * G + l] * w * sizeof *send);
      o += (size_t)sc[n * G + l];
    }
  MPI_TRY(a2av_rows(polled, p1, s1, d1, q1, r1, e1, row_type(m, width), m->node), "Alltoallv (2DH intra-node)");
  /* q1 holds, per source local l, the chunks for (node n, local me), n = 0..N-1: repack by node */
  o = 0;
  for (int n = 0; n < N; n++) {
    s2[n] = 0;
    for (int l = 0; l < G; l++) {
      size_t at = (size_t)e1[l];
      for (int i = 0; i < n; i++) at += (size_t)c1r[l * N + i];
      memcpy(p2 + o * w, q1 + at * w, (size_t)c1r[l * N + n] * w * sizeof *q1);
      o += (size_t)c1r[l * N + n];
      s2[n] += c1r[l * N + n];
    }
    d2[n] = n ? d2[n - 1] + s2[n - 1] : 0;
    r2[n] = 0;
    for (int l = 0; l < G; l++) r2[n] += rc[n * G + l]; /* from sources (node n, local l) */
    e2[n] = together ? rd[n * G] : n ? e2[n - 1] + r2[n - 1] : 0;
  }
  MPI_TRY(a2av_rows(polled, p2, s2, d2, together ? recv : p3, r2, e2, row_type(m, width), m->cross),
          "Alltoallv (2DH inter-node)");
  size_t at = 0;
  for (int q = 0; !together && q < W; at += (size_t)rc[q++])
    memcpy(recv + (size_t)rd[q] * w, p3 + at * w, (size_t)rc[q] * w * sizeof *recv);
  return MOE_OK;
}

static moe_status alltoallv_rows(const moe_dist *d, const float *send, const int *sendcounts, const int *sdispls,
                                 float *recv, const int *recvcounts, const int *rdispls, int width, int polled) {
  if (ONE(d)) {
    size_t w = (size_t)width;
    if (sendcounts[0]) memcpy(recv + rdispls[0] * w, send + sdispls[0] * w, (size_t)sendcounts[0] * w * sizeof *send);
    return MOE_OK;
  }
  if (ST(d)->algo == MOE_A2A_2DH)
    return alltoallv_2dh(d, send, sendcounts, sdispls, recv, recvcounts, rdispls, width, polled);
  MPI_TRY(a2av_rows(polled, send, sendcounts, sdispls, recv, recvcounts, rdispls, row_type(ST(d), width),
                    ST(d)->world), "Alltoallv (tokens)");
  return MOE_OK;
}

moe_status moe__dist_alltoallv_rows(const moe_dist *d, const float *send, const int *sendcounts,
                                    const int *sdispls, float *recv, const int *recvcounts,
                                    const int *rdispls, int width) {
  return alltoallv_rows(d, send, sendcounts, sdispls, recv, recvcounts, rdispls, width, 0);
}

moe_status moe__dist_alltoallv_rows_polled(const moe_dist *d, const float *send, const int *sendcounts,
                                           const int *sdispls, float *recv, const int *recvcounts,
                                           const int *rdispls, int width) {
  return alltoallv_rows(d, send, sendcounts, sdispls, recv, recvcounts, rdispls, width, 1);
}

moe_status moe__dist_reduce_scatter_f32(const moe_dist *d, const float *send, float *recv, const int *counts) {
  if (ONE(d)) {
    if (counts[0]) memcpy(recv, send, (size_t)counts[0] * sizeof *send);
    return MOE_OK;
  }
  MPI_TRY(MPI_Reduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, ST(d)->world), "Reduce_scatter");
  return MOE_OK;
}

moe_status moe__dist_allgather_f32(const moe_dist *d, const float *send, float *recv, const int *counts) {
  if (ONE(d)) {
    if (counts[0]) memcpy(recv, send, (size_t)counts[0] * sizeof *send);
    return MOE_OK;
  }
  int *displs = malloc(sizeof(int) * (size_t)d->size);
  MOE_TRY(displs, MOE_ERR_NOMEM, "out of memory for %d displacements", d->size);
  for (int r = 0, o = 0; r < d->size; o += counts[r++]) displs[r] = o;
  int rc = MPI_Allgatherv(send, counts[d->rank], MPI_FLOAT, recv, counts, displs, MPI_FLOAT, ST(d)->world);
  free(displs);
  MPI_TRY(rc, "Allgatherv");
  return MOE_OK;
}

void moe_dist_abort(const moe_dist *d, int code) {
  if (!d || ONE(d)) return;
  fprintf(stderr, "moe: rank %d of %d failed (exit %d); stopping every rank\n", d->rank, d->size, code);
  MPI_Abort(ST(d)->world, code);
}

int moe_dist_rank(const moe_dist *d) { return d ? d->rank : 0; }
int moe_dist_size(const moe_dist *d) { return d ? d->size : 1; }

int moe__dist_a2a_grid(const moe_dist *d, int *nodes, moe_a2a *now) {
  int G = !d || ONE(d) || ST(d)->node == MPI_COMM_NULL ? 0 : ST(d)->G;
  *nodes = G ? ST(d)->N : 0;
  *now = !d || ONE(d) ? MOE_A2A_LINEAR : ST(d)->algo;
  return G;
}

moe_status moe__dist_a2a_use(const moe_dist *d, moe_a2a algo) {
  int nodes;
  moe_a2a now;
  MOE_TRY(algo == MOE_A2A_LINEAR || moe__dist_a2a_grid(d, &nodes, &now), MOE_ERR_STATE,
          "2DH all-to-all: no grid of nodes (moe_dist_set_a2a with 2DH makes it)");
  if (d && !ONE(d)) ST(d)->algo = algo;
  return MOE_OK;
}

struct moe__dist_group {
  MPI_Comm comm; /* MPI_COMM_NULL for one process without MPI: the sum is the rank's own */
  int rank;      /* in d, for messages */
};

moe_status moe__dist_group_split(const moe_dist *d, int member, moe__dist_group **out) {
  MPI_Comm c = MPI_COMM_NULL;
  *out = NULL;
  if (!ONE(d)) MPI_TRY(MPI_Comm_split(ST(d)->world, member ? 0 : MPI_UNDEFINED, d->rank, &c), "Comm_split");
  if (!member) return MOE_OK;
  *out = malloc(sizeof **out);
  if (!*out && c != MPI_COMM_NULL) MPI_Comm_free(&c);
  MOE_TRY(*out, MOE_ERR_NOMEM, "rank %d: a communicator of a rank group: out of memory", d->rank);
  **out = (moe__dist_group){c, d->rank};
  return MOE_OK;
}

moe_status moe__dist_group_allreduce_f32(moe__dist_group *g, float *a, int n) {
  if (g->comm == MPI_COMM_NULL) return MOE_OK;
  int rc = MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, MPI_SUM, g->comm);
  MOE_TRY(rc == MPI_SUCCESS, MOE_ERR_IO, "MPI Allreduce over a rank group failed on rank %d (error %d)", g->rank, rc);
  return MOE_OK;
}

void moe__dist_group_free(moe__dist_group *g) {
  if (g && g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
  free(g);
}
