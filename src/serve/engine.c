/* The continuous-batching engine (moe.h, DESIGN 4.7). One thread owns the model: between steps
 * finished and released requests leave their KV-cache slots and queued ones take free slots; then one
 * forward (moe_lm_decode_ragged) runs the prompts of those that joined, of any length, up to
 * MOE_ENGINE_PREFILL_TOKENS of them, and the last token of every running request together, so that a
 * burst of requests gets its first tokens after one forward and the running ones wait for no other. A
 * request wanting its prompt's log-probabilities runs its prompt alone first (every position's logits).
 * Each request samples with its own generator, so a request alone gives moe generate's tokens for the
 * same seed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/engine.h"

#define MAX_EOS 64

struct moe_engine {
  moe_lm_t *m;
  moe_engine_config c;
  int32_t eos[MAX_EOS];
  moe_lm_cache *kv;
  pthread_mutex_t mu;    /* guards the queue, the requests' outputs, the flags and the stats */
  pthread_cond_t wake;
  pthread_t th;
  moe_engine_req *qhead, *qtail, **slots; /* slots (B): the request in each, or NULL */
  int *rows, *counts, *waiting; /* (B) each: the thread's scratch: a step's slots and their token counts,
                                   the slots whose prompts wait */
  int32_t *tok;          /* (max(MOE_ENGINE_PREFILL_TOKENS, max_seq) + B) the tokens of a step */
  int64_t joins;         /* requests that took a slot */
  int draining, started;
  moe_engine_stats st;
};

static int is_eos(const moe_engine *e, int32_t t) {
  for (int i = 0; i < e->c.n_eos; i++)
    if (e->eos[i] == t) return 1;
  return 0;
}

moe_status moe_engine_submit(moe_engine *e, const moe_engine_params *p, moe_engine_req **out) {
  moe_engine_req *r;
  MOE_CHECK(moe__req_new(e->m, p, e->c.tok, &r));
  pthread_mutex_lock(&e->mu);
  int ok = !e->draining;
  if (ok) {
    if (e->qtail) e->qtail->next = r;
    else e->qhead = r;
    e->qtail = r;
    e->st.queued++;
    pthread_cond_signal(&e->wake);
  } else {
    r->refs = 1; /* the engine never saw it */
    moe__req_unref(r);
  }
  pthread_mutex_unlock(&e->mu);
  MOE_TRY(ok, MOE_ERR_STATE, "moe_engine_submit: the engine is draining");
  *out = r;
  return MOE_OK;
}

void moe_engine_wait(moe_engine *e, moe_engine_req *r, int have, moe_engine_state *st) {
  pthread_mutex_lock(&e->mu);
  while (r->n_out <= have && !r->done) pthread_cond_wait(&r->cv, &e->mu);
  int scored = r->scored;
  *st = (moe_engine_state){r->n_out, r->out, r->done, r->stop_hit, r->safe,
                           r->done < 0 ? r->err : NULL, r->ttft, r->total, r->lp, r->top_ids, r->top_lp,
                           r->n_top > 0 ? r->n_top : 0, scored ? r->plp : NULL, scored ? r->ptop_ids : NULL,
                           scored ? r->ptop_lp : NULL};
  pthread_mutex_unlock(&e->mu);
}

moe_status moe_engine_text(moe_engine *e, moe_engine_req *r, size_t from, size_t to, char **out, size_t *len) {
  MOE_TRY(e && r && out && len, MOE_ERR_ARG, "moe_engine_text: NULL argument");
  *out = NULL, *len = 0;
  MOE_TRY(e->c.tok, MOE_ERR_STATE, "moe_engine_text: the engine has no tokenizer");
  pthread_mutex_lock(&e->mu);
  size_t safe = r->safe;
  char *s = from <= to && to <= safe ? malloc(to - from + 1) : NULL;
  if (s && to > from) memcpy(s, r->text + from, to - from); /* [0, safe) never changes */
  if (s) s[to - from] = 0;
  pthread_mutex_unlock(&e->mu);
  MOE_TRY(from <= to && to <= safe, MOE_ERR_ARG, "moe_engine_text: bytes [%zu, %zu) but the text has %zu to show",
          from, to, safe);
  MOE_TRY(s, MOE_ERR_NOMEM, "moe_engine_text: out of memory for %zu bytes", to - from);
  *out = s, *len = to - from;
  return MOE_OK;
}

void moe_engine_release(moe_engine *e, moe_engine_req *r) {
  if (!r) return;
  pthread_mutex_lock(&e->mu);
  r->gone = 1;
  moe__req_unref(r);
  pthread_mutex_unlock(&e->mu);
}

