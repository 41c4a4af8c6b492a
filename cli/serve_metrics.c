/* moe serve's metrics in Prometheus text format (serve.h): requests by status, tokens and tokens/s,
 * decode batch sizes, the expert caches' hit rate per layer and resident expert bytes, queue length,
 * and histograms of time to first token and request latency. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve.h"

/* Histogram upper bounds: batch sizes 1, 2, 4 ... 2048; seconds 1 ms, 2 ms, 4 ms ... 2 s. */
static double bound(int i, int seconds) { return (double)(1 << i) * (seconds ? 1e-3 : 1); }

void serve_metrics_init(serve_metrics *m, int L, moe_expert_cache **caches, size_t all_expert_bytes) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
  m->start = cli_now();
  m->L = L, m->caches = caches, m->all_expert_bytes = all_expert_bytes;
}

void serve_metrics_free(serve_metrics *m) { pthread_mutex_destroy(&m->mu); }

static void observe(int64_t *hist, double v, int seconds) {
  int i = 0;
  while (i < SERVE_NBUCKETS && v > bound(i, seconds)) i++;
  hist[i]++;
}

void serve_metrics_status(serve_metrics *m, int status) {
  pthread_mutex_lock(&m->mu);
  m->requests[status / 100 % 6]++;
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_latency(serve_metrics *m, double ttft_s, double total_s) {
  pthread_mutex_lock(&m->mu);
  if (ttft_s >= 0) observe(m->ttft_hist, ttft_s, 1), m->ttft_sum += ttft_s;
  if (total_s >= 0) observe(m->lat_hist, total_s, 1), m->lat_sum += total_s;
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_step(serve_metrics *m, int rows, int new_tokens, int prompt_tokens, double s) {
  pthread_mutex_lock(&m->mu);
  if (rows) observe(m->batch_hist, rows, 0), m->steps++, m->batch_sum += rows;
  m->tokens += new_tokens, m->prompt_tokens += prompt_tokens, m->busy_s += s;
  pthread_mutex_unlock(&m->mu);
}

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = t->oom ? 0 : vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (t->oom || (size_t)k < t->cap - t->n) {
      t->n += (size_t)k;
      return;
    }
    char *q = realloc(t->p, t->cap * 2 + (size_t)k);
    if (!q) {
      t->oom = 1;
      return;
    }
    t->p = q, t->cap = t->cap * 2 + (size_t)k;
  }
}

static void histogram(text *t, const char *name, const char *help, const int64_t *h, double sum, int seconds) {
  put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  int64_t acc = 0;
  for (int i = 0; i < SERVE_NBUCKETS; i++)
    acc += h[i], put(t, "%s_bucket{le=\"%g\"} %lld\n", name, bound(i, seconds), (long long)acc);
  acc += h[SERVE_NBUCKETS];
  put(t, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %g\n%s_count %lld\n", name, (long long)acc, name, sum, name,
      (long long)acc);
}

