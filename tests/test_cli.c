/* `moe layer-run` end to end: a good run matches the reference, and each kind of bad input gets a
 * non-zero exit, a message naming the file, tensor or field, and no output file. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare.h"
#include "run_cli.h"
#include "test.h"

#define CASE "relu_k2_cap1_index_static" /* E=6, D=12, H=16, T=24 */

static char err_text[4096];

static const char *fixture(const char *file, char *buf, size_t n) {
  snprintf(buf, n, "%s/" CASE "/%s", test_fixture_dir(), file);
  return buf;
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Runs moe layer-run with W, X and extra flags writing OUT; returns the exit status, stderr in err_text. */
static int layer_run(const char *w, const char *x, const char *out, const char *extra) {
  char args[2048];
  snprintf(args, sizeof args, "layer-run --weights '%s' --input '%s' --out '%s' %s", w, x, out, extra);
  return run_moe(NULL, args, NULL, err_text, sizeof err_text);
}

/* Expects failure: non-zero exit, stderr containing `needle`, no output. */
#define EXPECT_REJECT(w, x, extra, needle)                                            \
  do {                                                                                \
    char out_[512];                                                                   \
    test_tmp_path("never.safetensors", out_, sizeof out_);                            \
    unlink(out_);                                                                     \
    int rc_ = layer_run(w, x, out_, extra);                                           \
    if (rc_ == 0) FAIL_("layer-run accepted bad input (want an error with '%s')", needle); \
    if (!strstr(err_text, needle)) FAIL_("stderr '%s' does not mention '%s'", err_text, needle); \
    if (exists(out_)) FAIL_("an output file was written despite the error");        \
  } while (0)

static void write_raw(const char *path, const char *header, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  uint64_t len = strlen(header);
  fwrite(&len, 8, 1, f);
  fwrite(header, 1, len, f);
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

TEST(cli_layer_run_matches_reference) {
  char w[512], x[512], ref[512], out[512];
  fixture("w.safetensors", w, sizeof w);
  fixture("x.safetensors", x, sizeof x);
  fixture("ref.safetensors", ref, sizeof ref);
  test_tmp_path("out.safetensors", out, sizeof out);
  ASSERT_EQ_INT(layer_run(w, x, out, "--backward --spec"), 0);
  moe_st *o = NULL, *r = NULL;
  ASSERT_OK(moe_st_open(&o, out));
  ASSERT_OK(moe_st_open(&r, ref));
  const char *names[] = {"y", "spec", "grad.x", "grad.gate.weight", "grad.experts.fc2.weight"};
  int ok = 1;
  for (int i = 0; i < 5; i++) {
    moe_tensor_view a, b;
    ok &= moe_st_get(o, names[i], &a) == MOE_OK && moe_st_get(r, names[i], &b) == MOE_OK &&
          a.nbytes == b.nbytes && tensors_close(names[i], a.data, b.data, a.nbytes / 4, 1e-5, 1e-7);
  }
  moe_tensor_view d;
  ok &= moe_st_get(o, "dropped", &d) == MOE_OK && *(const int32_t *)d.data == 9;
  moe_st_close(o);
  moe_st_close(r);
  ASSERT(ok);
}

/* DeepSeek-V3's sequence-wise balance loss from the weights' metadata (seq_aux_alpha, seq_len): its value
 * and, through --backward, the router's gradient as the PyTorch reference has them. */
TEST(cli_layer_run_seq_aux_loss) {
  char w[512], x[512], ref[512], out[512];
  const char *cas = "dsv3_seq_aux_sigmoid_bias_dynamic";
  snprintf(w, sizeof w, "%s/%s/w.safetensors", test_fixture_dir(), cas);
  snprintf(x, sizeof x, "%s/%s/x.safetensors", test_fixture_dir(), cas);
  snprintf(ref, sizeof ref, "%s/%s/ref.safetensors", test_fixture_dir(), cas);
  test_tmp_path("out_seq_aux.safetensors", out, sizeof out);
  if (layer_run(w, x, out, "--backward")) FAIL_("layer-run: %s", err_text);
  moe_st *o = NULL, *r = NULL;
  ASSERT_OK(moe_st_open(&o, out));
  ASSERT_OK(moe_st_open(&r, ref));
  const char *names[] = {"seq_aux_loss", "grad.gate.weight", "grad.x"};
  int ok = 1;
  for (int i = 0; i < 3; i++) {
    moe_tensor_view a, b;
    ok &= moe_st_get(o, names[i], &a) == MOE_OK && moe_st_get(r, names[i], &b) == MOE_OK &&
          a.nbytes == b.nbytes && tensors_close(names[i], a.data, b.data, a.nbytes / 4, 1e-5, 1e-7);
  }
  moe_st_close(o);
  moe_st_close(r);
  ASSERT(ok);
}

TEST(cli_rejects_bad_k) {
  char w[512], x[512];
  fixture("w.safetensors", w, sizeof w);
  fixture("x.safetensors", x, sizeof x);
  EXPECT_REJECT(w, x, "--top_k 7", "top_k");
  EXPECT_REJECT(w, x, "--top_k 0", "top_k");
  EXPECT_REJECT(w, x, "--top_k two", "top_k");
  EXPECT_REJECT(w, x, "--activation tanh", "activation");
  EXPECT_REJECT(w, x, "--bogus 1", "bogus");
}

TEST(cli_rejects_bad_tensors) {
  char w[512], x[512], p[512];
  fixture("w.safetensors", w, sizeof w);
  fixture("x.safetensors", x, sizeof x);
  float buf[64 * 16] = {0};
  int64_t s2[2], s3[3];
  moe_st_writer *wr;

  /* x with D + 1 columns */
  ASSERT_OK(moe_st_writer_new(&wr));
  s2[0] = 4; s2[1] = 13;
  ASSERT_OK(moe_st_writer_add(wr, "x", MOE_DT_F32, 2, s2, buf));
  ASSERT_OK(moe_st_writer_save(wr, test_tmp_path("x_shape.safetensors", p, sizeof p)));
  moe_st_writer_free(wr);
  EXPECT_REJECT(w, p, "", "'x'");

  /* x as I32 */
  ASSERT_OK(moe_st_writer_new(&wr));
  s2[0] = 4; s2[1] = 12;
  ASSERT_OK(moe_st_writer_add(wr, "x", MOE_DT_I32, 2, s2, buf));
  ASSERT_OK(moe_st_writer_save(wr, test_tmp_path("x_dtype.safetensors", p, sizeof p)));
  moe_st_writer_free(wr);
  EXPECT_REJECT(w, p, "", "dtype I32");

  /* NaN and Inf in x */
  const float bad[2] = {NAN, INFINITY};
  for (int b = 0; b < 2; b++) {
    float xs[4 * 12] = {0};
    xs[2 * 12 + 5] = bad[b];
    ASSERT_OK(moe_st_writer_new(&wr));
    ASSERT_OK(moe_st_writer_add(wr, "x", MOE_DT_F32, 2, s2, xs));
    ASSERT_OK(moe_st_writer_save(wr, test_tmp_path("x_nan.safetensors", p, sizeof p)));
    moe_st_writer_free(wr);
    EXPECT_REJECT(w, p, "", "x");
    EXPECT_REJECT(w, p, "", "non-finite");
  }

  /* weights: wrong fc2 shape, E = 0, F64 gate, missing gate */
  moe_st *wf;
  ASSERT_OK(moe_st_open(&wf, w));
  const char *variants[] = {"fc2_shape", "e0", "gate_f64", "no_gate"};
  const char *needles[] = {"experts.fc2.weight", "E (experts) must be > 0", "gate.weight", "gate.weight"};
  for (int v = 0; v < 4; v++) {
    ASSERT_OK(moe_st_writer_new(&wr));
    for (int i = 0; i < moe_st_count(wf); i++) {
      moe_tensor_view t;
      ASSERT_OK(moe_st_at(wf, i, &t));
      int is_gate = !strcmp(t.name, "gate.weight");
      if (v == 3 && is_gate) continue;
      if (v == 0 && !strcmp(t.name, "experts.fc2.weight")) {
        s3[0] = 6; s3[1] = 12; s3[2] = 15;
        moe_st_writer_add(wr, t.name, MOE_DT_F32, 3, s3, t.data);
      } else if (v == 1) {
        int64_t z[3] = {0, t.shape[1], t.ndim > 2 ? t.shape[2] : 0};
        if (is_gate || !strcmp(t.name, "gate.bias")) z[1] = is_gate ? 12 : 0;
        moe_st_writer_add(wr, t.name, t.dtype, t.ndim, z, t.data);
      } else if (v == 2 && is_gate) {
        moe_st_writer_add(wr, t.name, MOE_DT_F64, 2, (int64_t[]){6, 6}, t.data);
      } else {
        moe_st_writer_add(wr, t.name, t.dtype, t.ndim, t.shape, t.data);
      }
    }
    char name[64];
    snprintf(name, sizeof name, "w_%s.safetensors", variants[v]);
    ASSERT_OK(moe_st_writer_save(wr, test_tmp_path(name, p, sizeof p)));
    moe_st_writer_free(wr);
    EXPECT_REJECT(p, x, "", needles[v]);
  }
  moe_st_close(wf);
}

TEST(cli_rejects_bad_files) {
  char w[512], x[512], p[512];
  fixture("w.safetensors", w, sizeof w);
  fixture("x.safetensors", x, sizeof x);
  float d[8] = {0};
  EXPECT_REJECT(test_tmp_path("missing.safetensors", p, sizeof p), x, "", "missing.safetensors");
  /* truncated: the first 20 bytes of a real file */
  FILE *in = fopen(w, "rb"), *out = fopen(test_tmp_path("trunc.safetensors", p, sizeof p), "wb");
  char head[20];
  ASSERT(in && out && fread(head, 1, 20, in) == 20);
  fwrite(head, 1, 20, out);
  fclose(in);
  fclose(out);
  EXPECT_REJECT(p, x, "", "trunc.safetensors");
  /* header length far beyond any bound */
  out = fopen(test_tmp_path("huge.safetensors", p, sizeof p), "wb");
  uint64_t len = 1ull << 40;
  fwrite(&len, 8, 1, out);
  fwrite("{}", 1, 2, out);
  fclose(out);
  EXPECT_REJECT(w, p, "", "huge.safetensors");
  /* overlapping offsets */
  write_raw(test_tmp_path("overlap.safetensors", p, sizeof p),
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,4],\"data_offsets\":[0,16]},"
            "\"dy\":{\"dtype\":\"F32\",\"shape\":[1,4],\"data_offsets\":[8,24]}}",
            d, 24);
  EXPECT_REJECT(w, p, "", "overlap");
  /* JSON that does not parse */
  write_raw(test_tmp_path("json.safetensors", p, sizeof p), "{\"x\":{\"dtype\":", d, 0);
  EXPECT_REJECT(w, p, "", "json.safetensors");
}

/* Runs `moe bench ARGS`; returns the exit status, stdout in out (n bytes at most), stderr in err_text. */
static int bench_run(const char *args, char *out, size_t n) {
  char outp[512], cmd[2048];
  test_tmp_path("bench_stdout.txt", outp, sizeof outp);
  snprintf(cmd, sizeof cmd, "bench %s", args);
  int rc = run_moe(NULL, cmd, outp, err_text, sizeof err_text);
  test_read_text(outp, out, n);
  return rc;
}

/* moe bench --dtype bf16 --cases S (one routing, one dispatch, one timed step: about a second): one
 * JSON line, case S in bf16, checked against the reference by bench itself; --shape runs a case of
 * one's own; a bad --dtype, --cases or --shape value fails naming the value. */
TEST(cli_bench_dtype_cases) {
  char out[8192];
  int rc = bench_run("--dtype bf16 --cases S --routing uniform --dispatch dynamic --reps 1 --json", out, sizeof out);
  if (rc != 0) FAIL_("moe bench failed (%d): %s", rc, err_text);
  int lines = 0;
  for (const char *p = out; (p = strchr(p, '\n')); p++) lines++;
  ASSERT_EQ_INT(lines, 1);
  ASSERT(strstr(out, "\"case\": \"S\""));
  ASSERT(strstr(out, "\"dtype\": \"bf16\""));
  ASSERT(strstr(out, "\"roofline_ratio\": "));
  ASSERT(!strstr(out, "\"case\": \"M\"") && !strstr(out, "\"case\": \"L\""));

  ASSERT(strstr(out, "\"fwd_cached_ms\": ")); /* bench fails if the cached forward's bits differ */
  /* the CPU as an object: its caches and features, and the small GEMMs' blocks */
  cJSON *j = cJSON_Parse(out), *cpu = cJSON_GetObjectItem(j, "cpu");
  if (!cJSON_IsObject(cpu)) FAIL_("no \"cpu\" object in %s", out);
  const char *nums[] = {"family", "model_number", "l1d_bytes", "l2_bytes", "l3_bytes", "cpus", "gemm_kc", "gemm_kc_nt"};
  for (int i = 0; i < 8; i++)
    if (!cJSON_IsNumber(cJSON_GetObjectItem(cpu, nums[i]))) FAIL_("\"cpu\" has no number \"%s\": %s", nums[i], out);
  ASSERT(cJSON_IsArray(cJSON_GetObjectItem(cpu, "features")) && cJSON_IsString(cJSON_GetObjectItem(cpu, "model")));
  ASSERT(cJSON_GetObjectItem(cpu, "gemm_kc_nt")->valueint == 2 * cJSON_GetObjectItem(cpu, "gemm_kc")->valueint);
  ASSERT(cJSON_GetObjectItem(cpu, "cpus")->valueint >= 1);
  cJSON_Delete(j);

  /* both routings and dispatches; --progress: a line per case on stderr, stdout still JSON only */
  rc = bench_run("--shape 300,16,24,6,2 --reps 1 --json --progress", out, sizeof out);
  if (rc != 0) FAIL_("moe bench --shape failed (%d): %s", rc, err_text);
  lines = 0;
  int json = out[0] == '{';
  for (const char *p = out; (p = strchr(p, '\n')); p++) lines++, json &= p[1] == '{' || !p[1];
  ASSERT_EQ_INT(lines, 4);
  ASSERT(json);
  if (!strstr(err_text, "case custom skewed static f32 [====================] 1/1 ") || !strstr(err_text, " steps/s ETA "))
    FAIL_("no progress line for case custom skewed static in stderr '%s'", err_text);
  ASSERT(strstr(out, "\"case\": \"custom\", \"T\": 300, \"D\": 16, \"H\": 24, \"E\": 6, \"k\": 2"));
  ASSERT(bench_run("--shape 300,16,24,2,3 --reps 1 --json", out, sizeof out) != 0); /* k > E */
  if (!strstr(err_text, "--shape") || !strstr(err_text, "'300,16,24,2,3'"))
    FAIL_("stderr '%s' does not name --shape", err_text);

  ASSERT(bench_run("--dtype f16 --cases S --reps 1 --json", out, sizeof out) != 0);
  if (!strstr(err_text, "--dtype") || !strstr(err_text, "'f16'"))
    FAIL_("stderr '%s' does not name --dtype f16", err_text);
  ASSERT(!strstr(out, "\"case\""));
  ASSERT(bench_run("--cases S,X --reps 1 --json", out, sizeof out) != 0);
  if (!strstr(err_text, "--cases") || !strstr(err_text, "'X'"))
    FAIL_("stderr '%s' does not name --cases X", err_text);
  ASSERT(!strstr(out, "\"case\""));
  ASSERT(bench_run("--cases S,S --reps 1 --json", out, sizeof out) != 0);
  if (!strstr(err_text, "'S' given twice")) FAIL_("stderr '%s' does not name the repeated S", err_text);
}

/* moe bench --optimizer-params: a JSON line per count, each with its parameters, threads and a time
 * (a step over 2^16 parameters is under a millisecond but never zero); a list it cannot read, or
 * --expert-parallel beside it, fails naming the flag and the value. */
TEST(cli_bench_optimizer_params) {
  char out[4096];
  int rc = bench_run("--optimizer-params 1000,65536 --threads 1 --reps 2 --json", out, sizeof out);
  if (rc != 0) FAIL_("moe bench --optimizer-params failed (%d): %s", rc, err_text);
  ASSERT(strstr(out, "{\"optimizer\": \"adam\", \"params\": 1000, \"threads\": 1, \"step_ms\": "));
  const char *big = strstr(out, "\"params\": 65536, \"threads\": 1, \"step_ms\": ");
  ASSERT(big);
  /* the offsets are the keys' lengths: one more skipped a value's first digit (1.00 read as .00) */
  double ms = atof(strstr(big, "\"step_ms\": ") + strlen("\"step_ms\": "));
  double gbs = atof(strstr(big, "\"gb_per_s\": ") + strlen("\"gb_per_s\": "));
  if (!(ms > 0 && gbs > 0)) FAIL_("step_ms %g, gb_per_s %g in '%s'", ms, gbs, out);
  ASSERT(!strstr(out, "\"case\""));
  const char *bad[] = {"0", "12,", "7x", "2000000000"};
  for (int i = 0; i < 4; i++) {
    char args[128];
    snprintf(args, sizeof args, "--optimizer-params %s --reps 1", bad[i]);
    ASSERT(bench_run(args, out, sizeof out) != 0);
    if (!strstr(err_text, "--optimizer-params") || !strstr(err_text, bad[i])) FAIL_("stderr '%s' for '%s'", err_text, bad[i]);
  }
  ASSERT(bench_run("--optimizer-params 1000 --expert-parallel", out, sizeof out) != 0);
  if (!strstr(err_text, "--expert-parallel")) FAIL_("stderr '%s' does not name --expert-parallel", err_text);
}

/* --flag=value is --flag value, for every subcommand (the split happens before dispatch). */
TEST(cli_flag_equals_value) {
  char w[512], x[512], a[512], b[512], args[2048];
  fixture("w.safetensors", w, sizeof w);
  fixture("x.safetensors", x, sizeof x);
  test_tmp_path("eq_a.safetensors", a, sizeof a);
  test_tmp_path("eq_b.safetensors", b, sizeof b);
  ASSERT_EQ_INT(layer_run(w, x, a, "--backward --priority score"), 0);
  snprintf(args, sizeof args, "layer-run --weights='%s' --input='%s' --out='%s' --backward --priority=score", w, x, b);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err_text, sizeof err_text), 0);
  ASSERT(test_same_file(a, b));
  ASSERT_EQ_INT(run_moe(NULL, "train --epochs=zero", NULL, err_text, sizeof err_text), 1);
  ASSERT(strstr(err_text, "--epochs: bad value 'zero'"));
}