int moe_engine_draining(moe_engine *e) {
  pthread_mutex_lock(&e->mu);
  int d = e->draining;
  pthread_mutex_unlock(&e->mu);
  return d;
}

void moe_engine_get_stats(moe_engine *e, moe_engine_stats *st) {
  pthread_mutex_lock(&e->mu);
  *st = e->st;
  pthread_mutex_unlock(&e->mu);
}

/* r leaves its slot (e->mu held): done (1) or failed (-1, err says why), or dropped when gone. */
static void finish(moe_engine *e, moe_engine_req *r, int how, const char *err) {
  if (!r->done) r->done = how;
  if (err) snprintf(r->err, sizeof r->err, "%s", err);
  if (r->slot >= 0) e->slots[r->slot] = NULL, e->st.running--;
  r->total = moe__now() - r->t_submit;
  r->slot = -1;
  pthread_cond_broadcast(&r->cv);
  moe__req_unref(r);
}

/* Token t's text (t < 0: none) and, when it is r's last, what the detokenizer still held, into r's text
 * (e->mu held): 1 when a stop string ends in it, else 0; -1 when out of memory. */
static int add_token_text(moe_engine_req *r, int32_t t, int last) {
  const char *b;
  size_t k;
  int stop = 0;
  if (t >= 0) stop = moe_detokenizer_push(r->detok, t, &b, &k) != MOE_OK ? -1 : moe__req_add_text(r, b, k);
  if (last && !stop) stop = moe_detokenizer_flush(r->detok, &b, &k) != MOE_OK ? -1 : moe__req_add_text(r, b, k);
  return stop;
}

/* Samples r's next token from its logits row (the engine's thread; publishes under e->mu): an end token
 * finishes r without it unless r ignores it, a stop string with it. Returns 1 when r got a token. The
 * waiter is woken after the lock is let go (r stays: the engine's reference goes only in finish), so
 * that it does not wake to block on the lock at once, a second switch per token beside the model's
 * threads. */
static int take_token(moe_engine *e, moe_engine_req *r, const float *logits) {
  int32_t t;
  int wake = 0;
  moe_status st = moe_lm_sample(logits, e->m->cfg.vocab, r->temperature, r->top_p, &r->seed, &t);
  int eos = st == MOE_OK && !r->ignore_eos && is_eos(e, t);
  pthread_mutex_lock(&e->mu);
  int stop = st == MOE_OK && r->detok ? add_token_text(r, eos ? -1 : t, eos || r->n_out + 1 == r->max_tokens) : 0;
  if (st == MOE_OK && !r->n_out) r->ttft = moe__now() - r->t_submit;
  if (st != MOE_OK || stop < 0) finish(e, r, -1, st != MOE_OK ? moe_last_error() : "out of memory for the text");
  else {
    if (!eos && r->n_top >= 0) /* arguments checked: cannot fail */
      moe_lm_logprobs(logits, e->m->cfg.vocab, t, r->n_top, &r->lp[r->n_out], r->top_ids + (size_t)r->n_out * r->n_top,
                      r->top_lp + (size_t)r->n_out * r->n_top);
    if (!eos) r->out[r->n_out++] = t, e->st.tokens++; /* counted before anyone can see the token */
    r->stop_hit = eos || stop;
    if (r->stop_hit || r->n_out == r->max_tokens) {
      if (!stop) r->safe = r->n_text; /* the text held back for a stop string goes out */
      r->complete = 1;
    } else wake = 1;
  }
  pthread_mutex_unlock(&e->mu);
  if (wake) pthread_cond_broadcast(&r->cv);
  return st == MOE_OK && !eos && stop >= 0;
}

/* The prompt's log-probabilities from the logits of its positions (the engine's thread, before they are
 * published: scored under e->mu). */
static void score_prompt(moe_engine *e, moe_engine_req *r, const float *logits) {
  int V = e->m->cfg.vocab, k = r->n_top;
  r->plp[0] = NAN; /* nothing before it */
  for (int j = 0; j < k; j++) r->ptop_ids[j] = -1, r->ptop_lp[j] = NAN;
  for (int i = 1; i < r->n_prompt; i++) /* arguments checked: cannot fail */
    moe_lm_logprobs(logits + (size_t)(i - 1) * V, V, r->prompt[i], k, &r->plp[i], r->ptop_ids + (size_t)i * k,
                    r->ptop_lp + (size_t)i * k);
  pthread_mutex_lock(&e->mu);
  r->scored = 1;
  pthread_mutex_unlock(&e->mu);
}

