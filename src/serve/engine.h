/* The continuous-batching engine's request (moe.h's moe_engine_req, DESIGN 4.7), shared by the engine
 * (engine.c) and the functions that make and match it (engine_req.c). */
#ifndef MOE_SERVE_ENGINE_H
#define MOE_SERVE_ENGINE_H

#include <pthread.h>

#include "internal.h"

struct moe_engine_req {
  int32_t *prompt;     /* (n_prompt) */
  int n_prompt, max_tokens;
  float temperature, top_p;
  uint64_t seed;       /* the request's generator, advanced as it samples */
  int ignore_eos;
  char *stop[MOE_ENGINE_STOPS];
  int n_stop;
  int32_t *out;        /* (max_tokens) the tokens generated so far: n_out of them */
  int n_top;           /* -1: no log-probabilities; else the alternatives kept per token */
  float *lp;           /* (max_tokens) each token's log-probability, when n_top >= 0 */
  int32_t *top_ids;    /* (max_tokens, n_top) */
  float *top_lp;       /* (max_tokens, n_top) */
  float *plp;          /* (n_prompt) with prompt_logprobs: the prompt's tokens' log-probabilities */
  int32_t *ptop_ids;   /* (n_prompt, n_top) */
  float *ptop_lp;      /* (n_prompt, n_top) */
  int scored;          /* the prompt's log-probabilities are in */
  int n_out;
  int done;            /* 1 finished, -1 failed (err says why) */
  int stop_hit;        /* finished at an end token or a stop string */
  int complete;        /* every token is in: finished once its step is counted (stats, on_step), so that
                          a caller seeing it done sees the step in the metrics too */
  moe_detokenizer *detok; /* with the engine's tokenizer: the tokens' text as they come */
  char *text;          /* the text's bytes so far (UTF-8) */
  size_t n_text, cap_text;
  size_t safe;         /* the bytes of text that may go out (not a stop string nor the start of one) */
  int gone;            /* the caller released it: the engine drops it */
  int refs;            /* the caller's handle and the engine's */
  int slot;            /* its KV-cache slot, or -1 */
  int64_t joined;      /* when it took its slot (the engine's count of joins): prompts run in that order */
  int fed;             /* its prompt is in its slot's cache */
  double t_submit, ttft, total;
  char err[256];
  pthread_cond_t cv;   /* signalled on each new token and at the end */
  struct moe_engine_req *next;
};

/* A request from p (checked against m; stop strings need tok, which gives its text), with two references. */
moe_status moe__req_new(const moe_lm_t *m, const moe_engine_params *p, const moe_tokenizer *tok, moe_engine_req **out);
/* Drops a reference (under the engine's lock); the last frees r. */
void moe__req_unref(moe_engine_req *r);
/* Appends k bytes of text and looks for r's stop strings in it: 1 when one ends in the new bytes (r->safe
 * where the first found starts); else 0, r->safe short of the longest end of the text that begins one;
 * -1 when out of memory. */
int moe__req_add_text(moe_engine_req *r, const char *b, size_t k);

#endif
