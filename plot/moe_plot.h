/* moe_plot: the images the moe tool draws (expert-load heatmaps of a trace, the FlexMoE placement's
 * chart, the simulator's sweep chart), a static library beside libmoe so that libmoe itself needs no
 * libpng. Built on moe.h's public API alone (traces, simulator results, moe_write_file_atomic); its
 * failures leave their message in moe_last_error(), as libmoe's do. Every file is written atomically
 * (temp file, fsync, rename). */
#ifndef MOE_PLOT_H
#define MOE_PLOT_H

#include <stdint.h>

#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- expert-load heatmaps of a trace (moe plot-trace) ---- */
#define MOE_HEATMAP_PNG_COLS 1200 /* step columns at most in a PNG, and in an SVG */
#define MOE_HEATMAP_SVG_COLS 600
typedef struct {
  int64_t steps;      /* steps of the trace */
  int layer0, panels; /* the layers shown: layer0 .. layer0 + panels - 1, one panel each, top to bottom */
  int experts;        /* rows of a panel, expert 0 at the top */
  int cols;           /* columns: one per step, or (more than max_cols steps) max_cols averages; column c
                       * covers steps [c * steps / cols, (c + 1) * steps / cols) */
  float *value;       /* (panels, experts, cols): mean over the column's steps of tokens(step, layer, e) /
                       * sum over e' of tokens(step, layer, e'), 0 for a step that routed nothing */
  float vmax;         /* largest value (or 1 when all are 0): the linear color scale runs from 0 to vmax */
  int width, height;  /* the raster: title, panels with axes, ticks and labels, a color bar per panel */
  uint8_t *rgb;       /* (height, width, 3) 8-bit sRGB */
  int x0, y0, cell_w, cell_h, panel_h; /* cell (p, e, c) covers the pixels x in [x0 + c * cell_w, + cell_w),
                                        * y in [y0 + p * panel_h + e * cell_h, + cell_h) */
} moe_heatmap;
/* Builds the values and the raster of layer `layer` of t, or of every layer when layer < 0, with at most
 * max_cols columns (> 0). MOE_ERR_ARG for an empty trace (no steps, layers or experts) or a layer out of
 * range, MOE_ERR_VALUE for a raster too large. Free with moe_heatmap_free. */
moe_status moe_heatmap_build(moe_heatmap *h, const moe_trace *t, int layer, int max_cols);
void moe_heatmap_free(moe_heatmap *h);
/* Write the raster as an 8-bit RGB PNG, or the values as an SVG (one <rect> per run of equal colors in a
 * row, axes, labels, a color bar). */
moe_status moe_heatmap_write_png(const moe_heatmap *h, const char *path);
moe_status moe_heatmap_write_svg(const moe_heatmap *h, const char *path);
/* The color map (viridis, linear interpolation between 10 samples): v in [0, 1], clamped. */
void moe_heatmap_color(float v, uint8_t rgb[3]);

/* ---- moe placement --method flexmoe --plot ---- */
typedef struct {
  int64_t n;                                 /* steps */
  const double *ratio_before, *ratio_after;  /* (n) Eq. 6 before and after each step's plan */
  const double *time_before, *time_after;    /* (n) Eq. 5, seconds */
  double threshold, ratio_max, time_max;     /* the scales: ratio from 1, time from 0 */
} moe_flex_plot;
/* Two panels over the steps (ratio on top, with the threshold; modelled step time below), each value
 * before its plan light and after it dark, as an 800 x 520 PNG without text (the caller prints the
 * scales). */
moe_status moe_flex_plot_png(const char *path, const moe_flex_plot *d);

/* ---- moe simulate --sweep --plot ---- */
/* A line chart of a sweep: the step, the busiest device's compute and the exposed communication (ms)
 * against the swept values x (> 0; a log axis when they span more than 10x) of key; as an SVG with its
 * labels, or as a 720 x 420 PNG of the same lines and ticks without text. */
moe_status moe_sim_plot_svg(const char *path, const char *key, const double *x, const moe_sim_result *r, int n);
moe_status moe_sim_plot_png(const char *path, const char *key, const double *x, const moe_sim_result *r, int n);

#ifdef __cplusplus
}
#endif

#endif
