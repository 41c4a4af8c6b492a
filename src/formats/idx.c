/* Datasets in the IDX format of MNIST: a pair of files, one of images (magic 0x00000803: unsigned
 * bytes, 3 dimensions n, rows, cols) and one of labels (magic 0x00000801: unsigned bytes, 1 dimension
 * n), every header field a big-endian 32-bit integer followed by the raw bytes in row-major order.
 * The reader is strict: the magic must name ubyte data with the expected number of dimensions, each
 * dimension must be positive and sane, the file size must equal header + product of dimensions exactly
 * (catching truncated files and trailing bytes), and both files must hold the same number of samples.
 * Pixels become floats pixel / 255 in [0, 1]; classes is the largest label + 1. Every error names the
 * file and the value found; on failure nothing is leaked and the dataset is left zeroed. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* fileno, fstat */
#endif
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* ubyte, 3 dims */
#define IDX_MAGIC_LABELS 0x00000801u /* ubyte, 1 dim */
#define IDX_MAX_SIDE 65536u          /* rows and cols above this are taken as a corrupt header */

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* What a magic number declares, for messages: "ubyte, 3 dims", "float32, 1 dim", ... */
static void describe_magic(uint32_t magic, char *buf, size_t n) {
  const char *type;
  switch ((magic >> 8) & 0xffu) {
    case 0x08: type = "ubyte"; break;
    case 0x09: type = "sbyte"; break;
    case 0x0B: type = "int16"; break;
    case 0x0C: type = "int32"; break;
    case 0x0D: type = "float32"; break;
    case 0x0E: type = "float64"; break;
    default: type = "unknown type"; break;
  }
  if (magic >> 16) snprintf(buf, n, "not an IDX file");
  else snprintf(buf, n, "%s, %u dim%s", type, magic & 0xffu, (magic & 0xffu) == 1 ? "" : "s");
}

/* Reads one IDX file whose magic must be `magic` with `ndim` dimensions (ndim <= 3) into dims and a
 * freshly allocated *data of the product of dims bytes. `what` is "images" or "labels". */
static moe_status idx_read_fp(FILE *fp, const char *path, const char *what, uint32_t magic, int ndim,
                              uint32_t *dims, unsigned char **data) {
  struct stat sb;
  MOE_TRY(fstat(fileno(fp), &sb) == 0, MOE_ERR_IO, "%s: stat: %s", path, strerror(errno));
  MOE_TRY(S_ISREG(sb.st_mode), MOE_ERR_IO, "%s: not a regular file", path);
  const uint64_t size = (uint64_t)sb.st_size;
  const uint64_t hdr = 4 + 4 * (uint64_t)ndim;

  unsigned char h[16];
  MOE_TRY(size >= 4, MOE_ERR_FORMAT, "%s: %s file is %" PRIu64 " bytes, too short for the 4-byte magic",
          path, what, size);
  MOE_TRY(fread(h, 1, 4, fp) == 4, MOE_ERR_IO, "%s: reading the magic: %s", path,
          ferror(fp) ? strerror(errno) : "unexpected end of file");
  const uint32_t found = be32(h);
  if (found != magic) {
    char want_s[40], found_s[40];
    describe_magic(magic, want_s, sizeof want_s);
    describe_magic(found, found_s, sizeof found_s);
    return moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__,
                      "%s: bad magic 0x%08" PRIx32 " (%s) for an %s file, expected 0x%08" PRIx32 " (%s)",
                      path, found, found_s, what, magic, want_s);
  }
  MOE_TRY(size >= hdr, MOE_ERR_FORMAT,
          "%s: %s file is %" PRIu64 " bytes, shorter than its %" PRIu64 "-byte header", path, what, size,
          hdr);
  MOE_TRY(fread(h, 4, (size_t)ndim, fp) == (size_t)ndim, MOE_ERR_IO, "%s: reading the header: %s", path,
          ferror(fp) ? strerror(errno) : "unexpected end of file");

  static const char *const names[3] = {"count", "rows", "cols"};
  uint64_t body = 1;
  for (int i = 0; i < ndim; i++) {
    dims[i] = be32(h + 4 * i);
    const uint32_t max = i == 0 ? (uint32_t)INT_MAX : IDX_MAX_SIDE;
    MOE_TRY(dims[i] > 0 && dims[i] <= max, MOE_ERR_FORMAT,
            "%s: %s header: %s is %" PRIu32 ", must be in [1, %" PRIu32 "]", path, what, names[i], dims[i],
            max);
    body *= dims[i]; /* < 2^31 * 2^16 * 2^16: no overflow */
  }
  const uint64_t expected = hdr + body;
  MOE_TRY(size == expected, MOE_ERR_FORMAT,
          "%s: %s file is %" PRIu64 " bytes, expected %" PRIu64 " (%" PRIu64 "-byte header + %" PRIu64
          " data bytes for the dimensions in the header): %s",
          path, what, size, expected, hdr, body, size < expected ? "truncated" : "trailing bytes");
  MOE_TRY(body <= SIZE_MAX / sizeof(float), MOE_ERR_NOMEM, "%s: %" PRIu64 " data bytes is too large", path,
          body);

  unsigned char *buf = malloc((size_t)body);
  MOE_TRY(buf, MOE_ERR_NOMEM, "%s: out of memory for %" PRIu64 " bytes of %s", path, body, what);
  if (fread(buf, 1, (size_t)body, fp) != (size_t)body) {
    const int e = errno, err = ferror(fp);
    free(buf);
    return moe__error(MOE_ERR_IO, __FILE__, __LINE__, "%s: reading %" PRIu64 " bytes of %s: %s", path, body,
                      what, err ? strerror(e) : "unexpected end of file");
  }
  *data = buf;
  return MOE_OK;
}

