/* moe train --replicas auto (DESIGN 3.4): each rank gets --slots expert slots (default E/W + 1, one
 * spare), the start-up profile of the cost model is printed, placements decided by the policy maker
 * land --delta-launch + 1 steps late through RECOMPILE, and the run's balance ratio and operations are
 * reported at the end, with the placement at the start (a resumed run's: the checkpoint's on as many ranks,
 * expert parallelism's blocks on another number) and at the end. */
#include "train_flex.h"

#include "cli.h"

/* The placement of m's blocks (moe_flex_layout_write), or why it is not shown. */
static const char *placement(const moe_model_t *m, char *buf, size_t n) {
  return moe_flex_layout_write(m, buf, n) == MOE_OK ? buf : "(too large to show)";
}

void flex_profile_text(const moe_flex_env *e, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "expert tokens/s");
  if (!e->rate_n) at += (size_t)snprintf(buf + at, at < n ? n - at : 0, " %.4g", e->tps);
  for (int i = 0; i < e->rate_n; i++)
    at += (size_t)snprintf(buf + at, at < n ? n - at : 0, " %.0f:%.4g", e->rate_rows[i], e->rate_tps[i]);
  snprintf(buf + at, at < n ? n - at : 0, ", all-to-all %.3g us + %.4g GB/s, all-reduce %.3g us + %.4g GB/s",
           e->a2a_lat * 1e6, e->a2a_bw / 1e9, e->ar_lat * 1e6, e->ar_bw / 1e9);
}

int flex_start(moe_flex_trainer **out, moe_model_t *m, float threshold, int horizon, int delta, const char *ops,
               FILE *f) {
  if (moe_flex_trainer_new(out, m, threshold, horizon, delta, ops) != MOE_OK) return cli_fail("train");
  moe_flex_env e;
  moe_flex_trainer_env(*out, &e);
  char buf[1024];
  flex_profile_text(&e, buf, sizeof buf);
  fprintf(f, "replicas: %d slots per rank, balance threshold %.3g; profiled: %s\n", m->cfg.moe.replica_slots,
          threshold, buf);
  fprintf(f, "replicas: placement at the start %s\n", placement(m, buf, sizeof buf));
  return 0;
}

void flex_report(const moe_flex_trainer *t, const moe_model_t *m, FILE *f, int json) {
  char buf[1024];
  const char *at_end = placement(m, buf, sizeof buf);
  moe_flex_stats s;
  moe_flex_trainer_stats(t, &s);
  double n = s.steps ? (double)s.steps : 1;
  if (json)
    fprintf(f, "{\"replicas\": {\"placements\": %lld, \"expand\": %lld, \"shrink\": %lld, \"migrate\": %lld, "
               "\"bytes_moved\": %.0f, \"balance_mean\": %.4f, \"balance_last\": %.4f, \"balance_without\": %.4f, "
               "\"placement\": \"%s\"}}\n",
            (long long)s.placements, (long long)s.expands, (long long)s.shrinks, (long long)s.migrates, s.bytes_moved,
            s.balance_sum / n, s.balance_last, s.balance_blocks_sum / n, at_end);
  else
    fprintf(f, "replicas: %lld placements (expand %lld, shrink %lld, migrate %lld), %.0f bytes moved; balance ratio "
               "mean %.4f (last %.4f), without replicas %.4f; placement at the end %s\n", (long long)s.placements, (long long)s.expands,
            (long long)s.shrinks, (long long)s.migrates, s.bytes_moved, s.balance_sum / n, s.balance_last,
            s.balance_blocks_sum / n, at_end);
}

int flex_default_slots(const char *resume, int E, int W) {
  int slots = resume ? moe_checkpoint_replica_slots(resume, W) : 0;
  return slots > 0 ? slots : E / W + 1;
}