/* A request of max_tokens 0 (its prompt scored) is complete after its prompt. */
static int no_tokens(moe_engine *e, moe_engine_req *r) {
  pthread_mutex_lock(&e->mu);
  r->ttft = moe__now() - r->t_submit;
  r->safe = r->n_text;
  r->complete = 1;
  pthread_mutex_unlock(&e->mu);
  return 0;
}

/* Queued requests into free slots (e->mu held); returns how many joined. */
static int admit(moe_engine *e) {
  int n = 0;
  for (int s = 0; s < e->c.slots && e->qhead; s++) {
    if (e->slots[s]) continue;
    moe_engine_req *r = e->qhead;
    e->qhead = r->next;
    if (!e->qhead) e->qtail = NULL;
    e->st.queued--;
    if (r->gone) { /* released while queued */
      moe__req_unref(r);
      s--;
      continue;
    }
    e->st.running++;
    e->st.prompt_tokens += r->n_prompt;
    r->slot = s;
    r->joined = e->joins++;
    e->slots[s] = r;
    n++;
  }
  return n;
}

/* Runs counts[i] tokens through slot slots[i], one forward; on failure every request there fails with
 * the error. */
static int decode(moe_engine *e, const int *slots, int n, const int32_t *tokens, const int *counts,
                  moe_engine_step *step) {
  step->forwards++;
  if (moe_lm_decode_ragged(e->m, e->kv, slots, n, tokens, counts) == MOE_OK) {
    if (e->c.on_decode) e->c.on_decode(e->c.ctx, moe_lm_cache_expert_counts(e->kv));
    return 1;
  }
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < n; i++) finish(e, e->slots[slots[i]], -1, moe_last_error());
  pthread_mutex_unlock(&e->mu);
  return 0;
}

/* r's first token (or, with max_tokens 0, its end) from the logits of its prompt's last position. */
static int first_token(moe_engine *e, moe_engine_req *r, const float *logits) {
  return r->max_tokens ? take_token(e, r, logits) : no_tokens(e, r);
}

/* The prompts of requests wanting their log-probabilities, each alone with every position's logits. */
static void score_prompts(moe_engine *e, moe_engine_step *step) {
  int V = e->m->cfg.vocab;
  for (int s = 0; s < e->c.slots; s++) { /* the slots are the engine's: read them unlocked */
    moe_engine_req *r = e->slots[s];
    if (!r || r->fed || !r->plp) continue;
    r->fed = 1;
    moe_lm_cache_slot_reset(e->kv, s);
    step->prompt_tokens += r->n_prompt;
    step->prefills++;
    moe_lm_cache_last_logits(e->kv, 0);
    int ok = decode(e, &s, 1, r->prompt, &r->n_prompt, step);
    moe_lm_cache_last_logits(e->kv, 1);
    if (!ok) continue;
    score_prompt(e, r, moe_lm_logits(e->m));
    step->tokens += first_token(e, r, moe_lm_logits(e->m) + (size_t)(r->n_prompt - 1) * V);
  }
}

/* A step's forward: the waiting prompts in the order their requests joined, while they fit in
 * MOE_ENGINE_PREFILL_TOKENS (the first always: a longer prompt runs with the running requests alone),
 * and the last token of every running request; each gets its next token from the logits of its last
 * position. */
static void step_forward(moe_engine *e, moe_engine_step *step) {
  int V = e->m->cfg.vocab, B = e->c.slots, *rows = e->rows, *counts = e->counts, *wait = e->waiting;
  int nw = 0, n = 0, np, used = 0;
  for (int s = 0; s < B; s++) /* insertion by join order: a few slots */
    if (e->slots[s] && !e->slots[s]->fed) {
      int j = nw++;
      for (; j > 0 && e->slots[wait[j - 1]]->joined > e->slots[s]->joined; j--) wait[j] = wait[j - 1];
      wait[j] = s;
    }
  for (int i = 0; i < nw; i++) {
    moe_engine_req *r = e->slots[wait[i]];
    if (used && used + r->n_prompt > MOE_ENGINE_PREFILL_TOKENS) break;
    r->fed = 1;
    moe_lm_cache_slot_reset(e->kv, wait[i]);
    memcpy(e->tok + used, r->prompt, (size_t)r->n_prompt * sizeof *e->tok);
    used += r->n_prompt;
    rows[n] = wait[i], counts[n++] = r->n_prompt;
  }
  np = n;
  for (int s = 0; s < B; s++)
    if (e->slots[s] && e->slots[s]->n_out && !e->slots[s]->complete)
      e->tok[used + n - np] = e->slots[s]->out[e->slots[s]->n_out - 1], rows[n] = s, counts[n++] = 1;
  step->prompt_tokens += used;
  step->prefills += np > 0;
  step->prompts = np;
  step->rows = n - np;
  if (!n || !decode(e, rows, n, e->tok, counts, step)) return;
  const float *logits = moe_lm_logits(e->m);
  for (int i = 0; i < n; i++) {
    moe_engine_req *r = e->slots[rows[i]];
    step->tokens += i < np ? first_token(e, r, logits + (size_t)i * V) : take_token(e, r, logits + (size_t)i * V);
  }
}

