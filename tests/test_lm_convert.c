/* moe_lm_convert (moe convert): the experts streamed from the checkpoint at save give the very
 * bytes moe_lm_save_gguf (each family, each of F32, Q8_0 and Q4_K, a directory and a GGUF file as
 * source; gpt-oss's fused experts, plain and MXFP4, with their biases) and moe_lm_save (GGUF files back
 * to directories, gpt-oss's directories to fused F32 ones) write from the whole model in memory; the
 * peak resident memory of a conversion either way stays under the dense weights and a few tensors, well
 * below the experts; a corrupt expert tensor is an error that names it, through the CLI too, and leaves
 * no file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm_check.h"
#include "run_cli.h"
#include "test.h"

/* The file at path, malloc'd (its size in *n); NULL on failure. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *b = NULL;
  long len = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1)) && fread(b, 1, (size_t)len, f) != (size_t)len)
    free(b), b = NULL;
  if (f) fclose(f);
  *n = len > 0 ? (size_t)len : 0;
  return b;
}

/* Whether the files a and b hold the same bytes; prints their sizes or the first byte that differs. */
static int same_file(const char *what, const char *a, const char *b) {
  size_t na, nb, i = 0;
  unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
  int same = x && y && na == nb && !memcmp(x, y, na);
  while (x && y && !same && i < na && i < nb && x[i] == y[i]) i++;
  if (!same) fprintf(stderr, "  %s: %s (%zu bytes) and %s (%zu bytes) differ first at byte %zu\n", what, a, na, b, nb, i);
  free(x), free(y);
  return same;
}

/* src converted streamed and, from the model loaded whole (every weight fp32), by moe_lm_save_gguf (type
 * t) or, to_dir, moe_lm_save: the same bytes (a directory's model.safetensors and config.json). */
static int same_as_in_memory(const char *src, const char *tag, moe_gguf_type t, int to_dir) {
  char streamed[512], whole[512], name[96];
  snprintf(name, sizeof name, to_dir ? "convert_%s_streamed" : "convert_%s_streamed.gguf", tag);
  test_tmp_path(name, streamed, sizeof streamed);
  snprintf(name, sizeof name, to_dir ? "convert_%s_whole" : "convert_%s_whole.gguf", tag);
  test_tmp_path(name, whole, sizeof whole);
  moe_lm_gguf_options o = {t, NULL, NULL};
  size_t numel = 0;
  moe_lm_config c;
  moe_lm_t m;
  if (moe_lm_convert(src, streamed, &o, &numel) != MOE_OK || moe_lm_read_config(src, &c) != MOE_OK) {
    fprintf(stderr, "  %s: %s\n", tag, moe_last_error());
    return 0;
  }
  c.moe.expert_type = -1;
  if (moe_lm_load(&m, src, &c) != MOE_OK) return fprintf(stderr, "  %s: %s\n", tag, moe_last_error()), 0;
  moe_status st = to_dir ? moe_lm_save(&m, whole) : moe_lm_save_gguf(&m, whole, &o);
  size_t want = m.numel;
  moe_lm_free(&m);
  if (st != MOE_OK) return fprintf(stderr, "  %s: %s\n", tag, moe_last_error()), 0;
  if (numel != want) return fprintf(stderr, "  %s: %zu parameters, the model has %zu\n", tag, numel, want), 0;
  if (!to_dir) return same_file(tag, streamed, whole);
  int same = 1;
  static const char *const files[2] = {"model.safetensors", "config.json"};
  for (int k = 0; k < 2; k++) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s", streamed, files[k]);
    snprintf(b, sizeof b, "%s/%s", whole, files[k]);
    same &= same_file(tag, a, b);
  }
  return same;
}

