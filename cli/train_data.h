/* What moe train and moe eval share: loading a split of an IDX data directory, forming shuffled,
 * shift-augmented batches as pure functions of (seed, epoch, position), evaluating accuracy, and
 * writing the expert trace of DESIGN 4.4. */
#ifndef MOE_TRAIN_DATA_H
#define MOE_TRAIN_DATA_H

#include <stdio.h>

#include "augment.h"
#include "moe.h"

/* The default --data: the repository's MNIST (scripts/get-mnist.sh). */
#define DEFAULT_DATA "data/mnist"
/* split "train" or "t10k": DIR/<split>-images-idx3-ubyte and DIR/<split>-labels-idx1-ubyte. DEFAULT_DATA
 * is looked for in the current directory, then beside the build directory of this moe. */
moe_status load_split(const char *dir, const char *split, moe_dataset *d);

/* The validation split (moe train --val N): the last n samples of d copied into val, and d keeps the
 * others. 1 when n is not in [1, d->n - 1] or memory runs out. */
int hold_out(moe_dataset *d, int n, moe_dataset *val);

typedef struct {
  const moe_dataset *d;
  int B;
  train_augment aug;
  uint64_t seed;
  int epoch;
  int32_t *perm; /* (n) this epoch's order */
  float *x;      /* (B, features) */
  uint8_t *y;    /* (B) */
} train_batch;
int train_batch_init(train_batch *b, const moe_dataset *d, int B);
void train_batch_free(train_batch *b);
/* Fixes the epoch's order and augmentation. */
void train_batch_epoch(train_batch *b, uint64_t seed, int epoch, const train_augment *aug);
/* Fills x and y with batch s of the epoch, the images on `threads` threads (the bits do not depend on
 * how many). */
void train_batch_fill(train_batch *b, int s, int threads);

/* Accuracy of m on d, in batches of B. */
int evaluate(moe_model_t *m, const moe_dataset *d, int B, double *acc);

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
