/* Expert-load heatmaps of a trace (declared in moe_plot.h): the values (share of each step's tokens per
 * expert, averaged over the steps of a column), a raster with a tiny built-in bitmap font for the labels,
 * written as PNG (save.c's libpng encoder), and an SVG written by hand. Both files are written atomically. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot_internal.h"

/* ---- color map: viridis sampled at 10 points (matplotlib), interpolated linearly in sRGB ---- */
static const uint8_t VIRIDIS[10][3] = {
  {0x44, 0x01, 0x54}, {0x48, 0x28, 0x78}, {0x3e, 0x49, 0x89}, {0x31, 0x68, 0x8e}, {0x26, 0x82, 0x8e},
  {0x1f, 0x9e, 0x89}, {0x35, 0xb7, 0x79}, {0x6e, 0xce, 0x58}, {0xb5, 0xde, 0x2b}, {0xfd, 0xe7, 0x25},
};

void moe_heatmap_color(float v, uint8_t rgb[3]) {
  if (!(v > 0)) v = 0; /* NaN too */
  if (v > 1) v = 1;
  float x = v * 9;
  int i = (int)x;
  if (i > 8) i = 8;
  float f = x - i;
  for (int k = 0; k < 3; k++)
    rgb[k] = (uint8_t)lrintf(VIRIDIS[i][k] + f * (VIRIDIS[i + 1][k] - VIRIDIS[i][k]));
}

