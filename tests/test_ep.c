/* Expert parallelism end to end: `moe layer-run --expert-parallel` under `mpirun -np W` (W = 2, 4;
 * oversubscribed) writes the same OUT as one process, within 1e-5 relative, for y, the losses, the
 * counts and every gradient; W = 1 runs the same code path without mpirun. Skipped with a message
 * where the library has no MPI or mpirun is missing. Open MPI keeps allocations until exit, so the
 * mpirun runs turn LeakSanitizer off; the W = 1 run, which does not start MPI, keeps it on. */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compare.h"
#include "run_cli.h"
#include "synth.h"
#include "test.h"


static int sh(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* A layer file with E = 8 experts (so W = 1, 2, 4 divide it) and an input with dy, daux, dz. */
static int make_case(const char *w, const char *x, moe_act act, int k, moe_dispatch disp, moe_priority prio) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 12; c.H = 20; c.E = 8; c.top_k = k; c.act = act; c.dispatch = disp; c.priority = prio;
  c.capacity_setting = 1.0f; /* static: some assignments are dropped */
  c.swiglu_limit = 0.5f;      /* swiglu_oai: values clamp */
  moe_layer_t l;
  if (moe_layer_init(&l, &c)) return 0;
  moe_layer_init_params(&l, 17);
  float *g = moe_layer_param(&l, "gate.weight");
  for (int i = 0; i < c.E * c.D; i++) g[i] *= 3.0f; /* uneven routing */
  moe_st_writer *wr;
  int ok = moe_st_writer_new(&wr) == MOE_OK && moe_layer_save_params(&l, wr) == MOE_OK &&
           moe_st_writer_save(wr, w) == MOE_OK;
  moe_st_writer_free(wr);
  moe_layer_free(&l);
  enum { T = 37 }; /* not a multiple of W: uneven token slices */
  static float xs[T * 12], dy[T * 12];
  uint64_t s = 5;
  for (int i = 0; i < T * 12; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    xs[i] = (float)((s >> 40) * 0x1.0p-23) - 1.0f;
    dy[i] = (float)((s >> 20 & 0xFFFFF) * 0x1.0p-19) - 1.0f;
  }
  float daux = 0.3f, dz = 0.05f;
  int64_t shp[2] = {T, 12}, one = 1;
  ok = ok && moe_st_writer_new(&wr) == MOE_OK && moe_st_writer_add(wr, "x", MOE_DT_F32, 2, shp, xs) == MOE_OK &&
       moe_st_writer_add(wr, "dy", MOE_DT_F32, 2, shp, dy) == MOE_OK &&
       moe_st_writer_add(wr, "daux", MOE_DT_F32, 1, &one, &daux) == MOE_OK &&
       moe_st_writer_add(wr, "dz", MOE_DT_F32, 1, &one, &dz) == MOE_OK && moe_st_writer_save(wr, x) == MOE_OK;
  moe_st_writer_free(wr);
  return ok;
}

/* Every tensor of ref equals the one in got (floats within 1e-5 relative, integers exactly). */
static int same_outputs(const char *got, const char *ref) {
  moe_st *a = NULL, *b = NULL;
  int ok = moe_st_open(&a, got) == MOE_OK && moe_st_open(&b, ref) == MOE_OK;
  for (int i = 0; ok && i < moe_st_count(b); i++) {
    moe_tensor_view vb, va;
    ok = moe_st_at(b, i, &vb) == MOE_OK && moe_st_get(a, vb.name, &va) == MOE_OK && va.nbytes == vb.nbytes &&
         va.dtype == vb.dtype;
    if (ok && vb.dtype == MOE_DT_F32) ok = tensors_close(vb.name, va.data, vb.data, vb.nbytes / 4, 1e-5, 1e-7);
    else if (ok) ok = !memcmp(va.data, vb.data, vb.nbytes);
    if (!ok) fprintf(stderr, "  %s differs from the one-process output %s (tensor %d)\n", got, ref, i);
  }
  if (!a || !b) fprintf(stderr, "  %s\n", moe_last_error());
  moe_st_close(a);
  moe_st_close(b);
  return ok;
}

