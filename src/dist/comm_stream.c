/* The communication stream (see comm_stream.h): a ring of posted exchanges and the thread that runs
 * them. A failure is sticky: the exchanges after it would pair with nothing on the other ranks, so
 * every later wait reports the first failure and its message. */
#include "dist/comm_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/worker.h"

#define RING 256 /* a layer has at most one exchange in and its n <= 64 way-back exchanges in flight */

typedef struct {
  const float *send;
  float *recv;
  int *counts; /* (4 W): send counts, send displacements, receive counts, receive displacements */
  int width;   /* floats per row, the counts' unit */
} job;

struct moe__stream {
  moe__worker w;
  const moe_dist *d;
  job ring[RING];
  uint64_t posted, done; /* exchanges posted and finished so far, under w.mu */
  moe_status failed;     /* the first failure, and its message */
  char why[512];
};

static void *run(void *arg) {
  struct moe__stream *s = arg;
  int W = s->d->size;
  pthread_mutex_lock(&s->w.mu);
  for (;;) {
    while (!s->w.stop && s->done == s->posted) pthread_cond_wait(&s->w.cv, &s->w.mu);
    if (s->done == s->posted) break; /* stopped, and nothing left */
    job *j = &s->ring[s->done % RING];
    int skip = s->failed != MOE_OK;
    pthread_mutex_unlock(&s->w.mu);
    moe_status st = skip ? MOE_OK
                         : moe__dist_alltoallv_rows_polled(s->d, j->send, j->counts, j->counts + W, j->recv,
                                                           j->counts + 2 * W, j->counts + 3 * W, j->width);
    pthread_mutex_lock(&s->w.mu);
    if (st != MOE_OK && s->failed == MOE_OK) {
      s->failed = st;
      snprintf(s->why, sizeof s->why, "%s", moe_last_error());
    }
    s->done++;
    pthread_cond_broadcast(&s->w.cv);
  }
  pthread_mutex_unlock(&s->w.mu);
  return NULL;
}

/* The stream of d, started on first use; NULL when exchanges run on the caller's thread. */
static moe_status stream_of(const moe_dist *d, struct moe__stream **out) {
  *out = NULL;
  if (!d || !d->thread_ok || d->size < 2) return MOE_OK;
  moe_dist *m = (moe_dist *)d; /* the stream is a cache of d's, started lazily behind its const */
  if (!m->stream) {
    struct moe__stream *s = calloc(1, sizeof *s);
    int *counts = calloc((size_t)RING * 4 * (size_t)d->size, sizeof *counts);
    if (s && counts) {
      for (int i = 0; i < RING; i++) s->ring[i].counts = counts + (size_t)i * 4 * d->size;
      s->d = d;
    }
    if (!s || !counts || !moe__worker_start(&s->w, run, s)) {
      free(counts);
      free(s);
      MOE_TRY(0, MOE_ERR_NOMEM, "communication thread: cannot start it (out of memory or threads)");
    }
    m->stream = s;
    m->stream_free = moe__stream_free;
  }
  *out = m->stream;
  return MOE_OK;
}

/* buf, or NULL when counts (W) are all 0: Open MPI's nonblocking all-to-all-v takes send == recv for
 * MPI_IN_PLACE (and then sends the receive counts), and an empty buffer from an arena shares its
 * address with the next one. */
static void *moved(void *buf, const int *counts, int W) {
  for (int q = 0; q < W; q++)
    if (counts[q]) return buf;
  return NULL;
}

moe_status moe__stream_alltoallv_rows(const moe_dist *d, const float *send, const int *counts, float *recv,
                                      int width, moe__ticket *t) {
  struct moe__stream *s;
  *t = 0;
  MOE_CHECK(stream_of(d, &s));
  int W = moe_dist_size(d);
  send = moved((void *)send, counts, W);
  recv = moved(recv, counts + 2 * W, W);
  if (!s) return moe__dist_alltoallv_rows(d, send, counts, counts + W, recv, counts + 2 * W, counts + 3 * W, width);
  pthread_mutex_lock(&s->w.mu);
  while (s->posted - s->done >= RING) pthread_cond_wait(&s->w.cv, &s->w.mu);
  job *j = &s->ring[s->posted % RING];
  j->send = send;
  j->recv = recv;
  j->width = width;
  memcpy(j->counts, counts, sizeof(int) * 4 * (size_t)W);
  *t = ++s->posted;
  pthread_cond_broadcast(&s->w.cv);
  pthread_mutex_unlock(&s->w.mu);
  return MOE_OK;
}

moe_status moe__stream_wait(const moe_dist *d, moe__ticket t) {
  struct moe__stream *s = d ? d->stream : NULL;
  if (!s || !t) return MOE_OK;
  pthread_mutex_lock(&s->w.mu);
  while (s->done < t) pthread_cond_wait(&s->w.cv, &s->w.mu);
  moe_status st = s->failed;
  pthread_mutex_unlock(&s->w.mu);
  MOE_TRY(st == MOE_OK, st, "%s", s->why);
  return MOE_OK;
}

moe_status moe__stream_wait_timed(const moe_dist *d, moe__ticket t, double *seconds) {
  double t0 = moe__now();
  moe_status st = moe__stream_wait(d, t);
  *seconds += moe__now() - t0;
  return st;
}

void moe__stream_free(moe_dist *d) {
  if (!d || !d->stream) return;
  moe__worker_stop(&d->stream->w); /* the thread finishes what was posted first */
  free(d->stream->ring[0].counts);
  free(d->stream);
  d->stream = NULL;
}
