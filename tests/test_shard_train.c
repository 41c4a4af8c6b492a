/* `moe train --parallel-r` under mpirun (src/shard/shard.c, src/model/checkpoint_dist.c): switching r at every step (a list of r taken in
 * turn) follows the run at one fixed r, and both the one-process run, within 1e-4 per step in loss:
 * W = 2 with E = 4 (r in {0, 1}) and W = 4 with E = 2 (W > E: r in {0, 1, 2}). A checkpoint saved by
 * sharded ranks is the one-process file: resumed with another W and r, the run goes on as one process
 * does. Skipped without mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define SH_TRAIN "train --batch 48 --augment 1 --threads 1 --log-steps"
#define SH_ARCH "--top-k 1 --hidden 24 --model 16 "

/* `moe train` with args (under mpirun -np W when W > 1); its per-step losses into loss (n of them). */
static int losses(int W, const char *args, double *loss, int *n) {
  char out[512], cmd[3000];
  test_tmp_path("shard_train.txt", out, sizeof out);
  snprintf(cmd, sizeof cmd, "%s%s%d '%s' " SH_TRAIN " %s --data '%s' > '%s' 2>&1", W > 1 ? TEST_MPIRUN : "",
           W > 1 ? "-np " : "", W > 1 ? W : 0, MOE_CLI, args, synth_data_dir(), out);
  if (W == 1) snprintf(cmd, sizeof cmd, "'%s' " SH_TRAIN " %s --data '%s' > '%s' 2>&1", MOE_CLI, args, synth_data_dir(), out);
  int rc = system(cmd);
  *n = test_read_losses(out, loss, 64);
  if (!WIFEXITED(rc) || WEXITSTATUS(rc)) {
    fprintf(stderr, "  %s: status %d, output:\n", cmd, rc);
    FILE *f = fopen(out, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) fprintf(stderr, "    %s", line);
    if (f) fclose(f);
    return 0;
  }
  return 1;
}

TEST(shard_train_switching_r_follows_fixed_r) {
  if (!test_have_mpirun()) return;
  const struct { int W; const char *E, *fixed, *cycle; } runs[] = {
      {2, SH_ARCH "--experts 4 --epochs 1", "--parallel-r 1", "--parallel-r 0,1"},
      {4, SH_ARCH "--experts 2 --epochs 1", "--parallel-r 2", "--parallel-r 0,1,2"},
  };
  for (int c = 0; c < 2; c++) {
    double one[64], fixed[64], cyc[64];
    int n1, nf, nc;
    char args[256];
    ASSERT(losses(1, runs[c].E, one, &n1));
    snprintf(args, sizeof args, "%s %s", runs[c].E, runs[c].fixed);
    ASSERT(losses(runs[c].W, args, fixed, &nf));
    snprintf(args, sizeof args, "%s %s", runs[c].E, runs[c].cycle);
    ASSERT(losses(runs[c].W, args, cyc, &nc));
    ASSERT(n1 >= 10);
    ASSERT_EQ_INT(nf, n1);
    ASSERT_EQ_INT(nc, n1);
    for (int i = 0; i < n1; i++)
      if (fabs(cyc[i] - fixed[i]) > 1e-4 || fabs(fixed[i] - one[i]) > 1e-4)
        FAIL_("W=%d %s, step %d: loss %.9g switching r (%s), %.9g at %s, %.9g in one process", runs[c].W, runs[c].E, i,
              cyc[i], runs[c].cycle, fixed[i], runs[c].fixed, one[i]);
  }
}

TEST(shard_checkpoint_resumes_with_another_w_and_r) {
  if (!test_have_mpirun()) return;
  char ck[512], args[1024];
  test_tmp_path("shard_ck.safetensors", ck, sizeof ck);
  double one[64], first[64], rest[64];
  int n1, nf, nr;
  ASSERT(losses(1, SH_ARCH "--experts 2 --epochs 2", one, &n1));
  snprintf(args, sizeof args, SH_ARCH "--experts 2 --epochs 2 --stop-after 1 --parallel-r 2 --checkpoint '%s'", ck);
  ASSERT(losses(4, args, first, &nf));
  snprintf(args, sizeof args, "--parallel-r 0 --resume '%s'", ck);
  ASSERT(losses(2, args, rest, &nr));
  ASSERT(nf >= 10);
  ASSERT_EQ_INT(nf + nr, n1);
  for (int i = 0; i < n1; i++) {
    double got = i < nf ? first[i] : rest[i - nf];
    if (fabs(got - one[i]) > 1e-4)
      FAIL_("step %d: loss %.9g (W=4 r=2, resumed on W=2 r=0 after step %d), %.9g in one process", i, got, nf, one[i]);
  }
}
