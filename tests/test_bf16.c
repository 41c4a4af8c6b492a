/* bf16 experts beyond the fixtures (test_fixtures.c): rounding, `moe layer-run --dtype bf16` against
 * the PyTorch bf16 reference and the fp32 contract, BF16 files written and read back, the slower
 * path on CPUs without AVX512-BF16, and bad input. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare.h"
#include "internal.h"
#include "run_cli.h"
#include "test.h"

#define BF16_TOL 1e-2

static char err[4096];

static const char *case_file(const char *dir, const char *cas, const char *file, char *buf, size_t n) {
  snprintf(buf, n, "%s%s/%s/%s", test_fixture_dir(), dir, cas, file);
  return buf;
}

/* Output tensor `name` of file o against tensor `rname` of file r (either F32 or BF16), Frobenius;
 * tol < 0: returns whether they differ by more than -tol, quietly. */
static int close_norm(const moe_st *o, const char *name, const moe_st *r, const char *rname, double tol) {
  moe_tensor_view a, b;
  if (moe_st_get(o, name, &a) || moe_st_get(r, rname, &b)) {
    fprintf(stderr, "  %s\n", moe_last_error());
    return 0;
  }
  size_t n = b.nbytes / moe_dtype_size(b.dtype);
  float *x = malloc(n * 4), *y = malloc(n * 4);
  int ok = x && y && a.nbytes / moe_dtype_size(a.dtype) == n && !moe_st_view_f32(o, &a, 0, n, x) &&
           !moe_st_view_f32(r, &b, 0, n, y);
  if (ok && tol >= 0) ok = tensors_close_norm(name, x, y, n, tol);
  else if (ok) {
    double d = 0, ref = 0;
    for (size_t i = 0; i < n; i++) d += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), ref += (double)y[i] * y[i];
    ok = sqrt(d) > -tol * sqrt(ref);
  }
  free(x);
  free(y);
  return ok;
}

static int same_i32(const moe_st *o, const moe_st *r, const char *name) {
  moe_tensor_view a, b;
  return !moe_st_get(o, name, &a) && !moe_st_get(r, name, &b) && a.nbytes == b.nbytes &&
         !memcmp(a.data, b.data, a.nbytes);
}

/* The nearest bf16 to f by brute force over its two neighbours, ties to the even one. */
static uint16_t nearest_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  float flo, fhi;
  uint32_t a = (uint32_t)lo << 16, b = (uint32_t)hi << 16;
  memcpy(&flo, &a, 4);
  memcpy(&fhi, &b, 4);
  double dl = fabs((double)f - flo), dh = fabs((double)fhi - f);
  return dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
}

TEST(bf16_rounds_to_nearest_even) {
  /* ties: 1 + 2^-8 -> 1 (even), 1 + 3 2^-8 -> 1 + 2^-6 (even); -0, Inf and NaN kept */
  const float in[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f, INFINITY, -INFINITY, NAN, 3.0e38f, 1e-40f};
  const uint16_t want[] = {0x3f80, 0x3f82, 0x8000, 0x7f80, 0xff80, 0, 0x7f62, 0x0001};
  uint16_t got[8];
  moe_bf16_from_f32(got, in, 8);
  for (int i = 0; i < 8; i++) {
    if (i == 5) ASSERT((got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f)); /* still a NaN */
    else if (got[i] != want[i]) FAIL_("%g -> 0x%04x, want 0x%04x", (double)in[i], got[i], want[i]);
  }
  enum { N = 200000 }; /* long enough for the threaded path */
  float *f = malloc(N * 4), *back = malloc(N * 4);
  uint16_t *b = malloc(N * 2);
  uint64_t s = 7;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(s >> 32);
    if ((u & 0x7f800000u) == 0x7f800000u || (u & 0x7fff0000u) == 0x7f7f0000u) u ^= 0x40000000u; /* finite, no overflow */
    memcpy(&f[i], &u, 4);
  }
  moe_bf16_from_f32(b, f, N);
  moe_bf16_to_f32(back, b, N);
  int bad = 0;
  for (int i = 0; i < N && bad < 3; i++) {
    uint32_t u;
    memcpy(&u, &back[i], 4);
    if (b[i] != nearest_bf16(f[i]) || u != (uint32_t)b[i] << 16) {
      fprintf(stderr, "  %a -> 0x%04x, want 0x%04x\n", (double)f[i], b[i], nearest_bf16(f[i]));
      bad++;
    }
  }
  free(f);
  free(back);
  free(b);
  ASSERT_EQ_INT(bad, 0);
}

