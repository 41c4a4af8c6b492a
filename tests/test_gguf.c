/* GGUF files (src/formats/gguf.c, gguf_write.c): the writer's bytes against a file laid out here from
 * the specification (docs/gguf.md of ggml), the reader's values, a round trip of every type, and
 * malformed files each refused with the field named. */
#include <stdlib.h>

#include "internal.h"
#include "run_cli.h"
#include "test.h"

/* ---------------------------------------------------------------- files laid out by hand */

typedef struct {
  uint8_t b[4096];
  size_t n;
} bytes;

static void put(bytes *f, const void *p, size_t n) {
  memcpy(f->b + f->n, p, n);
  f->n += n;
}
static void le(bytes *f, uint64_t v, int n) {
  for (int i = 0; i < n; i++) f->b[f->n++] = (uint8_t)(v >> (8 * i));
}
static void str(bytes *f, const char *s) {
  le(f, strlen(s), 8);
  put(f, s, strlen(s));
}
static void pad(bytes *f, size_t a) {
  while (f->n % a) f->b[f->n++] = 0;
}

/* One thing wrong with the file, or nothing. */
enum bad { GOOD, MAGIC, VERSION, KV_COUNT, T_COUNT, VTYPE, STRLEN, BOOLV, ARR_COUNT, DUP_KEY, ALIGN, NDIM, TTYPE,
           ROWLEN, UNALIGNED, OVERLAP, DUP_NAME, DIM_OVERFLOW, EMPTY_OVERFLOW, LONG_NAME, KEY_BINARY, PAST_END };

/* The test file: 4 metadata entries (a string, a u32, a bool, an array of 3 strings) and 2 tensors
 * (t.a: F32 [8] at 0; t.b: Q8_0 [32, 2] at 32), alignment 32, as the specification lays them out. */
static void make(bytes *f, enum bad bad) {
  bytes kv = {{0}, 0};
  int nkv = 0;
  str(&kv, "general.architecture"), le(&kv, 8, 4), le(&kv, bad == STRLEN ? UINT64_C(1) << 40 : 5, 8),
      put(&kv, "llama", 5), nkv++;
  str(&kv, bad == KEY_BINARY ? "llama.expert\ncount" : "llama.expert_count"), le(&kv, bad == VTYPE ? 13 : 4, 4),
      le(&kv, 8, 4), nkv++;
  str(&kv, "moe.flag"), le(&kv, 7, 4), le(&kv, bad == BOOLV ? 2 : 1, 1), nkv++;
  str(&kv, "tokenizer.ggml.tokens"), le(&kv, 9, 4), le(&kv, 8, 4), le(&kv, bad == ARR_COUNT ? UINT64_C(1) << 40 : 3, 8);
  str(&kv, "a"), str(&kv, "bc"), str(&kv, ""), nkv++;
  if (bad == DUP_KEY) str(&kv, "moe.flag"), le(&kv, 7, 4), le(&kv, 0, 1), nkv++;
  if (bad == ALIGN) str(&kv, "general.alignment"), le(&kv, 4, 4), le(&kv, 48, 4), nkv++;

  put(f, bad == MAGIC ? "GGUX" : "GGUF", 4);
  le(f, bad == VERSION ? 4 : 3, 4);
  le(f, bad == T_COUNT ? UINT64_C(1) << 40 : 2, 8);
  le(f, bad == KV_COUNT ? UINT64_C(1) << 40 : (uint64_t)nkv, 8);
  put(f, kv.b, kv.n);
  str(f, "t.a"), le(f, 1, 4), le(f, 8, 8), le(f, 0, 4), le(f, 0, 8);
  char long_name[66];
  memset(long_name, 'b', 65), long_name[65] = 0; /* one byte more than the specification allows */
  str(f, bad == DUP_NAME ? "t.a" : bad == LONG_NAME ? long_name : "t.b");
  if (bad == DIM_OVERFLOW || bad == EMPTY_OVERFLOW) /* a zero row length must not hide the overflow (fuzz_gguf found it) */
    le(f, 3, 4), le(f, bad == DIM_OVERFLOW ? 32 : 0, 8), le(f, UINT64_C(1) << 62, 8), le(f, 4, 8);
  else le(f, bad == NDIM ? 5 : 2, 4), le(f, bad == ROWLEN ? 16 : 32, 8), le(f, 2, 8);
  if (bad == NDIM) le(f, 1, 8), le(f, 1, 8), le(f, 1, 8);
  le(f, bad == TTYPE ? 4 : 8, 4);
  le(f, bad == UNALIGNED ? 16 : bad == OVERLAP ? 0 : bad == PAST_END ? 64 : 32, 8);
  pad(f, 32);
  for (int i = 0; i < 8; i++) { /* t.a: 0.5 * i */
    float v = 0.5f * (float)i;
    uint32_t u;
    memcpy(&u, &v, 4);
    le(f, u, 4);
  }
  for (int r = 0; r < 2; r++) { /* t.b: d = 0.25 (f16 0x3400), q = i - 16 + r */
    le(f, 0x3400, 2);
    for (int i = 0; i < 32; i++) le(f, (uint8_t)(int8_t)(i - 16 + r), 1);
  }
  pad(f, 32);
}

