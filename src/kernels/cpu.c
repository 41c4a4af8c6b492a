/* The CPU as the kernels see it (moe_cpu_info): its model, the features they are chosen by, its caches
 * (from Linux's /proc and /sys, or CPUID where /sys has no cache directory, as in some VMs), and the
 * choices made on it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/quant.h"
#include "moe.h"
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

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

/* The same from CPUID's deterministic cache parameters (leaf 4 on Intel, 0x8000001D on AMD: per subleaf
 * the type in EAX bits 0-4, 0 ending the list, the level in bits 5-7; ways, partitions and line size
 * less one in EBX, sets less one in ECX), or AMD's older leaves where a VM hides 0x8000001D (L1d KiB in
 * 0x80000005 ECX bits 24-31, L2 KiB in 0x80000006 ECX bits 16-31; its L3 field is left out: VMs fill
 * it with what no CPU has). */
static void caches_cpuid(char *out, size_t n) {
  out[0] = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a = 0, b = 0, c = 0, d = 0, leaf = 4;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  if (b == 0x68747541u) leaf = 0x8000001Du; /* "Auth"enticAMD */
  else if (a < 4) return;
  size_t w = 0;
  for (unsigned i = 0; i < 8 && w < n; i++) {
    if (!__get_cpuid_count(leaf, i, &a, &b, &c, &d) || (a & 31) == 0) break;
    if ((a & 31) == 2) continue; /* instructions */
    unsigned long long bytes = (unsigned long long)((b >> 22) + 1) * (((b >> 12) & 1023) + 1) * ((b & 4095) + 1) * (c + 1);
    w += (size_t)snprintf(out + w, n - w, "%sL%u%s %lluK", w ? " " : "", (a >> 5) & 7, (a & 31) == 1 ? "d" : "", bytes >> 10);
  }
  unsigned l1 = 0, l2 = 0;
  if (!w && leaf != 4 && __get_cpuid(0x80000005, &a, &b, &c, &d)) l1 = c >> 24;
  if (!w && leaf != 4 && __get_cpuid(0x80000006, &a, &b, &c, &d)) l2 = c >> 16;
  if (l1 && l2) snprintf(out, n, "L1d %uK L2 %uK", l1, l2);
#endif
}

/* "L1d 32K L2 512K L3 32768K" from cpu0's cache directory, else from CPUID. */
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
  if (!w) caches_cpuid(out, n);
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
