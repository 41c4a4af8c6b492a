/* moe serve's request queue and continuous-batching engine (serve.h). One thread owns the model:
 * between decode steps finished and abandoned requests leave their KV-cache slots and queued ones take
 * free slots (their prompt runs alone, as in moe generate); then one decode step runs the last token
 * of every running request through the model together. Each request samples with its own generator,
 * so a request alone gives moe generate's tokens for the same seed. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve.h"

serve_req *serve_req_new(moe__completion *c) {
  serve_req *r = calloc(1, sizeof *r);
  if (!r || !(r->out = malloc((size_t)c->max_tokens * sizeof *r->out))) {
    free(r);
    return NULL;
  }
  r->c = *c;
  memset(c, 0, sizeof *c);
  r->refs = 2;
  r->slot = -1;
  r->t_arrive = cli_now();
  pthread_cond_init(&r->cv, NULL);
  return r;
}

/* Drops one reference (e->mu held); the last frees r. */
static void unref(serve_req *r) {
  if (--r->refs) return;
  pthread_cond_destroy(&r->cv);
  moe__completion_free(&r->c);
  free(r->text);
  free(r->out);
  free(r);
}

int serve_submit(serve_engine *e, serve_req *r) {
  pthread_mutex_lock(&e->mu);
  int ok = !e->draining;
  if (ok) {
    if (e->qtail) e->qtail->next = r;
    else e->qhead = r;
    e->qtail = r;
    pthread_mutex_lock(&e->met->mu);
    e->met->queued++;
    e->met->requests[0]++;
    pthread_mutex_unlock(&e->met->mu);
    pthread_cond_signal(&e->wake);
  }
  pthread_mutex_unlock(&e->mu);
  return ok;
}

int serve_wait(serve_engine *e, serve_req *r, int have, int *done, size_t *safe) {
  pthread_mutex_lock(&e->mu);
  while (r->n_out <= have && !r->done) pthread_cond_wait(&r->cv, &e->mu);
  int n = r->n_out;
  *done = r->done;
  *safe = r->safe;
  pthread_mutex_unlock(&e->mu);
  return n;
}

void serve_release(serve_engine *e, serve_req *r) {
  pthread_mutex_lock(&e->mu);
  r->gone = 1;
  unref(r);
  pthread_mutex_unlock(&e->mu);
}

int serve_draining(serve_engine *e) {
  pthread_mutex_lock(&e->mu);
  int d = e->draining;
  pthread_mutex_unlock(&e->mu);
  return d;
}

/* r leaves its slot (e->mu held): done (1) or failed (-1, err says why), or dropped when gone. */
static void finish(serve_engine *e, serve_req *r, int how, const char *err) {
  if (!r->done) r->done = how;
  if (err) snprintf(r->err, sizeof r->err, "%s", err);
  if (r->slot >= 0) e->slots[r->slot] = NULL;
  pthread_mutex_lock(&e->met->mu);
  e->met->running -= r->slot >= 0;
  pthread_mutex_unlock(&e->met->mu);
  if (how > 0) serve_metrics_latency(e->met, -1, cli_now() - r->t_arrive);
  r->slot = -1;
  pthread_cond_broadcast(&r->cv);
  unref(r);
}

/* Appends t's bytes to r's text and looks for r's stop strings in it (e->mu held: r->safe is read by
 * the connection): 1 when one ends in the new bytes, r->safe where the first found starts; else 0,
 * r->safe short of the longest end of the text that begins one; -1 when out of memory. */
static int add_text(serve_engine *e, serve_req *r, int32_t t) {
  size_t k;
  const char *b = moe_tokenizer_token_bytes(e->tok, t, &k);
  if (r->n_text + k > r->cap_text) {
    char *p = realloc(r->text, 2 * r->cap_text + k);
    if (!p) return -1;
    r->text = p, r->cap_text = 2 * r->cap_text + k;
  }
  memcpy(r->text + r->n_text, b, k);
  size_t from = r->n_text, n = r->n_text += k, at = n, hold = 0;
  for (int i = 0; i < r->c.n_stop; i++) {
    const char *s = r->c.stop[i];
    size_t L = strlen(s);
    for (size_t j = from + 1 >= L ? from + 1 - L : 0; j + L <= n && j < at; j++) /* matches ending in b */
      if (!memcmp(r->text + j, s, L)) at = j;
    for (size_t h = L - 1 < n ? L - 1 : n; h > hold; h--)
      if (!memcmp(r->text + n - h, s, h)) hold = h;
  }
  r->safe = at < n ? at : n - hold;
  return at < n;
}

/* Samples r's next token from its logits row (engine thread; publishes under e->mu): an end of text
 * finishes r without it unless r ignores it, a stop string with it (its text cut where the string
 * starts). Returns 1 when r got a token. */
static int take_token(serve_engine *e, serve_req *r, const float *logits) {
  int32_t t;
  moe_status st = moe_lm_sample(logits, e->m->cfg.vocab, r->c.temperature, r->c.top_p, &r->c.seed, &t);
  int eos = st == MOE_OK && !r->c.ignore_eos && lm_is_eos(e->eos, e->n_eos, t);
  pthread_mutex_lock(&e->mu);
  int stop = st == MOE_OK && !eos && r->c.n_stop ? add_text(e, r, t) : 0;
  if (st == MOE_OK && !r->n_out) serve_metrics_latency(e->met, cli_now() - r->t_arrive, -1);
  if (st != MOE_OK || stop < 0) finish(e, r, -1, st != MOE_OK ? moe_last_error() : "out of memory for the text");
  else {
    if (!eos) r->out[r->n_out++] = t;
    r->stop = eos || stop;
    if (r->stop || r->n_out == r->c.max_tokens) {
      if (!stop) r->safe = r->n_text; /* the text held back for a stop string goes out */
      finish(e, r, 1, NULL);
    } else pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&e->mu);
  return st == MOE_OK && !eos && stop >= 0;
}

