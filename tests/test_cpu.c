/* The CPU's description (base/cpu.h) against /proc/cpuinfo, the small GEMMs' blocking derived from
 * its caches (moe__gemm_params_for), the kernels under other caches' blocking (MOE_CPU_CACHE_L2 in a
 * child process) against the reference, and moe --version naming the CPU and the choices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/cpu.h"
#include "kernels/gemm.h"
#include "run_cli.h"
#include "test.h"

/* kc and kc_nt for L2 sizes: 1 MiB (Zen 4/5, this machine) exactly the blocks they were tuned with
 * (512, 1024); 1.25 MiB (Ice Lake) as 1 MiB; 2 MiB (Sapphire Rapids on) twice; past 2 MiB no longer;
 * 256 KiB a quarter; 0 (unknown) and sizes no core's L2 has (a byte, 1 TiB) the 1 MiB defaults. */
TEST(gemm_params_follow_the_l2) {
  static const struct { long long l2; int kc, kc_nt; } want[] = {
      {1 << 20, 512, 1024},          {5 << 18, 512, 1024},   {2 << 20, 1024, 2048}, {3 << 20, 1024, 2048},
      {32 << 20, 1024, 2048},        {256 << 10, 128, 256},  {200 << 10, 128, 256}, {512 << 10, 256, 512},
      {0, 512, 1024},                {1, 512, 1024},         {-5, 512, 1024},       {1ll << 40, 512, 1024}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    moe__cpu c = {.l1d = 48 << 10, .l2 = want[i].l2};
    moe__gemm_params p = moe__gemm_params_for(&c);
    if (p.kc != want[i].kc || p.kc_nt != want[i].kc_nt)
      FAIL_("L2 %lld: kc %d, kc_nt %d, not %d, %d", want[i].l2, p.kc, p.kc_nt, want[i].kc, want[i].kc_nt);
    c.l1d = 32 << 10; /* the L1d drives nothing */
    ASSERT_EQ_INT(moe__gemm_params_for(&c).kc_nt, want[i].kc_nt);
  }
  ASSERT_EQ_INT(moe__gemm_params_for(NULL).kc, 512);
  if (!getenv("MOE_CPU_CACHE_L2")) { /* this machine's own */
    moe__gemm_params p = moe__gemm_params_for(moe__cpu_get());
    ASSERT(!memcmp(&p, moe__gemm_params_get(), sizeof p));
  }
}

/* The value of /proc/cpuinfo's first line with this key ("" without one). */
static void cpuinfo_field(const char *key, char *out, size_t n) {
  static char line[8192];
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  size_t k = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, k) && (line[k] == '\t' || line[k] == ' ' || line[k] == ':') && strchr(line, ':')) {
      snprintf(out, n, "%s", strchr(line, ':') + 1);
      out[strcspn(out, "\n")] = 0;
      break;
    }
  if (f) fclose(f);
}

static int has_word(const char *s, const char *w) {
  size_t k = strlen(w);
  for (const char *p = strstr(s, w); p; p = strstr(p + 1, w))
    if ((p == s || p[-1] == ' ') && (p[k] == ' ' || p[k] == 0)) return 1;
  return 0;
}

/* On x86-64 Linux: each feature exactly when /proc/cpuinfo's flags name it (the kernel's view of the
 * same CPUID, and of what the OS saves), family and model as it gives them, the model name, an L1d of
 * 16 KiB to 1 MiB, an L2 at least as large, and the processors online. */
TEST(cpu_description_matches_proc_cpuinfo) {
#ifndef __x86_64__
  SKIP("CPUID is x86-64's");
#else
  static char flags[8192];
  char fam[64], mod[64], name[256];
  cpuinfo_field("flags", flags, sizeof flags);
  if (!*flags) SKIP("no /proc/cpuinfo flags");
  cpuinfo_field("cpu family", fam, sizeof fam);
  cpuinfo_field("model", mod, sizeof mod);
  cpuinfo_field("model name", name, sizeof name);
  const moe__cpu *c = moe__cpu_get();
  for (int i = 0; i < MOE__CPU_NFEATURES; i++)
    if (has_word(flags, moe__cpu_feature_name(i)) != (int)(c->features >> i & 1))
      FAIL_("feature %s: CPUID says %d, /proc/cpuinfo %d", moe__cpu_feature_name(i), (int)(c->features >> i & 1),
            has_word(flags, moe__cpu_feature_name(i)));
  ASSERT_EQ_INT(c->family, atoi(fam));
  ASSERT_EQ_INT(c->model_number, atoi(mod));
  if (strcmp(c->model, name + (name[0] == ' '))) FAIL_("model '%s', /proc/cpuinfo '%s'", c->model, name);
  ASSERT(*c->vendor);
  if (!getenv("MOE_CPU_CACHE_L1D") && (c->l1d < (16 << 10) || c->l1d > (1 << 20)))
    FAIL_("L1d %lld bytes (from %s)", c->l1d, c->caches_from);
  if (!getenv("MOE_CPU_CACHE_L2") && c->l2 < c->l1d) FAIL_("L2 %lld bytes, L1d %lld", c->l2, c->l1d);
  ASSERT_EQ_INT(c->cpus, (int)sysconf(_SC_NPROCESSORS_ONLN));
  ASSERT_EQ_INT(moe__cpu_has(MOE__CPU_AVX2 | MOE__CPU_FMA), has_word(flags, "avx2") && has_word(flags, "fma"));
#endif
}

