/* The continuous-batching engine (moe_engine) from C, with no HTTP: requests submitted together to an
 * engine of fewer slots (so that some wait) each get the greedy tokens of decoding them alone with
 * moe_lm_decode; end tokens, release mid-generation, draining and bad requests. The language model is
 * the Mixtral fixture (tests/fixtures/lm/mixtral). */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/utf8.h"
#include "test.h"

enum { NREQ = 8, NEW = 10, V = 64 };

static int argmax(const float *l) {
  int b = 0;
  for (int i = 1; i < V; i++) b = l[i] > l[b] ? i : b;
  return b;
}

/* k tokens of a prompt alone, drawn as moe generate does (temperature 0: greedy). */
static int alone_sampled(moe_lm_t *m, const int32_t *prompt, int n, float temp, uint64_t seed, int32_t *ids, int k) {
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1) || moe_lm_decode(m, kv, prompt, n)) return 0;
  const float *l = moe_lm_logits(m) + (size_t)(n - 1) * V;
  for (int i = 0; i < k; i++) {
    if (moe_lm_sample(l, V, temp, 0.9f, &seed, &ids[i])) return 0;
    if (!temp && ids[i] != argmax(l)) return 0;
    if (i + 1 < k && moe_lm_decode(m, kv, &ids[i], 1)) return 0;
    l = moe_lm_logits(m);
  }
  moe_lm_cache_free(kv);
  return 1;
}

static int alone(moe_lm_t *m, const int32_t *prompt, int n, int32_t *ids) {
  return alone_sampled(m, prompt, n, 0.0f, 0, ids, NEW);
}

static int load(moe_lm_t *m) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  return moe_lm_load(m, dir, NULL) == MOE_OK && m->cfg.vocab == V;
}

static void prompt_of(int r, int32_t *p, int *n) {
  *n = 1 + r % 5;
  for (int i = 0; i < *n; i++) p[i] = (r * 13 + i * 7 + 3) % V;
}

TEST(engine_batched_requests_get_their_tokens_alone) {
  moe_lm_t m;
  ASSERT(load(&m));
  int32_t prompts[NREQ][8], want[NREQ][NEW];
  int n[NREQ];
  for (int r = 0; r < NREQ; r++) {
    prompt_of(r, prompts[r], &n[r]);
    ASSERT(alone(&m, prompts[r], n[r], want[r]));
  }
  moe_engine_config c = {.slots = 3};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  moe_engine_req *req[NREQ];
  for (int r = 0; r < NREQ; r++) {
    moe_engine_params p = {prompts[r], n[r], NEW, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 0, 0};
    ASSERT_OK(moe_engine_submit(e, &p, &req[r]));
  }
  for (int r = 0; r < NREQ; r++) {
    moe_engine_state st = {0};
    int streamed = 0;
    while (!st.done) { /* as a streaming client: each wait brings at least one more token, or the end */
      moe_engine_wait(e, req[r], st.n, &st);
      streamed++;
    }
    ASSERT_EQ_INT(st.done, 1);
    ASSERT_EQ_INT(st.n, NEW);
    ASSERT_EQ_INT(st.stop, 0); /* max_tokens */
    ASSERT(st.ttft_s >= 0 && st.total_s >= st.ttft_s && streamed >= 1);
    for (int i = 0; i < NEW; i++)
      if (st.tokens[i] != want[r][i]) FAIL_("request %d token %d: %d, alone %d", r, i, st.tokens[i], want[r][i]);
    moe_engine_release(e, req[r]);
  }
  moe_engine_stats s;
  moe_engine_get_stats(e, &s);
  ASSERT_EQ_INT(s.queued, 0);
  ASSERT_EQ_INT(s.running, 0);
  ASSERT_EQ_INT((int)s.tokens, NREQ * NEW);
  int prompt_tokens = 0;
  for (int r = 0; r < NREQ; r++) prompt_tokens += n[r];
  ASSERT_EQ_INT((int)s.prompt_tokens, prompt_tokens);
  moe_engine_free(e);
  moe_lm_free(&m);
}

/* Holds the engine after its first step until the test lets it go, and keeps each step's counts. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int held, open, n;
  moe_engine_step s[4 * NEW];
} step_gate;

static void gate_step(void *ctx, const moe_engine_step *s) {
  step_gate *g = ctx;
  pthread_mutex_lock(&g->mu);
  if (g->n < 4 * NEW) g->s[g->n] = *s;
  g->n++;
  g->held = 1;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_init(step_gate *g) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
}

static void gate_free(step_gate *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

/* Submits the nq requests p: the first alone, the others while the engine holds after the first's step,
 * then lets it go. */
