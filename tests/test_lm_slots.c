/* Continuous batching's decode (moe_lm_decode_slots): sequences that join and leave a running batch,
 * each in its own cache slot at its own length, get the logits and greedy tokens of decoding each one
 * alone with moe_lm_decode. */
#include <string.h>

#include "lm_check.h"
#include "test.h"

enum { NSEQ = 4, NEW = 8, V = 64 };

typedef struct {
  int n, join; /* prompt length, the batch step at which it joins */
  int32_t prompt[6];
  int32_t ids[NEW];
  float logits[NEW][V]; /* the logits each new token was drawn from */
} seq;

static int argmax(const float *l) {
  int b = 0;
  for (int i = 1; i < V; i++) b = l[i] > l[b] ? i : b;
  return b;
}

/* Greedy decoding of s alone, as moe generate does it. */
static int alone(moe_lm_t *m, seq *s) {
  moe_lm_cache *kv;
  if (moe_lm_cache_new(&kv, m, 1) || moe_lm_decode(m, kv, s->prompt, s->n)) return 0;
  const float *l = moe_lm_logits(m) + (size_t)(s->n - 1) * V;
  for (int i = 0; i < NEW; i++) {
    memcpy(s->logits[i], l, sizeof s->logits[i]);
    s->ids[i] = argmax(l);
    if (moe_lm_decode(m, kv, &s->ids[i], 1)) return 0;
    l = moe_lm_logits(m);
  }
  moe_lm_cache_free(kv);
  return 1;
}

TEST(lm_decode_slots_equal_each_sequence_alone) {
  char dir[512];
  moe_lm_t m;
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  ASSERT_EQ_INT(m.cfg.vocab, V);
  /* the last sequence joins when the first has left and takes its slot again */
  seq want[NSEQ] = {{.n = 3, .join = 0, .prompt = {5, 9, 1}},
                    {.n = 5, .join = 2, .prompt = {7, 7, 2, 40, 11}},
                    {.n = 2, .join = 3, .prompt = {60, 3}},
                    {.n = 6, .join = NEW + 1, .prompt = {1, 2, 3, 4, 5, 6}}};
  static seq got[NSEQ];
  memcpy(got, want, sizeof got);
  for (int i = 0; i < NSEQ; i++) ASSERT(alone(&m, &want[i]));
  moe_lm_cache *kv;
  ASSERT_OK(moe_lm_cache_new(&kv, &m, 3));
  int slot[NSEQ], done[NSEQ] = {0}, used[3] = {0}, peak = 0;
  double worst = 0;
  for (int step = 0, left = NSEQ; left; step++) {
    for (int i = 0; i < NSEQ; i++) /* joining: the prompt in a free slot, the first token from its logits */
      if (got[i].join == step) {
        slot[i] = 0;
        while (used[slot[i]]) slot[i]++;
        used[slot[i]] = 1;
        moe_lm_cache_slot_reset(kv, slot[i]);
        ASSERT_OK(moe_lm_decode_slots(&m, kv, &slot[i], 1, got[i].prompt, got[i].n));
        memcpy(got[i].logits[0], moe_lm_logits(&m) + (size_t)(got[i].n - 1) * V, sizeof got[i].logits[0]);
        got[i].ids[0] = argmax(got[i].logits[0]);
        done[i] = 1;
      }
    int rows[NSEQ], slots[NSEQ], n = 0;
    int32_t in[NSEQ];
    for (int i = 0; i < NSEQ; i++)
      if (got[i].join <= step && done[i] <= NEW && got[i].join != step) {
        rows[n] = i, slots[n] = slot[i], in[n++] = got[i].ids[done[i] - 1];
      }
    if (!n) continue;
    peak = n > peak ? n : peak;
    ASSERT_OK(moe_lm_decode_slots(&m, kv, slots, n, in, 1));
    for (int r = 0; r < n; r++) {
      seq *s = &got[rows[r]];
      if (done[rows[r]] == NEW) { /* its last token is in: it leaves */
        used[slot[rows[r]]] = 0, done[rows[r]]++, left--;
        continue;
      }
      memcpy(s->logits[done[rows[r]]], moe_lm_logits(&m) + (size_t)r * V, sizeof s->logits[0]);
      s->ids[done[rows[r]]] = argmax(s->logits[done[rows[r]]]);
      done[rows[r]]++;
    }
  }
  ASSERT_EQ_INT(peak, 3);
  ASSERT_EQ_INT(slot[NSEQ - 1], slot[0]);
  ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, slot[NSEQ - 1]), got[NSEQ - 1].n + NEW);
  for (int i = 0; i < NSEQ; i++) {
    for (int t = 0; t < NEW; t++) {
      if (got[i].ids[t] != want[i].ids[t]) FAIL_("sequence %d token %d: %d in the batch, %d alone", i, t, got[i].ids[t], want[i].ids[t]);
      for (int v = 0; v < V; v++) worst = fmax(worst, fabs(got[i].logits[t][v] - want[i].logits[t][v]));
    }
  }
  fprintf(stderr, "  batched against alone: max logit diff %.3g\n", worst);
  ASSERT(worst < 1e-5);
  int bad[2] = {0, 0};
  int32_t tk[2] = {1, 2};
  ASSERT_STATUS(moe_lm_decode_slots(&m, kv, bad, 2, tk, 1), MOE_ERR_ARG); /* a slot twice */
  bad[1] = 3;
  ASSERT_STATUS(moe_lm_decode_slots(&m, kv, bad, 2, tk, 1), MOE_ERR_ARG); /* out of range */
  ASSERT(strstr(moe_last_error(), "slot 3"));
  moe_lm_cache_slot_reset(kv, 0);
  int32_t many[64] = {0};
  ASSERT_OK(moe_lm_decode_slots(&m, kv, bad, 1, many, 5)); /* the trace counts: 5 tokens, top-2, per layer */
  for (int l = 0; l < m.cfg.n_layers; l++) {
    int sum = 0;
    for (int e = 0; e < m.cfg.moe.E; e++) sum += moe_lm_cache_expert_counts(kv)[l * m.cfg.moe.E + e];
    ASSERT_EQ_INT(sum, 5 * m.cfg.moe.top_k);
  }
  moe_lm_cache_slot_reset(kv, 0);
  ASSERT_STATUS(moe_lm_decode_slots(&m, kv, bad, 1, many, 65), MOE_ERR_ARG); /* past max_seq */
  moe_lm_cache_free(kv);
  moe_lm_free(&m);
}

