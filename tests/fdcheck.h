/* A small finite-difference engine for the gradient checks (test_gradcheck.c, test_model.c).
 * The caller supplies a loss callback that runs one forward at the current parameters and returns the
 * scalar; it returns 0 (after printing why) on an error or when the routing differs from the reference
 * forward, since routing is discontinuous. fd_tensor compares a tensor's analytic gradient with central
 * differences along a random unit direction over the whole tensor, then on a few single elements
 * spread over it; every comparison passes when |fd - an| <= atol + rtol * |an|. Failure messages start
 * with "  [name]" (the configuration) and name the tensor. */
#ifndef MOE_TEST_FDCHECK_H
#define MOE_TEST_FDCHECK_H

#include <stddef.h>
#include <stdint.h>

/* One forward: *L the loss; 0 on an error or a routing change (the callback says which, naming what). */
typedef int (*fd_loss_fn)(void *ctx, double *L, const char *what);

typedef struct {
  /* set by the caller */
  const char *name; /* the configuration, in every message */
  fd_loss_fn loss;
  void *ctx;        /* passed to loss */
  double eps;       /* central-difference step */
  double atol, rtol;
  double min_grad;  /* each tensor's analytic gradient must reach this somewhere */
  int elems;        /* single elements checked per tensor */
  /* bookkeeping */
  int probes;
  double worst_rel;   /* max |fd - an| / max(1, |an|) */
  double worst_ratio; /* max |fd - an| / tolerance */
  char worst_at[200];
  /* scratch, grown as needed; fd_free releases it */
  float *save;
  double *v;
  size_t cap;
} fd_check;

/* splitmix64: the stream the checks draw from (and the tests' own random data). */
uint64_t fd_next(uint64_t *s);
double fd_unif(uint64_t *s, double lo, double hi);
void fd_fill(uint64_t *s, float *a, size_t n, double lo, double hi);

/* Compares one finite difference fd with the analytic value an and records the worst error; lp, l0, lm
 * (the losses at +eps, 0, -eps) give the one-sided slopes printed on a failure. Returns 1 when close. */
int fd_compare(fd_check *f, const char *tensor, const char *kind, long idx, double fd, double an, double lp,
               double l0, double lm);

/* Central difference of the loss along p[i] +- eps * dir[i] (dir NULL: only element idx, by 1), with p
 * restored afterwards; the analytic value uses the perturbation actually stored in float. L0 is the loss
 * at the reference point. Returns 1 when it matches grad. */
int fd_probe(fd_check *f, float *p, const float *grad, size_t n, const double *dir, long idx, const char *tensor,
             double L0);

/* Both checks on one tensor: the gradient must reach min_grad somewhere, then a random unit direction
 * (drawn from rng) and up to f->elems single elements spread evenly over the candidates. With
 * group_counts, the tensor is `groups` equal consecutive slices (one per expert) and only elements of
 * slices whose count is nonzero are candidates; NULL: every element. */
int fd_tensor(fd_check *f, const char *tensor, float *p, const float *grad, size_t n, const int32_t *group_counts,
              int groups, uint64_t *rng, double L0);

void fd_free(fd_check *f);

#endif
