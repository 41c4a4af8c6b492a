/* A GGUF file rewritten with one tensor in another type (gguf_retype.h). */
#include "gguf_retype.h"

#include <stdlib.h>
#include <string.h>

/* The GGUF file at path again with tensor `name` stored as type t (its values dequantized and quantized
 * again; every other tensor and key as it was). */
moe_status gguf_retype(const char *path, const char *name, moe_gguf_type t2) {
  moe_gguf *g;
  moe_gguf_writer *w = NULL;
  float *f32 = NULL;
  void *out = NULL;
  moe_status st = moe_gguf_open(&g, path);
  if (st != MOE_OK) return st;
  st = moe_gguf_writer_new(&w);
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_kv_count(g); i++) st = moe_gguf_writer_copy_kv(w, g, i);
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    st = moe_gguf_tensor_at(g, i, &t);
    if (st != MOE_OK) break;
    if (strcmp(t.name, name)) {
      st = moe_gguf_writer_add_tensor(w, t.name, t.type, t.ndim, t.ne, t.data, t.nbytes);
      continue;
    }
    int64_t n = t.ne[0] * t.nrows;
    size_t bytes = (size_t)(n / moe_gguf_type_block(t2)) * moe_gguf_type_block_bytes(t2);
    f32 = malloc((size_t)n * 4), out = malloc(bytes);
    if (!f32 || !out) st = MOE_ERR_NOMEM;
    for (int64_t r = 0; st == MOE_OK && r < t.nrows; r++) st = moe_gguf_tensor_row_f32(g, &t, r, f32 + r * t.ne[0]);
    if (st == MOE_OK) st = moe_gguf_quantize(t2, f32, out, n);
    if (st == MOE_OK) st = moe_gguf_writer_add_tensor(w, t.name, t2, t.ndim, t.ne, out, bytes);
  }
  if (st == MOE_OK) st = moe_gguf_writer_save(w, path);
  moe_gguf_writer_free(w);
  moe_gguf_close(g);
  free(f32), free(out);
  return st;
}
