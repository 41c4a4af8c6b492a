/* What the plots of moe_plot share (save.c); not for callers, whose header is moe_plot.h. Internal
 * non-static symbols start with moe_plot__. */
#ifndef MOE_PLOT_INTERNAL_H
#define MOE_PLOT_INTERNAL_H

#include <stdio.h>

#include "moe_plot.h"

/* Check cond; on failure record the message in moe_last_error() and return st from the caller. */
#define MOE_PLOT_TRY(cond, st, ...)                                            \
  do {                                                                         \
    if (!(cond)) return moe_last_error_set((st), __VA_ARGS__);                 \
  } while (0)

/* Writes the content to fp; returns 0 on failure, optionally with the reason in msg (n bytes). */
typedef int (*moe_plot__writer)(FILE *fp, const void *ctx, char *msg, size_t n);

/* What write puts to an in-memory stream, written to path by moe_write_file_atomic. A writer's
 * failure is MOE_ERR_IO naming path and its reason (MOE_ERR_NOMEM when it gives none). */
moe_status moe_plot__save(const char *path, moe_plot__writer write, const void *ctx);

/* An 8-bit sRGB raster (height, width, 3) as a PNG with the title as its Title text, through save. */
moe_status moe_plot__save_png(const char *path, const uint8_t *rgb, int width, int height, const char *title);

#endif