/* Every subcommand answers --help (anywhere among its flags) with its usage on stdout and exit 0. */
TEST(cli_help_everywhere) {
  const char *cmds[] = {"train", "eval", "bench", "layer-run", "infer", "trace", "cachesim", "placement",
                        "plot-trace", "compare"};
  char out[512], args[256], text[4096], want[64];
  test_tmp_path("help.txt", out, sizeof out);
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    snprintf(args, sizeof args, "%s --threads 1 --help", cmds[i]);
    int rc = run_moe(NULL, args, out, err_text, sizeof err_text);
    test_read_text(out, text, sizeof text);
    snprintf(want, sizeof want, "usage: moe %s", cmds[i]);
    if (rc != 0 || strncmp(text, want, strlen(want)))
      FAIL_("moe %s: exit %d, stdout '%.80s' (want '%s...'), stderr '%s'", args, rc, text, want, err_text);
  }
}

/* Values a command cannot use are refused by name: infer's --policy belady (it needs the future) and a
 * language model's directory, and cachesim's --cache larger than the trace's experts; and cachesim --json. */
TEST(cli_refuses_unusable_values) {
  char trace[512], args[1024];
  ASSERT_EQ_INT(run_moe(NULL, "infer --checkpoint none.ck --cache 2 --policy belady", NULL, err_text, sizeof err_text), 1);
  ASSERT(strstr(err_text, "want lifo|lru|fifo"));
  /* a language model's directory: infer runs the classifier; the message names the commands that serve it */
  snprintf(args, sizeof args, "infer --checkpoint '%s/lm/qwen3_moe' --cache 1", test_fixture_dir());
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err_text, sizeof err_text), 1);
  if (!strstr(err_text, "language model's directory") || !strstr(err_text, "moe serve --cache K"))
    FAIL_("moe %s: %s", args, err_text);
  test_tmp_path("small_trace.csv", trace, sizeof trace);
  FILE *f = fopen(trace, "w");
  ASSERT(f);
  fputs("step,layer,expert,tokens\n0,0,0,1\n0,0,7,2\n", f);
  fclose(f);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy lru --cache 20", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err_text, sizeof err_text), 1);
  ASSERT(strstr(err_text, "--cache 20: more slots than the trace's 8 experts"));
  /* --json: a line per layer and one overall, JSON only */
  char out[512], text[1024];
  test_tmp_path("cachesim.jsonl", out, sizeof out);
  snprintf(args, sizeof args, "cachesim --trace '%s' --policy all --cache 1 --json", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err_text, sizeof err_text), 0);
  test_read_text(out, text, sizeof text);
  ASSERT(!strcmp(text, "{\"layer\": 0, \"accesses\": 2, \"miss_rate\": {\"lifo\": 1.000000, \"lru\": 1.000000, "
                       "\"fifo\": 1.000000, \"belady\": 1.000000, \"lfu\": 1.000000, \"lfru\": 1.000000}}\n{\"layer\": "
                       "\"overall\", \"accesses\": 2, \"miss_rate\": {\"lifo\": 1.000000, \"lru\": 1.000000, \"fifo\": "
                       "1.000000, \"belady\": 1.000000, \"lfu\": 1.000000, \"lfru\": 1.000000}}\n"));
}

