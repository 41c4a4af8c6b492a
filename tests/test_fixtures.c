/* The layer against the PyTorch reference (dev/gen_fixtures.py, float64): every case directory
 * under tests/fixtures, forward outputs, routing counts and every gradient, at 1e-5 relative. */
#include <dirent.h>
#include <stdlib.h>

#include "compare.h"
#include "test.h"

#define RTOL 1e-5
#define ATOL 1e-7

static int get(const moe_st *f, const char *name, moe_tensor_view *v) {
  if (moe_st_get(f, name, v) != MOE_OK) {
    fprintf(stderr, "  %s\n", moe_last_error());
    return 0;
  }
  return 1;
}

static int check(const moe_st *ref, const char *name, const float *got, size_t n, const char *cas) {
  moe_tensor_view v;
  if (!get(ref, name, &v)) return 0;
  if (v.nbytes != n * 4) {
    fprintf(stderr, "  %s %s: %zu values, reference has %zu\n", cas, name, n, v.nbytes / 4);
    return 0;
  }
  char label[256];
  snprintf(label, sizeof label, "%s %s", cas, name);
  return tensors_close(label, got, v.data, n, RTOL, ATOL);
}

static int check_i32(const moe_st *ref, const char *name, const int32_t *got, int n, const char *cas) {
  moe_tensor_view v;
  if (!get(ref, name, &v)) return 0;
  const int32_t *want = v.data;
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "  %s %s[%d]: %d, reference %d\n", cas, name, i, got[i], want[i]);
      return 0;
    }
  return 1;
}

/* Runs one case directory; returns 1 if everything matches. */
static int run_case(const char *dir, const char *cas, int threads) {
  char p[512];
  moe_st *wf = NULL, *xf = NULL, *rf = NULL;
  moe_layer_t l = {0};
  int ok = 0;
  float *y = NULL, *spec = NULL, *dx = NULL;
  snprintf(p, sizeof p, "%s/%s/w.safetensors", dir, cas);
  if (moe_st_open(&wf, p)) goto done;
  snprintf(p, sizeof p, "%s/%s/x.safetensors", dir, cas);
  if (moe_st_open(&xf, p)) goto done;
  snprintf(p, sizeof p, "%s/%s/ref.safetensors", dir, cas);
  if (moe_st_open(&rf, p)) goto done;
  if (moe_layer_load(&l, wf, NULL)) goto done;
  moe_layer_set_threads(&l, threads);
  moe_tensor_view x, dy, daux, dz, dspec;
  if (!get(xf, "x", &x) || !get(xf, "dy", &dy) || !get(xf, "daux", &daux) || !get(xf, "dz", &dz) ||
      !get(xf, "dspec", &dspec))
    goto done;
  int T = (int)x.shape[0], D = l.cfg.D, k = l.cfg.top_k;
  y = malloc((size_t)T * D * 4);
  spec = malloc((size_t)T * k * D * 4);
  dx = malloc((size_t)T * D * 4);
  moe_layer_stats s;
  if (moe_layer_forward(&l, x.data, T, y, spec, &s)) goto done;
  moe_layer_zero_grad(&l);
  if (moe_layer_backward(&l, dy.data, *(const float *)daux.data, *(const float *)dz.data, dspec.data, NULL, dx))
    goto done;
  int32_t dropped = s.dropped, cap = s.capacity;
  ok = check(rf, "y", y, (size_t)T * D, cas) & check(rf, "aux_loss", &s.aux_loss, 1, cas) &
       check(rf, "z_loss", &s.z_loss, 1, cas) & check(rf, "spec", spec, (size_t)T * k * D, cas) &
       check_i32(rf, "expert_counts", s.expert_counts, l.cfg.E, cas) &
       check_i32(rf, "dropped", &dropped, 1, cas) & check_i32(rf, "capacity", &cap, 1, cas) &
       check(rf, "grad.x", dx, (size_t)T * D, cas);
  for (int i = 0; i < l.nparams; i++) {
    char name[160];
    snprintf(name, sizeof name, "grad.%s", l.info[i].name);
    ok &= check(rf, name, l.grads + l.info[i].offset, l.info[i].numel, cas);
  }
done:
  if (!ok && moe_last_error()[0]) fprintf(stderr, "  %s: %s\n", cas, moe_last_error());
  free(y);
  free(spec);
  free(dx);
  moe_layer_free(&l);
  moe_st_close(rf);
  moe_st_close(xf);
  moe_st_close(wf);
  return ok;
}

TEST(fixtures_match_pytorch) {
  const char *dir = test_fixture_dir();
  DIR *d = opendir(dir);
  if (!d) FAIL_("cannot open fixture dir %s", dir);
  int n = 0, bad = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || e->d_type != DT_DIR) continue;
    n++;
    for (int threads = 1; threads <= 3; threads += 2) /* serial, and more tiles than cores */
      if (!run_case(dir, e->d_name, threads)) {
        fprintf(stderr, "  case %s (%d threads) differs from the reference\n", e->d_name, threads);
        bad++;
      }
  }
  closedir(d);
  ASSERT(n >= 18); /* the generator writes at least 18 cases */
  ASSERT_EQ_INT(bad, 0);
}
