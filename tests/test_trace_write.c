/* The expert-trace writer (src/serve/trace_write.c): what it writes moe_trace_load reads back cell for
 * cell; opened at a later step it keeps the existing file's earlier rows and drops the rest; nothing
 * reaches the file before close (written whole, atomically); a path it cannot write and bad rows are
 * errors naming them. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"

TEST(trace_writer_round_trip_and_resume) {
  char path[512];
  test_tmp_path("trace_write.csv", path, sizeof path);
  moe_trace_writer *t;
  ASSERT_OK(moe_trace_writer_open(&t, path, 0));
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < 2; l++) ASSERT_OK(moe_trace_writer_add(t, s, l, (s + l) % 3, 10 * s + l + 1));
  ASSERT_OK(moe_trace_writer_add(t, 4, 1, 2, 0)); /* no tokens: no row */
  struct stat sb;
  ASSERT(stat(path, &sb) != 0); /* nothing written before close */
  ASSERT_OK(moe_trace_writer_close(t));
  moe_trace tr;
  ASSERT_OK(moe_trace_load(&tr, path, 3));
  ASSERT(tr.steps == 4 && tr.layers == 2 && tr.experts == 3);
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < 2; l++)
      for (int e = 0; e < 3; e++) {
        int want = e == (s + l) % 3 ? 10 * s + l + 1 : 0, got = tr.tokens[(s * 2 + l) * 3 + e];
        if (got != want) FAIL_("step %d layer %d expert %d: %d tokens, want %d", s, l, e, got, want);
      }
  moe_trace_free(&tr);
  ASSERT_OK(moe_trace_writer_open(&t, path, 2)); /* resumed at step 2: steps 0 and 1 stay, 2 and 3 go */
  ASSERT_OK(moe_trace_writer_add(t, 2, 0, 0, 7));
  ASSERT_OK(moe_trace_writer_close(t));
  ASSERT_OK(moe_trace_load(&tr, path, 3));
  ASSERT(tr.steps == 3 && tr.tokens[(0 * 2 + 1) * 3 + 1] == 2 && tr.tokens[(1 * 2 + 0) * 3 + 1] == 11);
  ASSERT(tr.tokens[(2 * 2 + 0) * 3 + 0] == 7 && tr.tokens[(2 * 2 + 0) * 3 + 2] == 0);
  moe_trace_free(&tr);
}

TEST(trace_writer_errors_name_the_problem) {
  moe_trace_writer *t;
  ASSERT_OK(moe_trace_writer_open(&t, "/nonexistent-dir/trace.csv", 0));
  ASSERT_STATUS(moe_trace_writer_add(t, 0, -1, 0, 1), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "layer -1"));
  ASSERT_OK(moe_trace_writer_add(t, 0, 0, 0, 1));
  ASSERT(moe_trace_writer_close(t) != MOE_OK);
  if (!strstr(moe_last_error(), "/nonexistent-dir/trace.csv")) FAIL_("the error names no path: %s", moe_last_error());
  ASSERT_OK(moe_trace_writer_close(NULL));
}
