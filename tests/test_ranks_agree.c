/* Ranks started with different configurations (issue 21: hangs, silent wrong runs, raw MPI errors):
 * `moe train` and `moe layer-run --expert-parallel` compare their options, shapes and data sizes with
 * rank 0's at start-up, and every rank exits non-zero, the message naming the first rank that differs
 * and the setting printed once (by rank 0), without MPI_Abort. The mpirun cases print SKIP where the library has no MPI or mpirun is
 * missing; a failure prints the ranks' stderr. */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define MPIRUN TEST_MPI_ENV "timeout -k 5 60 mpirun --oversubscribe "

/* One process: nothing to compare with; bad arguments are refused. */
TEST(agree_one_process) {
  const moe_dist_setting s[2] = {{"--epochs", 3, NULL}, {"--dtype", 1, "bf16"}};
  ASSERT_OK(moe_dist_agree(NULL, s, 2));
  ASSERT_OK(moe_dist_agree(NULL, NULL, 0));
  ASSERT_STATUS(moe_dist_agree(NULL, NULL, 2), MOE_ERR_ARG);
  ASSERT_STATUS(moe_dist_agree(NULL, s, -1), MOE_ERR_ARG);
}

/* Runs `cmd` (stderr to err_path); the exit status, its stderr in err and how many lines of it hold
 * `want`. */
static int run_ranks(const char *cmd, const char *err_path, char *err, size_t n, const char *want, int *lines) {
  int rc = system(cmd);
  rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  test_read_text(err_path, err, n);
  *lines = 0;
  for (const char *p = err; (p = strstr(p, want)); p += strlen(want)) (*lines)++;
  return rc;
}

/* Writes DIR/<split>-images-idx3-ubyte (n blank side x side images) and its labels (i mod 10). */
static int write_split(const char *dir, const char *split, int n, int side) {
  char p[1100];
  unsigned char hdr[16] = {0, 0, 8, 3, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                           (unsigned char)n, 0, 0, 0, (unsigned char)side, 0, 0, 0, (unsigned char)side};
  size_t ni = 16 + (size_t)n * side * side, nl = 8 + (size_t)n;
  unsigned char *b = calloc(ni + nl, 1), *lab = b + ni;
  if (!b) return 0;
  memcpy(b, hdr, 16);
  memcpy(lab, hdr, 8);
  lab[3] = 1;
  for (int i = 0; i < n; i++) lab[8 + i] = (unsigned char)(i % 10);
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, split);
  int ok = moe_write_file_atomic(p, b, ni) == MOE_OK;
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, split);
  ok = ok && moe_write_file_atomic(p, lab, nl) == MOE_OK;
  free(b);
  return ok;
}

/* moe train with another data set on rank 1: the sizes differ, named once. */
TEST(agree_train_data_sizes) {
  if (!test_have_mpirun()) return;
  char dir[512], errp[512], err[8192], cmd[8192];
  test_tmp_path("agree_data", dir, sizeof dir); /* the synthetic set's sizes, 20 fewer training images */
  mkdir(dir, 0755);
  ASSERT(write_split(dir, "train", 580, 12) && write_split(dir, "t10k", 200, 12));
  test_tmp_path("agree_train_err.txt", errp, sizeof errp);
  const char *args = "train --experts 4 --top-k 2 --hidden 32 --model 32 --batch 50 --threads 1 --epochs 1";
  snprintf(cmd, sizeof cmd, MPIRUN "-np 1 '%s' %s --data '%s' : -np 1 '%s' %s --data '%s' >/dev/null 2>'%s'", MOE_CLI,
           args, synth_data_dir(), MOE_CLI, args, dir, errp);
  int lines, rc = run_ranks(cmd, errp, err, sizeof err,
                            "moe train: the ranks disagree: rank 1 has training images = 580, rank 0 has 600", &lines);
  if (rc == 0 || rc == 124 || lines != 1) FAIL_("exit %d, %d ranks named the difference; stderr:\n%s", rc, lines, err);
}

