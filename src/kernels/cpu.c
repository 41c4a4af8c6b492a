/* The CPU as the kernels see it (moe_cpu_info): its model, the features they are chosen by, its caches
 * (from Linux's /proc and /sys), and the choices made on it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/quant.h"
#include "moe.h"

static char info[1024]; /* room for what describe() writes at most: no truncation */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The values of the first "key<tabs>: value" lines of /proc/cpuinfo with these n keys, read once ("" for
 * a key it lacks; at most size - 1 bytes each). */
static void cpuinfo(const char *const *keys, char **vals, int n, size_t size) {
  static char line[8192];
  for (int i = 0; i < n; i++) vals[i][0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f)) {
    char *v = strchr(line, ':');
    if (!v) continue;
    size_t k = (size_t)(v - line);
    while (k && (line[k - 1] == '\t' || line[k - 1] == ' ')) k--;
    for (int i = 0; i < n; i++)
      if (!vals[i][0] && strlen(keys[i]) == k && !strncmp(line, keys[i], k)) {
        snprintf(vals[i], size, "%s", v + 1 + (v[1] == ' '));
        vals[i][strcspn(vals[i], "\n")] = 0;
      }
  }
  if (f) fclose(f);
}

/* Whether the flags line has this flag as a whole word. */
static int has_flag(const char *flags, const char *f) {
  size_t k = strlen(f);
  for (const char *p = strstr(flags, f); p; p = strstr(p + 1, f))
    if ((p == flags || p[-1] == ' ') && (p[k] == ' ' || p[k] == 0)) return 1;
  return 0;
}

/* "L1d 32K L2 512K L3 32768K" from cpu0's cache directory. */
static void caches(char *out, size_t n) {
  size_t w = 0;
  out[0] = 0;
  for (int i = 0; i < 8 && w < n; i++) {
    char path[96], level[8] = "", type[32] = "", size[32] = "";
    const char *names[3] = {"level", "type", "size"};
    char *vals[3] = {level, type, size};
    int ok = 1;
    for (int j = 0; j < 3 && ok; j++) {
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, names[j]);
      FILE *f = fopen(path, "r");
      ok = f && fgets(vals[j], 32, f);
      if (f) fclose(f);
      vals[j][strcspn(vals[j], "\n")] = 0;
    }
    if (!ok) break;
    if (!strcmp(type, "Instruction")) continue;
    w += (size_t)snprintf(out + w, n - w, "%sL%s%s %s", w ? " " : "", level, !strcmp(type, "Data") ? "d" : "", size);
  }
}

static void describe(void) {
  static char model[8192], family[8192], mod[8192], flags[8192];
  static const char *const keys[4] = {"model name", "cpu family", "model", "flags"};
  char *vals[4] = {model, family, mod, flags}, cache[128];
  cpuinfo(keys, vals, 4, sizeof flags);
  caches(cache, sizeof cache);
  static const char *const feats[] = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                                      "amx_tile", "amx_bf16", "amx_int8"};
  char fl[160] = "";
  for (size_t i = 0, w = 0; i < sizeof feats / sizeof *feats; i++)
    if (has_flag(flags, feats[i])) w += (size_t)snprintf(fl + w, sizeof fl - w, "%s%s", w ? " " : "", feats[i]);
  int avx512 = has_flag(flags, "avx512f");
#ifdef __AVX512F__
  int built512 = 1;
#else
  int built512 = 0;
#endif
  snprintf(info, sizeof info,
           "%.160s (family %.8s model %.8s): %s; %s; kernels: small GEMMs %s, activations %s, bf16 GEMMs %s, "
           "quantized experts' dot products %s",
           *model ? model : "unknown CPU", *family ? family : "?", *mod ? mod : "?", *fl ? fl : "no AVX2",
           *cache ? cache : "caches unknown",
           avx512 && built512 ? "AVX-512" : built512 ? "off (no AVX-512: the BLAS runs every GEMM)"
                                                      : "off (built without AVX-512: the BLAS runs every GEMM)",
           built512 ? "16 at a time (libmvec AVX-512)" : "one at a time",
           has_flag(flags, "avx512_bf16") ? "oneDNN with AVX512-BF16" : "oneDNN without AVX512-BF16 (slower)",
           moe__isa_name(moe__qdot_best()));
  for (char *p = info; *p; p++) /* it goes into JSON as it is */
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = ' ';
}

const char *moe_cpu_info(void) {
  pthread_once(&once, describe);
  return info;
}
