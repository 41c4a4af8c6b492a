/* Chat templates against @huggingface/jinja (fixtures by dev/gen_chat_fixtures.js): the real models'
 * templates over conversations, and one template per language feature, byte for byte or failing
 * where it fails; then the errors' positions, the bounds, and moe tokenizer template. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat/chat_render.h"
#include "run_cli.h"
#include "test.h"

#define NOW 1720170487 /* 2024-07-05 09:08:07 UTC, the generator's clock */

static cJSON *read_json(const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/chat/%s", test_fixture_dir(), rel);
  char *text = test_read_file(path, NULL);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  if (!j) fprintf(stderr, "  cannot read %s\n", path);
  free(text);
  return j;
}

/* 0 when got is the expected text or the expected error; otherwise prints the difference. */
static int check(const char *what, const cJSON *c, moe_status st, const char *got, size_t len) {
  const cJSON *want = cJSON_GetObjectItem(c, "expected"), *err = cJSON_GetObjectItem(c, "error");
  if (cJSON_IsString(err)) {
    if (st == MOE_OK) {
      fprintf(stderr, "  %s: rendered \"%s\", @huggingface/jinja fails: %s\n", what, got, err->valuestring);
      return 1;
    }
    /* The template's own exception carries its message. */
    const char *r = strstr(moe_last_error(), "raise_exception: ");
    if (r && strncmp(r + 17, err->valuestring, strlen(err->valuestring))) {
      fprintf(stderr, "  %s: %s, want the message %s\n", what, moe_last_error(), err->valuestring);
      return 1;
    }
    return 0;
  }
  if (st != MOE_OK) {
    fprintf(stderr, "  %s: %s\n", what, moe_last_error());
    return 1;
  }
  size_t n = strlen(want->valuestring), i = 0;
  if (n == len && !memcmp(got, want->valuestring, n)) return 0;
  while (i < n && i < len && got[i] == want->valuestring[i]) i++;
  size_t from = i > 40 ? i - 40 : 0;
  fprintf(stderr, "  %s: differs at byte %zu (%zu vs %zu bytes)\n    got:  \"%.80s\"\n    want: \"%.80s\"\n", what, i,
          len, n, got + from, want->valuestring + from);
  return 1;
}

TEST(chat_template_models) {
  static const char *models[] = {"qwen3", "deepseek_v3", "llama3", "llama3_1", "gemma3"};
  int bad = 0, n = 0;
  for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
    char rel[256], dir[1024];
    snprintf(rel, sizeof rel, "%s/cases.json", models[m]);
    snprintf(dir, sizeof dir, "%s/chat/%s", test_fixture_dir(), models[m]);
    cJSON *cases = read_json(rel);
    ASSERT(cases);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
      char *conv = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "conversation")), *out = NULL, what[256];
      size_t len = 0;
      moe_status st = moe_chat_template_render_config(dir, conv, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                                                      NOW, &out, &len);
      snprintf(what, sizeof what, "%s %s", models[m], cJSON_GetObjectItem(c, "name")->valuestring);
      bad += check(what, c, st, out, len);
      n++;
      free(out);
      free(conv);
    }
    cJSON_Delete(cases);
  }
  ASSERT(n >= 100);
  ASSERT_EQ_INT(bad, 0);
}

/* Where Gemma 3's template raises (roles not alternating, content null), rendering fails and the error
 * names the template's message and the file (@huggingface/jinja raises the same three messages). */
TEST(chat_template_gemma3_raises) {
  static const char *const convs[][2] = {
      {"[{\"role\": \"user\", \"content\": \"one\"}, {\"role\": \"user\", \"content\": \"two\"}]",
       "raise_exception: Conversation roles must alternate user/assistant/user/assistant/..."},
      {"[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"assistant\", \"content\": \"a\"}]",
       "raise_exception: Conversation roles must alternate"},
      {"[{\"role\": \"user\", \"content\": \"w\"}, {\"role\": \"assistant\", \"content\": null}]",
       "raise_exception: Invalid content type"}};
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/chat/gemma3", test_fixture_dir());
  for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
    char *out = NULL;
    moe_status st = moe_chat_template_render_config(dir, convs[i][0], 1, NOW, &out, NULL);
    free(out);
    if (st == MOE_OK || !strstr(moe_last_error(), convs[i][1]) || !strstr(moe_last_error(), "tokenizer_config.json"))
      fprintf(stderr, "  %s -> %s: %s\n", convs[i][0], moe_status_name(st), moe_last_error());
    ASSERT(st != MOE_OK);
    ASSERT(strstr(moe_last_error(), convs[i][1]) != NULL);
    ASSERT(strstr(moe_last_error(), "tokenizer_config.json") != NULL);
  }
}

TEST(chat_template_language) {
  cJSON *cases = read_json("lang.json");
  ASSERT(cases);
  int bad = 0, n = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, cases) {
    char *ctx = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "context")), *out = NULL;
    size_t len = 0;
    moe_status st = moe_chat_template_render(cJSON_GetObjectItem(c, "template")->valuestring, ctx, NOW, &out, &len);
    bad += check(cJSON_GetObjectItem(c, "name")->valuestring, c, st, out, len);
    n++;
    free(out);
    free(ctx);
  }
  cJSON_Delete(cases);
  ASSERT(n >= 60);
  ASSERT_EQ_INT(bad, 0);
}

