/* --checkpoint, --resume and --trace of `moe train` under mpirun (E = 8 experts over 1, 2 or 4 ranks).
 * What must be equal bit for bit: a 2-rank run of 2 epochs and a 2-rank run of 1 epoch resumed by 2
 * ranks (the same computation); the accuracy rank 0 reports and the one `moe eval` gives from the
 * file a 2-rank run saved (the same weights, gathered). What another rank count changes (the order
 * of sums over ranks) is compared within the one-process tolerance of tests/test_ep.c: resuming that
 * checkpoint with 1 and with 4 ranks follows the 2-rank losses. The trace of a 2-rank run counts the
 * whole batch; a 2-rank file has one process's tensors, dtypes and shapes. */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "compare.h"
#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define ARGS "train --experts 8 --top-k 2 --hidden 32 --model 32 --batch 24 --augment 1 --threads 1 --epochs 2"

/* `[mpirun -np W] moe ARGS` with stdout to out; the exit status, stderr in err. */
static int train_on(int W, const char *args, const char *out, char *err, size_t n) {
  char cmd[4096], errp[512];
  test_tmp_path("ep_ck_err.txt", errp, sizeof errp);
  if (W > 1) snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np %d '%s' %s > '%s' 2>'%s'", W, MOE_CLI, args, out, errp);
  else snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>'%s'", MOE_CLI, args, out, errp);
  int rc = system(cmd);
  test_read_text(errp, err, n);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The per-step losses (--log-steps) and the test accuracy of a run's stdout; how many losses. */
static int read_run(const char *path, double *loss, int max, double *acc) {
  FILE *f = fopen(path, "r");
  char line[256];
  int n = 0;
  *acc = -1;
  while (f && fgets(line, sizeof line, f)) {
    char *p = strstr(line, "\"loss\": ");
    if (!strncmp(line, "{\"step\"", 7) && p && n < max) loss[n++] = atof(p + 8);
    if (!strncmp(line, "test_accuracy=", 14)) *acc = atof(line + 14);
  }
  if (f) fclose(f);
  return n;
}

static int copy_file(const char *from, const char *to) {
  size_t n;
  char *b = test_read_file(from, &n);
  int ok = b && moe_write_file_atomic(to, b, n) == MOE_OK;
  free(b);
  return ok;
}

/* Whether the file of a 2-rank run (two) holds what one process's (one) holds: every tensor, its dtype
 * and whole shape, and after one epoch values within what the ranks' order of sums moves them. */
static int same_format(const char *one, const char *two) {
  moe_st *a = NULL, *b = NULL;
  int same = moe_st_open(&a, one) == MOE_OK && moe_st_open(&b, two) == MOE_OK && moe_st_count(a) == moe_st_count(b);
  for (int i = 0; same && i < moe_st_count(a); i++) {
    moe_tensor_view va, vb;
    same = moe_st_at(a, i, &va) == MOE_OK && moe_st_get(b, va.name, &vb) == MOE_OK && va.dtype == vb.dtype &&
           va.ndim == vb.ndim && va.nbytes == vb.nbytes && !memcmp(va.shape, vb.shape, sizeof(int64_t) * va.ndim);
    if (same && va.dtype == MOE_DT_F32 && strncmp(va.name, "optim.", 6)) /* the moments: too small to compare */
      same = tensors_close(va.name, vb.data, va.data, va.nbytes / 4, 1e-3, 1e-5);
    if (!same) fprintf(stderr, "  tensor %d (%s) differs between one process and two ranks\n", i, va.name);
  }
  moe_st_close(a);
  moe_st_close(b);
  return same;
}

TEST(ep_checkpoint_resume_any_ranks) {
  if (!test_have_mpirun()) return;
  const char *data = synth_data_dir();
  char a[512], b[512], b1[512], b4[512], c1[512], oa[512], ob[512], args[3000], err[4096], acc_txt[256];
  test_tmp_path("ep_a.safetensors", a, sizeof a);
  test_tmp_path("ep_b.safetensors", b, sizeof b);
  test_tmp_path("ep_b1.safetensors", b1, sizeof b1);
  test_tmp_path("ep_b4.safetensors", b4, sizeof b4);
  test_tmp_path("ep_c1.safetensors", c1, sizeof c1);
  test_tmp_path("ep_a.txt", oa, sizeof oa);
  test_tmp_path("ep_b.txt", ob, sizeof ob);
  snprintf(args, sizeof args, ARGS " --data '%s' --log-steps --checkpoint '%s'", data, a);
  if (train_on(2, args, oa, err, sizeof err)) FAIL_("2 ranks, 2 epochs: %s", err);
  double la[64], lb[64], acc_a, acc_b;
  int na = read_run(oa, la, 64, &acc_a), steps = 600 / 24;
  ASSERT_EQ_INT(na, 2 * steps);
  /* rank 0's accuracy of the 2-rank model, and one process's from the gathered file */
  snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s'", a, data);
  if (train_on(1, args, ob, err, sizeof err)) FAIL_("eval: %s", err);
  test_read_text(ob, acc_txt, sizeof acc_txt);
  if (strncmp(acc_txt, "test_accuracy=", 14) || atof(acc_txt + 14) != acc_a)
    FAIL_("2 ranks reported test_accuracy=%.4f, moe eval of their checkpoint says '%s'", acc_a, acc_txt);

  snprintf(args, sizeof args, ARGS " --data '%s' --stop-after 1 --checkpoint '%s'", data, b);
  if (train_on(2, args, ob, err, sizeof err)) FAIL_("2 ranks, epoch 1: %s", err);
  ASSERT(copy_file(b, b1) && copy_file(b, b4));
  snprintf(args, sizeof args, ARGS " --data '%s' --stop-after 1 --checkpoint '%s'", data, c1);
  if (train_on(1, args, ob, err, sizeof err)) FAIL_("1 process, epoch 1: %s", err);
  ASSERT(same_format(c1, b));
  snprintf(args, sizeof args, "train --data '%s' --threads 1 --log-steps --resume '%s'", data, b);
  if (train_on(2, args, ob, err, sizeof err)) FAIL_("2 ranks resuming: %s", err);
  ASSERT(test_same_file(a, b)); /* the same rank count: the same bits */
  int nb = read_run(ob, lb, 64, &acc_b);
  ASSERT_EQ_INT(nb, steps);
  for (int i = 0; i < nb; i++) ASSERT(lb[i] == la[steps + i]);

  const int ranks[2] = {1, 4};
  char *files[2] = {b1, b4};
  for (int k = 0; k < 2; k++) { /* another rank count: each rank keeps its own experts of the file */
    snprintf(args, sizeof args, "train --data '%s' --threads 1 --log-steps --resume '%s'", data, files[k]);
    if (train_on(ranks[k], args, ob, err, sizeof err)) FAIL_("%d ranks resuming a 2-rank checkpoint: %s", ranks[k], err);
    nb = read_run(ob, lb, 64, &acc_b);
    ASSERT_EQ_INT(nb, steps);
    for (int i = 0; i < nb; i++)
      if (fabs(lb[i] - la[steps + i]) > 1e-4)
        FAIL_("step %d: loss %.9g resumed on %d ranks, %.9g on 2", steps + i, lb[i], ranks[k], la[steps + i]);
    ASSERT_NEAR(acc_b, acc_a, 0.006); /* one of the 200 test samples at most */
  }
  /* 3 ranks cannot split 8 experts: said once, every rank exits non-zero */
  snprintf(args, sizeof args, "train --data '%s' --threads 1 --resume '%s'", data, b1);
  ASSERT(train_on(3, args, ob, err, sizeof err) != 0);
  const char *want = "E divisible by the ranks (E=8, W=3)", *at = strstr(err, want);
  if (!at || strstr(at + 1, want)) FAIL_("3 ranks resuming: stderr '%s' (want '%s' once)", err, want);
}

/* --trace under 2 ranks: rank 0 writes the whole batch's counts (B k per step and block). */
TEST(ep_trace_whole_batch) {
  if (!test_have_mpirun()) return;
  char tr[512], out[512], args[3000], err[4096];
  test_tmp_path("ep_trace.csv", tr, sizeof tr);
  test_tmp_path("ep_trace.txt", out, sizeof out);
  snprintf(args, sizeof args, ARGS " --epochs 1 --blocks 2 --data '%s' --trace '%s'", synth_data_dir(), tr);
  if (train_on(2, args, out, err, sizeof err)) FAIL_("2 ranks with --trace: %s", err);
  moe_trace t;
  ASSERT_OK(moe_trace_load(&t, tr, 8));
  int64_t bad = -1, steps = t.steps;
  for (int64_t c = 0; c < t.steps * t.layers && bad < 0; c++) {
    int64_t sum = 0;
    for (int e = 0; e < 8; e++) sum += t.tokens[c * 8 + e];
    if (sum != 24 * 2) bad = c;
  }
  int layers = t.layers;
  moe_trace_free(&t);
  ASSERT_EQ_INT(steps, 600 / 24);
  ASSERT_EQ_INT(layers, 2);
  ASSERT_EQ_INT(bad, -1);
}
