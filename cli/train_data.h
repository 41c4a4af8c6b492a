/* What moe train and moe eval share: loading a split of an IDX data directory, and writing the expert
 * trace of DESIGN 4.4. */
#ifndef MOE_TRAIN_DATA_H
#define MOE_TRAIN_DATA_H

#include <stdio.h>

#include "moe.h"

/* The default --data: the repository's MNIST (scripts/get-mnist.sh). */
#define DEFAULT_DATA "data/mnist"
/* split "train" or "t10k": DIR/<split>-images-idx3-ubyte and DIR/<split>-labels-idx1-ubyte. DEFAULT_DATA
 * is looked for in the current directory, then beside the build directory of this moe. */
moe_status load_split(const char *dir, const char *split, moe_dataset *d);

/* The expert trace: "step,layer,expert,tokens" rows with tokens > 0, kept in memory and written
 * atomically (moe_write_file_atomic) on close. */
typedef struct {
  FILE *f; /* an open_memstream over buf */
  char *buf;
  size_t len;
  const char *path;
} trace_writer;
/* Starts the trace; resuming at step `from` > 0 keeps the existing file's rows of earlier steps. */
moe_status trace_open(trace_writer *t, const char *path, int64_t from);
moe_status trace_step(trace_writer *t, const moe_model_t *m, int64_t step);
moe_status trace_close(trace_writer *t);

#endif
