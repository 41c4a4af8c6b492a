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
/* A checkpoint is a Hugging Face directory or a GGUF file (any other path: a file), which holds the
 * tokenizer (tokenizer.ggml.* keys, read by moe_tokenizer_load) and the chat template itself. */
/* Where ck's tokenizer is: ck/tokenizer.json, or the GGUF file ck (into buf, n bytes). */
const char *lm_tokenizer_path(const char *ck, char *buf, size_t n);
/* Whether ck has a tokenizer (tokenizer.json; a GGUF file's tokenizer.ggml.model) / a chat template
 * (tokenizer_config.json; tokenizer.chat_template), and the path moe_chat_template_render_config takes. */
int lm_has_tokenizer(const char *ck);
const char *lm_chat_template_path(const char *ck, char *buf, size_t n);
/* Whether id is one of the n in eos. */
int lm_is_eos(const int32_t *eos, int n, int32_t id);

/* The mean cross-entropy of m over up to max_windows (0: all) non-overlapping windows of T + 1 tokens of
 * the stream, evenly spaced over it, run B at a time; the same windows on every call. 0, or the exit
 * status after printing. */
int lm_eval_loss(const char *cmd, moe_lm_t *m, const int32_t *ids, size_t n, int T, int B, int max_windows,
                 double *loss);

/* Under mpirun (more than one rank): *d for the model's experts, errors held for cli_settle, and
 * stdout silenced on ranks other than 0, which reports. One process: *d NULL. 0, or the exit status
 * after printing; end with cli_dist_end. */
int lm_dist_start(const char *cmd, moe_dist **d, int *argc, char ***argv);

/* The training order: each epoch a permutation (a function of seed and epoch) of the stream's nwin
 * non-overlapping windows of T + 1 tokens, B windows a step, per_epoch steps an epoch (the windows left
 * over differ from epoch to epoch). A window is the same tokens every epoch, so its tokens are the
 * samples whose experts assignment caching records: token t of window w is sample w T + t. */
typedef struct {
  const int32_t *ids;
  int T, B, nwin, per_epoch, epoch;
  uint64_t seed;
  int32_t *perm; /* (nwin) the order of `epoch` */
} lm_order;
int lm_order_init(lm_order *o, const int32_t *ids, size_t n, int T, int B, uint64_t seed); /* 1: no memory */
/* Step s's batch into x and y (B, T) and its samples into sample (B T). */
void lm_order_fill(lm_order *o, int64_t s, int32_t *x, int32_t *y, int32_t *sample);
void lm_order_free(lm_order *o);

#endif
