/* `moe train` and `moe eval` end to end on a small synthetic IDX data set (10 classes, each a
 * noisy blob at its own place): the loss falls and accuracy beats chance by far; a run of 2 epochs
 * and a run of 1 epoch resumed for 1 more give the same checkpoint bytes and the same per-step
 * losses; eval reproduces train's accuracy; Ctrl-C leaves the last checkpoint loadable; bad data and
 * bad checkpoints get clear errors. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compare.h"
#include "run_cli.h"
#include "test.h"

#include "synth.h"

/* The accuracy `moe eval` gives for checkpoint ck on data_dir (the same in text and with --json), or -1. */
static double eval_accuracy(const char *ck, const char *data_dir) {
  char args[1200], out[512], err[2048];
  test_tmp_path("eval_out.txt", out, sizeof out);
  double acc[2] = {-1, -2};
  for (int json = 0; json < 2; json++) {
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s'%s", ck, data_dir, json ? " --json" : "");
    if (run_moe(NULL, args, out, err, sizeof err) != 0) {
      fprintf(stderr, "  moe eval: %s\n", err);
      return -1;
    }
    char *e = test_read_file(out, NULL);
    const char *key = json ? "{\"test_accuracy\": " : "test_accuracy=";
    if (e && !strncmp(e, key, strlen(key))) acc[json] = atof(e + strlen(key));
    free(e);
  }
  return acc[0] == acc[1] ? acc[0] : -1;
}

#define SMALL "--experts 4 --top-k 2 --hidden 32 --model 32 --batch 50 --augment 1 --threads 2 --seed 7"

TEST(train_loss_falls_and_beats_chance) {
  const char *data_dir = synth_data_dir();
  char args[3000], out[512], ck[512], err[2048];
  test_tmp_path("train_out.txt", out, sizeof out);
  test_tmp_path("ck_a.safetensors", ck, sizeof ck);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 4 --json --checkpoint '%s'", data_dir, ck);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *txt = test_read_file(out, NULL);
  ASSERT(txt);
  double loss[4] = {0}, acc = 0;
  int ne = 0;
  for (char *l = strtok(txt, "\n"); l; l = strtok(NULL, "\n")) {
    char *p = strstr(l, "\"loss\": ");
    if (p && ne < 4) loss[ne++] = atof(p + 8);
    if (!strncmp(l, "{\"test_accuracy\": ", 18)) acc = atof(l + 18); /* --json: the last line is JSON too */
  }
  free(txt);
  ASSERT_EQ_INT(ne, 4);
  ASSERT(loss[3] < 0.5 * loss[0]);
  ASSERT(acc > 0.6); /* chance is 0.1 */
  ASSERT_NEAR(eval_accuracy(ck, data_dir), acc, 1e-9); /* eval reproduces the accuracy from the checkpoint */
}

/* 2 epochs, and 1 + 1 resumed (with `extra` flags; the second half saving to the file it resumed from,
 * with no --checkpoint): the same checkpoint bytes and per-step losses. */
