/* The byte-level BPE tokenizer: GPT-2's pre-tokenizer on bytes, merges computed by hand on a tiny
 * corpus, byte-for-byte round trips (arbitrary bytes, a committed sample, the Brown test split when
 * scripts/get-brown.sh has fetched it), deterministic training, tokenizer.json save -> load ->
 * the same ids, Hugging Face file forms, malformed files refused with their field named, the CLI. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "lm/tokenizer.h"
#include "run_cli.h"
#include "test.h"

/* Encodes n bytes and decodes them back; 1 when the bytes come back, else says where they differ. */
static int round_trip(const moe_tokenizer *t, const char *s, size_t n, int special, size_t *n_ids) {
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  char *back = malloc(n ? n : 1);
  size_t k = 0, len = 0;
  int ok = ids && back && moe_tokenizer_encode(t, s, n, special, ids, &k) == MOE_OK &&
           moe_tokenizer_decode(t, ids, k, back, n, &len) == MOE_OK && len == n && !memcmp(back, s, n);
  if (!ok) {
    size_t i = 0;
    while (i < n && i < len && back && back[i] == s[i]) i++;
    fprintf(stderr, "  round trip of %zu bytes (special %d) gave %zu bytes, first difference at byte %zu (%s)\n", n,
            special, len, i, moe_last_error());
  }
  if (n_ids) *n_ids = k;
  free(ids);
  free(back);
  return ok;
}

static moe_tokenizer *train_on(const char *text, int32_t vocab) {
  moe_tokenizer *t = NULL;
  if (moe_tokenizer_train(&t, text, strlen(text), vocab) != MOE_OK) fprintf(stderr, "  train: %s\n", moe_last_error());
  return t;
}

/* The token string of id (its bytes, NUL-terminated) in a static buffer, for messages and checks. */
static const char *tok(const moe_tokenizer *t, int32_t id) {
  static char buf[256];
  size_t n = 0;
  const char *b = moe_tokenizer_token_bytes(t, id, &n);
  snprintf(buf, sizeof buf, "%.*s", b ? (int)n : 0, b ? b : "");
  return buf;
}

static char *sample(size_t *n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizer_sample.txt", test_fixture_dir());
  return test_read_file(path, n);
}

TEST(tokenizer_pretoken_gpt2_split) {
  const char *text = "Hello world's  \n 123abc!! 'll'x\t\xc3\xa9t\xc3\xa9 _x  ";
  const char *want[] = {"Hello", " world", "'s", "  \n", " 123", "abc", "!!", " '", "ll", "'", "x", "\t",
                        "\xc3\xa9t\xc3\xa9", " _", "x", "  "};
  size_t n = strlen(text), i = 0, k = 0;
  moe__pretok *pre;
  ASSERT_OK(moe__pretok_new(&pre));
  for (; i < n; k++) {
    size_t j = moe__pretok_next(pre, (const unsigned char *)text, n, i);
    if (k >= sizeof want / sizeof *want) FAIL_("more pieces than expected, next '%.*s'", (int)(j - i), text + i);
    if (j - i != strlen(want[k]) || memcmp(text + i, want[k], j - i))
      FAIL_("piece %zu is '%.*s', want '%s'", k, (int)(j - i), text + i, want[k]);
    i = j;
  }
  moe__pretok_free(pre);
  ASSERT_EQ_INT(k, sizeof want / sizeof *want);
}

/* GPT-2's regex over 318 lines of mixed Unicode (every script's letters and digits, combining marks,
 * emoji, Unicode spaces, contractions) splits each line as JavaScript's regex with Unicode classes does
 * (the reference of GPT-2's encoder port; fixtures made by dev/gen_pretok_fixture.js): the byte length
 * of each pre-token, line by line. */