static int submit_held(moe_engine *e, step_gate *g, const moe_engine_params *p, int nq, moe_engine_req **req) {
  for (int r = 0; r < nq; r++) {
    if (moe_engine_submit(e, &p[r], &req[r])) return 0;
    pthread_mutex_lock(&g->mu);
    while (!r && !g->held) pthread_cond_wait(&g->cv, &g->mu); /* the first request's step is over */
    g->open = r == nq - 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
  }
  return 1;
}

/* Requests queued while a step runs, with prompts of five lengths, all join the next step and run in
 * its one forward (moe_lm_decode_ragged) with the running request's token; the one wanting its prompt's
 * log-probabilities runs its prompt alone first and joins the forward as a running request. Counted:
 * the forwards, prompts and rows of each step; every request, greedy and sampled, gets the tokens of
 * running it alone. */
/* Waits for each of the nq requests to end, expects its k tokens to be want's row (k a row) and
 * releases it; 0 with the first difference printed. */
static int expect_alone(moe_engine *e, moe_engine_req **req, int nq, const int32_t *want, int k) {
  for (int r = 0; r < nq; r++) {
    moe_engine_state st = {0};
    do moe_engine_wait(e, req[r], st.n, &st);
    while (!st.done);
    int ok = st.done == 1 && st.n == k;
    for (int i = 0; ok && i < k; i++) ok = st.tokens[i] == want[r * k + i];
    if (!ok) fprintf(stderr, "  request %d: done %d, %d tokens of %d, or a token not its own alone\n", r, st.done, st.n, k);
    moe_engine_release(e, req[r]);
    if (!ok) return 0;
  }
  return 1;
}

TEST(engine_queued_prompts_of_any_length_run_in_one_forward) {
  moe_lm_t m;
  ASSERT(load(&m));
  enum { NQ = 7 };
  int32_t prompts[NQ][6], want[NQ][NEW];
  int n[NQ] = {2, 3, 5, 1, 4, 3, 6};
  moe_engine_params p[NQ];
  for (int r = 0; r < NQ; r++) {
    int plp = r == NQ - 1;
    float temp = r % 2 ? 0.8f : 0.0f;
    for (int i = 0; i < n[r]; i++) prompts[r][i] = (r * 11 + i * 5 + 1) % V;
    ASSERT(alone_sampled(&m, prompts[r], n[r], temp, 100 + r, want[r], NEW));
    p[r] = (moe_engine_params){prompts[r], n[r], NEW, temp, 0.9f, 100 + r, 1, NULL, 0, plp, 0, plp};
  }
  static step_gate g;
  gate_init(&g);
  moe_engine_config c = {.slots = NQ, .on_step = gate_step, .ctx = &g};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  moe_engine_req *req[NQ];
  ASSERT(submit_held(e, &g, p, NQ, req));
  int same = expect_alone(e, req, NQ, want[0], NEW);
  moe_engine_stats es;
  moe_engine_get_stats(e, &es);
  moe_engine_free(e);
  ASSERT(same);
  /* the first: its prompt (1 step) and NEW - 1 tokens; the others joined in step 2 and need NEW steps */
  ASSERT_EQ_INT(g.n, 1 + NEW);
  ASSERT_EQ_INT((int)es.steps, 1 + NEW);
  ASSERT_EQ_INT((int)es.forwards, 1 + NEW + 1); /* one a step, and the scored prompt's alone */
  ASSERT_EQ_INT((int)es.prefills, 1 + 2);
  ASSERT_EQ_INT((int)es.tokens, NQ * NEW);
  const moe_engine_step *first = &g.s[0], *next = &g.s[1];
  ASSERT_EQ_INT(first->forwards, 1); /* the first request alone: its prompt, its first token */
  ASSERT_EQ_INT(first->prefills, 1);
  ASSERT_EQ_INT(first->prompts, 1);
  ASSERT_EQ_INT(first->prompt_tokens, 2);
  ASSERT_EQ_INT(first->rows, 0);
  ASSERT_EQ_INT(first->tokens, 1);
  ASSERT_EQ_INT(next->forwards, 2);  /* the scored prompt alone, then everyone */
  ASSERT_EQ_INT(next->prefills, 2);
  ASSERT_EQ_INT(next->prompts, NQ - 2);
  ASSERT_EQ_INT(next->prompt_tokens, 3 + 5 + 1 + 4 + 3 + 6);
  ASSERT_EQ_INT(next->rows, 2);      /* the first request and the scored one */
  ASSERT_EQ_INT(next->tokens, 1 + (NQ - 2) + 2);
  for (int i = 2; i < g.n; i++) {
    ASSERT_EQ_INT(g.s[i].forwards, 1);
    ASSERT_EQ_INT(g.s[i].prefills, 0);
    ASSERT_EQ_INT(g.s[i].prompts, 0);
    ASSERT_EQ_INT(g.s[i].rows, i < NEW ? NQ : NQ - 2); /* the first and the scored one: done in step NEW */
  }
  gate_free(&g);
  moe_lm_free(&m);
}