/* moe layer-run with --backward on rank 1 and --a2a 2dh on rank 2 (a hang and a split that never
 * completes, before): rank 1's difference named once, and that more differ. */
TEST(agree_layer_run_options) {
  if (!test_have_mpirun()) return;
  char w[512], x[512], out[512], errp[512], err[8192], cmd[8192], base[2048];
  snprintf(w, sizeof w, "%s/relu_k2_cap1_index_static/w.safetensors", test_fixture_dir());
  snprintf(x, sizeof x, "%s/relu_k2_cap1_index_static/x.safetensors", test_fixture_dir());
  test_tmp_path("agree_out.safetensors", out, sizeof out);
  test_tmp_path("agree_layer_err.txt", errp, sizeof errp);
  snprintf(base, sizeof base, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --expert-parallel --threads 1",
           MOE_CLI, w, x, out);
  snprintf(cmd, sizeof cmd, MPIRUN "-np 1 %s : -np 1 %s --backward : -np 1 %s --a2a 2dh --ranks-per-node 1 "
           ">/dev/null 2>'%s'", base, base, base, errp);
  int lines, rc = run_ranks(cmd, errp, err, sizeof err,
                            "moe layer-run: the ranks disagree: rank 1 has --backward = 1, rank 0 has 0 (and more "
                            "ranks differ)", &lines);
  if (rc == 0 || rc == 124 || lines != 1) FAIL_("exit %d, %d ranks named the difference; stderr:\n%s", rc, lines, err);
  ASSERT(test_read_file(out, NULL) == NULL);
}

/* Errors under mpirun are printed once and every rank exits non-zero without MPI_Abort: a bad flag and
 * a missing data directory on both ranks (the message alone, once), and data missing on rank 1 only
 * (the message once, naming rank 1). */
TEST(errors_once_under_mpirun) {
  if (!test_have_mpirun()) return;
  char errp[512], err[8192], cmd[8192], none[512];
  test_tmp_path("errors_once_err.txt", errp, sizeof errp);
  test_tmp_path("no_such_data", none, sizeof none);
  const char *args = "train --experts 4 --top-k 2 --hidden 32 --model 32 --batch 50 --threads 1 --epochs 1";
  struct {
    const char *what, *want, *needle; /* the first line, and what the error says (once) */
    char cmd[4096];
  } c[3] = {{"a bad flag", "moe train: --epochs: bad value 'zero'", "bad value", ""},
            {"no data", "moe train: ", "train-images-idx3-ubyte: cannot open", ""},
            {"no data on rank 1", "moe train: rank 1 of 2: ", "train-images-idx3-ubyte: cannot open", ""}};
  snprintf(c[0].cmd, sizeof c[0].cmd, MPIRUN "-np 2 '%s' %s --data '%s' --epochs zero", MOE_CLI, args, synth_data_dir());
  snprintf(c[1].cmd, sizeof c[1].cmd, MPIRUN "-np 2 '%s' %s --data '%s'", MOE_CLI, args, none);
  snprintf(c[2].cmd, sizeof c[2].cmd, MPIRUN "-np 1 '%s' %s --data '%s' : -np 1 '%s' %s --data '%s'", MOE_CLI, args,
           synth_data_dir(), MOE_CLI, args, none);
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "%s >/dev/null 2>'%s'", c[i].cmd, errp);
    int lines, rc = run_ranks(cmd, errp, err, sizeof err, c[i].needle, &lines);
    if (rc == 0 || rc == 124 || lines != 1 || !strstr(err, c[i].want) || strstr(err, "MPI_ABORT") ||
        (i == 1 && strstr(err, "rank 1")))
      FAIL_("%s: exit %d, %d lines with the error (want 1, '%s'); stderr:\n%s", c[i].what, rc, lines, c[i].want, err);
  }
}
