/* moe train --task lm with the MoE layers' options (--capacity, --dispatch, --dtype bf16, --capacity
 * dynamic, --cache-assignments), --time-budget, and the reports' throughput and time shares; and the
 * library's per-layer stats and time shares they come from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_corpus.h"
#include "moe.h"
#include "run_cli.h"
#include "test.h"

/* moe train --task lm LM_TINY extra --json --log-steps on the corpus, stdout into tmp file `name`: its
 * text (malloc'd), or NULL after printing the command and its stderr. err gets the stderr. */
static char *train(const char *name, const char *extra, char *err, size_t n) {
  char args[2048], out[512];
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " %s --json --log-steps", lm_corpus(), extra);
  int rc = run_moe(NULL, args, test_tmp_path(name, out, sizeof out), err, n);
  if (rc) {
    fprintf(stderr, "  moe %s -> %d: %s\n", args, rc, err);
    return NULL;
  }
  return test_read_file(out, NULL);
}

/* The validation losses of text's reports (steps 10..40 and the last line) fall by 0.5 nat at least
 * and are finite. */
static int loss_falls(const char *text, const char *what) {
  double v[8];
  int n = valid_losses(text, v, 8);
  if (n == 5 && isfinite(v[3]) && v[3] < v[0] - 0.5) return 1;
  fprintf(stderr, "  %s: %d validation losses, %.4f at step 10 and %.4f at step 40: want 5, a drop of 0.5\n", what,
          n, n > 0 ? v[0] : NAN, n > 3 ? v[3] : NAN);
  return 0;
}

/* A capacity factor of 0.5 with static dispatch reaches the layers: about half of the assignments
 * are dropped (none with the default no-drop dynamic dispatch), and the model still learns. */
TEST(train_lm_static_capacity_drops) {
  char err[4096];
  char *cap = train("lm_cap.jsonl", "--capacity 0.5 --dispatch static", err, sizeof err);
  char *def = train("lm_def.jsonl", "", err, sizeof err);
  ASSERT(cap && def);
  double d_cap = json_num(cap, "dropped_fraction"), d_def = json_num(def, "dropped_fraction");
  int falls = loss_falls(cap, "--capacity 0.5");
  free(cap);
  free(def);
  if (!(d_cap > 0.3 && d_cap < 0.7 && d_def == 0))
    FAIL_("dropped fraction %.4f with --capacity 0.5 --dispatch static (want about 0.5), %.4f by default (want 0)",
          d_cap, d_def);
  ASSERT(falls);
}

/* --dtype bf16 reaches the experts: the per-step losses are not fp32's bits, yet close to them, and
 * the model learns. */
TEST(train_lm_bf16) {
  char err[4096], a[8192] = "", b[8192] = "";
  char *bf = train("lm_bf16.jsonl", "--dtype bf16", err, sizeof err);
  char *f32 = train("lm_f32.jsonl", "", err, sizeof err);
  ASSERT(bf && f32);
  step_lines(bf, a, sizeof a);
  step_lines(f32, b, sizeof b);
  double v[8], w[8];
  int n = valid_losses(bf, v, 8), m = valid_losses(f32, w, 8), falls = loss_falls(bf, "--dtype bf16");
  free(bf);
  free(f32);
  ASSERT(n == 5 && m == 5 && strlen(a) > 100);
  if (!strcmp(a, b)) FAIL_("--dtype bf16 logged fp32's losses bit for bit:\n%s", a);
  if (fabs(v[4] - w[4]) > 0.1) FAIL_("final validation loss %.4f in bf16, %.4f in fp32: want within 0.1", v[4], w[4]);
  ASSERT(falls);
}

/* --capacity dynamic: per-expert capacities recompiled while training (its report on stderr with
 * --json) on static dispatch, few assignments dropped, and the model learns. */
