/* See fdcheck.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdcheck.h"

uint64_t fd_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double fd_unif(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * (double)(fd_next(s) >> 11) * 0x1.0p-53;
}

void fd_fill(uint64_t *s, float *a, size_t n, double lo, double hi) {
  for (size_t i = 0; i < n; i++) a[i] = (float)fd_unif(s, lo, hi);
}

/* Scratch for a tensor of n elements. */
static int fd_reserve(fd_check *f, size_t n) {
  if (n <= f->cap) return 1;
  float *save = realloc(f->save, n * sizeof *save);
  if (save) f->save = save;
  double *v = save ? realloc(f->v, n * sizeof *v) : NULL;
  if (v) f->v = v;
  if (!save || !v) {
    fprintf(stderr, "  [%s] out of memory\n", f->name);
    return 0;
  }
  f->cap = n;
  return 1;
}

void fd_free(fd_check *f) {
  free(f->save);
  free(f->v);
  f->save = NULL;
  f->v = NULL;
  f->cap = 0;
}

int fd_compare(fd_check *f, const char *tensor, const char *kind, long idx, double fd, double an, double lp,
               double l0, double lm) {
  double err = fabs(fd - an), tol = f->atol + f->rtol * fabs(an);
  double rel = err / (fabs(an) > 1.0 ? fabs(an) : 1.0);
  f->probes++;
  if (rel > f->worst_rel) f->worst_rel = rel;
  if (err / tol > f->worst_ratio) {
    f->worst_ratio = err / tol;
    snprintf(f->worst_at, sizeof f->worst_at, "%s %s %ld: fd %.6g an %.6g", tensor, kind, idx, fd, an);
  }
  if (err <= tol) return 1;
  /* one-sided slopes that disagree point to a kink or a routing change */
  fprintf(stderr, "  [%s] %s %s %ld: finite difference %.7g, analytic %.7g, |diff| %.3g > tol %.3g "
          "(one-sided slopes %.7g, %.7g)\n", f->name, tensor, kind, idx, fd, an, err, tol,
          (lp - l0) / f->eps, (l0 - lm) / f->eps);
  return 0;
}

int fd_probe(fd_check *f, float *p, const float *grad, size_t n, const double *dir, long idx, const char *tensor,
             double L0) {
  if (!fd_reserve(f, n)) return 0;
  const double eps = f->eps;
  const char *kind = dir ? "direction" : "element";
  char what[160];
  snprintf(what, sizeof what, "%s %s %ld", tensor, kind, idx);
  memcpy(f->save, p, n * sizeof *p);
  size_t i0 = dir ? 0 : (size_t)idx, i1 = dir ? n : (size_t)idx + 1;
  double an = 0, Lp = 0, Lm = 0;
  for (size_t i = i0; i < i1; i++) {
    double step = eps * (dir ? dir[i] : 1.0);
    float hi = (float)(f->save[i] + step), lo = (float)(f->save[i] - step);
    an += (double)grad[i] * ((double)hi - lo) / (2 * eps);
    p[i] = hi;
  }
  int ok = f->loss(f->ctx, &Lp, what);
  for (size_t i = i0; i < i1; i++) p[i] = (float)(f->save[i] - eps * (dir ? dir[i] : 1.0));
  ok = ok && f->loss(f->ctx, &Lm, what);
  memcpy(p, f->save, n * sizeof *p);
  if (!ok) return 0;
  return fd_compare(f, tensor, kind, idx, (Lp - Lm) / (2 * eps), an, Lp, L0, Lm);
}

int fd_tensor(fd_check *f, const char *tensor, float *p, const float *grad, size_t n, const int32_t *group_counts,
              int groups, uint64_t *rng, double L0) {
  double gmax = 0;
  for (size_t i = 0; i < n; i++) gmax = fabs(grad[i]) > gmax ? fabs(grad[i]) : gmax;
  if (!(gmax >= f->min_grad)) {
    fprintf(stderr, "  [%s] %s: analytic gradient is at most %g everywhere: nothing to check\n", f->name, tensor,
            gmax);
    return 0;
  }
  if (!fd_reserve(f, n)) return 0;
  double nrm = 0;
  for (size_t i = 0; i < n; i++) {
    f->v[i] = fd_unif(rng, -1, 1);
    nrm += f->v[i] * f->v[i];
  }
  nrm = sqrt(nrm);
  for (size_t i = 0; i < n; i++) f->v[i] /= nrm;
  int ok = fd_probe(f, p, grad, n, f->v, 0, tensor, L0);
  /* the candidates, in order; spread the picks over them */
  size_t per = group_counts ? n / (size_t)groups : n, m = 0;
  long *cand = malloc(n * sizeof *cand);
  if (!cand) return 0;
  for (size_t i = 0; i < n; i++)
    if (!group_counts || group_counts[i / per] > 0) cand[m++] = (long)i;
  size_t picks = m < (size_t)f->elems ? m : (size_t)f->elems;
  for (size_t j = 0; j < picks && ok; j++) {
    size_t at = (j * m + m / (2 * picks)) / picks;
    ok = fd_probe(f, p, grad, n, NULL, cand[at], tensor, L0);
  }
  free(cand);
  return ok;
}
