/* moe serve's HTTP side on libmicrohttpd (serve.h): POST /v1/completions (OpenAI's completion shape,
 * streamed as server-sent events when asked), GET /health and GET /metrics. It listens before the model
 * loads, answering everything 503 ("loading") until serve_http_ready. One thread per connection
 * (libmicrohttpd's), so that a handler can wait for its tokens on a condition variable; the engine's
 * thread owns the model. Every error is a JSON body {"error": {"message", "type"}} with a 4xx or 5xx.
 * Connections are bounded: past --max-connections a reserve of RESERVE more is taken, each closed
 * after a second idle, where /health is answered and everything else 503; beyond it libmicrohttpd
 * closes them at once. A connection idle for --timeout seconds, or a request that has not all arrived
 * that long after its headers, is closed, which also bounds the drain at SIGTERM. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "serve.h"

#define MAX_BODY (1 << 20) /* a request body larger than this is refused (413) */
#define RESERVE 64u        /* connections past the limit, to answer /health and 503 */

struct serve_http {
  struct MHD_Daemon *d;
  moe_engine *e;
  const moe_lm_config *m;
  const moe_tokenizer *tok;
  const moe_chat_template *chat; /* or NULL: chat is refused */
  serve_metrics *met;
  serve_http_opts o;
  time_t created;     /* when it started, for /v1/models */
  atomic_int ready;   /* e, m and tok are set (released by serve_http_ready) */
  atomic_llong next_id;
  pthread_mutex_t mu; /* guards busy and open */
  pthread_cond_t idle;
  int busy;           /* requests counted before the drain whose response is not yet complete */
  int open;           /* connections */
};

typedef struct { /* one request on a connection: its body as it arrives */
  char *body;
  size_t n;
  int too_big;
  int counted;        /* in busy: its headers came before the drain */
  double deadline;    /* the body must have come by then */
} conn_req;

typedef struct { /* the state of a response: the request, its text so far */
  serve_http *h;
  moe_request c;   /* the parsed body */
  moe_engine_req *r;
  moe_engine_state st; /* the request's state at the last wait */
  long long id;
  int sent;            /* tokens turned into text */
  int timed;           /* its latencies are in the metrics */
  int chat;            /* POST /v1/chat/completions: chat's shapes */
  int role_sent;       /* chat stream: the first delta (with the role) is out */
  int echoed;          /* echo: the prompt is out */
  size_t echo_len;     /* echo: the prompt's text's bytes */
  size_t start;        /* the text's bytes out */
  char *pending;       /* stream: an event not yet (all) written */
  size_t npending, at;
  int last;            /* stream: the event with the finish_reason is out */
  int finished;
} reply;

static enum MHD_Result send_text(struct MHD_Connection *c, serve_http *h, int status, const char *type, char *body) {
  serve_metrics_status(h->met, status);
  if (!body) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) return free(body), MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, serve_http *h, int status, cJSON *o) {
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  return send_text(c, h, status, "application/json", s);
}

static enum MHD_Result send_error(struct MHD_Connection *c, serve_http *h, int status, const char *msg) {
  cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
  size_t n = strlen(msg);
  char *utf = malloc(3 * n + 1); /* a message quoting the request may cut a character */
  if (utf) moe_utf8_clean(msg, n, utf);
  cJSON_AddStringToObject(e, "message", utf ? utf : msg);
  free(utf);
  cJSON_AddStringToObject(e, "type", status < 500 ? "invalid_request_error" : "server_error");
  return send_json(c, h, status, o);
}

/* The text of r's tokens [p->sent, n) into a malloc'd string, and p->sent = n: with a tokenizer the
 * engine's text from p->start up to what may be shown (characters split over tokens and what may begin
 * a stop string wait for the next), else their ids as moe generate prints them. */
static char *new_text(reply *p, int n) {
  char *out = NULL;
  size_t len;
  if (p->h->tok) {
    if (moe_engine_text(p->h->e, p->r, p->start, p->st.text_safe, &out, &len) != MOE_OK) return NULL;
    p->start = p->st.text_safe;
  } else if ((out = malloc(12 * (size_t)(n - p->sent) + 1))) {
    size_t w = 0;
    for (int i = p->sent; i < n; i++) w += (size_t)sprintf(out + w, "%s%d", i ? " " : "", p->st.tokens[i]);
    out[w] = 0;
  }
  if (out) p->sent = n;
  return out;
}

