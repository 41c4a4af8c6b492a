/* The request bodies of POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize (moe_request_*). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "formats/json.h"

/* The field's number when it is one, integral when `integer`, in [lo, hi]; *v unchanged when absent. */
static moe_status number(const cJSON *o, const char *name, int integer, double lo, double hi, double *v) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
  if (!f || cJSON_IsNull(f)) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(f), MOE_ERR_VALUE, "\"%s\" must be a number", name);
  double x = f->valuedouble;
  MOE_TRY(!integer || x == floor(x), MOE_ERR_VALUE, "\"%s\" must be an integer, got %g", name, x);
  MOE_TRY(x >= lo && x <= hi, MOE_ERR_VALUE, "\"%s\" must be in [%g, %g], got %g", name, lo, hi, x);
  *v = x;
  return MOE_OK;
}

/* A boolean field into *v: 1 when true. */
static moe_status flag(const cJSON *o, const char *name, int *v) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
  MOE_TRY(!f || cJSON_IsNull(f) || cJSON_IsBool(f), MOE_ERR_VALUE, "\"%s\" must be true or false", name);
  *v = cJSON_IsTrue(f);
  return MOE_OK;
}

/* "stop": a string or an array of them (null or [] for none), each copied into c. */
static moe_status stops(const cJSON *f, const moe_tokenizer *tok, moe_request *c) {
  if (!f || cJSON_IsNull(f)) return MOE_OK;
  int n = cJSON_IsString(f) ? 1 : cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
  MOE_TRY(n >= 0 && n <= MOE_REQUEST_STOPS, MOE_ERR_VALUE, "\"stop\" must be a string or an array of at most %d",
          MOE_REQUEST_STOPS);
  MOE_TRY(!n || tok, MOE_ERR_VALUE, "\"stop\": this checkpoint has no tokenizer.json to make text of the tokens");
  for (const cJSON *s = cJSON_IsString(f) ? f : f->child; c->n_stop < n; s = s->next) {
    size_t len = cJSON_IsString(s) ? strlen(s->valuestring) : 0;
    MOE_TRY(len >= 1 && len <= MOE_REQUEST_STOP_BYTES, MOE_ERR_VALUE, "\"stop\"[%d] must be a string of 1 to %d bytes",
            c->n_stop, MOE_REQUEST_STOP_BYTES);
    c->stop[c->n_stop] = malloc(len + 1);
    MOE_TRY(c->stop[c->n_stop], MOE_ERR_NOMEM, "\"stop\": out of memory");
    memcpy(c->stop[c->n_stop++], s->valuestring, len + 1);
  }
  return MOE_OK;
}

/* The ids of len bytes of text (special: added tokens' strings as their ids, as a chat template's); a
 * tokenizer may give more ids than bytes (byte fallback, a prepended "▁"). */
static moe_status encode(const char *text, size_t len, const moe_tokenizer *tok, int special, moe_request *c) {
  size_t k = 0;
  MOE_CHECK(moe_tokenizer_encode_alloc(tok, text, len, special, &c->ids, &k));
  MOE_TRY(k <= INT32_MAX, MOE_ERR_VALUE, "\"prompt\" is too long");
  c->n_ids = (int)k;
  return MOE_OK;
}

/* The prompt's ids: a string through the tokenizer, or an array of ids. */
static moe_status prompt(const cJSON *p, const moe_tokenizer *tok, int vocab, moe_request *c) {
  MOE_TRY(p, MOE_ERR_VALUE, "\"prompt\" is required");
  if (cJSON_IsString(p)) {
    MOE_TRY(tok, MOE_ERR_VALUE, "\"prompt\": this checkpoint has no tokenizer.json; send token ids ([1, 2, 3])");
    size_t len = strlen(p->valuestring);
    MOE_TRY(len, MOE_ERR_VALUE, "\"prompt\" is empty");
    return encode(p->valuestring, len, tok, 0, c);
  }
  MOE_TRY(cJSON_IsArray(p), MOE_ERR_VALUE, "\"prompt\" must be a string or an array of token ids");
  int n = cJSON_GetArraySize(p);
  MOE_TRY(n > 0, MOE_ERR_VALUE, "\"prompt\" is empty");
  c->ids = malloc((size_t)n * sizeof *c->ids);
  MOE_TRY(c->ids, MOE_ERR_NOMEM, "\"prompt\": out of memory for %d ids", n);
  const cJSON *e;
  cJSON_ArrayForEach(e, p) {
    double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
    MOE_TRY(v >= 0 && v < vocab && v == floor(v), MOE_ERR_VALUE,
            "\"prompt\"[%d] is not a token id in [0, %d)", c->n_ids, vocab);
    c->ids[c->n_ids++] = (int32_t)v;
  }
  return MOE_OK;
}