/* The fixture case's checkpoint with every tensor stored BF16 (rounded), in a new directory dir. */
static int bf16_copy(const char *fixture, char *dir, size_t n) {
  char src[512], path[1024];
  moe_st *f = NULL;
  moe_st_writer *w = NULL;
  snprintf(path, sizeof path, "%s/model.safetensors", lm_case_dir(fixture, src, sizeof src));
  int ok = lm_copy_fixture(fixture, test_tmp_path("convert_bf16", dir, n)) && moe_st_open(&f, path) == MOE_OK &&
           moe_st_writer_new(&w) == MOE_OK;
  for (int i = 0; ok && i < moe_st_count(f); i++) {
    moe_tensor_view v;
    ok = moe_st_at(f, i, &v) == MOE_OK && v.dtype == MOE_DT_F32 &&
         moe_st_writer_add_f32(w, v.name, MOE_DT_BF16, v.ndim, v.shape, v.data) == MOE_OK;
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  ok = ok && moe_st_writer_save(w, path) == MOE_OK;
  moe_st_writer_free(w);
  moe_st_close(f);
  return ok;
}

/* Each family once (Mixtral's per-expert w1/w2/w3, Qwen's gate_proj with a shared expert, DeepSeek's
 * leading dense layer, gpt-oss's fused gate_up_proj and its MXFP4 blocks, with biases), each type once,
 * BF16 tensors (widened as read), and a GGUF file's stacks dequantized; Q4_K also on a model of
 * rows of 256 (whole Q4_K blocks: the fixtures' rows are shorter, Q8_0 by the fallback). */
TEST(lm_convert_streamed_is_moe_lm_save_gguf_byte_for_byte) {
  static const struct {
    const char *fixture;
    moe_gguf_type t;
  } cases[] = {{"mixtral", MOE_GGUF_F32},     {"qwen2_moe", MOE_GGUF_Q8_0}, {"qwen3_moe", MOE_GGUF_Q4_K},
               {"olmoe", MOE_GGUF_Q8_0},      {"deepseek_v2_lite", MOE_GGUF_F32}};
  char dir[512];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    if (!same_as_in_memory(lm_case_dir(cases[k].fixture, dir, sizeof dir), cases[k].fixture, cases[k].t, 0))
      FAIL_("%s as %s: the streamed file is not moe_lm_save_gguf's", cases[k].fixture, moe_gguf_type_name(cases[k].t));
  ASSERT(bf16_copy("mixtral", dir, sizeof dir));
  if (!same_as_in_memory(dir, "mixtral_bf16", MOE_GGUF_Q8_0, 0)) FAIL_("mixtral in BF16 as Q8_0: the streamed file is not moe_lm_save_gguf's");
  static const char *const oss[2] = {"gpt_oss", "gpt_oss_mxfp4"}; /* with llama.cpp's swiglu limit, which GGUF says */
  for (int k = 0; k < 2; k++) {
    ASSERT(lm_patched(oss[k], "swiglu_limit", "7", NULL, dir, sizeof dir));
    if (!same_as_in_memory(dir, oss[k], k ? MOE_GGUF_MXFP4 : MOE_GGUF_Q8_0, 0))
      FAIL_("%s: the streamed file is not moe_lm_save_gguf's", oss[k]);
  }
  char gguf[512];
  snprintf(gguf, sizeof gguf, "%s/gguf_lm/olmoe.gguf", test_fixture_dir());
  if (!same_as_in_memory(gguf, "olmoe_gguf", MOE_GGUF_Q8_0, 0))
    FAIL_("%s as Q8_0: the streamed file is not moe_lm_save_gguf's", gguf);
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.max_seq = 32;
  c.moe.D = 256, c.moe.H = 256, c.moe.E = 4, c.moe.top_k = 2;
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 7);
  moe_status st = moe_lm_save(&m, test_tmp_path("convert_q4_k", dir, sizeof dir));
  moe_lm_free(&m);
  ASSERT_OK(st);
  if (!same_as_in_memory(dir, "q4_k", MOE_GGUF_Q4_K, 0)) FAIL_("rows of 256 as Q4_K: the streamed file is not moe_lm_save_gguf's");
}

/* GGUF files back to directories, streamed: moe_lm_save's files of the loaded model, byte for byte
 * (llama.cpp's converter's files of Mixtral (its q and k rows put back) and DeepSeek-V2-Lite, and
 * libmoe's Q8_0 file of Qwen3-MoE and MXFP4 file of gpt-oss (its biases F32), dequantized); and gpt-oss's
 * directories, plain and MXFP4, to fused F32 ones. */