TEST(tokenizer_pretoken_unicode_matches_reference) {
  char path[1024];
  snprintf(path, sizeof path, "%s/pretok_unicode.txt", test_fixture_dir());
  char *text = test_read_file(path, NULL);
  snprintf(path, sizeof path, "%s/pretok_unicode.splits", test_fixture_dir());
  char *splits = test_read_file(path, NULL);
  moe__pretok *pre = NULL;
  int bad = !text || !splits || moe__pretok_new(&pre) != MOE_OK, lines = 0;
  if (bad) fprintf(stderr, "  cannot read %s or its text, or make the pre-tokenizer\n", path);
  for (char *line = text, *want = splits; !bad && *line; lines++) {
    char *eol = strchr(line, '\n'), *weol = strchr(want, '\n');
    if (!eol || !weol) break;
    size_t n = (size_t)(eol - line), i = 0;
    char got[4096] = "";
    for (size_t w = 0; i < n && w < sizeof got - 16; i = moe__pretok_next(pre, (const unsigned char *)line, n, i))
      w += (size_t)snprintf(got + w, sizeof got - w, "%s%zu", w ? " " : "",
                            moe__pretok_next(pre, (const unsigned char *)line, n, i) - i);
    if (strlen(got) != (size_t)(weol - want) || memcmp(got, want, strlen(got))) {
      fprintf(stderr, "  line %d '%.*s': pre-token lengths %s, want %.*s\n", lines + 1, (int)n, line, got,
              (int)(weol - want), want);
      bad = 1;
    }
    line = eol + 1, want = weol + 1;
  }
  moe__pretok_free(pre);
  free(text);
  free(splits);
  ASSERT(!bad);
  ASSERT_EQ_INT(lines, 318);
}

/* A directory stands for its tokenizer.json: one without is refused naming that file (a directory's
 * size used to read as LONG_MAX). */
TEST(tokenizer_load_directory_without_tokenizer_json) {
  moe_tokenizer *t = NULL;
  ASSERT_STATUS(moe_tokenizer_load(&t, test_fixture_dir()), MOE_ERR_IO);
  ASSERT(!t);
  if (!strstr(moe_last_error(), "fixtures/tokenizer.json") || strstr(moe_last_error(), "bytes"))
    FAIL_("message: %s", moe_last_error());
}

/* Bytes that are not UTF-8 are pre-tokens of one byte each, and the text's every byte is in one. */
TEST(tokenizer_pretoken_invalid_utf8_bytes) {
  const unsigned char text[] = "ab\xff\xfe cd\xc3 \xe2\x82";
  size_t n = sizeof text - 1, i = 0, k = 0, want[] = {2, 1, 1, 3, 1, 1, 1, 1};
  moe__pretok *pre;
  ASSERT_OK(moe__pretok_new(&pre));
  for (; i < n && k < 8; k++) {
    size_t j = moe__pretok_next(pre, text, n, i);
    if (j - i != want[k]) {
      moe__pretok_free(pre);
      FAIL_("piece %zu at byte %zu is %zu bytes, want %zu", k, i, j - i, want[k]);
    }
    i = j;
  }
  moe__pretok_free(pre);
  ASSERT_EQ_INT(i, n);
  ASSERT_EQ_INT(k, 8);
}

/* "the the the cat": words "the" x1, " the" x2, " cat" x1. Pairs (t,h) 3 and (h,e) 3 tie: 'h' (id
 * 71) < 't' (id 83) so "he" first; then "the" (3), " the" (2); then the count-1 ties by left id:
 * (a,t) as 'a' = 64 < 'c' = 66 < ' ' = 220, giving "at", then "cat" (c, at), then " cat". */
