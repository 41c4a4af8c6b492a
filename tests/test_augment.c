/* moe train's image distortions (src/train/augment.c) against cases whose answer is known exactly: a shift
 * alone moves whole pixels, a quarter turn is a transpose and a flip, a 2x zoom about an odd image's
 * centre lands output pixels on source pixels and on midpoints between them. */
#include "train/augment.h"
#include "test.h"

enum { N = 7 }; /* odd: the centre is a pixel */

static void fill(float *img) {
  for (int i = 0; i < N * N; i++) img[i] = (float)((i * 37) % 11) + 0.25f * (float)i;
}

TEST(augment_shift_moves_whole_pixels) {
  float src[N * N], dst[N * N];
  fill(src);
  moe__augment_warp(src, dst, N, N, 0.0, 1.0, 2, -1);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < N; c++) {
      int sr = r - 2, sc = c + 1;
      float want = sr >= 0 && sr < N && sc >= 0 && sc < N ? src[sr * N + sc] : 0.0f;
      if (dst[r * N + c] != want) FAIL_("(%d, %d): %g, want %g", r, c, dst[r * N + c], want);
    }
}

TEST(augment_quarter_turn_is_transpose_and_flip) {
  float src[N * N], dst[N * N];
  fill(src);
  moe__augment_warp(src, dst, N, N, 90.0, 1.0, 0, 0);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < N; c++) /* counter-clockwise: the top-right pixel goes to the top left */
      ASSERT_NEAR(dst[r * N + c], src[c * N + (N - 1 - r)], 1e-5);
  moe__augment_warp(src, dst, N, N, -90.0, 1.0, 0, 0);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < N; c++) ASSERT_NEAR(dst[r * N + c], src[(N - 1 - c) * N + r], 1e-5);
}

TEST(augment_zoom_samples_pixels_and_midpoints) {
  float src[N * N], dst[N * N];
  fill(src);
  moe__augment_warp(src, dst, N, N, 0.0, 2.0, 0, 0);
  const int m = N / 2;
  for (int r = 0; r < N; r++)
    for (int c = 0; c < N; c++) { /* output (r, c) reads source (m + (r - m) / 2, m + (c - m) / 2) */
      int r0 = m + (r - m - ((r - m) & 1)) / 2, c0 = m + (c - m - ((c - m) & 1)) / 2;
      int r1 = r0 + ((r - m) & 1), c1 = c0 + ((c - m) & 1);
      double want = 0.25 * (src[r0 * N + c0] + src[r0 * N + c1] + src[r1 * N + c0] + src[r1 * N + c1]);
      ASSERT_NEAR(dst[r * N + c], want, 1e-5);
    }
  /* shrinking by 2 brings in zeros beyond the source's edge */
  moe__augment_warp(src, dst, N, N, 0.0, 0.5, 0, 0);
  ASSERT_NEAR(dst[0], 0.0, 0.0);
  ASSERT_NEAR(dst[m * N + m], src[m * N + m], 1e-6);
  ASSERT_NEAR(dst[(m + 1) * N + m], src[(m + 2) * N + m], 1e-5);
}