char *serve_metrics_text(serve_metrics *m, moe_engine *e) {
  text t = {malloc(4096), 0, 4096, 0};
  if (!t.p) return NULL;
  moe_engine_stats es;
  moe_engine_get_stats(e, &es);
  t.p[0] = 0;
  pthread_mutex_lock(&m->mu);
  put(&t, "# HELP moe_serve_requests_total HTTP responses by status class.\n# TYPE moe_serve_requests_total counter\n");
  for (int c = 1; c < 6; c++) put(&t, "moe_serve_requests_total{code=\"%dxx\"} %lld\n", c, (long long)m->requests[c]);
  put(&t, "# HELP moe_serve_admitted_total Completion requests queued for the engine.\n"
          "# TYPE moe_serve_admitted_total counter\nmoe_serve_admitted_total %lld\n", (long long)m->requests[0]);
  put(&t, "# HELP moe_serve_prompt_tokens_total Prompt tokens read.\n# TYPE moe_serve_prompt_tokens_total counter\n"
          "moe_serve_prompt_tokens_total %lld\n", (long long)m->prompt_tokens);
  put(&t, "# HELP moe_serve_prefills_total Forwards that ran prompts (a step's, with every prompt that joined and "
          "fits and the running requests' tokens; one wanting prompt_logprobs alone).\n"
          "# TYPE moe_serve_prefills_total counter\nmoe_serve_prefills_total %lld\n", (long long)es.prefills);
  put(&t, "# HELP moe_serve_forwards_total Forwards through the model (one a step, and one a prompt wanting "
          "prompt_logprobs).\n# TYPE moe_serve_forwards_total counter\nmoe_serve_forwards_total %lld\n",
          (long long)es.forwards);
  put(&t, "# HELP moe_serve_generated_tokens_total Tokens generated.\n# TYPE moe_serve_generated_tokens_total counter\n"
          "moe_serve_generated_tokens_total %lld\n", (long long)m->tokens);
  put(&t, "# HELP moe_serve_tokens_per_second Tokens generated per second of the engine's busy time.\n"
          "# TYPE moe_serve_tokens_per_second gauge\nmoe_serve_tokens_per_second %g\n",
      m->busy_s > 0 ? (double)m->tokens / m->busy_s : 0.0);
  put(&t, "# HELP moe_serve_uptime_seconds Seconds since the server started.\n# TYPE moe_serve_uptime_seconds gauge\n"
          "moe_serve_uptime_seconds %g\n", cli_now() - m->start);
  put(&t, "# HELP moe_serve_queue_length Requests waiting for a batch slot.\n# TYPE moe_serve_queue_length gauge\n"
          "moe_serve_queue_length %d\n", es.queued);
  put(&t, "# HELP moe_serve_running Requests in the running batch.\n# TYPE moe_serve_running gauge\n"
          "moe_serve_running %d\n", es.running);
  histogram(&t, "moe_serve_batch_size", "Running requests' tokens per step (beside the prompts that joined).", m->batch_hist, (double)m->batch_sum, 0);
  histogram(&t, "moe_serve_ttft_seconds", "Time to first token.", m->ttft_hist, m->ttft_sum, 1);
  histogram(&t, "moe_serve_request_seconds", "Request latency, arrival to last token.", m->lat_hist, m->lat_sum, 1);
  size_t resident = m->caches ? 0 : m->all_expert_bytes;
  int L = m->L;
  moe_expert_cache_stats *s = calloc((size_t)L + 1, sizeof *s);
  if (!s) t.oom = 1, L = 0;
  for (int l = 0; l < L; l++) {
    if (m->caches && m->caches[l]) moe_expert_cache_get_stats(m->caches[l], &s[l]), resident += s[l].resident_bytes;
  }
  put(&t, "# HELP moe_serve_expert_cache_hit_rate Active experts found resident, per MoE layer.\n"
          "# TYPE moe_serve_expert_cache_hit_rate gauge\n");
  for (int l = 0; l < L; l++)
    put(&t, "moe_serve_expert_cache_hit_rate{layer=\"%d\"} %g\n", l,
        s[l].accesses ? 1.0 - (double)s[l].misses / (double)s[l].accesses : 1.0);
  put(&t, "# HELP moe_serve_expert_cache_slots Experts the cache holds, per MoE layer (--placement).\n"
          "# TYPE moe_serve_expert_cache_slots gauge\n");
  for (int l = 0; l < L; l++) put(&t, "moe_serve_expert_cache_slots{layer=\"%d\"} %d\n", l, s[l].slots);
  put(&t, "# HELP moe_serve_expert_cache_pinned Of those, experts pinned (--pin-from), per MoE layer.\n"
          "# TYPE moe_serve_expert_cache_pinned gauge\n");
  for (int l = 0; l < L; l++) put(&t, "moe_serve_expert_cache_pinned{layer=\"%d\"} %d\n", l, s[l].pinned);
  put(&t, "# HELP moe_serve_expert_bytes_read_total Expert bytes read from the checkpoint, per MoE layer.\n"
          "# TYPE moe_serve_expert_bytes_read_total counter\n");
  for (int l = 0; l < L; l++) put(&t, "moe_serve_expert_bytes_read_total{layer=\"%d\"} %lld\n", l, (long long)s[l].bytes_read);
  put(&t, "# HELP moe_serve_expert_stall_seconds_total Time waiting for experts to be read, per MoE layer.\n"
          "# TYPE moe_serve_expert_stall_seconds_total counter\n");
  for (int l = 0; l < L; l++) put(&t, "moe_serve_expert_stall_seconds_total{layer=\"%d\"} %g\n", l, s[l].stall_seconds);
  put(&t, "# HELP moe_serve_expert_prefetch_precision Predicted experts the next batch used, per MoE layer.\n"
          "# TYPE moe_serve_expert_prefetch_precision gauge\n");
  for (int l = 0; l < L; l++)
    put(&t, "moe_serve_expert_prefetch_precision{layer=\"%d\"} %g\n", l,
        s[l].predicted ? (double)s[l].predicted_hit / (double)s[l].predicted : 0.0);
  put(&t, "# HELP moe_serve_expert_prefetch_recall Active experts that were predicted, per MoE layer.\n"
          "# TYPE moe_serve_expert_prefetch_recall gauge\n");
  for (int l = 0; l < L; l++)
    put(&t, "moe_serve_expert_prefetch_recall{layer=\"%d\"} %g\n", l,
        s[l].actual ? (double)s[l].predicted_hit / (double)s[l].actual : 0.0);
  free(s);
  put(&t, "# HELP moe_serve_resident_expert_bytes Expert weights in memory.\n"
          "# TYPE moe_serve_resident_expert_bytes gauge\nmoe_serve_resident_expert_bytes %zu\n"
          "# HELP moe_serve_all_expert_bytes Expert weights of the whole model, in the bytes they are held in.\n"
          "# TYPE moe_serve_all_expert_bytes gauge\nmoe_serve_all_expert_bytes %zu\n", resident, m->all_expert_bytes);
  pthread_mutex_unlock(&m->mu);
  if (t.oom) free(t.p), t.p = NULL;
  return t.p;
}