/* OpenAI's completion fields this server does not implement, with the value that turns each off (null
 * too): taken so that a client sending its defaults is served, refused otherwise, as its output would
 * not be what the field asks for. */
static const struct {
  const char *name, *off;
  int type; /* cJSON's of off */
} UNSERVED[] = {
    {"n", "1", cJSON_Number},        {"best_of", "1", cJSON_Number},
    {"suffix", "null", cJSON_NULL},    {"logit_bias", "{}", cJSON_Object},
    {"presence_penalty", "0", cJSON_Number}, {"frequency_penalty", "0", cJSON_Number},
};
/* The fields each endpoint serves (checked as they are read), NULL-terminated, and their list for messages. */
static const char *const SERVED[] = {"prompt", "max_tokens", "temperature", "top_p", "seed", "stream", "ignore_eos",
                                     "stop", "logprobs", "echo", NULL};
static const char *const CHAT_SERVED[] = {"messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                                          "seed", "stream", "ignore_eos", "stop", "logprobs", "top_logprobs", NULL};

static int listed(const char *const *names, const char *s) {
  while (*names && strcmp(*names, s)) names++;
  return *names != NULL;
}

/* Every field is served, or one of UNSERVED turned off; "model" and "user" are strings. */
static moe_status fields(const cJSON *o, const char *const *served) {
  const cJSON *f;
  cJSON_ArrayForEach(f, o) {
    size_t k = 0;
    if (listed(served, f->string)) continue; /* checked as it is read */
    if (!strcmp(f->string, "model") || !strcmp(f->string, "user")) { /* one model; no effect on the output */
      MOE_TRY(cJSON_IsString(f) || cJSON_IsNull(f), MOE_ERR_VALUE, "\"%s\" must be a string", f->string);
      continue;
    }
    while (k < sizeof UNSERVED / sizeof *UNSERVED && strcmp(f->string, UNSERVED[k].name)) k++;
    if (k == sizeof UNSERVED / sizeof *UNSERVED) {
      char list[256] = "";
      for (const char *const *n = served; *n; n++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", n == served ? "" : ", ", *n);
      return moe__error(MOE_ERR_VALUE, __FILE__, __LINE__,
                        "unknown field \"%.60s\" (served: %s; model and user are taken and have no effect)", f->string, list);
    }
    int t = UNSERVED[k].type, off = cJSON_IsNull(f) || ((f->type & 0xFF) == t && (t != cJSON_Number ||
              f->valuedouble == strtod(UNSERVED[k].off, NULL)) && (t != cJSON_Object || !f->child));
    if (off) continue;
    char *v = cJSON_PrintUnformatted(f);
    moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "\"%s\" %.60s is not implemented by this server (only %s)",
               f->string, v ? v : "", UNSERVED[k].off);
    free(v);
    return MOE_ERR_VALUE;
  }
  return MOE_OK;
}

/* The sampling fields, once the prompt's ids are in c; chat takes max_completion_tokens too. */
static moe_status sampling(const cJSON *o, const moe_tokenizer *tok, int max_seq, int chat, moe_request *c) {
  double left = max_seq - c->n_ids, mt = left < 16 && left >= 1 ? left : 16, temp = 1, top_p = 1, seed = 0;
  if (!chat) MOE_CHECK(flag(o, "echo", &c->echo));
  MOE_CHECK(number(o, "max_tokens", 1, !c->echo, max_seq, &mt)); /* 0 with echo: the prompt scored */
  if (chat) MOE_CHECK(number(o, "max_completion_tokens", 1, 1, max_seq, &mt));
  MOE_CHECK(number(o, "temperature", 0, 0, 100, &temp));
  MOE_CHECK(number(o, "top_p", 0, 0, 1, &top_p));
  /* the engine samples with the float: 5e-324 is 0 there */
  MOE_TRY((float)top_p > 0, MOE_ERR_VALUE, "\"top_p\" must be in (0, 1] as a float (>= 1.4e-45), got %g", top_p);
  MOE_CHECK(number(o, "seed", 1, 0, 9007199254740992.0, &seed)); /* 2^53: exact in a double */
  MOE_CHECK(flag(o, "stream", &c->stream));
  MOE_CHECK(flag(o, "ignore_eos", &c->ignore_eos));
  MOE_CHECK(stops(cJSON_GetObjectItemCaseSensitive(o, "stop"), tok, c));
  double top = -1; /* completions: "logprobs" is the alternatives' count; chat: a flag, and "top_logprobs" */
  if (chat) {
    MOE_CHECK(flag(o, "logprobs", &c->logprobs));
    MOE_CHECK(number(o, "top_logprobs", 1, 0, MOE_ENGINE_TOP_LOGPROBS, &top));
    MOE_TRY(c->logprobs || top < 0, MOE_ERR_VALUE, "\"top_logprobs\" needs \"logprobs\": true");
  } else {
    MOE_CHECK(number(o, "logprobs", 1, 0, 5, &top));
    c->logprobs = top >= 0;
  }
  c->top_logprobs = top > 0 ? (int)top : 0;
  c->max_tokens = (int)mt, c->temperature = (float)temp, c->top_p = (float)top_p, c->seed = (uint64_t)seed;
  MOE_TRY(c->n_ids + (int64_t)c->max_tokens <= max_seq, MOE_ERR_VALUE,
          "the prompt (%d tokens) and \"max_tokens\" %d exceed the model's context of %d", c->n_ids, c->max_tokens,
          max_seq);
  return MOE_OK;
}

static moe_status parse(const cJSON *o, const moe_tokenizer *tok, int vocab, int max_seq, moe_request *c) {
  MOE_TRY(cJSON_IsObject(o), MOE_ERR_FORMAT, "the body must be a JSON object");
  MOE_CHECK(fields(o, SERVED));
  MOE_CHECK(prompt(cJSON_GetObjectItemCaseSensitive(o, "prompt"), tok, vocab, c));
  return sampling(o, tok, max_seq, 0, c);
}

/* "messages": a non-empty list of {"role", "content", ...} with a known role and content a string, a
 * list of parts, or null (an assistant's with tool calls), as the template takes them. */
static moe_status messages(const cJSON *m) {
  static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
  MOE_TRY(cJSON_IsArray(m) && cJSON_GetArraySize(m) > 0, MOE_ERR_VALUE, "\"messages\" must be a non-empty list");
  int i = 0;
  for (const cJSON *e = m->child; e; e = e->next, i++) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *content = cJSON_GetObjectItemCaseSensitive(e, "content");
    MOE_TRY(cJSON_IsObject(e) && cJSON_IsString(role), MOE_ERR_VALUE, "\"messages\"[%d] must be an object with a \"role\"", i);
    MOE_TRY(listed(roles, role->valuestring), MOE_ERR_VALUE,
            "\"messages\"[%d]: role \"%.40s\" (want system, developer, user, assistant or tool)", i, role->valuestring);
    MOE_TRY(cJSON_IsString(content) || cJSON_IsArray(content) || (cJSON_IsNull(content) && !strcmp(role->valuestring, "assistant")),
            MOE_ERR_VALUE, "\"messages\"[%d]: \"content\" must be a string or a list of parts", i);
  }
  return MOE_OK;
}

