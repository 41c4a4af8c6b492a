/* Tests of the IDX dataset reader (src/formats/idx.c): small image and label files written into the
 * scratch directory, one good pair checked value by value, then each malformed case checked for its
 * exact status, a message naming the file, and a zeroed dataset. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

/* A 3-sample, 2x3 image set and its labels {4, 0, 1} (so classes = 5). */
enum { N = 3, R = 2, C = 3 };
static const uint8_t PIX[N * R * C] = {0,   255, 128, 1,   2,   3,    /* sample 0 */
                                       10,  20,  30,  40,  50,  60,   /* sample 1 */
                                       254, 127, 0,   255, 200, 100}; /* sample 2 */
static const uint8_t LAB[N] = {4, 0, 1};

static size_t put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
  return 4;
}

static int write_bytes(const char *path, const uint8_t *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(b, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

/* Writes an IDX file: magic, ndim dims, then nbody bytes of body (which may disagree with dims). */
static int write_idx(const char *path, uint32_t magic, int ndim, const uint32_t *dims, const uint8_t *body,
                     size_t nbody) {
  uint8_t *buf = malloc(4 + 4 * (size_t)ndim + nbody + 1);
  if (!buf) return 0;
  size_t o = put_be32(buf, magic);
  for (int i = 0; i < ndim; i++) o += put_be32(buf + o, dims[i]);
  if (nbody) memcpy(buf + o, body, nbody);
  int ok = write_bytes(path, buf, o + nbody);
  free(buf);
  return ok;
}

/* The good pair: <tag>-images.idx with n images and <tag>-labels.idx with nl labels. */
static int write_pair(const char *tag, int n, int nl, char *ip, char *lp, size_t cap) {
  char name[64];
  snprintf(name, sizeof name, "%s-images.idx", tag);
  test_tmp_path(name, ip, cap);
  snprintf(name, sizeof name, "%s-labels.idx", tag);
  test_tmp_path(name, lp, cap);
  const uint32_t idims[3] = {(uint32_t)n, R, C}, ldims[1] = {(uint32_t)nl};
  return write_idx(ip, 0x00000803u, 3, idims, PIX, (size_t)n * R * C) &&
         write_idx(lp, 0x00000801u, 1, ldims, LAB, (size_t)nl);
}

/* A dataset filled with garbage, to check that a failed load zeroes it. */
static moe_dataset dirty(void) {
  moe_dataset d;
  memset(&d, 0x5a, sizeof d);
  return d;
}

#define ASSERT_ZEROED(d)                                                        \
  do {                                                                          \
    ASSERT_EQ_INT((d).n, 0);                                                    \
    ASSERT_EQ_INT((d).rows, 0);                                                 \
    ASSERT_EQ_INT((d).cols, 0);                                                 \
    ASSERT_EQ_INT((d).classes, 0);                                              \
    ASSERT((d).images == NULL);                                                 \
    ASSERT((d).labels == NULL);                                                 \
  } while (0)

/* The last error message contains s. */
#define ASSERT_MSG_HAS(s)                                                       \
  do { if (!strstr(moe_last_error(), (s)))                                      \
    FAIL_("message \"%s\" lacks \"%s\"", moe_last_error(), (s)); } while (0)

TEST(dataset_load_good) {
  char ip[512], lp[512];
  ASSERT(write_pair("good", N, N, ip, lp, sizeof ip));
  moe_dataset d = dirty();
  ASSERT_OK(moe_dataset_load_idx(&d, ip, lp));
  ASSERT_EQ_INT(d.n, 3);
  ASSERT_EQ_INT(d.rows, 2);
  ASSERT_EQ_INT(d.cols, 3);
  ASSERT_EQ_INT(d.classes, 5);
  ASSERT(d.images && d.labels);
  ASSERT_EQ_INT(d.labels[0], 4);
  ASSERT_EQ_INT(d.labels[1], 0);
  ASSERT_EQ_INT(d.labels[2], 1);
  ASSERT(d.images[0] == 0.0f);  /* pixel 0 -> exactly 0 */
  ASSERT(d.images[1] == 1.0f);  /* pixel 255 -> exactly 1 */
  ASSERT_NEAR(d.images[2], 128.0 / 255.0, 1e-7);
  ASSERT_NEAR(d.images[6], 10.0 / 255.0, 1e-7);  /* first pixel of sample 1 */
  ASSERT_NEAR(d.images[12], 254.0 / 255.0, 1e-7); /* first pixel of sample 2 */
  ASSERT_NEAR(d.images[17], 100.0 / 255.0, 1e-7); /* last pixel */
  for (int i = 0; i < N * R * C; i++) ASSERT_NEAR(d.images[i], PIX[i] / 255.0, 1e-7);
  moe_dataset_free(&d);
  ASSERT_ZEROED(d);
  moe_dataset_free(&d); /* a freed dataset may be freed again */
  moe_dataset_free(NULL);
}

TEST(dataset_classes_is_max_label_plus_one) {
  char ip[512], lp[512];
  ASSERT(write_pair("cls", N, N, ip, lp, sizeof ip));
  const uint8_t lab[N] = {9, 9, 2};
  const uint32_t ldims[1] = {N};
  ASSERT(write_idx(lp, 0x00000801u, 1, ldims, lab, N));
  moe_dataset d = dirty();
  ASSERT_OK(moe_dataset_load_idx(&d, ip, lp));
  ASSERT_EQ_INT(d.classes, 10);
  ASSERT_EQ_INT(d.labels[2], 2);
  moe_dataset_free(&d);
}

TEST(dataset_missing_file) {
  char ip[512], lp[512], nope[512];
  ASSERT(write_pair("miss", N, N, ip, lp, sizeof ip));
  test_tmp_path("no-such-file.idx", nope, sizeof nope);
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, nope, lp), MOE_ERR_IO);
  ASSERT_MSG_HAS(nope);
  ASSERT_MSG_HAS("No such file or directory");
  ASSERT_ZEROED(d);
  d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, nope), MOE_ERR_IO); /* missing labels, images read first */
  ASSERT_MSG_HAS(nope);
  ASSERT_MSG_HAS("labels");
  ASSERT_ZEROED(d);
}

