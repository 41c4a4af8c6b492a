/* The steps of Hugging Face tokenizer.json files that the real models' files (test_tokenizer_models.c)
 * do not use, on small hand-made files, against the examples of the tokenizers library's own
 * documentation and tests (Split's five behaviors on "the-final--countdown", Metaspace on
 * "Hey   friend!", Digits and Punctuation) or values worked out by hand from its rules: normalizers,
 * added tokens' lstrip/rstrip/single_word, byte fallback, unknown tokens, the post-processor and the
 * decoders of SentencePiece-style files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lm/tokenizer.h"
#include "run_cli.h"
#include "test.h"

/* Loads a tokenizer.json given as text; NULL (and a message) when it does not load. */
static moe_tokenizer *load_text(const char *name, const char *json) {
  char path[512];
  test_tmp_path(name, path, sizeof path);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  fputs(json, f);
  fclose(f);
  moe_tokenizer *t = NULL;
  if (moe_tokenizer_load(&t, path) != MOE_OK) fprintf(stderr, "  %s: %s\n", name, moe_last_error());
  return t;
}

/* A file of vocabulary {"a": 0} (string mode) with the given normalizer and pre_tokenizer. */
static moe_tokenizer *with_steps(const char *normalizer, const char *pre_tokenizer) {
  char json[2048];
  snprintf(json, sizeof json,
           "{\"normalizer\": %s, \"pre_tokenizer\": %s, \"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", "
           "\"vocab\": {\"a\": 0}, \"merges\": []}}", normalizer, pre_tokenizer);
  return load_text("steps.json", json);
}

/* The pieces of text joined by '|' must be want; 1 when they are. */
static int pieces_are(const moe_tokenizer *t, const char *text, int at_start, const char *want) {
  moe__tok_scratch *sc = moe__tok_scratch_new();
  const char *buf;
  const size_t(*p)[2];
  size_t n = 0;
  char got[1024] = "";
  int ok = sc && moe__tok_pretokenize(t, sc, text, strlen(text), at_start, &buf, &p, &n) == MOE_OK;
  for (size_t i = 0, w = 0; ok && i < n && w < sizeof got - 64; i++)
    w += (size_t)snprintf(got + w, sizeof got - w, "%s%.*s", i ? "|" : "", (int)(p[i][1] - p[i][0]), buf + p[i][0]);
  moe__tok_scratch_free(sc);
  if (ok && !strcmp(got, want)) return 1;
  fprintf(stderr, "  \"%s\": pieces \"%s\", want \"%s\" (%s)\n", text, got, want, ok ? "" : moe_last_error());
  return 0;
}

TEST(tokenizer_steps_split_behaviors) {
  /* The tokenizers library's SplitDelimiterBehavior documentation, splitting on '-'. */
  static const char *KEEP[][2] = {
      {"Removed", "the|final|countdown"},
      {"Isolated", "the|-|final|-|-|countdown"},
      {"MergedWithPrevious", "the-|final-|-|countdown"},
      {"MergedWithNext", "the|-final|-|-countdown"},
      {"Contiguous", "the|-|final|--|countdown"},
  };
  int bad = 0;
  for (int i = 0; i < 5; i++) {
    char pre[256];
    snprintf(pre, sizeof pre, "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\"}", KEEP[i][0]);
    moe_tokenizer *t = with_steps("null", pre);
    bad += !t || !pieces_are(t, "the-final--countdown", 1, KEEP[i][1]);
    moe_tokenizer_free(t);
  }
  /* invert: the matches are the pieces kept apart; Removed keeps only them. */
  moe_tokenizer *t = with_steps("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Removed\", "
                                        "\"invert\": true}");
  bad += !t || !pieces_are(t, "Hey, friend!", 1, "Hey|friend");
  moe_tokenizer_free(t);
  ASSERT_EQ_INT(bad, 0);
}

