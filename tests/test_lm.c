/* The language model against the PyTorch Mixtral of dev/mixtral_ref.py (tests/fixtures/lm/): a
 * Hugging Face checkpoint directory loaded as it is, then logits, losses and every parameter's
 * gradient compared; and its Hugging Face save and load. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lm_check.h"
#include "run_cli.h"
#include "test.h"

TEST(lm_matches_pytorch_mixtral) { ASSERT(lm_check_case("mixtral")); }
TEST(lm_matches_pytorch_mixtral_tied) { ASSERT(lm_check_case("mixtral_tied")); }

/* Logits (B, T, V) of the fixture's tokens through the model in dir, malloc'd; NULL after printing. */
static float *logits_of(const char *dir, size_t *n) {
  char ref[600];
  snprintf(ref, sizeof ref, "%s/lm/mixtral/ref.safetensors", test_fixture_dir());
  moe_lm_t m;
  moe_st *f = NULL;
  moe_tensor_view tok;
  float *out = NULL;
  if (moe_lm_load(&m, dir, NULL)) {
    fprintf(stderr, "  load %s: %s\n", dir, moe_last_error());
    return NULL;
  }
  moe_lm_stats st;
  if (!moe_st_open(&f, ref) && !moe_st_get(f, "tokens", &tok) &&
      !moe_lm_forward(&m, tok.data, NULL, (int)tok.shape[0], (int)tok.shape[1], &st)) {
    *n = (size_t)tok.shape[0] * tok.shape[1] * m.cfg.vocab;
    out = malloc(*n * 4);
    if (out) memcpy(out, moe_lm_logits(&m), *n * 4);
  } else {
    fprintf(stderr, "  forward %s: %s\n", dir, moe_last_error());
  }
  moe_st_close(f);
  moe_lm_free(&m);
  return out;
}

/* Copies the fixture's config.json into dir (created) and returns the fixture's model file, open. */
static moe_st *fixture_into(const char *dir) {
  char src[600], dst[600];
  mkdir(dir, 0755);
  snprintf(src, sizeof src, "%s/lm/mixtral/config.json", test_fixture_dir());
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  size_t len;
  char *text = test_read_file(src, &len);
  moe_status s = text ? moe_write_file_atomic(dst, text, len) : MOE_ERR_IO;
  free(text);
  snprintf(src, sizeof src, "%s/lm/mixtral/model.safetensors", test_fixture_dir());
  moe_st *f = NULL;
  if (s != MOE_OK || moe_st_open(&f, src) != MOE_OK) return NULL;
  return f;
}

TEST(lm_save_load_is_bit_identical) {
  char src[600], dir[512];
  snprintf(src, sizeof src, "%s/lm/mixtral", test_fixture_dir());
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, src, NULL));
  moe_status s = moe_lm_save(&m, test_tmp_path("lm_saved", dir, sizeof dir));
  moe_lm_free(&m);
  ASSERT_OK(s);
  size_t n1 = 0, n2 = 0;
  float *a = logits_of(src, &n1), *b = logits_of(dir, &n2);
  int same = a && b && n1 == n2 && !memcmp(a, b, n1 * 4);
  free(a), free(b);
  ASSERT(same);
  moe_lm_config c0, c1;
  ASSERT_OK(moe_lm_read_config(src, &c0));
  ASSERT_OK(moe_lm_read_config(dir, &c1));
  ASSERT(!memcmp(&c0, &c1, sizeof c0));
}

/* The fixture split over two shards with an index, its norms stored as F16 and its experts as BF16:
 * the same logits as the F32 file, to the rounding of those tensors. */