/* ---- a 5x9 bitmap font (rows 0-6 above the baseline, 7-8 descenders), 6 pixels of advance ---- */
static const char FONT_CHARS[] = " %'()+,-./0123456789:=_abcdefghijklmnopqrstuvwxyz~?";
static const uint8_t FONT[][9] = {
  {0x00,0x00,0x00,0x00,0x00,0x00,0x00,0x00,0x00}, /*   */
  {0x18,0x19,0x02,0x04,0x08,0x13,0x03,0x00,0x00}, /* % */
  {0x04,0x04,0x08,0x00,0x00,0x00,0x00,0x00,0x00}, /* ' */
  {0x02,0x04,0x08,0x08,0x08,0x04,0x02,0x00,0x00}, /* ( */
  {0x08,0x04,0x02,0x02,0x02,0x04,0x08,0x00,0x00}, /* ) */
  {0x00,0x04,0x04,0x1f,0x04,0x04,0x00,0x00,0x00}, /* + */
  {0x00,0x00,0x00,0x00,0x00,0x0c,0x0c,0x04,0x08}, /* , */
  {0x00,0x00,0x00,0x1f,0x00,0x00,0x00,0x00,0x00}, /* - */
  {0x00,0x00,0x00,0x00,0x00,0x0c,0x0c,0x00,0x00}, /* . */
  {0x00,0x01,0x02,0x04,0x08,0x10,0x00,0x00,0x00}, /* / */
  {0x0e,0x11,0x13,0x15,0x19,0x11,0x0e,0x00,0x00}, /* 0 */
  {0x04,0x0c,0x04,0x04,0x04,0x04,0x0e,0x00,0x00}, /* 1 */
  {0x0e,0x11,0x01,0x02,0x04,0x08,0x1f,0x00,0x00}, /* 2 */
  {0x1f,0x02,0x04,0x02,0x01,0x11,0x0e,0x00,0x00}, /* 3 */
  {0x02,0x06,0x0a,0x12,0x1f,0x02,0x02,0x00,0x00}, /* 4 */
  {0x1f,0x10,0x1e,0x01,0x01,0x11,0x0e,0x00,0x00}, /* 5 */
  {0x06,0x08,0x10,0x1e,0x11,0x11,0x0e,0x00,0x00}, /* 6 */
  {0x1f,0x01,0x02,0x04,0x08,0x08,0x08,0x00,0x00}, /* 7 */
  {0x0e,0x11,0x11,0x0e,0x11,0x11,0x0e,0x00,0x00}, /* 8 */
  {0x0e,0x11,0x11,0x0f,0x01,0x02,0x0c,0x00,0x00}, /* 9 */
  {0x00,0x0c,0x0c,0x00,0x0c,0x0c,0x00,0x00,0x00}, /* : */
  {0x00,0x00,0x1f,0x00,0x1f,0x00,0x00,0x00,0x00}, /* = */
  {0x00,0x00,0x00,0x00,0x00,0x00,0x00,0x00,0x1f}, /* _ */
  {0x00,0x00,0x0e,0x01,0x0f,0x11,0x0f,0x00,0x00}, /* a */
  {0x10,0x10,0x1e,0x11,0x11,0x11,0x1e,0x00,0x00}, /* b */
  {0x00,0x00,0x0e,0x10,0x10,0x11,0x0e,0x00,0x00}, /* c */
  {0x01,0x01,0x0f,0x11,0x11,0x11,0x0f,0x00,0x00}, /* d */
  {0x00,0x00,0x0e,0x11,0x1f,0x10,0x0e,0x00,0x00}, /* e */
  {0x06,0x09,0x08,0x1c,0x08,0x08,0x08,0x00,0x00}, /* f */
  {0x00,0x00,0x0f,0x11,0x11,0x11,0x0f,0x01,0x0e}, /* g */
  {0x10,0x10,0x16,0x19,0x11,0x11,0x11,0x00,0x00}, /* h */
  {0x04,0x00,0x0c,0x04,0x04,0x04,0x0e,0x00,0x00}, /* i */
  {0x02,0x00,0x06,0x02,0x02,0x02,0x02,0x12,0x0c}, /* j */
  {0x10,0x10,0x12,0x14,0x18,0x14,0x12,0x00,0x00}, /* k */
  {0x0c,0x04,0x04,0x04,0x04,0x04,0x0e,0x00,0x00}, /* l */
  {0x00,0x00,0x1a,0x15,0x15,0x15,0x15,0x00,0x00}, /* m */
  {0x00,0x00,0x16,0x19,0x11,0x11,0x11,0x00,0x00}, /* n */
  {0x00,0x00,0x0e,0x11,0x11,0x11,0x0e,0x00,0x00}, /* o */
  {0x00,0x00,0x1e,0x11,0x11,0x11,0x1e,0x10,0x10}, /* p */
  {0x00,0x00,0x0f,0x11,0x11,0x11,0x0f,0x01,0x01}, /* q */
  {0x00,0x00,0x16,0x19,0x10,0x10,0x10,0x00,0x00}, /* r */
  {0x00,0x00,0x0f,0x10,0x0e,0x01,0x1e,0x00,0x00}, /* s */
  {0x08,0x08,0x1c,0x08,0x08,0x09,0x06,0x00,0x00}, /* t */
  {0x00,0x00,0x11,0x11,0x11,0x13,0x0d,0x00,0x00}, /* u */
  {0x00,0x00,0x11,0x11,0x11,0x0a,0x04,0x00,0x00}, /* v */
  {0x00,0x00,0x11,0x11,0x15,0x15,0x0a,0x00,0x00}, /* w */
  {0x00,0x00,0x11,0x0a,0x04,0x0a,0x11,0x00,0x00}, /* x */
  {0x00,0x00,0x11,0x11,0x11,0x11,0x0f,0x01,0x0e}, /* y */
  {0x00,0x00,0x1f,0x02,0x04,0x08,0x1f,0x00,0x00}, /* z */
  {0x00,0x00,0x08,0x15,0x02,0x00,0x00,0x00,0x00}, /* ~ */
  {0x0e,0x11,0x01,0x02,0x04,0x00,0x04,0x00,0x00}, /* ? */
};

#define TS 2           /* text scale: font pixels are TS x TS */
#define GADV (6 * TS)  /* advance of a glyph */
#define GHT (9 * TS)   /* height of a line, descenders included */
#define CAP (7 * TS)   /* height above the baseline */
#define PAD 8
#define TICK 5
#define BAR_W 16
#define TITLE_H (PAD + GHT + 8)           /* the image's title */
#define PANEL_TOP (GHT + 6)               /* a panel's title, above its cells */
#define PANEL_BELOW (TICK + 4 + GHT + 4 + GHT + 12) /* ticks, tick labels, "step", gap */
#define MAX_PIXELS ((int64_t)1 << 26)