TEST(tokenizer_train_hand_computed) {
  const char *want[] = {"he", "the", " the", "at", "cat", " cat"};
  ASSERT_EQ_INT(moe__tok_byte_rank('a'), 64);
  ASSERT_EQ_INT(moe__tok_byte_rank(' '), 220); /* GPT-2's "Ġ" */
  ASSERT_EQ_INT(moe__tok_byte_rank('!'), 0);
  ASSERT_EQ_INT(moe__tok_byte_rank(0), 188);
  moe_tokenizer *t = train_on("the the the cat", 1000);
  ASSERT(t);
  ASSERT_EQ_INT(moe_tokenizer_vocab_size(t), 256 + 6 + 1); /* the text runs out of pairs */
  for (int m = 0; m < 6; m++)
    if (strcmp(tok(t, 256 + m), want[m])) FAIL_("merge %d made '%s', want '%s'", m, tok(t, 256 + m), want[m]);
  ASSERT(!strcmp(tok(t, 262), MOE_TOKENIZER_EOT));
  ASSERT_EQ_INT(moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT), 262);
  ASSERT_EQ_INT(moe_tokenizer_token_id(t, " cat"), 261);
  int32_t ids[32];
  size_t k;
  ASSERT_OK(moe_tokenizer_encode(t, "the cat<|endoftext|>cat", 23, 1, ids, &k));
  ASSERT_EQ_INT(k, 4);
  ASSERT_EQ_INT(ids[0], 257);
  ASSERT_EQ_INT(ids[1], 261);
  ASSERT_EQ_INT(ids[2], 262);
  ASSERT_EQ_INT(ids[3], 260);
  moe_tokenizer_free(t);
  /* A smaller vocabulary stops after the first merges, the end-of-text token last. */
  t = train_on("the the the cat", 260);
  ASSERT(t);
  ASSERT_EQ_INT(moe_tokenizer_vocab_size(t), 260);
  ASSERT(!strcmp(tok(t, 258), " the"));
  ASSERT(!strcmp(tok(t, 259), MOE_TOKENIZER_EOT));
  moe_tokenizer_free(t);
  moe_tokenizer *none = NULL;
  ASSERT_STATUS(moe_tokenizer_train(&none, "x", 1, 256), MOE_ERR_ARG);
  ASSERT(!none);
}

TEST(tokenizer_round_trips_arbitrary_bytes) {
  size_t n;
  char *text = sample(&n);
  ASSERT(text);
  moe_tokenizer *t = train_on(text, 600);
  ASSERT(t);
  size_t k;
  int ok = round_trip(t, text, n, 0, &k) && round_trip(t, text, n, 1, NULL);
  free(text);
  if (!ok || k * 2 > n) {
    moe_tokenizer_free(t);
    FAIL_("sample: round trip %d, %zu tokens for %zu bytes (want under half)", ok, k, n);
  }
  /* Random bytes: invalid UTF-8, NULs, every byte value; some with the end-of-text string inside. */
  uint64_t seed = 19;
  char buf[700];
  for (int r = 0; r < 300 && ok; r++) {
    size_t len = (size_t)(moe__splitmix(&seed) % sizeof buf);
    for (size_t i = 0; i < len; i++) {
      uint64_t x = moe__splitmix(&seed);
      buf[i] = r % 3 ? (char)x : " \t\n'aZ9.\0\xff\xc3"[x % 11]; /* a third from a small alphabet: long runs */
    }
    if (r % 5 == 0 && len > 20) memcpy(buf + len / 2, MOE_TOKENIZER_EOT, strlen(MOE_TOKENIZER_EOT));
    ok = round_trip(t, buf, len, r & 1, NULL);
  }
  ok = ok && round_trip(t, "", 0, 1, NULL);
  moe_tokenizer_free(t);
  ASSERT(ok);
}

TEST(tokenizer_training_is_deterministic) {
  size_t n;
  char *text = sample(&n), a[512], b[512];
  ASSERT(text);
  moe_tokenizer *t1 = train_on(text, 500), *t2 = train_on(text, 500);
  free(text);
  ASSERT(t1 && t2);
  ASSERT_OK(moe_tokenizer_save(t1, test_tmp_path("tok_a.json", a, sizeof a)));
  ASSERT_OK(moe_tokenizer_save(t2, test_tmp_path("tok_b.json", b, sizeof b)));
  moe_tokenizer_free(t1);
  moe_tokenizer_free(t2);
  ASSERT(test_same_file(a, b));
}

TEST(tokenizer_save_load_same_ids) {
  size_t n;
  char *text = sample(&n), p1[512], p2[512];
  ASSERT(text);
  moe_tokenizer *t = train_on(text, 520), *u = NULL;
  ASSERT(t);
  ASSERT_OK(moe_tokenizer_save(t, test_tmp_path("tok_save.json", p1, sizeof p1)));
  ASSERT_OK(moe_tokenizer_load(&u, p1));
  ASSERT_EQ_INT(moe_tokenizer_vocab_size(u), 520);
  int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  size_t kx = 0, ky = 0;
  int same = x && y && moe_tokenizer_encode(t, text, n, 1, x, &kx) == MOE_OK &&
             moe_tokenizer_encode(u, text, n, 1, y, &ky) == MOE_OK && kx == ky && !memcmp(x, y, kx * sizeof *x);
  int trip = round_trip(u, text, n, 0, NULL);
  free(x);
  free(y);
  free(text);
  ASSERT_OK(moe_tokenizer_save(u, test_tmp_path("tok_save2.json", p2, sizeof p2)));
  moe_tokenizer_free(t);
  moe_tokenizer_free(u);
  if (!same) FAIL_("the loaded tokenizer encodes the sample differently (%zu vs %zu ids)", kx, ky);
  ASSERT(trip);
  ASSERT(test_same_file(p1, p2));
}