TEST(lm_convert_gguf_to_directory_is_moe_lm_save_byte_for_byte) {
  char gguf[512];
  static const char *const files[] = {"mixtral", "deepseek_v2_lite"};
  for (int k = 0; k < 2; k++) {
    snprintf(gguf, sizeof gguf, "%s/gguf_lm/%s.gguf", test_fixture_dir(), files[k]);
    if (!same_as_in_memory(gguf, files[k], MOE_GGUF_F32, 1)) FAIL_("%s: the streamed directory is not moe_lm_save's", gguf);
  }
  char dir[512];
  moe_lm_gguf_options o = {MOE_GGUF_Q8_0, NULL, NULL};
  test_tmp_path("convert_qwen3_q8_0.gguf", gguf, sizeof gguf);
  ASSERT_OK(moe_lm_convert(lm_case_dir("qwen3_moe", dir, sizeof dir), gguf, &o, NULL));
  if (!same_as_in_memory(gguf, "qwen3_q8_0", MOE_GGUF_F32, 1)) FAIL_("%s: the streamed directory is not moe_lm_save's", gguf);
  ASSERT(lm_patched("gpt_oss_mxfp4", "swiglu_limit", "7", NULL, dir, sizeof dir));
  o.type = MOE_GGUF_MXFP4;
  ASSERT_OK(moe_lm_convert(dir, test_tmp_path("convert_oss_mxfp4.gguf", gguf, sizeof gguf), &o, NULL));
  if (!same_as_in_memory(gguf, "oss_mxfp4_gguf", MOE_GGUF_F32, 1))
    FAIL_("%s: the streamed directory is not moe_lm_save's", gguf);
  static const char *const oss[2] = {"gpt_oss", "gpt_oss_mxfp4"};
  for (int k = 0; k < 2; k++)
    if (!same_as_in_memory(lm_case_dir(oss[k], dir, sizeof dir), oss[k], MOE_GGUF_F32, 1))
      FAIL_("%s: the streamed directory is not moe_lm_save's", oss[k]);
}

/* A model of family f whose experts (48 MiB fp32) dwarf its dense part (2 MiB), converted to Q8_0
 * from its directory and from its checkpoint split into 3 shards, and that file back to a directory:
 * each one's peak resident memory over its start stays under the dense weights + 4 expert projections
 * + 16 MiB (the stated overhead: the reader's and the writer's buffers, libc's arenas), less than half
 * the experts: loading reads none of them and the save holds one at a time. */
static void check_peak(int *failed_, moe_lm_family f) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  moe_lm_config_set_family(&c, f);
  c.vocab = 256, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 32, c.max_seq = 64;
  c.moe.D = 256, c.moe.H = 512, c.moe.E = 16, c.moe.top_k = 4;
  if (f == MOE_LM_GPT_OSS) c.sliding_window = 16; /* llama.cpp's gpt-oss requires one */
  char dir[512], out[512];
  test_tmp_path("convert_rss", dir, sizeof dir);
  test_tmp_path("convert_rss.gguf", out, sizeof out);
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 3);
  moe_status st = moe_lm_save(&m, dir);
  size_t dense = 0;
  for (int i = 0; i < m.nrefs; i++) dense += strstr(m.refs[i].name, ".experts.") ? 0 : m.refs[i].numel * 4;
  moe_lm_free(&m);
  ASSERT_OK(st);
  const size_t mib = (size_t)1 << 20, experts = (size_t)2 * 16 * 3 * 256 * 512 * 4, proj = (size_t)256 * 512 * 4;
  char shards[512];
  ASSERT(lm_shard_checkpoint(dir, test_tmp_path("convert_rss_shards", shards, sizeof shards), 3));
  moe_lm_gguf_options o = {MOE_GGUF_Q8_0, NULL, NULL};
  static const char *const what[3] = {"directory -> GGUF", "3 shards -> GGUF", "GGUF -> directory"};
  for (int k = 0; k < 3; k++) { /* the directory and its shards to Q8_0, then that file back to a directory */
    char again[512];
    test_tmp_path("convert_rss_back", again, sizeof again);
    long long base = lm_peak_reset_kib();
    if (base < 0) SKIP("cannot reset and read the peak resident memory (/proc/self/clear_refs, VmHWM)");
    ASSERT_OK(moe_lm_convert(k == 0 ? dir : k == 1 ? shards : out, k < 2 ? out : again, &o, NULL));
    long long peak = lm_status_kib("VmHWM:");
    size_t bound = dense + 4 * proj + 16 * mib;
    fprintf(stderr, "  %s %s: peak %.1f MiB over the start, bound %.1f MiB (dense %.1f, a projection %.1f), experts "
            "%.1f MiB\n", moe_lm_family_name(f), what[k], (double)(peak - base) / 1024, (double)bound / mib,
            (double)dense / mib, (double)proj / mib, (double)experts / mib);
    ASSERT(bound < experts / 2); /* the test can fail: the experts resident would break it */
    ASSERT((size_t)(peak - base) * 1024 <= bound);
  }
}

