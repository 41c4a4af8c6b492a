/* libFuzzer target: GGUF (src/formats/gguf.c): open, every metadata entry and its values (as integers,
 * floats and strings, whichever apply), the typed getters, every tensor by index and by name, and every
 * row of each tensor with a codec dequantized. */
#include <stdlib.h>

#include "fuzz_file.h"
#include "moe.h"

static void metadata(const moe_gguf *g) {
  for (int64_t i = 0; i < moe_gguf_kv_count(g); i++) {
    moe_gguf_kv kv;
    if (moe_gguf_kv_at(g, i, &kv) != MOE_OK || moe_gguf_find_key(g, kv.key) != i) abort(); /* it listed it */
    for (uint64_t j = 0; j < kv.n && j < 64; j++) {
      int64_t v;
      double d;
      const char *s;
      size_t len;
      moe_gguf_kv_int(g, i, j, &v);
      moe_gguf_kv_float(g, i, j, &d);
      if (moe_gguf_kv_str(g, i, j, &s, &len) == MOE_OK && s[len]) abort(); /* NUL-terminated */
    }
    uint32_t u;
    int32_t i32;
    uint64_t u64;
    float f;
    int b;
    const char *s;
    moe_gguf_vtype et;
    uint64_t n;
    moe_gguf_get_u32(g, kv.key, &u), moe_gguf_get_i32(g, kv.key, &i32), moe_gguf_get_u64(g, kv.key, &u64);
    moe_gguf_get_f32(g, kv.key, &f), moe_gguf_get_bool(g, kv.key, &b), moe_gguf_get_str(g, kv.key, &s);
    if (moe_gguf_get_arr(g, kv.key, &et, &n) == MOE_OK && n <= 64) {
      int64_t ints[64];
      float floats[64];
      moe_gguf_get_arr_int(g, kv.key, ints, n), moe_gguf_get_arr_f32(g, kv.key, floats, n);
    }
  }
}

static void tensors(const moe_gguf *g) {
  for (int64_t i = 0; i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t, u;
    if (moe_gguf_tensor_at(g, i, &t) != MOE_OK || moe_gguf_tensor_get(g, t.name, &u) != MOE_OK || u.data != t.data)
      abort();
    if (!moe_gguf_type_supported(t.type) || t.ne[0] > (1 << 16)) continue;
    float *row = malloc((size_t)(t.ne[0] ? t.ne[0] : 1) * sizeof *row);
    for (int64_t r = 0; row && r < t.nrows && r < 256; r++)
      if (moe_gguf_tensor_row_f32(g, &t, r, row) != MOE_OK) abort(); /* validated: every row reads */
    free(row);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  moe_gguf *g;
  if (moe_gguf_open(&g, fuzz_file(0, "t.gguf", data, n)) != MOE_OK) return 0;
  metadata(g);
  tensors(g);
  moe_gguf_close(g);
  return 0;
}