static const char *TITLE = "expert load: share of each step's tokens routed to the expert (linear scale)";
static const uint8_t WHITE[3] = {255, 255, 255}, INK[3] = {32, 32, 32}, FRAME[3] = {96, 96, 96};

static const uint8_t *glyph(char ch) {
  if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
  const char *p = ch ? strchr(FONT_CHARS, ch) : NULL;
  if (!p) p = FONT_CHARS + sizeof FONT_CHARS - 2; /* '?' */
  return FONT[p - FONT_CHARS];
}

static int text_w(const char *s) { return s[0] ? (int)strlen(s) * GADV - TS : 0; }

typedef struct {
  uint8_t *rgb;
  int w, h;
} canvas;

static void fill(const canvas *c, int x, int y, int w, int h, const uint8_t col[3]) {
  int x1 = x + w < c->w ? x + w : c->w, y1 = y + h < c->h ? y + h : c->h;
  for (int yy = y < 0 ? 0 : y; yy < y1; yy++)
    for (int xx = x < 0 ? 0 : x; xx < x1; xx++) memcpy(c->rgb + ((size_t)yy * c->w + xx) * 3, col, 3);
}

/* Draws s with its top-left corner at (x, y); with up, a quarter turn counter-clockwise, reading
 * upwards from (x, y), its bottom-left corner. */
static void draw_text(const canvas *c, int x, int y, const char *s, int up) {
  for (int i = 0; s[i]; i++) {
    const uint8_t *g = glyph(s[i]);
    for (int r = 0; r < 9; r++)
      for (int b = 0; b < 5; b++)
        if (g[r] >> (4 - b) & 1) {
          int gx = i * 6 + b;
          if (up) fill(c, x + r * TS, y - (gx + 1) * TS, TS, TS, INK);
          else fill(c, x + gx * TS, y + r * TS, TS, TS, INK);
        }
  }
}

/* The smallest of 1, 2, 5 times a power of ten that is >= raw. */
static double nice_step(double raw) {
  if (!(raw > 0)) return 1;
  double p = pow(10, floor(log10(raw))), m = raw / p;
  return (m <= 1.000001 ? 1 : m <= 2.000001 ? 2 : m <= 5.000001 ? 5 : 10) * p;
}

static int digits(int64_t v) {
  int n = 1;
  while (v >= 10) v /= 10, n++;
  return n;
}

/* The geometry shared by the raster and the SVG. */
typedef struct {
  int plot_w, plot_h, bar_x, bar_lab_x;
  int64_t xstep; /* steps between x ticks */
  int ystep;     /* experts between y ticks */
  int nbar;      /* color bar ticks */
  float bar_v[16];
  char bar_lab[16][24];
} geom;

static int64_t tick_x(const moe_heatmap *h, const geom *g, int64_t s) {
  return h->x0 + (int64_t)floor((s + 0.5) * g->plot_w / h->steps);
}
static int tick_bar_y(const geom *g, int plot_top, float v, float vmax) {
  return plot_top + (int)lrint((1 - v / vmax) * (g->plot_h - 1));
}

static void bar_ticks(geom *g, float vmax) {
  int fit = g->plot_h / (GHT + 12); /* intervals that fit, at most 6 */
  fit = fit < 1 ? 1 : fit > 6 ? 6 : fit;
  double d = nice_step(vmax / fit);
  int dec = d < 1 ? (int)ceil(-log10(d) - 1e-9) : 0;
  g->nbar = 0;
  g->bar_v[g->nbar] = 0;
  snprintf(g->bar_lab[g->nbar++], sizeof g->bar_lab[0], "0");
  double gap = (GHT + 2.0) / (g->plot_h > 1 ? g->plot_h - 1 : 1) * vmax; /* in value units */
  for (int k = 1; g->nbar < 15; k++) {
    double v = k * d;
    if (v > vmax - gap) break;
    g->bar_v[g->nbar] = (float)v;
    snprintf(g->bar_lab[g->nbar++], sizeof g->bar_lab[0], "%.*f", dec, v);
  }
  g->bar_v[g->nbar] = vmax;
  snprintf(g->bar_lab[g->nbar++], sizeof g->bar_lab[0], "%.3g", vmax);
}