static void resume_is_bit_exact(const char *extra, int *failed_) {
  const char *data_dir = synth_data_dir();
  char args[3000], ca[512], cb[512], oa[512], ob1[512], ob2[512], err[2048];
  test_tmp_path("res_a.safetensors", ca, sizeof ca);
  test_tmp_path("res_b.safetensors", cb, sizeof cb);
  test_tmp_path("res_a.txt", oa, sizeof oa);
  test_tmp_path("res_b1.txt", ob1, sizeof ob1);
  test_tmp_path("res_b2.txt", ob2, sizeof ob2);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " %s --epochs 2 --log-steps --checkpoint '%s'", data_dir, extra, ca);
  ASSERT_EQ_INT(run_moe(NULL, args, oa, err, sizeof err), 0);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " %s --epochs 2 --stop-after 1 --log-steps --checkpoint '%s'",
           data_dir, extra, cb);
  ASSERT_EQ_INT(run_moe(NULL, args, ob1, err, sizeof err), 0);
  /* no --checkpoint: a resumed run saves to the file it resumed from */
  snprintf(args, sizeof args, "train --data '%s' --threads 2 --resume '%s' --log-steps", data_dir, cb);
  ASSERT_EQ_INT(run_moe(NULL, args, ob2, err, sizeof err), 0);
  ASSERT(strstr(err, "--resume without --checkpoint: saving to"));
  ASSERT(test_same_file(ca, cb));
  /* the per-step losses of the two halves are those of the whole run */
  char *la = test_read_file(oa, NULL), *l1 = test_read_file(ob1, NULL), *l2 = test_read_file(ob2, NULL);
  ASSERT(la && l1 && l2);
  char steps_a[65536] = "", steps_b[65536] = "";
  char *srcs[3] = {la, l1, l2};
  for (int i = 0; i < 3; i++)
    for (char *l = strtok(srcs[i], "\n"); l; l = strtok(NULL, "\n"))
      if (!strncmp(l, "{\"step\"", 7)) {
        strncat(i == 0 ? steps_a : steps_b, l, 200);
        strcat(i == 0 ? steps_a : steps_b, "\n");
      }
  free(la);
  free(l1);
  free(l2);
  ASSERT(strlen(steps_a) > 100);
  ASSERT(!strcmp(steps_a, steps_b));
}

TEST(train_resume_is_bit_exact) { resume_is_bit_exact("", failed_); }

/* The rotation and scaling are kept in the checkpoint: the resumed half, given no flags, draws the
 * same distorted images (values unlike the defaults, so the defaults cannot stand in for them). */
TEST(train_resume_keeps_rotation_and_scaling) { resume_is_bit_exact("--augment-rotate 12.5 --augment-scale 0.22", failed_); }

/* bf16 experts: resumes bit-exactly too (from the fp32 masters), stores the expert matrices as BF16
 * beside their masters, learns, and eval from the checkpoint reproduces train's accuracy. */
TEST(train_bf16) {
  resume_is_bit_exact("--dtype bf16", failed_);
  char ca[512];
  test_tmp_path("res_a.safetensors", ca, sizeof ca);
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, ca));
  ASSERT(tensor_dtype_is(f, "blocks.0.moe.experts.fc1.weight", MOE_DT_BF16) &&
         tensor_dtype_is(f, "master.blocks.0.moe.experts.fc1.weight", MOE_DT_F32));
  ASSERT(moe_st_meta(f, "dtype") && !strcmp(moe_st_meta(f, "dtype"), "bf16"));
  moe_st_close(f);
  double acc = eval_accuracy(ca, synth_data_dir());
  ASSERT(acc > 0.6); /* chance is 0.1 */
  char oa[512];
  test_tmp_path("res_a.txt", oa, sizeof oa);
  char *t = test_read_file(oa, NULL), *line = t ? strstr(t, "test_accuracy=") : NULL;
  double train_acc = line ? atof(line + 14) : -1;
  free(t);
  ASSERT_NEAR(acc, train_acc, 1e-9);
}

TEST(train_interrupt_keeps_checkpoint) {
  const char *data_dir = synth_data_dir();
  char ck[512], args[1500];
  test_tmp_path("ck_int.safetensors", ck, sizeof ck);
  snprintf(args, sizeof args, "--data %s --experts 4 --hidden 32 --model 32 --batch 50 --threads 1 --epochs 100000 "
           "--checkpoint %s", data_dir, ck);
  pid_t pid = fork();
  if (pid == 0) {
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)MOE_CLI;
    argv[n++] = "train";
    for (char *t = strtok(args, " "); t && n < 30; t = strtok(NULL, " ")) argv[n++] = t;
    argv[n] = NULL;
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    execv(MOE_CLI, argv);
    _exit(127);
  }
  struct stat st;
  for (int i = 0; i < 200 && stat(ck, &st) != 0; i++) nanosleep(&(struct timespec){0, 50000000}, NULL);
  nanosleep(&(struct timespec){0, 30000000}, NULL);
  kill(pid, SIGINT);
  int status;
  waitpid(pid, &status, 0);
  ASSERT(WIFEXITED(status));
  ASSERT_EQ_INT(WEXITSTATUS(status), 130);
  moe_model_t m;
  ASSERT_OK(moe_checkpoint_load(ck, &m, NULL, NULL));
  moe_model_free(&m);
}