/* Without data, train says how to get it. */
TEST(cli_missing_data_says_how_to_get_it) {
  char dir[512], args[1024];
  test_tmp_path("no_such_data", dir, sizeof dir);
  snprintf(args, sizeof args, "train --data '%s' --epochs 1", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err_text, sizeof err_text), 1);
  ASSERT(strstr(err_text, "scripts/get-mnist.sh") && strstr(err_text, "--data DIR"));
}

/* placement --json: a JSON line per layer on stdout, the heading on stderr. Expert 0 takes 3 of every
 * 4 tokens and expert 1 the other: the contiguous layout puts both on device 0 (max load 1), greedy
 * puts them apart (3/4). */
TEST(cli_placement_json) {
  char trace[512], out[512], args[1024], text[1024];
  test_tmp_path("placement_trace.csv", trace, sizeof trace);
  FILE *f = fopen(trace, "w");
  ASSERT(f);
  fputs("step,layer,expert,tokens\n", f);
  for (int s = 0; s < 4; s++) fprintf(f, "%d,0,0,3\n%d,0,1,1\n", s, s);
  fclose(f);
  test_tmp_path("placement.jsonl", out, sizeof out);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method greedy --experts 4 --json", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err_text, sizeof err_text), 0);
  test_read_text(out, text, sizeof text);
  const char *want = "{\"layer\": 0, \"test_batches\": 2, \"max_load\": {\"original\": 1.000000, \"greedy\": 0.750000}, "
                     "\"avg_max_load\": {\"original\": 1.000000, \"greedy\": 0.750000}, \"expert_device\": [0, 1, 1, 0]}\n";
  if (strcmp(text, want)) FAIL_("stdout '%s', want '%s'", text, want);
  ASSERT(strstr(err_text, "placement: 4 experts on 2 devices"));
}

