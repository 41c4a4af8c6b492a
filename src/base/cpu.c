/* The CPU's description (cpu.h): features by CPUID and XGETBV, caches by sysfs or CPUID, asked once. */
#include "base/cpu.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_CPUID 1
#include <cpuid.h>
#endif

static moe__cpu cpu;
static char caches_from[16];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* /proc/cpuinfo's first "model name" (none on some other architectures). */
static void model_name(char *out, size_t n) {
  char line[512];
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f)) {
    char *v = strchr(line, ':');
    if (strncmp(line, "model name", 10) || !v || strspn(line + 10, " \t") != (size_t)(v - line - 10)) continue;
    snprintf(out, n, "%s", v + 1 + (v[1] == ' '));
    out[strcspn(out, "\n")] = 0;
    break;
  }
  if (f) fclose(f);
}

/* "48K", "1024K", "2M" or a count of bytes; -1 for anything else. */
static long long parse_size(const char *s) {
  char *end;
  if (!s || !isdigit((unsigned char)*s)) return -1;
  long long v = strtoll(s, &end, 10);
  long long unit = *end == 'K' ? 1024 : *end == 'M' ? 1048576 : 1;
  if (unit > 1) end++;
  if (*end == '\n') end++;
  return *end || v > (1ll << 40) ? -1 : v * unit;
}

/* The data (level 1) and unified (2, 3) caches of cpu0's sysfs directory; whether it has any. */
static int caches_sysfs(moe__cpu *c) {
  int found = 0;
  for (int i = 0; i < 8; i++) {
    char path[96], vals[3][32];
    const char *names[3] = {"level", "type", "size"};
    int ok = 1;
    for (int j = 0; j < 3 && ok; j++) {
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, names[j]);
      FILE *f = fopen(path, "r");
      ok = f && fgets(vals[j], sizeof vals[j], f);
      if (f) fclose(f);
      if (ok) vals[j][strcspn(vals[j], "\n")] = 0;
    }
    if (!ok) break;
    long long bytes = parse_size(vals[2]);
    if (!strcmp(vals[1], "Instruction") || bytes <= 0) continue;
    int level = atoi(vals[0]);
    long long *dst = level == 1 ? &c->l1d : level == 2 ? &c->l2 : level == 3 ? &c->l3 : NULL;
    if (dst) *dst = bytes, found = 1;
  }
  return found;
}

/* The same from CPUID's deterministic cache parameters (leaf 4 on Intel, 0x8000001D on AMD: per subleaf
 * the type in EAX bits 0-4, 0 ending the list, the level in bits 5-7; ways, partitions and line size
 * less one in EBX, sets less one in ECX), or AMD's older leaves where a VM hides 0x8000001D (L1d KiB in
 * 0x80000005 ECX bits 24-31, L2 KiB in 0x80000006 ECX bits 16-31; its L3 field is left out: VMs fill
 * it with what no CPU has). */
static int caches_cpuid(moe__cpu *c) {
#ifdef MOE_CPUID
  unsigned a = 0, b = 0, cx = 0, d = 0, leaf = 4, amd = !strcmp(c->vendor, "AuthenticAMD");
  if (!__get_cpuid(0, &a, &b, &cx, &d)) return 0;
  if (amd) leaf = 0x8000001Du;
  else if (a < 4) return 0;
  int found = 0;
  for (unsigned i = 0; i < 8; i++) {
    if (!__get_cpuid_count(leaf, i, &a, &b, &cx, &d) || (a & 31) == 0) break;
    if ((a & 31) == 2) continue; /* instructions */
    long long bytes = (long long)((b >> 22) + 1) * (((b >> 12) & 1023) + 1) * ((b & 4095) + 1) * (cx + 1);
    unsigned level = (a >> 5) & 7;
    long long *dst = level == 1 ? &c->l1d : level == 2 ? &c->l2 : level == 3 ? &c->l3 : NULL;
    if (dst) *dst = bytes, found = 1;
  }
  if (!found && amd && __get_cpuid(0x80000005, &a, &b, &cx, &d) && cx >> 24) {
    c->l1d = (long long)(cx >> 24) << 10;
    if (__get_cpuid(0x80000006, &a, &b, &cx, &d)) c->l2 = (long long)(cx >> 16) << 10;
    found = 1;
  }
  return found;
#else
  (void)c;
  return 0;
#endif
}

