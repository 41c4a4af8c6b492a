/* moe train --task lm under mpirun: the MoE layers expert-parallel (or sharded, --parallel-r), the rest
 * data-parallel, each rank a slice of every batch; its per-step losses are one process's. SKIP without
 * mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "lm_corpus.h"
#include "run_cli.h"
#include "test.h"

/* The losses of the --log-steps lines of text into v (at most n); their count. */
static int step_losses(const char *text, double *v, int n) {
  char lines[8192] = "";
  step_lines(text, lines, sizeof lines);
  int k = 0;
  for (const char *p = lines; k < n && (p = strstr(p, "\"loss\": ")); p++) v[k++] = strtod(p + 8, NULL);
  return k;
}

/* 2 ranks (2 of the 4 experts each, 2 of the 4 windows each) against one process, with dynamic and
 * with static dispatch: every step's loss within 1e-4. */
TEST(train_lm_expert_parallel_follows_one_process) {
  if (!test_have_mpirun()) return;
  static const char *const modes[] = {"", "--capacity 0.75 --dispatch static"};
  for (int i = 0; i < 2; i++) {
    char args[2048], one[512], two[512], err[4096];
    snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --layers 2 %s --json --log-steps",
             lm_corpus(), modes[i]);
    test_tmp_path("lm_ep1.jsonl", one, sizeof one);
    test_tmp_path("lm_ep2.jsonl", two, sizeof two);
    if (run_moe(NULL, args, one, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    if (run_moe(TEST_MPIRUN "-np 2", args, two, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    char *a = test_read_file(one, NULL), *b = test_read_file(two, NULL);
    ASSERT(a && b);
    double la[64], lb[64];
    int na = step_losses(a, la, 64), nb = step_losses(b, lb, 64);
    free(a);
    free(b);
    if (na != 40 || nb != 40) FAIL_("'%s': %d and %d step losses, want 40 each", modes[i], na, nb);
    for (int s = 0; s < 40; s++)
      if (!(fabs(la[s] - lb[s]) <= 1e-4))
        FAIL_("'%s': step %d loss %.8f with 2 ranks, %.8f in one process", modes[i], s + 1, lb[s], la[s]);
  }
}

/* moe train --task lm with args (under mpirun -np 2 when mpi): its step losses (*n), its valid_loss
 * lines (*nv) and its exit status; its stderr in err. */
static int lm_run(int mpi, const char *args, double *loss, int *n, double *valid, int *nv, char *err, size_t en) {
  char out[512], full[2048];
  test_tmp_path("lm_pr.jsonl", out, sizeof out);
  snprintf(full, sizeof full, "train --task lm --data '%s' --json --log-steps %s", lm_corpus(), args);
  int rc = run_moe(mpi ? TEST_MPIRUN "-np 2" : NULL, full, out, err, en);
  char *text = test_read_file(out, NULL);
  *n = text ? step_losses(text, loss, 64) : 0;
  *nv = text ? valid_losses(text, valid, 8) : 0;
  free(text);
  return rc;
}

/* The checkpoint dir's validation loss in one process (moe eval --task lm). */
static double lm_eval_valid(const char *dir) {
  char args[2048], res[512], text[1024];
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --split valid --threads 1 --json", dir,
           lm_corpus());
  if (run_moe(NULL, args, test_tmp_path("lm_pr_eval.json", res, sizeof res), NULL, 0)) return NAN;
  test_read_text(res, text, sizeof text);
  return json_num(text, "valid_loss");
}

/* --parallel-r (Tutel's sharded layout: every rank a slice of each expert's H) with 2 ranks and 4
 * experts: r = 0 (stopped after 10 steps, resumed with r switching 1, 2), r = 2 (clipped to 1) over 2DH,
 * and r switching 0, 1, 2 at every step each follow one process within 1e-4 per step; the checkpoints
 * the sharded ranks write (the one-process format) give one process the validation loss the training
 * reported. */
TEST(train_lm_parallel_r_follows_one_process) {
  if (!test_have_mpirun()) return;
  char ck[512], args[1024], err[4096];
  test_tmp_path("lm_pr_ck", ck, sizeof ck);
  double one[64], got[64], v[8], rest[64];
  int n1, n, nv, nr;
  ASSERT_EQ_INT(lm_run(0, LM_TINY " --steps 20", one, &n1, v, &nv, err, sizeof err), 0);
  ASSERT_EQ_INT(n1, 20);
  snprintf(args, sizeof args, LM_TINY " --steps 20 --stop-after 10 --parallel-r 0 --checkpoint '%s'", ck);
  if (lm_run(1, args, got, &n, v, &nv, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  ASSERT(n == 10 && nv == 2); /* the report at step 10 and the last line */
  double ev = lm_eval_valid(ck);
  if (!(fabs(ev - v[0]) <= 1e-6))
    FAIL_("r = 0 checkpoint: eval's valid_loss %.6f, the training reported %.6f", ev, v[0]);
  snprintf(args, sizeof args, "--resume '%s' --parallel-r 1,2 --threads 1", ck);
  if (lm_run(1, args, rest, &nr, v, &nv, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  ASSERT(nr == 10 && nv == 2);
  ev = lm_eval_valid(ck);
  if (!(fabs(ev - v[0]) <= 1e-6))
    FAIL_("resumed checkpoint: eval's valid_loss %.6f, the training reported %.6f", ev, v[0]);
  memcpy(got + 10, rest, 10 * sizeof *rest);
  static const char *const runs[] = {"", "--parallel-r 2 --a2a 2dh --ranks-per-node 1", "--parallel-r 0,1,2"};
  for (int r = 0; r < 3; r++) {
    const char *what = r ? runs[r] : "--parallel-r 0, resumed with --parallel-r 1,2";
    if (r) {
      snprintf(args, sizeof args, LM_TINY " --steps 20 %s", runs[r]);
      if (lm_run(1, args, got, &n, v, &nv, err, sizeof err)) FAIL_("moe %s: %s", args, err);
      ASSERT_EQ_INT(n, 20);
    }
    for (int s = 0; s < 20; s++)
      if (!(fabs(got[s] - one[s]) <= 1e-4))
        FAIL_("%s: step %d loss %.8f with 2 ranks, %.8f in one process", what, s + 1, got[s], one[s]);
  }
}

/* gpt-oss (router and expert biases, the clamped SwiGLU, sinks; without and with its balance loss,
 * whose sums are over both ranks' tokens) with 2 ranks, 2 of the 4 experts each: stopped at step 10
 * with a checkpoint (the stacked expert tensors gathered from both ranks), which `moe eval` in one
 * process scores as the training reported, and resumed by 2 ranks (each reading its rows of them, the
 * loss's weight from config.json): every step's loss within 1e-4 of one process's. */
TEST(train_lm_gpt_oss_expert_parallel_follows_one_process) {
  if (!test_have_mpirun()) return;
  double without[64] = {0};
  for (int aux = 0; aux < 2; aux++) {
    char ck[512], args[2048], err[4096], arch[512];
    test_tmp_path(aux ? "lm_oss_aux_ck" : "lm_oss_ck", ck, sizeof ck);
    double one[64], got[64], v[8];
    int n1, n, nv;
    snprintf(arch, sizeof arch, LM_TINY " --steps 20 --layers 2 --family gpt_oss%s", aux ? " --aux-weight 0.5" : "");
    ASSERT_EQ_INT(lm_run(0, arch, one, &n1, v, &nv, err, sizeof err), 0);
    ASSERT_EQ_INT(n1, 20);
    snprintf(args, sizeof args, "%s --stop-after 10 --checkpoint '%s'", arch, ck);
    if (lm_run(1, args, got, &n, v, &nv, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    ASSERT(n == 10 && nv == 2);
    double ev = lm_eval_valid(ck);
    if (!(fabs(ev - v[0]) <= 1e-6)) FAIL_("checkpoint of 2 ranks: eval's valid_loss %.6f, training's %.6f", ev, v[0]);
    snprintf(args, sizeof args, "--resume '%s' --threads 1", ck);
    if (lm_run(1, args, got + 10, &n, v, &nv, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
    ASSERT_EQ_INT(n, 10);
    for (int s = 0; s < 20; s++)
      if (!(fabs(got[s] - one[s]) <= 1e-4))
        FAIL_("%s: step %d loss %.8f with 2 ranks, %.8f in one process", arch, s + 1, got[s], one[s]);
    if (!aux) memcpy(without, one, sizeof without);
    else if (one[19] == without[19]) FAIL_("--aux-weight 0.5 changed nothing: step 20 loss %.8f", one[19]);
  }
}

/* More ranks than experts (W = 2, E = 1: the plain expert parallelism cannot run): r switching 0, 1, 2
 * (2: each rank half of the expert's H) with --a2a auto follows one process within 1e-4 per step. */
TEST(train_lm_parallel_r_more_ranks_than_experts) {
  if (!test_have_mpirun()) return;
  char err[4096];
  double one[64], got[64], v[8];
  int n1, n, nv;
  const char *arch = LM_TINY " --steps 20 --experts 1 --top-k 1", *flags = " --parallel-r 0,1,2 --a2a auto";
  char args[1024];
  ASSERT_EQ_INT(lm_run(0, arch, one, &n1, v, &nv, err, sizeof err), 0);
  snprintf(args, sizeof args, "%s%s", arch, flags);
  if (lm_run(1, args, got, &n, v, &nv, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  ASSERT(n1 == 20 && n == 20);
  for (int s = 0; s < 20; s++)
    if (!(fabs(got[s] - one[s]) <= 1e-4))
      FAIL_("step %d loss %.8f with 2 ranks (%s), %.8f in one process", s + 1, got[s], flags, one[s]);
}

/* Ranks given different --parallel-r stop at start-up with a message naming it (each would run another
 * exchange otherwise). */
TEST(train_lm_parallel_r_ranks_disagree) {
  if (!test_have_mpirun()) return;
  char errp[512], err[8192], cmd[4096], base[1024];
  snprintf(base, sizeof base, "'%s' train --task lm --data '%s' " LM_TINY " --steps 5", MOE_CLI, lm_corpus());
  test_tmp_path("lm_pr_agree_err.txt", errp, sizeof errp);
  snprintf(cmd, sizeof cmd, TEST_MPI_ENV "timeout -k 5 120 mpirun --oversubscribe -np 1 %s --parallel-r 0 : -np 1 %s "
           "--parallel-r 1 >/dev/null 2>'%s'", base, base, errp);
  int rc = system(cmd);
  rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  test_read_text(errp, err, sizeof err);
  if (rc == 0 || rc == 124 || !strstr(err, "moe train: the ranks disagree: rank 1 has --parallel-r"))
    FAIL_("exit %d; want a message naming --parallel-r; stderr:\n%s", rc, err);
}