/* moe compare --json: a JSON line per tensor of REF, then the totals; a tensor that differs is
 * "ok": false and the exit is 1. */
TEST(cli_compare_json) {
  char x[512], y[512], out[512], args[2048], err[4096];
  fixture("x.safetensors", x, sizeof x);
  fixture("ref.safetensors", y, sizeof y); /* other tensors: the ones of x are missing from it */
  test_tmp_path("compare.json", out, sizeof out);
  snprintf(args, sizeof args, "compare '%s' '%s' --json", x, x);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *j = test_read_file(out, NULL);
  ASSERT(j);
  int ok = !strncmp(j, "{\"tensor\":\"x\",\"max_abs_err\":0,\"rel\":0,\"ok\":true}\n", 48) &&
           strstr(j, "{\"tensors\":5,\"differ\":0,");
  if (!ok) fprintf(stderr, "  printed: %s", j);
  free(j);
  ASSERT(ok);
  snprintf(args, sizeof args, "compare '%s' '%s' --json", y, x);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
  j = test_read_file(out, NULL);
  ASSERT(j);
  ok = !strncmp(j, "{\"tensor\":\"x\",\"ok\":false,\"error\":", 33) && strstr(j, "no tensor 'x'") &&
       strstr(j, "{\"tensors\":5,\"differ\":5,") && strstr(err, "no tensor 'x'");
  if (!ok) fprintf(stderr, "  printed: %s, stderr: %s\n", j, err);
  free(j);
  ASSERT(ok);
}

