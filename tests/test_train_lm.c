/* moe train --task lm, moe eval --task lm and moe generate --prompt on a tiny corpus the test writes
 * (a few sentences in a seeded order, documents separated by empty lines as scripts/get-brown.sh
 * writes them), so no download is needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "lm_corpus.h"
#include "run_cli.h"
#include "test.h"

/* Trains LM_TINY once per process into checkpoint dir ck (its JSON lines in out); 0 when it worked. */
static int trained(const char **ck, const char **out) {
  static char c[512], o[512], err[2048];
  static int rc = -1;
  *ck = test_tmp_path("lm_ck", c, sizeof c);
  *out = test_tmp_path("lm_train.jsonl", o, sizeof o);
  if (rc >= 0) return rc;
  char args[2048];
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --checkpoint '%s' --json --log-steps",
           lm_corpus(), c);
  rc = run_moe(NULL, args, o, err, sizeof err);
  if (rc) fprintf(stderr, "  moe %s -> %d: %s\n", args, rc, err);
  return rc;
}

TEST(train_lm_validation_loss_drops) {
  const char *ck, *out;
  ASSERT_EQ_INT(trained(&ck, &out), 0);
  char *text = test_read_file(out, NULL);
  ASSERT(text);
  double v[8];
  int n = valid_losses(text, v, 8);
  free(text);
  ASSERT_EQ_INT(n, 5); /* steps 10, 20, 30, 40 and the last line */
  /* From ln(vocab) (about 5.7 nats) untrained; 40 steps on five sentences take the loss far below it. */
  if (!(v[3] < v[0] - 1.0 && v[3] < 3.5))
    FAIL_("validation loss %.4f at step 10, %.4f at step 40: want a drop of 1 nat to below 3.5", v[0], v[3]);
  ASSERT_NEAR(v[4], v[3], 0);
}

/* Stopped at step 20 and resumed, the run logs the uninterrupted run's losses bit for bit: the batches
 * are functions of (seed, step), the weights and Adam's moments are saved as F32, the step and the
 * schedule with them, and the kernels are deterministic for a thread count. */
TEST(train_lm_resume_matches_uninterrupted) {
  const char *ck, *out;
  ASSERT_EQ_INT(trained(&ck, &out), 0);
  char half[512], p1[512], p2[512], args[2048], err[2048];
  test_tmp_path("lm_half", half, sizeof half);
  snprintf(args, sizeof args,
           "train --task lm --data '%s' " LM_TINY " --checkpoint '%s' --stop-after 20 --json --log-steps", lm_corpus(),
           half);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_p1.jsonl", p1, sizeof p1), err, sizeof err), 0);
  snprintf(args, sizeof args, "train --task lm --resume '%s' --data '%s' --threads 1 --json --log-steps", half,
           lm_corpus());
  if (run_moe(NULL, args, test_tmp_path("lm_p2.jsonl", p2, sizeof p2), err, sizeof err)) FAIL_("resume: %s", err);
  char *full = test_read_file(out, NULL), *a = test_read_file(p1, NULL), *b = test_read_file(p2, NULL);
  ASSERT(full && a && b);
  /* Every per-step loss line, in order: the first run's, then the resumed run's. */
  char want[8192] = "", got[8192] = "";
  step_lines(full, want, sizeof want);
  step_lines(a, got, sizeof got);
  step_lines(b, got, sizeof got);
  double vf[8], vb[8];
  int nf = valid_losses(full, vf, 8), nb = valid_losses(b, vb, 8);
  free(full);
  free(a);
  free(b);
  if (strcmp(want, got)) FAIL_("resumed losses differ:\nuninterrupted:\n%s\nstopped + resumed:\n%s", want, got);
  ASSERT(strstr(want, "{\"step\": 40, "));
  ASSERT(nf == 5 && nb == 3);
  ASSERT_NEAR(vb[2], vf[4], 0);
}

/* eval's perplexity is exp(its loss); on the validation split with the training context it is the
 * training's last validation loss (every window of that split: the same windows). */
TEST(eval_lm_perplexity_is_exp_loss) {
  const char *ck, *out;
  ASSERT_EQ_INT(trained(&ck, &out), 0);
  char args[2048], res[512], err[2048], text[1024];
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --json", ck, lm_corpus());
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_eval.json", res, sizeof res), err, sizeof err), 0);
  test_read_text(res, text, sizeof text);
  double loss = json_num(text, "test_loss"), ppl = json_num(text, "test_perplexity");
  ASSERT(loss > 0 && loss < 10);
  ASSERT_NEAR(ppl, exp(loss), 1e-4 * exp(loss));
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --split valid --json", ck, lm_corpus());
  ASSERT_EQ_INT(run_moe(NULL, args, res, err, sizeof err), 0);
  test_read_text(res, text, sizeof text);
  char *train = test_read_file(out, NULL);
  ASSERT(train);
  double v[8];
  int n = valid_losses(train, v, 8);
  free(train);
  ASSERT_EQ_INT(n, 5);
  ASSERT_NEAR(json_num(text, "valid_loss"), v[4], 0);
}