/* Writes text to a scratch file named name; returns its path (static buffer). */
static const char *scratch(const char *name, const char *text) {
  static char path[512];
  test_tmp_path(name, path, sizeof path);
  FILE *f = fopen(path, "wb");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  return path;
}

/* A Hugging Face tokenizer.json made by hand: every byte character (GPT-2's id order), merges "Ġ t",
 * ["Ġt", "h"] (the newer pair form), an added token that is also in model.vocab (as in GPT-2's
 * file). The extra members ("key": value, ...) come first in the root or model object: cJSON takes
 * the first of duplicate keys, so they replace the defaults. */
static char *hf_json(const char *model_extra, const char *merges, const char *root_extra) {
  cJSON *vocab = cJSON_CreateObject();
  for (int b = 0; b < 256; b++) {
    char s[3];
    int c = moe__tok_byte_char(b);
    if (c < 0x80) s[0] = (char)c, s[1] = 0;
    else s[0] = (char)(0xc0 | (c >> 6)), s[1] = (char)(0x80 | (c & 0x3f)), s[2] = 0;
    cJSON_AddNumberToObject(vocab, s, moe__tok_byte_rank(b));
  }
  cJSON_AddNumberToObject(vocab, "\xc4\xa0t", 256); /* "Ġt" */
  cJSON_AddNumberToObject(vocab, "\xc4\xa0th", 257);
  cJSON_AddNumberToObject(vocab, "<|endoftext|>", 258);
  char *v = cJSON_PrintUnformatted(vocab), *out = malloc(strlen(v) + 4096);
  sprintf(out,
          "{%s\"version\": \"1.0\", \"added_tokens\": [{\"id\": 258, \"content\": \"<|endoftext|>\", \"special\": true}],"
          " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
          " \"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": {\"type\": \"ByteLevel\"},"
          " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {%s\"type\": \"BPE\", \"dropout\": null,"
          " \"unk_token\": null, \"fuse_unk\": false, \"vocab\": %s, \"merges\": %s}}",
          root_extra, model_extra, v, merges);
  free(v);
  cJSON_Delete(vocab);
  return out;
}

#define GOOD_MERGES "[\"\xc4\xa0 t\", [\"\xc4\xa0t\", \"h\"]]"

TEST(tokenizer_loads_hugging_face_forms) {
  char *j = hf_json("", GOOD_MERGES, "");
  moe_tokenizer *t = NULL;
  moe_status st = moe_tokenizer_load(&t, scratch("hf.json", j));
  free(j);
  ASSERT_OK(st);
  ASSERT_EQ_INT(moe_tokenizer_vocab_size(t), 259);
  int32_t ids[16];
  size_t k;
  /* " the" -> "Ġth" + "e"; "<|endoftext|>" is one id with special = 1, 13 bytes without. */
  ASSERT_OK(moe_tokenizer_encode(t, " the<|endoftext|>", 17, 1, ids, &k));
  ASSERT_EQ_INT(k, 3);
  ASSERT_EQ_INT(ids[0], 257);
  ASSERT_EQ_INT(ids[1], moe__tok_byte_rank('e'));
  ASSERT_EQ_INT(ids[2], 258);
  ASSERT_OK(moe_tokenizer_encode(t, "<|endoftext|>", 13, 0, ids, &k));
  ASSERT_EQ_INT(k, 13); /* plain bytes, no merge applies */
  ASSERT_OK(moe_tokenizer_encode(t, "<|endoftext|>a<|endoftext|><|endoftext|><|", 42, 1, ids, &k));
  ASSERT_EQ_INT(k, 6);
  int32_t want[] = {258, moe__tok_byte_rank('a'), 258, 258, moe__tok_byte_rank('<'), moe__tok_byte_rank('|')};
  for (int i = 0; i < 6; i++) ASSERT_EQ_INT(ids[i], want[i]);
  moe_tokenizer_free(t);
  /* ignore_merges: a pre-token that is in the vocabulary is that token. */
  j = hf_json("\"ignore_merges\": true, ", "[]", "");
  st = moe_tokenizer_load(&t, scratch("hf_im.json", j));
  free(j);
  ASSERT_OK(st);
  ASSERT_OK(moe_tokenizer_encode(t, " th", 3, 0, ids, &k));
  ASSERT_EQ_INT(k, 1);
  ASSERT_EQ_INT(ids[0], 257);
  moe_tokenizer_free(t);
}

/* A file that must be refused with status st and a message naming `needle`. */
static int refused(const char *name, const char *text, moe_status st, const char *needle) {
  moe_tokenizer *t = NULL;
  moe_status got = moe_tokenizer_load(&t, scratch(name, text));
  int ok = got == st && !t && strstr(moe_last_error(), needle);
  if (!ok) fprintf(stderr, "  %s: got %s '%s', want %s naming '%s'\n", name, moe_status_name(got), moe_last_error(),
                   moe_status_name(st), needle);
  moe_tokenizer_free(t);
  return ok;
}

TEST(tokenizer_malformed_files_refused) {
  struct {
    const char *model_extra, *merges, *root_extra;
    moe_status st;
    const char *needle;
  } cases[] = {
      {"\"byte_fallback\": 3, ", "[]", "", MOE_ERR_FORMAT, "model.byte_fallback is 3, not a boolean"},
      {"\"dropout\": 0.1, ", "[]", "", MOE_ERR_FORMAT, "model.dropout is 0.1"},
      {"\"continuing_subword_prefix\": \"##\", ", "[]", "", MOE_ERR_FORMAT, "model.continuing_subword_prefix"},
      {"\"ignore_merges\": 3, ", "[]", "", MOE_ERR_FORMAT, "model.ignore_merges is 3"},
      {"", "[\"\xc4\xa0 t x\"]", "", MOE_ERR_FORMAT, "model.merges[0]"},
      {"", "[\"\xc4\xa0t\"]", "", MOE_ERR_FORMAT, "model.merges[0]"},
      {"", "[7]", "", MOE_ERR_FORMAT, "model.merges[0] is 7"},
      {"", "[\"\xc4\xa0 t\", \"q zz\"]", "", MOE_ERR_FORMAT, "model.merges[1]: \"zz\" is not in model.vocab"},
      {"", "[\"t h\"]", "", MOE_ERR_FORMAT, "model.merges[0]: the merge of \"t\" and \"h\""},
      {"", "{}", "", MOE_ERR_MISSING, "model.merges is missing"},
      {"", "[]", "\"normalizer\": {\"type\": \"BertNormalizer\"}, ", MOE_ERR_FORMAT,
       "normalizer is of type \"BertNormalizer\": not supported"},
      {"", "[]", "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Precompiled\"}]}, ",
       MOE_ERR_FORMAT, "normalizer.normalizers[1] is of type \"Precompiled\""},
      {"", "[]", "\"decoder\": {\"type\": \"Metaspace\"}, ", MOE_ERR_FORMAT, "a decoder other than ByteLevel"},
      {"", "[]", "\"decoder\": {\"type\": \"WordPiece\"}, ", MOE_ERR_FORMAT, "decoder is of type \"WordPiece\""},
      {"\"unk_token\": \"<unk>\", ", "[]", "", MOE_ERR_FORMAT, "model.unk_token \"<unk>\" is not in model.vocab"},
      {"", "[]", "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}]}, ",
       MOE_ERR_FORMAT, "post_processor.single[0] names \"<s>\""},
      {"", "[]", "\"post_processor\": {\"type\": \"RobertaProcessing\", \"cls\": [\"<s>\", 9999], \"sep\": [\"</s>\", 2]}, ",
       MOE_ERR_FORMAT, "post_processor.cls[1] is not a token id"},
      {"", "[]", "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Digits\"}]}, ",
       MOE_ERR_FORMAT, "pre_tokenizer.pretokenizers[1] follows a ByteLevel pre-tokenizer"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *j = hf_json(cases[i].model_extra, cases[i].merges, cases[i].root_extra);
    char name[32];
    snprintf(name, sizeof name, "bad%zu.json", i);
    bad += !refused(name, j, cases[i].st, cases[i].needle);
    free(j);
  }
  /* Whole-file and vocabulary problems. */
  bad += !refused("notjson.json", "{\"model\": ", MOE_ERR_FORMAT, "not valid JSON");
  bad += !refused("array.json", "[1, 2]", MOE_ERR_FORMAT, "not a JSON object");
  bad += !refused("nomodel.json", "{}", MOE_ERR_MISSING, "no \"model\" object");
  bad += !refused("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", MOE_ERR_FORMAT,
                  "model.type is \"Unigram\"");
  bad += !refused("ws.json", "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}",
                  MOE_ERR_FORMAT, "pre_tokenizer is of type \"Whitespace\": not supported");
  /* an empty Metaspace replacement (fuzz_tokenizer_json: the decoder matched it at every byte without advancing) */
  bad += !refused("meta_dec.json", "{\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\"}, \"model\": "
                  "{\"vocab\": {\"a\": 0}, \"merges\": []}}", MOE_ERR_FORMAT, "decoder.replacement is empty");
  bad += !refused("meta_pre.json", "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\"}, \"model\": "
                  "{\"vocab\": {\"a\": 0}, \"merges\": []}}", MOE_ERR_FORMAT, "pre_tokenizer.replacement is empty");
  bad += !refused("behav.json", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
                  "\"Sideways\"}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}", MOE_ERR_FORMAT,
                  "pre_tokenizer.behavior is \"Sideways\"");
  bad += !refused("regex.json", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}}, "
                  "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}", MOE_ERR_FORMAT,
                  "pre_tokenizer: the pattern \"(a\" does not compile");

  const char *bl = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"merges\": [], \"vocab\": ";
  char buf[512];
  snprintf(buf, sizeof buf, "%s{\"a\": 0, \"b\": 1.5}}}", bl);
  bad += !refused("frac.json", buf, MOE_ERR_FORMAT, "model.vocab[\"b\"] is 1.5, not a token id");
  snprintf(buf, sizeof buf, "%s{\"a\": 0, \"b\": 0}}}", bl);
  bad += !refused("dupid.json", buf, MOE_ERR_FORMAT, "gives id 0 to both \"a\" and \"b\"");
  snprintf(buf, sizeof buf, "%s{\"a\": 0, \"b\": 2}}}", bl);
  bad += !refused("gap.json", buf, MOE_ERR_FORMAT, "no token has id 1");
  snprintf(buf, sizeof buf, "%s{\"a\": 0, \"\xe2\x96\x81the\": 1}}}", bl);
  bad += !refused("spm.json", buf, MOE_ERR_FORMAT, "\"\xe2\x96\x81the\" (id 1) is not made of ByteLevel's 256 byte characters");
  snprintf(buf, sizeof buf, "%s{\"a\": 0, \"b\": 1}}}", bl);
  bad += !refused("bytes.json", buf, MOE_ERR_FORMAT, "no token for the byte 0x00");
  snprintf(buf, sizeof buf, "%s{\"a\": 0}}, \"added_tokens\": [{\"id\": 0, \"content\": \"x\"}]}", bl);
  bad += !refused("added.json", buf, MOE_ERR_FORMAT, "added_tokens[0] (\"x\") has id 0, which is already \"a\"");
  snprintf(buf, sizeof buf, "%s{\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}", bl);
  bad += !refused("added2.json", buf, MOE_ERR_FORMAT, "added_tokens[0] is");
  char missing[512];
  test_tmp_path("no_such_tokenizer.json", missing, sizeof missing);
  unlink(missing);
  moe_tokenizer *t = NULL;
  ASSERT_STATUS(moe_tokenizer_load(&t, missing), MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "no_such_tokenizer.json"));
  /* Decode names the bad id. */
  char *j = hf_json("", "[]", "");
  ASSERT_OK(moe_tokenizer_load(&t, scratch("hf_ok.json", j)));
  free(j);
  size_t len;
  ASSERT_STATUS(moe_tokenizer_decode(t, (int32_t[]){1, 259}, 2, buf, sizeof buf, &len), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "ids[1] = 259"));
  ASSERT_STATUS(moe_tokenizer_decode(t, (int32_t[]){258}, 1, buf, 5, &len), MOE_ERR_ARG);
  ASSERT_EQ_INT(len, 13);
  char *all = NULL;
  ASSERT_STATUS(moe_tokenizer_decode_alloc(t, (int32_t[]){1, 259}, 2, &all, &len), MOE_ERR_VALUE);
  ASSERT(!all && strstr(moe_last_error(), "ids[1] = 259"));
  ASSERT_OK(moe_tokenizer_decode_alloc(t, (int32_t[]){258}, 1, &all, &len));
  ASSERT_EQ_INT(len, 13);
  ASSERT_OK(moe_tokenizer_decode(t, (int32_t[]){258}, 1, buf, sizeof buf, &len));
  ASSERT(!memcmp(all, buf, 13) && !all[13]);
  free(all);
  moe_tokenizer_free(t);
  ASSERT_EQ_INT(bad, 0);
}