/* Mixtral's per-expert tensors, and gpt-oss's fused ones with their biases. */
TEST(lm_convert_peak_memory_is_dense_plus_a_few_tensors) {
  check_peak(failed_, MOE_LM_MIXTRAL);
  check_peak(failed_, MOE_LM_GPT_OSS);
}

/* A NaN in expert 2's w3 of layer 1: moe convert fails (non-zero) naming the tensor and the expert, and
 * leaves no file. */
TEST(lm_convert_corrupt_expert_is_an_error_naming_it) {
  char dir[512], out[512], args[1200], err[2048];
  test_tmp_path("convert_corrupt", dir, sizeof dir);
  test_tmp_path("convert_corrupt.gguf", out, sizeof out);
  ASSERT(lm_copy_fixture("mixtral", dir));
  const char *bad = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  size_t nb;
  ASSERT(lm_st_poison(dir, bad, 40, &nb) > 0);
  unlink(out);
  snprintf(args, sizeof args, "convert %s %s --type Q8_0", dir, out);
  int rc = run_moe(NULL, args, NULL, err, sizeof err);
  if (rc == 0 || !strstr(err, bad) || !strstr(err, "expert 2") || !strstr(err, "blk.1.ffn_up_exps.weight"))
    FAIL_("exit %d, and the message does not name the tensor: %s", rc, err);
  ASSERT(access(out, F_OK) != 0);
}

/* gpt-oss's fused experts too: a NaN in expert 2's rows of layer 1's down_proj stops a streamed
 * conversion to a directory with an error naming the tensor and the value's index (expert first), and
 * nothing is written. */
TEST(lm_convert_gpt_oss_corrupt_expert_is_an_error_naming_it) {
  char dir[512], out[512];
  test_tmp_path("convert_corrupt_oss", dir, sizeof dir);
  test_tmp_path("convert_corrupt_oss_out", out, sizeof out);
  ASSERT(lm_copy_fixture("gpt_oss", dir));
  const char *bad = "model.layers.1.mlp.experts.down_proj";
  size_t nb;
  ASSERT(lm_st_poison(dir, bad, 2 * 32 * 32 * 4 + 40, &nb) > 0); /* (E 4, H 32, D 32) F32: expert 2's rows */
  ASSERT_EQ_INT(nb, 4 * 32 * 32 * 4);
  ASSERT_STATUS(moe_lm_convert(dir, out, NULL, NULL), MOE_ERR_VALUE);
  if (!strstr(moe_last_error(), bad) || !strstr(moe_last_error(), "(2, 0, 10)")) /* expert 2, row 0, value 10 */
    FAIL_("the message does not name the tensor and the value's index: %s", moe_last_error());
  ASSERT(access(out, F_OK) != 0);
}

/* A checkpoint split into 3 shards (an expert's projections in different shards) converts streamed to the
 * very bytes its unsharded directory converts to: Mixtral (F32 and Q8_0) and Qwen3-MoE (Q4_K fallback),
 * and to a directory too, as does gpt-oss's MXFP4 one (its blocks, scales and biases in different
 * shards). */
