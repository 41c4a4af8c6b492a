/* Experts streamed from the checkpoint under a memory budget (moe_lm_load_streaming): the logits and
 * tokens of the all-resident model bit for bit for every policy, budget and prefetch setting (greedy and
 * sampled with a seed), no expert read at load, a corrupt or short expert an error naming the tensor at
 * its read, and the process's peak resident memory under dense + budget + a stated overhead. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lm_check.h"
#include "run_cli.h"
#include "gguf_retype.h"
#include "test.h"

enum { NEW = 10, MAXV = 256 };

typedef struct {
  int32_t ids[NEW];
  float logits[NEW][MAXV];
} run_out;

/* A prompt and NEW tokens (temperature 0: greedy; else sampled with seed 7), keeping each step's logits;
 * with rec, each forward's expert counts as trace steps (NEW + 1 steps of n_layers x E). */
static moe_status decode_traced(moe_lm_t *m, float temperature, run_out *o, int32_t *rec) {
  int V = m->cfg.vocab;
  int32_t prompt[5] = {3, 9, 1, 7, 2};
  moe_lm_cache *kv;
  moe_status st = moe_lm_cache_new(&kv, m, 1);
  if (st != MOE_OK) return st;
  size_t cells = (size_t)m->cfg.n_layers * m->cfg.moe.E;
  st = moe_lm_decode(m, kv, prompt, 5);
  if (rec && st == MOE_OK) memcpy(rec, moe_lm_cache_expert_counts(kv), cells * 4);
  const float *l = moe_lm_logits(m) + 4 * (size_t)V;
  uint64_t rng = 7;
  for (int i = 0; i < NEW && st == MOE_OK; i++) {
    memcpy(o->logits[i], l, (size_t)V * 4);
    st = moe_lm_sample(l, V, temperature, 1.0f, &rng, &o->ids[i]);
    if (st == MOE_OK) st = moe_lm_decode(m, kv, &o->ids[i], 1);
    if (rec && st == MOE_OK) memcpy(rec + (i + 1) * cells, moe_lm_cache_expert_counts(kv), cells * 4);
    l = moe_lm_logits(m);
  }
  moe_lm_cache_free(kv);
  return st;
}

static moe_status decode(moe_lm_t *m, float temperature, run_out *o) { return decode_traced(m, temperature, o, NULL); }

/* The caches' stats summed over the layers. */
static moe_expert_cache_stats total(const moe_lm_experts *x) {
  moe_expert_cache_stats t = {0};
  for (int i = 0; i < x->n; i++) {
    if (!x->caches[i]) continue;
    moe_expert_cache_stats s;
    moe_expert_cache_get_stats(x->caches[i], &s);
    t.accesses += s.accesses, t.misses += s.misses, t.loads += s.loads, t.bytes_read += s.bytes_read;
    t.resident_bytes += s.resident_bytes, t.expert_bytes = s.expert_bytes;
    t.prefetches += s.prefetches, t.prefetch_used += s.prefetch_used, t.prefetch_skipped += s.prefetch_skipped;
    t.predicted += s.predicted, t.predicted_hit += s.predicted_hit, t.actual += s.actual;
  }
  return t;
}

/* The model at dir (a checkpoint directory or a GGUF file) loaded with config c, streamed under every
 * policy, budget and prefetch setting: the all-resident model's logits and tokens bit for bit. slot: the
 * bytes of a slot of each MoE layer (NULL: moe_expert_cache_slot_bytes in every layer). min_read: a load
 * reads at least slot / min_read bytes (2: the matrices at bf16; MXFP4's 4.25 bits a value and fp32
 * biases: 8). */
static void check_streamed_slots(int *failed_, const char *dir, moe_lm_config c, const char *family, int min_read,
                                 const size_t *slot_of, int npol) {
  moe_dtype dt = c.moe.dtype;
  ASSERT(c.vocab <= MAXV);
  moe_lm_t all;
  ASSERT_OK(moe_lm_load(&all, dir, &c));
  static run_out want[2], got;
  ASSERT_OK(decode(&all, 0.0f, &want[0]));
  ASSERT_OK(decode(&all, 0.9f, &want[1]));
  moe_lm_free(&all);
  size_t slot = 0, row = 0; /* the smallest slot, and one slot of each MoE layer */
  int Lm = 0;
  for (int i = 0; i < c.n_layers; i++) {
    if (moe_lm_layer_dense(&c, i)) continue;
    size_t b = slot_of ? slot_of[Lm] : moe_expert_cache_slot_bytes(&c.moe);
    slot = !slot || b < slot ? b : slot, row += b, Lm++;
  }
  const moe_cache_policy pol[5] = {MOE_CACHE_LRU, MOE_CACHE_LFRU, MOE_CACHE_LIFO, MOE_CACHE_FIFO, MOE_CACHE_LFU};
  const int slots[3] = {1, 2, c.moe.E};
  for (int p = 0; p < npol; p++)
    for (int b = 0; b < 3; b++)
      for (int ahead = 0; ahead < 2 + (p == 0); ahead++) /* off, on, and auto under the first policy */
        for (int sampled = 0; sampled < 1 + (b == 0); sampled++) { /* sampled: with the fewest slots */
          moe_lm_stream_config s;
          moe_lm_stream_config_default(&s);
          s.policy = pol[p];
          s.prefetch = ahead;
          s.budget = row * slots[b] + slot - 1; /* and a remainder no slot fits, left unused */
          moe_lm_t m;
          moe_lm_experts x;
          ASSERT_OK(moe_lm_load_streaming(&m, dir, &c, &s, &x));
          moe_expert_cache_stats t = total(&x);
          ASSERT_EQ_INT(t.loads, 0); /* loading read no expert */
          ASSERT_EQ_INT(t.resident_bytes, row * slots[b]);
          ASSERT(t.resident_bytes <= s.budget);
          moe_status st = decode(&m, sampled ? 0.9f : 0.0f, &got);
          t = total(&x);
          moe_lm_free(&m);
          moe_lm_experts_free(&x);
          ASSERT_OK(st);
          if (memcmp(got.ids, want[sampled].ids, sizeof got.ids) || memcmp(got.logits, want[sampled].logits, sizeof got.logits))
            FAIL_("%s %s, %s, %d slots, prefetch %d, %s: not the all-resident model's bits", family,
                  moe_compute_dtype_name(dt), moe_cache_policy_name(pol[p]), slots[b], ahead,
                  sampled ? "sampled" : "greedy");
          ASSERT(t.accesses > 0 && t.misses > 0 && t.misses <= t.accesses);
          ASSERT(t.misses <= t.loads && t.loads <= t.misses + t.prefetches); /* the last prefetch may be in flight */
          ASSERT(t.bytes_read >= t.loads * (int64_t)(slot / min_read));
          if (slots[b] == c.moe.E && !ahead) ASSERT(t.misses <= (int64_t)Lm * c.moe.E); /* each expert once */
          if (ahead) { /* predictions were made and scored; some of them were right and used */
            ASSERT(t.predicted > 0 && t.actual > 0 && t.predicted_hit > 0);
            ASSERT(t.predicted_hit <= t.predicted && t.predicted_hit <= t.actual);
            if (slots[b] > 1 && Lm > 1 && ahead == MOE_PREFETCH_ON) ASSERT(t.prefetches > 0);
            if (ahead == MOE_PREFETCH_ON) ASSERT_EQ_INT(t.prefetch_skipped, 0);
            ASSERT(t.prefetch_used <= t.prefetches);
          } else {
            ASSERT_EQ_INT(t.prefetches, 0);
            ASSERT_EQ_INT(t.predicted, 0);
          }
        }
}

/* Every policy (npol 5), or the first npol of them where what is tested is not the policy (the policies'
 * bookkeeping is the same for every expert format: a GGUF type's slots under all five took a minute of
 * the sanitized suite). */
static void check_streamed(int *failed_, const char *dir, moe_lm_config c, const char *family, int min_read, int npol) {
  check_streamed_slots(failed_, dir, c, family, min_read, NULL, npol);
}

static void check_family(int *failed_, const char *family, moe_dtype dt, int min_read) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/%s", test_fixture_dir(), family);
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(dir, &c));
  c.moe.dtype = dt;
  check_streamed(failed_, dir, c, family, min_read, 5);
}

