/* A progress line on stderr for long loops (train, bench, infer): done/total, rate and ETA, throttled
 * to a few updates a second on a monotonic clock. Shown on a terminal, or anywhere with --progress;
 * never with --quiet. On a terminal the line is rewritten in place; elsewhere each update is a line. */
#ifndef MOE_CLI_PROGRESS_H
#define MOE_CLI_PROGRESS_H

#include <stdint.h>

typedef struct {
  int mode;           /* PROGRESS_AUTO, _ON (--progress) or _OFF (--quiet) */
  int on, tty, shown; /* printing at all, to a terminal, a line is open (terminal) */
  const char *unit;
  int64_t total;
  double t0, last;
} cli_progress;

enum { PROGRESS_AUTO, PROGRESS_ON, PROGRESS_OFF };

/* Takes --progress or --quiet into p->mode (the struct zeroed first): 1 when arg was one of them. */
int cli_progress_flag(const char *arg, cli_progress *p);
/* Starts a loop of total units; show: 0 keeps this process silent (a rank other than 0). */
void cli_progress_start(cli_progress *p, int show, const char *unit, int64_t total);
/* "LABEL [bar] done/total R unit/s ETA S s EXTRA": at most every 0.25 s, and always for the first
 * and the last unit. label and extra may be NULL. */
void cli_progress_update(cli_progress *p, int64_t done, const char *label, const char *extra);
/* Ends a line left open on the terminal, so that other text starts on its own line. */
void cli_progress_break(cli_progress *p);

#endif
