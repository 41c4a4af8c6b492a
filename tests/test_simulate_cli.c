/* `moe simulate`: the text and JSON reports, the sweep's CSV, and bad configs refused with a message
 * naming the field and the value. */
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "run_cli.h"
#include "sim/sim.h"
#include "test.h"

/* A 2-node x 2-device config with `extra` appended to its fields. */
static const char *sim_config(const char *name, const char *extra, char *buf, size_t n) {
  test_tmp_path(name, buf, n);
  FILE *f = fopen(buf, "w");
  fprintf(f, "{\"nodes\": 2, \"devices_per_node\": 2, \"intra_bw\": 1e11, \"intra_lat\": 5e-6,"
             " \"inter_bw\": 1e10, \"inter_lat\": 2e-5, \"gemm_flops\": 1e13, \"tokens\": 2048,"
             " \"d_model\": 512, \"hidden\": 2048, \"experts\": 4, \"top_k\": 2%s}", extra);
  fclose(f);
  return buf;
}

static char sim_out[4096], sim_err[2048];

static int sim_moe(const char *args) {
  char o[512];
  test_tmp_path("simulate_stdout.txt", o, sizeof o);
  int rc = run_moe(NULL, args, o, sim_err, sizeof sim_err);
  test_read_text(o, sim_out, sizeof sim_out);
  return rc;
}

TEST(simulate_cli_reports) {
  char p[512], args[1024];
  snprintf(args, sizeof args, "simulate --config %s",
           sim_config("sim_ok.json", ", \"pipeline\": \"auto\", \"zipf\": 1, \"flex\": true", p, sizeof p));
  if (sim_moe(args) != 0) FAIL_("exit non-zero: %s", sim_err);
  if (!strstr(sim_out, "4 devices (2 nodes x 2)") || !strstr(sim_out, "(Algorithm 1 over simulated trial steps)") ||
      !strstr(sim_out, "FlexMoE: balance ratio"))
    FAIL_("unexpected report:\n%s", sim_out);
  snprintf(args, sizeof args, "simulate --config %s --json", p);
  if (sim_moe(args) != 0) FAIL_("--json exit non-zero: %s", sim_err);
  cJSON *j = cJSON_Parse(sim_out);
  if (!j) FAIL_("not JSON: %s", sim_out);
  double step = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_s"));
  double before = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_before_s"));
  int msgs = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "a2a_msgs"));
  cJSON_Delete(j);
  ASSERT(step > 0 && before >= step);
  ASSERT_EQ_INT(msgs, 3);
}

TEST(simulate_cli_sweep_csv) {
  char p[512], csv[512], svg[512], args[2048];
  test_tmp_path("sim_sweep.csv", csv, sizeof csv);
  test_tmp_path("sim_sweep.svg", svg, sizeof svg);
  snprintf(args, sizeof args, "simulate --config %s --sweep devices=2,4,32 -o %s --plot %s",
           sim_config("sim_sweep.json", ", \"a2a\": \"2dh\"", p, sizeof p), csv, svg);
  if (sim_moe(args) != 0) FAIL_("exit non-zero: %s", sim_err);
  char text[8192];
  test_read_text(csv, text, sizeof text);
  int rows = 0;
  for (char *s = text; (s = strchr(s, '\n')); s++) rows++;
  if (rows != 4 || strncmp(text, "devices,devices,nodes,experts,", 30) || !strstr(text, "\n32,32,16,32,2048,"))
    FAIL_("CSV:\n%s", text);
  /* The chart: three lines (step, compute, exposed communication) of three points each, on a log axis. */
  test_read_text(svg, text, sizeof text);
  int lines = 0, points = 0;
  for (char *s = text; (s = strstr(s, "<polyline")); s++, lines++)
    for (char *q = strstr(s, "points=\""); *q != '/'; q++) points += *q == ',';
  if (lines != 3 || points != 9 || !strstr(text, "devices (log scale)") || !strstr(text, "</svg>"))
    FAIL_("SVG (%d lines, %d points):\n%s", lines, points, text);
  /* The PNG: a PNG signature and the raster's 720 x 420 in its header; another image type refused. */
  char png[512];
  test_tmp_path("sim_sweep.png", png, sizeof png);
  snprintf(args, sizeof args, "simulate --config %s --sweep devices=2,4,32 --plot %s", p, png);
  if (sim_moe(args) != 0) FAIL_("--plot PNG exit non-zero: %s", sim_err);
  FILE *f = fopen(png, "rb");
  unsigned char head[24] = {0};
  size_t got = f ? fread(head, 1, sizeof head, f) : 0;
  if (f) fclose(f);
  if (got != 24 || memcmp(head, "\x89PNG\r\n\x1a\n", 8) || memcmp(head + 12, "IHDR", 4) ||
      (head[18] << 8 | head[19]) != 720 || (head[22] << 8 | head[23]) != 420)
    FAIL_("%s: not a 720 x 420 PNG (%zu bytes read)", png, got);
  snprintf(args, sizeof args, "simulate --config %s --sweep devices=2 --plot out.jpg", p);
  ASSERT(sim_moe(args) != 0);
  if (!strstr(sim_err, "unknown image type")) FAIL_("stderr: %s", sim_err);
  snprintf(args, sizeof args, "simulate --config %s --sweep nodes=2", p);
  ASSERT(sim_moe(args) != 0);
  if (!strstr(sim_err, "unknown key 'nodes'")) FAIL_("stderr: %s", sim_err);
  snprintf(args, sizeof args, "simulate --config %s --sweep devices=3", p);
  ASSERT(sim_moe(args) != 0);
  if (!strstr(sim_err, "3 is not a multiple of devices_per_node 2")) FAIL_("stderr: %s", sim_err);
}

