/* The CPU as the kernels see it (moe_cpu_info): its model, the features they are chosen by, its caches
 * (from Linux's /proc and /sys), and the choices made on it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"

static char info[768];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The value of the first "key<tabs>: value" line of /proc/cpuinfo, or "" (at most n - 1 bytes). */
static void cpuinfo(const char *key, char *out, size_t n) {
  static char line[8192];
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  size_t k = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, k) && (line[k] == '\t' || line[k] == ' ' || line[k] == ':')) {
      char *v = strchr(line, ':');
      if (v) snprintf(out, n, "%s", v + 1 + (v[1] == ' '));
      out[strcspn(out, "\n")] = 0;
      break;
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
  char model[128], family[16], mod[16], cache[128];
  static char flags[8192];
  cpuinfo("model name", model, sizeof model);
  cpuinfo("cpu family", family, sizeof family);
  cpuinfo("model", mod, sizeof mod);
  cpuinfo("flags", flags, sizeof flags);
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
           "%s (family %s model %s): %s; %s; kernels: small GEMMs %s, activations %s, bf16 GEMMs %s",
           *model ? model : "unknown CPU", *family ? family : "?", *mod ? mod : "?", *fl ? fl : "no AVX2",
           *cache ? cache : "caches unknown",
           avx512 && built512 ? "AVX-512" : built512 ? "off (no AVX-512: the BLAS runs every GEMM)"
                                                      : "off (built without AVX-512: the BLAS runs every GEMM)",
           built512 ? "16 at a time (libmvec AVX-512)" : "one at a time",
           has_flag(flags, "avx512_bf16") ? "oneDNN with AVX512-BF16" : "oneDNN without AVX512-BF16 (slower)");
  for (char *p = info; *p; p++) /* it goes into JSON as it is */
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = ' ';
}

const char *moe_cpu_info(void) {
  pthread_once(&once, describe);
  return info;
}