/* A token's text for logprobs: its bytes, those that are not UTF-8 as U+FFFD (malloc'd), or its id. */
/* A token's text: what token t adds to the decoded text after token prev (-1: at the start), as decoding
 * [prev, t] beside [prev] (its text `before`, nb bytes, decoded once for the token and its alternatives)
 * tells it (SentencePiece's "\u2581the" is " the", byte fallback's <0x0A> a newline, byte-level BPE's its
 * bytes); the text of t alone when a decoder changed prev's. raw: those bytes (a character split over
 * tokens comes in pieces), text: them as UTF-8 (U+FFFD for such pieces), both malloc'd. Without a
 * tokenizer the id, as moe generate prints it. 0 when out of memory. */
typedef struct {
  char *raw, *text;
  size_t n; /* raw's bytes */
} token_piece;

static int token_piece_of(const serve_http *h, const char *before, size_t nb, int32_t prev, int32_t t, token_piece *out) {
  memset(out, 0, sizeof *out);
  char *b = NULL;
  size_t n = 0;
  int32_t ids[2] = {prev, t};
  if (!h->tok) {
    if (!(out->raw = malloc(16))) return 0;
    out->n = (size_t)snprintf(out->raw, 16, "%d", t);
  } else if (before && moe_tokenizer_decode_alloc(h->tok, ids, 2, &b, &n) == MOE_OK && n >= nb && !memcmp(before, b, nb)) {
    if ((out->raw = malloc(n - nb + 1))) memcpy(out->raw, b + nb, n - nb), out->n = n - nb;
  } else if (moe_tokenizer_decode_alloc(h->tok, &t, 1, &out->raw, &out->n) != MOE_OK) {
    out->raw = NULL;
  }
  free(b);
  out->text = out->raw ? malloc(3 * out->n + 1) : NULL;
  if (!out->text) return free(out->raw), out->raw = NULL, 0;
  moe_utf8_clean(out->raw, out->n, out->text);
  return 1;
}

static void token_piece_free(token_piece *p) { free(p->raw), free(p->text); }

/* OpenAI's "bytes" of a chat token: its raw bytes as numbers. */
static cJSON *bytes_json(const token_piece *p) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < p->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p->raw[i]));
  return a;
}

/* The prompt's text for echo (malloc'd): its ids through the tokenizer (bytes that are not UTF-8 as
 * U+FFFD), or the ids as moe generate prints them. */
static char *prompt_text(const reply *p) {
  char *raw = NULL, *out = NULL;
  size_t len = 0;
  if (!p->h->tok) {
    if ((out = malloc(12 * (size_t)p->c.n_ids + 1)))
      for (int i = 0, w = 0; i < p->c.n_ids; i++) w += sprintf(out + w, "%s%d", i ? " " : "", p->c.ids[i]);
  } else if (moe_tokenizer_decode_alloc(p->h->tok, p->c.ids, (size_t)p->c.n_ids, &raw, &len) == MOE_OK &&
             (out = malloc(3 * len + 1)))
    moe_utf8_clean(raw, len, out);
  free(raw);
  return out;
}

/* a, sep and b in a new string; frees b (NULL when out of memory). */
static char *joined(const char *a, const char *sep, char *b) {
  char *s = malloc(strlen(a) + strlen(sep) + strlen(b) + 1);
  if (s) sprintf(s, "%s%s%s", a, sep, b);
  free(b);
  return s;
}

/* One token's entry in logprobs_json's arrays (completions: toks, lps, tops, offs; chat: content): t, its
 * log-probability lp (NaN, a prompt's first token: null) and n_top alternatives (ids, their lps). */
typedef struct {
  cJSON *content, *toks, *lps, *tops, *offs;
  size_t offset; /* completions: the text's bytes before the token */
} lp_arrays;

