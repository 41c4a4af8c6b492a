/* moe placement --method flexmoe: FlexMoE's policy maker over a recorded trace (DESIGN 3.4). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_cli.h"
#include "test.h"

/* A trace of 6 steps of 8 experts: experts 0 and 1 take 300 tokens a step each, the other six 40: on 4 devices with 3 slots, rank 0
 * (experts 0, 1) has 600 of 840 tokens, a balance ratio of 2.86. The first step's plan must bring the
 * ratio under the threshold with a lower modelled step, and no step's plan may raise the model's step
 * time (P3 check (b)); later steps find the placement balanced and change nothing. */
static int skewed_trace(char *trace, size_t n) {
  test_tmp_path("flex_trace.csv", trace, n);
  FILE *f = fopen(trace, "w");
  if (!f) return 0;
  fputs("step,layer,expert,tokens\n", f);
  for (int s = 0; s < 6; s++)
    for (int e = 0; e < 8; e++) fprintf(f, "%d,0,%d,%d\n", s, e, e < 2 ? 300 : 40);
  return fclose(f) == 0;
}

TEST(flex_placement_balances_a_skewed_trace) {
  char trace[512], out[512], args[1200], err[4096], text[8192];
  ASSERT(skewed_trace(trace, sizeof trace));
  test_tmp_path("flex_placement.jsonl", out, sizeof out);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 4 --method flexmoe --json", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  ASSERT(strstr(err, "flexmoe, 8 experts on 4 devices with 3 slots each"));
  test_read_text(out, text, sizeof text);
  int steps = 0, ops = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), steps++) {
    double b0, b1, t0, t1, x;
    int step, ne, ns, nm;
    if (sscanf(line, "{\"step\": %d, \"balance_before\": %lf, \"balance_after\": %lf, \"time_before\": %lf, "
                     "\"time_after\": %lf, \"xfer_s\": %lf, \"expand\": %d, \"shrink\": %d, \"migrate\": %d}",
               &step, &b0, &b1, &t0, &t1, &x, &ne, &ns, &nm) != 9)
      FAIL_("line %d: '%s'", steps, line);
    ASSERT_EQ_INT(step, steps);
    if (t1 > t0) FAIL_("step %d: the plan raised the modelled step from %g to %g s", step, t0, t1);
    if (step == 0) {
      ASSERT_NEAR(b0, 600.0 / 210, 1e-4);
      if (b1 > 1.2 || t1 >= t0 || ne < 1 || ne != ns) FAIL_("step 0: %s", line);
    } else if (b1 > 1.2)
      FAIL_("step %d: balance %g after the plan", step, b1);
    ops += step ? ne + ns + nm : 0;
  }
  ASSERT_EQ_INT(steps, 6);
  ASSERT_EQ_INT(ops, 0); /* the same counts every step: balanced once, left alone */
}

TEST(flex_placement_rejects_bad_flags) {
  char args[1200], err[4096], trace[512];
  ASSERT(skewed_trace(trace, sizeof trace));
  snprintf(args, sizeof args, "placement --trace '%s' --devices 2 --method flexmoe --balance-threshold 0.5", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "--balance-threshold: bad value '0.5'"));
  snprintf(args, sizeof args, "placement --trace '%s' --devices 3 --method flexmoe --slots 2", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "cannot hold E=8 experts"));
}

/* --plot: an 800 x 520 PNG of the ratio and the modelled step over the steps, its scales on stdout
 * (the ratio's top is the first step's 600/210 before its plan). */
TEST(flex_placement_plots_ratio_and_time) {
  char trace[512], png[512], out[512], args[1400], err[4096], text[8192];
  ASSERT(skewed_trace(trace, sizeof trace));
  test_tmp_path("flex_placement.png", png, sizeof png);
  test_tmp_path("flex_placement.txt", out, sizeof out);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 4 --method flexmoe --plot '%s'", trace, png);
  if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("placement --plot: %s", err);
  test_read_text(out, text, sizeof text);
  if (!strstr(text, "flex_placement.png: balance ratio 1 to 2.857 (top, threshold 1.2 in grey), modelled step 0 to"))
    FAIL_("output: %s", text);
  size_t n = 0;
  unsigned char *b = (unsigned char *)test_read_file(png, &n);
  ASSERT(b && n > 24);
  ASSERT(!memcmp(b, "\x89PNG\r\n\x1a\n", 8) && !memcmp(b + 12, "IHDR", 4));
  ASSERT_EQ_INT((b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19]), 800);
  ASSERT_EQ_INT((b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23]), 520);
  free(b);
  snprintf(args, sizeof args, "placement --trace '%s' --devices 4 --method flexmoe --plot /nonexistent/x.png", trace);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  if (!strstr(err, "/nonexistent/x.png")) FAIL_("stderr: %s", err);
}