TEST(lm_loads_shards_bf16_f16) {
  char dir[512], path[600];
  moe_st *f = fixture_into(test_tmp_path("lm_shards", dir, sizeof dir));
  ASSERT(f);
  moe_st_writer *w[2];
  ASSERT_OK(moe_st_writer_new(&w[0]));
  ASSERT_OK(moe_st_writer_new(&w[1]));
  char *index = malloc(1 << 16);
  size_t at = (size_t)snprintf(index, 1 << 16, "{\"metadata\": {}, \"weight_map\": {");
  for (int i = 0; i < moe_st_count(f); i++) {
    moe_tensor_view v;
    ASSERT_OK(moe_st_at(f, i, &v));
    int shard = i % 2;
    size_t n = v.nbytes / 4;
    if (strstr(v.name, "norm")) {
      _Float16 *h = malloc(n * 2);
      for (size_t j = 0; j < n; j++) h[j] = (_Float16)((const float *)v.data)[j];
      ASSERT_OK(moe_st_writer_add(w[shard], v.name, MOE_DT_F16, v.ndim, v.shape, h));
      free(h);
    } else {
      ASSERT_OK(moe_st_writer_add_f32(w[shard], v.name, strstr(v.name, "experts") ? MOE_DT_BF16 : MOE_DT_F32, v.ndim,
                                      v.shape, v.data));
    }
    at += (size_t)snprintf(index + at, (1 << 16) - at, "%s\"%s\": \"part%d.safetensors\"", i ? ", " : "", v.name,
                           shard);
  }
  snprintf(index + at, (1 << 16) - at, "}}");
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/part%d.safetensors", dir, s);
    ASSERT_OK(moe_st_writer_save(w[s], path));
    moe_st_writer_free(w[s]);
  }
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  ASSERT_OK(moe_write_file_atomic(path, index, strlen(index)));
  free(index);
  moe_st_close(f);
  char src[600];
  snprintf(src, sizeof src, "%s/lm/mixtral", test_fixture_dir());
  size_t n1 = 0, n2 = 0;
  float *a = logits_of(src, &n1), *b = logits_of(dir, &n2);
  ASSERT(a && b);
  double worst = 0;
  for (size_t i = 0; i < n1; i++) worst = fmax(worst, fabs(a[i] - b[i]));
  free(a), free(b);
  fprintf(stderr, "  logits from bf16 experts and f16 norms: max diff %.3g\n", worst);
  ASSERT(n1 == n2 && worst > 0 && worst < 0.05);
}

/* Writes the fixture into dir with tensor `drop` left out or `bad` stored with its dimensions swapped. */
static int write_broken(const char *dir, const char *drop, const char *bad) {
  moe_st *f = fixture_into(dir);
  moe_st_writer *w;
  if (!f || moe_st_writer_new(&w)) return 0;
  for (int i = 0; i < moe_st_count(f); i++) {
    moe_tensor_view v;
    moe_st_at(f, i, &v);
    if (!strcmp(v.name, drop)) continue;
    int64_t shape[2] = {v.shape[v.ndim - 1], v.shape[0]};
    moe_st_writer_add(w, v.name, v.dtype, v.ndim, !strcmp(v.name, bad) && v.ndim == 2 ? shape : v.shape, v.data);
  }
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int ok = moe_st_writer_save(w, path) == MOE_OK;
  moe_st_writer_free(w);
  moe_st_close(f);
  return ok;
}

TEST(lm_load_names_missing_and_misshaped_tensors) {
  char dir[512];
  moe_lm_t m;
  const char *gone = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  ASSERT(write_broken(test_tmp_path("lm_missing", dir, sizeof dir), gone, ""));
  ASSERT_STATUS(moe_lm_load(&m, dir, NULL), MOE_ERR_MISSING);
  ASSERT(strstr(moe_last_error(), gone));
  const char *bad = "model.layers.0.self_attn.k_proj.weight"; /* (16, 32) stored as (32, 16) */
  ASSERT(write_broken(test_tmp_path("lm_misshaped", dir, sizeof dir), "", bad));
  ASSERT_STATUS(moe_lm_load(&m, dir, NULL), MOE_ERR_SHAPE);
  fprintf(stderr, "  %s\n", moe_last_error());
  ASSERT(strstr(moe_last_error(), bad) && strstr(moe_last_error(), "16") && strstr(moe_last_error(), "32"));
}