TEST(simulate_cli_bad_configs) {
  static const char *const cases[][2] = {
      {", \"experst\": 4", "unknown field \"experst\""},
      {", \"pipeline\": \"fast\"", "\"pipeline\" is \"fast\", want a count >= 1 or \"auto\""},
      {", \"a2a\": \"ring\"", "ring"},
      {", \"reuse\": \"s2\"", "\"reuse\" s2 offloads to the host: \"host_bw\" is required"},
      {", \"capacity_factor\": -1", "\"capacity_factor\" is -1, want a number in [0,"},
      {", \"load\": [1, 2]", "\"load\" must be an array of 4 numbers (one per expert), has 2"},
      {", \"zipf\": 1, \"load\": [1, 1, 1, 1]", "give \"zipf\" or \"load\", not both"},
      {", \"flex\": 1", "\"flex\" must be true or false"},
      {", \"r\": 2", "\"r\" is 2, want a number in [0, 1]"},
      {", \"dispatch\": \"static\"", "\"dispatch\" static pads to the capacity: \"capacity_factor\" is required"},
  };
  char p[512], args[1024];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(args, sizeof args, "simulate --config %s", sim_config("sim_bad.json", cases[i][0], p, sizeof p));
    int rc = sim_moe(args);
    if (rc == 0 || !strstr(sim_err, cases[i][1]) || !strstr(sim_err, p))
      FAIL_("config with%s: exit %d, stderr '%s', want '%s' and the path", cases[i][0], rc, sim_err, cases[i][1]);
  }
  test_tmp_path("sim_bad.json", p, sizeof p);
  FILE *f = fopen(p, "w");
  fputs("{\"devices_per_node\": 4, \"intra_bw\": 1e9, \"intra_lat\": 0, \"gemm_flops\": 1e9, \"tokens\": 8,"
        " \"d_model\": 4, \"hidden\": 4, \"experts\": 6}", f);
  fclose(f);
  snprintf(args, sizeof args, "simulate --config %s", p);
  ASSERT(sim_moe(args) != 0);
  if (!strstr(sim_err, "\"experts\" is 6: neither a multiple nor a divisor of the 4 devices")) FAIL_("stderr: %s", sim_err);
  f = fopen(p, "w");
  fputs("{\"devices_per_node\": 4}", f);
  fclose(f);
  ASSERT(sim_moe(args) != 0);
  if (!strstr(sim_err, "field \"intra_bw\" is required")) FAIL_("stderr: %s", sim_err);
}

/* --calibrate (moe_sim_calibrate_config) writes a config of this machine's rates, one node of this one
 * rank, that moe_sim_config_load reads and --config runs (the rates' values not asserted: timing). */
