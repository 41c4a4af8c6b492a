/* FlexMoE's replicas in training (DESIGN 3.4): under mpirun, `moe train --replicas auto` follows
 * `--replicas off` step by step for 200 steps while placements land (Expand, Shrink, Migrate moving
 * weights and AdamW state between ranks), its checkpoint is the one without replicas with the placement
 * beside it, a run resumed on as many ranks takes that placement back, and one on another number of
 * ranks starts from expert parallelism's blocks. The policy maker only replicates when its cost model
 * says the copies pay off, which at test sizes needs a long horizon (--replica-horizon); the 200-step
 * tests force each primitive through the test hook (--replica-ops) instead. The model is tiny (D = H
 * = 8) so that 200 steps take a second or two. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_cli.h"
#include "synth.h"
#include "test.h"

#define FLEX_TRAIN "train --top-k 2 --hidden 32 --model 32 --augment 1 --threads 1 --log-steps --epochs 1 "
#define FLEX_TINY "train --top-k 2 --hidden 8 --model 8 --augment 1 --threads 1 --log-steps "
#define MAX_STEPS 256

/* `moe train ARGS EXTRA` on np ranks (1: one process, without mpirun), stdout to out; the exit
 * status, stderr in err. */
static int train_np(int np, const char *args, const char *extra, const char *out, char *err, size_t n) {
  char a[2048], mpi[256];
  snprintf(a, sizeof a, "%s --data '%s' %s", args, synth_data_dir(), extra);
  snprintf(mpi, sizeof mpi, TEST_MPIRUN "-np %d", np);
  return run_moe(np > 1 ? mpi : NULL, a, out, err, n);
}

/* b's per-step losses agree within 1e-4 with a's from step `from` on (b has at least `min` steps,
 * and a as many from `from`). The runs without replicas are one process's: expert parallelism
 * follows them within the same bound (test_ep.c). */
static void same_losses_from(const char *a, int from, const char *b, int min, int *failed_) {
  double x[MAX_STEPS], y[MAX_STEPS];
  int nx = test_read_losses(a, x, MAX_STEPS), ny = test_read_losses(b, y, MAX_STEPS);
  if (ny < min || nx - from != ny) {
    char *text = test_read_file(b, NULL);
    FAIL_("%d steps in %s (from step %d of %d in %s), at least %d wanted; its output:\n%s", ny, b, from, nx, a, min,
          text ? text : "(none)");
    free(text);
    return;
  }
  for (int i = 0; i < ny; i++)
    if (fabs(x[from + i] - y[i]) > 1e-4)
      FAIL_("step %d: loss %.9g in %s, %.9g in %s", from + i, x[from + i], a, y[i], b);
}

static void same_losses(const char *a, const char *b, int min, int *failed_) { same_losses_from(a, 0, b, min, failed_); }

/* The line of out holding `key`, into line (empty when none). */
static void line_with(const char *out, const char *key, char *line, size_t n) {
  FILE *f = fopen(out, "r");
  line[0] = 0;
  while (f && fgets(line, (int)n, f) && !strstr(line, key)) line[0] = 0;
  if (f) fclose(f);
}

/* The placement out reports after `key` ("placement at the start " or "... end "), into p. */
static void placement(const char *out, const char *key, char *p, size_t n) {
  char line[1024];
  line_with(out, key, line, sizeof line);
  const char *at = strstr(line, key);
  snprintf(p, n, "%s", at ? at + strlen(key) : "");
  p[strcspn(p, "\n")] = 0;
}

/* 2 ranks, E = 4, 3 slots each (rank 0 holds 0 0 1, rank 1 2 2 3): step 3 frees a slot of expert 2 on
 * rank 1 and gives it expert 0 (a copy from rank 0), step 6 swaps expert 1 on rank 0 with expert 0 on
 * rank 1 (1 moves over; rank 0 holds 0 already), step 9 gives rank 0's spare replica of 0 to expert 2.
 * Over 200 steps the losses follow the run without replicas, and both checkpoints (weights and AdamW's
 * moments in the one-process layout) agree: no optimizer state was lost on the way. */