TEST(train_bad_input) {
  const char *data_dir = synth_data_dir();
  char args[3000], err[2048];
  snprintf(args, sizeof args, "train --data /nonexistent/dir --epochs 1");
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "/nonexistent/dir/train-images-idx3-ubyte"));
  /* a truncated image file */
  char bad[512], cmd[3000];
  test_tmp_path("badsynth", bad, sizeof bad);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/* '%s'/ && truncate -s 1000 '%s/train-images-idx3-ubyte'", bad,
           data_dir, bad, bad);
  ASSERT_EQ_INT(system(cmd), 0);
  snprintf(args, sizeof args, "train --data '%s' --epochs 1", bad);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "train-images-idx3-ubyte") && strstr(err, "truncated"));
  /* a missing, a truncated and a non-checkpoint file for eval and resume */
  const char *cks[3] = {"/nonexistent/ck.safetensors", NULL, NULL};
  char trunc[512], layer[512];
  char good[512];
  test_tmp_path("ck_a.safetensors", good, sizeof good);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 1 --checkpoint '%s'", data_dir, good);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  test_tmp_path("ck_trunc.safetensors", trunc, sizeof trunc);
  snprintf(cmd, sizeof cmd, "head -c 3000 '%s' > '%s'", good, trunc);
  ASSERT_EQ_INT(system(cmd), 0);
  cks[1] = trunc;
  snprintf(layer, sizeof layer, "%s/relu_k2_nonorm_dynamic/w.safetensors", test_fixture_dir());
  cks[2] = layer;
  const char *needles[3] = {"/nonexistent/ck.safetensors", "ck_trunc.safetensors", "not a libmoe checkpoint"};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s'", cks[i], data_dir);
    ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
    if (!strstr(err, needles[i])) FAIL_("eval: '%s' does not mention '%s'", err, needles[i]);
    snprintf(args, sizeof args, "train --data '%s' --resume '%s'", data_dir, cks[i]);
    ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
    if (!strstr(err, needles[i])) FAIL_("resume: '%s' does not mention '%s'", err, needles[i]);
  }
  /* architecture flags with --resume are refused rather than ignored */
  snprintf(args, sizeof args, "train --data '%s' --resume '%s' --experts 8", data_dir, good);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "--resume"));
  /* distortions out of range are named */
  const char *flags[3][2] = {{"--augment-rotate", "91"}, {"--augment-scale", "1"}, {"--augment-rotate", "-5"}};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "train --data '%s' --epochs 1 %s=%s", data_dir, flags[i][0], flags[i][1]);
    ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
    if (!strstr(err, flags[i][0]) || !strstr(err, flags[i][1])) FAIL_("%s %s is not named: %s", flags[i][0], flags[i][1], err);
  }
}

/* --trace: one row per (step, block, expert) with assignments, B * top-k per step and block, written
 * atomically (a killed run's leftover temporary file of the same path is removed). */
/* dir/t10k-* := the last n samples of src's training split (IDX: a 16- or 8-byte header, then samples). */
static int write_tail_split(const char *src, const char *dir, int n) {
  const char *kinds[2] = {"images-idx3-ubyte", "labels-idx1-ubyte"};
  int ok = 1;
  for (int k = 0; k < 2 && ok; k++) {
    char p[700];
    snprintf(p, sizeof p, "%s/train-%s", src, kinds[k]);
    size_t len, head = k ? 8 : 16;
    unsigned char *b = (unsigned char *)test_read_file(p, &len);
    int total = b && len >= head ? b[4] << 24 | b[5] << 16 | b[6] << 8 | b[7] : 0;
    size_t each = total ? (len - head) / (size_t)total : 0;
    snprintf(p, sizeof p, "%s/t10k-%s", dir, kinds[k]);
    FILE *f = total > n ? fopen(p, "wb") : NULL;
    if (f) {
      b[4] = 0, b[5] = 0, b[6] = (unsigned char)(n >> 8), b[7] = (unsigned char)n;
      ok = fwrite(b, 1, head, f) == head && fwrite(b + len - (size_t)n * each, each, (size_t)n, f) == (size_t)n;
      ok = fclose(f) == 0 && ok;
    } else ok = 0;
    free(b);
  }
  return ok;
}

