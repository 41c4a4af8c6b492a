/* Expert-load heatmaps (plot/heatmap.c) and `moe plot-trace`: values and downsampling on hand-made
 * traces, a PNG read back through libpng (size, a hot cell in the color map's top color, a cold one in
 * its bottom color), an SVG's cells, and the command's errors (exit 1, a message, no output left). */
#include <dirent.h>
#include <png.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "moe_plot.h"
#include "run_cli.h"
#include "test.h"

static const uint8_t TOP[3] = {0xfd, 0xe7, 0x25}, BOTTOM[3] = {0x44, 0x01, 0x54};

/* A trace of `steps` x `layers` x `experts` with every cell 0. */
static int trace_new(moe_trace *t, int64_t steps, int layers, int experts) {
  t->steps = steps;
  t->layers = layers;
  t->experts = experts;
  t->tokens = calloc((size_t)(steps * layers * experts), sizeof *t->tokens);
  return t->tokens != NULL;
}
static int32_t *cell(moe_trace *t, int64_t s, int l, int e) { return &t->tokens[(s * t->layers + l) * t->experts + e]; }

/* 5 steps, 1 layer, 4 experts: 3 tokens to each expert, except step 3 where expert 2 gets all 12. */
static int trace_hot(moe_trace *t) {
  if (!trace_new(t, 5, 1, 4)) return 0;
  for (int s = 0; s < 5; s++)
    for (int e = 0; e < 4; e++) *cell(t, s, 0, e) = s == 3 ? (e == 2 ? 12 : 0) : 3;
  return 1;
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Files in the scratch directory whose names start with prefix (temp files included). */
static int count_files(const char *prefix) {
  char dir[512];
  test_tmp_path("", dir, sizeof dir);
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
  if (d) closedir(d);
  return n;
}

TEST(plot_colormap) {
  uint8_t c[3];
  moe_heatmap_color(0, c);
  ASSERT(!memcmp(c, BOTTOM, 3));
  moe_heatmap_color(1, c);
  ASSERT(!memcmp(c, TOP, 3));
  moe_heatmap_color(7, c); /* clamped */
  ASSERT(!memcmp(c, TOP, 3));
  moe_heatmap_color(-1, c);
  ASSERT(!memcmp(c, BOTTOM, 3));
  moe_heatmap_color(4.0f / 9, c); /* the 5th sample, #26828e */
  ASSERT_EQ_INT(c[0], 0x26);
  ASSERT_EQ_INT(c[1], 0x82);
  ASSERT_EQ_INT(c[2], 0x8e);
  moe_heatmap_color(0.5f / 9, c); /* halfway between #440154 and #482878 */
  ASSERT_NEAR(c[0], (0x44 + 0x48) / 2.0, 0.51);
  ASSERT_NEAR(c[1], (0x01 + 0x28) / 2.0, 0.51);
  ASSERT_NEAR(c[2], (0x54 + 0x78) / 2.0, 0.51);
}

TEST(plot_values) {
  moe_trace t;
  ASSERT(trace_new(&t, 3, 2, 4));
  /* layer 0: step 0 tokens 1,1,2,0; step 1 nothing; step 2 0,0,0,5. layer 1: step 1 all 4 to expert 1 */
  *cell(&t, 0, 0, 0) = 1, *cell(&t, 0, 0, 1) = 1, *cell(&t, 0, 0, 2) = 2, *cell(&t, 2, 0, 3) = 5;
  *cell(&t, 1, 1, 1) = 4;
  moe_heatmap h;
  moe_status st = moe_heatmap_build(&h, &t, -1, 1200);
  if (st != MOE_OK) moe_trace_free(&t);
  ASSERT_OK(st);
  int ok = h.panels == 2 && h.layer0 == 0 && h.experts == 4 && h.cols == 3 && h.steps == 3;
  float v[2][4][3];
  memcpy(v, h.value, sizeof v);
  float vmax = h.vmax;
  int w = h.width, hh = h.height, cw = h.cell_w, ch = h.cell_h;
  moe_heatmap_free(&h);
  ASSERT(ok);
  ASSERT_NEAR(v[0][0][0], 0.25, 1e-6);
  ASSERT_NEAR(v[0][2][0], 0.5, 1e-6);
  ASSERT_NEAR(v[0][3][0], 0, 0);
  for (int e = 0; e < 4; e++) ASSERT_NEAR(v[0][e][1], 0, 0); /* a step without tokens */
  ASSERT_NEAR(v[0][3][2], 1, 1e-6);
  ASSERT_NEAR(v[1][1][1], 1, 1e-6);
  ASSERT_NEAR(v[1][0][1], 0, 0);
  ASSERT_NEAR(vmax, 1, 1e-6);
  ASSERT_EQ_INT(cw, 320); /* few steps: wide cells, 960 pixels in all */
  ASSERT_EQ_INT(ch, 24); /* 96 pixels at least for a panel's rows */
  ASSERT(w > 0 && hh > 0);

  /* one layer */
  st = moe_heatmap_build(&h, &t, 1, 1200);
  if (st != MOE_OK) moe_trace_free(&t);
  ASSERT_OK(st);
  ok = h.panels == 1 && h.layer0 == 1 && h.value[1 * 3 + 1] == 1.0f && h.value[0 * 3 + 1] == 0;
  int h1 = h.height;
  moe_heatmap_free(&h);
  ASSERT(ok);
  ASSERT(h1 < hh);

  /* errors: layer out of range, no columns, empty trace */
  ASSERT_STATUS(moe_heatmap_build(&h, &t, 2, 1200), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "layer 2 out of range"));
  ASSERT(h.value == NULL && h.rgb == NULL);
  ASSERT_STATUS(moe_heatmap_build(&h, &t, 0, 0), MOE_ERR_ARG);
  moe_trace_free(&t);
  moe_trace empty = {0};
  ASSERT_STATUS(moe_heatmap_build(&h, &empty, -1, 1200), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "empty trace"));
}