TEST(lm_stream_mixtral_bit_identical) { check_family(failed_, "mixtral", MOE_DT_F32, 2); }
TEST(lm_stream_mixtral_bf16_bit_identical) { check_family(failed_, "mixtral", MOE_DT_BF16, 2); }
/* a dense first layer (the prediction skips it) and gate_proj/up_proj/down_proj experts */
TEST(lm_stream_qwen3_moe_bit_identical) { check_family(failed_, "qwen3_moe", MOE_DT_F32, 2); }
/* shared experts, sigmoid scores and a selection bias */
TEST(lm_stream_deepseek_v3_bit_identical) { check_family(failed_, "deepseek_v3", MOE_DT_F32, 2); }
/* fused gate_up_proj (interleaved columns) and down_proj with biases, one expert's slab at a time; the
 * router's bias in the prediction; bf16 slots rounded from the converted fp32 values */
TEST(lm_stream_gpt_oss_bit_identical) { check_family(failed_, "gpt_oss", MOE_DT_F32, 2); }
TEST(lm_stream_gpt_oss_bf16_bit_identical) { check_family(failed_, "gpt_oss", MOE_DT_BF16, 2); }
/* MXFP4 blocks and scales dequantized per expert */
TEST(lm_stream_gpt_oss_mxfp4_bit_identical) { check_family(failed_, "gpt_oss_mxfp4", MOE_DT_F32, 8); }

/* A Mixtral-shaped model (L layers of 4 experts, rows of 256: whole blocks of every type) written as a
 * GGUF file of type t to path. */
static moe_status write_gguf_layers(const char *path, moe_gguf_type t, int L) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 64, c.n_layers = L, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.max_seq = 32;
  c.moe.D = 256, c.moe.H = 256, c.moe.E = 4, c.moe.top_k = 2;
  moe_lm_t m;
  moe_status st = moe_lm_init(&m, &c);
  if (st != MOE_OK) return st;
  moe_lm_init_params(&m, 7);
  moe_lm_gguf_options o = {t, NULL, NULL};
  st = moe_lm_save_gguf(&m, path, &o);
  moe_lm_free(&m);
  return st;
}

static moe_status write_gguf(const char *path, moe_gguf_type t) { return write_gguf_layers(path, t, 2); }

/* Bytes of a slot of GGUF experts in their stored types: each projection's rows (H, D, H rows of D, H, D
 * values) 64-byte aligned, and with expert biases their fp32 values (H, D, H) 64-byte aligned; of fp32
 * ones when t is 0. */
static size_t stored_slot(const moe_lm_config *c, const moe_gguf_type t[3]) {
  const int64_t rows[3] = {c->moe.H, c->moe.D, c->moe.H}, cols[3] = {c->moe.D, c->moe.H, c->moe.D};
  size_t bytes = 0;
  for (int j = 0; j < 3; j++) {
    size_t n = t[0] ? (size_t)(cols[j] / moe_gguf_type_block(t[j])) * moe_gguf_type_block_bytes(t[j]) : (size_t)cols[j] * 4;
    bytes += ((size_t)rows[j] * n + 63) / 64 * 64;
    if (c->moe.expert_bias) bytes += ((size_t)rows[j] * 4 + 63) / 64 * 64;
  }
  return bytes;
}

/* The types of layer i's gate, down and up stacks in the GGUF file at path. */
static void stack_types(const char *path, int i, moe_gguf_type t[3]) {
  static const char *const stacks[3] = {"gate", "down", "up"};
  moe_gguf *g;
  t[0] = t[1] = t[2] = MOE_GGUF_F32;
  if (moe_gguf_open(&g, path) != MOE_OK) return;
  for (int j = 0; j < 3; j++) {
    char name[64];
    moe_gguf_tensor x;
    snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i, stacks[j]);
    if (moe_gguf_tensor_get(g, name, &x) == MOE_OK) t[j] = x.type;
  }
  moe_gguf_close(g);
}

/* GGUF files streamed: quantized ones (and BF16) by default in their stored types, the slots the file's
 * bytes (counted per layer), computed by the quantized kernels; then with moe.expert_type -1 each
 * expert's rows dequantized into f32 or bf16 slots. Either way the all-resident model's bits, loaded with
 * the same config. */
static void check_gguf_file(int *failed_, const char *path, moe_dtype dt, int min_read) {
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  int stored = c.moe.expert_type > 0;
  if (stored) {
    size_t slot[8];
    ASSERT(c.n_layers <= 8);
    for (int i = 0; i < c.n_layers; i++) {
      moe_gguf_type t[3];
      stack_types(path, i, t);
      slot[i] = stored_slot(&c, t);
    }
    check_streamed_slots(failed_, path, c, path, 2, slot, 2);
    c.moe.expert_type = -1;
  }
  c.moe.dtype = dt;
  check_streamed(failed_, path, c, path, min_read, stored ? 1 : 2); /* dequantized: one policy after two */
}

static void check_gguf(int *failed_, moe_gguf_type t, moe_dtype dt, int min_read) {
  char path[512], name[64];
  snprintf(name, sizeof name, "stream_%s.gguf", moe_gguf_type_name(t));
  test_tmp_path(name, path, sizeof path);
  ASSERT_OK(write_gguf(path, t));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  ASSERT_EQ_INT(c.moe.expert_type, t == MOE_GGUF_F32 ? -1 : (int)t); /* computed in the stored type */
  check_gguf_file(failed_, path, dt, min_read);
}

TEST(lm_stream_gguf_f32_bit_identical) { check_gguf(failed_, MOE_GGUF_F32, MOE_DT_F32, 2); }
TEST(lm_stream_gguf_bf16_slots_bit_identical) { check_gguf(failed_, MOE_GGUF_BF16, MOE_DT_BF16, 4); }
TEST(lm_stream_gguf_q8_0_bit_identical) { check_gguf(failed_, MOE_GGUF_Q8_0, MOE_DT_F32, 4); }
TEST(lm_stream_gguf_q4_k_bit_identical) { check_gguf(failed_, MOE_GGUF_Q4_K, MOE_DT_F32, 8); }
TEST(lm_stream_gguf_q6_k_bit_identical) { check_gguf(failed_, MOE_GGUF_Q6_K, MOE_DT_F32, 8); }
TEST(lm_stream_gguf_f16_bit_identical) { check_gguf(failed_, MOE_GGUF_F16, MOE_DT_F32, 4); }
TEST(lm_stream_gguf_mxfp4_bit_identical) { check_gguf(failed_, MOE_GGUF_MXFP4, MOE_DT_F32, 8); }

/* gpt-oss as llama.cpp's converter writes it (the MXFP4 fixture with llama.cpp's swiglu limit) to path:
 * MXFP4 expert stacks and F32 biases (ffn_{gate,down,up}_exps.bias), swiglu_oai. */
static moe_status write_gpt_oss_gguf(const char *path) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/gpt_oss_mxfp4", test_fixture_dir());
  moe_lm_config c;
  moe_status st = moe_lm_read_config(dir, &c);
  c.moe.swiglu_limit = 7.0f; /* llama.cpp's: the file cannot say the fixture's */
  moe_lm_t m;
  if (st == MOE_OK) st = moe_lm_load(&m, dir, &c);
  if (st != MOE_OK) return st;
  moe_lm_gguf_options o = {MOE_GGUF_MXFP4, NULL, NULL};
  st = moe_lm_save_gguf(&m, path, &o);
  moe_lm_free(&m);
  return st;
}

/* A gpt-oss GGUF file streamed in MXFP4: the slots hold the file's bytes and the biases in fp32 (the
 * budget counts both), computed by the kernels of the resident MXFP4 experts; then dequantized into fp32
 * slots. Either way the all-resident model's bits. */
TEST(lm_stream_gguf_gpt_oss_mxfp4_with_biases_bit_identical) {
  char path[512];
  test_tmp_path("stream_oss.gguf", path, sizeof path);
  ASSERT_OK(write_gpt_oss_gguf(path));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  ASSERT_EQ_INT(c.moe.expert_type, MOE_GGUF_MXFP4);
  ASSERT(c.moe.expert_bias && c.moe.act == MOE_ACT_SWIGLU_OAI);
  check_gguf_file(failed_, path, MOE_DT_F32, 8);
}

/* Experts of mixed types as llama.cpp's _M files have them, other per layer (layer 0: Q4_K, Q6_K, Q4_K;
 * layer 1: Q4_K, BF16, Q8_0, whose activations differ from fc1's): slots of other sizes per layer. */
