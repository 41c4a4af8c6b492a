/* The sweep's chart (moe simulate --sweep --plot): a line chart of the step, the busiest device's
 * compute and the exposed communication against the swept value, as SVG (written here: the heatmap's
 * SVG is cells, not lines) or as a PNG raster (save.c's encoder). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot_internal.h"

enum { W_ = 720, H_ = 420, L_ = 80, R_ = 170, T_ = 30, B_ = 60 };

typedef struct {
  const char *key;
  const double *x;
  const moe_sim_result *r;
  int n, logx;
  double x0, x1, ymax;
} chart;

static double px(const chart *c, double x) {
  double f = c->x1 == c->x0 ? 0.5
             : c->logx      ? log(x / c->x0) / log(c->x1 / c->x0)
                            : (x - c->x0) / (c->x1 - c->x0);
  return L_ + f * (W_ - L_ - R_);
}
static double py(const chart *c, double ms) { return H_ - B_ - ms / c->ymax * (H_ - T_ - B_); }

static double series(const moe_sim_result *r, int s) {
  return 1e3 * (s == 0 ? r->step_s : s == 1 ? r->compute_s : r->exposed_comm_s);
}

static const char *const NAMES[] = {"step", "compute (busiest device)", "exposed communication"};
static const uint8_t RGB[3][3] = {{0x20, 0x20, 0x20}, {0x1f, 0x77, 0xb4}, {0xd6, 0x27, 0x28}};

static int write_chart(FILE *fp, const void *ctx, char *msg, size_t n) {
  (void)msg, (void)n;
  const chart *c = ctx;
  fprintf(fp, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
              "height=\"%d\" font-family=\"sans-serif\" font-size=\"13\" fill=\"#202020\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
              "<path d=\"M%d %d V%d H%d\" stroke=\"#202020\" fill=\"none\"/>\n",
          W_, H_, L_, T_, H_ - B_, W_ - R_);
  for (int t = 0; t <= 4; t++) { /* y ticks: 0 .. ymax in quarters */
    double ms = c->ymax * t / 4;
    fprintf(fp, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L_ - 6, py(c, ms) + 4, ms);
  }
  for (int i = 0; i < c->n; i++)
    fprintf(fp, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", px(c, c->x[i]), H_ - B_ + 18, c->x[i]);
  fprintf(fp, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s%s</text>\n", (W_ - R_ + L_) / 2, H_ - 15, c->key,
          c->logx ? " (log scale)" : "");
  fprintf(fp, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">ms</text>\n",
          (H_ - B_ + T_) / 2, (H_ - B_ + T_) / 2);
  for (int s = 0; s < 3; s++) {
    fprintf(fp, "<polyline fill=\"none\" stroke=\"#%02x%02x%02x\" stroke-width=\"2\" points=\"", RGB[s][0], RGB[s][1],
            RGB[s][2]);
    for (int i = 0; i < c->n; i++) fprintf(fp, "%s%.1f,%.1f", i ? " " : "", px(c, c->x[i]), py(c, series(c->r + i, s)));
    fprintf(fp, "\"/>\n<text x=\"%d\" y=\"%d\" fill=\"#%02x%02x%02x\">%s</text>\n", W_ - R_ + 10, T_ + 10 + 18 * s,
            RGB[s][0], RGB[s][1], RGB[s][2], NAMES[s]);
  }
  return fputs("</svg>\n", fp) >= 0;
}

/* A filled square of side 2 w + 1 around (x, y), clipped to the raster. */
static void dot(uint8_t *rgb, double x, double y, int w, const uint8_t col[3]) {
  int x0 = (int)lround(x), y0 = (int)lround(y);
  for (int yy = y0 - w; yy <= y0 + w; yy++)
    for (int xx = x0 - w; xx <= x0 + w; xx++)
      if (xx >= 0 && xx < W_ && yy >= 0 && yy < H_) memcpy(rgb + ((size_t)yy * W_ + xx) * 3, col, 3);
}