static moe_status parse_chat(const cJSON *o, const moe_tokenizer *tok, const moe_chat_template *chat_template, int max_seq,
                             moe_request *c, char **text) {
  MOE_TRY(cJSON_IsObject(o), MOE_ERR_FORMAT, "the body must be a JSON object");
  MOE_CHECK(fields(o, CHAT_SERVED));
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
  MOE_CHECK(messages(m));
  MOE_TRY(tok && chat_template, MOE_ERR_VALUE, "chat: this checkpoint has no %s",
          tok ? "tokenizer_config.json with a chat_template" : "tokenizer.json");
  char *conv = cJSON_PrintUnformatted(m);
  MOE_TRY(conv, MOE_ERR_NOMEM, "chat: out of memory for the messages");
  size_t len = 0;
  moe_status st = moe_chat_template_apply(chat_template, conv, 1, -1, text, &len);
  free(conv);
  MOE_CHECK(st);
  MOE_TRY(len, MOE_ERR_VALUE, "chat: the chat template rendered the messages as no text");
  MOE_CHECK(encode(*text, len, tok, 1, c)); /* the template's special tokens are tokens, as transformers does */
  return sampling(o, tok, max_seq, 1, c);
}

/* The offset of the first \u0000 escape in the n bytes of a JSON text, or -1: cJSON ends its strings at
 * the NUL, so a prompt with one would be cut there. Backslashes appear only in strings' escapes. */
static long nul_escape(const char *s, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if (s[i] == '\\') {
      if (s[i + 1] == 'u' && i + 6 <= n && !memcmp(s + i + 2, "0000", 4)) return (long)i;
      i++; /* the escaped character */
    }
  return -1;
}

