/* libFuzzer target: safetensors (src/formats/safetensors.c), read whole and lazily: every view by index and
 * by name, its values as floats where it is F32 or BF16, a non-finite scan, and the metadata. */
#include <stdlib.h>

#include "fuzz_file.h"
#include "internal.h"

static void views(const moe_st *f) {
  moe_st_meta(f, "format");
  for (int i = 0; i < moe_st_count(f); i++) {
    moe_tensor_view v, w;
    if (moe_st_at(f, i, &v) != MOE_OK || moe_st_get(f, v.name, &w) != MOE_OK) abort(); /* it listed them */
    unsigned char b[64];
    moe_st_read(f, &v, 0, v.nbytes < sizeof b ? v.nbytes : sizeof b, b);
    if (v.dtype != MOE_DT_F32 && v.dtype != MOE_DT_BF16) continue;
    size_t cnt = v.nbytes / moe_dtype_size(v.dtype);
    float *x = malloc(cnt ? cnt * sizeof *x : 1);
    if (x && moe_st_view_f32(f, &v, 0, cnt, x) == MOE_OK) moe_st_get_f32(f, v.name, x, cnt);
    free(x);
    moe__st_scan_finite(f, &v);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "t.safetensors", data, n);
  moe_st *f;
  if (moe_st_open(&f, path) == MOE_OK) views(f), moe_st_close(f);
  if (moe_st_open_lazy(&f, path) == MOE_OK) views(f), moe_st_close(f);
  return 0;
}