/* A line from (x0, y0) to (x1, y1) as dots a pixel apart. */
static void line(uint8_t *rgb, double x0, double y0, double x1, double y1, int w, const uint8_t col[3]) {
  int steps = (int)ceil(fmax(fabs(x1 - x0), fabs(y1 - y0)));
  for (int i = 0; i <= steps; i++) {
    double f = steps ? (double)i / steps : 0;
    dot(rgb, x0 + f * (x1 - x0), y0 + f * (y1 - y0), w, col);
  }
}

/* The raster: axes, y ticks at quarters and x ticks at the swept values, the three series, and a
 * swatch per series where the SVG has its name (the raster has no text: the SVG and the CSV do). */
static void draw_chart(const chart *c, uint8_t *rgb) {
  memset(rgb, 255, (size_t)W_ * H_ * 3);
  const uint8_t *ink = RGB[0];
  line(rgb, L_, T_, L_, H_ - B_, 0, ink);
  line(rgb, L_, H_ - B_, W_ - R_, H_ - B_, 0, ink);
  for (int t = 0; t <= 4; t++) line(rgb, L_ - 6, py(c, c->ymax * t / 4), L_, py(c, c->ymax * t / 4), 0, ink);
  for (int i = 0; i < c->n; i++) line(rgb, px(c, c->x[i]), H_ - B_, px(c, c->x[i]), H_ - B_ + 6, 0, ink);
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i + 1 < c->n; i++)
      line(rgb, px(c, c->x[i]), py(c, series(c->r + i, s)), px(c, c->x[i + 1]), py(c, series(c->r + i + 1, s)), 1,
           RGB[s]);
    for (int i = 0; i < c->n; i++) dot(rgb, px(c, c->x[i]), py(c, series(c->r + i, s)), 2, RGB[s]);
    line(rgb, W_ - R_ + 10, T_ + 6 + 18 * s, W_ - R_ + 40, T_ + 6 + 18 * s, 1, RGB[s]);
  }
}

static moe_status make_chart(const char *path, const char *key, const double *x, const moe_sim_result *r, int n,
                             chart *c) {
  MOE_PLOT_TRY(n >= 1, MOE_ERR_ARG, "%s: a sweep chart needs at least one run", path);
  *c = (chart){key, x, r, n, 0, x[0], x[0], 0};
  for (int i = 0; i < n; i++) {
    MOE_PLOT_TRY(isfinite(x[i]) && x[i] > 0, MOE_ERR_ARG, "%s: sweep value %g is not > 0", path, x[i]);
    c->x0 = fmin(c->x0, x[i]), c->x1 = fmax(c->x1, x[i]), c->ymax = fmax(c->ymax, series(r + i, 0));
  }
  c->logx = c->x1 > 10 * c->x0;
  c->ymax = c->ymax > 0 ? c->ymax * 1.05 : 1;
  return MOE_OK;
}

moe_status moe_sim_plot_svg(const char *path, const char *key, const double *x, const moe_sim_result *r, int n) {
  chart c;
  moe_status st = make_chart(path, key, x, r, n, &c);
  return st ? st : moe_plot__save(path, write_chart, &c);
}

moe_status moe_sim_plot_png(const char *path, const char *key, const double *x, const moe_sim_result *r, int n) {
  chart c;
  moe_status st = make_chart(path, key, x, r, n, &c);
  if (st) return st;
  uint8_t *rgb = malloc((size_t)W_ * H_ * 3);
  MOE_PLOT_TRY(rgb, MOE_ERR_NOMEM, "%s: a %d x %d raster", path, W_, H_);
  draw_chart(&c, rgb);
  st = moe_plot__save_png(path, rgb, W_, H_, "moe simulate sweep: step, compute and exposed communication (ms)");
  free(rgb);
  return st;
}