/* moe bench --lm: one JSON line with the prefill and decode counts, positive speeds, and the weight
 * bytes a decode step reads, counted here by hand for the Mixtral fixture (untied): per layer the
 * attention's projections, two norms, the router and k of the E experts; the head, one embedding row
 * and the final norm. Both token counts 0: the load alone, its seconds and the bytes mapped. */
TEST(cli_bench_lm_json) {
  char out[4096], args[1024], dir[600];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  snprintf(args, sizeof args, "--lm '%s' --prompt-tokens 16 --gen-tokens 4 --reps 1 --threads 1 --json", dir);
  int rc = bench_run(args, out, sizeof out);
  if (rc != 0) FAIL_("moe bench --lm failed (%d): %s", rc, err_text);
  cJSON *j = cJSON_Parse(out);
  ASSERT(j);
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(dir, &c));
  ASSERT(!c.tie_embeddings && c.family == MOE_LM_MIXTRAL);
  double D = c.moe.D, q = (double)c.n_heads * c.head_dim, kv = (double)c.n_kv_heads * c.head_dim;
  double layer = D * (q + 2 * kv) + q * D + 2 * D + c.moe.E * D + c.moe.top_k * 3.0 * c.moe.H * D;
  double bytes = 4 * (c.n_layers * layer + c.vocab * D + 2 * D);
  ASSERT_EQ_INT((int)cJSON_GetObjectItem(j, "prefill_tokens")->valuedouble, 16);
  ASSERT_EQ_INT((int)cJSON_GetObjectItem(j, "decode_tokens")->valuedouble, 4);
  ASSERT(cJSON_GetObjectItem(j, "prefill_tok_s")->valuedouble > 0 && cJSON_GetObjectItem(j, "decode_tok_s")->valuedouble > 0);
  double got = cJSON_GetObjectItem(j, "decode_weight_bytes")->valuedouble;
  if (got != bytes) FAIL_("decode_weight_bytes %.0f, the tensors give %.0f", got, bytes);
  cJSON_Delete(j);
  ASSERT(bench_run("--lm /nonexistent --reps 1", out, sizeof out) != 0);
  ASSERT(strstr(err_text, "/nonexistent"));
  snprintf(args, sizeof args, "--lm '%s' --prompt-tokens 0 --gen-tokens 0 --json", dir); /* the load alone */
  ASSERT_EQ_INT(bench_run(args, out, sizeof out), 0);
  j = cJSON_Parse(out);
  ASSERT(j);
  int load_only = cJSON_GetObjectItem(j, "load_s") && cJSON_GetObjectItem(j, "load_s")->valuedouble > 0 &&
                  cJSON_GetObjectItem(j, "mapped_bytes") && !cJSON_GetObjectItem(j, "prefill_tok_s") &&
                  !cJSON_GetObjectItem(j, "decode_tok_s");
  cJSON_Delete(j);
  ASSERT(load_only);
}