static int add_entry(const reply *p, lp_arrays *a, int32_t prev, int32_t t, float lp, const int32_t *ids,
                     const float *alt, int n_top) {
  token_piece tt, s;
  char *before = NULL; /* prev's text, for the token and its alternatives */
  size_t nb = 0;
  if (p->h->tok && prev >= 0 && moe_tokenizer_decode_alloc(p->h->tok, &prev, 1, &before, &nb) != MOE_OK) before = NULL;
  cJSON *top = isnan(lp) ? cJSON_CreateNull() : p->chat ? cJSON_CreateArray() : cJSON_CreateObject();
  int ok = token_piece_of(p->h, before, nb, prev, t, &tt) && top;
  for (int j = 0; ok && !isnan(lp) && j < n_top; j++) {
    if (!token_piece_of(p->h, before, nb, prev, ids[j], &s)) ok = 0;
    else if (p->chat) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "token", s.text);
      cJSON_AddNumberToObject(e, "logprob", alt[j]);
      cJSON_AddItemToObject(e, "bytes", bytes_json(&s));
      cJSON_AddItemToArray(top, e);
    } else if (!cJSON_GetObjectItemCaseSensitive(top, s.text)) /* two ids of one text: the more probable */
      cJSON_AddNumberToObject(top, s.text, alt[j]);
    if (ok) token_piece_free(&s);
  }
  if (ok && p->chat) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", tt.text);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON_AddItemToObject(e, "bytes", bytes_json(&tt));
    cJSON_AddItemToObject(e, "top_logprobs", top), top = NULL;
    cJSON_AddItemToArray(a->content, e);
  } else if (ok) {
    cJSON_AddItemToArray(a->toks, cJSON_CreateString(tt.text));
    cJSON_AddItemToArray(a->lps, isnan(lp) ? cJSON_CreateNull() : cJSON_CreateNumber(lp));
    cJSON_AddItemToArray(a->tops, top), top = NULL;
    cJSON_AddItemToArray(a->offs, cJSON_CreateNumber((double)a->offset));
    a->offset += tt.n;
  }
  cJSON_Delete(top);
  token_piece_free(&tt);
  free(before);
  return ok;
}

/* The log-probabilities of tokens [from, n) in OpenAI's completion shape ({"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"}) or chat's ({"content": [{"token", "logprob", "bytes", "top_logprobs"}]}),
 * after the prompt's tokens when echo asks for them (prompt 1); NULL when the request did not ask for
 * them (or out of memory). */
static cJSON *logprobs_json(const reply *p, int from, int n, int prompt) {
  const moe_engine_state *st = &p->st;
  if (!st->logprobs) return NULL;
  cJSON *o = cJSON_CreateObject();
  lp_arrays a = {0};
  if (p->chat) a.content = cJSON_AddArrayToObject(o, "content");
  else {
    a.toks = cJSON_AddArrayToObject(o, "tokens"), a.lps = cJSON_AddArrayToObject(o, "token_logprobs");
    a.tops = cJSON_AddArrayToObject(o, "top_logprobs"), a.offs = cJSON_AddArrayToObject(o, "text_offset");
  }
  int ok = o != NULL, k = st->n_top;
  for (int i = 0; ok && prompt && i < p->c.n_ids; i++)
    ok = add_entry(p, &a, i ? p->c.ids[i - 1] : -1, p->c.ids[i], st->prompt_logprobs[i],
                   st->prompt_top_ids + (size_t)i * k, st->prompt_top_logprobs + (size_t)i * k, k);
  a.offset = p->echo_len + p->start; /* the text's bytes before token `from` (completions) */
  for (int i = from; ok && i < n; i++) {
    int32_t prev = i ? st->tokens[i - 1] : p->c.n_ids ? p->c.ids[p->c.n_ids - 1] : -1;
    ok = add_entry(p, &a, prev, st->tokens[i], st->logprobs[i], st->top_ids + (size_t)i * k,
                   st->top_logprobs + (size_t)i * k, k);
  }
  if (!ok) cJSON_Delete(o);
  return ok ? o : NULL;
}

/* {"id", "object", "created", "model", "choices": [...]} for tokens [p->sent, n): the whole answer, or one
 * event of a stream. A completion's choice is {"text", "index", "logprobs", "finish_reason", "token_ids"};
 * a chat's {"index", "message": {"role", "content"}} or, streamed, {"index", "delta": {"role" in the
 * first, "content"}}, with "logprobs" and "finish_reason". The finish_reason of the final one: "stop"
 * at an end token or a stop string, else "length" (max_tokens, which the context bounds). */