/* --val N trains on all but the last N training samples and reports the accuracy on those: eval of its
 * checkpoint on a test split made of exactly those samples gives the same figure. */
TEST(train_validation_split) {
  const char *data_dir = synth_data_dir();
  char args[3000], out[512], err[2048], ck[512], dir[512], cmd[1200];
  test_tmp_path("train_val_out.txt", out, sizeof out);
  test_tmp_path("ck_val.safetensors", ck, sizeof ck);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 2 --val 150 --checkpoint '%s'", data_dir, ck);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *txt = test_read_file(out, NULL), *v = txt ? strstr(txt, "val_accuracy=") : NULL;
  double acc = v ? atof(v + 13) : -1;
  if (!v || !strstr(txt, "val_acc ") || strstr(txt, "test_acc")) FAIL_("moe train --val printed:\n%s", txt ? txt : "");
  free(txt);
  ASSERT(acc > 0.5);
  test_tmp_path("valsynth", dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/train-* '%s'/", dir, data_dir, dir);
  ASSERT_EQ_INT(system(cmd), 0);
  ASSERT(write_tail_split(data_dir, dir, 150));
  ASSERT_NEAR(eval_accuracy(ck, dir), acc, 1e-9);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 1 --val 600", data_dir);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  if (!strstr(err, "--val 600")) FAIL_("--val larger than the training set: '%s'", err);
}

TEST(train_trace) {
  const char *data_dir = synth_data_dir();
  char args[3000], err[2048], tr[512], stale[600];
  test_tmp_path("train_trace.csv", tr, sizeof tr);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT(dead > 0 && waitpid(dead, NULL, 0) == dead);
  snprintf(stale, sizeof stale, "%s.tmp.%d", tr, (int)dead);
  ASSERT_OK(moe_write_file_atomic(stale, "step,layer", 10));
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --blocks 2 --epochs 1 --trace '%s'", data_dir, tr);
  int rc = run_moe(NULL, args, NULL, err, sizeof err);
  if (rc != 0) FAIL_("moe %s: exit %d: %s", args, rc, err);
  moe_trace t;
  ASSERT_OK(moe_trace_load(&t, tr, 4));
  int64_t steps = t.steps, bad = -1;
  for (int64_t c = 0; c < t.steps * t.layers && bad < 0; c++) {
    int64_t sum = 0;
    for (int e = 0; e < 4; e++) sum += t.tokens[c * 4 + e];
    if (sum != 50 * 2) bad = c;
  }
  int layers = t.layers;
  moe_trace_free(&t);
  ASSERT_EQ_INT(steps, 600 / 50);
  ASSERT_EQ_INT(layers, 2);
  ASSERT_EQ_INT(bad, -1);
  ASSERT(access(stale, F_OK) != 0);
}

/* Test images of another size than training's (issue 21: smaller ones crashed in sgemm, larger ones
 * gave a meaningless accuracy): refused before training, naming both files and sizes. */
TEST(train_test_size_mismatch) {
  const char *data_dir = synth_data_dir();
  const int sides[2] = {4, 16};
  for (int k = 0; k < 2; k++) {
    char dir[512], cmd[3000], args[3000], err[2048], img[700];
    snprintf(cmd, sizeof cmd, "mismatch%d", sides[k]);
    test_tmp_path(cmd, dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/* '%s'/", dir, data_dir, dir);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte", dir); /* 200 blank images, as many as the labels */
    FILE *f = fopen(img, "wb");
    ASSERT(f);
    const unsigned char hdr[16] = {0, 0, 8, 3, 0, 0, 0, 200, 0, 0, 0, (unsigned char)sides[k], 0, 0, 0,
                                   (unsigned char)sides[k]};
    fwrite(hdr, 1, sizeof hdr, f);
    for (int i = 0; i < 200 * sides[k] * sides[k]; i++) fputc(0, f);
    ASSERT_EQ_INT(fclose(f), 0);
    snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 1", dir);
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    char want[64];
    snprintf(want, sizeof want, "t10k-images-idx3-ubyte has %dx%d images", sides[k], sides[k]);
    if (rc != 1 || !strstr(err, want) || !strstr(err, "train-images-idx3-ubyte 12x12"))
      FAIL_("moe %s: exit %d, stderr '%s', want 1, '%s' and 'train-images-idx3-ubyte 12x12'", args, rc, err, want);
  }
}

/* --capacity dynamic: per-expert capacities through RECOMPILE; it trains, reports its recompiles and
 * stalls, and keeps test_accuracy as the last line. */
TEST(train_dynamic_capacity) {
  const char *data_dir = synth_data_dir();
  char args[3000], out[512], err[2048];
  char ck[512];
  test_tmp_path("dyncap.txt", out, sizeof out);
  test_tmp_path("dyncap.safetensors", ck, sizeof ck);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 3 --capacity dynamic --delta-launch 3 --checkpoint '%s'",
           data_dir, ck);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *txt = test_read_file(out, NULL);
  ASSERT(txt);
  char *rec = strstr(txt, "dynamic capacity: "), *last = strstr(txt, "test_accuracy=");
  long recompiles = rec ? strtol(rec + 18, NULL, 10) : -1;
  double acc = last ? atof(last + 14) : 0;
  free(txt);
  ASSERT(recompiles >= 1);
  ASSERT(acc > 0.5);
  /* the checkpoint keeps the capacities (for the training batch; eval's batches scale them): eval
   * reproduces train's accuracy */
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, ck));
  ASSERT(tensor_dtype_is(f, "blocks.0.moe.expert_capacity", MOE_DT_I32));
  ASSERT(moe_st_meta(f, "blocks.0.expert_capacity_tokens") && atoi(moe_st_meta(f, "blocks.0.expert_capacity_tokens")) == 50);
  moe_st_close(f);
  ASSERT_NEAR(eval_accuracy(ck, data_dir), acc, 1e-9);
}