/* Prompts that joined together past MOE_ENGINE_PREFILL_TOKENS: those that fit run in the step's forward,
 * in the order they came, the next waits for the following step; each still gets its tokens alone. */
TEST(engine_prompts_past_the_step_budget_wait_a_step) {
  moe_lm_t m;
  ASSERT(load(&m));
  enum { NQ = 10, LONG = 60, K = 3 };
  ASSERT(m.cfg.max_seq >= LONG + K && 8 * LONG <= MOE_ENGINE_PREFILL_TOKENS && 9 * LONG > MOE_ENGINE_PREFILL_TOKENS);
  static int32_t prompts[NQ][LONG], want[NQ][K];
  moe_engine_params p[NQ];
  for (int r = 0; r < NQ; r++) {
    int n = r ? LONG : 2;
    for (int i = 0; i < n; i++) prompts[r][i] = (r * 7 + i * 3 + 2) % V;
    ASSERT(alone_sampled(&m, prompts[r], n, 0.0f, 0, want[r], K));
    p[r] = (moe_engine_params){prompts[r], n, K, 0.0f, 1.0f, 0, 1, NULL, 0, 0, 0, 0};
  }
  static step_gate g;
  gate_init(&g);
  moe_engine_config c = {.slots = NQ, .on_step = gate_step, .ctx = &g};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  moe_engine_req *req[NQ];
  ASSERT(submit_held(e, &g, p, NQ, req));
  int same = expect_alone(e, req, NQ, want[0], K);
  moe_engine_free(e);
  ASSERT(same);
  ASSERT_EQ_INT(g.s[1].prompts, 8);
  ASSERT_EQ_INT(g.s[1].prompt_tokens, 8 * LONG);
  ASSERT_EQ_INT(g.s[1].rows, 1);
  ASSERT_EQ_INT(g.s[2].prompts, 1); /* the ninth, with the first (its last token) and the eight */
  ASSERT_EQ_INT(g.s[2].prompt_tokens, LONG);
  ASSERT_EQ_INT(g.s[2].rows, 1 + 8);
  for (int i = 0; i < g.n; i++) ASSERT_EQ_INT(g.s[i].forwards, 1);
  ASSERT_EQ_INT(g.n, 2 + K);       /* the ninth's K tokens from step 3 on */
  gate_free(&g);
  moe_lm_free(&m);
}

/* An end token ends a request without being kept (stop); ignore_eos goes on; a released request leaves
 * its slot while another runs on; after the drain nothing is taken; bad requests name the field. */
