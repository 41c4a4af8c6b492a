/* moe serve under a real HTTP client (tests/serve_client.py: Python's http.client and raw sockets) on
 * a loopback port the kernel picks: a request alone gives moe generate's tokens and text for the same
 * seed, streamed or not, with every expert resident or through the expert cache; greedy requests give
 * the same tokens alone and in a busy batch; generation stops at the end of text unless ignore_eos, and
 * at stop strings; the
 * metrics count what the server did; bad requests, and OpenAI fields the server does not implement
 * unless turned off, get a 4xx with a JSON error naming them, and a client
 * leaving mid-stream or 1,000 connections at once do not stop it; past --max-connections /health still
 * answers and the rest get 503, idle connections close after --timeout; SIGTERM finishes the requests
 * under way and exits 0, not waiting for a body that never comes. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>

#include "run_cli.h"
#include "test.h"

#define PYTHON "/usr/bin/python3" /* Debian's, as tests/test_python.c: no version manager's shim to start */

/* A random model (vocab: a byte-level BPE tokenizer trained on a few sentences) saved once with its
 * tokenizer.json; NULL after printing when it cannot be made. */
static const char *checkpoint(void) {
  static char dir[512];
  static int state; /* 0 not yet, 1 made, -1 failed */
  if (state) return state > 0 ? dir : NULL;
  state = -1;
  const char *text = "the cat sat on the mat. experts route every token to two of four experts. "
                     "a dog ran to the park. caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac.";
  moe_tokenizer *t;
  char path[600];
  moe_lm_config c;
  moe_lm_t m;
  test_tmp_path("serve_lm", dir, sizeof dir);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (moe_tokenizer_train(&t, text, strlen(text), 300)) return fprintf(stderr, "  tokenizer: %s\n", moe_last_error()), NULL;
  moe_lm_config_default(&c);
  c.vocab = moe_tokenizer_vocab_size(t);
  c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.max_seq = 64;
  c.moe.D = 32, c.moe.H = 32, c.moe.E = 4, c.moe.threads = 1;
  int ok = moe_lm_init(&m, &c) == MOE_OK;
  if (ok) {
    moe_lm_init_params(&m, 5);
    ok = moe_lm_save(&m, dir) == MOE_OK && moe_tokenizer_save(t, path) == MOE_OK;
    moe_lm_free(&m);
  }
  moe_tokenizer_free(t);
  if (!ok) return fprintf(stderr, "  checkpoint: %s\n", moe_last_error()), NULL;
  state = 1;
  return dir;
}

/* Runs a scenario of serve_client.py against checkpoint ck (extra: more serve flags); 1 when it passed,
 * after printing its report (a scenario that cannot run here exits 77: a skip, and 1). */
static int scenario_on(const char *ck, const char *name, const char *extra) {
  char cmd[2048], log[512];
  test_tmp_path("serve_client.log", log, sizeof log);
  snprintf(cmd, sizeof cmd, PYTHON " '%s/../serve_client.py' '%s' '%s' %s %s >'%s' 2>&1", test_fixture_dir(), MOE_CLI,
           ck, name, extra, log);
  int rc = system(cmd);
  char *out = test_read_file(log, NULL);
  fprintf(stderr, "%s", out ? out : "  (no output)\n");
  free(out);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    test_skip("scenario %s cannot run here (above)", name);
    return 1;
  }
  return rc == 0;
}

/* The same on the checkpoint above. */
static int scenario(const char *name, const char *extra) {
  const char *ck = checkpoint();
  return ck && scenario_on(ck, name, extra);
}

static int have_python(void) {
  if (system(PYTHON " -c 'import http.client' >/dev/null 2>&1") == 0) return 1;
  test_skip(PYTHON " not found");
  return 0;
}

TEST(serve_matches_generate) {
  if (!have_python()) return;
  ASSERT(scenario("match", ""));
}

/* One expert of four resident per layer; the trace of the experts used loads as moe trace's do; then
 * streamed under a budget placed and pinned from that trace (/metrics: the slots and pins per layer). */