TEST(ep_layer_run_matches_one_process) {
  char w[512], x[512], ref[512], out[512], cmd[3000];
  test_tmp_path("ep_w.safetensors", w, sizeof w);
  test_tmp_path("ep_x.safetensors", x, sizeof x);
  test_tmp_path("ep_ref.safetensors", ref, sizeof ref);
  test_tmp_path("ep_out.safetensors", out, sizeof out);
  const struct { moe_act act; int k; moe_dispatch disp; moe_priority prio; } cases[5] = {
      {MOE_ACT_GELU, 1, MOE_DISPATCH_DYNAMIC, MOE_PRIORITY_INDEX},
      {MOE_ACT_SWIGLU, 2, MOE_DISPATCH_DYNAMIC, MOE_PRIORITY_INDEX},
      {MOE_ACT_RELU, 2, MOE_DISPATCH_STATIC, MOE_PRIORITY_INDEX},
      {MOE_ACT_SILU, 1, MOE_DISPATCH_STATIC, MOE_PRIORITY_SCORE},
      {MOE_ACT_SWIGLU_OAI, 2, MOE_DISPATCH_STATIC, MOE_PRIORITY_INDEX}}; /* gpt-oss's, fc3.bias sliced too */
  int have_mpi = test_have_mpirun(); /* without: only W = 1 is checked */
  for (int c = 0; c < 5; c++) {
    ASSERT(make_case(w, x, cases[c].act, cases[c].k, cases[c].disp, cases[c].prio));
    snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --backward --threads 1",
             MOE_CLI, w, x, ref);
    ASSERT_EQ_INT(sh(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --backward --expert-parallel",
             MOE_CLI, w, x, out);
    ASSERT_EQ_INT(sh(cmd), 0);
    ASSERT(same_outputs(out, ref));
    if (cases[c].disp == MOE_DISPATCH_STATIC) { /* the drops must be there, or the test shows little */
      moe_st *r = NULL;
      moe_tensor_view v;
      ASSERT_OK(moe_st_open(&r, ref));
      int dropped = moe_st_get(r, "dropped", &v) == MOE_OK ? *(const int32_t *)v.data : -1;
      moe_st_close(r);
      ASSERT(dropped > 0);
    }
    /* Linear on 2 and 4 ranks; 2DH on 2 nodes of 2 (static's fixed buffers use neither): two of the three
     * per case, each run by three or four cases (all of them for all cases took 20 s of the suite) */
    const struct { int W; const char *a2a; int G; } runs[] = {{2, "linear", 0}, {4, "linear", 0}, {4, "2dh", 2}};
    for (int j = 0; have_mpi && j < 2; j++) {
      int i = (c + j) % 3;
      unlink(out);
      snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np %d '%s' layer-run --weights '%s' --input '%s' --out '%s' --backward "
               "--expert-parallel --a2a %s --ranks-per-node %d --threads 1 >/dev/null 2>&1",
               runs[i].W, MOE_CLI, w, x, out, runs[i].a2a, runs[i].G);
      ASSERT_EQ_INT(sh(cmd), 0);
      if (!same_outputs(out, ref)) FAIL_("W=%d %s, case %d: expert-parallel output differs", runs[i].W, runs[i].a2a, c);
    }
    if (cases[c].disp != MOE_DISPATCH_STATIC) continue;
    /* DynaMoE's per-expert capacities: ragged expert blocks in the exchanges */
    const char *caps = "--expert-capacity 3,0,9,2,5,1,7,4";
    snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --backward --threads 1 %s",
             MOE_CLI, w, x, ref, caps);
    ASSERT_EQ_INT(sh(cmd), 0);
    if (have_mpi) {
      int W = c == 3 ? 2 : 4; /* 4 ranks in two cases, 2 in one */
      unlink(out);
      snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np %d '%s' layer-run --weights '%s' --input '%s' --out '%s' --backward "
               "--expert-parallel --threads 1 %s >/dev/null 2>&1", W, MOE_CLI, w, x, out, caps);
      ASSERT_EQ_INT(sh(cmd), 0);
      if (!same_outputs(out, ref)) FAIL_("W=%d, case %d, per-expert capacities: expert-parallel output differs", W, c);
    }
  }
}