#define OPS_2 "3:shrink:2:1,3:expand:0:1,6:migrate:1:0:0:1,9:shrink:0:0,9:expand:2:0"
TEST(flex_train_2_ranks_forced_moves_follow_off) {
  if (!test_have_mpirun()) return;
  char off[512], on[512], ck_off[512], ck_on[512], extra[1024], err[4096], line[512];
  test_tmp_path("flex_off.txt", off, sizeof off);
  test_tmp_path("flex_on.txt", on, sizeof on);
  test_tmp_path("flex_off.safetensors", ck_off, sizeof ck_off);
  test_tmp_path("flex_on.safetensors", ck_on, sizeof ck_on);
  snprintf(extra, sizeof extra, "--checkpoint '%s'", ck_off);
  ASSERT_EQ_INT(train_np(1, FLEX_TINY "--experts 4 --batch 24 --epochs 8", extra, off, err, sizeof err), 0);
  snprintf(extra, sizeof extra, "--checkpoint '%s' --replicas auto --replica-ops " OPS_2, ck_on);
  if (train_np(2, FLEX_TINY "--experts 4 --batch 24 --epochs 8", extra, on, err, sizeof err))
    FAIL_("replicas run: %s", err);
  same_losses(off, on, 200, failed_);
  line_with(on, "replicas: 5 placements", line, sizeof line);
  if (!strstr(line, "(expand 2, shrink 2, migrate 1), 5184 bytes moved") ||
      !strstr(line, "placement at the end 2x3:0,0,2,2,1,3"))
    FAIL_("report: '%s'", line);
  line_with(on, "replicas: 3 slots per rank", line, sizeof line);
  ASSERT(strstr(line, "profiled:") && strstr(line, "expert tokens/s"));
  char args[1200];
  snprintf(args, sizeof args, "compare '%s' '%s' --rtol 1e-4", ck_on, ck_off);
  if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("the checkpoints differ: %s", err);
}

/* The checkpoint keeps the placement: a 2-rank run stopped after the forced moves of the test above
 * (epoch 1 of 2) resumes on 2 ranks with the placement it ended with, on 4 ranks from expert
 * parallelism's blocks (another number of ranks redistributes the experts; --slots by default one
 * spare), and both follow the uninterrupted run step by step (one process's: the replicas follow it). */
TEST(flex_train_resume_keeps_placement) {
  if (!test_have_mpirun()) return;
  char full[512], first[512], r2[512], r4[512], ck[512], ck2[512], extra[1400], err[4096], end[512], start[512];
  test_tmp_path("flex_full.txt", full, sizeof full);
  test_tmp_path("flex_first.txt", first, sizeof first);
  test_tmp_path("flex_resumed2.txt", r2, sizeof r2);
  test_tmp_path("flex_resumed4.txt", r4, sizeof r4);
  test_tmp_path("flex_stopped.safetensors", ck, sizeof ck);
  test_tmp_path("flex_resumed2.safetensors", ck2, sizeof ck2); /* a resumed run saves; ck stays for the next */
  const char *args = FLEX_TINY "--experts 4 --batch 24 --epochs 2 --replicas auto --replica-ops " OPS_2;
  ASSERT_EQ_INT(train_np(1, FLEX_TINY "--experts 4 --batch 24 --epochs 2", "", full, err, sizeof err), 0);
  snprintf(extra, sizeof extra, "--stop-after 1 --checkpoint '%s'", ck);
  if (train_np(2, args, extra, first, err, sizeof err)) FAIL_("first epoch: %s", err);
  placement(first, "placement at the end ", end, sizeof end);
  ASSERT(!strcmp(end, "2x3:0,0,2,2,1,3"));
  snprintf(extra, sizeof extra, "--resume '%s' --replicas auto --checkpoint '%s'", ck, ck2);
  if (train_np(2, "train --threads 1 --log-steps", extra, r2, err, sizeof err)) FAIL_("resumed on 2 ranks: %s", err);
  placement(r2, "placement at the start ", start, sizeof start);
  if (strcmp(start, end)) FAIL_("resumed on 2 ranks with placement '%s', the checkpoint's is '%s'", start, end);
  same_losses_from(full, 25, r2, 25, failed_);
  snprintf(extra, sizeof extra, "--resume '%s' --replicas auto --checkpoint '%s'", ck, ck2);
  if (train_np(4, "train --threads 1 --log-steps", extra, r4, err, sizeof err)) FAIL_("resumed on 4 ranks: %s", err);
  placement(r4, "placement at the start ", start, sizeof start);
  if (strcmp(start, "4x2:0,0,1,1,2,2,3,3")) FAIL_("resumed on 4 ranks with placement '%s'", start);
  same_losses_from(full, 25, r4, 25, failed_);
}

