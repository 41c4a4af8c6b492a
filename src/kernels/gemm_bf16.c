/* bf16 GEMMs (fp32 accumulation and output) through oneDNN's matmul. One primitive per
 * (op(A), op(B), beta) with every dimension and stride given at run time, so a handful of primitives
 * serve all expert sizes: oneDNN then picks its JIT GEMM, which uses AVX512-BF16 where the CPU has
 * it, and measured faster here than per-shape brgemm primitives (DESIGN 3b shapes). Called from
 * inside the tiled grouped GEMM's OpenMP region, one tile per call and thread. Where oneDNN has no
 * bf16 matmul for this CPU (before AVX-512), the operands are widened to fp32 and go to fp32 BLAS:
 * the same products (bf16 x bf16 is exact in fp32), slower. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/gemm.h"
#include "internal.h"

static dnnl_engine_t engine;
static dnnl_primitive_t prims[2][2][2]; /* [ta][tb][beta != 0] */
static size_t scratch[2][2][2];         /* their scratchpad bytes (0 for the JIT GEMM of oneDNN 2.6) */
static int native, widen; /* widen: no oneDNN bf16 matmul here, the fp32 BLAS path */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A (rows, cols) matrix descriptor; `trans`: stored transposed (column-major), with leading dimension ld. */
static dnnl_status_t desc(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, int trans,
                          dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static void init(void) {
  widen = 1;
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
    fprintf(stderr, "libmoe: oneDNN has no CPU engine: bf16 GEMMs run widened to fp32 (slower)\n");
    return;
  }
  const int64_t R = DNNL_RUNTIME_DIM_VAL;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int acc = 0; acc < 2; acc++) {
        dnnl_memory_desc_t a, b, c;
        dnnl_matmul_desc_t d;
        dnnl_primitive_attr_t attr = NULL;
        dnnl_post_ops_t po = NULL;
        dnnl_primitive_desc_t pd = NULL;
        int ok = desc(&a, R, R, R, ta, dnnl_bf16) == dnnl_success &&
                 desc(&b, R, R, R, tb, dnnl_bf16) == dnnl_success &&
                 desc(&c, R, R, R, 0, dnnl_f32) == dnnl_success &&
                 dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) == dnnl_success &&
                 dnnl_primitive_attr_create(&attr) == dnnl_success;
        if (ok && acc) /* C += A B: the sum post-op reads the old C */
          ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
               dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
        /* a user scratchpad (one per call) lets threads run one primitive at once: this oneDNN is
         * built for OpenMP, without concurrent execution of a library-held scratchpad */
        ok = ok && dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&prims[ta][tb][acc], pd) == dnnl_success;
        const dnnl_memory_desc_t *smd = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
        scratch[ta][tb][acc] = smd ? dnnl_memory_desc_get_size(smd) : 0;
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (po) dnnl_post_ops_destroy(po);
        if (attr) dnnl_primitive_attr_destroy(attr);
        if (!ok) {
          fprintf(stderr, "libmoe: this CPU (or DNNL_MAX_CPU_ISA) lacks AVX512-BF16 and oneDNN has no bf16 "
                          "matmul for it: bf16 GEMMs run widened to fp32 (slower)\n");
          return;
        }
      }
  widen = 0;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  native = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
  if (!native)
    fprintf(stderr, "libmoe: this CPU (or DNNL_MAX_CPU_ISA) lacks AVX512-BF16: bf16 GEMMs take oneDNN's "
                    "slower path\n");
}

void moe__gemm_bf16_init(void) { pthread_once(&once, init); }

int moe_bf16_native(void) {
  pthread_once(&once, init);
  return native;
}

/* rows x cols bf16 at stride ld -> dense fp32 (allocated; NULL without memory). */
static float *widened(const uint16_t *a, int rows, int cols, int ld) {
  float *w = malloc((size_t)rows * cols * 4 + 4);
  for (int r = 0; w && r < rows; r++) moe_bf16_to_f32(w + (size_t)r * cols, a + (size_t)r * ld, (size_t)cols);
  return w;
}

static int gemm_widened(const moe__gemm *g) {
  int ar = g->ta ? g->K : g->M, ac = g->ta ? g->M : g->K, br = g->tb ? g->N : g->K, bc = g->tb ? g->K : g->N;
  float *a = widened(g->A, ar, ac, g->lda), *b = widened(g->B, br, bc, g->ldb);
  if (a && b)
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->M, g->N,
                g->K, 1.0f, a, ac, b, bc, g->beta, g->C, g->ldc);
  int ok = a && b;
  free(a);
  free(b);
  return ok;
}

int moe__gemm_bf16_one(const moe__gemm *g) {
  if (widen) return gemm_widened(g);
  dnnl_stream_t stream = NULL; /* one per call: cheap on a CPU, and nothing outlives it */
  dnnl_primitive_t prim = prims[g->ta][g->tb][g->beta != 0.0f];
  size_t sbytes = scratch[g->ta][g->tb][g->beta != 0.0f];
  void *sp = sbytes ? malloc(sbytes) : NULL;
  dnnl_memory_desc_t a, b, c;
  dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
  int ok = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success && desc(&a, g->M, g->K, g->lda, g->ta, dnnl_bf16) == dnnl_success &&
           desc(&b, g->K, g->N, g->ldb, g->tb, dnnl_bf16) == dnnl_success &&
           desc(&c, g->M, g->N, g->ldc, 0, dnnl_f32) == dnnl_success &&
           dnnl_memory_create(&ma, &a, engine, (void *)g->A) == dnnl_success &&
           dnnl_memory_create(&mb, &b, engine, (void *)g->B) == dnnl_success &&
           dnnl_memory_create(&mc, &c, engine, g->C) == dnnl_success && (!sbytes || sp);
  if (ok && sbytes) {
    const dnnl_memory_desc_t *smd = NULL;
    const_dnnl_primitive_desc_t pd = NULL;
    ok = dnnl_primitive_get_primitive_desc(prim, &pd) == dnnl_success &&
         (smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) != NULL &&
         dnnl_memory_create(&ms, smd, engine, sp) == dnnl_success;
  }
  if (ok) {
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
    ok = dnnl_primitive_execute(prim, stream, sbytes ? 4 : 3, args) == dnnl_success;
  }
  if (ms) dnnl_memory_destroy(ms);
  free(sp);
  if (mc) dnnl_memory_destroy(mc);
  if (mb) dnnl_memory_destroy(mb);
  if (ma) dnnl_memory_destroy(ma);
  if (stream) dnnl_stream_destroy(stream);
  return ok;
}