/* The routers and shared experts of open models (DESIGN 4.1b) expert-parallel: DeepSeek-V3's routing
 * (sigmoid, selection bias, groups, scale, a shared expert; E = 8) and Qwen2-MoE's gated shared expert
 * (E = 6) on 2 ranks (and 4 for E = 8) give one process's outputs and gradients: the shared experts'
 * gradients summed over the ranks, the groups chosen per token alike. */
TEST(ep_open_routing_matches_one_process) {
  if (!test_have_mpirun()) SKIP("no mpirun or a library without MPI");
  static const struct { const char *cas; int maxW; } cases[] = {
      {"dsv3_sigmoid_groups_top2_bias_scale_dynamic", 4}, {"qwen2moe_shared_gate_swiglu_dynamic", 2}};
  char ref[512], out[512], cmd[3000];
  test_tmp_path("ep_open_ref.safetensors", ref, sizeof ref);
  test_tmp_path("ep_open_out.safetensors", out, sizeof out);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *fx = test_fixture_dir(), *n = cases[c].cas;
    snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s/%s/w.safetensors' --input '%s/%s/x.safetensors' "
             "--out '%s' --backward --threads 1", MOE_CLI, fx, n, fx, n, ref);
    ASSERT_EQ_INT(sh(cmd), 0);
    for (int W = 2; W <= cases[c].maxW; W *= 2) {
      unlink(out);
      snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np %d '%s' layer-run --weights '%s/%s/w.safetensors' --input "
               "'%s/%s/x.safetensors' --out '%s' --backward --expert-parallel --threads 1 >/dev/null 2>&1",
               W, MOE_CLI, fx, n, fx, n, out);
      ASSERT_EQ_INT(sh(cmd), 0);
      if (!same_outputs(out, ref)) FAIL_("W=%d, %s: expert-parallel output differs", W, n);
    }
  }
}

/* 2DH on uneven grids (3 nodes of 2, 2 nodes of 3: ranks per node differ from the node count)
 * against the PyTorch reference of a fixture with E = 6. */
TEST(ep_2dh_uneven_grids_match_reference) {
  if (!test_have_mpirun()) return;
  char f[512], out[512], cmd[3000];
  snprintf(f, sizeof f, "%s/swiglu_k3_cap1_index_dynamic", test_fixture_dir());
  test_tmp_path("ep_2dh.safetensors", out, sizeof out);
  for (int G = 2; G <= 3; G++) {
    unlink(out);
    snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np 6 '%s' layer-run --weights '%s/w.safetensors' --input '%s/x.safetensors' "
             "--out '%s' --backward --spec --expert-parallel --a2a 2dh --ranks-per-node %d --threads 1 >/dev/null 2>&1",
             MOE_CLI, f, f, out, G);
    ASSERT_EQ_INT(sh(cmd), 0);
    char ref[600];
    snprintf(ref, sizeof ref, "%s/ref.safetensors", f);
    if (!same_outputs(out, ref)) FAIL_("2DH with %d ranks per node differs from the reference", G);
  }
}

TEST(ep_rejects_what_it_does_not_support) {
  moe_dist *d;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.D = 4; c.H = 4; c.E = 3; c.dist = d;
  moe_layer_t l;
  if (moe_dist_size(d) > 1 && c.E % moe_dist_size(d)) {
    ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  }
  c.E = 4;
  c.inner_experts = 2;
  c.inner_top_k = 1;
  ASSERT_STATUS(moe_layer_init(&l, &c), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "hierarchical"));
  moe_dist_finalize(d);
}

/* `mpirun -np 2 moe train` (data + expert parallel, the same global batch) follows the one-process
 * loss curve within 1e-4 for 50 steps and reaches the same accuracy. */
/* `moe train ARGS` with one process and under mpirun -np 2: the same per-step losses (within tol; tol
 * < 0: not compared, test accuracy within 0.05) and test accuracy; both outputs must hold `mark`
 * (NULL: nothing to look for). */