TEST(lm_stream_gguf_mixed_types_bit_identical) {
  char path[512];
  test_tmp_path("stream_mixed.gguf", path, sizeof path);
  ASSERT_OK(write_gguf(path, MOE_GGUF_Q4_K));
  ASSERT_OK(gguf_retype(path, "blk.0.ffn_down_exps.weight", MOE_GGUF_Q6_K));
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_up_exps.weight", MOE_GGUF_Q8_0));
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_down_exps.weight", MOE_GGUF_BF16));
  check_gguf_file(failed_, path, MOE_DT_F32, 8);
}

/* The GGUF file at path streamed with config c under budget: every MoE layer's cache has `slots` slots of
 * bytes[i] bytes (layer i). */
static void expect_slots(int *failed_, const char *path, const moe_lm_config *c, size_t budget, const int *slots,
                         const size_t *bytes) {
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = budget;
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load_streaming(&m, path, c, &s, &x));
  moe_expert_cache_stats cs[8];
  int L = c->n_layers < 8 ? c->n_layers : 8;
  for (int i = 0; i < L; i++) moe_expert_cache_get_stats(x.caches[i], &cs[i]);
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  for (int i = 0; i < L; i++) {
    if (cs[i].slots != slots[i] || cs[i].expert_bytes != bytes[i] || cs[i].resident_bytes != (size_t)slots[i] * bytes[i])
      FAIL_("budget %zu, layer %d: %d slots of %zu bytes (%zu resident), want %d of %zu", budget, i, cs[i].slots,
            cs[i].expert_bytes, cs[i].resident_bytes, slots[i], bytes[i]);
  }
}

/* The budget counts the stored bytes: a budget of one fp32 slot a layer holds 7 Q4_K experts a layer
 * (4.5 bits a value against 32; capped at E) and one dequantized; equal placement over layers whose slots
 * differ gives each as many slots as the sum of one slot of every layer fits, and what is left a slot
 * more to each layer in turn whose slot it still holds. */
TEST(lm_stream_gguf_budget_counts_stored_bytes) {
  char path[512];
  test_tmp_path("stream_budget.gguf", path, sizeof path);
  ASSERT_OK(write_gguf(path, MOE_GGUF_Q4_K));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  ASSERT_EQ_INT(c.n_layers, 2);
  const moe_gguf_type q4[3] = {MOE_GGUF_Q4_K, MOE_GGUF_Q4_K, MOE_GGUF_Q4_K}, f32[3] = {0, 0, 0};
  const moe_gguf_type mixed[3] = {MOE_GGUF_Q4_K, MOE_GGUF_Q8_0, MOE_GGUF_Q4_K};
  size_t fp = stored_slot(&c, f32), q = stored_slot(&c, q4), q1 = stored_slot(&c, mixed);
  const size_t fps[2] = {fp, fp}, qs[2] = {q, q}, mix[2] = {q, q1};
  ASSERT_EQ_INT(fp / q, 7);
  ASSERT_EQ_INT(fp, moe_expert_cache_slot_bytes(&c.moe));
  for (int k = 1; k <= 2; k++) {
    expect_slots(failed_, path, &c, 2 * q * k + q - 1, (int[]){k, k}, qs);
    expect_slots(failed_, path, &c, 2 * q * k + q, (int[]){k + 1, k}, qs); /* what is left: a slot more in layer 0 */
  }
  expect_slots(failed_, path, &c, 2 * fp, (int[]){c.moe.E, c.moe.E}, qs); /* 7 a layer fit: capped at E = 4 */
  c.moe.expert_type = -1;
  expect_slots(failed_, path, &c, 2 * fp + q, (int[]){1, 1}, fps);
  expect_slots(failed_, path, &c, 3 * fp, (int[]){2, 1}, fps);
  c.moe.expert_type = MOE_GGUF_Q4_K;
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_down_exps.weight", MOE_GGUF_Q8_0)); /* layer 1's slot larger */
  ASSERT(q1 > q);
  expect_slots(failed_, path, &c, 2 * (q + q1) + q, (int[]){3, 2}, mix); /* a third slot fits in layer 0 only */
  expect_slots(failed_, path, &c, 2 * (q + q1) + q1 - 1, (int[]){3, 2}, mix);
  expect_slots(failed_, path, &c, 2 * (q + q1) + q + q1, (int[]){3, 3}, mix);
}

/* The process's open descriptors (those in /proc/self/fd, less the one reading it), or -1. */
static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = -1; /* the directory's own */
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Streams `path` (c may be NULL) under s, decodes, and counts the descriptors the process holds past
 * those before: after loading (held), after decoding (decoded) and after freeing (left); 0 on a failure
 * (printed). */
static int descriptors_while_streaming(const char *path, const moe_lm_config *c, const moe_lm_stream_config *s,
                                       int *held, int *decoded, int *left) {
  int before = open_fds();
  moe_lm_t m;
  moe_lm_experts x;
  if (moe_lm_load_streaming(&m, path, c, s, &x) != MOE_OK) {
    fprintf(stderr, "  %s: %s\n", path, moe_last_error());
    return 0;
  }
  *held = open_fds() - before;
  static run_out o;
  moe_status st = decode(&m, 0.0f, &o); /* the experts are read through them */
  *decoded = open_fds() - before;
  moe_expert_cache_stats t = total(&x);
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  *left = open_fds() - before;
  if (st != MOE_OK || t.loads <= 0) fprintf(stderr, "  %s: decode %d, %lld loads\n", path, (int)st, (long long)t.loads);
  return st == MOE_OK && t.loads > 0;
}

/* A GGUF file of 6 MoE layers streamed (its experts in their stored type, then dequantized) holds one
 * descriptor of the file, which every layer's reader shares (one each took 6), and none once freed. */
TEST(lm_stream_gguf_layers_share_one_descriptor) {
  char path[512];
  test_tmp_path("stream_fds.gguf", path, sizeof path);
  ASSERT_OK(write_gguf_layers(path, MOE_GGUF_Q8_0, 6));
  if (open_fds() < 0) SKIP("no /proc/self/fd to count descriptors in");
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  for (int stored = 1; stored >= 0; stored--) {
    c.moe.expert_type = stored ? MOE_GGUF_Q8_0 : -1;
    moe_lm_stream_config s;
    moe_lm_stream_config_default(&s);
    s.budget = 6 * 2 * moe_expert_cache_slot_bytes(&c.moe);
    int held, decoded, left;
    ASSERT(descriptors_while_streaming(path, &c, &s, &held, &decoded, &left));
    if (held != 1 || decoded != held)
      FAIL_("%s: %d descriptors held after loading 6 streamed layers, %d after decoding; want 1", stored ? "stored" : "fp32",
            held, decoded);
    ASSERT_EQ_INT(left, 0);
  }
}

/* Decoding the streamed model of dir (a directory, or a GGUF file) with a budget of 1 MiB (its file cut
 * to cut bytes after loading when cut >= 0): its status, the message kept. */
static moe_status stream_decode(const char *dir, long long cut, char *msg, size_t n) {
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = (size_t)1 << 20;
  moe_lm_t m;
  moe_lm_experts x;
  moe_status st = moe_lm_load_streaming(&m, dir, NULL, &s, &x);
  static run_out o;
  char path[1024];
  size_t n_dir = strlen(dir);
  snprintf(path, sizeof path, n_dir > 5 && !strcmp(dir + n_dir - 5, ".gguf") ? "%s" : "%s/model.safetensors", dir);
  if (st == MOE_OK && cut >= 0 && truncate(path, cut) != 0) st = MOE_ERR_IO;
  if (st == MOE_OK) {
    st = decode(&m, 0.0f, &o);
    snprintf(msg, n, "%s", moe_last_error());
    moe_status again = decode(&m, 0.0f, &o); /* the error once, then the same read again */
    if (st != MOE_OK && again == MOE_OK) st = MOE_ERR_STATE;
    moe_lm_free(&m);
    moe_lm_experts_free(&x);
  } else {
    snprintf(msg, n, "%s", moe_last_error());
  }
  return st;
}

/* An expert holding a NaN, and a file cut short inside an expert while it is served: loading succeeds (no
 * expert is read), the read of that expert fails naming its tensor, not a crash; a file already short
 * when loaded is refused at once, naming the tensor past its end. */