TEST(tokenizer_steps_metaspace_digits_punctuation) {
  int bad = 0;
  /* The library's Metaspace tests: runs of spaces each become a "▁" piece, the last one joining the word. */
  moe_tokenizer *t = with_steps("null", "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\"}");
  bad += !t || !pieces_are(t, "Hey   friend!", 1, "\xe2\x96\x81Hey|\xe2\x96\x81|\xe2\x96\x81|\xe2\x96\x81" "friend!");
  moe_tokenizer_free(t);
  /* prepend_scheme "first": only a stretch that begins the text gets the "▁"; split false: one piece. */
  t = with_steps("null", "{\"type\": \"Metaspace\", \"prepend_scheme\": \"first\", \"split\": false}");
  bad += !t || !pieces_are(t, "a b", 1, "\xe2\x96\x81" "a\xe2\x96\x81" "b");
  bad += !t || !pieces_are(t, "a b", 0, "a\xe2\x96\x81" "b");
  moe_tokenizer_free(t);
  t = with_steps("null", "{\"type\": \"Digits\", \"individual_digits\": true}");
  bad += !t || !pieces_are(t, "Hey 123 friend!", 1, "Hey |1|2|3| friend!");
  moe_tokenizer_free(t);
  t = with_steps("null", "{\"type\": \"Digits\", \"individual_digits\": false}");
  bad += !t || !pieces_are(t, "Hey 123 friend!", 1, "Hey |123| friend!");
  moe_tokenizer_free(t);
  t = with_steps("null", "{\"type\": \"Punctuation\"}");
  bad += !t || !pieces_are(t, "Hey friend!     How are you?!?", 1, "Hey friend|!|     How are you|?|!|?");
  moe_tokenizer_free(t);
  /* ByteLevel with add_prefix_space and GPT-2's regex. */
  t = with_steps("null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": \"ByteLevel\", "
                         "\"add_prefix_space\": true}]}");
  moe_tokenizer_free(t); /* a vocabulary of strings with ByteLevel is refused: not every byte has a token */
  ASSERT(!t);
  ASSERT_EQ_INT(bad, 0);
}

TEST(tokenizer_steps_normalizers) {
  int bad = 0;
  /* NFKC folds the ligature and the full-width letters; Lowercase; Strip both sides; Prepend; Replace. */
  moe_tokenizer *t = with_steps("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"}, "
                                "{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}, {\"type\": \"Prepend\", "
                                "\"prepend\": \"_\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"~\"}]}",
                                "null");
  bad += !t || !pieces_are(t, "  \xef\xac\x81 \xef\xbc\xa1\xc3\x89 \xce\xa3 ", 1, "_fi~a\xc3\xa9~\xcf\x83");
  bad += !t || !pieces_are(t, "", 1, ""); /* Prepend leaves empty text empty */
  moe_tokenizer_free(t);
  /* NFC composes e + U+0301; NFD takes it apart; invalid UTF-8 passes through. */
  t = with_steps("{\"type\": \"NFC\"}", "null");
  bad += !t || !pieces_are(t, "e\xcc\x81\xff", 1, "\xc3\xa9\xff");
  moe_tokenizer_free(t);
  t = with_steps("{\"type\": \"NFD\"}", "null");
  bad += !t || !pieces_are(t, "\xc3\xa9", 1, "e\xcc\x81");
  moe_tokenizer_free(t);
  /* A Replace with a regex. */
  t = with_steps("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"}", "null");
  bad += !t || !pieces_are(t, "a \t\n b", 1, "a b");
  moe_tokenizer_free(t);
  ASSERT_EQ_INT(bad, 0);
}

