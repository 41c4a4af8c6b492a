/* moe train --task lm under mpirun: the MoE layers expert-parallel, the rest data-parallel, each rank
 * a slice of every batch; its per-step losses are one process's. SKIP without mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