TEST(lm_stream_corrupt_or_short_expert_is_an_error_naming_it) {
  char dir[512], msg[1024];
  test_tmp_path("stream_corrupt", dir, sizeof dir);
  ASSERT(lm_copy_fixture("mixtral", dir));
  const char *bad = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  size_t nb;
  long long off = lm_st_poison(dir, bad, 40, &nb);
  ASSERT(off > 0);
  ASSERT_STATUS(stream_decode(dir, -1, msg, sizeof msg), MOE_ERR_VALUE);
  if (!strstr(msg, bad) || !strstr(msg, "expert 2")) FAIL_("the message does not name the tensor: %s", msg);
  ASSERT(lm_copy_fixture("mixtral", dir));
  ASSERT_STATUS(stream_decode(dir, off + (long long)nb / 2, msg, sizeof msg), MOE_ERR_IO);
  /* the first expert read past the cut: bad or one after it in the file */
  if (!strstr(msg, "reading tensor 'model.layers.") || !strstr(msg, "file shrank"))
    FAIL_("the message does not name the tensor: %s", msg);
  ASSERT_STATUS(stream_decode(dir, -1, msg, sizeof msg), MOE_ERR_FORMAT); /* still short */
  if (!strstr(msg, bad)) FAIL_("the message does not name the tensor: %s", msg);
}

/* gpt-oss's fused gate_up_proj with a NaN in expert 2's slab: loading succeeds, the read of that expert
 * fails naming the tensor and the expert. */
TEST(lm_stream_gpt_oss_corrupt_slab_is_an_error_naming_it) {
  char dir[512], msg[1024];
  test_tmp_path("stream_oss_corrupt", dir, sizeof dir);
  ASSERT(lm_copy_fixture("gpt_oss", dir));
  const char *bad = "model.layers.1.mlp.experts.gate_up_proj";
  size_t nb;
  ASSERT(lm_st_offset(dir, bad, &nb) > 0);
  ASSERT(lm_st_poison(dir, bad, (long long)nb / 4 * 2 + 40, &nb) > 0); /* in expert 2 of 4's slab */
  ASSERT_STATUS(stream_decode(dir, -1, msg, sizeof msg), MOE_ERR_VALUE);
  if (!strstr(msg, bad) || !strstr(msg, "expert 2")) FAIL_("the message does not name the tensor and expert: %s", msg);
}

/* A GGUF file with a NaN in expert 2's rows of a stacked tensor, then cut short inside them while it is
 * served: loading succeeds, the read of that expert fails naming the tensor (and the expert), not a crash
 * (the reads are preads, not the mapping's pages: no SIGBUS); still short at the next load, refused. */
TEST(lm_stream_gguf_corrupt_or_short_expert_is_an_error_naming_it) {
  char path[512], msg[1024];
  test_tmp_path("stream_corrupt.gguf", path, sizeof path);
  moe_lm_t m;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  moe_status st = moe_lm_save_gguf(&m, path, NULL);
  moe_lm_free(&m);
  ASSERT_OK(st);
  const char *bad = "blk.1.ffn_up_exps.weight";
  moe_gguf *g;
  moe_gguf_tensor t;
  ASSERT_OK(moe_gguf_open(&g, path));
  st = moe_gguf_tensor_get(g, bad, &t);
  moe_gguf_close(g);
  ASSERT_OK(st);
  ASSERT_EQ_INT(t.type, MOE_GGUF_F32);
  long long at = (long long)t.file_offset + (long long)(t.nbytes / 4) * 2 + 40; /* in expert 2 of 4 */
  int fd = open(path, O_WRONLY);
  const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
  ASSERT(fd >= 0 && pwrite(fd, nan, 4, at) == 4);
  close(fd);
  ASSERT_STATUS(stream_decode(path, -1, msg, sizeof msg), MOE_ERR_VALUE);
  if (!strstr(msg, bad) || !strstr(msg, "expert 2") || !strstr(msg, "non-finite")) FAIL_("the message does not name the tensor: %s", msg);
  ASSERT_STATUS(stream_decode(path, (long long)t.file_offset + (long long)t.nbytes / 2, msg, sizeof msg), MOE_ERR_IO);
  if (!strstr(msg, "reading tensor 'blk.") || !strstr(msg, "file shrank")) FAIL_("the message does not name the tensor: %s", msg);
  ASSERT(stream_decode(path, -1, msg, sizeof msg) != MOE_OK); /* still short: refused at load */
  if (!strstr(msg, "stream_corrupt.gguf")) FAIL_("the message does not name the file: %s", msg);
}

/* GGUF experts streamed in their stored types: a non-finite fp16 scale in a block of expert 2's rows
 * (Q8_0's d, Q4_K's dmin, Q6_K's d at the block's end) is an error naming the tensor and the expert at
 * its read; a file cut inside an expert's rows while it is served, an error naming the tensor. */
TEST(lm_stream_gguf_stored_corrupt_scale_or_short_is_an_error_naming_it) {
  const moe_gguf_type types[3] = {MOE_GGUF_Q8_0, MOE_GGUF_Q4_K, MOE_GGUF_Q6_K};
  const size_t field[3] = {0, 2, 208};
  for (int k = 0; k < 3; k++) {
    char path[512], msg[1024];
    test_tmp_path("stream_scale.gguf", path, sizeof path);
    ASSERT_OK(write_gguf(path, types[k]));
    const char *bad = "blk.1.ffn_up_exps.weight";
    moe_gguf *g;
    moe_gguf_tensor t;
    ASSERT_OK(moe_gguf_open(&g, path));
    moe_status st = moe_gguf_tensor_get(g, bad, &t);
    moe_gguf_close(g);
    ASSERT_OK(st);
    ASSERT_EQ_INT(t.type, types[k]);
    size_t bb = moe_gguf_type_block_bytes(types[k]);
    long long at = (long long)t.file_offset + (long long)(t.nbytes / 4) * 2 + 3 * (long long)bb + (long long)field[k];
    const unsigned char inf[2] = {0x00, 0x7c}; /* fp16 +Inf, little-endian */
    int fd = open(path, O_WRONLY);
    ASSERT(fd >= 0 && pwrite(fd, inf, 2, at) == 2);
    close(fd);
    ASSERT_STATUS(stream_decode(path, -1, msg, sizeof msg), MOE_ERR_VALUE);
    if (!strstr(msg, bad) || !strstr(msg, "expert 2") || !strstr(msg, "non-finite scale"))
      FAIL_("%s: the message does not name the tensor and expert: %s", moe_gguf_type_name(types[k]), msg);
    ASSERT_OK(write_gguf(path, types[k]));
    ASSERT_STATUS(stream_decode(path, (long long)t.file_offset + (long long)t.nbytes / 2, msg, sizeof msg), MOE_ERR_IO);
    if (!strstr(msg, "reading tensor 'blk.") || !strstr(msg, "file shrank"))
      FAIL_("%s: the message does not name the tensor: %s", moe_gguf_type_name(types[k]), msg);
  }
}

/* A NaN in expert 2's row of a gpt-oss GGUF file's down-projection biases: loading succeeds, the read of
 * that expert (MXFP4 slots, fp32 biases) fails naming the tensor and the expert. */
TEST(lm_stream_gguf_gpt_oss_corrupt_bias_is_an_error_naming_it) {
  char path[512], msg[1024];
  test_tmp_path("stream_oss_nan.gguf", path, sizeof path);
  ASSERT_OK(write_gpt_oss_gguf(path));
  const char *bad = "blk.1.ffn_down_exps.bias";
  moe_gguf *g;
  moe_gguf_tensor t;
  ASSERT_OK(moe_gguf_open(&g, path));
  moe_status st = moe_gguf_tensor_get(g, bad, &t);
  moe_gguf_close(g);
  ASSERT_OK(st);
  ASSERT(t.type == MOE_GGUF_F32 && t.ndim == 2);
  const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
  int fd = open(path, O_WRONLY);
  ASSERT(fd >= 0 && pwrite(fd, nan, 4, (off_t)t.file_offset + (off_t)t.nbytes / 4 * 2 + 8) == 4); /* expert 2 of 4 */
  close(fd);
  ASSERT_STATUS(stream_decode(path, -1, msg, sizeof msg), MOE_ERR_VALUE);
  if (!strstr(msg, bad) || !strstr(msg, "expert 2") || !strstr(msg, "non-finite"))
    FAIL_("the message does not name the tensor and expert: %s", msg);
}