TEST(serve_matches_generate_with_expert_cache) {
  if (!have_python()) return;
  char trace[512], extra[1400];
  test_tmp_path("serve_trace.csv", trace, sizeof trace);
  snprintf(extra, sizeof extra, "--cache 1 --policy lru --trace '%s'", trace);
  ASSERT(scenario("match", extra));
  moe_trace t;
  ASSERT_OK(moe_trace_load(&t, trace, 4));
  ASSERT(t.steps > 10 && t.layers == 2);
  for (int64_t s = 0; s < t.steps; s++) { /* each step routes its tokens to top-2 experts, in each layer */
    int per[2] = {0, 0};
    for (int l = 0; l < 2; l++)
      for (int e = 0; e < 4; e++) per[l] += t.tokens[(s * 2 + l) * 4 + e];
    if (per[0] != per[1] || per[0] % 2 || !per[0]) FAIL_("trace step %lld: %d and %d tokens", (long long)s, per[0], per[1]);
  }
  moe_trace_free(&t);
  /* that trace places 4 slots (3 x 32 x 32 fp32 values each) by its simulated misses and pins from it */
  snprintf(extra, sizeof extra, "--memory-budget 48K --placement miss-cost --placement-trace '%s' --pin-from '%s' --pin 1",
           trace, trace);
  ASSERT(scenario("match", extra));
}

/* moe serve --cache 1 (expert buffering, moe_lm_buffer_experts) on every family's fixture: token-id
 * requests, greedy and sampled, give moe generate's tokens with every expert resident, and fewer expert
 * bytes are resident than the model's. */
TEST(serve_expert_cache_every_family) {
  if (!have_python()) return;
  static const char *const fam[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v2_lite",
                                    "deepseek_v3", "gpt_oss", "gpt_oss_mxfp4"};
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lm/%s", test_fixture_dir(), fam[i]);
    if (!scenario_on(dir, "ids", "--cache 1 --policy lru")) FAIL_("%s: serve --cache 1 differs (above)", fam[i]);
  }
}

/* /metrics counts resident quantized experts in the bytes they are held in: a gpt-oss GGUF file of MXFP4
 * experts and F32 biases (its experts bound in MXFP4) has the bytes of the file's expert tensors, not
 * their fp32 size (about 7 times more). */
TEST(serve_metrics_count_quantized_experts_as_held) {
  if (!have_python()) return;
  char dir[512], path[512], want[64];
  snprintf(dir, sizeof dir, "%s/lm/gpt_oss_mxfp4", test_fixture_dir());
  test_tmp_path("serve_oss.gguf", path, sizeof path);
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(dir, &c));
  c.moe.swiglu_limit = 7.0f; /* llama.cpp's: the file cannot say the fixture's */
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, dir, &c));
  moe_lm_gguf_options o = {MOE_GGUF_MXFP4, NULL, NULL};
  moe_status st = moe_lm_save_gguf(&m, path, &o);
  moe_lm_free(&m);
  ASSERT_OK(st);
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, path));
  size_t bytes = 0, fp32 = 0;
  for (int64_t i = 0; i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    if (moe_gguf_tensor_at(g, i, &t) == MOE_OK && strstr(t.name, "_exps."))
      bytes += t.nbytes, fp32 += (size_t)(t.ne[0] * t.ne[1] * t.ne[2]) * 4;
  }
  moe_gguf_close(g);
  ASSERT(bytes > 0 && fp32 > 5 * bytes);
  snprintf(want, sizeof want, "%zu", bytes);
  setenv("MOE_WANT_EXPERT_BYTES", want, 1);
  int ok = scenario_on(path, "expert_bytes", "");
  unsetenv("MOE_WANT_EXPERT_BYTES");
  ASSERT(ok);
}

/* On a copy of the checkpoint whose eos_token_id is a token greedy decoding reaches: requests stop
 * there (finish_reason "stop", the token not returned), streamed or not, as moe generate does, and go
 * on to max_tokens with ignore_eos ("length"). */
TEST(serve_stops_at_end_of_text) {
  if (!have_python()) return;
  ASSERT(scenario("eos", ""));
}

/* Stop strings, one or several, found or not, streamed or not (the stream holds back text that may
 * begin one): the text ends where the first found starts. */
/* POST /v1/chat/completions: the messages through the checkpoint's chat template answer what a
 * completion of the rendered text answers (streamed as chat chunks or not), GET /v1/models, and bad
 * messages get 400s naming them (serve_client.py chat). */
TEST(serve_chat_completions_through_the_template) {
  if (!have_python()) return;
  ASSERT(scenario("chat", ""));
}