/* layer-run on a bf16 fixture: every output within BF16_TOL of the PyTorch bf16 reference (read back
 * from BF16 outputs too), routing exactly the reference's. */
static int layer_run_case(const char *cas, const char *extra, const char *env) {
  char w[512], x[512], ref[512], out[512], args[2048];
  case_file("/bf16", cas, "w.safetensors", w, sizeof w);
  case_file("/bf16", cas, "x.safetensors", x, sizeof x);
  case_file("/bf16", cas, "ref.safetensors", ref, sizeof ref);
  test_tmp_path("bf16_out.safetensors", out, sizeof out);
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' --backward --spec %s", w, x, out,
           extra);
  if (run_moe(env, args, NULL, err, sizeof err)) {
    fprintf(stderr, "  %s: %s\n", cas, err);
    return 0;
  }
  moe_st *o = NULL, *r = NULL;
  int ok = !moe_st_open(&o, out) && !moe_st_open(&r, ref);
  const char *names[] = {"y", "spec", "grad.x", "grad.experts.fc1.weight", "grad.experts.fc2.weight",
                         "grad.experts.fc1.bias", "grad.gate.weight"};
  for (int i = 0; ok && i < 7; i++) ok &= close_norm(o, names[i], r, names[i], BF16_TOL);
  ok = ok && same_i32(o, r, "expert_counts") && same_i32(o, r, "dropped") && same_i32(o, r, "capacity");
  moe_st_close(o);
  moe_st_close(r);
  return ok;
}

TEST(bf16_layer_run_matches_pytorch) {
  ASSERT(layer_run_case("gelu_k1_dynamic", "", NULL));
  ASSERT(layer_run_case("drops_swiglu_k2_cap075_score_static", "--threads 3", NULL));
  ASSERT(layer_run_case("xbf16_swiglu_k1_dynamic", "--out-dtype bf16", NULL)); /* BF16 in and out */
}

/* Without AVX512-BF16 (as oneDNN sees it under DNNL_MAX_CPU_ISA) bf16 runs a slower path, says so,
 * and gives the same answers: oneDNN's own on AVX-512 CPUs, widening to fp32 BLAS before them. */
TEST(bf16_without_avx512_bf16_says_so_and_agrees) {
  ASSERT(layer_run_case("relu_k2_cap1_index_static", "", "DNNL_MAX_CPU_ISA=AVX512_CORE"));
  ASSERT(strstr(err, "lacks AVX512-BF16")); /* oneDNN's slower path; widening on a CPU without AVX-512 */
  ASSERT(layer_run_case("silu_k3_dynamic", "--threads 2", "DNNL_MAX_CPU_ISA=AVX2"));
  ASSERT(strstr(err, "lacks AVX512-BF16") && strstr(err, "widened to fp32"));
}

/* --dtype bf16 on fp32 weights: the fp32 contract (DESIGN 4.1) within what bf16 rounding explains,
 * and exactly the fp32 routing. */
TEST(bf16_layer_run_follows_fp32_contract) {
  const char *cases[] = {"relu_k2_cap1_index_static", "swiglu_k3_cap1_index_dynamic", "gelu_k3_capneg_score_static"};
  for (int i = 0; i < 3; i++) {
    char w[512], x[512], ref[512], out[512], args[2048];
    case_file("", cases[i], "w.safetensors", w, sizeof w);
    case_file("", cases[i], "x.safetensors", x, sizeof x);
    case_file("", cases[i], "ref.safetensors", ref, sizeof ref);
    test_tmp_path("bf16_f32.safetensors", out, sizeof out);
    snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' --backward --dtype bf16", w, x, out);
    if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("%s: %s", cases[i], err);
    moe_st *o = NULL, *r = NULL;
    ASSERT_OK(moe_st_open(&o, out));
    ASSERT_OK(moe_st_open(&r, ref));
    int ok = close_norm(o, "y", r, "y", 1.5e-2) && close_norm(o, "grad.x", r, "grad.x", 6e-2) &&
             same_i32(o, r, "expert_counts") && same_i32(o, r, "dropped");
    /* and it really ran in bf16: not the fp32 answer to fp32 precision */
    ok = ok && close_norm(o, "y", r, "y", -1e-4);
    moe_st_close(o);
    moe_st_close(r);
    if (!ok) FAIL_("%s", cases[i]);
  }
}