/* Every document of the Brown test split (and the whole file) round-trips through a tokenizer trained
 * on the train split at the default 4096 ids. */
TEST(tokenizer_brown_test_split_round_trips) {
  char path[1024];
  size_t ntrain, ntest;
  snprintf(path, sizeof path, "%s/../../data/brown/train.txt", test_fixture_dir());
  char *train = test_read_file(path, &ntrain);
  snprintf(path, sizeof path, "%s/../../data/brown/test.txt", test_fixture_dir());
  char *test = train ? test_read_file(path, &ntest) : NULL;
  if (!test) {
    free(train);
    SKIP("no data/brown (scripts/get-brown.sh fetches it)");
  }
  moe_tokenizer *t = NULL;
  moe_status st = moe_tokenizer_train(&t, train, ntrain, 4096);
  free(train);
  int ok = st == MOE_OK, docs = 0;
  size_t tokens = 0;
  for (char *d = test; ok && d < test + ntest; docs++) { /* documents end at an empty line */
    char *e = strstr(d, "\n\n");
    size_t n = e ? (size_t)(e - d) + 1 : (size_t)(test + ntest - d), k;
    ok = round_trip(t, d, n, 0, &k);
    if (!ok) fprintf(stderr, "  document %d of the test split differs\n", docs);
    tokens += k;
    d += n + (e != NULL);
  }
  ok = ok && round_trip(t, test, ntest, 1, NULL);
  free(test);
  moe_tokenizer_free(t);
  if (st != MOE_OK) FAIL_("train: %s", moe_last_error());
  ASSERT(ok);
  ASSERT_EQ_INT(docs, 50);
  ASSERT(tokens * 3 < ntest); /* more than 3 bytes per token */
}

