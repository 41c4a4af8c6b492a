/* The progress line (see progress.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"

#define EVERY 0.25 /* seconds between updates */

int cli_progress_flag(const char *arg, cli_progress *p) {
  if (cli_flag_is(arg, "progress")) p->mode = PROGRESS_ON;
  else if (cli_flag_is(arg, "quiet")) p->mode = PROGRESS_OFF;
  else return 0;
  return 1;
}

void cli_progress_start(cli_progress *p, int show, const char *unit, int64_t total) {
  cli_progress_break(p);
  p->tty = isatty(2);
  p->on = show && p->mode != PROGRESS_OFF && (p->mode == PROGRESS_ON || p->tty);
  p->unit = unit;
  p->total = total;
  p->t0 = cli_now();
  p->last = -1;
}

void cli_progress_update(cli_progress *p, int64_t done, const char *label, const char *extra) {
  if (!p->on) return;
  double now = cli_now();
  if (done != 1 && done != p->total && now - p->last < EVERY) return;
  p->last = now;
  enum { W = 20 };
  char bar[W + 1];
  int full = p->total > 0 ? (int)(done * W / p->total) : W;
  for (int i = 0; i < W; i++) bar[i] = i < full ? '=' : ' ';
  bar[W] = 0;
  double rate = now > p->t0 ? done / (now - p->t0) : 0, eta = rate > 0 ? (p->total - done) / rate : 0;
  fprintf(stderr, "%s%s%s[%s] %lld/%lld %.1f %s/s ETA %.0f s%s%s%s", p->tty ? "\r" : "", label ? label : "",
          label ? " " : "", bar, (long long)done, (long long)p->total, rate, p->unit, eta, extra ? " " : "",
          extra ? extra : "", p->tty ? " " : "\n");
  fflush(stderr);
  p->shown = p->tty;
}

void cli_progress_break(cli_progress *p) {
  if (p->shown) fputc('\n', stderr);
  p->shown = 0;
}