TEST(engine_end_tokens_release_drain_and_errors) {
  moe_lm_t m;
  ASSERT(load(&m));
  int32_t prompt[8], want[NEW];
  int n;
  prompt_of(2, prompt, &n);
  ASSERT(alone(&m, prompt, n, want));
  int32_t eos = want[3];
  int first = 0;
  while (want[first] != eos) first++; /* its first appearance */
  moe_engine_config c = {.slots = 2, .eos = &eos, .n_eos = 1};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  moe_engine_params p = {prompt, n, NEW, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 0, 0};
  moe_engine_req *a, *b, *long_one;
  moe_engine_params lp = {prompt, 1, 40, 0.7f, 0.9f, 5, 1, NULL, 0, 0, 0, 0};
  ASSERT_OK(moe_engine_submit(e, &lp, &long_one));
  ASSERT_OK(moe_engine_submit(e, &p, &a));
  p.ignore_eos = 1;
  ASSERT_OK(moe_engine_submit(e, &p, &b));
  moe_engine_state st = {0};
  moe_engine_wait(e, long_one, 0, &st); /* it has started: release it mid-generation */
  moe_engine_release(e, long_one);
  do moe_engine_wait(e, a, st.n, &st);
  while (!st.done);
  ASSERT_EQ_INT(st.done, 1);
  ASSERT_EQ_INT(st.stop, 1);
  ASSERT_EQ_INT(st.n, first);
  for (int i = 0; i < first; i++) ASSERT_EQ_INT(st.tokens[i], want[i]);
  st = (moe_engine_state){0};
  do moe_engine_wait(e, b, st.n, &st);
  while (!st.done);
  ASSERT_EQ_INT(st.n, NEW);
  ASSERT_EQ_INT(st.stop, 0);
  for (int i = 0; i < NEW; i++) ASSERT_EQ_INT(st.tokens[i], want[i]);
  moe_engine_release(e, a);
  moe_engine_release(e, b);
  moe_engine_req *bad;
  moe_engine_params bp = {prompt, n, m.cfg.max_seq, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 0, 0};
  ASSERT_STATUS(moe_engine_submit(e, &bp, &bad), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "max_seq"));
  int32_t out_of_range = V;
  moe_engine_params bv = {&out_of_range, 1, 2, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 0, 0};
  ASSERT_STATUS(moe_engine_submit(e, &bv, &bad), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "prompt token 0"));
  const char *stop[] = {"x"};
  moe_engine_params bs = {prompt, n, 2, 0.0f, 1.0f, 0, 0, stop, 1, 0, 0, 0};
  ASSERT_STATUS(moe_engine_submit(e, &bs, &bad), MOE_ERR_ARG); /* no tokenizer */
  ASSERT(strstr(moe_last_error(), "tokenizer"));
  moe_engine_drain(e);
  ASSERT(moe_engine_draining(e));
  ASSERT_STATUS(moe_engine_submit(e, &p, &bad), MOE_ERR_STATE);
  moe_engine_stats s;
  moe_engine_get_stats(e, &s);
  ASSERT_EQ_INT(s.running, 0);
  ASSERT_EQ_INT(s.queued, 0);
  moe_engine_free(e);
  moe_lm_free(&m);
}

/* logprobs: each token's log-probability and the top alternatives', from the logits of its step, equal
 * (to rounding) those of a full forward of the sequence without a cache; greedy: the chosen token is the
 * most probable alternative; sorted, ties to the lower id. */
TEST(engine_logprobs_are_the_full_forwards) {
  moe_lm_t m;
  ASSERT(load(&m));
  int32_t prompt[3] = {5, 9, 1}, seq[3 + NEW];
  moe_engine_config c = {.slots = 2};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  enum { TOP = 4 };
  for (int sampled = 0; sampled < 2; sampled++) {
    moe_engine_params p = {prompt, 3, NEW, sampled ? 0.9f : 0.0f, 1.0f, 7, 1, NULL, 0, 1, TOP, 0};
    moe_engine_req *r;
    ASSERT_OK(moe_engine_submit(e, &p, &r));
    moe_engine_state st = {0};
    do moe_engine_wait(e, r, st.n, &st);
    while (!st.done);
    ASSERT(st.logprobs && st.n_top == TOP && st.n == NEW);
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 3, st.tokens, NEW * sizeof *seq);
    ASSERT_OK(moe_lm_forward(&m, seq, NULL, 1, 3 + NEW - 1, NULL));
    const float *lg = moe_lm_logits(&m);
    for (int i = 0; i < NEW; i++) {
      const float *row = lg + (size_t)(2 + i) * V;
      double mx = row[0], sum = 0;
      for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
      for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
      double want = row[st.tokens[i]] - mx - log(sum);
      if (fabs(st.logprobs[i] - want) > 1e-4) FAIL_("token %d: logprob %g, full forward %g", i, st.logprobs[i], want);
      for (int j = 0; j < TOP; j++) {
        int32_t id = st.top_ids[i * TOP + j];
        double w = row[id] - mx - log(sum);
        if (fabs(st.top_logprobs[i * TOP + j] - w) > 1e-4) FAIL_("token %d alternative %d", i, j);
        if (j) ASSERT(st.top_logprobs[i * TOP + j] <= st.top_logprobs[i * TOP + j - 1]);
      }
      if (!sampled) ASSERT_EQ_INT(st.top_ids[i * TOP], st.tokens[i]);
    }
    moe_engine_release(e, r);
  }
  moe_engine_req *bad;
  moe_engine_params bp = {prompt, 3, 2, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 3, 0};
  ASSERT_STATUS(moe_engine_submit(e, &bp, &bad), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "top_logprobs"));
  moe_engine_free(e);
  moe_lm_free(&m);
}