/* The fixture's logits position by position through the KV cache: the prompt's 5 tokens at once,
 * then 1 and 2 more, against one forward of all 8 (to rounding: other GEMM shapes). */
TEST(lm_kv_cache_decode_matches_full_forward) {
  char dir[512], path[600];
  moe_lm_t m;
  moe_st *ref = NULL;
  moe_tensor_view tok;
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("mixtral", dir, sizeof dir), NULL));
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  ASSERT_OK(moe_st_open(&ref, path));
  ASSERT_OK(moe_st_get(ref, "tokens", &tok));
  enum { B = 2, T = 8 };
  int V = m.cfg.vocab;
  const int32_t *t = tok.data;
  static float full[B * T * 64];
  ASSERT(V == 64 && tok.shape[0] == B && tok.shape[1] == T);
  ASSERT_OK(moe_lm_forward(&m, t, NULL, B, T, NULL));
  memcpy(full, moe_lm_logits(&m), sizeof full);
  moe_lm_cache *kv;
  ASSERT_OK(moe_lm_cache_new(&kv, &m, B));
  const int steps[3][2] = {{0, 5}, {5, 1}, {6, 2}}; /* positions [p, p + n) */
  double worst = 0;
  for (int s = 0; s < 3; s++) {
    int p = steps[s][0], n = steps[s][1];
    int32_t in[B * 5];
    for (int b = 0; b < B; b++) memcpy(in + b * n, t + b * T + p, (size_t)n * 4);
    moe_status st = moe_lm_decode(&m, kv, in, n);
    if (st) FAIL_("decode: %s", moe_last_error());
    for (int b = 0; b < B; b++)
      for (int i = 0; i < n * V; i++)
        worst = fmax(worst, fabs(moe_lm_logits(&m)[(size_t)b * n * V + i] - full[((size_t)b * T + p) * V + i]));
  }
  ASSERT_EQ_INT(moe_lm_cache_len(kv), T);
  ASSERT_STATUS(moe_lm_decode(&m, kv, t, 64 - T + 1), MOE_ERR_ARG); /* past max_seq = 64 */
  moe_lm_cache_free(kv);
  moe_st_close(ref);
  moe_lm_free(&m);
  fprintf(stderr, "  cached decoding against the full forward: max logit diff %.3g\n", worst);
  ASSERT(worst < 1e-5);
}

TEST(lm_sample_greedy_top_p_and_seeded) {
  float lg[5] = {1, 3, 2, 3, -1};
  uint64_t rng = 1;
  int32_t tk;
  ASSERT_OK(moe_lm_sample(lg, 5, 0, 1, &rng, &tk));
  ASSERT_EQ_INT(tk, 1); /* the argmax, ties to the lower id */
  ASSERT_OK(moe_lm_sample(lg, 5, 1, 1e-6f, &rng, &tk));
  ASSERT_EQ_INT(tk, 1); /* a tiny nucleus holds the first most probable token only */
  /* temperature 1, top-p 1: frequencies follow softmax; top-p 0.8 keeps ids 1, 3, 2 (mass 0.82) */
  int count[5] = {0}, cut[5] = {0}, n = 20000;
  for (int i = 0; i < n; i++) {
    ASSERT_OK(moe_lm_sample(lg, 5, 1, 1, &rng, &tk));
    count[tk]++;
    ASSERT_OK(moe_lm_sample(lg, 5, 1, 0.8f, &rng, &tk));
    cut[tk]++;
  }
  double z = 0;
  for (int i = 0; i < 5; i++) z += exp(lg[i]);
  for (int i = 0; i < 5; i++) ASSERT_NEAR(count[i] / (double)n, exp(lg[i]) / z, 0.015);
  ASSERT(cut[0] == 0 && cut[4] == 0);
  ASSERT_NEAR(cut[2] / (double)n, exp(2) / (2 * exp(3) + exp(2)), 0.015);
  uint64_t a = 9, b = 9;
  int32_t ta, tb;
  for (int i = 0; i < 50; i++) {
    ASSERT_OK(moe_lm_sample(lg, 5, 0.7f, 0.9f, &a, &ta));
    ASSERT_OK(moe_lm_sample(lg, 5, 0.7f, 0.9f, &b, &tb));
    ASSERT_EQ_INT(ta, tb);
  }
  ASSERT_STATUS(moe_lm_sample(lg, 5, 1, 0, &rng, &tk), MOE_ERR_ARG);
}

