/* The CPU as the kernels see it (moe_cpu_info, moe_cpu_json): its description (base/cpu.h) and the
 * choices made on it: which kernels, and the small GEMMs' blocking from its caches. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/cpu.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "moe.h"

static char info[1024], json[2048]; /* room for what describe() writes at most: no truncation */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The features' names, spaced (sep " ") or as JSON strings (sep ", " with quotes). */
static void feature_list(unsigned f, const char *sep, const char *quote, char *out, size_t n) {
  size_t w = 0;
  out[0] = 0;
  for (int i = 0; i < MOE__CPU_NFEATURES && w < n; i++)
    if (f >> i & 1) w += (size_t)snprintf(out + w, n - w, "%s%s%s%s", w ? sep : "", quote, moe__cpu_feature_name(i), quote);
}

/* "L1d 32K L2 1024K L3 32768K", the known ones. */
static void cache_list(const moe__cpu *c, char *out, size_t n) {
  const char *names[3] = {"L1d", "L2", "L3"};
  long long sizes[3] = {c->l1d, c->l2, c->l3};
  size_t w = 0;
  out[0] = 0;
  for (int i = 0; i < 3 && w < n; i++)
    if (sizes[i] > 0) w += (size_t)snprintf(out + w, n - w, "%s%s %lldK", w ? " " : "", names[i], sizes[i] >> 10);
}

static void describe(void) {
  const moe__cpu *c = moe__cpu_get();
  const moe__gemm_params *gp = moe__gemm_params_get();
  char model[160], fl[256], fj[320], cache[128], small[160];
  snprintf(model, sizeof model, "%s", *c->model ? c->model : "unknown CPU");
  for (char *p = model; *p; p++) /* it goes into JSON as it is */
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = ' ';
  feature_list(c->features, " ", "", fl, sizeof fl);
  feature_list(c->features, ", ", "\"", fj, sizeof fj);
  cache_list(c, cache, sizeof cache);
#ifdef __AVX512F__
  int built512 = 1;
#else
  int built512 = 0;
#endif
  int on = built512 && moe__cpu_has(MOE__CPU_AVX512F);
  if (on)
    snprintf(small, sizeof small, "AVX-512 (blocks of K: NN %d, NT up to %d, for an L2 of %lldK; %ld KiB scratch a thread)",
             gp->kc, gp->kc_nt, gp->l2 >> 10, moe__gemm_small_scratch_bytes() >> 10);
  else
    snprintf(small, sizeof small, "%s", built512 ? "off (no AVX-512: the BLAS runs every GEMM)"
                                                 : "off (built without AVX-512: the BLAS runs every GEMM)");
  const char *act = built512 ? "16 at a time (libmvec AVX-512)" : "one at a time";
  const char *bf16 = moe__cpu_has(MOE__CPU_AVX512_BF16) ? "oneDNN with AVX512-BF16" : "oneDNN without AVX512-BF16 (slower)";
  const char *qdot = moe__isa_name(moe__qdot_best());
  snprintf(info, sizeof info,
           "%s (family %d model %d): %s; %s, %d CPUs; kernels: small GEMMs %s, activations %s, bf16 GEMMs %s, "
           "quantized experts' dot products %s%s",
           model, c->family, c->model_number, *fl ? fl : "no AVX2", *cache ? cache : "caches unknown", c->cpus, small,
           act, bf16, qdot,
           moe__qdot_best() == MOE__ISA_AVX512 && moe__cpu_has(MOE__CPU_GFNI) ? " (Q4_K, Q5_K decode nibbles by GFNI)" : "");
  snprintf(json, sizeof json,
           "{\"model\": \"%s\", \"vendor\": \"%s\", \"family\": %d, \"model_number\": %d, \"features\": [%s], "
           "\"l1d_bytes\": %lld, \"l2_bytes\": %lld, \"l3_bytes\": %lld, \"caches_from\": \"%s\", \"cpus\": %d, "
           "\"small_gemm\": \"%s\", \"gemm_kc\": %d, \"gemm_kc_nt\": %d, \"gemm_scratch_bytes\": %ld, \"activations\": \"%s\", \"bf16_gemm\": \"%s\", "
           "\"quant_dot\": \"%s\"}",
           model, c->vendor, c->family, c->model_number, fj, c->l1d, c->l2, c->l3, c->caches_from, c->cpus,
           on ? "AVX-512" : "off", gp->kc, gp->kc_nt, on ? moe__gemm_small_scratch_bytes() : 0L, act, bf16, qdot);
}

const char *moe_cpu_info(void) {
  pthread_once(&once, describe);
  return info;
}

const char *moe_cpu_json(void) {
  pthread_once(&once, describe);
  return json;
}
