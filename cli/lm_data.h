/* The language model's data: a split of a text directory (DIR/train.txt, valid.txt, test.txt, as
 * scripts/get-brown.sh writes them: documents separated by an empty line) as one token stream (the
 * library's moe_lm_stream_encode; its loss over fixed windows is moe_lm_eval_windows). Shared by train
 * --task lm and eval --task lm. */
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

/* Under mpirun (more than one rank): *d for the model's experts, errors held for cli_settle, and
 * stdout silenced on ranks other than 0, which reports. One process: *d NULL. 0, or the exit status
 * after printing; end with cli_dist_end. */
int lm_dist_start(const char *cmd, moe_dist **d, int *argc, char ***argv);

#endif