/* Written plainly (not atomically: no fsync for each of the hundreds of cut files). */
static const char *save(const bytes *f, const char *name, char *buf) {
  FILE *fp = fopen(test_tmp_path(name, buf, 512), "wb");
  int ok = fp && fwrite(f->b, 1, f->n, fp) == f->n;
  return fp && !fclose(fp) && ok ? buf : NULL;
}

/* ---------------------------------------------------------------- tests */

TEST(gguf_writer_bytes_match_spec) {
  bytes want = {{0}, 0};
  make(&want, GOOD);
  /* the spec's fields at their places: magic, version, counts, the first key, its type and value */
  ASSERT(!memcmp(want.b, "GGUF", 4) && want.b[4] == 3 && want.b[8] == 2 && want.b[16] == 4);
  ASSERT(want.b[24] == 20 && !memcmp(want.b + 32, "general.architecture", 20) && want.b[52] == 8);
  ASSERT(want.b[56] == 5 && !memcmp(want.b + 64, "llama", 5));

  moe_gguf_writer *w;
  ASSERT_OK(moe_gguf_writer_new(&w));
  const char *toks[] = {"a", "bc", ""};
  float a[8];
  uint8_t q[68];
  for (int i = 0; i < 8; i++) a[i] = 0.5f * (float)i;
  for (int r = 0; r < 2; r++) {
    q[34 * r] = 0x00, q[34 * r + 1] = 0x34;
    for (int i = 0; i < 32; i++) q[34 * r + 2 + i] = (uint8_t)(int8_t)(i - 16 + r);
  }
  int64_t ne_a[1] = {8}, ne_b[2] = {32, 2};
  ASSERT_OK(moe_gguf_writer_set_str(w, "general.architecture", "gpt2"));
  ASSERT_OK(moe_gguf_writer_set_u32(w, "llama.expert_count", 8));
  ASSERT_OK(moe_gguf_writer_set_bool(w, "moe.flag", 1));
  ASSERT_OK(moe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3));
  ASSERT_OK(moe_gguf_writer_set_str(w, "general.architecture", "llama")); /* replaced in place */
  ASSERT_OK(moe_gguf_writer_add_tensor(w, "t.a", MOE_GGUF_F32, 1, ne_a, a, sizeof a));
  ASSERT_OK(moe_gguf_writer_add_tensor(w, "t.b", MOE_GGUF_Q8_0, 2, ne_b, q, sizeof q));
  ASSERT_STATUS(moe_gguf_writer_add_tensor(w, "t.b", MOE_GGUF_Q8_0, 2, ne_b, q, sizeof q), MOE_ERR_ARG);
  ASSERT_STATUS(moe_gguf_writer_add_tensor(w, "t.c", MOE_GGUF_Q8_0, 2, ne_b, q, 34), MOE_ERR_SHAPE);
  ASSERT_STATUS(moe_gguf_writer_add_tensor(w, "t.d", MOE_GGUF_Q8_0, 1, ne_a, q, 34), MOE_ERR_SHAPE);
  char path[512];
  ASSERT_OK(moe_gguf_writer_save(w, test_tmp_path("w.gguf", path, sizeof path)));
  moe_gguf_writer_free(w);
  size_t n;
  char *got = test_read_file(path, &n);
  ASSERT(got);
  for (size_t i = 0; i < n && i < want.n; i++)
    if ((uint8_t)got[i] != want.b[i]) {
      uint8_t g = (uint8_t)got[i];
      free(got);
      FAIL_("byte %zu: %02x, the spec's layout has %02x", i, g, want.b[i]);
    }
  free(got);
  ASSERT_EQ_INT(n, want.n);
}

