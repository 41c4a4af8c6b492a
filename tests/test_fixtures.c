/* The layer against the PyTorch references: every case directory under tests/fixtures (fp32,
 * dev/gen_fixtures.py: forward outputs, routing counts and every gradient at 1e-5 relative) and under
 * tests/fixtures/bf16 (bf16 experts, dev/gen_bf16_fixtures.py: every tensor within 1e-2 of its
 * Frobenius norm, and within what bf16 rounding explains of the fp32 layer: y 1.5e-2, grad.x 6e-2;
 * routing exactly as fp32). */
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "compare.h"
#include "test.h"

#define RTOL 1e-5
#define ATOL 1e-7
#define BF16_TOL 1e-2
#define BF16_FP32_Y 1.5e-2
#define BF16_FP32_DX 6e-2

typedef struct {
  int bf16;           /* compare as a bf16 case */
  const char *dir;
  const char *cas;
} fixture;

static int check(const moe_st *ref, const char *name, const float *got, size_t n, const fixture *fx, double tol) {
  float *want = malloc(n * 4 + 4);
  int ok = want && moe_st_get_f32(ref, name, want, n) == MOE_OK;
  if (!ok) fprintf(stderr, "  %s %s: %s\n", fx->cas, name, moe_last_error());
  char label[256];
  snprintf(label, sizeof label, "%s %s", fx->cas, name);
  if (ok) ok = tol > 0 ? tensors_close_norm(label, got, want, n, tol) : tensors_close(label, got, want, n, RTOL, ATOL);
  free(want);
  return ok;
}

static int check_i32(const moe_st *ref, const char *name, const int32_t *got, int n, const char *cas) {
  moe_tensor_view v;
  if (moe_st_get(ref, name, &v) != MOE_OK) {
    fprintf(stderr, "  %s\n", moe_last_error());
    return 0;
  }
  const int32_t *want = v.data;
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "  %s %s[%d]: %d, reference %d\n", cas, name, i, got[i], want[i]);
      return 0;
    }
  return 1;
}

/* An input tensor (F32 or BF16) as float32, allocated. */
static float *input(const moe_st *f, const char *name, size_t *n) {
  moe_tensor_view v;
  if (moe_st_get(f, name, &v) != MOE_OK) return NULL;
  *n = v.nbytes / moe_dtype_size(v.dtype);
  float *a = malloc(*n * 4 + 4);
  if (a && moe_st_view_f32(f, &v, 0, *n, a) != MOE_OK) {
    free(a);
    return NULL;
  }
  return a;
}