/* --keep-best holds the model of the lowest validation loss the run reported: its loss on the
 * validation split (every window, the training's windows here) is that minimum, bit for bit; and it
 * may not be the --checkpoint directory, whose trainer state belongs to the latest model. */
TEST(train_lm_keep_best_is_the_lowest_validation_loss) {
  char best[512], out[512], res[512], args[2048], err[2048], text[1024];
  test_tmp_path("lm_best", best, sizeof best);
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --lr 0.05 --eval-every 5 --keep-best '%s' --json",
           lm_corpus(), best);
  if (run_moe(NULL, args, test_tmp_path("lm_best.jsonl", out, sizeof out), err, sizeof err)) FAIL_("%s", err);
  char *train = test_read_file(out, NULL);
  ASSERT(train);
  double v[16], low = INFINITY;
  int n = valid_losses(train, v, 16);
  free(train);
  ASSERT(n >= 4);
  for (int i = 0; i < n; i++) low = fmin(low, v[i]);
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --data '%s' --split valid --json", best, lm_corpus());
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_best_eval.json", res, sizeof res), err, sizeof err), 0);
  test_read_text(res, text, sizeof text);
  ASSERT_NEAR(json_num(text, "valid_loss"), low, 0);
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --checkpoint '%s' --keep-best '%s'",
           lm_corpus(), best, best);
  ASSERT(run_moe(NULL, args, res, err, sizeof err) != 0);
  if (!strstr(err, "--keep-best") || !strstr(err, "--checkpoint")) FAIL_("want an error naming both flags: %s", err);
}

/* --prompt goes through the checkpoint's tokenizer as `moe tokenizer encode` does: greedy text from
 * --prompt is the decoded greedy ids from --prompt-ids of the encoded prompt; a seed repeats a sample. */
TEST(generate_lm_prompt_text) {
  const char *ck, *out;
  ASSERT_EQ_INT(trained(&ck, &out), 0);
  char args[6144], a[512], b[512], in[512], ids[512], dec[512], err[2048], t1[4096], t2[4096];
  FILE *f = fopen(test_tmp_path("lm_prompt.txt", in, sizeof in), "wb");
  ASSERT(f);
  fputs("the cat sat", f);
  fclose(f);
  snprintf(args, sizeof args, "tokenizer encode --tokenizer '%s/tokenizer.json' < '%s'", ck, in);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_prompt.ids", ids, sizeof ids), err, sizeof err), 0);
  test_read_text(ids, t1, sizeof t1);
  t1[strcspn(t1, "\n")] = 0;
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt-ids '%s' --max-tokens 8 --temperature 0", ck, t1);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_gen_ids.txt", a, sizeof a), err, sizeof err), 0);
  snprintf(args, sizeof args, "tokenizer decode --tokenizer '%s/tokenizer.json' < '%s'", ck, a);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_gen_dec.txt", dec, sizeof dec), err, sizeof err), 0);
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt 'the cat sat' --max-tokens 8 --temperature 0", ck);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("lm_gen_text.txt", b, sizeof b), err, sizeof err), 0);
  test_read_text(dec, t1, sizeof t1);
  test_read_text(b, t2, sizeof t2);
  if (strncmp(t1, t2, strlen(t1)) || strlen(t2) != strlen(t1) + 1)
    FAIL_("--prompt text '%s' is not the decoded ids' '%s' and a newline", t2, t1);
  ASSERT(strlen(t1) > 0);
  /* --json: the same greedy ids and text, as one JSON line */
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt 'the cat sat' --max-tokens 8 --temperature 0 --json",
           ck);
  ASSERT_EQ_INT(run_moe(NULL, args, b, err, sizeof err), 0);
  char *j = test_read_file(b, NULL), *want_ids = test_read_file(a, NULL);
  ASSERT(j && want_ids);
  want_ids[strcspn(want_ids, "\n")] = 0;
  for (char *c = want_ids; *c; c++) *c = *c == ' ' ? ',' : *c; /* "1 2 3" -> "1,2,3" */
  char want[4096];
  snprintf(want, sizeof want, "\"ids\":[%s],\"text\":", want_ids);
  int json_ok = !strncmp(j, "{\"prompt_tokens\":", 17) && strstr(j, want) && !strchr(strchr(j, '\n') + 1, '\n');
  cJSON *o = cJSON_Parse(j); /* and its times: the rate is the new tokens' forwards (all but the last) a second */
  int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "ids"));
  double ps = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "prompt_seconds")),
         ds = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "decode_seconds")),
         rate = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "decode_tokens_per_s"));
  cJSON_Delete(o);
  json_ok = json_ok && n > 1 && ps > 0 && ds > 0 && fabs(rate * ds - (n - 1)) < 1e-9 * (n - 1);
  if (!json_ok) fprintf(stderr, "  --json printed %s  want %s and the times\n", j, want);
  free(j);
  free(want_ids);
  ASSERT(json_ok);
  /* Sampling: the same seed, the same text. */
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt 'the dog' --max-tokens 12 --seed 5", ck);
  ASSERT_EQ_INT(run_moe(NULL, args, a, err, sizeof err), 0);
  ASSERT_EQ_INT(run_moe(NULL, args, b, err, sizeof err), 0);
  ASSERT(test_same_file(a, b));
}