/* The body as JSON (c cleared): refused with a \u0000 escape. */
static moe_status body_json(const char *body, size_t n, moe_request *c, cJSON **o) {
  memset(c, 0, sizeof *c);
  long nul = nul_escape(body, n);
  MOE_TRY(nul < 0, MOE_ERR_VALUE, "the body has \\u0000 at byte %ld: strings with NUL characters are refused", nul);
  return moe__json_parse("request", "body", body, n, o);
}

moe_status moe_request_parse_completion(const char *body, size_t n, const moe_tokenizer *tok, int vocab, int max_seq,
                                 moe_request *c) {
  cJSON *o;
  MOE_CHECK(body_json(body, n, c, &o));
  moe_status st = parse(o, tok, vocab, max_seq, c);
  cJSON_Delete(o);
  if (st != MOE_OK) moe_request_free(c);
  return st;
}

moe_status moe_request_parse_chat(const char *body, size_t n, const moe_tokenizer *tok,
                                  const moe_chat_template *chat_template, int max_seq, moe_request *c) {
  cJSON *o;
  MOE_CHECK(body_json(body, n, c, &o));
  char *text = NULL;
  moe_status st = parse_chat(o, tok, chat_template, max_seq, c, &text);
  free(text);
  cJSON_Delete(o);
  if (st != MOE_OK) moe_request_free(c);
  return st;
}

/* Every field of o is one of names (NULL-terminated); "model" a string. */
static moe_status only(const cJSON *o, const char *const *names) {
  MOE_TRY(cJSON_IsObject(o), MOE_ERR_FORMAT, "the body must be a JSON object");
  for (const cJSON *f = o->child; f; f = f->next) {
    if (!strcmp(f->string, "model")) {
      MOE_TRY(cJSON_IsString(f) || cJSON_IsNull(f), MOE_ERR_VALUE, "\"model\" must be a string");
      continue;
    }
    MOE_TRY(listed(names, f->string), MOE_ERR_VALUE, "unknown field \"%.60s\"", f->string);
  }
  return MOE_OK;
}

moe_status moe_request_parse_tokenize(const char *body, size_t n, const moe_tokenizer *tok, moe_request *c) {
  static const char *const names[] = {"prompt", "add_special_tokens", NULL};
  cJSON *o;
  MOE_CHECK(body_json(body, n, c, &o));
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
  int add = 0;
  size_t k = 0;
  moe_status st = only(o, names);
  if (!st) st = flag(o, "add_special_tokens", &add);
  if (!st && !tok) st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "/tokenize: this checkpoint has no tokenizer.json");
  if (!st && !cJSON_IsString(p)) st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "\"prompt\" must be a string");
  if (!st) /* special tokens written in the text are theirs, as the chat template's are */
    st = moe_tokenizer_encode_alloc(tok, p->valuestring, strlen(p->valuestring),
                                    MOE_TOKENIZER_SPECIAL | (add ? MOE_TOKENIZER_ADD_SPECIAL : 0), &c->ids, &k);
  if (!st && k > INT32_MAX) st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "\"prompt\" is too long");
  c->n_ids = (int)k;
  cJSON_Delete(o);
  if (st != MOE_OK) moe_request_free(c);
  return st;
}

moe_status moe_request_parse_detokenize(const char *body, size_t n, int vocab, moe_request *c) {
  static const char *const names[] = {"tokens", NULL};
  cJSON *o;
  MOE_CHECK(body_json(body, n, c, &o));
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens");
  moe_status st = only(o, names);
  if (!st && !cJSON_IsArray(t)) st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "\"tokens\" must be a list of token ids");
  int m = st ? 0 : cJSON_GetArraySize(t);
  if (!st && !(c->ids = malloc(((size_t)m + 1) * sizeof *c->ids))) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory");
  for (const cJSON *e = st ? NULL : t->child; e; e = e->next) {
    double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
    if (!(v >= 0 && v < vocab && v == floor(v))) {
      st = moe__error(MOE_ERR_VALUE, __FILE__, __LINE__, "\"tokens\"[%d] is not a token id in [0, %d)", c->n_ids, vocab);
      break;
    }
    c->ids[c->n_ids++] = (int32_t)v;
  }
  cJSON_Delete(o);
  if (st != MOE_OK) moe_request_free(c);
  return st;
}

void moe_request_free(moe_request *c) {
  free(c->ids);
  c->ids = NULL;
  c->n_ids = 0;
  for (; c->n_stop; c->n_stop--) free(c->stop[c->n_stop - 1]);
}

