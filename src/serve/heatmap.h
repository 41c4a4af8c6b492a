/* Expert-load heatmaps of a trace (DESIGN 4.4; the deployment paper's Figure 6): x = step, y = expert,
 * color = the share of the step's routed tokens that went to the expert, one panel per layer.
 * These declarations belong in include/moe.h, after moe_trace_free; they live here until moved. */
#ifndef MOE_SERVE_HEATMAP_H
#define MOE_SERVE_HEATMAP_H

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
 * row, axes, labels, a color bar); both atomically (temp file, fsync, rename). */
moe_status moe_heatmap_write_png(const moe_heatmap *h, const char *path);
moe_status moe_heatmap_write_svg(const moe_heatmap *h, const char *path);
/* The color map (viridis, linear interpolation between 10 samples): v in [0, 1], clamped. */
void moe_heatmap_color(float v, uint8_t rgb[3]);

#ifdef __cplusplus
}
#endif
#endif