/* Runs one case directory; returns 1 if everything matches. */
static int run_case(const fixture *fx, int threads) {
  char p[512];
  moe_st *wf = NULL, *xf = NULL, *rf = NULL;
  moe_layer_t l = {0};
  int ok = 0;
  float *x = NULL, *dy = NULL, *dspec = NULL, *daux = NULL, *dz = NULL, *y = NULL, *spec = NULL, *dx = NULL;
  size_t nx, ndy, nspec, n1;
  const char *cas = fx->cas;
  double tol = fx->bf16 ? BF16_TOL : 0; /* 0: elementwise at RTOL */
  snprintf(p, sizeof p, "%s/%s/w.safetensors", fx->dir, cas);
  if (moe_st_open(&wf, p)) goto done;
  snprintf(p, sizeof p, "%s/%s/x.safetensors", fx->dir, cas);
  if (moe_st_open(&xf, p)) goto done;
  snprintf(p, sizeof p, "%s/%s/ref.safetensors", fx->dir, cas);
  if (moe_st_open(&rf, p)) goto done;
  if (moe_layer_load(&l, wf, NULL)) goto done;
  if ((l.cfg.dtype == MOE_DT_BF16) != fx->bf16) {
    fprintf(stderr, "  %s: metadata dtype %s\n", cas, moe_compute_dtype_name(l.cfg.dtype));
    goto done;
  }
  moe_layer_set_threads(&l, threads);
  x = input(xf, "x", &nx);
  dy = input(xf, "dy", &ndy);
  dspec = input(xf, "dspec", &nspec);
  daux = input(xf, "daux", &n1);
  dz = input(xf, "dz", &n1);
  if (!x || !dy || !dspec || !daux || !dz) goto done;
  int T = (int)(nx / (size_t)l.cfg.D), D = l.cfg.D, k = l.cfg.top_k;
  y = malloc((size_t)T * D * 4);
  spec = malloc((size_t)T * k * D * 4);
  dx = malloc((size_t)T * D * 4);
  moe_layer_stats s;
  if (moe_layer_forward(&l, x, T, y, spec, &s)) goto done;
  moe_layer_zero_grad(&l);
  if (moe_layer_backward(&l, dy, *daux, *dz, dspec, NULL, dx)) goto done;
  int32_t dropped = s.dropped, cap = s.capacity;
  /* the router is fp32 in both modes */
  ok = check(rf, "y", y, (size_t)T * D, fx, tol) & check(rf, "aux_loss", &s.aux_loss, 1, fx, 0) &
       check(rf, "z_loss", &s.z_loss, 1, fx, 0) & check(rf, "spec", spec, (size_t)T * k * D, fx, tol) &
       check_i32(rf, "expert_counts", s.expert_counts, l.cfg.E, cas) &
       check_i32(rf, "dropped", &dropped, 1, cas) & check_i32(rf, "capacity", &cap, 1, cas) &
       check(rf, "grad.x", dx, (size_t)T * D, fx, tol);
  if (moe_st_has(rf, "seq_aux_loss")) /* DeepSeek-V3's sequence-wise balance loss; its gradient is in grad.* */
    ok &= check(rf, "seq_aux_loss", &s.seq_aux_loss, 1, fx, 0);
  for (int i = 0; i < l.nparams; i++) {
    char name[160];
    snprintf(name, sizeof name, "grad.%s", l.info[i].name);
    int router = !strncmp(l.info[i].name, "gate.", 5);
    ok &= check(rf, name, l.grads + l.info[i].offset, l.info[i].numel, fx, router ? 0 : tol);
  }
  if (fx->bf16)
    ok &= check(rf, "fp32.y", y, (size_t)T * D, fx, BF16_FP32_Y) &
          check(rf, "fp32.grad.x", dx, (size_t)T * D, fx, BF16_FP32_DX);
done:
  if (!ok && moe_last_error()[0]) fprintf(stderr, "  %s: %s\n", cas, moe_last_error());
  free(x);
  free(dy);
  free(dspec);
  free(daux);
  free(dz);
  free(y);
  free(spec);
  free(dx);
  moe_layer_free(&l);
  moe_st_close(rf);
  moe_st_close(xf);
  moe_st_close(wf);
  return ok;
}

/* Every case directory under dir (those with a w.safetensors: not bf16/, nor the language models' lm/);
 * returns the number that failed. */
static int run_all(const char *dir, int bf16, int *n) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "  cannot open fixture dir %s\n", dir);
    return 1;
  }
  int bad = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char w[1024];
    snprintf(w, sizeof w, "%s/%s/w.safetensors", dir, e->d_name);
    if (e->d_name[0] == '.' || e->d_type != DT_DIR || access(w, R_OK)) /* a layer case has its weights */
      continue;
    (*n)++;
    fixture fx = {bf16, dir, e->d_name};
    for (int threads = 1; threads <= 3; threads += 2) /* serial, and more tiles than cores */
      if (!run_case(&fx, threads)) {
        fprintf(stderr, "  case %s (%d threads) differs from the reference\n", e->d_name, threads);
        bad++;
      }
  }
  closedir(d);
  return bad;
}

TEST(fixtures_match_pytorch) {
  int n = 0;
  ASSERT_EQ_INT(run_all(test_fixture_dir(), 0, &n), 0);
  ASSERT(n >= 20); /* the generator writes at least 20 cases */
}

TEST(fixtures_bf16_match_pytorch) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/bf16", test_fixture_dir());
  int n = 0;
  ASSERT_EQ_INT(run_all(dir, 1, &n), 0);
  ASSERT(n >= 8); /* the generator writes 8 cases */
}