/* The log-softmax of row at id (in double). */
static double log_softmax(const float *row, int id) {
  double mx = row[0], sum = 0;
  for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
  return row[id] - mx - log(sum);
}

/* prompt_logprobs (a completions server's echo): each prompt token's log-probability and alternatives
 * from the full forward's logits of the position before it, the first NaN; with max_tokens 0 the request
 * is done after its prompt with no token; the others' tokens are those without it. */
TEST(engine_prompt_logprobs_are_the_full_forwards) {
  moe_lm_t m;
  ASSERT(load(&m));
  enum { P = 6, TOP = 3 };
  int32_t prompt[P] = {5, 9, 1, 33, 7, 60};
  moe_engine_config c = {.slots = 2};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c));
  ASSERT_OK(moe_lm_forward(&m, prompt, NULL, 1, P, NULL));
  float *lg = malloc(sizeof(float) * P * V);
  ASSERT(lg);
  memcpy(lg, moe_lm_logits(&m), sizeof(float) * P * V);
  for (int max_tokens = 0; max_tokens <= 4; max_tokens += 4) {
    moe_engine_params p = {prompt, P, max_tokens, 0.0f, 1.0f, 0, 1, NULL, 0, 1, TOP, 1};
    moe_engine_req *r;
    ASSERT_OK(moe_engine_submit(e, &p, &r));
    moe_engine_state st = {0};
    do moe_engine_wait(e, r, st.n, &st);
    while (!st.done);
    ASSERT_EQ_INT(st.done, 1);
    ASSERT_EQ_INT(st.n, max_tokens);
    ASSERT(st.prompt_logprobs && st.prompt_top_ids && st.prompt_top_logprobs);
    ASSERT(isnan(st.prompt_logprobs[0]) && st.prompt_top_ids[0] == -1);
    for (int i = 1; i < P; i++) {
      const float *row = lg + (size_t)(i - 1) * V;
      double want = log_softmax(row, prompt[i]);
      if (fabs(st.prompt_logprobs[i] - want) > 1e-4) FAIL_("prompt token %d: %g, full forward %g", i, st.prompt_logprobs[i], want);
      for (int j = 0; j < TOP; j++) {
        int32_t id = st.prompt_top_ids[i * TOP + j];
        if (fabs(st.prompt_top_logprobs[i * TOP + j] - log_softmax(row, id)) > 1e-4) FAIL_("prompt %d alternative %d", i, j);
        if (j) ASSERT(st.prompt_top_logprobs[i * TOP + j] <= st.prompt_top_logprobs[i * TOP + j - 1]);
      }
    }
    if (max_tokens) { /* greedy: the first token is the best alternative after the prompt */
      ASSERT_EQ_INT(st.tokens[0], st.top_ids[0]);
      double want = log_softmax(lg + (size_t)(P - 1) * V, st.tokens[0]);
      ASSERT(fabs(st.logprobs[0] - want) < 1e-4);
    }
    moe_engine_release(e, r);
  }
  moe_engine_req *bad;
  moe_engine_params bp = {prompt, P, 0, 0.0f, 1.0f, 0, 0, NULL, 0, 0, 0, 0}; /* max_tokens 0 without scoring */
  ASSERT_STATUS(moe_engine_submit(e, &bp, &bad), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "max_tokens"));
  bp.max_tokens = 1, bp.prompt_logprobs = 1; /* scoring needs logprobs */
  ASSERT_STATUS(moe_engine_submit(e, &bp, &bad), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "prompt_logprobs"));
  free(lg);
  moe_engine_free(e);
  moe_lm_free(&m);
}

