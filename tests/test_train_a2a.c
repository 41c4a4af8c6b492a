/* `moe train --a2a linear|2dh|auto [--ranks-per-node G]` under mpirun: the exchanges' all-to-all is a
 * transport choice (2DH delivers the same rows in the same places), so 2DH (one machine split into nodes
 * of one rank) and auto give Linear's losses to the last printed digit, and ranks given different
 * algorithms stop at start-up with a message naming --a2a (before 2DH's communicator split, where they
 * would hang). The mpirun cases print SKIP without mpirun or MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define MPIRUN2 TEST_MPI_ENV "timeout -k 5 120 mpirun --oversubscribe "
#define A2A_TRAIN "train --experts 4 --top-k 1 --hidden 24 --model 16 --epochs 1 --batch 48 --augment 1 --threads 1"

/* `moe train` with args on the synthetic set, launched by launcher (mpirun or ""): its per-step losses
 * (*n of them), its exit status, its stderr in err. */
static int train_on(const char *launcher, const char *args, double *loss, int *n, char *err, size_t en) {
  char out[512], errp[512], cmd[4096];
  test_tmp_path("a2a_train.txt", out, sizeof out);
  test_tmp_path("a2a_train_err.txt", errp, sizeof errp);
  snprintf(cmd, sizeof cmd, "%s '%s' " A2A_TRAIN " --log-steps %s --data '%s' >'%s' 2>'%s'", launcher, MOE_CLI, args,
           synth_data_dir(), out, errp);
  int rc = system(cmd);
  *n = test_read_losses(out, loss, 64);
  test_read_text(errp, err, en);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int train2(const char *args, double *loss, int *n, char *err, size_t en) {
  return train_on(MPIRUN2 "-np 2", args, loss, n, err, en);
}

TEST(train_a2a_2dh_and_auto_follow_linear) {
  if (!test_have_mpirun()) return;
  static const char *const algos[3] = {"--a2a linear", "--a2a 2dh --ranks-per-node 1", "--a2a auto --ranks-per-node 1"};
  double loss[3][64];
  int n[3];
  char err[4096];
  for (int a = 0; a < 3; a++) {
    int rc = train2(algos[a], loss[a], &n[a], err, sizeof err);
    if (rc) FAIL_("%s: exit %d, stderr:\n%s", algos[a], rc, err);
  }
  if (n[0] != 12 || n[1] != 12 || n[2] != 12) FAIL_("%d, %d and %d step losses, want 12 each", n[0], n[1], n[2]);
  for (int a = 1; a < 3; a++)
    for (int s = 0; s < 12; s++)
      if (loss[a][s] != loss[0][s]) /* %.9g of the same bits */
        FAIL_("step %d: loss %.9g with %s, %.9g with %s", s + 1, loss[a][s], algos[a], loss[0][s], algos[0]);
}

TEST(train_a2a_ranks_disagree) {
  if (!test_have_mpirun()) return;
  char errp[512], err[8192], cmd[4096];
  test_tmp_path("a2a_agree_err.txt", errp, sizeof errp);
  snprintf(cmd, sizeof cmd, MPIRUN2 "-np 1 '%s' " A2A_TRAIN " --data '%s' : -np 1 '%s' " A2A_TRAIN
           " --data '%s' --a2a 2dh --ranks-per-node 1 >/dev/null 2>'%s'", MOE_CLI, synth_data_dir(), MOE_CLI,
           synth_data_dir(), errp);
  int rc = system(cmd);
  rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  test_read_text(errp, err, sizeof err);
  const char *want = "moe train: the ranks disagree: rank 1 has --a2a = 2dh, rank 0 has linear";
  const char *at = strstr(err, want);
  if (rc == 0 || rc == 124 || !at || strstr(at + 1, want)) /* 124: a hang, the timeout's */
    FAIL_("exit %d; want the message '%s' once; stderr:\n%s", rc, want, err);
}

/* Without mpirun: both training commands document the flags and refuse a bad algorithm. */
TEST(train_a2a_flags_help_and_bad_value) {
  char out[512], err[2048];
  test_tmp_path("a2a_help.txt", out, sizeof out);
  static const char *const cmds[2] = {"train", "train --task lm"};
  for (int i = 0; i < 2; i++) {
    char args[256], *help;
    snprintf(args, sizeof args, "%s --help", cmds[i]);
    ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
    help = test_read_file(out, NULL);
    int ok = help && strstr(help, "--a2a linear|2dh|auto") && strstr(help, "--ranks-per-node G") &&
             strstr(help, "--parallel-r N|auto");
    free(help);
    if (!ok) FAIL_("moe %s: the help does not show --a2a, --ranks-per-node and --parallel-r", args);
    snprintf(args, sizeof args, "%s --a2a ring --data /nonexistent", cmds[i]);
    if (run_moe(NULL, args, NULL, err, sizeof err) == 0 || !strstr(err, "--a2a: bad value 'ring'"))
      FAIL_("moe %s: want an error naming --a2a, got: %s", args, err);
  }
}

/* One process has no exchange and no shards: --a2a and --parallel-r (a list too) change nothing. */
TEST(train_a2a_and_parallel_r_in_one_process_change_nothing) {
  static const char *const args[2] = {"", "--a2a 2dh --ranks-per-node 1 --parallel-r 0,1,2"};
  double loss[2][64];
  int n[2];
  char err[4096];
  for (int a = 0; a < 2; a++) {
    int rc = train_on("", args[a], loss[a], &n[a], err, sizeof err);
    if (rc) FAIL_("'%s': exit %d, stderr:\n%s", args[a], rc, err);
  }
  if (n[0] != 12 || n[1] != 12) FAIL_("%d and %d step losses, want 12 each", n[0], n[1]);
  for (int s = 0; s < 12; s++)
    if (loss[1][s] != loss[0][s]) FAIL_("step %d: loss %.9g with '%s', %.9g without", s + 1, loss[1][s], args[1], loss[0][s]);
}