TEST(gguf_reader_values) {
  bytes f = {{0}, 0};
  make(&f, GOOD);
  char buf[512];
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, save(&f, "r.gguf", buf)));
  ASSERT_EQ_INT(moe_gguf_kv_count(g), 4);
  ASSERT_EQ_INT(moe_gguf_alignment(g), 32);
  ASSERT_EQ_INT(moe_gguf_data_offset(g) % 32, 0);
  const char *s;
  size_t len;
  ASSERT_OK(moe_gguf_get_str(g, "general.architecture", &s));
  ASSERT(!strcmp(s, "llama"));
  uint32_t u;
  uint64_t u64;
  int32_t i32;
  int b;
  ASSERT_OK(moe_gguf_get_u32(g, "llama.expert_count", &u));
  ASSERT_EQ_INT(u, 8);
  ASSERT_OK(moe_gguf_get_u64(g, "llama.expert_count", &u64));
  ASSERT_OK(moe_gguf_get_i32(g, "llama.expert_count", &i32));
  ASSERT_EQ_INT(u64 + (uint64_t)i32, 16);
  ASSERT_OK(moe_gguf_get_bool(g, "moe.flag", &b));
  ASSERT_EQ_INT(b, 1);
  moe_gguf_vtype et;
  uint64_t n;
  ASSERT_OK(moe_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n));
  ASSERT(et == MOE_GGUFV_STRING && n == 3);
  ASSERT_OK(moe_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s, &len));
  ASSERT(!strcmp(s, "bc") && len == 2);
  ASSERT_OK(moe_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 2, &s, &len));
  ASSERT(!strcmp(s, "") && len == 0);
  ASSERT_STATUS(moe_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 3, &s, &len), MOE_ERR_ARG);
  /* the wrong kind, absent keys */
  ASSERT_STATUS(moe_gguf_get_u32(g, "general.architecture", &u), MOE_ERR_DTYPE);
  ASSERT(strstr(moe_last_error(), "'general.architecture' is a string value, want a u32"));
  ASSERT_STATUS(moe_gguf_get_f32(g, "llama.expert_count", &(float){0}), MOE_ERR_DTYPE);
  ASSERT_STATUS(moe_gguf_get_str(g, "tokenizer.ggml.tokens", &s), MOE_ERR_DTYPE);
  ASSERT(strstr(moe_last_error(), "an array of string"));
  ASSERT_STATUS(moe_gguf_get_u32(g, "llama.block_count", &u), MOE_ERR_MISSING);
  ASSERT(strstr(moe_last_error(), "llama.block_count") && strstr(moe_last_error(), "r.gguf"));
  /* tensors: by index and name, shapes in ggml's order, rows as floats */
  ASSERT_EQ_INT(moe_gguf_tensor_count(g), 2);
  moe_gguf_tensor t;
  ASSERT_OK(moe_gguf_tensor_get(g, "t.b", &t));
  ASSERT(t.type == MOE_GGUF_Q8_0 && t.ndim == 2 && t.ne[0] == 32 && t.ne[1] == 2 && t.nrows == 2 && t.nbytes == 68);
  ASSERT_EQ_INT(t.file_offset, moe_gguf_data_offset(g) + 32);
  ASSERT_EQ_INT(((const uint8_t *)t.data)[0], 0x00);
  float row[32];
  ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, 1, row));
  for (int i = 0; i < 32; i++) ASSERT(row[i] == 0.25f * (float)(i - 15));
  ASSERT_STATUS(moe_gguf_tensor_row_f32(g, &t, 2, row), MOE_ERR_ARG);
  ASSERT_OK(moe_gguf_tensor_at(g, 0, &t));
  ASSERT(!strcmp(t.name, "t.a") && t.ndim == 1 && t.ne[0] == 8 && t.ne[1] == 1 && t.nrows == 1);
  ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, 0, row));
  ASSERT(row[7] == 3.5f);
  ASSERT_STATUS(moe_gguf_tensor_get(g, "t.c", &t), MOE_ERR_MISSING);
  ASSERT(strstr(moe_last_error(), "'t.c'"));
  ASSERT(moe_gguf_has_tensor(g, "t.a") && !moe_gguf_has_tensor(g, "t"));
  moe_gguf_close(g);
}