/* --cache-assignments: frac_same is reported from the second epoch on; with thresholds that let it, the
 * trigger turns caching on from the metrics of the first step after the minimum epoch, and the switch
 * lands exactly delta_launch + 1 steps later; training goes on with the cached assignments. */
TEST(train_assignment_caching) {
  const char *data_dir = synth_data_dir();
  char args[3000], out[512], err[2048];
  test_tmp_path("cache.txt", out, sizeof out);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 4 --cache-assignments --cache-on 0 --cache-off 0 "
           "--cache-min-epoch 2 --delta-launch 3 --json", data_dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *txt = test_read_file(out, NULL);
  ASSERT(txt);
  int on_at = -1, first_metric = -1;
  long long from = -2, steps1 = -1;
  for (char *l = strtok(txt, "\n"); l; l = strtok(NULL, "\n")) {
    int ep, cach;
    double fs;
    long long st, fr;
    if (sscanf(l, "{\"epoch\": 1, \"steps\": %lld,", &st) == 1) steps1 = st;
    if (sscanf(l, "{\"epoch\": %d, \"frac_same\": %lf, \"caching\": %d, \"caching_from_step\": %lld}", &ep, &fs,
               &cach, &fr) == 4) {
      if (fs >= 0 && first_metric < 0) first_metric = ep;
      if (cach && on_at < 0) on_at = ep, from = fr;
      if (fs >= 0) ASSERT(fs <= 1.0);
    }
  }
  free(txt);
  ASSERT_EQ_INT(first_metric, 2);
  ASSERT_EQ_INT(on_at, 3); /* decided on epoch 2's frac_same, during epoch 3 */
  ASSERT(steps1 > 10);
  if (from != 2 * steps1 + 4) FAIL_("caching on from step %lld, want %lld", from, 2 * steps1 + 4);
}