TEST(plot_downsample) {
  /* 10 steps averaged into 4 columns: steps [0,2), [2,5), [5,7), [7,10). Expert 0 gets all tokens at
   * step s when s is even, expert 1 otherwise. */
  moe_trace t;
  ASSERT(trace_new(&t, 10, 1, 2));
  for (int s = 0; s < 10; s++) *cell(&t, s, 0, s % 2) = 7;
  moe_heatmap h;
  moe_status st = moe_heatmap_build(&h, &t, 0, 4);
  moe_trace_free(&t);
  ASSERT_OK(st);
  float v[2][4];
  int cols = h.cols;
  memcpy(v, h.value, sizeof v);
  moe_heatmap_free(&h);
  ASSERT_EQ_INT(cols, 4);
  const float want0[4] = {0.5f, 2 / 3.0f, 0.5f, 1 / 3.0f}; /* {0}, {2,4}, {6}, {8} of the columns' steps */
  for (int c = 0; c < 4; c++) {
    ASSERT_NEAR(v[0][c], want0[c], 1e-6);
    ASSERT_NEAR(v[1][c], 1 - want0[c], 1e-6);
  }

  /* thousands of steps: at most 1200 columns of a pixel each */
  ASSERT(trace_new(&t, 3000, 1, 8));
  for (int s = 0; s < 3000; s++) *cell(&t, s, 0, s % 8) = 1 + s % 5;
  st = moe_heatmap_build(&h, &t, -1, MOE_HEATMAP_PNG_COLS);
  moe_trace_free(&t);
  ASSERT_OK(st);
  int ok = h.cols == 1200 && h.cell_w == 1 && h.width > 1200;
  float sum = 0;
  for (int e = 0; e < 8; e++) sum += h.value[e * h.cols + 17];
  moe_heatmap_free(&h);
  ASSERT(ok);
  ASSERT_NEAR(sum, 1, 1e-5); /* each column's shares still sum to 1 */
}

/* Reads an 8-bit RGB PNG into *rgb (malloc'd); 0 on failure. */
static int read_png(const char *path, int *w, int *h, uint8_t **rgb) {
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&im, path)) return 0;
  im.format = PNG_FORMAT_RGB;
  *rgb = malloc(PNG_IMAGE_SIZE(im));
  if (!*rgb || !png_image_finish_read(&im, NULL, *rgb, 0, NULL)) {
    png_image_free(&im);
    free(*rgb);
    return 0;
  }
  *w = (int)im.width;
  *h = (int)im.height;
  return 1;
}

static const uint8_t *pixel_of(const uint8_t *rgb, int w, const moe_heatmap *h, int p, int e, int c) {
  int x = h->x0 + c * h->cell_w + h->cell_w / 2, y = h->y0 + p * h->panel_h + e * h->cell_h + h->cell_h / 2;
  return rgb + ((size_t)y * w + x) * 3;
}