TEST(dataset_wrong_magic) {
  char ip[512], lp[512];
  ASSERT(write_pair("magic", N, N, ip, lp, sizeof ip));
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, lp, lp), MOE_ERR_FORMAT); /* labels given as images */
  ASSERT_MSG_HAS(lp);
  ASSERT_MSG_HAS("0x00000801");
  ASSERT_MSG_HAS("expected 0x00000803");
  ASSERT_ZEROED(d);
  d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, ip), MOE_ERR_FORMAT); /* images given as labels */
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("0x00000803");
  ASSERT_MSG_HAS("expected 0x00000801");
  ASSERT_ZEROED(d);
  /* float32 images (0x0D) with the right dimension count: only ubyte is supported */
  char fp[512];
  test_tmp_path("magic-f32.idx", fp, sizeof fp);
  const uint32_t dims[3] = {N, R, C};
  ASSERT(write_idx(fp, 0x00000D03u, 3, dims, PIX, sizeof PIX));
  d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, fp, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(fp);
  ASSERT_MSG_HAS("0x00000d03 (float32, 3 dims)");
  ASSERT_ZEROED(d);
  /* shorter than the magic */
  ASSERT(write_bytes(fp, PIX, 3));
  ASSERT_STATUS(moe_dataset_load_idx(&d, fp, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(fp);
  ASSERT_MSG_HAS("3 bytes");
  ASSERT_ZEROED(d);
}

TEST(dataset_truncated_images) {
  char ip[512], lp[512];
  ASSERT(write_pair("trunc", N, N, ip, lp, sizeof ip));
  const uint32_t dims[3] = {N, R, C};
  ASSERT(write_idx(ip, 0x00000803u, 3, dims, PIX, sizeof PIX - 1)); /* last pixel missing */
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("is 33 bytes, expected 34"); /* 16-byte header + 18 pixels */
  ASSERT_MSG_HAS("truncated");
  ASSERT_ZEROED(d);
  /* cut inside the header */
  ASSERT(write_idx(ip, 0x00000803u, 1, dims, NULL, 0));
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("is 8 bytes, shorter than its 16-byte header");
  ASSERT_ZEROED(d);
}

TEST(dataset_trailing_bytes) {
  char ip[512], lp[512];
  ASSERT(write_pair("trail", N, N, ip, lp, sizeof ip));
  const uint32_t ldims[1] = {N - 1}; /* header says 2 labels, file holds 3 */
  ASSERT(write_idx(lp, 0x00000801u, 1, ldims, LAB, N));
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(lp);
  ASSERT_MSG_HAS("is 11 bytes, expected 10");
  ASSERT_MSG_HAS("trailing bytes");
  ASSERT_ZEROED(d);
  uint8_t extra[N * R * C + 1];
  memcpy(extra, PIX, sizeof PIX);
  extra[N * R * C] = 7;
  const uint32_t idims[3] = {N, R, C};
  ASSERT(write_pair("trail", N, N, ip, lp, sizeof ip));
  ASSERT(write_idx(ip, 0x00000803u, 3, idims, extra, sizeof extra));
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("is 35 bytes, expected 34");
  ASSERT_ZEROED(d);
}

TEST(dataset_bad_dims) {
  char ip[512], lp[512];
  ASSERT(write_pair("dims", N, N, ip, lp, sizeof ip));
  const uint32_t zero_rows[3] = {N, 0, C};
  ASSERT(write_idx(ip, 0x00000803u, 3, zero_rows, NULL, 0));
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("rows is 0");
  ASSERT_ZEROED(d);
  const uint32_t huge[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu}; /* must not overflow or allocate */
  ASSERT(write_idx(ip, 0x00000803u, 3, huge, PIX, sizeof PIX));
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS("count is 4294967295");
  ASSERT_ZEROED(d);
  const uint32_t wide[3] = {1, 1, 70000};
  ASSERT(write_idx(ip, 0x00000803u, 3, wide, PIX, sizeof PIX));
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS("cols is 70000");
  ASSERT_ZEROED(d);
  const uint32_t no_labels[1] = {0};
  ASSERT(write_pair("dims", N, N, ip, lp, sizeof ip));
  ASSERT(write_idx(lp, 0x00000801u, 1, no_labels, NULL, 0));
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_FORMAT);
  ASSERT_MSG_HAS(lp);
  ASSERT_MSG_HAS("count is 0");
  ASSERT_ZEROED(d);
}

TEST(dataset_count_mismatch) {
  char ip[512], lp[512];
  ASSERT(write_pair("count", N, N - 1, ip, lp, sizeof ip)); /* 3 images, 2 labels: each file valid */
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(&d, ip, lp), MOE_ERR_SHAPE);
  ASSERT_MSG_HAS(ip);
  ASSERT_MSG_HAS(lp);
  ASSERT_MSG_HAS("holds 3 images");
  ASSERT_MSG_HAS("holds 2 labels");
  ASSERT_ZEROED(d);
}

TEST(dataset_null_args) {
  char ip[512], lp[512];
  ASSERT(write_pair("null", N, N, ip, lp, sizeof ip));
  moe_dataset d = dirty();
  ASSERT_STATUS(moe_dataset_load_idx(NULL, ip, lp), MOE_ERR_ARG);
  ASSERT_STATUS(moe_dataset_load_idx(&d, NULL, lp), MOE_ERR_ARG);
  ASSERT_MSG_HAS("images");
  ASSERT_ZEROED(d);
}