/* What streaming refuses: a budget below one expert per MoE layer (saying the least). */
TEST(lm_stream_refuses_what_it_cannot_serve) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = 100;
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_STATUS(moe_lm_load_streaming(&m, dir, NULL, &s, &x), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "below one expert per MoE layer"));
}

/* The process's peak resident memory while a model whose experts take 96 MiB decodes under an 8 MiB budget
 * stays under what it has before loading + the dense weights + the slots + 24 MiB (the stated overhead:
 * the arena of activations, the KV cache, the loader threads' stacks, the BLAS's buffers), less than half
 * the experts: loading reads none of them, the slots hold what is read, and the file's pages are
 * dropped. Needs /proc/self/clear_refs to reset the peak (Linux 4.0 on). */
TEST(lm_stream_resident_memory_under_its_bound) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 256, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 32, c.max_seq = 64;
  c.moe.D = 256, c.moe.H = 512, c.moe.E = 32, c.moe.top_k = 4;
  char dir[512];
  test_tmp_path("stream_rss", dir, sizeof dir);
  moe_lm_t m;
  ASSERT_OK(moe_lm_init(&m, &c));
  moe_lm_init_params(&m, 3);
  moe_status st = moe_lm_save(&m, dir);
  size_t dense = 0;
  moe_lm_free(&m);
  ASSERT_OK(st);
  const size_t experts = (size_t)2 * 32 * 3 * 256 * 512 * 4, mib = (size_t)1 << 20;
  long long base = lm_peak_reset_kib();
  if (base < 0) SKIP("cannot reset and read the peak resident memory (/proc/self/clear_refs, VmHWM)");
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = 8 * mib;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load_streaming(&m, dir, NULL, &s, &x));
  for (int i = 0; i < m.nrefs; i++) dense += m.refs[i].data ? m.refs[i].numel * 4 : 0;
  static run_out o;
  st = decode(&m, 0.9f, &o);
  moe_expert_cache_stats t = total(&x);
  long long peak = lm_status_kib("VmHWM:");
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  ASSERT_OK(st);
  ASSERT(t.resident_bytes <= s.budget && t.loads > 4); /* experts came and went through the slots */
  size_t bound = dense + s.budget + 24 * mib;
  fprintf(stderr, "  peak %.1f MiB over the start, bound %.1f MiB (dense %.1f, budget %.1f), experts %.1f MiB\n",
          (double)(peak - base) / 1024, (double)bound / mib, (double)dense / mib, (double)s.budget / mib,
          (double)experts / mib);
  ASSERT(bound < experts / 2); /* the test can fail: all the experts resident would break it */
  ASSERT((size_t)(peak - base) * 1024 <= bound);
}

/* moe generate and eval --memory-budget: the ids and the loss of the run without a budget, and the JSON's
 * "experts" with the caches' stats (every policy, prefetch off and on); flags that do not fit refused. */
TEST(lm_stream_cli_same_outputs_and_stats) {
  char dir[512], args[1400], out[512], err[1024], text[16384], want[4096];
  snprintf(dir, sizeof dir, "%s/lm/qwen3_moe", test_fixture_dir());
  test_tmp_path("stream_cli.txt", out, sizeof out);
  const char *gen = "generate --checkpoint '%s' --prompt-ids '3 9 1' --max-tokens 12 --temperature 0.8 --seed 5 --json";
  snprintf(args, sizeof args, gen, dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  test_read_text(out, want, sizeof want);
  ASSERT(strstr(want, "\"ids\":[") && !strstr(want, "experts"));
  const char *pol[5] = {"lifo", "lru", "fifo", "lfu", "lfru"};
  for (int p = 0; p < 5; p++)
    for (int ahead = 0; ahead < 2; ahead++) {
      size_t n = (size_t)snprintf(args, sizeof args, gen, dir);
      snprintf(args + n, sizeof args - n, " --memory-budget 7KiB --policy %s --prefetch %s", pol[p], ahead ? "on" : "off");
      if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
      test_read_text(out, text, sizeof text);
      char *ids = strstr(text, "\"ids\":[");
      ASSERT(ids);
      if (strncmp(ids, strstr(want, "\"ids\":["), strcspn(strstr(want, "\"ids\":["), "]")))
        FAIL_("%s: ids differ from the run without a budget:\n%s\n%s", args, text, want);
      ASSERT(strstr(text, "\"experts\":{\"memory_budget\":7168,"));
      ASSERT(strstr(text, "\"tokens\":") && strstr(text, "\"bytes_read_per_token\":"));
      ASSERT(strstr(text, "\"layers\":[{\"layer\":1,\"slots\":1,")); /* layer 0 is dense */
      ASSERT(strstr(text, ahead ? "\"prefetch\":\"on\"" : "\"prefetch_precision\":0,"));
    }
  /* eval: the loss of the whole model */
  char ids[512];
  test_tmp_path("stream_ids.txt", ids, sizeof ids);
  FILE *f = fopen(ids, "w");
  ASSERT(f);
  for (int i = 0; i < 80; i++) fprintf(f, "%d ", (i * 7 + 3) % 40);
  fclose(f);
  snprintf(args, sizeof args, "eval --task lm --checkpoint '%s' --tokens '%s' --context 16 --json", dir, ids);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 0);
  test_read_text(out, want, sizeof want);
  size_t n = strlen(args);
  snprintf(args + n, sizeof args - n, " --memory-budget 8K --policy lfu");
  if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  test_read_text(out, text, sizeof text);
  ASSERT(!strncmp(text, want, strcspn(want, "}"))); /* the loss, perplexity and tokens */
  ASSERT(strstr(text, "\"experts\": {\"memory_budget\":8192,\"policy\":\"lfu\""));
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt-ids '3' --memory-budget 12X", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt-ids '3' --policy lru", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
  ASSERT(strstr(err, "--policy needs --memory-budget"));
  snprintf(args, sizeof args, "generate --checkpoint '%s' --prompt-ids '3' --memory-budget 1K --policy belady", dir);
  ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
}

/* Placement and pins (qwen3_moe: layer 0 dense, layers 1 and 2 MoE of 4 experts). */
enum { QL = 3, QE = 4, QSTEPS = NEW + 1 };

/* The whole model's greedy run (its outputs, and its experts as a trace) on the qwen3_moe fixture. */
static void qwen3_whole(int *failed_, const char *dir, moe_lm_config *c, run_out *want, int32_t *rec) {
  ASSERT_OK(moe_lm_read_config(dir, c));
  ASSERT(c->n_layers == QL && c->moe.E == QE && moe_lm_layer_dense(c, 0));
  moe_lm_t all;
  ASSERT_OK(moe_lm_load(&all, dir, c));
  moe_status st = decode_traced(&all, 0.0f, want, rec);
  moe_lm_free(&all);
  ASSERT_OK(st);
}

/* A layer's simulated misses with k slots over the whole trace. */
static int64_t sim_misses(const moe_trace *t, int layer, moe_cache_policy p, int k) {
  int64_t acc, miss;
  return moe_cachesim(t, layer, 0, t->steps, p, k, &acc, &miss) == MOE_OK ? miss : -1;
}

/* Miss-cost placement: on a crafted trace (layer 1 uses expert 0 only, layer 2 cycles through all four:
 * LRU misses every access with fewer than 4 slots) 5 slots go 1 + 4 where equal placement gives 3 + 2;
 * for every budget and policy, on that trace and on the model's own, the slots are what minimises the
 * simulated misses over every split (brute force), never more than the budget buys; the outputs are the
 * whole model's bit for bit. */