TEST(plot_png) {
  moe_trace t;
  ASSERT(trace_hot(&t));
  moe_heatmap h;
  moe_status st = moe_heatmap_build(&h, &t, -1, MOE_HEATMAP_PNG_COLS);
  moe_trace_free(&t);
  ASSERT_OK(st);
  char path[512];
  test_tmp_path("hot.png", path, sizeof path);
  st = moe_heatmap_write_png(&h, path);
  if (st != MOE_OK) moe_heatmap_free(&h);
  ASSERT_OK(st);
  int w = 0, ht = 0;
  uint8_t *rgb = NULL;
  int ok = read_png(path, &w, &ht, &rgb);
  if (!ok) moe_heatmap_free(&h);
  ASSERT(ok);
  ok = w == h.width && ht == h.height && !memcmp(rgb, h.rgb, (size_t)w * ht * 3);
  uint8_t hot[3], cold[3], warm[3], want_warm[3];
  memcpy(hot, pixel_of(rgb, w, &h, 0, 2, 3), 3);
  memcpy(cold, pixel_of(rgb, w, &h, 0, 0, 3), 3);
  memcpy(warm, pixel_of(rgb, w, &h, 0, 1, 0), 3);
  moe_heatmap_color(0.25f, want_warm);
  float vmax = h.vmax;
  free(rgb);
  moe_heatmap_free(&h);
  ASSERT(ok); /* the file holds the raster, pixel for pixel */
  ASSERT_NEAR(vmax, 1, 1e-6);
  ASSERT(memcmp(hot, cold, 3));
  ASSERT(!memcmp(hot, TOP, 3));
  ASSERT(!memcmp(cold, BOTTOM, 3));
  ASSERT(!memcmp(warm, want_warm, 3));
  ASSERT_EQ_INT(count_files("hot.png"), 1); /* no temp file left */

  /* a directory that does not exist: MOE_ERR_IO, nothing written */
  ASSERT(trace_hot(&t));
  st = moe_heatmap_build(&h, &t, 0, 100);
  moe_trace_free(&t);
  ASSERT_OK(st);
  test_tmp_path("nodir/x.png", path, sizeof path);
  st = moe_heatmap_write_png(&h, path);
  moe_heatmap_free(&h);
  ASSERT_STATUS(st, MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "nodir/x.png"));
}

/* <rect elements inside the first <g class="cells"> group of svg. */
static int count_cells(const char *svg) {
  const char *g = strstr(svg, "<g class=\"cells\"");
  const char *end = g ? strstr(g, "</g>") : NULL;
  int n = 0;
  for (const char *p = g; p && end && (p = strstr(p + 1, "<rect")) && p < end;) n++;
  return n;
}

TEST(plot_svg) {
  moe_trace t;
  ASSERT(trace_hot(&t));
  moe_heatmap h;
  moe_status st = moe_heatmap_build(&h, &t, -1, MOE_HEATMAP_SVG_COLS);
  moe_trace_free(&t);
  ASSERT_OK(st);
  char path[512], hot[200], cold[200], run[200];
  test_tmp_path("hot.svg", path, sizeof path);
  st = moe_heatmap_write_svg(&h, path);
  /* the hot cell (expert 2, step 3), a cold one (expert 0, step 3), and expert 1's run over steps 0..2 */
  snprintf(hot, sizeof hot, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fde725\"/>",
           h.x0 + 3 * h.cell_w, h.y0 + 2 * h.cell_h, h.cell_w, h.cell_h);
  snprintf(cold, sizeof cold, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#440154\"/>",
           h.x0 + 3 * h.cell_w, h.y0, h.cell_w, h.cell_h);
  uint8_t c[3];
  moe_heatmap_color(0.25f, c);
  snprintf(run, sizeof run, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#%02x%02x%02x\"/>", h.x0,
           h.y0 + h.cell_h, 3 * h.cell_w, h.cell_h, c[0], c[1], c[2]);
  moe_heatmap_free(&h);
  ASSERT_OK(st);
  char *svg = test_read_file(path, NULL);
  ASSERT(svg);
  int n = count_cells(svg);
  int ok = strstr(svg, hot) && strstr(svg, cold) && strstr(svg, run) && strstr(svg, ">step</text>") &&
           strstr(svg, ">expert</text>") && strstr(svg, ">layer 0 (5 steps)</text>") &&
           strstr(svg, "fill=\"url(#viridis)\"") && strstr(svg, "</svg>\n");
  if (!ok) fprintf(stderr, "  want %s\n  and %s\n  and %s\n", hot, cold, run);
  free(svg);
  ASSERT_EQ_INT(n, 12); /* each expert's row: steps 0-2, step 3, step 4 */
  ASSERT(ok);
}

/* ---- the command ---- */
static char err_text[4096];