/* Expert buffering (moe_lm_buffer_experts): K = 1 and 2 of 4 experts resident, LIFO and LRU, give the
 * all-resident model's logits bit for bit over a prompt and greedy steps, from the checkpoint and from it
 * split into 3 shards; the caches count their misses. */
TEST(lm_buffered_experts_decode_bit_identical) {
  char dir[512], shards[512];
  moe_lm_t all, buf;
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  ASSERT(lm_shard_checkpoint(dir, test_tmp_path("buffered_shards", shards, sizeof shards), 3));
  ASSERT_OK(moe_lm_load(&all, dir, NULL));
  seq want = {.n = 5, .prompt = {7, 7, 2, 40, 11}};
  ASSERT(alone(&all, &want));
  moe_lm_free(&all);
  for (int k = 0; k < 4; k++) {
    int K = 1 + k % 2;
    const char *from = k < 2 ? dir : shards;
    moe_lm_experts x;
    ASSERT_OK(moe_lm_load(&buf, from, NULL));
    ASSERT_OK(moe_lm_buffer_experts(&buf, from, K, K == 1 ? MOE_CACHE_LIFO : MOE_CACHE_LRU, &x));
    ASSERT(!moe_lm_find(&buf, "model.layers.0.block_sparse_moe.experts.1.w2.weight")->data);
    seq got = want;
    ASSERT(alone(&buf, &got));
    ASSERT(!memcmp(got.logits, want.logits, sizeof got.logits));
    moe_expert_cache_stats st;
    moe_expert_cache_get_stats(x.caches[1], &st);
    ASSERT(st.misses > 0 && st.accesses >= st.misses);
    ASSERT_EQ_INT((int)st.resident_bytes, K * 3 * 32 * 32 * 4); /* w1, w2, w3 of 32 x 32, fp32 */
    moe_lm_free(&buf);
    moe_lm_experts_free(&x);
  }
  ASSERT_OK(moe_lm_load(&buf, dir, NULL));
  moe_lm_experts x;
  ASSERT_STATUS(moe_lm_buffer_experts(&buf, "/nonexistent", 2, MOE_CACHE_LIFO, &x), MOE_ERR_IO);
  moe_lm_free(&buf);
}

/* moe_lm_cache_last_logits: prompts of 3 tokens in 2 slots (moe_lm_decode_slots) and in a cache of one
 * sequence (moe_lm_decode) leave one row of logits each, that of their last position in the full
 * logits (to rounding: the output layer runs on other rows); the next decode after it, and turned off,
 * the full (rows, T, vocab) again. */
TEST(lm_cache_last_logits_are_the_last_positions) {
  char dir[512];
  moe_lm_t m;
  snprintf(dir, sizeof dir, "%s/lm/mixtral", test_fixture_dir());
  ASSERT_OK(moe_lm_load(&m, dir, NULL));
  const int32_t p[2][3] = {{5, 9, 1}, {60, 3, 17}};
  int slots[2] = {1, 0};
  static float full[2][3][V], last[2][V];
  moe_lm_cache *kv;
  ASSERT_OK(moe_lm_cache_new(&kv, &m, 2));
  for (int on = 0; on < 2; on++) {
    moe_lm_cache_last_logits(kv, on);
    for (int b = 0; b < 2; b++) moe_lm_cache_slot_reset(kv, b);
    ASSERT_OK(moe_lm_decode_slots(&m, kv, slots, 2, &p[0][0], 3));
    memcpy(on ? (float *)last : (float *)full, moe_lm_logits(&m), on ? sizeof last : sizeof full);
  }
  for (int b = 0; b < 2; b++)
    for (int v = 0; v < V; v++) ASSERT_NEAR(last[b][v], full[b][2][v], 1e-5);
  int32_t next[2] = {argmax(last[0]), argmax(last[1])};
  ASSERT_OK(moe_lm_decode_slots(&m, kv, slots, 2, next, 1)); /* T 1: one row each, as without */
  moe_lm_cache_last_logits(kv, 0);
  ASSERT_EQ_INT(moe_lm_cache_slot_len(kv, 0), 4);
  moe_lm_cache_free(kv);
  moe_lm_cache *one;
  ASSERT_OK(moe_lm_cache_new(&one, &m, 1));
  moe_lm_cache_last_logits(one, 1);
  ASSERT_OK(moe_lm_decode(&m, one, p[1], 3));
  for (int v = 0; v < V; v++) ASSERT_NEAR(moe_lm_logits(&m)[v], full[1][2][v], 1e-5);
  moe_lm_cache_last_logits(one, 0);
  moe_lm_cache_reset(one);
  ASSERT_OK(moe_lm_decode(&m, one, p[1], 3));
  for (int v = 0; v < V; v++) ASSERT_NEAR(moe_lm_logits(&m)[2 * V + v], full[1][2][v], 1e-5);
  moe_lm_cache_free(one);
  moe_lm_free(&m);
}