TEST(gguf_roundtrip_all_types) {
  static const moe_gguf_type types[] = {MOE_GGUF_F32, MOE_GGUF_F16, MOE_GGUF_BF16, MOE_GGUF_Q8_0, MOE_GGUF_Q4_0,
                                        MOE_GGUF_Q4_K, MOE_GGUF_Q5_K, MOE_GGUF_Q6_K, MOE_GGUF_MXFP4};
  enum { NT = 9, COLS = 256, ROWS = 3 };
  uint8_t *data[NT];
  float x[COLS * ROWS], y[COLS];
  uint64_t seed = 5;
  for (int i = 0; i < COLS * ROWS; i++) x[i] = moe__uniform(&seed);
  moe_gguf_writer *w;
  ASSERT_OK(moe_gguf_writer_new(&w));
  ASSERT_OK(moe_gguf_writer_set_u32(w, "general.alignment", 64));
  ASSERT_OK(moe_gguf_writer_set_i32(w, "k.i32", -7));
  ASSERT_OK(moe_gguf_writer_set_u64(w, "k.u64", UINT64_C(1) << 40));
  ASSERT_OK(moe_gguf_writer_set_f32(w, "k.f32", 1e-5f));
  ASSERT_OK(moe_gguf_writer_set_bool(w, "k.bool", 0));
  const int32_t iv[3] = {-1, 0, 2147483647};
  const float fv[2] = {0.5f, -2};
  ASSERT_OK(moe_gguf_writer_set_arr_i32(w, "k.ints", iv, 3));
  ASSERT_OK(moe_gguf_writer_set_arr_f32(w, "k.floats", fv, 2));
  ASSERT_OK(moe_gguf_writer_set_arr_str(w, "k.none", NULL, 0));
  for (int t = 0; t < NT; t++) {
    size_t nb = (size_t)(COLS * ROWS / moe_gguf_type_block(types[t])) * moe_gguf_type_block_bytes(types[t]);
    data[t] = malloc(nb);
    ASSERT(data[t]);
    ASSERT_OK(moe_gguf_quantize(types[t], x, data[t], COLS * ROWS));
    char name[32];
    snprintf(name, sizeof name, "blk.%d.w", t);
    int64_t ne[3] = {COLS, 1, ROWS};
    ASSERT_OK(moe_gguf_writer_add_tensor(w, name, types[t], 3, ne, data[t], nb));
  }
  char path[512], path2[512];
  ASSERT_OK(moe_gguf_writer_save(w, test_tmp_path("rt.gguf", path, sizeof path)));
  moe_gguf_writer_free(w);

  /* copied entry by entry into another file, the metadata reads the same */
  moe_gguf *g0, *g;
  ASSERT_OK(moe_gguf_open(&g0, path));
  ASSERT_OK(moe_gguf_writer_new(&w));
  for (int64_t i = 0; i < moe_gguf_kv_count(g0); i++) ASSERT_OK(moe_gguf_writer_copy_kv(w, g0, i));
  ASSERT_OK(moe_gguf_writer_save(w, test_tmp_path("rt2.gguf", path2, sizeof path2)));
  moe_gguf_writer_free(w);
  ASSERT_OK(moe_gguf_open(&g, path2));
  for (int pass = 0; pass < 2; pass++, g = g0) {
    ASSERT_EQ_INT(moe_gguf_alignment(g), 64);
    int32_t i32;
    uint64_t u64;
    float f;
    int b;
    int64_t ints[3];
    float floats[2];
    ASSERT_OK(moe_gguf_get_i32(g, "k.i32", &i32));
    ASSERT_OK(moe_gguf_get_u64(g, "k.u64", &u64));
    ASSERT_OK(moe_gguf_get_f32(g, "k.f32", &f));
    ASSERT_OK(moe_gguf_get_bool(g, "k.bool", &b));
    ASSERT(i32 == -7 && u64 == UINT64_C(1) << 40 && f == 1e-5f && b == 0);
    ASSERT_STATUS(moe_gguf_get_u32(g, "k.i32", &(uint32_t){0}), MOE_ERR_VALUE);
    ASSERT_STATUS(moe_gguf_get_u32(g, "k.u64", &(uint32_t){0}), MOE_ERR_VALUE);
    ASSERT(strstr(moe_last_error(), "k.u64") && strstr(moe_last_error(), "1099511627776"));
    ASSERT_OK(moe_gguf_get_arr_int(g, "k.ints", ints, 3));
    ASSERT(ints[0] == -1 && ints[1] == 0 && ints[2] == 2147483647);
    ASSERT_STATUS(moe_gguf_get_arr_int(g, "k.ints", ints, 2), MOE_ERR_SHAPE);
    ASSERT_OK(moe_gguf_get_arr_f32(g, "k.floats", floats, 2));
    ASSERT(floats[0] == 0.5f && floats[1] == -2);
    moe_gguf_vtype et;
    uint64_t n;
    ASSERT_OK(moe_gguf_get_arr(g, "k.none", &et, &n));
    ASSERT(et == MOE_GGUFV_STRING && n == 0);
    if (pass == 0) moe_gguf_close(g);
  }
  /* every tensor: aligned, its bytes as written, its rows as dequantized from them */
  ASSERT_EQ_INT(moe_gguf_data_offset(g0) % 64, 0);
  for (int t = 0; t < NT; t++) {
    moe_gguf_tensor v;
    ASSERT_OK(moe_gguf_tensor_at(g0, t, &v));
    ASSERT(v.type == types[t] && v.ndim == 3 && v.ne[0] == COLS && v.ne[2] == ROWS && v.nrows == ROWS);
    ASSERT_EQ_INT(v.file_offset % 64, 0);
    ASSERT(!memcmp(v.data, data[t], v.nbytes));
    float want[COLS];
    size_t row = v.nbytes / ROWS;
    ASSERT_OK(moe_gguf_tensor_row_f32(g0, &v, 2, y));
    ASSERT_OK(moe_gguf_dequantize(types[t], data[t] + 2 * row, want, COLS));
    ASSERT(!memcmp(y, want, sizeof y));
    if (types[t] == MOE_GGUF_F32) ASSERT(!memcmp(y, x + 2 * COLS, sizeof y));
    free(data[t]);
  }
  moe_gguf_close(g0);
}