static cJSON *choice_json(reply *p, int n, int final) {
  cJSON *o = cJSON_CreateObject(), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
  char id[40], *text;
  snprintf(id, sizeof id, "%s-%lld", p->chat ? "chatcmpl" : "cmpl", p->id);
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "object", !p->chat ? "text_completion" : p->c.stream ? "chat.completion.chunk" : "chat.completion");
  cJSON_AddNumberToObject(o, "created", (double)time(NULL));
  cJSON_AddStringToObject(o, "model", "moe");
  cJSON_AddItemToArray(ch, c);
  int echo = p->c.echo && !p->echoed; /* this choice begins with the prompt */
  char *ptext = echo ? prompt_text(p) : NULL;
  if (ptext) p->echo_len = strlen(ptext);
  cJSON *ids = echo ? cJSON_CreateIntArray(p->c.ids, p->c.n_ids) : cJSON_CreateArray(), *lp = logprobs_json(p, p->sent, n, echo);
  for (int i = p->sent; ids && i < n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(p->st.tokens[i]));
  if (!(text = new_text(p, n)) || !ids || (p->st.logprobs && !lp) || (echo && !(text = joined(ptext, !p->h->tok && *text ? " " : "", text))))
    return free(ptext), free(text), cJSON_Delete(ids), cJSON_Delete(lp), cJSON_Delete(o), NULL;
  free(ptext);
  p->echoed |= echo;
  cJSON_AddNumberToObject(c, "index", 0);
  if (p->chat) {
    cJSON *msg = cJSON_AddObjectToObject(c, p->c.stream ? "delta" : "message");
    if (!p->c.stream || !p->role_sent) cJSON_AddStringToObject(msg, "role", "assistant");
    p->role_sent = 1;
    cJSON_AddStringToObject(msg, "content", text);
    cJSON_Delete(ids);
  } else {
    cJSON_AddStringToObject(c, "text", text);
    cJSON_AddItemToObject(c, "token_ids", ids);
  }
  free(text);
  if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
  else cJSON_AddNullToObject(c, "logprobs");
  if (final) cJSON_AddStringToObject(c, "finish_reason", p->st.stop ? "stop" : "length");
  else cJSON_AddNullToObject(c, "finish_reason");
  return o;
}

/* A finished request's latencies into the metrics, once, before its last bytes go out (a client that
 * then reads /metrics finds them). */
static void record_latency(reply *p) {
  if (p->st.done <= 0 || p->timed) return;
  serve_metrics_latency(p->h->met, p->st.ttft_s, p->st.total_s);
  p->timed = 1;
}

/* The next event of a stream into p->pending: the new tokens, then the last with its finish_reason (no
 * tokens when the end of text came after the others), then [DONE]; 0 at the end. */
static int next_event(reply *p) {
  free(p->pending), p->pending = NULL, p->npending = p->at = 0;
  if (p->finished) return 0;
  moe_engine_wait(p->h->e, p->r, p->sent, &p->st);
  record_latency(p);
  int done = p->st.done, n = p->st.n;
  char *s = NULL;
  if (done < 0) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", p->st.error);
    cJSON_AddStringToObject(e, "type", "server_error");
    s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
  } else if (!p->last) {
    cJSON *o = choice_json(p, n, done > 0);
    s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    p->last = s && done > 0;
  } else p->finished = 1;
  p->finished |= done < 0;
  size_t k = s ? strlen(s) : 0;
  if (!s && !p->finished) return 0; /* out of memory: end the stream */
  p->pending = malloc(k + 32);
  if (!p->pending) return free(s), 0;
  p->npending = (size_t)sprintf(p->pending, "data: %s\n\n", s ? s : "[DONE]");
  free(s);
  return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  reply *p = cls;
  if (p->at == p->npending && !next_event(p)) return MHD_CONTENT_READER_END_OF_STREAM;
  size_t k = p->npending - p->at < max ? p->npending - p->at : max;
  memcpy(buf, p->pending + p->at, k);
  p->at += k;
  return (ssize_t)k;
}

/* The end of a response: the request released. */
static void reply_free(reply *p) {
  moe_engine_release(p->h->e, p->r);
  moe_request_free(&p->c);
  free(p->pending);
  free(p);
}

static void stream_free(void *cls) { reply_free(cls); } /* the stream ended, or the client left mid-stream */