/* One row per expert used in this step's decode, per layer. */
static void trace_step(serve_engine *e) {
  const int32_t *cnt = moe_lm_cache_expert_counts(e->kv);
  int L = e->m->cfg.n_layers, E = e->m->cfg.moe.E;
  for (int l = 0; l < L; l++)
    for (int x = 0; x < E; x++)
      if (cnt[l * E + x]) fprintf(e->trace, "%lld,%d,%d,%d\n", (long long)e->trace_step, l, x, cnt[l * E + x]);
  e->trace_step++;
}

/* Queued requests into free slots (e->mu held); returns how many joined, their slots in joined. */
static int admit(serve_engine *e, int *joined) {
  int n = 0;
  for (int s = 0; s < e->B && e->qhead; s++) {
    if (e->slots[s]) continue;
    serve_req *r = e->qhead;
    e->qhead = r->next;
    if (!e->qhead) e->qtail = NULL;
    pthread_mutex_lock(&e->met->mu);
    e->met->queued--;
    e->met->running += !r->gone;
    pthread_mutex_unlock(&e->met->mu);
    if (r->gone) { /* left while queued */
      unref(r);
      s--;
      continue;
    }
    r->slot = s;
    e->slots[s] = r;
    joined[n++] = s;
  }
  return n;
}

/* Runs tokens through the slots; on failure every request there fails with the error. */
static int decode(serve_engine *e, const int *slots, int n, const int32_t *tokens, int T) {
  if (moe_lm_decode_slots(e->m, e->kv, slots, n, tokens, T) == MOE_OK) {
    if (e->trace) trace_step(e);
    return 1;
  }
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < n; i++) finish(e, e->slots[slots[i]], -1, moe_last_error());
  pthread_mutex_unlock(&e->mu);
  return 0;
}

static void *engine(void *arg) {
  serve_engine *e = arg;
  int V = e->m->cfg.vocab, *joined = e->joined, *rows = e->joined + e->B;
  int32_t *last = e->last;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    int running = 0;
    for (int s = 0; s < e->B; s++)
      if (e->slots[s] && e->slots[s]->gone) finish(e, e->slots[s], -1, "the client left");
      else running += e->slots[s] != NULL;
    int nj = admit(e, joined);
    if (!nj && !running) {
      if (e->draining && !e->qhead) break;
      pthread_cond_wait(&e->wake, &e->mu);
      continue;
    }
    pthread_mutex_unlock(&e->mu);
    double t0 = cli_now();
    int prompt = 0, got = 0;
    for (int i = 0; i < nj; i++) { /* the slots are the engine's: read them unlocked */
      serve_req *r = e->slots[joined[i]];
      moe_lm_cache_slot_reset(e->kv, joined[i]);
      prompt += r->c.n_ids;
      if (decode(e, &joined[i], 1, r->c.ids, r->c.n_ids))
        got += take_token(e, r, moe_lm_logits(e->m) + (size_t)(r->c.n_ids - 1) * V);
    }
    int n = 0;
    for (int s = 0; s < e->B; s++)
      if (e->slots[s] && e->slots[s]->n_out) rows[n] = s, last[n++] = e->slots[s]->out[e->slots[s]->n_out - 1];
    if (n && decode(e, rows, n, last, 1))
      for (int i = 0; i < n; i++) got += take_token(e, e->slots[rows[i]], moe_lm_logits(e->m) + (size_t)i * V);
    serve_metrics_step(e->met, n, got, prompt, cli_now() - t0);
    pthread_mutex_lock(&e->mu);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

moe_status serve_engine_start(serve_engine *e, moe_lm_t *m, const moe_tokenizer *tok, int B, serve_metrics *met,
                              FILE *trace, const int32_t *eos, int n_eos) {
  memset(e, 0, sizeof *e);
  e->m = m, e->tok = tok, e->B = B, e->met = met, e->trace = trace, e->n_eos = n_eos;
  memcpy(e->eos, eos, (size_t)n_eos * sizeof *eos);
  e->slots = calloc((size_t)B, sizeof *e->slots);
  e->joined = malloc(2 * (size_t)B * sizeof *e->joined);
  e->last = malloc((size_t)B * sizeof *e->last);
  moe_status st = e->slots && e->joined && e->last ? moe_lm_cache_new(&e->kv, m, B) : MOE_ERR_NOMEM;
  if (st == MOE_OK) {
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    if (pthread_create(&e->th, NULL, engine, e)) st = MOE_ERR_NOMEM, moe_lm_cache_free(e->kv);
  }
  if (st != MOE_OK) free(e->slots), free(e->joined), free(e->last);
  return st;
}

void serve_engine_drain(serve_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->draining = 1;
  pthread_cond_signal(&e->wake);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->th, NULL);
}

void serve_engine_free(serve_engine *e) {
  moe_lm_cache_free(e->kv);
  free(e->slots), free(e->joined), free(e->last);
  pthread_cond_destroy(&e->wake);
  pthread_mutex_destroy(&e->mu);
}