static void make_geom(const moe_heatmap *h, geom *g) {
  g->plot_w = h->cols * h->cell_w;
  g->plot_h = h->experts * h->cell_h;
  g->bar_x = h->x0 + g->plot_w + 16;
  g->bar_lab_x = g->bar_x + BAR_W + TICK + 4;
  int64_t fit = g->plot_w / ((int64_t)digits(h->steps - 1) * GADV + 16);
  g->xstep = (int64_t)nice_step((double)h->steps / (fit > 1 ? fit : 1));
  if (g->xstep < 1) g->xstep = 1;
  g->ystep = (int)nice_step((double)(GHT + 2) / h->cell_h);
  if (g->ystep < 1) g->ystep = 1;
  bar_ticks(g, h->vmax);
}

static void panel_title(const moe_heatmap *h, int p, char *buf, size_t n) {
  if (h->cols < h->steps)
    snprintf(buf, n, "layer %d (%lld steps, averaged %.1f per column)", h->layer0 + p, (long long)h->steps,
             (double)h->steps / h->cols);
  else
    snprintf(buf, n, "layer %d (%lld steps)", h->layer0 + p, (long long)h->steps);
}

static void cell_color(const moe_heatmap *h, int p, int e, int c, uint8_t rgb[3]) {
  moe_heatmap_color(h->value[((size_t)p * h->experts + e) * h->cols + c] / h->vmax, rgb);
}

static void draw(const moe_heatmap *h, const geom *g) {
  canvas cv = {h->rgb, h->width, h->height};
  fill(&cv, 0, 0, cv.w, cv.h, WHITE);
  draw_text(&cv, (cv.w - text_w(TITLE)) / 2, PAD, TITLE, 0);
  char buf[128];
  for (int p = 0; p < h->panels; p++) {
    int top = h->y0 + p * h->panel_h, bottom = top + g->plot_h;
    panel_title(h, p, buf, sizeof buf);
    draw_text(&cv, h->x0, top - PANEL_TOP, buf, 0);
    for (int e = 0; e < h->experts; e++)
      for (int c = 0; c < h->cols; c++) {
        uint8_t rgb[3];
        cell_color(h, p, e, c, rgb);
        fill(&cv, h->x0 + c * h->cell_w, top + e * h->cell_h, h->cell_w, h->cell_h, rgb);
      }
    /* frame */
    fill(&cv, h->x0 - 1, top - 1, g->plot_w + 2, 1, FRAME);
    fill(&cv, h->x0 - 1, bottom, g->plot_w + 2, 1, FRAME);
    fill(&cv, h->x0 - 1, top - 1, 1, g->plot_h + 2, FRAME);
    fill(&cv, h->x0 + g->plot_w, top - 1, 1, g->plot_h + 2, FRAME);
    /* x: step ticks and label */
    for (int64_t s = 0; s < h->steps; s += g->xstep) {
      int x = (int)tick_x(h, g, s);
      fill(&cv, x, bottom + 1, 1, TICK, INK);
      snprintf(buf, sizeof buf, "%lld", (long long)s);
      draw_text(&cv, x - text_w(buf) / 2, bottom + 1 + TICK + 4, buf, 0);
    }
    draw_text(&cv, h->x0 + (g->plot_w - text_w("step")) / 2, bottom + 1 + TICK + 4 + GHT + 4, "step", 0);
    /* y: expert ticks and label */
    for (int e = 0; e < h->experts; e += g->ystep) {
      int y = top + e * h->cell_h + h->cell_h / 2;
      fill(&cv, h->x0 - 1 - TICK, y, TICK, 1, INK);
      snprintf(buf, sizeof buf, "%d", e);
      draw_text(&cv, h->x0 - 1 - TICK - 4 - text_w(buf), y - CAP / 2, buf, 0);
    }
    draw_text(&cv, PAD, top + (g->plot_h + text_w("expert")) / 2, "expert", 1);
    /* color bar, vmax at the top */
    for (int r = 0; r < g->plot_h; r++) {
      uint8_t rgb[3];
      moe_heatmap_color(g->plot_h > 1 ? 1.0f - (float)r / (g->plot_h - 1) : 1.0f, rgb);
      fill(&cv, g->bar_x, top + r, BAR_W, 1, rgb);
    }
    fill(&cv, g->bar_x - 1, top - 1, BAR_W + 2, 1, FRAME);
    fill(&cv, g->bar_x - 1, bottom, BAR_W + 2, 1, FRAME);
    fill(&cv, g->bar_x - 1, top - 1, 1, g->plot_h + 2, FRAME);
    fill(&cv, g->bar_x + BAR_W, top - 1, 1, g->plot_h + 2, FRAME);
    for (int k = 0; k < g->nbar; k++) {
      int y = tick_bar_y(g, top, g->bar_v[k], h->vmax);
      fill(&cv, g->bar_x + BAR_W + 1, y, TICK, 1, INK);
      draw_text(&cv, g->bar_lab_x, y - CAP / 2, g->bar_lab[k], 0);
    }
  }
}