/* Encodes text (flags) and compares with want (n ids); 1 when equal. */
static int ids_are(const moe_tokenizer *t, const char *text, int flags, const int32_t *want, size_t n) {
  int32_t *ids = NULL;
  size_t k = 0;
  int ok = moe_tokenizer_encode_alloc(t, text, strlen(text), flags, &ids, &k) == MOE_OK && k == n &&
           !memcmp(ids, want, n * sizeof *ids);
  if (!ok) {
    fprintf(stderr, "  \"%s\" (flags %d): %zu ids (%s):", text, flags, k, moe_last_error());
    for (size_t i = 0; i < k; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "; want %zu:", n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
    fprintf(stderr, "\n");
  }
  free(ids);
  return ok;
}

#define IDS(t, text, flags, ...) ids_are(t, text, flags, (int32_t[]){__VA_ARGS__}, sizeof((int32_t[]){__VA_ARGS__}) / 4)

/* A SentencePiece-style file (as Llama 2's): Prepend "▁" and spaces to "▁", byte fallback, <unk>. */
static const char SPM[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\", "
    "\"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}, {\"id\": 11, \"content\": \"<mask>\", "
    "\"lstrip\": true, \"rstrip\": true, \"special\": false}, {\"id\": 12, \"content\": \"ab\", \"single_word\": true, "
    "\"special\": false}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"},"
    " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}]}, \"pre_tokenizer\": null,"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1]}, \"</s>\": {\"id\": \"</s>\", \"ids\": [2]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xe2\x96\x81\"},"
    " \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \","
    " \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"byte_fallback\": %s, \"vocab\": {\"<unk>\": 0,"
    " \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"\xe2\x96\x81\": 5, \"a\": 6, \"b\": 7, \"\xe2\x96\x81" "a\": 8,"
    " \"\xe2\x96\x81" "ab\": 9, \"<0x0A>\": 10, \"<mask>\": 11, \"ab\": 12},"
    " \"merges\": [\"\xe2\x96\x81 a\", \"\xe2\x96\x81" "a b\", \"a b\"]}}";

static moe_tokenizer *spm(const char *fuse, const char *fallback) {
  char json[sizeof SPM + 16];
  snprintf(json, sizeof json, SPM, fuse, fallback);
  return load_text("spm.json", json);
}

TEST(tokenizer_steps_byte_fallback_and_unknown) {
  moe_tokenizer *t = spm("true", "true");
  ASSERT(t);
  int bad = 0;
  /* "abb é": "▁abb▁é" -> ▁ab (merges ▁+a, ▁a+b), b, ▁, é as <0xC3> <0xA9>. */
  bad += !IDS(t, "abb \xc3\xa9", 0, 9, 7, 5, 3, 4);
  /* "bzz\n": ▁ has no merge with b; z has no token nor byte token: <unk>; \n is <0x0A>. */
  bad += !IDS(t, "bzz\n", 0, 5, 7, 0, 10);
  /* The post-processor: <s> text </s>; an empty text gets both. */
  bad += !IDS(t, "a", MOE_TOKENIZER_ADD_SPECIAL, 1, 8, 2);
  bad += !IDS(t, "", MOE_TOKENIZER_ADD_SPECIAL, 1, 2);
  /* Special added tokens only with SPECIAL; the stretch after one gets its own "▁" (HF's Prepend runs
   * on each stretch). */
  bad += !IDS(t, "<s>a", MOE_TOKENIZER_SPECIAL, 1, 8);
  /* <mask> (lstrip, rstrip) takes the spaces beside it, special or not; "ab" (single_word) matches
   * only as a word of its own. */
  bad += !IDS(t, "a <mask> a", 0, 8, 11, 8);
  bad += !IDS(t, "ab", 0, 12);
  bad += !IDS(t, "ab \xc3\xa9", 0, 12, 5, 5, 3, 4); /* the stretch after it: "▁" prepended, then its space */
  bad += !IDS(t, "aab", 0, 8, 12); /* "ab" inside a word is not the added token: BPE gives ▁a, ab (in model.vocab too) */
  moe_tokenizer_free(t);
  /* fuse_unk off: each unknown character its own <unk>; byte fallback off: é is unknown too. */
  t = spm("false", "false");
  ASSERT(t);
  bad += !IDS(t, "zz\xc3\xa9", 0, 5, 0, 0, 0);
  moe_tokenizer_free(t);
  ASSERT_EQ_INT(bad, 0);
}