TEST(lm_convert_sharded_is_the_unsharded_byte_for_byte) {
  static const struct {
    const char *fixture;
    moe_gguf_type t;
  } cases[] = {{"mixtral", MOE_GGUF_F32}, {"mixtral", MOE_GGUF_Q8_0}, {"qwen3_moe", MOE_GGUF_Q4_K}};
  char src[512], dir[512], a[512], b[512];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    moe_lm_gguf_options o = {cases[k].t, NULL, NULL};
    ASSERT(lm_shard_checkpoint(lm_case_dir(cases[k].fixture, src, sizeof src), test_tmp_path("convert_shards", dir, sizeof dir), 3));
    ASSERT_OK(moe_lm_convert(src, test_tmp_path("convert_unsharded.gguf", a, sizeof a), &o, NULL));
    ASSERT_OK(moe_lm_convert(dir, test_tmp_path("convert_sharded.gguf", b, sizeof b), &o, NULL));
    if (!same_file(cases[k].fixture, a, b)) FAIL_("%s as %s: the sharded checkpoint's file is not the unsharded one's",
                                                  cases[k].fixture, moe_gguf_type_name(cases[k].t));
  }
  static const char *const to_dir[2] = {"qwen3_moe", "gpt_oss_mxfp4"};
  for (int k = 0; k < 2; k++) {
    lm_case_dir(to_dir[k], src, sizeof src);
    ASSERT(lm_shard_checkpoint(src, test_tmp_path("convert_shards", dir, sizeof dir), 3));
    ASSERT_OK(moe_lm_convert(src, test_tmp_path("convert_unsharded_dir", a, sizeof a), NULL, NULL));
    ASSERT_OK(moe_lm_convert(dir, test_tmp_path("convert_sharded_dir", b, sizeof b), NULL, NULL));
    char fa[700], fb[700];
    snprintf(fa, sizeof fa, "%s/model.safetensors", a);
    snprintf(fb, sizeof fb, "%s/model.safetensors", b);
    if (!same_file(to_dir[k], fa, fb))
      FAIL_("%s: the sharded checkpoint's directory is not the unsharded one's", to_dir[k]);
  }
}

/* moe convert of a sharded checkpoint whose shard is missing, or cut short: non-zero,
 * naming the shard (and the tensor), and no file left. */
TEST(lm_convert_sharded_missing_or_short_shard_is_an_error_naming_it) {
  char src[512], dir[512], out[512], shard[1024], args[1400], err[2048];
  ASSERT(lm_shard_checkpoint(lm_case_dir("mixtral", src, sizeof src), test_tmp_path("convert_bad_shards", dir, sizeof dir), 3));
  test_tmp_path("convert_bad_shards.gguf", out, sizeof out);
  lm_shard_path(dir, 3, 3, shard, sizeof shard);
  snprintf(args, sizeof args, "convert %s %s --type Q8_0", dir, out);
  for (int missing = 0; missing < 2; missing++) {
    ASSERT(missing ? unlink(shard) == 0 : truncate(shard, 4096) == 0);
    unlink(out);
    int rc = run_moe(NULL, args, NULL, err, sizeof err);
    if (rc == 0 || !strstr(err, "model-00003-of-00003.safetensors") || !strstr(err, "tensor 'model.layers."))
      FAIL_("%s shard: exit %d, and the message does not name the shard and a tensor: %s", missing ? "a missing" : "a short",
            rc, err);
    ASSERT(access(out, F_OK) != 0);
  }
}

/* A model whose experts an expert cache serves (moe_lm_buffer_experts: no values in the model) is not
 * saved either way: an error, not a read of NULL. */
TEST(lm_convert_buffered_model_is_refused_by_the_writers) {
  char dir[512], out[512];
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load(&m, lm_case_dir("mixtral", dir, sizeof dir), NULL));
  moe_status st = moe_lm_buffer_experts(&m, dir, 2, MOE_CACHE_LRU, &x);
  moe_status a = st == MOE_OK ? moe_lm_save(&m, test_tmp_path("convert_buffered", out, sizeof out)) : st;
  moe_status b = st == MOE_OK ? moe_lm_save_gguf(&m, test_tmp_path("convert_buffered.gguf", out, sizeof out), NULL) : st;
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  ASSERT_OK(st);
  ASSERT_STATUS(a, MOE_ERR_STATE);
  ASSERT_STATUS(b, MOE_ERR_STATE);
  ASSERT(access(out, F_OK) != 0);
}
