/* The language-model tests' data and output: a tiny corpus and the JSON numbers of moe's output. */
#ifndef MOE_TEST_LM_CORPUS_H
#define MOE_TEST_LM_CORPUS_H

#include <stddef.h>

/* A directory with train.txt, valid.txt and test.txt (a few sentences in a seeded order, documents
 * separated by empty lines as scripts/get-brown.sh writes them), written once per process. */
const char *lm_corpus(void);
/* The value of "key": in the first line of text that has it; NAN when none. */
double json_num(const char *text, const char *key);
/* The values of the lines of text holding "valid_loss" into v (at most n); their count. */
int valid_losses(const char *text, double *v, int n);
/* The --log-steps lines of text ({"step": N, "loss": X}, not the reports) appended to dst (n bytes). */
void step_lines(const char *text, char *dst, size_t n);
/* A tiny model's flags: context 16, one layer of 4 experts top-2, 40 steps with a report every 10. */
#define LM_TINY "--vocab 320 --context 16 --batch 4 --layers 1 --model 32 --heads 2 --kv-heads 1 --experts 4 " \
                "--hidden 32 --steps 40 --eval-every 10 --lr 3e-3 --threads 1"

#endif
