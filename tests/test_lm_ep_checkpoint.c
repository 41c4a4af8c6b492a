/* The language model's checkpoints, eval and generate under mpirun (2 ranks, 2 of the 4 experts
 * each), against one process: a 2-rank run stopped at step 20 and resumed by 2 ranks logs one
 * process's uninterrupted losses (within the 1e-4 of tests/test_train_lm_ep.c), and so does one
 * process resuming it (the file holds every expert and every expert's Adam moments); `moe eval` and greedy `moe generate` on 2 ranks give one process's loss and tokens
 * from that checkpoint. SKIP without mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_corpus.h"
#include "run_cli.h"
#include "test.h"

#define MPI2 TEST_MPIRUN "-np 2"

/* The losses of the --log-steps lines of the files a and b, one after the other, into v (at most n). */
static int losses_of(const char *a, const char *b, double *v, int n) {
  char lines[8192] = "";
  char *ta = test_read_file(a, NULL), *tb = b ? test_read_file(b, NULL) : NULL;
  if (ta) step_lines(ta, lines, sizeof lines);
  if (tb) step_lines(tb, lines, sizeof lines);
  free(ta);
  free(tb);
  int k = 0;
  for (const char *p = lines; k < n && (p = strstr(p, "\"loss\": ")); p++) v[k++] = strtod(p + 8, NULL);
  return k;
}

/* Every loss of got within 1e-4 of want's (40 of each); 0 after printing the first that is not. */
static int follows(const char *what, const double *want, const double *got, int ngot) {
  if (ngot != 40) return fprintf(stderr, "  %s: %d step losses, want 40\n", what, ngot), 0;
  for (int s = 0; s < 40; s++)
    if (!(fabs(want[s] - got[s]) <= 1e-4))
      return fprintf(stderr, "  %s: step %d loss %.8f, one process %.8f\n", what, s + 1, got[s], want[s]), 0;
  return 1;
}

/* The number after key in file path's text; NAN when none. */
static double num_in(const char *path, const char *key) {
  char text[4096];
  test_read_text(path, text, sizeof text);
  return json_num(text, key);
}

TEST(lm_expert_parallel_checkpoint_eval_generate) {
  if (!test_have_mpirun()) return;
  char one[512], ck1[512], ck2[512], p1[512], p2[512], q2[512], args[3000], err[4096], a[512], b[512];
  const char *corpus = lm_corpus();
  test_tmp_path("lm_epck_one.jsonl", one, sizeof one);
  test_tmp_path("lm_epck_one", ck1, sizeof ck1);
  test_tmp_path("lm_epck_two", ck2, sizeof ck2);
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --checkpoint '%s' --json --log-steps", corpus,
           ck1);
  if (run_moe(NULL, args, one, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  snprintf(args, sizeof args,
           "train --task lm --data '%s' " LM_TINY " --checkpoint '%s' --stop-after 20 --json --log-steps", corpus, ck2);
  if (run_moe(MPI2, args, test_tmp_path("lm_epck_p1.jsonl", p1, sizeof p1), err, sizeof err))
    FAIL_("mpirun -np 2 moe %s: %s", args, err);
  /* the 2-rank checkpoint resumed by one process, then (copied first) by 2 ranks */
  char ck3[512], cmd[2048];
  test_tmp_path("lm_epck_copy", ck3, sizeof ck3);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", ck3, ck2, ck3);
  ASSERT_EQ_INT(system(cmd), 0);
  snprintf(args, sizeof args, "train --task lm --resume '%s' --data '%s' --threads 1 --json --log-steps", ck3, corpus);
  if (run_moe(NULL, args, test_tmp_path("lm_epck_q2.jsonl", q2, sizeof q2), err, sizeof err))
    FAIL_("moe %s: %s", args, err);
  snprintf(args, sizeof args, "train --task lm --resume '%s' --data '%s' --threads 1 --json --log-steps", ck2, corpus);
  if (run_moe(MPI2, args, test_tmp_path("lm_epck_p2.jsonl", p2, sizeof p2), err, sizeof err))
    FAIL_("mpirun -np 2 moe %s: %s", args, err);
  double want[64], two[64], mixed[64];
  int nw = losses_of(one, NULL, want, 64), nt = losses_of(p1, p2, two, 64), nm = losses_of(p1, q2, mixed, 64);
  ASSERT_EQ_INT(nw, 40);
  ASSERT(follows("2 ranks, stopped and resumed by 2 ranks", want, two, nt));
  ASSERT(follows("2 ranks, stopped and resumed by one process", want, mixed, nm));
  /* eval and greedy generate from the finished 2-rank checkpoint: one process's answers */
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --threads 1 --json", ck2, corpus);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_epck_e1.json", a, sizeof a), err, sizeof err), 0);
  if (run_moe(MPI2, args, test_tmp_path("lm_epck_e2.json", b, sizeof b), err, sizeof err))
    FAIL_("mpirun -np 2 moe %s: %s", args, err);
  double l1 = num_in(a, "test_loss"), l2 = num_in(b, "test_loss");
  if (!(l1 > 0 && fabs(l1 - l2) <= 1e-5)) FAIL_("test loss %.8f on 2 ranks, %.8f in one process", l2, l1);
  snprintf(args, sizeof args,
           "generate --checkpoint '%s' --prompt 'the cat' --max-tokens 10 --temperature 0 --threads 1 --json", ck2);
  ASSERT_EQ_INT(run_moe(NULL, args, a, err, sizeof err), 0);
  if (run_moe(MPI2, args, b, err, sizeof err)) FAIL_("mpirun -np 2 moe %s: %s", args, err);
  char g1[4096], g2[4096];
  test_read_text(a, g1, sizeof g1);
  test_read_text(b, g2, sizeof g2);
  char *t1 = strstr(g1, ",\"prompt_seconds\""), *t2 = strstr(g2, ",\"prompt_seconds\"");
  if (t1) *t1 = 0; /* the times differ */
  if (t2) *t2 = 0;
  if (!t1 || !t2 || strcmp(g1, g2) || !strstr(g1, "\"ids\":[")) FAIL_("generate on 2 ranks printed %s, one process %s", g2, g1);
}
