/* Expert traces written (DESIGN 4.4; trace.c reads them): "step,layer,expert,tokens" rows in a memory
 * stream, written to the file atomically on close, so a run that stops half-way leaves the file it
 * had, never half of one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct moe_trace_writer {
  FILE *f; /* an open_memstream over buf */
  char *buf;
  size_t len;
  char *path;
};

moe_status moe_trace_writer_open(moe_trace_writer **out, const char *path, int64_t from) {
  MOE_TRY(out && path, MOE_ERR_ARG, "moe_trace_writer_open: NULL argument");
  moe_trace_writer *t = calloc(1, sizeof *t);
  MOE_TRY(t, MOE_ERR_NOMEM, "moe_trace_writer_open: out of memory");
  t->path = strdup(path);
  t->f = t->path ? open_memstream(&t->buf, &t->len) : NULL;
  if (!t->f) {
    free(t->path), free(t);
    return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "trace %s: out of memory", path);
  }
  fprintf(t->f, "step,layer,expert,tokens\n");
  FILE *old = from > 0 ? fopen(path, "r") : NULL;
  if (old) { /* a resumed run: the steps before it stay in the trace */
    char line[256];
    long long s;
    while (fgets(line, sizeof line, old))
      if (sscanf(line, "%lld,", &s) == 1 && s < from) fputs(line, t->f);
    fclose(old);
  }
  *out = t;
  return MOE_OK;
}

moe_status moe_trace_writer_add(moe_trace_writer *t, int64_t step, int layer, int expert, int tokens) {
  MOE_TRY(t && step >= 0 && layer >= 0 && expert >= 0 && tokens >= 0, MOE_ERR_ARG,
          "moe_trace_writer_add: step %lld, layer %d, expert %d, tokens %d (want a writer and no negative value)",
          (long long)step, layer, expert, tokens);
  if (tokens) fprintf(t->f, "%lld,%d,%d,%d\n", (long long)step, layer, expert, tokens);
  MOE_TRY(!ferror(t->f), MOE_ERR_NOMEM, "trace %s: out of memory", t->path);
  return MOE_OK;
}

moe_status moe_trace_writer_add_model(moe_trace_writer *t, const moe_model_t *m, int64_t step) {
  MOE_TRY(t && m, MOE_ERR_ARG, "moe_trace_writer_add_model: NULL argument");
  for (int l = 0; l < m->cfg.blocks; l++) {
    const int32_t *c = moe_model_layer_stats(m, l)->expert_counts;
    for (int e = 0; e < m->cfg.moe.E; e++) MOE_CHECK(moe_trace_writer_add(t, step, l, e, c[e]));
  }
  return MOE_OK;
}

moe_status moe_trace_writer_add_counts(moe_trace_writer *t, int64_t step, const int32_t *counts, int layers, int experts) {
  MOE_TRY(t && counts, MOE_ERR_ARG, "moe_trace_writer_add_counts: NULL argument");
  for (int l = 0; l < layers; l++)
    for (int e = 0; e < experts; e++) MOE_CHECK(moe_trace_writer_add(t, step, l, e, counts[(size_t)l * experts + e]));
  return MOE_OK;
}

moe_status moe_trace_writer_close(moe_trace_writer *t) {
  if (!t) return MOE_OK;
  int bad = ferror(t->f) != 0; /* a row add could not keep: never a file without it */
  bad |= fclose(t->f) != 0;
  moe_status st = bad ? moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "trace %s: out of memory", t->path)
                      : moe_write_file_atomic(t->path, t->buf, t->len);
  free(t->buf), free(t->path), free(t);
  return st;
}