TEST(tokenizer_cli_train_encode_decode) {
  char data[1024], tj[512], in[512], ids[512], out[512], args[4096], err[2048];
  snprintf(data, sizeof data, "%s/tokenizer_sample.txt", test_fixture_dir());
  test_tmp_path("cli_tok.json", tj, sizeof tj);
  snprintf(args, sizeof args, "tokenizer train --data '%s' --vocab 400 --out '%s' --json", data, tj);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 0);
  const char *bytes = "caf\xc3\xa9 \x00\xff the experts\n";
  FILE *f = fopen(test_tmp_path("cli_in.bin", in, sizeof in), "wb");
  ASSERT(f);
  fwrite(bytes, 1, 21, f);
  fclose(f);
  test_tmp_path("cli_ids.txt", ids, sizeof ids);
  test_tmp_path("cli_out.bin", out, sizeof out);
  snprintf(args, sizeof args, "tokenizer encode --tokenizer '%s' < '%s'", tj, in);
  ASSERT_EQ_INT(run_moe(NULL, args, ids, err, sizeof err), 0);
  snprintf(args, sizeof args, "tokenizer decode --tokenizer '%s' < '%s'", tj, ids);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  ASSERT(test_same_file(in, out));
  snprintf(args, sizeof args, "tokenizer encode --tokenizer '%s' --json < '%s'", tj, in);
  ASSERT_EQ_INT(run_moe(NULL, args, ids, err, sizeof err), 0);
  char text[4096];
  test_read_text(ids, text, sizeof text);
  ASSERT(text[0] == '[');
  snprintf(args, sizeof args, "tokenizer decode --tokenizer '%s' < '%s'", tj, ids); /* a JSON array decodes too */
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  ASSERT(test_same_file(in, out));
  /* Errors: a bad id, a bad vocabulary size, a missing tokenizer. */
  scratch("cli_bad_ids.txt", "1 2 99999\n");
  snprintf(args, sizeof args, "tokenizer decode --tokenizer '%s' < '%s'", tj, scratch("cli_bad_ids.txt", "1 2 99999\n"));
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  if (!strstr(err, "ids[2] = 99999")) FAIL_("stderr '%s' does not name ids[2] = 99999", err);
  snprintf(args, sizeof args, "tokenizer decode --tokenizer '%s' < '%s'", tj, scratch("cli_bad_ids2.txt", "1 x2\n"));
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  if (!strstr(err, "byte 2: not a token id")) FAIL_("stderr '%s'", err);
  ASSERT(run_moe(NULL, "tokenizer train --vocab 100 --out /dev/null", NULL, err, sizeof err) != 0);
  if (!strstr(err, "--vocab")) FAIL_("stderr '%s' does not name --vocab", err);
  ASSERT(run_moe(NULL, "tokenizer encode --tokenizer /nonexistent/t.json", NULL, err, sizeof err) != 0);
  if (!strstr(err, "/nonexistent/t.json")) FAIL_("stderr '%s' does not name the file", err);
  ASSERT_EQ_INT(run_moe(NULL, "tokenizer --help", NULL, err, sizeof err), 0);
}