TEST(lm_stream_placement_by_simulated_misses) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/qwen3_moe", test_fixture_dir());
  moe_lm_config c;
  static run_out want, got;
  static int32_t own[QSTEPS * QL * QE], crafted[QSTEPS * QL * QE];
  qwen3_whole(failed_, dir, &c, &want, own);
  for (int b = 0; b < QSTEPS; b++) {
    crafted[(b * QL + 0) * QE + b % QE] = 1; /* the dense layer's rows: ignored */
    crafted[(b * QL + 1) * QE + 0] = 2;
    crafted[(b * QL + 2) * QE + b % QE] = 1;
  }
  moe_trace traces[2] = {{QSTEPS, QL, QE, crafted}, {QSTEPS, QL, QE, own}};
  size_t slot = moe_expert_cache_slot_bytes(&c.moe);
  const moe_cache_policy pol[5] = {MOE_CACHE_LIFO, MOE_CACHE_LRU, MOE_CACHE_FIFO, MOE_CACHE_LFU, MOE_CACHE_LFRU};
  for (int tr = 0; tr < 2; tr++)
    for (int p = 0; p < 5; p++)
      for (int T = 2; T <= 2 * QE + 1; T++) {
        moe_lm_stream_config s;
        moe_lm_stream_config_default(&s);
        s.budget = (size_t)T * slot + slot / 2;
        s.policy = pol[p];
        s.placement = MOE_LM_PLACE_MISS_COST;
        s.placement_trace = &traces[tr];
        s.prefetch = T % 2;
        moe_lm_t m;
        moe_lm_experts x;
        ASSERT_OK(moe_lm_load_streaming(&m, dir, &c, &s, &x));
        moe_expert_cache_stats s1, s2;
        moe_expert_cache_get_stats(x.caches[1], &s1);
        moe_expert_cache_get_stats(x.caches[2], &s2);
        moe_status st = decode(&m, 0.0f, &got);
        moe_lm_free(&m);
        moe_lm_experts_free(&x);
        ASSERT_OK(st);
        if (memcmp(&got, &want, sizeof got)) FAIL_("trace %d, %s, %d slots: not the whole model's bits", tr, moe_cache_policy_name(pol[p]), T);
        ASSERT(s1.slots >= 1 && s2.slots >= 1 && s1.slots + s2.slots <= T && s1.slots <= QE && s2.slots <= QE);
        ASSERT(s1.resident_bytes + s2.resident_bytes <= s.budget);
        int64_t best = INT64_MAX, chosen = sim_misses(&traces[tr], 1, pol[p], s1.slots) + sim_misses(&traces[tr], 2, pol[p], s2.slots);
        for (int k1 = 1; k1 <= QE; k1++)
          for (int k2 = 1; k2 <= QE && k1 + k2 <= T; k2++) {
            int64_t v = sim_misses(&traces[tr], 1, pol[p], k1) + sim_misses(&traces[tr], 2, pol[p], k2);
            if (v < best) best = v;
          }
        if (chosen != best)
          FAIL_("trace %d, %s, %d slots: placed %d + %d (%lld simulated misses), the best split misses %lld", tr,
                moe_cache_policy_name(pol[p]), T, s1.slots, s2.slots, (long long)chosen, (long long)best);
        if (tr == 0 && T == 5 && pol[p] == MOE_CACHE_LRU) {
          ASSERT_EQ_INT(s1.slots, 1);
          ASSERT_EQ_INT(s2.slots, 4);
        }
      }
  /* equal placement of the same 5 slots, and a trace of another model refused */
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = 5 * slot;
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load_streaming(&m, dir, &c, &s, &x));
  moe_expert_cache_stats s1, s2;
  moe_expert_cache_get_stats(x.caches[1], &s1);
  moe_expert_cache_get_stats(x.caches[2], &s2);
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  ASSERT_EQ_INT(s1.slots, 3); /* 2 each, and the fifth to the first layer */
  ASSERT_EQ_INT(s2.slots, 2);
  s.placement = MOE_LM_PLACE_MISS_COST;
  ASSERT_STATUS(moe_lm_load_streaming(&m, dir, &c, &s, &x), MOE_ERR_ARG); /* no trace */
  ASSERT(strstr(moe_last_error(), "needs a trace"));
  moe_trace wide = {1, QL + 1, QE, crafted};
  s.placement_trace = &wide;
  ASSERT_STATUS(moe_lm_load_streaming(&m, dir, &c, &s, &x), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "a trace of another model"));
}

/* Miss-cost placement by bytes over layers whose slots differ (layer 0's Q4_K experts, layer 1's with a
 * Q8_0 down projection: larger): on a crafted trace (layer 0 uses expert 0 only, layer 1 cycles through
 * all four) a budget of one slot of layer 0 and four of layer 1 goes 1 + 4 (equal: 3 + 2); for budgets
 * from one slot a layer to every expert, on that trace and the model's own, under LRU and FIFO, the
 * slots' bytes fit the budget and their simulated misses read the fewest bytes (a miss: a slot's) of
 * every split that fits (brute force); the outputs are the whole model's bit for bit. */
TEST(lm_stream_gguf_placement_by_bytes_over_mixed_types) {
  char path[512];
  test_tmp_path("stream_place_mixed.gguf", path, sizeof path);
  ASSERT_OK(write_gguf(path, MOE_GGUF_Q4_K));
  ASSERT_OK(gguf_retype(path, "blk.1.ffn_down_exps.weight", MOE_GGUF_Q8_0));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(path, &c));
  enum { L = 2, E = 4, STEPS = NEW + 1 };
  ASSERT(c.n_layers == L && c.moe.E == E);
  size_t slot[L];
  for (int i = 0; i < L; i++) {
    moe_gguf_type t[3];
    stack_types(path, i, t);
    slot[i] = stored_slot(&c, t);
  }
  ASSERT(slot[1] > slot[0]);
  static run_out want, got;
  static int32_t own[STEPS * L * E], crafted[STEPS * L * E];
  moe_lm_t all;
  ASSERT_OK(moe_lm_load(&all, path, &c));
  moe_status st = decode_traced(&all, 0.0f, &want, own);
  moe_lm_free(&all);
  ASSERT_OK(st);
  for (int b = 0; b < STEPS; b++) crafted[(b * L + 0) * E + 0] = 2, crafted[(b * L + 1) * E + b % E] = 1;
  moe_trace traces[2] = {{STEPS, L, E, crafted}, {STEPS, L, E, own}};
  const moe_cache_policy pol[2] = {MOE_CACHE_LRU, MOE_CACHE_FIFO};
  size_t row = slot[0] + slot[1], step = slot[0] / 2;
  for (int tr = 0; tr < 2; tr++)
    for (int p = 0; p < 2; p++)
      for (size_t budget = row; budget <= E * row; budget += step) {
        moe_lm_stream_config s;
        moe_lm_stream_config_default(&s);
        s.budget = budget, s.policy = pol[p], s.prefetch = 0;
        s.placement = MOE_LM_PLACE_MISS_COST;
        s.placement_trace = &traces[tr];
        moe_lm_t m;
        moe_lm_experts x;
        ASSERT_OK(moe_lm_load_streaming(&m, path, &c, &s, &x));
        moe_expert_cache_stats cs[L];
        for (int i = 0; i < L; i++) moe_expert_cache_get_stats(x.caches[i], &cs[i]);
        st = tr == 0 && p == 0 ? decode(&m, 0.0f, &got) : MOE_OK; /* the slots' count does not change the outputs */
        moe_lm_free(&m);
        moe_lm_experts_free(&x);
        ASSERT_OK(st);
        if (tr == 0 && p == 0 && memcmp(&got, &want, sizeof got)) FAIL_("budget %zu: not the whole model's bits", budget);
        ASSERT(cs[0].expert_bytes == slot[0] && cs[1].expert_bytes == slot[1]);
        ASSERT(cs[0].resident_bytes + cs[1].resident_bytes <= budget);
        int64_t best = INT64_MAX, chosen = 0;
        for (int i = 0; i < L; i++) chosen += sim_misses(&traces[tr], i, pol[p], cs[i].slots) * (int64_t)slot[i];
        for (int k0 = 1; k0 <= E; k0++)
          for (int k1 = 1; k1 <= E && k0 * slot[0] + k1 * slot[1] <= budget; k1++) {
            int64_t v = sim_misses(&traces[tr], 0, pol[p], k0) * (int64_t)slot[0] + sim_misses(&traces[tr], 1, pol[p], k1) * (int64_t)slot[1];
            if (v < best) best = v;
          }
        if (chosen != best)
          FAIL_("trace %d, %s, budget %zu: placed %d + %d (%lld bytes missed), the best split that fits misses %lld", tr,
                moe_cache_policy_name(pol[p]), budget, cs[0].slots, cs[1].slots, (long long)chosen, (long long)best);
        if (tr == 0 && p == 0 && budget >= slot[0] + 4 * slot[1] && budget < 2 * slot[0] + 4 * slot[1]) {
          ASSERT_EQ_INT(cs[0].slots, 1);
          ASSERT_EQ_INT(cs[1].slots, 4);
        }
      }
}