static moe_status idx_read(const char *path, const char *what, uint32_t magic, int ndim, uint32_t *dims,
                           unsigned char **data) {
  *data = NULL;
  FILE *fp = fopen(path, "rb");
  MOE_TRY(fp, MOE_ERR_IO, "%s: cannot open %s file: %s", path, what, strerror(errno));
  const moe_status st = idx_read_fp(fp, path, what, magic, ndim, dims, data);
  fclose(fp);
  return st;
}

/* Everything but the cleanup: the caller frees *pix and *lab (and d's arrays) on failure. */
static moe_status load(moe_dataset *d, const char *images_path, const char *labels_path,
                       unsigned char **pix, unsigned char **lab) {
  uint32_t idims[3], ldims[1];
  MOE_CHECK(idx_read(images_path, "images", IDX_MAGIC_IMAGES, 3, idims, pix));
  MOE_CHECK(idx_read(labels_path, "labels", IDX_MAGIC_LABELS, 1, ldims, lab));
  MOE_TRY(idims[0] == ldims[0], MOE_ERR_SHAPE,
          "sample counts differ: %s holds %" PRIu32 " images but %s holds %" PRIu32 " labels", images_path,
          idims[0], labels_path, ldims[0]);

  const size_t n = idims[0], feat = (size_t)idims[1] * idims[2], total = n * feat;
  d->images = malloc(total * sizeof(float));
  MOE_TRY(d->images, MOE_ERR_NOMEM, "%s: out of memory for %zu float pixels", images_path, total);
  for (size_t i = 0; i < total; i++) d->images[i] = (float)(*pix)[i] / 255.0f;
  int maxl = 0;
  for (size_t i = 0; i < n; i++)
    if ((*lab)[i] > maxl) maxl = (*lab)[i];
  d->labels = *lab; /* the bytes are the labels: keep the buffer */
  *lab = NULL;
  d->n = (int)n;
  d->rows = (int)idims[1];
  d->cols = (int)idims[2];
  d->classes = maxl + 1;
  return MOE_OK;
}

moe_status moe_dataset_load_idx(moe_dataset *d, const char *images_path, const char *labels_path) {
  MOE_TRY(d, MOE_ERR_ARG, "moe_dataset_load_idx: NULL dataset");
  memset(d, 0, sizeof *d);
  MOE_TRY(images_path && labels_path, MOE_ERR_ARG, "moe_dataset_load_idx: NULL %s path",
          images_path ? "labels" : "images");
  unsigned char *pix = NULL, *lab = NULL;
  const moe_status st = load(d, images_path, labels_path, &pix, &lab);
  free(pix);
  free(lab);
  if (st != MOE_OK) moe_dataset_free(d);
  return st;
}

void moe_dataset_free(moe_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  memset(d, 0, sizeof *d);
}

moe_status moe_dataset_hold_out(moe_dataset *d, int n, moe_dataset *val) {
  memset(val, 0, sizeof *val);
  MOE_TRY(n > 0 && n < d->n, MOE_ERR_ARG, "hold out %d: want 1 to %d of the %d samples", n, d->n - 1, d->n);
  size_t F = (size_t)d->rows * d->cols, first = (size_t)(d->n - n);
  *val = *d;
  val->n = n;
  val->images = malloc((size_t)n * F * sizeof *val->images);
  val->labels = malloc((size_t)n);
  if (!val->images || !val->labels) {
    moe_dataset_free(val);
    MOE_TRY(0, MOE_ERR_NOMEM, "hold out %d: out of memory for %d x %zu", n, n, F);
  }
  memcpy(val->images, d->images + first * F, (size_t)n * F * sizeof *val->images);
  memcpy(val->labels, d->labels + first, (size_t)n);
  d->n -= n;
  return MOE_OK;
}