/* Bad flags and data: a clear message, a non-zero exit. */
TEST(train_lm_errors) {
  const char *ck, *out;
  ASSERT_EQ_INT(trained(&ck, &out), 0);
  char args[2048], err[2048];
  static const struct { const char *args, *want; } cases[] = {
      {"train --task poem", "--task: 'poem' is not lm or classifier"},
      {"train --task lm --data /nonexistent/brown", "scripts/get-brown.sh"},
      {"train --task lm --data @ --model 30 --heads 4", "--model 30 is not a multiple of --heads 4"},
      {"train --task lm --data @ --context 100000", "--context: bad value"},
      {"train --task lm --data @ --vocab 320 --context 4000", "fewer than one window of --context 4000"},
      {"train --task lm --resume # --layers 3", "drop --layers"},
      {"train --task lm --resume /nonexistent/ck", "/nonexistent/ck"},
      {"train --task lm --bogus 1", "unknown flag '--bogus'"},
      {"train --task lm --data @ --on-nan skip", "--on-nan: bad value 'skip'"},
      {"eval --task lm --data @", "--checkpoint is required"},
      {"eval --task lm --checkpoint # --data @ --context 99", "exceeds the model's max_position_embeddings 16"},
      {"generate --checkpoint # --prompt a --prompt-ids 1", "one of --prompt and --prompt-ids"},
      {"generate --checkpoint # --prompt ''", "--prompt: no text"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char line[1024] = "";
    for (const char *p = cases[i].args; *p; p++) { /* @: the corpus, #: the checkpoint */
      size_t k = strlen(line);
      if (*p == '@' || *p == '#') snprintf(line + k, sizeof line - k, "'%s'", *p == '@' ? lm_corpus() : ck);
      else if (k + 1 < sizeof line) line[k] = *p, line[k + 1] = 0;
    }
    snprintf(args, sizeof args, "%s", line);
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    if (rc == 0 || !strstr(err, cases[i].want))
      FAIL_("moe %s -> %d, stderr '%s': want a failure naming '%s'", args, rc, err, cases[i].want);
  }
}

/* --lr 1e3 diverges within a few steps: --on-nan stop (the default) exits 1 naming the step and the
 * way out; --on-nan skip-step goes on to the end, says why it skipped the first, and its reports count
 * exactly the steps missing from the --log-steps lines (a skipped step logs none). */
TEST(train_lm_on_nan) {
  char args[2048], err[2048], out[512];
  test_tmp_path("lm_on_nan.txt", out, sizeof out);
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --lr 1e3 --log-steps", lm_corpus());
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
  if (!strstr(err, "moe train: step ") || !strstr(err, "lower --lr, or --on-nan skip-step"))
    FAIL_("stderr '%s': want the step and --on-nan skip-step", err);
  snprintf(args, sizeof args, "train --task lm --data '%s' " LM_TINY " --lr 1e3 --log-steps --on-nan skip-step",
           lm_corpus());
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  if (!strstr(err, ": update skipped: ") || !strstr(err, "further skips are counted"))
    FAIL_("stderr '%s': want the first skip's reason", err);
  char *text = test_read_file(out, NULL);
  ASSERT(text != NULL);
  const char *key = "steps skipped (non-finite, --on-nan skip-step): ";
  int skipped = 0, reports = 0, logged = 0;
  for (const char *p = text; (p = strstr(p, key)); p += strlen(key), reports++) skipped += atoi(p + strlen(key));
  for (const char *p = text; (p = strstr(p, "{\"step\": ")); p++) logged += strstr(p, "\"loss\"") != NULL;
  free(text);
  ASSERT_EQ_INT(reports, 4); /* one per report: steps 10, 20, 30, 40 */
  ASSERT(skipped > 0);
  ASSERT_EQ_INT(logged + skipped, 40);
}
