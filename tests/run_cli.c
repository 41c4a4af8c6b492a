/* See run_cli.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_cli.h"
#include "test.h"

int run_moe(const char *env_prefix, const char *args, const char *out_path, char *err, size_t n) {
  char errp[512], cmd[4096];
  test_tmp_path("run_moe_stderr.txt", errp, sizeof errp);
  snprintf(cmd, sizeof cmd, "%s '%s' %s >'%s' 2>'%s'", env_prefix ? env_prefix : "", MOE_CLI, args,
           out_path ? out_path : "/dev/null", errp);
  int rc = system(cmd);
  if (err) test_read_text(errp, err, n);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int test_have_mpirun(void) {
  if (moe_dist_has_mpi() && system("command -v mpirun >/dev/null 2>&1") == 0) return 1;
  test_skip("%s", moe_dist_has_mpi() ? "mpirun not found" : "libmoe built without MPI");
  return 0;
}

int test_mpirun_self(int W, const char *name, int timeout_s, char *cmd, size_t cn, char *out, size_t on) {
  snprintf(cmd, cn, "timeout %d " TEST_MPIRUN "-np %d /proc/%d/exe %s 2>&1", timeout_s, W, (int)getpid(), name);
  out[0] = 0;
  FILE *p = popen(cmd, "r");
  if (!p) return snprintf(out, on, "popen failed"), -1;
  size_t n = fread(out, 1, on - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  return rc ? rc : strstr(out, "1 passed, 0 failed") ? 0 : -1;
}

int test_read_losses(const char *path, double *loss, int max) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f) && n < max) {
    char *p = strstr(line, "\"loss\": ");
    if (!strncmp(line, "{\"step\"", 7) && p) loss[n++] = atof(p + 8);
  }
  fclose(f);
  return n;
}
