/* moe serve (DESIGN 4.7): the Prometheus metrics (serve_metrics.c), the HTTP handlers on libmicrohttpd
 * (serve_http.c) and the command (serve.c), around the library's continuous-batching engine
 * (moe_engine). */
#ifndef MOE_CLI_SERVE_H
#define MOE_CLI_SERVE_H

#include <pthread.h>
#include <stdio.h>

#include "moe.h"

/* ---- metrics: counters the engine and the handlers add to, printed in Prometheus text ---- */
#define SERVE_NBUCKETS 12
typedef struct {
  pthread_mutex_t mu;
  double start;                 /* when the server started */
  int64_t requests[6];          /* by status class: 1xx..5xx ([1]..[5]), [0] completions admitted */
  int64_t prompt_tokens, tokens; /* prompt tokens read and tokens generated (an end of text not counted) */
  double busy_s;                /* the engine's time in prefill and decode steps */
  int64_t steps, batch_sum, batch_hist[SERVE_NBUCKETS + 1]; /* decode steps by batch size (powers of 2, +Inf) */
  int64_t lat_hist[SERVE_NBUCKETS + 1], ttft_hist[SERVE_NBUCKETS + 1];
  double lat_sum, ttft_sum;
  int L;                        /* per layer: the expert caches (NULL: every expert resident) */
  moe_expert_cache **caches;
  size_t all_expert_bytes;      /* every expert resident, per the whole model */
} serve_metrics;
void serve_metrics_init(serve_metrics *m, int L, moe_expert_cache **caches, size_t all_expert_bytes);
void serve_metrics_free(serve_metrics *m);
/* The metrics in Prometheus text format with e's gauges, malloc'd (NULL when out of memory). */
char *serve_metrics_text(serve_metrics *m, moe_engine *e);
void serve_metrics_status(serve_metrics *m, int status);
void serve_metrics_latency(serve_metrics *m, double ttft_s, double total_s);
void serve_metrics_step(serve_metrics *m, int rows, int new_tokens, int prompt_tokens, double s);

/* ---- HTTP ---- */
typedef struct serve_http serve_http;
typedef struct {
  int context;         /* a request's prompt and max_tokens at most (0: the model's max_seq) */
  int max_connections; /* connections served; past them /health still answers, the rest 503 */
  int timeout_s;       /* a connection idle that long, or a request not all arrived, is closed */
} serve_http_opts;
/* Listens on host:port (port 0: one the kernel picks; *bound gets it), answering every request 503
 * ("loading") until serve_http_ready. Non-zero after printing why it cannot. */
int serve_http_start(serve_http **out, const char *host, int port, serve_metrics *met, const serve_http_opts *o,
                     int *bound);
/* From now on serves m through e (tok may be NULL; chat NULL: chat is refused). */
void serve_http_ready(serve_http *h, moe_engine *e, const moe_lm_config *m, const moe_tokenizer *tok,
                      const moe_chat_template *chat);
/* Waits until no response counted before the drain is under way (those still arriving close within
 * the timeout), then stops the daemon and frees. */
void serve_http_stop(serve_http *h);

#endif