/* The render fails with status st and a message holding `want`. */
static int fails_with(const char *tmpl, moe_status st, const char *want) {
  char *out = NULL;
  moe_status got = moe_chat_template_render(tmpl, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", NOW, &out, NULL);
  free(out);
  if (got == st && strstr(moe_last_error(), want)) return 1;
  fprintf(stderr, "  %s -> %s: %s (want %s: ...%s...)\n", tmpl, moe_status_name(got), moe_last_error(), moe_status_name(st), want);
  return 0;
}

TEST(chat_template_errors) {
  ASSERT(fails_with("{{ 'x' | frobnicate }}", MOE_ERR_VALUE, "unknown filter 'frobnicate' for a string at 1:10"));
  ASSERT(fails_with("line one\n  {{ 1 is frobnicated }}", MOE_ERR_VALUE, "unknown test 'frobnicated' at 2:8"));
  ASSERT(fails_with("{{ messages[0].content.format(1) }}", MOE_ERR_VALUE, "no method 'format' (a undefined is not a function) at 1:23"));
  ASSERT(fails_with("{{ frob(1) }}", MOE_ERR_VALUE, "'frob' is not a function (a undefined) at 1:4"));
  ASSERT(fails_with("{% frob %}", MOE_ERR_FORMAT, "unknown statement 'frob' at 1:4"));
  ASSERT(fails_with("ab\n{% if true %}\nnever closed", MOE_ERR_FORMAT, "{% if %} without its {% endif %} at 2:4"));
  ASSERT(fails_with("{{ 1 + }}", MOE_ERR_FORMAT, "expected an expression, found '}}' at 1:8"));
  ASSERT(fails_with("{{ 'abc }}", MOE_ERR_FORMAT, "unterminated string at 1:4"));
  ASSERT(fails_with("{{ 'a\\q' }}", MOE_ERR_FORMAT, "unknown escape \\q in a string at 1:6"));
  ASSERT(fails_with("{# open", MOE_ERR_FORMAT, "comment without its #} at 1:1"));
  ASSERT(fails_with("{{ x @ y }}", MOE_ERR_FORMAT, "unexpected character '@' at 1:6"));
  ASSERT(fails_with("\xc3\xa9t\xc3\xa9 {{ raise_exception('bad ' ~ messages|length) }}", MOE_ERR_VALUE,
                    "raise_exception: bad 1 at 1:8"));
  ASSERT(fails_with("{% break %}", MOE_ERR_VALUE, "{% break %} outside a loop at 1:4"));
  ASSERT(fails_with("{{ nope + 1 }}", MOE_ERR_VALUE, "'+' on an undefined value at 1:9"));
  ASSERT(fails_with("{% set d = {} %}{% set d.x = 1 %}", MOE_ERR_VALUE, "set assigns attributes of a namespace only"));
  /* a context that shadows a built-in is refused, as @huggingface/jinja refuses it */
  char *out = NULL;
  ASSERT_STATUS(moe_chat_template_render("x", "{\"range\": 1}", NOW, &out, NULL), MOE_ERR_VALUE);
  ASSERT(strstr(moe_last_error(), "'range' is a built-in name"));
  ASSERT_STATUS(moe_chat_template_render("x", "[1]", NOW, &out, NULL), MOE_ERR_FORMAT);
  ASSERT_STATUS(moe_chat_template_render("x", "{\"a\": ", NOW, &out, NULL), MOE_ERR_FORMAT);
  ASSERT(out == NULL);
  ASSERT_OK(moe_chat_template_render("{{ a }}", "{\"a\": 1, \"a\": 2}", NOW, &out, NULL)); /* JSON.parse: the last */
  ASSERT(!strcmp(out, "2"));
  free(out);
  ASSERT_OK(moe_chat_template_render("{{ a }}", NULL, NOW, &out, NULL));
  ASSERT(!strcmp(out, ""));
  free(out);
}

typedef struct {
  const moe_chat_template *t;
  const char *want;
  int bad; /* renders that differed from want */
} apply_job;

static void *apply_many(void *arg) {
  apply_job *j = arg;
  for (int i = 0; i < 200; i++) {
    char *out = NULL;
    size_t len;
    if (moe_chat_template_apply(j->t, "[{\"role\": \"user\", \"content\": \"hi\"}]", 1, NOW, &out, &len) ||
        len != strlen(j->want) || memcmp(out, j->want, len))
      j->bad++;
    free(out);
  }
  return NULL;
}

/* A template loaded once (what moe serve does) renders what moe_chat_template_render_config renders,
 * from two threads at once, after its file is gone; without a chat_template it is MOE_ERR_MISSING
 * naming the file. */
TEST(chat_template_loaded_once) {
  char dir[512], path[600];
  test_tmp_path("chat_once", dir, sizeof dir);
  mkdir(dir, 0755); /* or there from an earlier run */
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  const char *cfg = "{\"bos_token\": {\"content\": \"<s>\"}, \"chat_template\": \"{{ bos_token }}{% for m in messages %}"
                    "[{{ m.role }}] {{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}\"}";
  ASSERT_OK(moe_write_file_atomic(path, cfg, strlen(cfg)));
  char *want = NULL;
  ASSERT_OK(moe_chat_template_render_config(dir, "[{\"role\": \"user\", \"content\": \"hi\"}]", 1, NOW, &want, NULL));
  ASSERT(!strcmp(want, "<s>[user] hi[assistant]"));
  moe_chat_template *t;
  ASSERT_OK(moe_chat_template_load(&t, dir));
  ASSERT_EQ_INT(unlink(path), 0);
  apply_job j[2] = {{t, want, 0}, {t, want, 0}};
  pthread_t th;
  ASSERT_EQ_INT(pthread_create(&th, NULL, apply_many, &j[0]), 0);
  apply_many(&j[1]);
  pthread_join(th, NULL);
  moe_chat_template_free(t);
  free(want);
  ASSERT_EQ_INT(j[0].bad + j[1].bad, 0);
  ASSERT_OK(moe_write_file_atomic(path, "{\"eos_token\": \"</s>\"}", 21));
  ASSERT_STATUS(moe_chat_template_load(&t, dir), MOE_ERR_MISSING);
  ASSERT(t == NULL && strstr(moe_last_error(), "tokenizer_config.json: no chat_template"));
  ASSERT_STATUS(moe_chat_template_apply(NULL, "[]", 1, NOW, &want, NULL), MOE_ERR_ARG);
}

/* Bounds: hostile templates end in an error, quickly, naming the bound. */
TEST(chat_template_bounds) {
  static const cj_limits small = {256u << 20, 100000, 10000, 50}, tiny_memory = {1u << 20, 100000, 10000, 50};
  static const struct {
    const char *tmpl, *want;
  } cases[] = {
      {"{% for i in range(100000) %}{% endfor %}", "range of more than 10000 numbers"},
      {"{% for i in range(300) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "more than 100000 steps"},
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "deeper than 50"},
      {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "more than 1048576 bytes"},
      {"{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "more than 10000"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out = NULL;
    const cj_limits *lim = strstr(cases[i].want, "bytes") ? &tiny_memory : &small;
    moe_status st = moe__chat_render(cases[i].tmpl, strlen(cases[i].tmpl), NULL, NOW, lim, &out, NULL);
    if (st != MOE_ERR_VALUE || !strstr(moe_last_error(), cases[i].want))
      FAIL_("%s -> %s: %s (want ...%s...)", cases[i].tmpl, moe_status_name(st), moe_last_error(), cases[i].want);
    ASSERT(out == NULL);
  }
  /* nesting in the parser */
  char deep[2100];
  size_t k = 0;
  k += (size_t)snprintf(deep, sizeof deep, "{{ ");
  for (int i = 0; i < 1000; i++) deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 1000; i++) deep[k++] = ')';
  snprintf(deep + k, sizeof deep - k, " }}");
  char *out = NULL;
  ASSERT_STATUS(moe_chat_template_render(deep, NULL, NOW, &out, NULL), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "nested deeper than 200"));
}