/* The threads of this process (/proc/self/task). */
static int tasks(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

/* A prompt decoded on the calling thread. */
static void decode_here(moe_lm_t *m) {
  moe_lm_cache *kv;
  int32_t t[3] = {5, 9, 1};
  if (moe_lm_cache_new(&kv, m, 1) == MOE_OK) {
    moe_lm_decode(m, kv, t, 3);
    moe_lm_cache_free(kv);
  }
}

/* The thread count once it has come down to n (threads end a little after they are told to), polled for
 * at most 5 s; the count then. */
static int settles_to(int n) {
  for (int i = 0; i < 5000 && tasks() != n; i++) usleep(1000);
  return tasks();
}

/* moe_threads_release ends the calling thread's OpenMP team, and moe_engine_new does it for its caller,
 * so that a model decoded on the engine's thread does not keep the loading thread's team beside its own. */
TEST(threads_release_ends_the_callers_team) {
  moe_lm_t m;
  int base = tasks();
  ASSERT(load(&m)); /* with AVX-512 its init runs a parallel region: this thread's team starts here */
  moe_threads_release();
  ASSERT_EQ_INT(settles_to(base), base);
  moe_lm_set_threads(&m, 2);
  decode_here(&m); /* on this thread: its team of 2 stays, one worker more */
  ASSERT_EQ_INT(tasks(), base + 1);
  moe_threads_release();
  ASSERT_EQ_INT(settles_to(base), base);
  decode_here(&m);
  ASSERT_EQ_INT(tasks(), base + 1);
  moe_engine_config c = {.slots = 1};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &c)); /* this thread's team ends; the engine's thread starts */
  ASSERT_EQ_INT(settles_to(base + 1), base + 1);
  moe_engine_free(e);
  moe_lm_free(&m);
}

/* The engine's text through a SentencePiece tokenizer (Llama 2's: "▁" pieces, byte fallback): a random
 * model sampling over its whole vocabulary; the text read as it comes (moe_engine_text from each state's
 * text_safe) joined is what the tokens add to the prompt's decode (its first piece's space kept), with
 * bytes that are not UTF-8 as U+FFFD, and has no "▁". */
TEST(engine_text_streams_through_the_tokenizers_decoders) {
  char path[1024];
  snprintf(path, sizeof path, "%s/../../data/tokenizers/llama2/tokenizer.json", test_fixture_dir());
  if (access(path, R_OK)) SKIP("no data/tokenizers/llama2 (scripts/get-tokenizers.sh fetches it)");
  moe_tokenizer *t;
  ASSERT_OK(moe_tokenizer_load(&t, path));
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = moe_tokenizer_vocab_size(t), c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 8;
  c.max_seq = 64, c.moe.D = 16, c.moe.H = 16, c.moe.E = 2, c.moe.top_k = 1, c.moe.threads = 1;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 3);
  moe_engine_config ec = {.slots = 1, .tok = t};
  moe_engine *e;
  ASSERT_OK(moe_engine_new(&e, &m, &ec));
  int32_t prompt[] = {1, 450, 4796}; /* <s> "▁The" "▁cat" */
  moe_engine_params p = {prompt, 3, 40, 1.0f, 1.0f, 11, 1, NULL, 0, 0, 0, 0};
  moe_engine_req *r;
  ASSERT_OK(moe_engine_submit(e, &p, &r));
  moe_engine_state st = {0};
  char got[4096], *piece, *all = NULL, *want = NULL;
  size_t w = 0, k, n;
  do {
    moe_engine_wait(e, r, st.n, &st);
    ASSERT_OK(moe_engine_text(e, r, w, st.text_safe, &piece, &k));
    ASSERT(w + k < sizeof got);
    memcpy(got + w, piece, k), w += k;
    free(piece);
  } while (!st.done);
  ASSERT_EQ_INT(st.n, 40);
  int32_t ids[43]; /* the text continues the prompt's: what the tokens add to its decode */
  memcpy(ids, prompt, sizeof prompt);
  memcpy(ids + 3, st.tokens, 40 * sizeof *ids);
  char *pre = NULL;
  size_t np;
  ASSERT_OK(moe_tokenizer_decode_alloc(t, prompt, 3, &pre, &np));
  ASSERT_OK(moe_tokenizer_decode_alloc(t, ids, 43, &all, &n));
  ASSERT(np <= n && !memcmp(pre, all, np) && (want = malloc(3 * n + 1)));
  free(pre);
  size_t used, nw = moe__utf8_clean(all + np, n - np, 1, want, &used);
  if (nw != w || memcmp(got, want, w)) FAIL_("streamed \"%.*s\", decode \"%.*s\"", (int)w, got, (int)nw, want);
  got[w] = 0;
  ASSERT(!strstr(got, "\xe2\x96\x81"));
  ASSERT_STATUS(moe_engine_text(e, r, 0, w + 1, &piece, &k), MOE_ERR_ARG); /* not shown yet: never */
  free(all), free(want);
  moe_engine_release(e, r);
  moe_engine_free(e);
  moe_lm_free(&m);
  moe_tokenizer_free(t);
}