TEST(train_lm_dynamic_capacity) {
  char err[4096];
  char *t = train("lm_dyn.jsonl", "--capacity dynamic --delta-launch 0", err, sizeof err);
  ASSERT(t);
  double drop = json_num(strstr(t, "\"step\": 40, \"loss\": ") ? strstr(t, "\"step\": 40, \"loss\": ") : t,
                         "dropped_fraction");
  int falls = loss_falls(t, "--capacity dynamic");
  free(t);
  const char *r = strstr(err, "dynamic capacity: ");
  long recompiles = r ? strtol(r + 18, NULL, 10) : 0;
  if (recompiles < 1) FAIL_("want a 'dynamic capacity: N recompiles' line with N >= 1 on stderr, got '%s'", err);
  if (!(drop >= 0 && drop < 0.2)) FAIL_("dropped fraction %.4f over steps 31..40: want below 0.2", drop);
  ASSERT(falls);
}

/* --cache-assignments: each window's tokens are samples; after a few epochs (a pass over the
 * corpus's windows) of a model that settles, frac_same crosses --cache-on and caching turns on while
 * the loss goes on falling. */
TEST(train_lm_assignment_caching) {
  char err[4096];
  char *t = train("lm_cache.jsonl", "--steps 200 --eval-every 40 --cache-assignments --cache-on 0.5 --cache-off 0.3 "
                  "--cache-min-epoch 2", err, sizeof err);
  ASSERT(t);
  const char *on = strstr(t, "\"caching\": 1");
  double from = on ? json_num(on, "caching_from_step") : -1, v[8];
  int n = valid_losses(t, v, 8), epochs = 0;
  for (const char *p = t; (p = strstr(p, "\"frac_same\": ")); p++) epochs++;
  if (!on || from < 1) fprintf(stderr, "  output:\n%s", t);
  free(t);
  ASSERT(epochs >= 3);
  if (!on || from < 1) FAIL_("caching never turned on in %d epochs (want an epoch line with \"caching\": 1)", epochs);
  ASSERT(n == 6 && isfinite(v[5]) && v[4] < v[0] - 0.5);
}

/* Stopped and resumed, a run with static capacity and bf16 experts logs the uninterrupted run's
 * losses bit for bit: the layers' options come back from the trainer state. */
TEST(train_lm_resume_keeps_layer_options) {
  char err[4096], ck[512], args[2048], p2[512], want[8192] = "", got[8192] = "";
  const char *opts = "--capacity 0.75 --dispatch static --dtype bf16";
  char extra[1024];
  snprintf(extra, sizeof extra, "%s --checkpoint '%s' --stop-after 20", opts,
           test_tmp_path("lm_opt_ck", ck, sizeof ck));
  char *full = train("lm_opt_full.jsonl", opts, err, sizeof err), *a = train("lm_opt_a.jsonl", extra, err, sizeof err);
  ASSERT(full && a);
  snprintf(args, sizeof args, "train --task lm --resume '%s' --data '%s' --threads 1 --json --log-steps", ck,
           lm_corpus());
  int rc = run_moe(NULL, args, test_tmp_path("lm_opt_b.jsonl", p2, sizeof p2), err, sizeof err);
  char *b = test_read_file(p2, NULL);
  step_lines(full, want, sizeof want);
  step_lines(a, got, sizeof got);
  if (b) step_lines(b, got, sizeof got);
  free(full);
  free(a);
  free(b);
  if (rc) FAIL_("resume: %s", err);
  if (strcmp(want, got)) FAIL_("resumed losses differ:\nuninterrupted:\n%s\nstopped + resumed:\n%s", want, got);
  ASSERT(strstr(want, "{\"step\": 40, "));
}

/* --time-budget: a budget that the first step exceeds ends the run there, with one report; --steps
 * still stops a run whose budget is far off; --warmup (steps) is refused with it. No timing is judged. */