/* Runs this binary's test `name` again with `env` set; 0 passed, 77 skipped, else failed (output in out). */
static int run_self(const char *env, const char *name, char *out, size_t n) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "env %s /proc/%d/exe --run %s 2>&1", env, (int)getpid(), name);
  FILE *p = popen(cmd, "r");
  if (!p) return snprintf(out, n, "popen failed"), -1;
  size_t got = fread(out, 1, n - 1, p);
  out[got] = 0;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The small-GEMM reference tests again under the blocks of a 2 MiB L2 (NT's K in blocks up to 2048)
 * and of a 256 KiB one (NN's 128, NT's 256: many blocks, more tails), each in a child process that
 * takes MOE_CPU_CACHE_L2 before its first GEMM; moe --version names the blocks taken. */
TEST(gemm_small_under_other_l2_blocks_match_reference) {
  static const char *const envs[] = {"MOE_CPU_CACHE_L2=2097152", "MOE_CPU_CACHE_L2=256K"};
  static const char *const names[] = {"gemm_small_kernels_match_reference",
                                      "gemm_small_wide_gradients_and_long_rows_match_reference",
                                      "gemm_small_nt_rows_past_64_match_reference"};
  static char out[16384];
  for (int e = 0; e < 2; e++)
    for (int t = 0; t < 3; t++) {
      int rc = run_self(envs[e], names[t], out, sizeof out);
      if (rc == TEST_SKIP_CODE) SKIP("%s skipped: %s", names[t], out);
      if (rc != 0) FAIL_("%s %s: exit %d\n%s", envs[e], names[t], rc, out);
    }
}

/* moe --version: the CPU line with its caches and the blocking chosen; under MOE_CPU_CACHE_L2=2M the
 * blocks of a 2 MiB L2, and "+env" where the caches came from in the JSON. */
TEST(cli_version_names_cpu_and_blocking) {
  char outp[512], err[2048];
  test_tmp_path("version.txt", outp, sizeof outp);
  ASSERT_EQ_INT(run_moe(NULL, "--version", outp, err, sizeof err), 0);
  static char out[4096];
  test_read_text(outp, out, sizeof out);
  if (!strstr(out, "(family ") || !strstr(out, "; kernels: small GEMMs ") || !strstr(out, "quantized experts' dot products"))
    FAIL_("moe --version: %s", out);
#ifdef __x86_64__
  if (!strstr(out, "L1d ") || !strstr(out, " L2 ")) FAIL_("moe --version names no caches: %s", out);
#endif
  const moe__cpu *c = moe__cpu_get();
#ifdef __AVX512F__
  int on = moe__cpu_has(MOE__CPU_AVX512F);
#else
  int on = 0;
#endif
  if (!on) SKIP("no small-GEMM kernels here: no blocking to name");
  char want[128];
  moe__gemm_params p = moe__gemm_params_for(c);
  snprintf(want, sizeof want, "small GEMMs AVX-512 (blocks of K: NN %d, NT up to %d, ", p.kc, p.kc_nt);
  if (!strstr(out, want)) FAIL_("moe --version lacks '%s': %s", want, out);
  ASSERT_EQ_INT(run_moe("MOE_CPU_CACHE_L2=2M", "--version", outp, err, sizeof err), 0);
  test_read_text(outp, out, sizeof out);
  if (!strstr(out, "(blocks of K: NN 1024, NT up to 2048, for an L2 of 2048K; ") || !strstr(out, " L2 2048K"))
    FAIL_("MOE_CPU_CACHE_L2=2M: %s", out);
  ASSERT_EQ_INT(run_moe("MOE_CPU_CACHE_L2=lots", "--version", outp, err, sizeof err), 0);
  if (!strstr(err, "MOE_CPU_CACHE_L2='lots' is not a size")) FAIL_("stderr '%s' does not name the bad value", err);
}
