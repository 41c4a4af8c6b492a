/* The engine's requests (moe.h, DESIGN 4.7): made from their parameters (checked, copied), their stop
 * strings matched against the text of the tokens as they come, freed with the last reference. */
#include <stdlib.h>
#include <string.h>

#include "serve/engine.h"

static void req_free(moe_engine_req *r) {
  if (!r) return;
  for (int i = 0; i < MOE_ENGINE_STOPS; i++) free(r->stop[i]);
  free(r->prompt);
  free(r->out);
  free(r->lp), free(r->top_ids), free(r->top_lp);
  free(r->plp), free(r->ptop_ids), free(r->ptop_lp);
  free(r->text);
  moe_detokenizer_free(r->detok);
  free(r);
}

moe_status moe__req_new(const moe_lm_t *m, const moe_engine_params *p, const moe_tokenizer *tok, moe_engine_req **out) {
  int V = m->cfg.vocab, S = m->cfg.max_seq;
  MOE_TRY(p && p->prompt && p->n_prompt >= 1, MOE_ERR_ARG, "engine request: the prompt must have a token");
  MOE_TRY(p->prompt_logprobs == 0 || (p->prompt_logprobs == 1 && p->logprobs == 1), MOE_ERR_ARG,
          "engine request: prompt_logprobs must be 0, or 1 with logprobs 1, got %d", p->prompt_logprobs);
  MOE_TRY(p->max_tokens >= !p->prompt_logprobs, MOE_ERR_ARG, "engine request: max_tokens must be >= %d, got %d",
          !p->prompt_logprobs, p->max_tokens);
  MOE_TRY(p->n_prompt <= S && p->max_tokens <= S - p->n_prompt, MOE_ERR_ARG,
          "engine request: the prompt's %d tokens and max_tokens %d exceed the model's max_seq %d", p->n_prompt,
          p->max_tokens, S);
  for (int i = 0; i < p->n_prompt; i++)
    MOE_TRY(p->prompt[i] >= 0 && p->prompt[i] < V, MOE_ERR_ARG, "engine request: prompt token %d is %d, not in [0, %d)",
            i, p->prompt[i], V);
  MOE_TRY(p->n_stop >= 0 && p->n_stop <= MOE_ENGINE_STOPS && (p->n_stop == 0 || p->stop), MOE_ERR_ARG,
          "engine request: n_stop must be in [0, %d], got %d", MOE_ENGINE_STOPS, p->n_stop);
  MOE_TRY(!p->n_stop || tok, MOE_ERR_ARG, "engine request: stop strings need the engine's tokenizer");
  for (int i = 0; i < p->n_stop; i++)
    MOE_TRY(p->stop[i] && p->stop[i][0], MOE_ERR_ARG, "engine request: stop string %d is empty", i);
  MOE_TRY(p->logprobs == 0 || p->logprobs == 1, MOE_ERR_ARG, "engine request: logprobs must be 0 or 1, got %d",
          p->logprobs);
  MOE_TRY(p->top_logprobs >= 0 && p->top_logprobs <= MOE_ENGINE_TOP_LOGPROBS && (p->logprobs || !p->top_logprobs),
          MOE_ERR_ARG, "engine request: top_logprobs must be in [0, %d] (with logprobs 1), got %d",
          MOE_ENGINE_TOP_LOGPROBS, p->top_logprobs);
  moe_engine_req *r = calloc(1, sizeof *r);
  int ok = r && (r->prompt = malloc((size_t)p->n_prompt * 4)) && (r->out = malloc((size_t)p->max_tokens * 4 + 4));
  for (int i = 0; ok && i < p->n_stop; i++) ok = (r->stop[i] = strdup(p->stop[i])) != NULL;
  size_t nt = (size_t)p->max_tokens * (p->top_logprobs ? (size_t)p->top_logprobs : 1);
  if (ok && tok) /* the completion's text continues the prompt's */
    ok = moe_detokenizer_new(&r->detok, tok) == MOE_OK && moe_detokenizer_follow(r->detok, p->prompt, (size_t)p->n_prompt) == MOE_OK;
  size_t np = (size_t)p->n_prompt * (p->top_logprobs ? (size_t)p->top_logprobs : 1);
  if (ok && p->logprobs)
    ok = (r->lp = malloc((size_t)p->max_tokens * 4 + 4)) && (r->top_ids = malloc(nt * 4 + 4)) &&
         (r->top_lp = malloc(nt * 4 + 4));
  if (ok && p->prompt_logprobs)
    ok = (r->plp = malloc((size_t)p->n_prompt * 4)) && (r->ptop_ids = malloc(np * 4)) && (r->ptop_lp = malloc(np * 4));
  if (!ok) {
    req_free(r);
    MOE_TRY(0, MOE_ERR_NOMEM, "engine request: out of memory");
  }
  memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * 4);
  r->n_prompt = p->n_prompt;
  r->max_tokens = p->max_tokens;
  r->temperature = p->temperature;
  r->top_p = p->top_p;
  r->seed = p->seed;
  r->ignore_eos = p->ignore_eos;
  r->n_stop = p->n_stop;
  r->n_top = p->logprobs ? (p->top_logprobs < V ? p->top_logprobs : V) : -1;
  r->refs = 2; /* the caller's handle and the engine's */
  r->slot = -1;
  r->ttft = r->total = -1;
  r->t_submit = moe__now();
  pthread_cond_init(&r->cv, NULL);
  *out = r;
  return MOE_OK;
}

void moe__req_unref(moe_engine_req *r) {
  if (--r->refs) return;
  pthread_cond_destroy(&r->cv);
  req_free(r);
}

int moe__req_add_text(moe_engine_req *r, const char *b, size_t k) {
  if (r->n_text + k > r->cap_text) {
    char *p = realloc(r->text, 2 * r->cap_text + k);
    if (!p) return -1;
    r->text = p, r->cap_text = 2 * r->cap_text + k;
  }
  if (k) memcpy(r->text + r->n_text, b, k);
  size_t from = r->n_text, n = r->n_text += k, at = n, hold = 0;
  for (int i = 0; i < r->n_stop; i++) {
    const char *s = r->stop[i];
    size_t L = strlen(s);
    for (size_t j = from + 1 >= L ? from + 1 - L : 0; j + L <= n && j < at; j++) /* matches ending in b */
      if (!memcmp(r->text + j, s, L)) at = j;
    for (size_t h = L - 1 < n ? L - 1 : n; h > hold; h--) /* the longest end of the text that begins s */
      if (!memcmp(r->text + n - h, s, h)) hold = h;
  }
  r->safe = at < n ? at : n - hold;
  return at < n;
}
