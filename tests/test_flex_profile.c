/* FlexMoE's start-up profile (moe_flex_profile) is the same on every rank, bit for bit, so that every
 * rank's policy maker decides the same placement from the same counts (the bench lands each rank's own
 * decision). The test runs this test binary itself on 2 ranks under mpirun: with MOE_TEST_FLEX_PROFILE
 * set, a rank profiles a small layer and writes what it got to DIR/rank<r>; the launcher compares the
 * files. Each rank times its own passes, so without the agreement they would differ. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_cli.h"
#include "test.h"

#define ENV_DIR "MOE_TEST_FLEX_PROFILE"

/* The profile's fields as doubles, in the order of moe_flex_env; their number. */
static int env_values(const moe_flex_env *e, double *v) {
  int n = 0;
  double head[7] = {e->tps, e->a2a_lat, e->a2a_bw, e->ar_lat, e->ar_bw, e->token_bytes, e->expert_bytes};
  for (int i = 0; i < 7; i++) v[n++] = head[i];
  v[n++] = e->rate_n;
  for (int i = 0; i < e->rate_n; i++) v[n++] = e->rate_rows[i], v[n++] = e->rate_tps[i];
  return n;
}

/* One rank's part: its profile of a small layer to DIR/rank<r>. */
static void profile_rank(const char *dir, int *failed_) {
  moe_dist *d;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 16, c.H = 32, c.E = 4, c.top_k = 2, c.threads = 1, c.dist = d;
  moe_flex_env e;
  moe_status st = moe_flex_profile(&c, &e);
  char path[600];
  snprintf(path, sizeof path, "%s/rank%d", dir, moe_dist_rank(d));
  moe_dist_finalize(d);
  ASSERT_OK(st);
  double v[8 + 2 * MOE_FLEX_RATE_BUCKETS];
  ASSERT_OK(moe_write_file_atomic(path, v, sizeof *v * (size_t)env_values(&e, v)));
}

TEST(flex_profile_is_the_same_on_every_rank) {
  const char *dir = getenv(ENV_DIR);
  if (dir) {
    profile_rank(dir, failed_);
    return;
  }
  if (!test_have_mpirun()) return;
  char exe[512], tmp[512], errp[600], cmd[2400], p0[600], p1[600];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT(n > 0);
  exe[n] = 0;
  test_tmp_path("flex_profile", tmp, sizeof tmp);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmp);
  ASSERT_EQ_INT(system(cmd), 0);
  snprintf(errp, sizeof errp, "%s/stderr", tmp);
  snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np 2 env " ENV_DIR "='%s' '%s' flex_profile_is_the_same_on_every_rank "
           ">/dev/null 2>'%s'", tmp, exe, errp);
  int rc = system(cmd);
  char err[4096];
  test_read_text(errp, err, sizeof err);
  if (!WIFEXITED(rc) || WEXITSTATUS(rc)) FAIL_("the ranks' run failed (%d); stderr:\n%s", rc, err);
  snprintf(p0, sizeof p0, "%s/rank0", tmp);
  snprintf(p1, sizeof p1, "%s/rank1", tmp);
  size_t n0 = 0;
  double *v = (double *)test_read_file(p0, &n0);
  if (!v || n0 < 9 * sizeof *v) FAIL_("rank 0's profile %s: %zu bytes; stderr:\n%s", p0, n0, err);
  else if (v[7] < 1 || v[8] != 64) FAIL_("rank 0's profile has %g rate buckets, the first at %g rows", v[7], v[8]);
  ASSERT(test_same_file(p0, p1));
  free(v);
}