/* moe generate on the fixture: the same seed gives the same tokens; greedy (temperature 0) gives the
 * argmax chain of full forwards without a cache; bad ids and a prompt past the context are errors. */
TEST(lm_generate_cli_reproducible_and_greedy) {
  char dir[512], args[1200], out1[512], out2[512], err[512];
  lm_case_dir("mixtral", dir, sizeof dir);
  test_tmp_path("gen1.txt", out1, sizeof out1);
  test_tmp_path("gen2.txt", out2, sizeof out2);
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 9 1' --max-tokens 12 --temperature 0.8 "
           "--top-p 0.9 --seed 3", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out1, err, sizeof err), 0);
  ASSERT_EQ_INT(run_moe(NULL, args, out2, err, sizeof err), 0);
  ASSERT(test_same_file(out1, out2));
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5,9,1' --max-tokens 6 --temperature 0", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out1, err, sizeof err), 0);
  char text[256];
  test_read_text(out1, text, sizeof text);
  moe_lm_t m;
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  int32_t seq[9] = {5, 9, 1};
  char want[256] = "";
  size_t at = 0;
  for (int n = 3; n < 9; n++) {
    moe_status st = moe_lm_forward(&m, seq, NULL, 1, n, NULL);
    if (st) FAIL_("forward: %s", moe_last_error());
    uint64_t rng = 0;
    moe_lm_sample(moe_lm_logits(&m) + (size_t)(n - 1) * m.cfg.vocab, m.cfg.vocab, 0, 1, &rng, &seq[n]);
    at += (size_t)snprintf(want + at, sizeof want - at, "%s%d", n > 3 ? " " : "", seq[n]);
  }
  moe_lm_free(&m);
  snprintf(want + at, sizeof want - at, "\n");
  if (strcmp(text, want)) FAIL_("greedy generate printed '%s', the full forwards give '%s'", text, want);
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids '5 64'", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "'64' is not a token id in [0, 64)"));
  snprintf(args, sizeof args, "generate --checkpoint %s --prompt-ids 1 --max-tokens 64", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "exceed the model's context of 64"));
}

/* Plain SGD on one batch of 2 x 80 tokens (two query blocks of attention), a periodic sequence:
 * the loss must fall far, through every kind of parameter. Seeded, so the numbers are fixed. */
TEST(lm_sgd_fits_a_batch) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 24, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8, c.max_seq = 80;
  c.moe.D = 32, c.moe.H = 32, c.moe.E = 4, c.moe.top_k = 2, c.aux_coef = 0.01f, c.moe.threads = 2;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 5);
  enum { B = 2, T = 80 };
  int32_t tok[B * T + 1];
  for (int i = 0; i <= B * T; i++) tok[i] = (int32_t)((i * 7 + i / 5) % 23);
  double first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    moe_lm_stats st;
    moe_lm_zero_grad(&m);
    moe_status s = moe_lm_forward(&m, tok, tok + 1, B, T, &st);
    if (s == MOE_OK) s = moe_lm_backward(&m);
    if (s) FAIL_("step %d: %s", step, moe_last_error());
    if (step == 0) first = st.ce;
    last = st.ce;
    for (int i = 0; i < m.nrefs; i++) /* lr 0.5: at 1.0 the path is chaotic, a rounding change moves it */
      for (size_t j = 0; j < m.refs[i].numel; j++) m.refs[i].data[j] -= 0.5f * m.refs[i].grad[j];
    moe_lm_params_changed(&m);
  }
  moe_lm_free(&m);
  fprintf(stderr, "  cross-entropy %.4f -> %.4f after 40 SGD steps\n", first, last);
  ASSERT(first > 3.0 && last < 0.5 * first);
}

