/* moe chat: a conversation in the terminal over a checkpoint's chat template (issue 37). Each line of
 * standard input is a user turn: the conversation so far goes through DIR/tokenizer_config.json's
 * chat_template with the generation prompt, is encoded with its special tokens as tokens, and the
 * library's engine (moe_engine, one slot) answers, printed as it comes; the answer joins the
 * conversation as the assistant's turn. An empty line or the end of input ends the chat. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "lm_data.h"

static const char *CMD = "chat";

static void usage(FILE *f) {
  fprintf(f, "usage: moe chat --checkpoint DIR [--system TEXT] [--max-tokens N] [--temperature T] [--top-p P]\n"
             "                [--seed S] [--threads N]\n"
             "Each line of standard input is your turn; the model's answer follows, through the chat template\n"
             "of DIR/tokenizer_config.json and DIR/tokenizer.json (default: 128 tokens, temperature 0.7, top-p\n"
             "0.95, seed 0; the answer ends at an end-of-text token). An empty line or the end of input ends it.\n");
}

typedef struct {
  const char *ck, *system;
  int max_tokens, threads;
  float temperature, top_p;
  int seed;
} chat_opts;

static int parse(int argc, char **argv, chat_opts *o) {
  *o = (chat_opts){.max_tokens = 128, .temperature = 0.7f, .top_p = 0.95f};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    int ok = 1;
    if (cli_flag_is(f, "checkpoint")) o->ck = v;
    else if (cli_flag_is(f, "system")) o->system = v;
    else if (cli_flag_is(f, "max-tokens")) ok = cli_parse_int(v, &o->max_tokens) && o->max_tokens >= 1;
    else if (cli_flag_is(f, "temperature")) ok = cli_parse_float(v, &o->temperature) && o->temperature >= 0;
    else if (cli_flag_is(f, "top-p")) ok = cli_parse_float(v, &o->top_p) && o->top_p > 0 && o->top_p <= 1;
    else if (cli_flag_is(f, "seed")) ok = cli_parse_int(v, &o->seed) && o->seed >= 0;
    else if (cli_flag_is(f, "threads")) ok = cli_parse_int(v, &o->threads) && o->threads >= 0;
    else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (!ok) return cli_usage_error(CMD, "%s: bad value '%s'", f, v);
  }
  return o->ck ? 0 : cli_usage_error(CMD, "--checkpoint is required");
}

static int add_turn(cJSON *msgs, const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  return m && cJSON_AddItemToArray(msgs, m) && cJSON_AddStringToObject(m, "role", role) &&
         cJSON_AddStringToObject(m, "content", content);
}

/* One answer to the conversation msgs: printed as it comes, its text into *answer (malloc'd). */
static int answer(moe_engine *e, const moe_tokenizer *t, const moe_chat_template *tmpl, const chat_opts *o, cJSON *msgs,
                  int turn, char **out) {
  char *conv = cJSON_PrintUnformatted(msgs), *text = NULL;
  int32_t *ids = NULL;
  size_t len = 0, n = 0;
  int rc = !conv ? cli_usage_error(CMD, "out of memory")
           : moe_chat_template_apply(tmpl, conv, 1, -1, &text, &len) ? cli_fail(CMD)
           : moe_tokenizer_encode_alloc(t, text, len, MOE_TOKENIZER_SPECIAL, &ids, &n) ? cli_fail(CMD) : 0;
  moe_engine_params p = {ids, (int)n, o->max_tokens, o->temperature, o->top_p, (uint64_t)o->seed + (uint64_t)turn,
                         0, NULL, 0, 0, 0, 0};
  moe_engine_req *r = NULL;
  if (!rc && moe_engine_submit(e, &p, &r)) rc = cli_fail(CMD);
  moe_engine_state st = {0};
  size_t shown = 0, k;
  char *piece;
  while (!rc && !st.done) {
    moe_engine_wait(e, r, st.n, &st);
    if (moe_engine_text(e, r, shown, st.text_safe, &piece, &k)) rc = cli_fail(CMD);
    else fwrite(piece, 1, k, stdout), free(piece), shown = st.text_safe;
    fflush(stdout);
  }
  if (!rc && st.done < 0) rc = cli_usage_error(CMD, "%s", st.error);
  *out = NULL;
  if (!rc && moe_engine_text(e, r, 0, st.text_safe, out, &k)) rc = cli_fail(CMD);
  printf("\n");
  moe_engine_release(e, r);
  free(conv), free(text), free(ids);
  return rc;
}

static int chat(const chat_opts *o, moe_lm_t *m, const moe_tokenizer *t, const moe_chat_template *tmpl, const int32_t *eos,
                int n_eos) {
  moe_engine_config ec = {1, t, eos, n_eos, NULL, NULL, NULL};
  moe_engine *e;
  if (moe_engine_new(&e, m, &ec)) return cli_fail(CMD);
  cJSON *msgs = cJSON_CreateArray();
  int rc = !msgs || (o->system && !add_turn(msgs, "system", o->system)) ? cli_usage_error(CMD, "out of memory") : 0;
  char line[65536];
  for (int turn = 0; !rc && fgets(line, sizeof line, stdin); turn++) {
    line[strcspn(line, "\r\n")] = 0;
    if (!line[0]) break;
    char *reply = NULL;
    rc = !add_turn(msgs, "user", line) ? cli_usage_error(CMD, "out of memory") : answer(e, t, tmpl, o, msgs, turn, &reply);
    if (!rc && !add_turn(msgs, "assistant", reply)) rc = cli_usage_error(CMD, "out of memory");
    free(reply);
  }
  cJSON_Delete(msgs);
  moe_engine_free(e);
  return rc;
}

int cmd_chat(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) return usage(stdout), 0;
  chat_opts o;
  if (parse(argc, argv, &o)) return 1;
  moe_lm_config c;
  moe_lm_t m;
  moe_tokenizer *t = NULL;
  moe_chat_template *tmpl = NULL;
  int32_t eos[MOE_LM_MAX_EOS];
  int n_eos = 0;
  char path[4096];
  lm_tokenizer_path(o.ck, path, sizeof path);
  if (moe_lm_read_config(o.ck, &c) || moe_tokenizer_load(&t, path) || moe_chat_template_load(&tmpl, o.ck)) {
    moe_tokenizer_free(t);
    return cli_fail(CMD);
  }
  c.moe.threads = o.threads;
  int rc = 1;
  if (moe_lm_load(&m, o.ck, &c)) cli_fail(CMD);
  else {
    rc = moe_lm_eos_ids(o.ck, t, c.vocab, eos, MOE_LM_MAX_EOS, &n_eos) ? cli_fail(CMD) : chat(&o, &m, t, tmpl, eos, n_eos);
    moe_lm_free(&m);
  }
  moe_chat_template_free(tmpl);
  moe_tokenizer_free(t);
  return rc;
}
