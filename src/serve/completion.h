/* moe serve's request body and text (DESIGN 4.7): the parser of POST /v1/completions, apart from the
 * HTTP server so that it can be fuzzed (fuzz/fuzz_completion.c), and the UTF-8 cleaning of generated
 * bytes for JSON. */
#ifndef MOE_SERVE_COMPLETION_H
#define MOE_SERVE_COMPLETION_H

#include <stddef.h>
#include <stdint.h>

#include "base/utf8.h" /* moe__utf8_clean, which the server writes text with */
#include "moe.h"

#define MOE_COMPLETION_STOPS 4        /* stop strings at most, as OpenAI */
#define MOE_COMPLETION_STOP_BYTES 256 /* bytes of a stop string at most */

typedef struct {
  int32_t *ids;      /* the prompt's token ids (malloc'd; free with moe__completion_free) */
  int n_ids;
  int max_tokens;    /* >= 1 (0 with echo); when absent 16 as OpenAI, or fewer to fit the context */
  float temperature; /* >= 0, 1 when absent; 0 is greedy */
  float top_p;       /* (0, 1], 1 when absent */
  uint64_t seed;     /* 0 when absent (moe generate's default) */
  int stream;        /* server-sent events */
  int ignore_eos;    /* go on past the end-of-text token */
  int echo;          /* completions: the prompt's text (and with logprobs its tokens') before the answer */
  int logprobs;      /* each token's log-probability, and those of the top_logprobs most probable */
  int top_logprobs;
  char *stop[MOE_COMPLETION_STOPS]; /* the text ends before the first of these found (malloc'd) */
  int n_stop;
} moe__completion;

/* Parses the n bytes of body (none may be a \u0000 escape: cJSON's strings end at the NUL): a JSON
 * object with "prompt" (a string, through tok, or an array of token
 * ids in [0, vocab); tok NULL refuses strings), and optional "max_tokens", "temperature", "top_p",
 * "seed" (integers >= 0 for the integers), "stream", "ignore_eos" and "echo" (booleans; echo lets
 * max_tokens be 0), "logprobs" (null, or the alternatives per token in [0, 5]), "stop" (a string or up
 * to 4 in an array, each 1 to 256 bytes; it needs tok); "model" and "user" (strings) have no effect.
 * OpenAI's fields the server does not implement are taken only with the value that turns them off or
 * null ("n" 1, "best_of" 1, "logit_bias" {}, the penalties 0, "suffix" null); any other value, and any other field, is refused by name.
 * The prompt and max_tokens must fit the context of max_seq positions. MOE_ERR_FORMAT (not JSON, not
 * an object) or MOE_ERR_VALUE (a field missing, of the wrong type or out of range), naming the field
 * and its value. */
moe_status moe__completion_parse(const char *body, size_t n, const moe_tokenizer *tok, int vocab, int max_seq,
                                 moe__completion *out);
/* POST /v1/chat/completions' body: "messages" (a non-empty list of {"role": system|developer|user|
 * assistant|tool, "content": a string, a list of parts, or null for an assistant's}) rendered by the chat
 * template of chat_template (a tokenizer_config.json or its directory, moe_chat_template_render_config,
 * with the generation prompt) and encoded with the template's special tokens as tokens; then
 * "max_tokens" (or "max_completion_tokens"), "temperature", "top_p", "seed", "stream", "ignore_eos" and
 * "stop" as for completions, "logprobs" (a boolean) with "top_logprobs" (0 to 20), OpenAI's other fields as
 * there. Errors as
 * moe__completion_parse's, and the template's. */
moe_status moe__chat_parse(const char *body, size_t n, const moe_tokenizer *tok, const char *chat_template, int max_seq,
                           moe__completion *out);
/* POST /tokenize's body {"prompt": text, "add_special_tokens": bool} (vLLM's): its ids (special tokens
 * written in the text as theirs; BOS/EOS with add_special_tokens) into c->ids; POST /detokenize's
 * {"tokens": [ids]}: the ids, each in [0, vocab). "model" is taken; other fields are refused by name. */
moe_status moe__tokenize_parse(const char *body, size_t n, const moe_tokenizer *tok, moe__completion *out);
moe_status moe__detokenize_parse(const char *body, size_t n, int vocab, moe__completion *out);
void moe__completion_free(moe__completion *c);

#endif