static void *engine(void *arg) {
  moe_engine *e = arg;
  int B = e->c.slots;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    int running = 0;
    for (int s = 0; s < B; s++)
      if (e->slots[s] && e->slots[s]->gone) finish(e, e->slots[s], -1, "the request was released");
      else running += e->slots[s] != NULL;
    int nj = admit(e);
    if (!nj && !running) {
      if (e->draining && !e->qhead) break;
      pthread_cond_wait(&e->wake, &e->mu);
      continue;
    }
    pthread_mutex_unlock(&e->mu);
    double t0 = moe__now();
    moe_engine_step step = {0};
    score_prompts(e, &step);
    step_forward(e, &step);
    step.seconds = moe__now() - t0;
    if (e->c.on_step) e->c.on_step(e->c.ctx, &step);
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.busy_s += step.seconds;
    e->st.prefills += step.prefills;
    e->st.forwards += step.forwards;
    for (int s = 0; s < B; s++) /* the step counted: its complete requests are done */
      if (e->slots[s] && e->slots[s]->complete) finish(e, e->slots[s], 1, NULL);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

moe_status moe_engine_new(moe_engine **out, moe_lm_t *m, const moe_engine_config *c) {
  MOE_TRY(out && m && c, MOE_ERR_ARG, "moe_engine_new: NULL argument");
  MOE_TRY(c->slots >= 1, MOE_ERR_ARG, "moe_engine_new: slots must be >= 1, got %d", c->slots);
  MOE_TRY(c->n_eos >= 0 && c->n_eos <= MAX_EOS && (!c->n_eos || c->eos), MOE_ERR_ARG,
          "moe_engine_new: n_eos must be in [0, %d], got %d", MAX_EOS, c->n_eos);
  moe_engine *e = calloc(1, sizeof *e);
  MOE_TRY(e, MOE_ERR_NOMEM, "moe_engine_new: out of memory");
  e->m = m, e->c = *c;
  if (c->n_eos) memcpy(e->eos, c->eos, (size_t)c->n_eos * sizeof *e->eos);
  e->c.eos = NULL;
  e->slots = calloc((size_t)c->slots, sizeof *e->slots);
  e->rows = malloc((size_t)c->slots * sizeof *e->rows);
  e->counts = malloc((size_t)c->slots * sizeof *e->counts);
  e->waiting = malloc((size_t)c->slots * sizeof *e->waiting);
  int most = m->cfg.max_seq > MOE_ENGINE_PREFILL_TOKENS ? m->cfg.max_seq : MOE_ENGINE_PREFILL_TOKENS;
  e->tok = malloc(((size_t)most + c->slots) * sizeof *e->tok);
  moe_status st = e->slots && e->rows && e->counts && e->waiting && e->tok
                      ? moe_lm_cache_new(&e->kv, m, c->slots)
                      : moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_engine_new: out of memory");
  if (st == MOE_OK) {
    moe_lm_cache_last_logits(e->kv, 1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    moe_threads_release(); /* the engine's thread does the model's work from now on */
    e->started = !pthread_create(&e->th, NULL, engine, e);
    if (!e->started) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_engine_new: cannot start its thread");
  }
  if (st != MOE_OK) {
    moe_engine_free(e);
    return st;
  }
  *out = e;
  return MOE_OK;
}

void moe_engine_drain(moe_engine *e) {
  pthread_mutex_lock(&e->mu);
  int join = e->started;
  e->draining = 1;
  e->started = 0;
  pthread_cond_signal(&e->wake);
  pthread_mutex_unlock(&e->mu);
  if (join) pthread_join(e->th, NULL);
}

void moe_engine_free(moe_engine *e) {
  if (!e) return;
  if (e->kv) { /* the lock and the thread exist */
    moe_engine_drain(e);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->mu);
  }
  moe_lm_cache_free(e->kv);
  free(e->slots), free(e->rows), free(e->counts), free(e->waiting), free(e->tok);
  free(e);
}