static int plot(const char *trace, const char *out, const char *extra) {
  char args[2048];
  snprintf(args, sizeof args, "plot-trace '%s' -o '%s' %s", trace, out, extra);
  return run_moe(NULL, args, NULL, err_text, sizeof err_text);
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return 0;
  int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

#define EXPECT_PLOT_FAILS(trace, out, extra, needle)                                  \
  do {                                                                               \
    int rc_ = plot(trace, out, extra);                                               \
    if (rc_ != 1 || !strstr(err_text, needle))                                       \
      FAIL_("plot-trace %s -o %s %s: exit %d, stderr '%s', want 1 and '%s'", trace, out, extra, rc_, \
            err_text, needle);                                                       \
    ASSERT(!exists(out));                                                            \
    ASSERT_EQ_INT(count_files("cli-heat"), 0);                                       \
  } while (0)

TEST(plot_cli) {
  char good[512], empty[512], bad[512], missing[512], png[512], svg[512], jpg[512];
  test_tmp_path("cli-good.csv", good, sizeof good);
  test_tmp_path("cli-empty.csv", empty, sizeof empty);
  test_tmp_path("cli-bad.csv", bad, sizeof bad);
  test_tmp_path("cli-missing.csv", missing, sizeof missing);
  test_tmp_path("cli-heat.png", png, sizeof png);
  test_tmp_path("cli-heat.svg", svg, sizeof svg);
  test_tmp_path("cli-heat.jpg", jpg, sizeof jpg);
  ASSERT(write_text(good, "step,layer,expert,tokens\n0,0,0,3\n0,0,1,1\n1,0,2,4\n0,1,1,2\n1,1,0,2\n"));
  ASSERT(write_text(empty, "step,layer,expert,tokens\n"));
  ASSERT(write_text(bad, "step,layer,expert,tokens\n0,0,0,3\n0,0,x,1\n"));

  EXPECT_PLOT_FAILS(missing, png, "", "cli-missing.csv");
  EXPECT_PLOT_FAILS(bad, png, "", "cli-bad.csv line 3");
  EXPECT_PLOT_FAILS(empty, png, "", "empty trace");
  EXPECT_PLOT_FAILS(good, jpg, "", "want a name ending in .png or .svg");
  EXPECT_PLOT_FAILS(good, png, "--layer 2", "--layer 2 out of range");
  EXPECT_PLOT_FAILS(good, svg, "--layer -1", "--layer: bad value");
  EXPECT_PLOT_FAILS(good, png, "--experts 2", "unknown expert 2");
  EXPECT_PLOT_FAILS(good, png, "--colour red", "unknown flag");

  /* the good ones: every layer as PNG, layer 1 as SVG with 5 experts */
  ASSERT_EQ_INT(plot(good, png, ""), 0);
  int w = 0, h = 0;
  uint8_t *rgb = NULL;
  ASSERT(read_png(png, &w, &h, &rgb));
  free(rgb);
  ASSERT(w > 100 && h > 200);
  ASSERT_EQ_INT(plot(good, svg, "--layer 1 --experts 5"), 0);
  char *s = test_read_file(svg, NULL);
  ASSERT(s);
  int ok = strstr(s, "<g id=\"layer1\">") && !strstr(s, "<g id=\"layer0\">") && strstr(s, ">4</text>");
  int n = count_cells(s);
  free(s);
  ASSERT(ok);
  ASSERT_EQ_INT(n, 7); /* layer 1: experts 0 and 1 switch (2 runs each), experts 2, 3, 4 are idle (1 each) */
  ASSERT_EQ_INT(count_files("cli-heat"), 2);
  /* --json: what was drawn, one JSON line on stdout (layer 1 of 5 experts over 2 steps; its largest share
   * is step 1's expert 0: 2 of 2 tokens) */
  char args[2048], jpath[512];
  snprintf(args, sizeof args, "plot-trace '%s' -o '%s' --layer 1 --experts 5 --json", good, svg);
  ASSERT_EQ_INT(run_moe(NULL, args, test_tmp_path("cli-plot.json", jpath, sizeof jpath), err_text, sizeof err_text), 0);
  char *j = test_read_file(jpath, NULL);
  ASSERT(j);
  int json_ok = !strncmp(j, "{\"image\":", 9) && strstr(j, "\"layers\":1,\"experts\":5,\"steps\":2,") &&
                strstr(j, "\"largest_share\":1,") && !strchr(strchr(j, '\n') + 1, '\n');
  if (!json_ok) fprintf(stderr, "  --json printed: %s", j);
  free(j);
  ASSERT(json_ok);
}
