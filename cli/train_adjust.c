/* The training commands' adjustment flags and report (train_adjust.h). */
#include <string.h>

#include "cli.h"
#include "train_adjust.h"

void train_adjust_defaults(train_adjust *a) {
  moe_trainer_config c;
  moe_trainer_config_default(&c);
  *a = c.adjust;
}

void train_capacity_report(const moe_trainer *t, FILE *f) {
  moe_recompile_stats st;
  if (!moe_trainer_capacity_stats(t, &st)) return;
  fprintf(f, "dynamic capacity: %lld recompiles, %lld trigger calls, %lld stalls (%.3f s)\n", (long long)st.adjustments,
          (long long)st.triggers, (long long)st.stalls, st.stall_seconds);
}

/* The adjustments' flags: 1 when f is one. */
static int adjust_flag(const char *f, const char *v, train_adjust *a, int *ok) {
  if (cli_flag_is(f, "delta_launch"))
    *ok = cli_parse_int(v, &a->delta_launch) && a->delta_launch >= 0 && a->delta_launch < 60;
  else if (cli_flag_is(f, "headroom"))
    *ok = cli_parse_float(v, &a->headroom) && a->headroom >= 0 && a->headroom <= 10;
  else if (cli_flag_is(f, "cache_on")) *ok = cli_parse_float(v, &a->cache.on) && a->cache.on >= 0 && a->cache.on <= 1;
  else if (cli_flag_is(f, "cache_off"))
    *ok = cli_parse_float(v, &a->cache.off) && a->cache.off >= 0 && a->cache.off <= 1;
  else if (cli_flag_is(f, "cache_min_epoch")) *ok = cli_parse_int(v, &a->cache.min_epoch) && a->cache.min_epoch >= 0;
  else return 0;
  return 1;
}

int train_adjust_flag(const char *f, const char *v, moe_layer_config *m, train_adjust *a, int *ok, moe_status *st) {
  *ok = 1;
  *st = MOE_OK;
  if (cli_flag_is(f, "capacity")) {
    a->dynamic_capacity = !strcmp(v, "dynamic");
    if (a->dynamic_capacity) m->dispatch = MOE_DISPATCH_STATIC, m->capacity_setting = 1.0f;
    else *ok = cli_parse_float(v, &m->capacity_setting);
  } else if (cli_flag_is(f, "dispatch")) *st = moe_dispatch_parse(v, "--dispatch", &m->dispatch);
  else if (cli_flag_is(f, "dtype")) *st = moe_dtype_parse(v, "--dtype", &m->dtype);
  else return adjust_flag(f, v, a, ok) ? 2 : 0;
  return 1;
}