TEST(serve_stop_strings) {
  if (!have_python()) return;
  ASSERT(scenario("stop", ""));
}

/* Three requests of known prompt and token counts one after another, and a refused one: the requests
 * by status, tokens, decode steps and their batch sizes, latencies' counts, gauges and expert bytes. */
TEST(serve_metrics_count_what_the_server_did) {
  if (!have_python()) return;
  ASSERT(scenario("metrics", ""));
}

TEST(serve_greedy_same_alone_and_in_busy_batch) {
  if (!have_python()) return;
  ASSERT(scenario("busy", ""));
}

TEST(serve_bad_requests_disconnects_and_1000_connections) {
  if (!have_python()) return;
  ASSERT(scenario("bad", ""));
}

TEST(serve_sigterm_finishes_requests_under_way) {
  if (!have_python()) return;
  ASSERT(scenario("sigterm", ""));
}

/* 5 idle connections on a server of 4: /health 200, a completion 503, the idle ones closed by the
 * timeout, then a completion served. */
TEST(serve_full_answers_health_and_closes_idle_connections) {
  if (!have_python()) return;
  ASSERT(scenario("full", "--max-connections 4 --timeout 2"));
}

/* A request whose headers came and whose body never does: SIGTERM's drain ends after the timeout. */
TEST(serve_sigterm_does_not_wait_for_a_missing_body) {
  if (!have_python()) return;
  ASSERT(scenario("drain", "--timeout 2"));
}

/* It listens before the model loads: /health 503 "loading" and every other request a 503 until it is
 * ready (the load held by a file lease on the tokenizer), then serves as usual. */
TEST(serve_answers_503_while_loading) {
  if (!have_python()) return;
  ASSERT(scenario("loading", ""));
}

/* Logprobs' tokens with a SentencePiece tokenizer (Llama 2's, from scripts/get-tokenizers.sh): the text
 * each token adds, not its raw piece, and the offsets of that text; chat's bytes. */
TEST(serve_logprobs_token_text_sentencepiece) {
  if (!have_python()) return;
  char src[600], dir[512], path[700], cmd[2048];
  snprintf(src, sizeof src, "%s/../../data/tokenizers/llama2", test_fixture_dir());
  snprintf(path, sizeof path, "%s/tokenizer.json", src);
  if (access(path, R_OK)) SKIP("no data/tokenizers/llama2 (scripts/get-tokenizers.sh fetches it)");
  moe_lm_config c;
  moe_lm_t m;
  moe_lm_config_default(&c);
  c.vocab = 32000, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 8, c.max_seq = 64;
  c.moe.D = 16, c.moe.H = 16, c.moe.E = 4, c.moe.threads = 1;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 7);
  ASSERT_OK(moe_lm_save(&m, test_tmp_path("serve_llama2", dir, sizeof dir)));
  moe_lm_free(&m);
  snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'", src, src, dir);
  ASSERT_EQ_INT(system(cmd), 0);
  ASSERT(scenario_on(dir, "pieces", ""));
}

/* Flags the server cannot serve with: an error naming the value, exit 1, before listening. */
TEST(serve_cli_errors) {
  char args[1024], err[512], fx[600];
  snprintf(fx, sizeof fx, "%s/lm/mixtral", test_fixture_dir());
  static const char *const cases[][2] = {
      {"--host localhost", "--host: 'localhost' is not an IPv4 address"},
      {"--cache 9 --port 0", "K must be in [1, E=4], got 9"},
      {"--policy belady --cache 2", "--policy: bad value 'belady'"},
      {"--policy fifo", "--policy needs --cache K or --memory-budget"},
      {"--cache 2 --memory-budget 1G", "--cache K and --memory-budget: one or the other"},
      {"--memory-budget 1K", "below one expert per MoE layer"},
      {"--max-batch 0", "--max-batch: bad value '0'"},
      {"--timeout 0", "--timeout: bad value '0'"},
      {"--max-connections 0", "--max-connections: bad value '0'"},
      {"--context 0", "--context: bad value '0'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(args, sizeof args, "serve --checkpoint '%s' %s", fx, cases[i][0]);
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    if (rc != 1 || !strstr(err, cases[i][1])) FAIL_("moe %s -> %d: %s (want '%s')", args, rc, err, cases[i][1]);
  }
}
