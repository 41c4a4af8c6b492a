/* FlexMoE's replicas in training (DESIGN 3.4): under mpirun, `moe train --replicas auto` follows
 * `--replicas off` step by step while placements land (Expand, Shrink, Migrate moving weights and
 * AdamW state between ranks), its checkpoint is the one without replicas, and a run resumes from it
 * with another number of ranks. The policy maker only replicates when its cost model says the copies
 * pay off, which at test sizes needs a long horizon (--replica-horizon); the 2-rank test forces each
 * primitive through the test hook (--replica-ops) instead. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define FLEX_TRAIN "train --top-k 2 --hidden 32 --model 32 --augment 1 --threads 1 --log-steps --epochs 1 "

/* `moe train ARGS EXTRA` on np ranks (1: one process, without mpirun), stdout to out; the exit
 * status, stderr in err. */
static int train_np(int np, const char *args, const char *extra, const char *out, char *err, size_t n) {
  char a[2048], mpi[256];
  snprintf(a, sizeof a, "%s --data '%s' %s", args, synth_data_dir(), extra);
  snprintf(mpi, sizeof mpi, TEST_MPIRUN "-np %d", np);
  return run_moe(np > 1 ? mpi : NULL, a, out, err, n);
}

/* Both runs' per-step losses agree within 1e-4 (at least `min` steps). The runs without replicas are
 * one process's: expert parallelism follows them within the same bound (test_ep.c). */
static void same_losses(const char *a, const char *b, int min, int *failed_) {
  double x[64], y[64];
  int nx = test_read_losses(a, x, 64), ny = test_read_losses(b, y, 64);
  ASSERT(nx >= min);
  ASSERT_EQ_INT(nx, ny);
  for (int i = 0; i < nx; i++)
    if (fabs(x[i] - y[i]) > 1e-4) FAIL_("step %d: loss %.9g without replicas, %.9g with", i, x[i], y[i]);
}

/* The line of out holding `key`, into line (empty when none). */
static void line_with(const char *out, const char *key, char *line, size_t n) {
  FILE *f = fopen(out, "r");
  line[0] = 0;
  while (f && fgets(line, (int)n, f) && !strstr(line, key)) line[0] = 0;
  if (f) fclose(f);
}

/* 2 ranks, E = 4, 3 slots each (rank 0 holds 0 0 1, rank 1 2 2 3): step 3 frees a slot of expert 2 on
 * rank 1 and gives it expert 0 (a copy from rank 0), step 6 swaps expert 1 on rank 0 with expert 0 on
 * rank 1 (1 moves over; rank 0 holds 0 already), step 9 gives rank 0's spare replica of 0 to expert 2.
 * The losses follow the run without replicas, and both checkpoints (weights and AdamW's moments in
 * the one-process layout) agree: no optimizer state was lost on the way. The checkpoint resumes on 4
 * ranks with replicas as the other does in one process. */
TEST(flex_train_2_ranks_forced_moves_follow_off) {
  if (!test_have_mpirun()) return;
  char off[512], on[512], ck_off[512], ck_on[512], extra[1024], err[4096], line[512];
  test_tmp_path("flex_off.txt", off, sizeof off);
  test_tmp_path("flex_on.txt", on, sizeof on);
  test_tmp_path("flex_off.safetensors", ck_off, sizeof ck_off);
  test_tmp_path("flex_on.safetensors", ck_on, sizeof ck_on);
  snprintf(extra, sizeof extra, "--checkpoint '%s'", ck_off);
  ASSERT_EQ_INT(train_np(1, FLEX_TRAIN "--experts 4 --batch 24", extra, off, err, sizeof err), 0);
  snprintf(extra, sizeof extra, "--checkpoint '%s' --replicas auto --replica-ops "
           "3:shrink:2:1,3:expand:0:1,6:migrate:1:0:0:1,9:shrink:0:0,9:expand:2:0", ck_on);
  if (train_np(2, FLEX_TRAIN "--experts 4 --batch 24", extra, on, err, sizeof err)) FAIL_("replicas run: %s", err);
  same_losses(off, on, 20, failed_);
  line_with(on, "replicas: 5 placements", line, sizeof line);
  if (!strstr(line, "(expand 2, shrink 2, migrate 1), 76032 bytes moved")) FAIL_("report: '%s'", line);
  line_with(on, "replicas: 3 slots per rank", line, sizeof line);
  ASSERT(strstr(line, "profiled:") && strstr(line, "expert tokens/s"));
  char args[1200];
  snprintf(args, sizeof args, "compare '%s' '%s' --rtol 1e-4", ck_on, ck_off);
  if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("the checkpoints differ: %s", err);
  char r4[512], r1[512];
  test_tmp_path("flex_r4.txt", r4, sizeof r4);
  test_tmp_path("flex_r1.txt", r1, sizeof r1);
  snprintf(extra, sizeof extra, "--resume '%s' --epochs 2 --replicas auto --slots 2", ck_on);
  if (train_np(4, "train --threads 1 --log-steps", extra, r4, err, sizeof err)) FAIL_("resumed on 4 ranks: %s", err);
  snprintf(extra, sizeof extra, "--resume '%s' --epochs 2", ck_off);
  ASSERT_EQ_INT(train_np(1, "train --threads 1 --log-steps", extra, r1, err, sizeof err), 0);
  same_losses(r1, r4, 20, failed_);
}