/* Pinned experts: each MoE layer's two most used experts of the whole model's run, read at load into 3
 * slots and never evicted: the caches miss exactly what the simulator says for the trace without the
 * pinned experts' accesses and the slots left (an evicted pinned expert would miss again), the pinned
 * experts were used, and the outputs are the whole model's bit for bit; no room past K - 1 pins. */
TEST(lm_stream_pinned_experts_never_miss) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/lm/qwen3_moe", test_fixture_dir());
  moe_lm_config c;
  static run_out want, got;
  static int32_t own[QSTEPS * QL * QE], run[QSTEPS * QL * QE], rest[QSTEPS * QL * QE];
  qwen3_whole(failed_, dir, &c, &want, own);
  moe_trace t = {QSTEPS, QL, QE, own};
  size_t slot = moe_expert_cache_slot_bytes(&c.moe);
  const moe_cache_policy pol[4] = {MOE_CACHE_LIFO, MOE_CACHE_LRU, MOE_CACHE_FIFO, MOE_CACHE_LFU};
  for (int p = 0; p < 4; p++) {
    moe_lm_stream_config s;
    moe_lm_stream_config_default(&s);
    s.budget = 6 * slot;
    s.policy = pol[p];
    s.prefetch = 0;
    s.pin_trace = &t;
    s.pin = 2;
    moe_lm_t m;
    moe_lm_experts x;
    ASSERT_OK(moe_lm_load_streaming(&m, dir, &c, &s, &x));
    int more = 0; /* a third pin has no slot: one stays for the others */
    moe_status extra = moe_expert_cache_pin(x.caches[1], &more, 1);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", moe_last_error());
    moe_expert_cache_stats at_load[QL], after[QL];
    for (int i = 1; i < QL; i++) moe_expert_cache_get_stats(x.caches[i], &at_load[i]);
    memset(run, 0, sizeof run);
    moe_status st = decode_traced(&m, 0.0f, &got, run);
    for (int i = 1; i < QL; i++) moe_expert_cache_get_stats(x.caches[i], &after[i]);
    moe_lm_free(&m);
    moe_lm_experts_free(&x);
    ASSERT_OK(st);
    if (memcmp(&got, &want, sizeof got)) FAIL_("%s with pins: not the whole model's bits", moe_cache_policy_name(pol[p]));
    ASSERT(memcmp(run, own, sizeof run) == 0); /* the same experts as the whole model's */
    if (extra != MOE_ERR_ARG || !strstr(msg, "no slot")) FAIL_("a pin past K - 1: status %d, %s", extra, msg);
    for (int i = 1; i < QL; i++) {
      ASSERT_EQ_INT(at_load[i].slots, 3);
      ASSERT_EQ_INT(at_load[i].pinned, 2);
      ASSERT_EQ_INT(at_load[i].loads, 2); /* the pins, read at load */
      ASSERT_EQ_INT(at_load[i].misses, 0);
      /* the two experts active in the most steps (ties to the lower id), and the trace without them */
      int64_t steps[QE] = {0};
      for (int b = 0; b < QSTEPS; b++)
        for (int e = 0; e < QE; e++) steps[e] += own[(b * QL + i) * QE + e] > 0;
      int first = 0, second = -1;
      for (int e = 1; e < QE; e++) first = steps[e] > steps[first] ? e : first;
      for (int e = 0; e < QE; e++)
        if (e != first && (second < 0 || steps[e] > steps[second])) second = e;
      ASSERT(steps[first] > 0 && steps[second] > 0); /* the pinned experts were used */
      memcpy(rest, own, sizeof rest);
      int64_t pinned_uses = 0;
      for (int b = 0; b < QSTEPS; b++) {
        pinned_uses += (rest[(b * QL + i) * QE + first] > 0) + (rest[(b * QL + i) * QE + second] > 0);
        rest[(b * QL + i) * QE + first] = rest[(b * QL + i) * QE + second] = 0;
      }
      moe_trace without = {QSTEPS, QL, QE, rest};
      int64_t misses = after[i].misses, want_misses = sim_misses(&without, i, pol[p], 1);
      if (misses != want_misses)
        FAIL_("%s layer %d: %lld misses with experts %d and %d pinned, the simulator says %lld without them", moe_cache_policy_name(pol[p]),
              i, (long long)misses, first, second, (long long)want_misses);
      ASSERT_EQ_INT(after[i].loads, 2 + misses); /* a pinned expert is never read again */
      ASSERT(after[i].accesses >= pinned_uses + misses);
    }
  }
}

/* moe generate --trace, then --placement miss-cost and --pin-from on that trace: the same ids, the JSON
 * naming the placement and the pins; the flags refused where they do not fit. */
