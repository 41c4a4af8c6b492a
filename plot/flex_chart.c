/* moe placement --method flexmoe --plot: the balance ratio and the modelled step time over the steps of
 * a trace, before (light) and after (dark) each step's plan, in two panels (the ratio on top, with the
 * threshold as a grey line), drawn as an RGB raster in the heatmap's colors and written as a PNG
 * (save.c: libpng, atomically). The raster has no text (the heatmap's font is its own); the caller
 * prints the axes' ranges. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot_internal.h"

enum { PW = 800, PH = 520, MARGIN = 20, GAP = 40 };

typedef struct {
  uint8_t *rgb;
  int top, h;       /* the panel's pixel rows */
  double lo, hi;    /* the values at its bottom and top */
} panel;

static void dot(uint8_t *rgb, int x, int y, const uint8_t c[3]) {
  if (x >= 0 && x < PW && y >= 0 && y < PH) memcpy(rgb + ((size_t)y * PW + x) * 3, c, 3);
}

static int row_of(const panel *p, double v) {
  double f = p->hi > p->lo ? (v - p->lo) / (p->hi - p->lo) : 0.5;
  return p->top + p->h - 1 - (int)lround(fmin(fmax(f, 0), 1) * (p->h - 1));
}

static int col_of(int64_t i, int64_t n) { return MARGIN + (n > 1 ? (int)(i * (PW - 2 * MARGIN - 1) / (n - 1)) : 0); }

/* A straight line (x0, y0) -> (x1, y1), Bresenham. */
static void line(uint8_t *rgb, int x0, int y0, int x1, int y1, const uint8_t c[3]) {
  int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
  for (;;) {
    dot(rgb, x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

static void series(const panel *p, const double *v, int64_t n, const uint8_t c[3]) {
  for (int64_t i = 0; i < n; i++)
    line(p->rgb, col_of(i > 0 ? i - 1 : 0, n), row_of(p, v[i > 0 ? i - 1 : 0]), col_of(i, n), row_of(p, v[i]), c);
}

static void frame(const panel *p) {
  static const uint8_t INK[3] = {0x40, 0x40, 0x40};
  int y0 = p->top, y1 = p->top + p->h - 1, x1 = PW - MARGIN - 1;
  line(p->rgb, MARGIN, y0, x1, y0, INK), line(p->rgb, MARGIN, y1, x1, y1, INK);
  line(p->rgb, MARGIN, y0, MARGIN, y1, INK), line(p->rgb, x1, y0, x1, y1, INK);
}

moe_status moe_flex_plot_png(const char *path, const moe_flex_plot *d) {
  MOE_PLOT_TRY(d->n >= 1, MOE_ERR_ARG, "%s: no steps to plot", path);
  uint8_t *rgb = malloc((size_t)PW * PH * 3);
  MOE_PLOT_TRY(rgb, MOE_ERR_NOMEM, "%s: a %dx%d raster", path, PW, PH);
  memset(rgb, 0xff, (size_t)PW * PH * 3);
  int ph = (PH - 2 * MARGIN - GAP) / 2;
  panel ratio = {rgb, MARGIN, ph, 1, d->ratio_max}, time = {rgb, MARGIN + ph + GAP, ph, 0, d->time_max};
  uint8_t before[3], after[3];
  static const uint8_t GREY[3] = {0xb0, 0xb0, 0xb0};
  moe_heatmap_color(0.75f, before);
  moe_heatmap_color(0.0f, after);
  frame(&ratio), frame(&time);
  line(rgb, MARGIN, row_of(&ratio, d->threshold), PW - MARGIN - 1, row_of(&ratio, d->threshold), GREY);
  series(&ratio, d->ratio_before, d->n, before), series(&ratio, d->ratio_after, d->n, after);
  series(&time, d->time_before, d->n, before), series(&time, d->time_after, d->n, after);
  moe_status st = moe_plot__save_png(path, rgb, PW, PH,
                                     "FlexMoE placement per step: balance ratio (top), modelled step time (bottom)");
  free(rgb);
  return st;
}
