/* The language model's data: a split of a text directory (DIR/train.txt, valid.txt, test.txt, as
 * scripts/get-brown.sh writes them: documents separated by an empty line) as one token stream, and
 * the mean cross-entropy over a fixed set of windows of it. Shared by train --task lm and eval --task lm. */
#ifndef MOE_CLI_LM_DATA_H
#define MOE_CLI_LM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

/* DIR/<split>.txt tokenized: each document preceded by <|endoftext|> (which ends the one before), into
 * a malloc'd *ids (*n of them). 0, or the exit status after printing "moe <cmd>: ..." (a missing file
 * names scripts/get-brown.sh; a split too short for one window of context + 1 tokens says so). */
int lm_stream_load(const char *cmd, const moe_tokenizer *t, const char *dir, const char *split, int context,
                   int32_t **ids, size_t *n);
/* The mean cross-entropy of m over up to max_windows (0: all) non-overlapping windows of T + 1 tokens of
 * the stream, evenly spaced over it, run B at a time; the same windows on every call. 0, or the exit
 * status after printing. */
int lm_eval_loss(const char *cmd, moe_lm_t *m, const int32_t *ids, size_t n, int T, int B, int max_windows,
                 double *loss);

#endif