TEST(gguf_rejects_malformed) {
  static const struct { enum bad bad; moe_status st; const char *says; } cases[] = {
      {MAGIC, MOE_ERR_FORMAT, "not \"GGUF\""},
      {VERSION, MOE_ERR_FORMAT, "version 4"},
      {KV_COUNT, MOE_ERR_FORMAT, "metadata_kv_count 1099511627776"},
      {T_COUNT, MOE_ERR_FORMAT, "tensor_count 1099511627776"},
      {VTYPE, MOE_ERR_FORMAT, "metadata 1 ('llama.expert_count'): unknown value type 13"},
      {STRLEN, MOE_ERR_FORMAT, "metadata 0 ('general.architecture') string needs 1099511627776 bytes"},
      {BOOLV, MOE_ERR_FORMAT, "('moe.flag'): bool value 2"},
      {ARR_COUNT, MOE_ERR_FORMAT, "('tokenizer.ggml.tokens') array of 1099511627776 string"},
      {DUP_KEY, MOE_ERR_FORMAT, "duplicate metadata key 'moe.flag'"},
      {ALIGN, MOE_ERR_FORMAT, "general.alignment 48 is not a power of two"},
      {NDIM, MOE_ERR_FORMAT, "tensor 't.b': n_dimensions 5"},
      {TTYPE, MOE_ERR_DTYPE, "tensor 't.b': unknown type 4"},
      {ROWLEN, MOE_ERR_FORMAT, "tensor 't.b': row length ne[0] = 16 is not a multiple of Q8_0's block of 32"},
      {UNALIGNED, MOE_ERR_FORMAT, "tensor 't.b': offset 16 is not a multiple of the alignment 32"},
      {OVERLAP, MOE_ERR_FORMAT, "tensors 't.a' and 't.b' overlap"},
      {DUP_NAME, MOE_ERR_FORMAT, "duplicate tensor name 't.a'"},
      {DIM_OVERFLOW, MOE_ERR_FORMAT, "tensor 't.b': dimension 1 = 4611686018427387904 makes the element count overflow"},
      {EMPTY_OVERFLOW, MOE_ERR_FORMAT, "tensor 't.b': dimension 2 = 4 makes the element count overflow"},
      {LONG_NAME, MOE_ERR_FORMAT, "tensor info 1 name length 65 exceeds 64"},
      {KEY_BINARY, MOE_ERR_FORMAT, "metadata 1 at offset"},
      {PAST_END, MOE_ERR_FORMAT, "tensor 't.b': data at offset 64 + 68 bytes runs past the end"},
  };
  char buf[512];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    bytes f = {{0}, 0};
    make(&f, cases[i].bad);
    moe_gguf *g = NULL;
    moe_status st = moe_gguf_open(&g, save(&f, "bad.gguf", buf));
    if (st != cases[i].st || !strstr(moe_last_error(), cases[i].says) || !strstr(moe_last_error(), "bad.gguf"))
      FAIL_("case %zu: %s: %s; want %s with \"%s\"", i, moe_status_name(st), moe_last_error(),
            moe_status_name(cases[i].st), cases[i].says);
    ASSERT(!g);
  }
  /* every truncation before the end of the last tensor's data (the padding after it is not needed) */
  bytes f = {{0}, 0};
  make(&f, GOOD);
  size_t data_end = f.n - 28; /* the Q8_0 tensor ends 28 bytes of padding before the end */
  for (size_t n = 0; n < f.n; n++) {
    bytes t = f;
    t.n = n;
    moe_gguf *g = NULL;
    moe_status st = moe_gguf_open(&g, save(&t, "cut.gguf", buf));
    if (n < data_end && (st != MOE_ERR_FORMAT || (n >= 24 && !strstr(moe_last_error(), "truncated"))))
      FAIL_("cut at %zu of %zu bytes: %s: %s", n, f.n, moe_status_name(st), moe_last_error());
    if (n >= data_end && st != MOE_OK) FAIL_("cut at %zu (after the data): %s", n, moe_last_error());
    moe_gguf_close(g);
  }
  ASSERT_STATUS(moe_gguf_open(&(moe_gguf *){0}, "/nonexistent/x.gguf"), MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "/nonexistent/x.gguf"));
}

/* ---------------------------------------------------------------- the command line */

/* A small MoE-shaped file with llama.cpp's names (F32): an embedding, a norm, a router, experts whose
 * rows are 256 long (gate) and 32 long (down), and a 1-D bias. Returns the path; the weights in w. */
