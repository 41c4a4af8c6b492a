/* libFuzzer target: moe serve's request bodies (moe_request_parse_completion, and by the same bytes
 * moe_request_parse_chat over a fixed chat template, moe_request_parse_tokenize and moe_request_parse_detokenize) with a
 * tokenizer trained on a fixed text, and the UTF-8 cleaning of its bytes. A body that parses must respect
 * the limits it was given; the cleaned text must be well-formed UTF-8 whatever the split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/utf8.h"
#include "moe.h"


static moe_tokenizer *tok(void) {
  static moe_tokenizer *t;
  static const char text[] = "the cat sat on the mat. experts route every token. caf\xc3\xa9";
  if (!t && moe_tokenizer_train(&t, text, sizeof text - 1, 280) != MOE_OK) abort();
  return t;
}

/* A tokenizer_config.json with a chat template, written once. */
static const moe_chat_template *chat_template(void) {
  static moe_chat_template *t;
  if (t) return t;
  char path[64];
  snprintf(path, sizeof path, "/tmp/fuzz_completion_%d.json", (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f || fputs("{\"chat_template\": \"{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant:{% endif %}\"}", f) < 0 || fclose(f) ||
      moe_chat_template_load(&t, path))
    abort();
  remove(path);
  return t;
}

/* The other bodies: what parses is within its limits. */
static void other_bodies(const char *b, size_t n, int vocab) {
  moe_request c;
  if (moe_request_parse_chat(b, n, tok(), chat_template(), 64, &c) == MOE_OK) {
    if (c.n_ids < 1 || c.max_tokens < 1 || c.n_ids + c.max_tokens > 64) abort();
    moe_request_free(&c);
  }
  if (moe_request_parse_tokenize(b, n, tok(), &c) == MOE_OK) {
    for (int i = 0; i < c.n_ids; i++)
      if (c.ids[i] < 0 || c.ids[i] >= vocab) abort();
    moe_request_free(&c);
  }
  if (moe_request_parse_detokenize(b, n, vocab, &c) == MOE_OK) {
    for (int i = 0; i < c.n_ids; i++)
      if (c.ids[i] < 0 || c.ids[i] >= vocab) abort();
    moe_request_free(&c);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  moe_request c;
  int vocab = moe_tokenizer_vocab_size(tok());
  other_bodies((const char *)data, n, vocab);
  if (moe_request_parse_completion((const char *)data, n, tok(), vocab, 64, &c) == MOE_OK) {
    if (c.n_ids < 1 || c.max_tokens < !c.echo || c.n_ids + c.max_tokens > 64 || !(c.top_p > 0 && c.top_p <= 1) ||
        !(c.temperature >= 0))
      abort();
    for (int i = 0; i < c.n_ids; i++)
      if (c.ids[i] < 0 || c.ids[i] >= vocab) abort();
    if (c.n_stop < 0 || c.n_stop > MOE_REQUEST_STOPS) abort();
    for (int i = 0; i < c.n_stop; i++)
      if (!c.stop[i][0] || strlen(c.stop[i]) > MOE_REQUEST_STOP_BYTES) abort();
    moe_request_free(&c);
  }
  /* the bytes as generated text in two pieces, split at the first byte's value */
  char *out = malloc(3 * n + 1);
  size_t used, cut = n ? data[0] % (n + 1) : 0, w = moe__utf8_clean((const char *)data, cut, 0, out, &used);
  size_t rest;
  w += moe__utf8_clean((const char *)data + used, n - used, 1, out + w, &rest);
  if (used + rest != n || used > cut || cut - used > 3) abort();
  size_t again, w2;
  char *twice = malloc(3 * w + 1);
  w2 = moe__utf8_clean(out, w, 1, twice, &again); /* well-formed: unchanged */
  if (w2 != w || memcmp(twice, out, w)) abort();
  free(twice);
  free(out);
  return 0;
}