TEST(simulate_cli_calibrate) {
  char p[512], args[1024];
  test_tmp_path("sim_machine.json", p, sizeof p);
  snprintf(args, sizeof args, "simulate --calibrate --threads 1 -o %s", p);
  if (sim_moe(args) != 0) FAIL_("exit non-zero: %s", sim_err);
  moe_sim_config *c;
  ASSERT_OK(moe_sim_config_load(p, &c));
  int dpn = c->dpn, rates = c->gemm_flops > 0 && c->intra_bw > 0 && c->mem_bw >= 0;
  moe_sim_config_free(c);
  ASSERT_EQ_INT(dpn, 1);
  ASSERT(rates);
  snprintf(args, sizeof args, "simulate --config %s --json", p);
  if (sim_moe(args) != 0) FAIL_("the calibrated config does not run: %s", sim_err);
  cJSON *j = cJSON_Parse(sim_out);
  double step = j ? cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_s")) : 0;
  cJSON_Delete(j);
  if (!(step > 0)) FAIL_("output: %s", sim_out);
}

/* A serving run by hand: one layer of 4 experts (D 8, H 16) at 1 GFLOP/s, 2 slots (LIFO), 1 MB/s to
 * the slow memory. Steps {0: 2, 1: 2}, {0: 4}, {2: 4}, {1: 4} tokens: misses 0, 1 (cold), hit 0, miss 2
 * (evicting 1, the last in), miss 1: hit rate 1/5. A miss reads (2 D H + D + H) 4 bytes = 1.12 ms; an
 * expert of r rows computes its two GEMMs in 2 x 2 D H r / 1e9 s = 0.512 r us, after its fetch: step 0
 * ends at 2 x 1.12 ms + 1.024 us, the others take 2.048 us more than their fetch, if any. */
TEST(simulate_cli_serving_run) {
  char trace[512], p[512], args[1024];
  test_tmp_path("sim_serve_trace.csv", trace, sizeof trace);
  FILE *f = fopen(trace, "w");
  fputs("step,layer,expert,tokens\n0,0,0,2\n0,0,1,2\n1,0,0,4\n2,0,2,4\n3,0,1,4\n", f);
  fclose(f);
  for (int k = 2; k >= 0; k -= 2) {
    test_tmp_path("sim_serve.json", p, sizeof p);
    f = fopen(p, "w");
    fprintf(f, "{\"devices_per_node\": 1, \"intra_bw\": 1e9, \"intra_lat\": 0, \"gemm_flops\": 1e9, \"tokens\": 4,"
               " \"d_model\": 8, \"hidden\": 16, \"experts\": 4, \"serve_trace\": \"%s\", \"cache_experts\": %d%s}",
            trace, k, k ? ", \"fetch_bw\": 1e6" : "");
    fclose(f);
    snprintf(args, sizeof args, "simulate --config %s --json", p);
    if (sim_moe(args) != 0) FAIL_("K %d: exit non-zero: %s", k, sim_err);
    cJSON *j = cJSON_Parse(sim_out);
    if (!j) FAIL_("not JSON: %s", sim_out);
    double hit = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "hit_rate"));
    double tok = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "token_s"));
    int misses = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "misses"));
    int tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "tokens"));
    cJSON_Delete(j);
    ASSERT_EQ_INT(tokens, 16);
    ASSERT_EQ_INT(misses, k ? 4 : 0);
    ASSERT_NEAR(hit, k ? 0.2 : 1.0, 1e-12);
    double run = k ? 2 * 1.12e-3 + 1.024e-6 + 2.048e-6 + 2 * (1.12e-3 + 2.048e-6) : 16 * 0.512e-6;
    ASSERT_NEAR(tok, run / 16, 1e-15);
  }
  /* BELADY needs the future; a cache without a trace is no serving run. */
  const char *bad[2][2] = {{", \"serve_trace\": \"t.csv\", \"cache_experts\": 2, \"fetch_bw\": 1e6, \"cache_policy\": \"belady\"",
                            "\"cache_policy\" must be \"lifo\", \"lru\" or \"fifo\""},
                           {", \"cache_experts\": 2, \"fetch_bw\": 1e6", "\"serve_trace\" is required"}};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "simulate --config %s", sim_config("sim_serve_bad.json", bad[i][0], p, sizeof p));
    ASSERT(sim_moe(args) != 0);
    if (!strstr(sim_err, bad[i][1])) FAIL_("config %d: stderr: %s", i, sim_err);
  }
}