static const char *moe_file(char *path, float **w) {
  static const struct { const char *name; int ndim; int64_t ne[3]; } ts[] = {
      {"token_embd.weight", 2, {256, 16, 1}},      {"blk.0.attn_norm.weight", 1, {256, 1, 1}},
      {"blk.0.ffn_gate_inp.weight", 2, {256, 4, 1}}, {"blk.0.ffn_gate_exps.weight", 3, {256, 32, 4}},
      {"blk.0.ffn_down_exps.weight", 3, {32, 256, 4}}, {"blk.0.attn_q.bias", 1, {256, 1, 1}}};
  enum { NT = 6, MAXN = 256 * 32 * 4 };
  *w = malloc(NT * MAXN * sizeof **w);
  if (!*w) return NULL;
  uint64_t seed = 11;
  for (int i = 0; i < NT * MAXN; i++) (*w)[i] = 0.1f * moe__uniform(&seed);
  moe_gguf_writer *wr;
  if (moe_gguf_writer_new(&wr) != MOE_OK) return NULL;
  const char *toks[] = {"<s>", "</s>", "a", "b", "c", "d", "e", "f", "g", "h"};
  int ok = moe_gguf_writer_set_str(wr, "general.architecture", "llama") == MOE_OK &&
           moe_gguf_writer_set_u32(wr, "llama.expert_count", 4) == MOE_OK &&
           moe_gguf_writer_set_f32(wr, "llama.attention.layer_norm_rms_epsilon", 1e-5f) == MOE_OK &&
           moe_gguf_writer_set_arr_str(wr, "tokenizer.ggml.tokens", toks, 10) == MOE_OK;
  for (int i = 0; ok && i < NT; i++) {
    size_t n = (size_t)(ts[i].ne[0] * ts[i].ne[1] * ts[i].ne[2]);
    ok = moe_gguf_writer_add_tensor(wr, ts[i].name, MOE_GGUF_F32, ts[i].ndim, ts[i].ne, *w + i * MAXN, 4 * n) == MOE_OK;
  }
  ok = ok && moe_gguf_writer_save(wr, test_tmp_path("moe.gguf", path, 512)) == MOE_OK;
  moe_gguf_writer_free(wr);
  return ok ? path : NULL;
}

TEST(gguf_cli_info_and_quantize) {
  char in[512], out[512], txt[512], args[2048], err[4096];
  float *w = NULL;
  ASSERT(moe_file(in, &w));
  snprintf(args, sizeof args, "gguf info %s", in);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("info.txt", txt, sizeof txt), err, sizeof err), 0);
  size_t n;
  char *t = test_read_file(txt, &n);
  ASSERT(t);
  int has = strstr(t, "tokenizer.ggml.tokens") && strstr(t, "10: [\"<s>\", \"</s>\", \"a\"") && strstr(t, "2 more]") &&
            strstr(t, "blk.0.ffn_gate_exps.weight") && strstr(t, "256 x 32 x 4") && strstr(t, "131072");
  if (!has) printf("%s", t);
  free(t);
  ASSERT(has);
  snprintf(args, sizeof args, "gguf info %s --json", in);
  ASSERT_EQ_INT(run_moe(NULL, args, txt, err, sizeof err), 0);
  t = test_read_file(txt, &n);
  ASSERT(t);
  has = strstr(t, "{\"key\":\"llama.expert_count\",\"type\":\"u32\",\"value\":4}") &&
        strstr(t, "\"elem_type\":\"string\",\"n\":10,\"head\":[\"<s>\",\"</s>\",\"a\",\"b\",\"c\",\"d\",\"e\",\"f\"]") &&
        strstr(t, "{\"name\":\"blk.0.ffn_down_exps.weight\",\"type\":\"F32\",\"ne\":[32,256,4],\"bytes\":131072");
  if (!has) printf("%s", t);
  free(t);
  ASSERT(has);

  /* each type: the weights' types by llama.cpp's rules, the metadata kept, the values near the source */
  static const struct { const char *type; moe_gguf_type t, down; int ftype; double tol; } cases[] = {
      {"Q8_0", MOE_GGUF_Q8_0, MOE_GGUF_Q8_0, 7, 0.01},  {"q4_k", MOE_GGUF_Q4_K, MOE_GGUF_Q8_0, 14, 0.11},
      {"Q6_K", MOE_GGUF_Q6_K, MOE_GGUF_Q8_0, 18, 0.03}, {"MXFP4", MOE_GGUF_MXFP4, MOE_GGUF_MXFP4, 38, 0.17},
      {"BF16", MOE_GGUF_BF16, MOE_GGUF_BF16, 32, 0.003}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    snprintf(args, sizeof args, "quantize %s %s --type %s", in, test_tmp_path("q.gguf", out, sizeof out), cases[c].type);
    if (run_moe(NULL, args, NULL, err, sizeof err)) FAIL_("moe %s: %s", args, err);
    moe_gguf *g;
    ASSERT_OK(moe_gguf_open(&g, out));
    const char *arch;
    uint32_t ft, experts;
    ASSERT_OK(moe_gguf_get_str(g, "general.architecture", &arch));
    ASSERT_OK(moe_gguf_get_u32(g, "general.file_type", &ft));
    ASSERT_OK(moe_gguf_get_u32(g, "llama.expert_count", &experts));
    ASSERT(!strcmp(arch, "llama") && experts == 4);
    ASSERT_EQ_INT(ft, cases[c].ftype);
    static const char *names[6] = {"token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight",
                                   "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight", "blk.0.attn_q.bias"};
    moe_gguf_type want[6] = {cases[c].t, MOE_GGUF_F32, MOE_GGUF_F32, cases[c].t, cases[c].down, MOE_GGUF_F32};
    for (int i = 0; i < 6; i++) {
      moe_gguf_tensor v;
      ASSERT_OK(moe_gguf_tensor_get(g, names[i], &v));
      if (v.type != want[i])
        FAIL_("--type %s: %s is %s, want %s", cases[c].type, names[i], moe_gguf_type_name(v.type),
              moe_gguf_type_name(want[i]));
      double e = 0, s = 0;
      float row[256];
      for (int64_t r = 0; r < v.nrows; r++) {
        ASSERT_OK(moe_gguf_tensor_row_f32(g, &v, r, row));
        const float *x = w + i * 256 * 32 * 4 + r * v.ne[0];
        for (int64_t k = 0; k < v.ne[0]; k++) e += (double)(row[k] - x[k]) * (row[k] - x[k]), s += (double)x[k] * x[k];
      }
      if (!(sqrt(e / s) <= (want[i] == MOE_GGUF_F32 ? 0 : cases[c].tol)))
        FAIL_("--type %s: %s relative RMS error %g", cases[c].type, names[i], sqrt(e / s));
    }
    moe_gguf_close(g);
  }
  free(w);
  /* errors: a bad type, a malformed file (the field named), a missing subcommand */
  snprintf(args, sizeof args, "quantize %s %s --type Q2_K", in, out);
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "--type Q2_K: no codec"));
  bytes f = {{0}, 0};
  make(&f, BOOLV);
  char bad[512];
  snprintf(args, sizeof args, "gguf info %s", save(&f, "bad.gguf", bad));
  ASSERT_EQ_INT(run_moe(NULL, args, NULL, err, sizeof err), 1);
  ASSERT(strstr(err, "moe gguf:") && strstr(err, "bad.gguf") && strstr(err, "'moe.flag'): bool value 2"));
  ASSERT_EQ_INT(run_moe(NULL, "gguf", NULL, err, sizeof err), 1);
}

