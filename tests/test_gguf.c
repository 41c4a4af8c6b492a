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
           ROWLEN, UNALIGNED, OVERLAP, DUP_NAME, DIM_OVERFLOW, LONG_NAME, KEY_BINARY, PAST_END, NBAD };

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
  if (bad == DIM_OVERFLOW) le(f, 3, 4), le(f, 32, 8), le(f, UINT64_C(1) << 62, 8), le(f, 4, 8);
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

static const char *save(const bytes *f, const char *name, char *buf) {
  test_tmp_path(name, buf, 512);
  return moe_write_file_atomic(buf, f->b, f->n) == MOE_OK ? buf : NULL;
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