static void train_follows_one_process(const char *args, const char *mark, double tol, int *failed_) {
  if (!test_have_mpirun()) return;
  char one[512], two[512], cmd[3000];
  test_tmp_path("train_w1.txt", one, sizeof one);
  test_tmp_path("train_w2.txt", two, sizeof two);
  snprintf(cmd, sizeof cmd, "'%s' %s --data '%s' > '%s' 2>/dev/null", MOE_CLI, args, synth_data_dir(), one);
  ASSERT_EQ_INT(sh(cmd), 0);
  snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np 2 '%s' %s --data '%s' > '%s' 2>/dev/null", MOE_CLI, args, synth_data_dir(), two);
  ASSERT_EQ_INT(sh(cmd), 0);
  double a[64], b[64];
  int na = test_read_losses(one, a, 64), nb = test_read_losses(two, b, 64);
  ASSERT(na >= 50);
  ASSERT_EQ_INT(na, nb);
  for (int i = 0; i < na && tol >= 0; i++)
    if (fabs(a[i] - b[i]) > tol) FAIL_("step %d: loss %.9g with one process, %.9g with two", i, a[i], b[i]);
  char *acc[2] = {one, two};
  double accs[2] = {-1, -2};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(acc[i], "r");
    char line[256];
    int marked = !mark;
    while (f && fgets(line, sizeof line, f)) {
      if (!strncmp(line, "test_accuracy=", 14)) accs[i] = atof(line + 14);
      if (mark && strstr(line, mark)) marked = 1;
    }
    if (f) fclose(f);
    if (!marked) FAIL_("%s run: no line with '%s'", i ? "two-rank" : "one-process", mark);
  }
  ASSERT(accs[0] > 0.3);
  ASSERT_NEAR(accs[0], accs[1], tol >= 0 ? 0.006 : 0.05); /* one or two of the 200 test samples at most */
}

#define EP_TRAIN "train --experts 4 --top-k 2 --hidden 32 --model 32 --batch 24 --augment 1 --threads 1 --log-steps"

TEST(ep_train_follows_one_process) { train_follows_one_process(EP_TRAIN " --epochs 2", NULL, 1e-4, failed_); }

/* The adaptive micro-batch count and memory strategy under mpirun: every rank runs the same trial steps
 * and picks the same n and strategy from the rates summed over the ranks (a mismatch would hang the
 * exchanges or change the losses), each micro-batch's exchange overlapping the previous one's experts
 * on the communication thread. */
TEST(ep_train_pipeline_auto_follows_one_process) {
  train_follows_one_process(EP_TRAIN " --epochs 2 --pipeline auto --memory-reuse auto --memory-budget 0.05", NULL,
                            1e-4, failed_);
}

/* Sample-assignment caching under mpirun: frac_same over all ranks, the switch at the same epoch, and
 * the cached batches routed as one process routes them. */
TEST(ep_train_caching_follows_one_process) {
  train_follows_one_process(EP_TRAIN " --epochs 3 --cache-assignments --cache-on 0 --cache-min-epoch 1",
                            "caching on", 1e-4, failed_);
}

/* Per-expert capacities under mpirun (static dispatch, ragged expert blocks): rank 0's RECOMPILE
 * decisions on every rank at the same step. Which metrics a trigger sees depends on timing (it takes
 * the newest), so runs may recompile at other steps than one process: the steps are not compared. */
TEST(ep_train_dynamic_capacity_follows_one_process) {
  train_follows_one_process(EP_TRAIN " --epochs 2 --capacity dynamic", "recompiles", -1, failed_);
}

/* Pids of running processes whose command line holds `mark`. */
static int find_procs(const char *mark, int *pids, int max) {
  DIR *d = opendir("/proc");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) && n < max) {
    int pid = atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
    FILE *f = fopen(p, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < len; i++) buf[i] = buf[i] ? buf[i] : ' ';
    buf[len] = 0;
    if (strstr(buf, mark) && strstr(buf, "moe") && !strstr(buf, "mpirun")) pids[n++] = pid;
  }
  if (d) closedir(d);
  return n;
}

/* One rank killed in the middle of training: mpirun and every other rank end, non-zero, naming the
 * failed rank; nothing is left running. The waits poll with generous guards (60 s) against a hang: a
 * loaded machine may take seconds, and no claim is made about how fast. */
