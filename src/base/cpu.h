/* The CPU the library runs on, found once: the one place that asks it for its features and caches
 * (the kernels dispatch on these, and their blocking is derived from the caches). */
#ifndef MOE_BASE_CPU_H
#define MOE_BASE_CPU_H

#include <stddef.h>

/* The features the kernels are chosen by, each usable: the CPU has it and the OS saves its registers. */
enum {
  MOE__CPU_AVX2 = 1 << 0,
  MOE__CPU_FMA = 1 << 1,
  MOE__CPU_F16C = 1 << 2,
  MOE__CPU_AVX512F = 1 << 3,
  MOE__CPU_AVX512DQ = 1 << 4,
  MOE__CPU_AVX512CD = 1 << 5,
  MOE__CPU_AVX512BW = 1 << 6,
  MOE__CPU_AVX512VL = 1 << 7,
  MOE__CPU_AVX512_VNNI = 1 << 8,
  MOE__CPU_AVX512_BF16 = 1 << 9,
  MOE__CPU_AMX_TILE = 1 << 10,
  MOE__CPU_AMX_BF16 = 1 << 11,
  MOE__CPU_AMX_INT8 = 1 << 12,
  MOE__CPU_GFNI = 1 << 13,
};
#define MOE__CPU_NFEATURES 14

typedef struct {
  char vendor[16];       /* CPUID's vendor ("GenuineIntel", "AuthenticAMD"), "" off x86-64 */
  char model[160];       /* /proc/cpuinfo's model name, "" when it has none */
  int family, model_number; /* CPUID's display family and model, -1 off x86-64 */
  unsigned features;     /* MOE__CPU_* */
  long long l1d, l2, l3; /* bytes of one data / unified cache of each level; 0 when unknown */
  const char *caches_from; /* "sysfs", "cpuid" or "none"; "+env" appended when MOE_CPU_CACHE_* set one */
  int cpus;              /* logical processors online */
} moe__cpu;

/* This machine's, found on the first call (thread-safe); the caches from cpu0's sysfs cache directory,
 * else CPUID (leaf 4 on Intel, 0x8000001D or 0x80000005/6 on AMD), else unknown; then the environment's
 * MOE_CPU_CACHE_L1D, MOE_CPU_CACHE_L2, MOE_CPU_CACHE_L3 (bytes, or with a K or M suffix) replace them,
 * for tests of the choices made on other CPUs. */
const moe__cpu *moe__cpu_get(void);
/* Whether this CPU has every feature of the mask. */
int moe__cpu_has(unsigned mask);
/* The name of feature bit i (i < MOE__CPU_NFEATURES), as /proc/cpuinfo's flags spell it. */
const char *moe__cpu_feature_name(int i);

#endif