static enum MHD_Result completion(struct MHD_Connection *c, serve_http *h, conn_req *q, int chat) {
  reply *p = calloc(1, sizeof *p);
  if (!p) return send_error(c, h, 503, "out of memory for the request");
  int context = h->o.context && h->o.context < h->m->max_seq ? h->o.context : h->m->max_seq;
  const char *body = q->body ? q->body : "";
  moe_status st = chat ? moe_request_parse_chat(body, q->n, h->tok, h->chat, context, &p->c)
                       : moe_request_parse_completion(body, q->n, h->tok, h->m->vocab, context, &p->c);
  if (st != MOE_OK) return free(p), send_error(c, h, 400, moe_last_error());
  p->chat = chat;
  moe_engine_params ep = {p->c.ids, p->c.n_ids, p->c.max_tokens, p->c.temperature, p->c.top_p, p->c.seed,
                          p->c.ignore_eos, (const char *const *)p->c.stop, p->c.n_stop, p->c.logprobs,
                          p->c.top_logprobs, p->c.echo && p->c.logprobs};
  p->h = h;
  p->id = atomic_fetch_add(&h->next_id, 1);
  if (moe_engine_submit(h->e, &ep, &p->r) != MOE_OK) {
    int draining = moe_engine_draining(h->e);
    enum MHD_Result ok = send_error(c, h, draining ? 503 : 500, draining ? "the server is shutting down" : moe_last_error());
    reply_free(p);
    return ok;
  }
  pthread_mutex_lock(&h->met->mu);
  h->met->requests[0]++;
  pthread_mutex_unlock(&h->met->mu);
  if (p->c.stream) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, p, stream_free);
    if (!resp) return reply_free(p), MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    serve_metrics_status(h->met, 200);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ok;
  }
  do moe_engine_wait(h->e, p->r, p->st.n, &p->st);
  while (!p->st.done);
  record_latency(p);
  enum MHD_Result ok;
  int n = p->st.n;
  if (p->st.done < 0) ok = send_error(c, h, 500, p->st.error);
  else {
    cJSON *o = choice_json(p, n, 1), *u = cJSON_CreateObject();
    if (o && u) {
      cJSON_AddNumberToObject(u, "prompt_tokens", p->c.n_ids);
      cJSON_AddNumberToObject(u, "completion_tokens", n);
      cJSON_AddNumberToObject(u, "total_tokens", p->c.n_ids + n);
      cJSON_AddItemToObject(o, "usage", u), u = NULL;
    }
    cJSON_Delete(u);
    ok = send_json(c, h, 200, o);
  }
  reply_free(p);
  return ok;
}

/* POST /tokenize: {"tokens", "count", "max_model_len"}; POST /detokenize: {"prompt"} (vLLM's shapes). */
static enum MHD_Result tokens(struct MHD_Connection *c, serve_http *h, conn_req *q, int tokenize) {
  moe_request r;
  const char *body = q->body ? q->body : "";
  moe_status st = tokenize ? moe_request_parse_tokenize(body, q->n, h->tok, &r) : moe_request_parse_detokenize(body, q->n, h->m->vocab, &r);
  if (st != MOE_OK) return send_error(c, h, 400, moe_last_error());
  cJSON *o = cJSON_CreateObject();
  if (tokenize) {
    cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(r.ids, r.n_ids));
    cJSON_AddNumberToObject(o, "count", r.n_ids);
    cJSON_AddNumberToObject(o, "max_model_len", h->m->max_seq);
  } else if (h->tok) { /* through the tokenizer's decoders (SentencePiece's "\u2581", byte fallback) */
    size_t len = 0;
    char *raw = NULL, *text = NULL;
    if (moe_tokenizer_decode_alloc(h->tok, r.ids, (size_t)r.n_ids, &raw, &len) == MOE_OK && (text = malloc(3 * len + 1))) {
      moe_utf8_clean(raw, len, text);
      cJSON_AddStringToObject(o, "prompt", text);
    }
    free(raw), free(text);
  } else {
    reply p = {.h = h, .st = {.n = r.n_ids, .tokens = r.ids}}; /* the ids, as a completion's text without a tokenizer */
    char *text = new_text(&p, r.n_ids);
    if (text) cJSON_AddStringToObject(o, "prompt", text);
    free(text);
  }
  moe_request_free(&r);
  return send_json(c, h, 200, o);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **con_cls) {
  (void)version;
  serve_http *h = cls;
  conn_req *q = *con_cls;
  if (!q) { /* the headers: the body comes in the next calls */
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (i && i->socket_context && strcmp(url, "/health"))
      return send_error(c, h, 503, "the server is full: too many connections; try again later");
    if (!(q = calloc(1, sizeof *q))) return MHD_NO;
    *con_cls = q;
    q->deadline = cli_now() + h->o.timeout_s;
    /* the drain waits for those it found, not for newcomers; nothing is counted while loading */
    q->counted = atomic_load(&h->ready) && !moe_engine_draining(h->e);
    pthread_mutex_lock(&h->mu);
    h->busy += q->counted;
    pthread_mutex_unlock(&h->mu);
    return MHD_YES;
  }
  if (*size) {
    double left = q->deadline - cli_now();
    if (left <= 0) return MHD_NO; /* a body trickling in: closed */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, left < 1 ? 1u : (unsigned)left);
    if (!q->too_big && q->n + *size <= MAX_BODY) {
      char *b = realloc(q->body, q->n + *size + 1);
      if (!b) return MHD_NO;
      memcpy(b + q->n, data, *size);
      q->body = b, q->n += *size;
    } else q->too_big = 1;
    *size = 0;
    return MHD_YES;
  }
  int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (!atomic_load(&h->ready)) {
    if (strcmp(url, "/health")) return send_error(c, h, 503, "the model is loading; GET /health says when it is ready");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "loading");
    return send_json(c, h, 503, o);
  }
  if (!strcmp(url, "/health")) {
    if (!get) return send_error(c, h, 405, "GET /health");
    int draining = moe_engine_draining(h->e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", draining ? "draining" : "ok");
    return send_json(c, h, draining ? 503 : 200, o);
  }
  if (!strcmp(url, "/metrics")) {
    if (!get) return send_error(c, h, 405, "GET /metrics");
    return send_text(c, h, 200, "text/plain; version=0.0.4", serve_metrics_text(h->met, h->e));
  }
  int chat = !strcmp(url, "/v1/chat/completions");
  if (chat || !strcmp(url, "/v1/completions")) {
    if (!post) return send_error(c, h, 405, chat ? "POST /v1/chat/completions" : "POST /v1/completions");
    if (q->too_big) return send_error(c, h, 413, "the body is larger than 1 MiB");
    return completion(c, h, q, chat);
  }
  int tokenize = !strcmp(url, "/tokenize");
  if (tokenize || !strcmp(url, "/detokenize")) {
    if (!post) return send_error(c, h, 405, tokenize ? "POST /tokenize" : "POST /detokenize");
    if (q->too_big) return send_error(c, h, 413, "the body is larger than 1 MiB");
    return tokens(c, h, q, tokenize);
  }
  if (!strcmp(url, "/v1/models")) {
    if (!get) return send_error(c, h, 405, "GET /v1/models");
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", "moe");
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "libmoe");
    return send_json(c, h, 200, o);
  }
  return send_error(c, h, 404, "no such endpoint: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                               "POST /tokenize, POST /detokenize, GET /health and GET /metrics are served");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
  (void)c, (void)why;
  serve_http *h = cls;
  conn_req *q = *con_cls;
  if (!q) return;
  int counted = q->counted;
  free(q->body);
  free(q);
  *con_cls = NULL;
  pthread_mutex_lock(&h->mu);
  if (counted && !--h->busy) pthread_cond_broadcast(&h->idle);
  pthread_mutex_unlock(&h->mu);
}