void moe_heatmap_free(moe_heatmap *h) {
  if (!h) return;
  free(h->value);
  free(h->rgb);
  memset(h, 0, sizeof *h);
}

moe_status moe_heatmap_build(moe_heatmap *h, const moe_trace *t, int layer, int max_cols) {
  MOE_PLOT_TRY(h && t, MOE_ERR_ARG, "moe_heatmap_build: NULL %s", h ? "trace" : "heatmap");
  memset(h, 0, sizeof *h);
  MOE_PLOT_TRY(max_cols > 0, MOE_ERR_ARG, "moe_heatmap_build: max_cols %d, want > 0", max_cols);
  MOE_PLOT_TRY(t->steps > 0 && t->layers > 0 && t->experts > 0 && t->tokens, MOE_ERR_ARG,
          "empty trace: nothing to plot (%lld steps, %d layers, %d experts)", (long long)t->steps, t->layers,
          t->experts);
  MOE_PLOT_TRY(layer < t->layers, MOE_ERR_ARG, "layer %d out of range: the trace has %d layer%s (0..%d)", layer,
          t->layers, t->layers == 1 ? "" : "s", t->layers - 1);
  int E = t->experts, L = t->layers;
  h->steps = t->steps;
  h->layer0 = layer < 0 ? 0 : layer;
  h->panels = layer < 0 ? L : 1;
  h->experts = E;
  h->cols = t->steps < max_cols ? (int)t->steps : max_cols;
  h->value = calloc((size_t)h->panels * E * h->cols, sizeof *h->value);
  if (!h->value) return moe_last_error_set(MOE_ERR_NOMEM, "heatmap: out of memory");

  /* values: the share of each step's tokens, averaged over the column's steps */
  float vmax = 0;
  for (int p = 0; p < h->panels; p++) {
    int l = h->layer0 + p;
    float *vp = h->value + (size_t)p * E * h->cols;
    for (int c = 0; c < h->cols; c++) {
      int64_t s0 = (int64_t)c * h->steps / h->cols, s1 = (int64_t)(c + 1) * h->steps / h->cols;
      for (int64_t s = s0; s < s1; s++) {
        const int32_t *tok = t->tokens + ((size_t)s * L + l) * E;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += tok[e];
        if (sum > 0)
          for (int e = 0; e < E; e++) vp[(size_t)e * h->cols + c] += (float)(tok[e] / sum);
      }
      for (int e = 0; e < E; e++) {
        float *v = &vp[(size_t)e * h->cols + c];
        *v /= (float)(s1 - s0);
        if (*v > vmax) vmax = *v;
      }
    }
  }
  h->vmax = vmax > 0 ? vmax : 1;

  /* geometry */
  h->cell_w = 960 / h->cols; /* about 960 pixels of plot for any number of columns up to 960 */
  h->cell_w = h->cell_w < 1 ? 1 : h->cell_w;
  h->cell_h = 480 / E;
  h->cell_h = h->cell_h < 1 ? 1 : h->cell_h > 24 ? 24 : h->cell_h;
  if (E * h->cell_h < 96) h->cell_h = (96 + E - 1) / E;
  h->x0 = PAD + GHT + 8 + digits(E - 1) * GADV + 4 + TICK;
  h->y0 = TITLE_H + PANEL_TOP;
  geom g;
  make_geom(h, &g);
  int lab = 0;
  for (int k = 0; k < g.nbar; k++) lab = text_w(g.bar_lab[k]) > lab ? text_w(g.bar_lab[k]) : lab;
  int64_t width = g.bar_lab_x + lab + PAD, title = text_w(TITLE) + 2 * PAD;
  char buf[128];
  panel_title(h, 0, buf, sizeof buf);
  int64_t ptitle = h->x0 + text_w(buf) + PAD;
  width = width > title ? width : title;
  width = width > ptitle ? width : ptitle;
  h->panel_h = PANEL_TOP + g.plot_h + PANEL_BELOW;
  int64_t height = TITLE_H + (int64_t)h->panels * h->panel_h;
  if (width * height > MAX_PIXELS) {
    moe_heatmap_free(h);
    return moe_last_error_set(MOE_ERR_VALUE, "heatmap: %lld x %lld pixels is too large (%d experts, %d panels)",
                              (long long)width, (long long)height, E, layer < 0 ? L : 1);
  }
  h->width = (int)width;
  h->height = (int)height;
  h->rgb = malloc((size_t)width * height * 3);
  if (!h->rgb) {
    moe_heatmap_free(h);
    return moe_last_error_set(MOE_ERR_NOMEM, "heatmap: out of memory for the raster");
  }
  draw(h, &g);
  return MOE_OK;
}

