/* The sweep's chart (moe simulate --sweep --plot): an SVG line chart of the step, the busiest device's
 * compute and the exposed communication against the swept value. The heatmap's writer draws rasters
 * of cells, not lines, so this is its own small writer. */
#include <math.h>
#include <string.h>

#include "atomic_file.h"
#include "internal.h"

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

static int write_chart(FILE *fp, void *ctx, char *msg, size_t n) {
  (void)msg, (void)n;
  const chart *c = ctx;
  static const char *const names[] = {"step", "compute (busiest device)", "exposed communication"};
  static const char *const colors[] = {"#202020", "#1f77b4", "#d62728"};
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
    fprintf(fp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", colors[s]);
    for (int i = 0; i < c->n; i++) fprintf(fp, "%s%.1f,%.1f", i ? " " : "", px(c, c->x[i]), py(c, series(c->r + i, s)));
    fprintf(fp, "\"/>\n<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", W_ - R_ + 10, T_ + 10 + 18 * s, colors[s],
            names[s]);
  }
  return fputs("</svg>\n", fp) >= 0;
}

moe_status moe_sim_plot_svg(const char *path, const char *key, const double *x, const moe_sim_result *r, int n) {
  MOE_TRY(n >= 1, MOE_ERR_ARG, "%s: a sweep chart needs at least one run", path);
  chart c = {key, x, r, n, 0, x[0], x[0], 0};
  for (int i = 0; i < n; i++) {
    MOE_TRY(isfinite(x[i]) && x[i] > 0, MOE_ERR_ARG, "%s: sweep value %g is not > 0", path, x[i]);
    c.x0 = fmin(c.x0, x[i]), c.x1 = fmax(c.x1, x[i]), c.ymax = fmax(c.ymax, series(r + i, 0));
  }
  c.logx = c.x1 > 10 * c.x0;
  c.ymax = c.ymax > 0 ? c.ymax * 1.05 : 1;
  return moe__save_atomic(path, write_chart, &c);
}