/* A connection past the limit is marked (its socket context non-NULL) and closed after a second idle. */
static void connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
  serve_http *h = cls;
  pthread_mutex_lock(&h->mu);
  h->open += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
  int over = code == MHD_CONNECTION_NOTIFY_STARTED && h->open > h->o.max_connections;
  pthread_mutex_unlock(&h->mu);
  if (!over) return;
  *socket_context = h;
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
}

int serve_http_start(serve_http **out, const char *host, int port, serve_metrics *met, const serve_http_opts *o,
                     int *bound) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return cli_usage_error("serve", "--host: '%s' is not an IPv4 address", host);
  serve_http *h = calloc(1, sizeof *h);
  if (!h) return cli_usage_error("serve", "out of memory");
  h->met = met, h->o = *o, h->created = time(NULL);
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->idle, NULL);
  /* a thread per connection, polled with poll(): more than FD_SETSIZE connections at once */
  h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0,
                          NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_NOTIFY_CONNECTION, connection, h,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections + RESERVE,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s,
                          MHD_OPTION_THREAD_STACK_SIZE, (size_t)256 << 10, MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
                          MHD_OPTION_END);
  if (!h->d) {
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
    free(h);
    return cli_usage_error("serve", "cannot listen on %s:%d (in use, or not an address of this machine)", host, port);
  }
  const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  *bound = i ? i->port : port;
  *out = h;
  return 0;
}

void serve_http_ready(serve_http *h, moe_engine *e, const moe_lm_config *m, const moe_tokenizer *tok,
                      const moe_chat_template *chat) {
  h->e = e, h->m = m, h->tok = tok, h->chat = chat;
  atomic_store(&h->ready, 1);
}

void serve_http_stop(serve_http *h) {
  pthread_mutex_lock(&h->mu);
  while (h->busy) pthread_cond_wait(&h->idle, &h->mu);
  pthread_mutex_unlock(&h->mu);
  MHD_stop_daemon(h->d);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->idle);
  free(h);
}