/* --progress shows train's and infer's progress lines (rate, ETA) on stderr even though it is not a
 * terminal, while stdout stays JSON lines only; --quiet (given last) silences them. */
TEST(train_infer_progress) {
  const char *data_dir = synth_data_dir();
  char args[3000], out[512], ck[512], err[4096];
  test_tmp_path("progress_out.txt", out, sizeof out);
  test_tmp_path("progress.safetensors", ck, sizeof ck);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 1 --json --progress --checkpoint '%s'", data_dir, ck);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  if (!strstr(err, "epoch 1/1 [====================] 12/12 ") || !strstr(err, " steps/s ETA 0 s loss "))
    FAIL_("no progress line in train's stderr '%s'", err);
  char *txt = test_read_file(out, NULL);
  ASSERT(txt);
  int lines = 0, json = 1;
  for (char *l = strtok(txt, "\n"); l; l = strtok(NULL, "\n")) lines++, json &= l[0] == '{';
  free(txt);
  ASSERT_EQ_INT(lines, 2); /* the epoch's line and the test accuracy */
  ASSERT(json);
  snprintf(args, sizeof args, "infer --checkpoint '%s' --data '%s' --batch 100 --json --progress", ck, data_dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  if (!strstr(err, "infer [====================] ") || !strstr(err, " batches/s ETA 0 s"))
    FAIL_("no progress line in infer's stderr '%s'", err);
  txt = test_read_file(out, NULL);
  ASSERT(txt && txt[0] == '{' && strchr(txt, '\n') == txt + strlen(txt) - 1);
  free(txt);
  snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 1 --progress --quiet", data_dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  if (strstr(err, "steps/s")) FAIL_("--quiet: stderr '%s' has a progress line", err);
}

/* bench/plot_study.py draws capacity_study.sh's figure from `moe train --json` logs: one curve per
 * run, a point per epoch (the log's closing {"test_accuracy": ...} line is not an epoch). */
TEST(plot_study_reads_train_json) {
  const char *data_dir = synth_data_dir();
  char args[3000], dir[512], log[600], svg[600], err[2048], cmd[4096];
  test_tmp_path("study", dir, sizeof dir);
  mkdir(dir, 0755);
  const char *runs[2][2] = {{"1.0", "--dispatch static --capacity 1.0"}, {"dynamic", "--dispatch static --capacity dynamic"}};
  for (int r = 0; r < 2; r++) {
    snprintf(log, sizeof log, "%s/%s.jsonl", dir, runs[r][0]);
    snprintf(args, sizeof args, "train --data '%s' " SMALL " --epochs 3 %s --json", data_dir, runs[r][1]);
    ASSERT_EQ_INT(run_moe(NULL, args, log, err, sizeof err), 0);
  }
  snprintf(svg, sizeof svg, "%s/study.svg", dir);
  snprintf(cmd, sizeof cmd, "python3 '%s/../../bench/plot_study.py' '%s' '%s' > '%s/plot.txt' 2>&1", MOE_FIXTURE_DIR,
           dir, svg, dir);
  int rc = system(cmd);
  if (rc != 0) {
    snprintf(log, sizeof log, "%s/plot.txt", dir);
    char *txt = test_read_file(log, NULL);
    fprintf(stderr, "  %s\n  status %d, output:\n%s\n", cmd, rc, txt ? txt : "(none)");
    free(txt);
    FAIL_("plot_study.py failed");
  }
  char *txt = test_read_file(svg, NULL);
  ASSERT(txt);
  int curves = 0, points = 0;
  for (char *p = strstr(txt, "<polyline points=\""); p; p = strstr(p + 1, "<polyline points=\"")) {
    curves++;
    for (char *q = p + 18; *q && *q != '"'; q++) points += *q == ',';
  }
  free(txt);
  ASSERT_EQ_INT(curves, 2);
  ASSERT_EQ_INT(points, 6); /* 3 epochs each */
}