TEST(tokenizer_steps_decoders) {
  moe_tokenizer *t = spm("true", "true");
  ASSERT(t);
  struct {
    int32_t ids[6];
    size_t n;
    const char *want;
  } cases[] = {
      {{9, 5, 3, 4, 10}, 5, "ab \xc3\xa9\n"},       /* Replace, ByteFallback, Fuse, Strip of the first space */
      {{1, 8}, 2, "<s> a"},                           /* the added token is first: nothing to strip */
      {{3, 6}, 2, "\xef\xbf\xbd" "a"},               /* a lone <0xC3> is not UTF-8: U+FFFD */
      {{10, 3, 3, 6}, 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "a"}, /* a run that is not UTF-8: U+FFFD per byte, its \n too */
      {{5, 5, 8}, 3, "  a"},                          /* only one leading space goes */
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char out[64];
    size_t len = 0;
    if (moe_tokenizer_decode(t, cases[i].ids, cases[i].n, out, sizeof out, &len) != MOE_OK || len != strlen(cases[i].want) ||
        memcmp(out, cases[i].want, len)) {
      fprintf(stderr, "  case %zu: \"%.*s\", want \"%s\"\n", i, (int)len, out, cases[i].want);
      bad++;
    }
  }
  moe_tokenizer_free(t);
  /* The Metaspace decoder: "▁" back to spaces, the first token's prepended one dropped. */
  t = load_text("meta.json", "{\"decoder\": {\"type\": \"Metaspace\", \"prepend_scheme\": \"always\"}, \"model\": {\"type\": "
                             "\"BPE\", \"vocab\": {\"\xe2\x96\x81Hey\": 0, \"\xe2\x96\x81" "friend\": 1}, \"merges\": []}}");
  ASSERT(t);
  char out[64];
  size_t len = 0;
  ASSERT_OK(moe_tokenizer_decode(t, (int32_t[]){0, 1}, 2, out, sizeof out, &len));
  moe_tokenizer_free(t);
  if (len != 10 || memcmp(out, "Hey friend", 10)) FAIL_("Metaspace decode gave \"%.*s\"", (int)len, out);
  ASSERT_EQ_INT(bad, 0);
}

/* A directory: its tokenizer.json, and tokenizer_config.json's add_bos_token / add_eos_token in place
 * of the post-processor (here: BOS only, where the file's template adds </s> too); the CLI's
 * --add-special asks for them. */
TEST(tokenizer_steps_directory_config) {
  char dir[512], path[600], out[600], err[512];
  test_tmp_path("tokdir", dir, sizeof dir);
  mkdir(dir, 0755);
  char json[sizeof SPM + 16];
  snprintf(json, sizeof json, SPM, "true", "true");
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  fputs(json, f);
  fclose(f);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  f = fopen(path, "wb");
  ASSERT(f);
  fputs("{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\"}", f);
  fclose(f);
  moe_tokenizer *t = NULL;
  ASSERT_OK(moe_tokenizer_load(&t, dir));
  int bad = !IDS(t, "a", MOE_TOKENIZER_ADD_SPECIAL, 1, 8) + !IDS(t, "a", 0, 8);
  moe_tokenizer_free(t);
  ASSERT_EQ_INT(bad, 0);
  char args[1400];
  test_tmp_path("tokdir_ids.txt", out, sizeof out);
  snprintf(args, sizeof args, "tokenizer encode --tokenizer %s --add-special < /dev/null", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  char *ids = test_read_file(out, NULL);
  int same = ids && !strcmp(ids, "1\n");
  free(ids);
  if (!same) FAIL_("moe tokenizer encode --add-special of an empty text did not print \"1\" (stderr %s)", err);
  /* A config naming a token the tokenizer lacks is refused naming it. */
  f = fopen(path, "wb");
  ASSERT(f);
  fputs("{\"add_bos_token\": true, \"bos_token\": \"<bos>\"}", f);
  fclose(f);
  ASSERT_STATUS(moe_tokenizer_load(&t, dir), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "bos_token \"<bos>\" is not a token"));
}