TEST(lm_stream_cli_placement_and_pins) {
  char dir[512], args[2048], out[512], err[1024], text[16384], want[4096], trace[512];
  snprintf(dir, sizeof dir, "%s/lm/qwen3_moe", test_fixture_dir());
  test_tmp_path("stream_place.txt", out, sizeof out);
  test_tmp_path("stream_place_trace.csv", trace, sizeof trace);
  const char *gen = "generate --checkpoint '%s' --prompt-ids '3 9 1' --max-tokens 12 --temperature 0.8 --seed 5 --json --ignore-eos";
  size_t n = (size_t)snprintf(args, sizeof args, gen, dir);
  snprintf(args + n, sizeof args - n, " --trace '%s'", trace);
  if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
  test_read_text(out, want, sizeof want);
  moe_trace t;
  ASSERT_OK(moe_trace_load(&t, trace, 4));
  int64_t steps = t.steps;
  int layers = t.layers;
  moe_trace_free(&t);
  ASSERT_EQ_INT(steps, 12); /* the prompt, then 11 tokens (the last is not decoded) */
  ASSERT_EQ_INT(layers, 3);
  const char *ids = strstr(want, "\"ids\":[");
  ASSERT(ids);
  /* 3 slots placed by the trace; 4 slots, 2 a layer, one of them pinned */
  const char *runs[2][2] = {{" --memory-budget 11KiB --placement miss-cost --placement-trace '%s'", "\"placement\":\"miss-cost\""},
                            {" --memory-budget 14KiB --pin-from '%s' --pin 1", "\"pinned\":2,\"layers\":["}};
  for (int r = 0; r < 2; r++) {
    n = (size_t)snprintf(args, sizeof args, gen, dir);
    snprintf(args + n, sizeof args - n, runs[r][0], trace);
    if (run_moe(NULL, args, out, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    test_read_text(out, text, sizeof text);
    ASSERT(strstr(text, "\"ids\":["));
    if (strncmp(strstr(text, "\"ids\":["), ids, strcspn(ids, "]"))) FAIL_("ids differ from the run without a budget:\n%s\n%s", text, want);
    if (!strstr(text, runs[r][1])) FAIL_("moe %s: no %s in\n%s", args, runs[r][1], text);
  }
  const char *bad[4][2] = {{" --pin-from T.csv", "need --memory-budget"},
                           {" --memory-budget 11K --placement miss-cost", "go together"},
                           {" --memory-budget 11K --pin 1", "--pin needs --pin-from"},
                           {" --memory-budget 11K --placement-trace /nonexistent.csv --placement miss-cost", "/nonexistent.csv"}};
  for (int i = 0; i < 4; i++) {
    n = (size_t)snprintf(args, sizeof args, gen, dir);
    snprintf(args + n, sizeof args - n, "%s", bad[i][0]);
    ASSERT_EQ_INT(run_moe(NULL, args, out, err, sizeof err), 1);
    if (!strstr(err, bad[i][1])) FAIL_("moe %s: wanted '%s' in: %s", args, bad[i][1], err);
  }
}

/* The fixture case `family`'s checkpoint split into 3 shards (lm_shard_checkpoint: an expert's projections
 * in different shards) in a new directory dir; the model loaded whole from there decodes as the
 * unsharded fixture does, bit for bit. */
static int sharded_fixture(const char *family, char *dir, size_t n) {
  char src[512], name[96];
  snprintf(src, sizeof src, "%s/lm/%s", test_fixture_dir(), family);
  snprintf(name, sizeof name, "stream_shards_%s", family);
  if (!lm_shard_checkpoint(src, test_tmp_path(name, dir, n), 3)) return fprintf(stderr, "  cannot shard %s\n", src), 0;
  static run_out a, b;
  moe_lm_t m;
  moe_status st = moe_lm_load(&m, src, NULL);
  if (st == MOE_OK) st = decode(&m, 0.0f, &a), moe_lm_free(&m);
  if (st == MOE_OK && (st = moe_lm_load(&m, dir, NULL)) == MOE_OK) st = decode(&m, 0.0f, &b), moe_lm_free(&m);
  if (st != MOE_OK) return fprintf(stderr, "  %s: %s\n", family, moe_last_error()), 0;
  return !memcmp(&a, &b, sizeof a);
}

/* A sharded checkpoint streamed under a small budget (Mixtral's w1/w2/w3 and Qwen3-MoE's
 * gate/up/down_proj of one expert in different shards, gpt-oss's fused gate_up_proj, down_proj (or their
 * MXFP4 blocks and scales) and biases too): the all-resident model's tokens and logits bit for bit,
 * greedy and sampled, with and without prefetch, no expert read at load; and its experts buffered from
 * the shards (moe_lm_buffer_experts, serve --cache 1) decode as the model loaded whole. */
static void check_sharded(int *failed_, const char *family, int min_read) {
  char dir[512];
  ASSERT(sharded_fixture(family, dir, sizeof dir));
  moe_lm_config c;
  ASSERT_OK(moe_lm_read_config(dir, &c));
  check_streamed(failed_, dir, c, family, min_read, 1);
  static run_out want, got;
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  moe_status st = decode(&m, 0.0f, &want);
  if (st == MOE_OK) st = moe_lm_buffer_experts(&m, dir, 1, MOE_CACHE_LRU, &x);
  if (st == MOE_OK) st = decode(&m, 0.0f, &got), moe_lm_experts_free(&x);
  moe_lm_free(&m);
  ASSERT_OK(st);
  if (memcmp(&got, &want, sizeof got)) FAIL_("%s: the experts buffered from 3 shards decode otherwise", family);
}

TEST(lm_stream_sharded_mixtral_bit_identical) { check_sharded(failed_, "mixtral", 2); }
TEST(lm_stream_sharded_qwen3_moe_bit_identical) { check_sharded(failed_, "qwen3_moe", 2); }
TEST(lm_stream_sharded_gpt_oss_bit_identical) { check_sharded(failed_, "gpt_oss", 2); }
TEST(lm_stream_sharded_gpt_oss_mxfp4_bit_identical) { check_sharded(failed_, "gpt_oss_mxfp4", 8); }

/* The 3 shards of a streamed checkpoint are opened once each for every layer's cache (3 descriptors
 * held, not one a layer, gpt-oss's fused tensors too), and closed with the last cache. */
TEST(lm_stream_sharded_layers_share_one_descriptor_a_shard) {
  static const char *const fam[] = {"mixtral", "gpt_oss_mxfp4"};
  for (int k = 0; k < 2; k++) {
    char dir[512];
    ASSERT(sharded_fixture(fam[k], dir, sizeof dir));
    if (open_fds() < 0) SKIP("no /proc/self/fd to count descriptors in");
    moe_lm_stream_config s;
    moe_lm_stream_config_default(&s);
    s.budget = (size_t)1 << 20;
    int held, decoded, left;
    ASSERT(descriptors_while_streaming(dir, NULL, &s, &held, &decoded, &left));
    if (held != 3 || decoded != held)
      FAIL_("%s: %d descriptors held after loading 3 shards streamed, %d after decoding; want 3", fam[k], held,
            decoded);
    ASSERT_EQ_INT(left, 0);
  }
}

/* dir's index with tensor `name` said to be in file `shard` (NULL: left out of the index). */
static int index_points(const char *dir, const char *name, const char *shard) {
  char path[1024];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  FILE *f = fopen(path, "rb");
  char text[1 << 16];
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  cJSON *root = cJSON_Parse(text), *map = cJSON_GetObjectItem(root, "weight_map");
  int ok = map && cJSON_GetObjectItem(map, name);
  if (ok && shard) ok = cJSON_ReplaceItemInObject(map, name, cJSON_CreateString(shard));
  else if (ok) cJSON_DeleteItemFromObject(map, name);
  char *out = ok ? cJSON_Print(root) : NULL;
  f = out ? fopen(path, "w") : NULL;
  ok = f && fputs(out, f) >= 0;
  if (f) ok &= fclose(f) == 0;
  cJSON_Delete(root);
  free(out);
  return ok;
}

/* Whether msg names every one of the strings (c may be NULL); prints it otherwise. */
static int names(const char *msg, const char *a, const char *b, const char *c) {
  if (strstr(msg, a) && strstr(msg, b) && (!c || strstr(msg, c))) return 1;
  fprintf(stderr, "  the message does not name '%s', '%s'%s%s: %s\n", a, b, c ? ", " : "", c ? c : "", msg);
  return 0;
}

/* A sharded checkpoint of `family` gone bad: a shard missing, or cut short, refused at load naming the
 * shard; a shard cut short while the model is served, an error at the read naming the shard and the
 * tensor; the index naming a shard that lacks expert tensor `moved`, or not naming it at all, refused
 * at load naming both. Never a crash. */
static void check_bad_shards(int *failed_, const char *family, const char *moved) {
  char dir[512], shard[1024], msg[1024];
  const char *file = "model-00002-of-00003.safetensors";
  ASSERT(sharded_fixture(family, dir, sizeof dir));
  lm_shard_path(dir, 2, 3, shard, sizeof shard);
  ASSERT(truncate(shard, 4096) == 0);
  ASSERT_STATUS(stream_decode(dir, -1, msg, sizeof msg), MOE_ERR_FORMAT);
  ASSERT(names(msg, file, "model.layers.", NULL));
  ASSERT(unlink(shard) == 0);
  ASSERT(stream_decode(dir, -1, msg, sizeof msg) != MOE_OK);
  ASSERT(names(msg, file, "No such file", NULL));
  /* cut while served: the experts read after it fail naming the shard and a tensor of it */
  ASSERT(sharded_fixture(family, dir, sizeof dir));
  moe_lm_stream_config s;
  moe_lm_stream_config_default(&s);
  s.budget = (size_t)1 << 20;
  moe_lm_t m;
  moe_lm_experts x;
  ASSERT_OK(moe_lm_load_streaming(&m, dir, NULL, &s, &x));
  static run_out o;
  moe_status st = truncate(shard, 4096) == 0 ? decode(&m, 0.0f, &o) : MOE_ERR_IO;
  snprintf(msg, sizeof msg, "%s", moe_last_error());
  moe_lm_free(&m);
  moe_lm_experts_free(&x);
  ASSERT_STATUS(st, MOE_ERR_IO);
  ASSERT(names(msg, file, "reading tensor 'model.layers.", "experts."));
  /* the index says shard 2 holds a tensor of shard 1 (or shard 1 one of shard 2), then names no shard */
  for (int left_out = 0; left_out < 2; left_out++) {
    ASSERT(sharded_fixture(family, dir, sizeof dir));
    char own[1024];
    lm_shard_path(dir, 1, 3, own, sizeof own);
    moe_st *f;
    ASSERT_OK(moe_st_open_lazy(&f, own));
    int in_first = moe_st_has(f, moved);
    moe_st_close(f);
    const char *wrong = in_first ? file : "model-00001-of-00003.safetensors";
    ASSERT(index_points(dir, moved, left_out ? NULL : wrong));
    ASSERT_STATUS(stream_decode(dir, -1, msg, sizeof msg), MOE_ERR_MISSING);
    ASSERT(names(msg, left_out ? "weight_map" : wrong, moved, NULL));
  }
}

TEST(lm_stream_sharded_missing_short_or_wrong_shard_is_an_error_naming_it) {
  check_bad_shards(failed_, "mixtral", "model.layers.1.block_sparse_moe.experts.2.w3.weight");
}
/* gpt-oss's fused tensors: the MXFP4 blocks of a down-projection */
TEST(lm_stream_sharded_gpt_oss_missing_short_or_wrong_shard_is_an_error_naming_it) {
  check_bad_shards(failed_, "gpt_oss_mxfp4", "model.layers.1.mlp.experts.down_proj_blocks");
}
