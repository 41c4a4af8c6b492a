/* moe serve (DESIGN 4.7): the request queue and continuous-batching engine (serve_engine.c), the
 * Prometheus metrics (serve_metrics.c), the HTTP handlers on libmicrohttpd (serve_http.c) and the
 * command (serve.c). */
#ifndef MOE_CLI_SERVE_H
#define MOE_CLI_SERVE_H

#include <pthread.h>
#include <stdio.h>

#include "lm_data.h"
#include "moe.h"
#include "serve/completion.h"

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
  int queued, running;          /* gauges */
  int L;                        /* per layer: the expert caches (NULL: every expert resident) */
  moe_expert_cache **caches;
  size_t all_expert_bytes;      /* every expert resident, per the whole model */
} serve_metrics;
void serve_metrics_init(serve_metrics *m, int L, moe_expert_cache **caches, size_t all_expert_bytes);
void serve_metrics_free(serve_metrics *m);
/* The metrics in Prometheus text format, malloc'd (NULL when out of memory). */
char *serve_metrics_text(serve_metrics *m);
void serve_metrics_status(serve_metrics *m, int status);
void serve_metrics_latency(serve_metrics *m, double ttft_s, double total_s);
void serve_metrics_step(serve_metrics *m, int rows, int new_tokens, int prompt_tokens, double s);

/* ---- a completion request, shared by its HTTP connection and the engine ---- */
typedef struct serve_req {
  moe__completion c;
  int32_t *out;        /* (c.max_tokens) the tokens generated so far: n_out of them */
  int n_out;
  int done;            /* 1 finished (max_tokens or the end of text), -1 failed (err says why) */
  int stop;            /* done at the end of text or a stop string (finish_reason "stop"), not max_tokens */
  char *text;          /* with stop strings: the text's bytes so far (the engine's) */
  size_t n_text, cap_text;
  size_t safe;         /* with stop strings: the bytes of text that may go out (before a stop string) */
  int gone;            /* the client left: the engine drops it */
  int refs;            /* the connection and the engine each hold one */
  int slot;
  double t_arrive;
  char err[256];
  pthread_cond_t cv;   /* signalled on each new token and at the end */
  struct serve_req *next;
} serve_req;

/* ---- the engine: one thread owns the model and a KV cache of B slots; between decode steps
 * requests leave (done or gone) and queued ones join (their prompt in one forward), then one decode
 * step runs every running request's last token through the model together. ---- */
typedef struct {
  moe_lm_t *m;
  const moe_tokenizer *tok; /* the text of tokens, for stop strings (NULL: none are taken) */
  moe_lm_cache *kv;
  int B;
  serve_metrics *met;
  FILE *trace;           /* step,layer,expert,tokens rows, or NULL */
  int64_t trace_step;
  pthread_mutex_t mu;    /* guards the queue, the requests' outputs and the flags */
  pthread_cond_t wake;
  pthread_t th;
  serve_req *qhead, *qtail, **slots; /* slots (B): the request in each, or NULL */
  int *joined;           /* (2 B) the engine's scratch: slots joining, rows of a step */
  int32_t *last;         /* (B) the tokens of a step */
  int draining;          /* no new requests; the thread ends once the queue and slots are empty */
  int32_t eos[LM_MAX_EOS]; /* the ids that end a request not asking to ignore them */
  int n_eos;
} serve_engine;

moe_status serve_engine_start(serve_engine *e, moe_lm_t *m, const moe_tokenizer *tok, int B, serve_metrics *met,
                              FILE *trace, const int32_t *eos, int n_eos);
/* Stops taking requests, finishes those queued and running, joins the thread. */
void serve_engine_drain(serve_engine *e);
/* After the connections are gone (serve_http_stop). */
void serve_engine_free(serve_engine *e);
/* A request for the parsed body c (moved into it) with two references; NULL when out of memory. */
serve_req *serve_req_new(moe__completion *c);
/* Queues r; 0 when the engine is draining (r is untouched). */
int serve_submit(serve_engine *e, serve_req *r);
/* Waits until r has more than `have` tokens or is done; returns its token count and sets *done to
 * r->done and *safe to r->safe (locks e->mu). */
int serve_wait(serve_engine *e, serve_req *r, int have, int *done, size_t *safe);
/* The connection's end of r: marks it gone when unfinished, drops the reference. */
void serve_release(serve_engine *e, serve_req *r);
int serve_draining(serve_engine *e);

/* ---- HTTP ---- */
typedef struct serve_http serve_http;
typedef struct {
  int context;         /* a request's prompt and max_tokens at most (0: the model's max_seq) */
  int max_connections; /* connections served; past them /health still answers, the rest 503 */
  int timeout_s;       /* a connection idle that long, or a request not all arrived, is closed */
} serve_http_opts;
/* Serves on host:port (port 0: one the kernel picks; *bound gets it). tok may be NULL. */
moe_status serve_http_start(serve_http **out, const char *host, int port, serve_engine *e, const moe_tokenizer *tok,
                            const serve_http_opts *o, int *bound);
/* Waits until no response counted before the drain is under way (those still arriving close within
 * the timeout), then stops the daemon and frees. */
void serve_http_stop(serve_http *h);

#endif