/* 4 ranks, E = 8, 3 slots each (rank g holds 2g 2g 2g+1): the moves of the 2-rank test on ranks 0 and
 * 1, then rank 2 gives a replica of 4 to expert 7 (a copy from rank 3) and swaps 5 with a 6 of rank
 * 3; 200 steps follow the run without replicas. */
TEST(flex_train_4_ranks_forced_moves_follow_off) {
  if (!test_have_mpirun()) return;
  char off[512], on[512], err[4096], line[512];
  test_tmp_path("flex4f_off.txt", off, sizeof off);
  test_tmp_path("flex4f_on.txt", on, sizeof on);
  const char *args = FLEX_TINY "--experts 8 --batch 24 --epochs 8";
  ASSERT_EQ_INT(train_np(1, args, "", off, err, sizeof err), 0);
  if (train_np(4, args, "--replicas auto --replica-ops " OPS_2 ",12:shrink:4:2,12:expand:7:2,15:migrate:5:2:6:3",
               on, err, sizeof err))
    FAIL_("replicas: %s", err);
  same_losses(off, on, 200, failed_);
  line_with(on, "replicas: 8 placements", line, sizeof line);
  if (!strstr(line, "(expand 3, shrink 3, migrate 2)")) FAIL_("report: '%s'", line);
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

/* A checkpoint whose placement names an expert the model does not have, or leaves an expert without a
 * replica, is refused on resume with the file, the block and the slot, not loaded into a wrong layout. */
TEST(flex_train_rejects_a_bad_placement) {
  if (!test_have_mpirun()) return;
  static const char *const bad[][2] = {
      {"2x3:0,0,7,2,2,3", "replica placement of block 0, slot 2: bad entry at '7,2,2,3'"},
      {"2x3:0,0,0,2,2,3", "replica placement of block 0: flex table: expert 1 has no replica"},
  };
  moe_model_config c;
  moe_model_config_default(&c);
  c.in_dim = 144, c.classes = 10, c.moe.D = 8, c.moe.H = 8, c.moe.E = 4, c.moe.top_k = 2;
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_model_t m;
  moe_optim_t o;
  ASSERT_OK(moe_model_init(&m, &c));
  ASSERT_OK(moe_optim_init(&o, &oc, &m));
  moe_model_init_params(&m, 1);
  for (int i = 0; i < 2; i++) {
    char ck[512], extra[700], err[4096];
    test_tmp_path("flex_bad_placement.safetensors", ck, sizeof ck);
    moe_train_state ts = {.epoch = 1, .step = 25, .seed = 1};
    snprintf(ts.extra, sizeof ts.extra, "epochs=2;batch=24;warmup=0;augment=1;lr=0.001;replicas=%s", bad[i][0]);
    ASSERT_OK(moe_checkpoint_save(ck, &m, &o, &ts));
    snprintf(extra, sizeof extra, "--resume '%s' --replicas auto", ck);
    ASSERT_EQ_INT(train_np(2, "train --threads 1", extra, NULL, err, sizeof err), 1);
    if (!strstr(err, "flex_bad_placement.safetensors") || !strstr(err, bad[i][1])) FAIL_("placement %s: %s", bad[i][0], err);
  }
  moe_optim_free(&o);
  moe_model_free(&m);
}