/* Streaming a byte-level tokenizer's ids one by one: a character split over tokens waits for its end,
 * bytes that are not UTF-8 come out as U+FFFD, and the pieces are the whole decode cleaned (as Python's
 * errors="replace" cleans it: the reference here is written out by hand). */
TEST(tokenizer_detokenizer_streams_characters_whole) {
  moe_tokenizer *t = train_on("ab ab ab", 300); /* few merges: a multi-byte character is several tokens */
  ASSERT(t);
  const char *text = "a\xc3\xa9 \xf0\x9f\xa6\x99!\xff"; /* "aé 🦙!" and a stray byte */
  int32_t ids[32];
  size_t n = 0;
  ASSERT_OK(moe_tokenizer_encode(t, text, strlen(text), 0, ids, &n));
  ASSERT(n >= 8); /* every byte its own token */
  moe_detokenizer *d;
  ASSERT_OK(moe_detokenizer_new(&d, t));
  char got[64];
  size_t w = 0, len;
  const char *piece;
  int empty = 0;
  for (size_t i = 0; i < n; i++) {
    ASSERT_OK(moe_detokenizer_push(d, ids[i], &piece, &len));
    empty += len == 0;
    ASSERT(w + len < sizeof got);
    memcpy(got + w, piece, len), w += len;
  }
  ASSERT_OK(moe_detokenizer_flush(d, &piece, &len));
  memcpy(got + w, piece, len), w += len;
  const char *want = "a\xc3\xa9 \xf0\x9f\xa6\x99!\xef\xbf\xbd";
  if (w != strlen(want) || memcmp(got, want, w)) FAIL_("streamed \"%.*s\", want \"%s\"", (int)w, got, want);
  ASSERT_EQ_INT(empty, 1 + 3); /* é's first byte and 🦙's first three wait for the rest */
  /* a character left incomplete at the end is U+FFFD at the flush; then a new text starts */
  ASSERT_OK(moe_detokenizer_push(d, ids[1], &piece, &len));
  ASSERT_EQ_INT((int)len, 0);
  ASSERT_OK(moe_detokenizer_flush(d, &piece, &len));
  ASSERT(len == 3 && !memcmp(piece, "\xef\xbf\xbd", 3));
  ASSERT_OK(moe_detokenizer_push(d, ids[0], &piece, &len));
  ASSERT(len == 1 && piece[0] == 'a');
  ASSERT_STATUS(moe_detokenizer_push(d, 1 << 20, &piece, &len), MOE_ERR_VALUE);
  moe_detokenizer_free(d);
  moe_tokenizer_free(t);
}