TEST(chat_template_cli) {
  char dir[1024], args[4096], err[1024], outp[512], inp[512];
  snprintf(dir, sizeof dir, "%s/chat", test_fixture_dir());
  test_tmp_path("conv.json", inp, sizeof inp);
  test_tmp_path("chat.txt", outp, sizeof outp);
  FILE *f = fopen(inp, "w");
  ASSERT(f);
  fputs("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]", f);
  fclose(f);
  snprintf(args, sizeof args, "tokenizer template --tokenizer %s/qwen3 --generation-prompt < %s", dir, inp);
  ASSERT_EQ_INT(run_moe(NULL, args, outp, err, sizeof err), 0);
  char *text = test_read_file(outp, NULL);
  ASSERT(text);
  int same = !strcmp(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  if (!same) fprintf(stderr, "  got: %s\n", text);
  free(text);
  ASSERT(same);
  /* a config file given directly; the {"content": ...} form of bos_token (DeepSeek-V3's) */
  snprintf(args, sizeof args, "tokenizer template --tokenizer %s/deepseek_v3/tokenizer_config.json < %s", dir, inp);
  ASSERT_EQ_INT(run_moe(NULL, args, outp, err, sizeof err), 0);
  text = test_read_file(outp, NULL);
  ASSERT(text);
  same = !strcmp(text, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Be brief.<\xef\xbd\x9cUser\xef\xbd\x9c>Hi");
  if (!same) fprintf(stderr, "  got: %s\n", text);
  free(text);
  ASSERT(same);
  /* Llama 2's package ships no chat template */
  snprintf(args, sizeof args, "tokenizer template --tokenizer %s/llama2 < %s", dir, inp);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "no chat_template"));
  snprintf(args, sizeof args, "tokenizer template --tokenizer %s/qwen3 < /dev/null", dir);
  ASSERT(run_moe(NULL, args, NULL, err, sizeof err) != 0);
  ASSERT(strstr(err, "not a JSON list of messages"));
}