/* MOE_CPU_CACHE_<name> in place of the cache found; whether it was set (a bad value is said and ignored). */
static int cache_env(const char *name, long long *dst) {
  char var[32];
  snprintf(var, sizeof var, "MOE_CPU_CACHE_%s", name);
  const char *s = getenv(var);
  if (!s) return 0;
  long long v = parse_size(s);
  if (v < 0) {
    fprintf(stderr, "libmoe: %s='%s' is not a size in bytes (such as 2097152, 2048K or 2M): ignored\n", var, s);
    return 0;
  }
  *dst = v;
  return 1;
}

/* Vendor, family, model and the usable features: CPUID leaves 1 and 7 (subleaves 0 and 1), and XCR0
 * for the registers the OS saves (bits 1-2 SSE and AVX, 5-7 opmask and ZMM, 17-18 AMX tiles). */
static void features(moe__cpu *c) {
  c->family = c->model_number = -1;
#ifdef MOE_CPUID
  unsigned a, b, cx, d, lo = 0, hi = 0;
  if (!__get_cpuid(0, &a, &b, &cx, &d)) return;
  unsigned max = a;
  memcpy(c->vendor, &b, 4), memcpy(c->vendor + 4, &d, 4), memcpy(c->vendor + 8, &cx, 4);
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
  unsigned fam = (a >> 8) & 15, mod = (a >> 4) & 15;
  c->family = (int)(fam == 15 ? fam + ((a >> 20) & 255) : fam);
  c->model_number = (int)(fam == 6 || fam == 15 ? mod | ((a >> 16) & 15) << 4 : mod);
  if (!(cx >> 27 & 1)) return; /* no XGETBV: the OS saves no AVX registers */
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  int avx = (lo & 6) == 6 && (cx >> 28 & 1), zmm = avx && (lo & 0xe0) == 0xe0, tiles = ((lo >> 17) & 3) == 3;
  unsigned f = 0;
  if (avx) f |= (cx >> 12 & 1 ? MOE__CPU_FMA : 0) | (cx >> 29 & 1 ? MOE__CPU_F16C : 0);
  if (max >= 7 && __get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
    if (avx && (b >> 5 & 1)) f |= MOE__CPU_AVX2;
    if (zmm) {
      static const struct { int bit; unsigned flag; } ebx[] = {{16, MOE__CPU_AVX512F}, {17, MOE__CPU_AVX512DQ},
                                                              {28, MOE__CPU_AVX512CD}, {30, MOE__CPU_AVX512BW},
                                                              {31, MOE__CPU_AVX512VL}};
      for (size_t i = 0; i < sizeof ebx / sizeof *ebx; i++)
        if (b >> ebx[i].bit & 1) f |= ebx[i].flag;
      if (cx >> 11 & 1) f |= MOE__CPU_AVX512_VNNI;
    }
    if (cx >> 8 & 1) f |= MOE__CPU_GFNI;
    if (tiles)
      f |= (d >> 24 & 1 ? MOE__CPU_AMX_TILE : 0) | (d >> 22 & 1 ? MOE__CPU_AMX_BF16 : 0) |
           (d >> 25 & 1 ? MOE__CPU_AMX_INT8 : 0);
    unsigned sub = a;
    if (zmm && sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &cx, &d) && (a >> 5 & 1)) f |= MOE__CPU_AVX512_BF16;
  }
  if (!(f & MOE__CPU_AVX512F)) f &= ~(unsigned)(MOE__CPU_AVX512DQ | MOE__CPU_AVX512CD | MOE__CPU_AVX512BW |
                                               MOE__CPU_AVX512VL | MOE__CPU_AVX512_VNNI | MOE__CPU_AVX512_BF16);
  c->features = f;
#endif
}

static void describe(void) {
  features(&cpu);
  model_name(cpu.model, sizeof cpu.model);
  const char *from = caches_sysfs(&cpu) ? "sysfs" : caches_cpuid(&cpu) ? "cpuid" : "none";
  int env = cache_env("L1D", &cpu.l1d) | cache_env("L2", &cpu.l2) | cache_env("L3", &cpu.l3);
  snprintf(caches_from, sizeof caches_from, "%s%s", from, env ? "+env" : "");
  cpu.caches_from = caches_from;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  cpu.cpus = n > 0 ? (int)n : 1;
}

const moe__cpu *moe__cpu_get(void) {
  pthread_once(&once, describe);
  return &cpu;
}

int moe__cpu_has(unsigned mask) { return (moe__cpu_get()->features & mask) == mask; }

const char *moe__cpu_feature_name(int i) {
  static const char *const names[MOE__CPU_NFEATURES] = {
      "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
      "amx_tile", "amx_bf16", "amx_int8", "gfni"};
  return i >= 0 && i < MOE__CPU_NFEATURES ? names[i] : "?";
}