/* The Mixtral fixture with config.json's `field` set to the JSON `value` (its weights linked), in dir. */
static int patched_fixture(const char *field, const char *value, char *dir, size_t n) {
  static int made;
  char src[700], dst[700], name[96];
  snprintf(name, sizeof name, "lm_patched_%d", made++);
  test_tmp_path(name, dir, n);
  snprintf(src, sizeof src, "%s/lm/mixtral/config.json", test_fixture_dir());
  char *text = test_read_file(src, NULL);
  cJSON *c = text ? cJSON_Parse(text) : NULL, *v = cJSON_Parse(value);
  free(text);
  cJSON_DeleteItemFromObjectCaseSensitive(c, field);
  int ok = c && v && mkdir(dir, 0755) == 0 && cJSON_AddItemToObject(c, field, v);
  if (!ok) cJSON_Delete(v);
  char *out = ok ? cJSON_Print(c) : NULL;
  cJSON_Delete(c);
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  ok = out && moe_write_file_atomic(dst, out, strlen(out)) == MOE_OK;
  free(out);
  snprintf(src, sizeof src, "%s/lm/mixtral/model.safetensors", test_fixture_dir());
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  return ok && symlink(src, dst) == 0;
}

/* Sizes in config.json that the weights do not have, and an eos_token_id that is not a token id (or a
 * list of at most 8), are errors naming the field and value before anything of their size is
 * allocated, and max_position_embeddings costs only the positions used: each under a 1 GB address space
 * (not under AddressSanitizer, which reserves terabytes). */
TEST(lm_config_sizes_checked_against_tensors_in_bounded_memory) {
  static const char *const cases[][3] = {
      {"num_local_experts", "65536", "\"num_local_experts\" is 65536, but tensor"},
      {"intermediate_size", "1000000", "\"intermediate_size\" is 1000000, but tensor"},
      {"hidden_size", "1000000000", "\"hidden_size\" is 1000000000, but tensor"},
      {"num_hidden_layers", "1000", "\"num_hidden_layers\" 1000 and \"num_local_experts\" 4 ask for tensor"},
      {"max_position_embeddings", "1000000000", NULL},
      {"max_position_embeddings", "20000000", NULL},
      {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "\"rope_scaling\" of type linear is not supported"},
      {"sliding_window", "0", "\"sliding_window\" must be a positive integer"},
      {"eos_token_id", "64", "\"eos_token_id\" 64 is not a token id in [0, 64) or a list of them"},
      {"eos_token_id", "[1, \"2\"]", "\"eos_token_id\" [1,\"2\"] is not a token id"},
      {"eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]",
       "\"eos_token_id\": more than the 16 end ids there is room for"},
  };
#if defined(__SANITIZE_ADDRESS__)
  const char *limit = NULL;
#else
  const char *limit = "ulimit -v 1000000;";
#endif
  char dir[512], args[1024], err[1024], out[512], want[64] = "";
  test_tmp_path("lm_patched.out", out, sizeof out);
  snprintf(args, sizeof args, "generate --checkpoint '%s/lm/mixtral' --prompt-ids '1 2 3' --max-tokens 2 --threads 1",
           test_fixture_dir());
  ASSERT(run_moe(limit, args, out, err, sizeof err) == 0);
  test_read_text(out, want, sizeof want);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ASSERT(patched_fixture(cases[i][0], cases[i][1], dir, sizeof dir));
    snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt-ids '1 2 3' --max-tokens 2 --threads 1", dir);
    int rc = run_moe(limit, args, out, err, sizeof err);
    char got[64] = "";
    test_read_text(out, got, sizeof got);
    if (cases[i][2] ? rc != 1 || !strstr(err, cases[i][2]) : rc != 0 || strcmp(got, want))
      FAIL_("%s %s -> %d: %s%s (want %s)", cases[i][0], cases[i][1], rc, err, got, cases[i][2] ? cases[i][2] : want);
  }
}