/* A file laid out by dev/gguf_corpus.py in Python from the specification (not by libmoe's writer): every
 * value type, arrays of several, an array of arrays, alignment 64, F32, F16 and Q8_0 tensors. */
TEST(gguf_reads_independent_file) {
  char path[1024];
  snprintf(path, sizeof path, "%s/gguf_spec.gguf", test_fixture_dir());
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, path));
  ASSERT_EQ_INT(moe_gguf_alignment(g), 64);
  ASSERT_EQ_INT(moe_gguf_kv_count(g), 19);
  static const struct { const char *key; int64_t v; } ints[] = {
      {"t.u8", 200}, {"t.i8", -100}, {"t.u16", 60000}, {"t.i16", -30000}, {"t.u32", 4000000000},
      {"t.i32", -2000000000}, {"t.i64", -(INT64_C(1) << 62)}, {"t.bool", 1}};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    int64_t v;
    ASSERT_OK(moe_gguf_kv_int(g, moe_gguf_find_key(g, ints[i].key), 0, &v));
    if (v != ints[i].v) FAIL_("%s = %lld, want %lld", ints[i].key, (long long)v, (long long)ints[i].v);
  }
  uint64_t u64;
  int64_t v;
  ASSERT_OK(moe_gguf_get_u64(g, "t.u64", &u64));
  ASSERT(u64 == (UINT64_C(1) << 63) + 5);
  ASSERT_STATUS(moe_gguf_kv_int(g, moe_gguf_find_key(g, "t.u64"), 0, &v), MOE_ERR_VALUE);
  ASSERT_STATUS(moe_gguf_get_i32(g, "t.u32", &(int32_t){0}), MOE_ERR_VALUE);
  int32_t i32;
  ASSERT_OK(moe_gguf_get_i32(g, "t.i16", &i32));
  ASSERT_EQ_INT(i32, -30000);
  float f;
  double d;
  ASSERT_OK(moe_gguf_get_f32(g, "t.f32", &f));
  ASSERT_OK(moe_gguf_kv_float(g, moe_gguf_find_key(g, "t.f64"), 0, &d));
  ASSERT(f == 0.25f && d == -1.5);
  const char *s;
  size_t len;
  ASSERT_OK(moe_gguf_get_str(g, "t.str", &s));
  ASSERT(!strcmp(s, "h\xc3\xa9llo"));
  int64_t ai[3];
  float af[2];
  ASSERT_OK(moe_gguf_get_arr_int(g, "t.arr_i32", ai, 3));
  ASSERT(ai[0] == -1 && ai[1] == 0 && ai[2] == 7);
  ASSERT_OK(moe_gguf_get_arr_int(g, "t.arr_bool", ai, 2));
  ASSERT(ai[0] == 1 && ai[1] == 0);
  ASSERT_OK(moe_gguf_get_arr_f32(g, "t.arr_f32", af, 2));
  ASSERT(af[0] == 0.5f && af[1] == -2);
  ASSERT_OK(moe_gguf_get_arr_str(g, "t.arr_str", 2, &s, &len));
  ASSERT(!strcmp(s, "bc") && len == 2);
  moe_gguf_kv kv;
  ASSERT_OK(moe_gguf_kv_at(g, moe_gguf_find_key(g, "t.nested"), &kv));
  ASSERT(kv.type == MOE_GGUFV_ARRAY && kv.elem_type == MOE_GGUFV_ARRAY && kv.n == 2);
  ASSERT_STATUS(moe_gguf_kv_int(g, moe_gguf_find_key(g, "t.nested"), 0, &v), MOE_ERR_DTYPE);
  float row[32];
  moe_gguf_tensor t;
  ASSERT_OK(moe_gguf_tensor_get(g, "t.f32", &t));
  ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, 1, row));
  ASSERT(t.ne[0] == 4 && t.ne[1] == 2 && row[0] == 2.0f && row[3] == 3.5f);
  ASSERT_OK(moe_gguf_tensor_get(g, "t.f16", &t));
  ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, 0, row));
  ASSERT(row[0] == -4 && row[7] == 3);
  ASSERT_OK(moe_gguf_tensor_get(g, "t.q8_0", &t));
  ASSERT_EQ_INT(t.file_offset % 64, 0);
  ASSERT_OK(moe_gguf_tensor_row_f32(g, &t, 1, row));
  for (int i = 0; i < 32; i++) ASSERT(row[i] == 0.5f * (float)(i - 15));
  moe_gguf_close(g);
}