TEST(train_lm_time_budget) {
  char err[4096];
  char *t = train("lm_tb1.jsonl", "--time-budget 1e-9", err, sizeof err);
  ASSERT(t);
  double step = json_num(t, "step"), secs = json_num(t, "train_seconds");
  int reports = valid_losses(t, (double[4]){0}, 4);
  free(t);
  if (!(step == 1 && secs > 0 && reports == 2))
    FAIL_("--time-budget 1e-9: first report at step %g with train_seconds %g and %d validation losses: want step 1, "
          "> 0 s, 2 (the report, the last line)", step, secs, reports);
  t = train("lm_tb2.jsonl", "--time-budget 1e6 --steps 3", err, sizeof err);
  ASSERT(t);
  ASSERT(strstr(t, "{\"step\": 3, \"loss\": ") && !strstr(t, "{\"step\": 4, "));
  free(t);
  char args[2048];
  snprintf(args, sizeof args, "train --task lm --data '%s' --time-budget 10 --warmup 5", lm_corpus());
  int rc = run_moe(NULL, args, NULL, err, sizeof err);
  if (rc == 0 || !strstr(err, "--warmup counts steps")) FAIL_("--time-budget with --warmup -> %d: '%s'", rc, err);
}

/* Each report's throughput and time shares: positive tokens/s and expert GFLOP/s, the three measured
 * shares in (0, 1) and the rest, what they leave, not negative. */
TEST(train_lm_reports_time_shares) {
  char err[4096];
  char *t = train("lm_shares.jsonl", "", err, sizeof err);
  ASSERT(t);
  const char *r = strstr(t, "\"valid_loss\": ");
  while (r > t && r[-1] != '\n') r--;
  double tok = json_num(r, "tokens_per_s"), gf = json_num(r, "experts_gflops"), att = json_num(r, "attention_share"),
         ex = json_num(r, "experts_share"), rt = json_num(r, "router_share"), rest = json_num(r, "rest_share");
  if (!(tok > 0 && gf > 0 && att > 0 && att < 1 && ex > 0 && ex < 1 && rt > 0 && rt < 1 && rest >= -1e-3 &&
        fabs(att + ex + rt + rest - 1) < 1e-3))
    FAIL_("report '%.300s': want tokens/s and GFLOP/s > 0, shares in (0, 1) summing to 1", r);
  free(t);
}

/* The library's side: after a forward and backward the three time shares are positive, the router's
 * holds the layers' own router seconds (stats.router_seconds, each positive), and reset clears them;
 * each layer's stats count N k assignments. */
TEST(lm_times_and_layer_stats) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 24, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 8, c.max_seq = 16;
  c.moe.D = 16, c.moe.H = 16, c.moe.E = 4, c.moe.top_k = 2, c.moe.threads = 1;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 3);
  int32_t tok[2 * 16 + 1];
  for (int i = 0; i <= 32; i++) tok[i] = (i * 5) % 24;
  moe_lm_stats st;
  ASSERT_OK(moe_lm_forward(&m, tok, tok + 1, 2, 16, &st));
  ASSERT_OK(moe_lm_backward(&m));
  moe_lm_times t;
  moe_lm_times_get(&m, &t);
  long counts[2] = {0, 0};
  double gates[2];
  for (int l = 0; l < 2; l++) {
    for (int e = 0; e < 4; e++) counts[l] += moe_lm_layer_stats(&m, l)->expert_counts[e];
    gates[l] = moe_lm_layer_stats(&m, l)->router_seconds;
  }
  int ok_t = t.attention > 0 && t.experts > 0 && gates[0] > 0 && gates[1] > 0 && t.router >= gates[0] + gates[1];
  moe_lm_times_reset(&m);
  moe_lm_times_get(&m, &t);
  moe_lm_free(&m);
  if (!ok_t)
    FAIL_("time shares after a step: attention %g, experts %g, router %g s, the layers' routers %g and %g s: want "
          "all > 0, the router's at least the layers' sum", t.attention, t.experts, t.router, gates[0], gates[1]);
  ASSERT(t.attention == 0 && t.experts == 0 && t.router == 0);
  if (counts[0] != 64 || counts[1] != 64)
    FAIL_("layer stats count %ld and %ld assignments: want 2 x 16 x 2 = 64", counts[0], counts[1]);
}