static void write_raw(const char *path, const char *header, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  uint64_t len = strlen(header);
  fwrite(&len, 8, 1, f);
  fwrite(header, 1, len, f);
  fwrite(data, 1, n, f);
  fclose(f);
}

TEST(bf16_bad_input_is_named) {
  char w[512], x[512], bad[512], out[512], args[2048];
  case_file("/bf16", "gelu_k1_dynamic", "w.safetensors", w, sizeof w);
  case_file("/bf16", "gelu_k1_dynamic", "x.safetensors", x, sizeof x);
  test_tmp_path("bf16_bad_x.safetensors", bad, sizeof bad);
  test_tmp_path("bf16_never.safetensors", out, sizeof out);
  uint16_t data[48 * 12] = {0};
  /* x claims (48, 12) BF16 = 1152 bytes but holds 1150 */
  write_raw(bad, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[48,12],\"data_offsets\":[0,1150]}}", data, 1150);
  unlink(out);
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s'", w, bad, out);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "'x'") || strstr(err, "\"x\""));
  ASSERT(strstr(err, "1150") || strstr(err, "1152"));
  struct stat st;
  ASSERT(stat(out, &st) != 0);
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' --dtype f16", w, x, out);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "--dtype") && strstr(err, "f16"));
  ASSERT(stat(out, &st) != 0);
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' --out-dtype int8", w, x, out);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "--out-dtype") && strstr(err, "int8"));
  ASSERT(stat(out, &st) != 0);
}

/* One forward of a layer on fixed input. */
static void forward(moe_layer_t *l, float *y, int T) {
  float *x = malloc((size_t)T * l->cfg.D * 4);
  uint64_t s = 3;
  for (int i = 0; i < T * l->cfg.D; i++) x[i] = moe__uniform(&s);
  moe_layer_stats st;
  if (moe_layer_forward(l, x, T, y, NULL, &st)) fprintf(stderr, "  %s\n", moe_last_error());
  free(x);
}

/* A bf16 layer saved (BF16 expert matrices, "dtype" metadata) and loaded back computes the same bits;
 * a write to the parameters takes effect once announced with moe_layer_params_changed. */
TEST(bf16_layer_save_reload_and_params_changed) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16;
  c.H = 24;
  c.E = 4;
  c.act = MOE_ACT_SWIGLU;
  c.dtype = MOE_DT_BF16;
  moe_layer_t a = {0}, b = {0};
  ASSERT_OK(moe_layer_init(&a, &c));
  moe_layer_init_params(&a, 11);
  char path[512];
  test_tmp_path("bf16_layer.safetensors", path, sizeof path);
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  ASSERT_OK(moe_layer_save_params(&a, w));
  ASSERT_OK(moe_st_writer_save(w, path));
  moe_st_writer_free(w);
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, path));
  ASSERT(tensor_dtype_is(f, "experts.fc3.weight", MOE_DT_BF16) && tensor_dtype_is(f, "experts.fc1.bias", MOE_DT_F32));
  ASSERT(moe_st_meta(f, "dtype") && !strcmp(moe_st_meta(f, "dtype"), "bf16"));
  ASSERT_OK(moe_layer_load(&b, f, NULL));
  moe_st_close(f);
  ASSERT(b.cfg.dtype == MOE_DT_BF16);
  enum { T = 40 };
  float ya[T * 16], yb[T * 16];
  forward(&a, ya, T);
  forward(&b, yb, T);
  ASSERT(!memcmp(ya, yb, sizeof ya));
  float *w2 = moe_layer_param(&a, "experts.fc2.weight");
  for (int i = 0; i < 4 * 24 * 16; i++) w2[i] *= 2.0f; /* doubles fc2 and so the expert outputs, minus biases (0) */
  moe_layer_params_changed(&a);
  forward(&a, ya, T);
  for (int i = 0; i < T * 16; i++)
    if (ya[i] != 2.0f * yb[i]) FAIL_("y[%d] = %g after doubling fc2, want %g", i, (double)ya[i], 2.0 * yb[i]);
  moe_layer_free(&a);
  moe_layer_free(&b);
}