/* A file llama.cpp's Python package wrote (dev/gguf_ggml_ref.py: gguf-py's GGUFWriter and numpy codecs):
 * it opens; each quantized tensor dequantizes to gguf-py's values; Q8_0 and Q4_0 quantize to gguf-py's
 * bytes (its Q8_0 bit-exact with ggml's reference quantizer). */
TEST(gguf_llama_cpp_reference) {
  char path[1024];
  snprintf(path, sizeof path, "%s/gguf_ggml_ref.gguf", test_fixture_dir());
  moe_gguf *g;
  ASSERT_OK(moe_gguf_open(&g, path));
  uint32_t e;
  ASSERT_OK(moe_gguf_get_u32(g, "llama.expert_count", &e));
  ASSERT_EQ_INT(e, 8);
  moe_gguf_tensor x, q, d;
  ASSERT_OK(moe_gguf_tensor_get(g, "x", &x));
  static const char *names[] = {"q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};
  for (int i = 0; i < 5; i++) {
    char dn[32];
    snprintf(dn, sizeof dn, "%s.deq", names[i]);
    ASSERT_OK(moe_gguf_tensor_get(g, names[i], &q));
    ASSERT_OK(moe_gguf_tensor_get(g, dn, &d));
    ASSERT(q.ne[0] == 256 && q.nrows == 2 && d.ne[0] == 256 && d.nrows == 2);
    for (int r = 0; r < 2; r++) {
      float got[256], want[256];
      ASSERT_OK(moe_gguf_tensor_row_f32(g, &q, r, got));
      ASSERT_OK(moe_gguf_tensor_row_f32(g, &d, r, want));
      for (int k = 0; k < 256; k++)
        if (got[k] != want[k]) FAIL_("%s row %d value %d: %.9g, gguf-py %.9g", names[i], r, k, got[k], want[k]);
    }
    if (i >= 2) continue;
    uint8_t mine[2 * 8 * 34];
    float row[256];
    for (int r = 0; r < 2; r++) {
      ASSERT_OK(moe_gguf_tensor_row_f32(g, &x, r, row));
      ASSERT_OK(moe_gguf_quantize(q.type, row, mine + r * q.nbytes / 2, 256));
    }
    for (size_t k = 0; k < q.nbytes; k++)
      if (mine[k] != ((const uint8_t *)q.data)[k])
        FAIL_("%s byte %zu: %02x, gguf-py %02x", names[i], k, mine[k], ((const uint8_t *)q.data)[k]);
  }
  moe_gguf_close(g);
}