/* ---- writing, atomically ---- */
static moe_status check_built(const moe_heatmap *h, const char *path) {
  MOE_PLOT_TRY(h && path, MOE_ERR_ARG, "heatmap: NULL %s", h ? "path" : "heatmap");
  MOE_PLOT_TRY(h->value && h->rgb, MOE_ERR_STATE, "%s: the heatmap was not built", path);
  return MOE_OK;
}

moe_status moe_heatmap_write_png(const moe_heatmap *h, const char *path) {
  moe_status st = check_built(h, path);
  return st ? st : moe_plot__save_png(path, h->rgb, h->width, h->height, TITLE);
}

static void svg_text(FILE *fp, int x, int top, const char *anchor, const char *s) {
  fprintf(fp, "<text x=\"%d\" y=\"%d\"%s%s%s>%s</text>\n", x, top + CAP, anchor ? " text-anchor=\"" : "",
          anchor ? anchor : "", anchor ? "\"" : "", s);
}

static void svg_frame(FILE *fp, int x, int y, int w, int h) {
  fprintf(fp, "<rect x=\"%d.5\" y=\"%d.5\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#606060\"/>\n", x - 1,
          y - 1, w + 1, h + 1);
}

static int write_svg(FILE *fp, const void *ctx, char *msg, size_t n) {
  const moe_heatmap *h = ctx;
  (void)msg;
  (void)n;
  geom g;
  make_geom(h, &g);
  char buf[128];
  fprintf(fp,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
          "font-family=\"sans-serif\" font-size=\"16\" fill=\"#202020\">\n"
          "<title>%s</title>\n"
          "<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">",
          h->width, h->height, h->width, h->height, TITLE);
  for (int i = 0; i < 10; i++)
    fprintf(fp, "<stop offset=\"%.4f\" stop-color=\"#%02x%02x%02x\"/>", i / 9.0, VIRIDIS[i][0], VIRIDIS[i][1],
            VIRIDIS[i][2]);
  fprintf(fp, "</linearGradient></defs>\n<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", h->width, h->height);
  svg_text(fp, h->width / 2, PAD, "middle", TITLE);
  for (int p = 0; p < h->panels; p++) {
    int top = h->y0 + p * h->panel_h, bottom = top + g.plot_h;
    fprintf(fp, "<g id=\"layer%d\">\n", h->layer0 + p);
    panel_title(h, p, buf, sizeof buf);
    svg_text(fp, h->x0, top - PANEL_TOP, NULL, buf);
    /* cells: one rect per run of equal colors in a row */
    fprintf(fp, "<g class=\"cells\" shape-rendering=\"crispEdges\">\n");
    for (int e = 0; e < h->experts; e++)
      for (int c = 0; c < h->cols;) {
        uint8_t rgb[3], next[3];
        cell_color(h, p, e, c, rgb);
        int c1 = c + 1;
        while (c1 < h->cols && (cell_color(h, p, e, c1, next), !memcmp(next, rgb, 3))) c1++;
        fprintf(fp, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#%02x%02x%02x\"/>\n",
                h->x0 + c * h->cell_w, top + e * h->cell_h, (c1 - c) * h->cell_w, h->cell_h, rgb[0], rgb[1], rgb[2]);
        c = c1;
      }
    fprintf(fp, "</g>\n");
    svg_frame(fp, h->x0, top, g.plot_w, g.plot_h);
    for (int64_t s = 0; s < h->steps; s += g.xstep) {
      int x = (int)tick_x(h, &g, s);
      fprintf(fp, "<line x1=\"%d.5\" y1=\"%d\" x2=\"%d.5\" y2=\"%d\" stroke=\"#202020\"/>\n", x, bottom + 1, x,
              bottom + 1 + TICK);
      snprintf(buf, sizeof buf, "%lld", (long long)s);
      svg_text(fp, x, bottom + 1 + TICK + 4, "middle", buf);
    }
    svg_text(fp, h->x0 + g.plot_w / 2, bottom + 1 + TICK + 4 + GHT + 4, "middle", "step");
    for (int e = 0; e < h->experts; e += g.ystep) {
      int y = top + e * h->cell_h + h->cell_h / 2;
      fprintf(fp, "<line x1=\"%d\" y1=\"%d.5\" x2=\"%d\" y2=\"%d.5\" stroke=\"#202020\"/>\n", h->x0 - 1 - TICK, y,
              h->x0 - 1, y);
      snprintf(buf, sizeof buf, "%d", e);
      svg_text(fp, h->x0 - 1 - TICK - 4, y - CAP / 2, "end", buf);
    }
    int ly = top + g.plot_h / 2;
    fprintf(fp, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">expert</text>\n",
            PAD + CAP, ly, PAD + CAP, ly);
    fprintf(fp, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"url(#viridis)\"/>\n", g.bar_x, top, BAR_W,
            g.plot_h);
    svg_frame(fp, g.bar_x, top, BAR_W, g.plot_h);
    for (int k = 0; k < g.nbar; k++) {
      int y = tick_bar_y(&g, top, g.bar_v[k], h->vmax);
      fprintf(fp, "<line x1=\"%d\" y1=\"%d.5\" x2=\"%d\" y2=\"%d.5\" stroke=\"#202020\"/>\n", g.bar_x + BAR_W + 1, y,
              g.bar_x + BAR_W + 1 + TICK, y);
      svg_text(fp, g.bar_lab_x, y - CAP / 2, NULL, g.bar_lab[k]);
    }
    fprintf(fp, "</g>\n");
  }
  fprintf(fp, "</svg>\n");
  return !ferror(fp);
}

moe_status moe_heatmap_write_svg(const moe_heatmap *h, const char *path) {
  moe_status st = check_built(h, path);
  return st ? st : moe_plot__save(path, write_svg, h);
}
