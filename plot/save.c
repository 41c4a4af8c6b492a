/* The plots' files: each image is made in memory (open_memstream) and written by libmoe's
 * moe_write_file_atomic, so that a failure leaves the path as it was; and the PNG encoder (libpng),
 * the one place moe_plot uses it. */
#include <png.h>
#include <stdlib.h>

#include "plot_internal.h"

moe_status moe_plot__save(const char *path, moe_plot__writer write, const void *ctx) {
  MOE_PLOT_TRY(path, MOE_ERR_ARG, "cannot write an image: NULL path");
  char *buf = NULL, msg[200] = "";
  size_t n = 0;
  FILE *fp = open_memstream(&buf, &n);
  MOE_PLOT_TRY(fp, MOE_ERR_NOMEM, "%s: out of memory", path);
  int ok = write(fp, ctx, msg, sizeof msg) && !ferror(fp);
  ok = fclose(fp) == 0 && ok; /* sets buf and n */
  moe_status st = ok      ? moe_write_file_atomic(path, buf, n)
                  : msg[0] ? moe_last_error_set(MOE_ERR_IO, "%s: cannot write: %s", path, msg)
                           : moe_last_error_set(MOE_ERR_NOMEM, "%s: out of memory", path);
  free(buf);
  return st;
}

typedef struct {
  char *msg;
  size_t n;
} png_err_sink;

static void png_on_error(png_structp png, png_const_charp text) {
  png_err_sink *sink = png_get_error_ptr(png);
  snprintf(sink->msg, sink->n, "libpng: %s", text);
  png_longjmp(png, 1);
}
static void png_on_warning(png_structp png, png_const_charp text) {
  (void)png;
  (void)text;
}

typedef struct {
  const uint8_t *rgb;
  int width, height;
  const char *title;
} raster;

static int write_png(FILE *fp, const void *ctx, char *msg, size_t n) {
  const raster *r = ctx;
  png_err_sink sink = {msg, n};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, png_on_error, png_on_warning);
  if (!png) return snprintf(msg, n, "libpng: cannot create a writer"), 0;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, NULL);
    return snprintf(msg, n, "libpng: cannot create the info struct"), 0;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return 0;
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, (png_uint_32)r->width, (png_uint_32)r->height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_text txt = {.compression = PNG_TEXT_COMPRESSION_NONE, .key = "Title", .text = (char *)r->title};
  png_set_text(png, info, &txt, 1);
  png_write_info(png, info);
  for (int y = 0; y < r->height; y++) png_write_row(png, r->rgb + (size_t)y * r->width * 3);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  return !ferror(fp);
}

moe_status moe_plot__save_png(const char *path, const uint8_t *rgb, int width, int height, const char *title) {
  raster r = {rgb, width, height, title};
  return moe_plot__save(path, write_png, &r);
}