/* 4 ranks, E = 8 without the balance loss: the router favours a few experts (balance ratio about 1.9
 * over expert parallelism's blocks), and the policy maker, given a long horizon, may replicate them
 * through RECOMPILE. Whether it does rests on the profiled costs of this moment (a loaded machine's
 * all-reduce latency can make every replica cost more than it saves), and which steps its decisions
 * land at on timing; the losses follow the run without replicas either way, and the report adds up:
 * each Expand comes with a Shrink, and the ratio falls when a placement landed. */
TEST(flex_train_4_ranks_policy_follows_off) {
  if (!test_have_mpirun()) return;
  char off[512], on[512], err[4096], line[512];
  test_tmp_path("flex4_off.txt", off, sizeof off);
  test_tmp_path("flex4_on.txt", on, sizeof on);
  const char *args = FLEX_TRAIN "--experts 8 --batch 48 --aux-weight 0";
  ASSERT_EQ_INT(train_np(1, args, "", off, err, sizeof err), 0);
  if (train_np(4, args, "--replicas auto --replica-horizon 100000", on, err, sizeof err)) FAIL_("replicas: %s", err);
  same_losses(off, on, 12, failed_);
  line_with(on, "placements (expand", line, sizeof line);
  long long placements = 0, expands = 0, shrinks = -1;
  double with = 0, without = 0;
  if (sscanf(line, "replicas: %lld placements (expand %lld, shrink %lld", &placements, &expands, &shrinks) != 3 ||
      !strstr(line, "without replicas"))
    FAIL_("report: '%s'", line);
  sscanf(strstr(line, "mean "), "mean %lf", &with);
  sscanf(strstr(line, "without replicas "), "without replicas %lf", &without);
  ASSERT_NEAR(without, 1.93, 0.05);
  if (shrinks != expands || (placements > 0 ? with >= without : with != without)) FAIL_("report: '%s'", line);
}

/* A forced operation that does not apply is refused at start-up, naming it. */
TEST(flex_train_rejects_bad_replica_ops) {
  if (!test_have_mpirun()) return;
  char err[4096];
  const char *args = FLEX_TRAIN "--experts 4 --batch 24";
  ASSERT_EQ_INT(train_np(2, args, "--replicas auto --replica-ops 3:shrink:2:1,3:expand:0:1,4:expand:1:0", NULL, err,
                         sizeof err), 1);
  if (!strstr(err, "replica operation 3 (at step 4): flex expand: expert 1 to rank 0, which has no free slot"))
    FAIL_("stderr: %s", err);
}

/* The layer refuses replicas where the replica transport does not go: static dispatch, micro-batches,
 * fewer slots than a rank's share of the experts. */
TEST(flex_layer_rejects_what_replicas_do_not_support) {
  moe_dist *d;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 4, c.H = 4, c.E = 4, c.dist = d, c.replica_slots = 5;
  moe_layer_t l;
  c.dispatch = MOE_DISPATCH_STATIC;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "replica_slots 5 needs E_v >= E/W (E=4, W=1), dynamic dispatch and pipeline 1"));
  c.dispatch = MOE_DISPATCH_DYNAMIC, c.pipeline = 2;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  c.pipeline = 1, c.replica_slots = 3;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  c.replica_slots = -1;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  moe_dist_finalize(d);
}