TEST(ep_rank_failure_stops_every_rank) {
  if (!test_have_mpirun()) return;
  char errp[512], outp[512], cmd[3000];
  test_tmp_path("fault_stderr.txt", errp, sizeof errp);
  test_tmp_path("fault_stdout.txt", outp, sizeof outp);
  const char *mark = "--seed 424242";
  snprintf(cmd, sizeof cmd, "exec " TEST_MPIRUN "-np 2 '%s' train --data '%s' --experts 4 --hidden 32 --model 32 "
           "--epochs 100000 --threads 1 %s >'%s' 2>'%s'", MOE_CLI, synth_data_dir(), mark, outp, errp);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  /* Kill only once both ranks are past MPI_Init and training: the second epoch's line proves it (a rank
   * killed inside MPI_Init tests Open MPI's start-up, not our failure handling). */
  int pids[8], n = 0;
  char text[8192] = "";
  for (int i = 0; i < 600 && (n < 2 || !strstr(text, "epoch 2/")); i++) {
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    n = find_procs(mark, pids, 8);
    test_read_text(outp, text, sizeof text);
  }
  if (n < 2 || !strstr(text, "epoch 2/")) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    FAIL_("the two ranks did not start training (%d found; stdout: %.300s)", n, text);
  }
  kill(pids[n - 1], SIGKILL);
  int status = 0, done = 0;
  for (int i = 0; i < 600 && !done; i++) { /* the hang guard: 60 s */
    done = waitpid(pid, &status, WNOHANG) == pid;
    if (!done) nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    test_read_text(errp, text, sizeof text);
    FAIL_("mpirun still running 60 s after a rank was killed; its stderr: %.2000s", text);
  }
  ASSERT(!WIFEXITED(status) || WEXITSTATUS(status) != 0);
  int left = find_procs(mark, pids, 8);
  for (int i = 0; i < 600 && left; i++) { /* the ranks mpirun ended may take a moment to go */
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    left = find_procs(mark, pids, 8);
  }
  ASSERT_EQ_INT(left, 0); /* no rank left behind */
  test_read_text(errp, text, sizeof text);
  if (!strstr(text, "rank")) FAIL_("stderr does not name the failed rank: %s", text);
}

/* An expert-parallel run that loads a placement (experts interleaved over the ranks, as moe placement
 * writes them) gives the one-process output; a placement for other ranks is refused by name. */
TEST(ep_placement_matches_one_process) {
  if (!test_have_mpirun()) return;
  char w[512], x[512], ref[512], out[512], pl[512], cmd[3000];
  test_tmp_path("pl_w.safetensors", w, sizeof w);
  test_tmp_path("pl_x.safetensors", x, sizeof x);
  test_tmp_path("pl_ref.safetensors", ref, sizeof ref);
  test_tmp_path("pl_out.safetensors", out, sizeof out);
  test_tmp_path("placement.json", pl, sizeof pl);
  ASSERT(make_case(w, x, MOE_ACT_GELU, 2, MOE_DISPATCH_DYNAMIC, MOE_PRIORITY_INDEX));
  FILE *f = fopen(pl, "w");
  ASSERT(f);
  fprintf(f, "{\"devices\": 2, \"method\": \"greedy\", \"layers\": [{\"layer\": 0, "
             "\"expert_device\": [1, 0, 0, 1, 1, 0, 1, 0]}]}\n");
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --backward --threads 1", MOE_CLI, w,
           x, ref);
  ASSERT_EQ_INT(sh(cmd), 0);
  snprintf(cmd, sizeof cmd, TEST_MPIRUN "-np 2 '%s' layer-run --weights '%s' --input '%s' --out '%s' --backward "
           "--expert-parallel --placement '%s' --threads 1 >/dev/null 2>&1", MOE_CLI, w, x, out, pl);
  ASSERT_EQ_INT(sh(cmd), 0);
  ASSERT(same_outputs(out, ref));
  unlink(out);
  snprintf(cmd, sizeof cmd, "'%s' layer-run --weights '%s' --input '%s' --out '%s' --expert-parallel "
           "--placement '%s' 2>/dev/null", MOE_CLI, w, x, out, pl); /* one rank, a placement for two */
  ASSERT(sh(cmd) != 0);
  ASSERT(access(out, F_OK) != 0);
}
