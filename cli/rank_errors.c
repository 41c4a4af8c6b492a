/* Errors printed once under mpirun (see rank_errors.h). The messages travel as doubles through
 * moe_dist_allreduce (each rank writing its own slot: a gather), the one collective of the public API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rank_errors.h"

#define MSG 512 /* characters of a message carried to rank 0 */

static struct {
  int on, rank, size;
  int settled; /* the last failure is known to every rank */
  char msg[MSG];
} held;

void cli_hold_errors(const moe_dist *d) {
  held.on = moe_dist_size(d) > 1;
  held.rank = moe_dist_rank(d);
  held.size = moe_dist_size(d);
  held.msg[0] = 0;
}

void cli_report(const char *cmd, const char *msg) {
  if (!held.on) fprintf(stderr, "moe %s: %s\n", cmd, msg);
  else if (!held.msg[0]) snprintf(held.msg, MSG, "%s", msg[0] ? msg : "failed");
}

int cli_quiet_rank(void) { return held.on && held.rank != 0; }

/* "rank 1" or "ranks 1, 3" of the ranks whose message equals rank q's; how many in *n. */
static void ranks_with(const double *text, int W, int q, char *out, size_t size, int *n) {
  size_t len = 0;
  *n = 0;
  for (int p = 0; p < W; p++)
    if (!memcmp(text + (size_t)p * MSG, text + (size_t)q * MSG, MSG * sizeof *text) && len < size)
      len += (size_t)snprintf(out + len, size - len, "%s%d", (*n)++ ? ", " : "", p);
}

int cli_settle(const moe_dist *d, const char *cmd, int rc) {
  if (!held.on || held.settled) return rc; /* a failure settled before is every rank's already */
  int W = held.size, r = held.rank;
  double *v = calloc((size_t)W * (MSG + 1), sizeof *v), *text = v + W;
  if (!v) {
    fprintf(stderr, "moe %s: rank %d: out of memory settling errors\n", cmd, r);
    return rc ? rc : 1; /* unsettled: cli_dist_end stops every rank */
  }
  v[r] = rc != 0;
  int failed = 0;
  moe_status st = moe_dist_allreduce(d, v, W);
  for (int p = 0; p < W; p++) failed += v[p] != 0;
  if (st == MOE_OK && failed) {
    for (int c = 0; c < MSG && rc; c++) text[(size_t)r * MSG + c] = (unsigned char)held.msg[c];
    st = moe_dist_allreduce(d, text, W * MSG);
  }
  if (st != MOE_OK) {
    fprintf(stderr, "moe %s: rank %d: %s\n", cmd, r, moe_last_error());
    free(v);
    return rc ? rc : 1;
  }
  for (int q = 0; q < W && r == 0; q++) { /* each distinct message once, at its first rank */
    int first = v[q] != 0 && text[(size_t)q * MSG] != 0, n; /* none held: the rank printed its own */
    for (int p = 0; p < q && first; p++)
      first = !(v[p] && !memcmp(text + (size_t)p * MSG, text + (size_t)q * MSG, MSG * sizeof *text));
    if (!first) continue;
    char who[128], m[MSG];
    ranks_with(text, W, q, who, sizeof who, &n);
    for (int c = 0; c < MSG; c++) m[c] = (char)text[(size_t)q * MSG + c];
    m[MSG - 1] = 0;
    if (n == W) fprintf(stderr, "moe %s: %s\n", cmd, m);
    else fprintf(stderr, "moe %s: %s %s of %d: %s\n", cmd, n > 1 ? "ranks" : "rank", who, W, m);
  }
  free(v);
  held.msg[0] = 0;
  held.settled = failed > 0;
  return failed ? (rc ? rc : 1) : 0;
}

int cli_dist_end(moe_dist *d, const char *cmd, int rc) {
  if (rc && held.on && !held.settled) {
    if (held.msg[0]) fprintf(stderr, "moe %s: rank %d of %d: %s\n", cmd, held.rank, held.size, held.msg);
    moe_dist_abort(d, rc); /* does not return */
  }
  held.on = 0;
  moe_dist_finalize(d);
  return rc;
}
