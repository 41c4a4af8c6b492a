/* --memory-budget for the language-model commands (lm_budget.h). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lm_budget.h"

void lm_budget_defaults(lm_budget_opts *o) {
  memset(o, 0, sizeof *o);
  moe_lm_stream_config_default(&o->s);
}

int cli_parse_size(const char *s, size_t *bytes) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v > 0) || v > 1e18) return 0;
  const char *units = "KMGT", *u = *end ? strchr(units, end[0] & ~0x20) : NULL;
  if (*end && !u) return 0;
  if (u) {
    for (const char *p = units; p <= u; p++) v *= 1024;
    end++;
  }
  if (!strcmp(end, "iB") || !strcmp(end, "B")) end += strlen(end);
  if (*end || v < 1 || v > 1e18) return 0;
  *bytes = (size_t)v;
  return 1;
}

int lm_budget_flag(const char *f, const char *v, lm_budget_opts *o, int *ok) {
  if (cli_flag_is(f, "memory-budget")) *ok = cli_parse_size(v, &o->s.budget);
  else if (cli_flag_is(f, "policy"))
    *ok = moe_cache_policy_parse(v, "--policy", &o->s.policy) == MOE_OK && o->s.policy != MOE_CACHE_BELADY,
    o->policy_set = 1;
  else if (cli_flag_is(f, "prefetch")) *ok = moe_prefetch_mode_parse(v, "--prefetch", &o->s.prefetch) == MOE_OK;
  else if (cli_flag_is(f, "placement")) *ok = moe_lm_placement_parse(v, "--placement", &o->s.placement) == MOE_OK;
  else if (cli_flag_is(f, "placement-trace")) o->placement_trace = v;
  else if (cli_flag_is(f, "pin-from")) o->pin_from = v;
  else if (cli_flag_is(f, "pin")) *ok = cli_parse_int(v, &o->s.pin) && o->s.pin >= 1, o->pin_set = 1;
  else if (cli_flag_is(f, "page-cache"))
    *ok = !strcmp(v, "keep") || !strcmp(v, "drop"), o->s.keep_page_cache = !strcmp(v, "keep");
  else return 0;
  return 1;
}

const char *lm_budget_misuse(const lm_budget_opts *o) {
  int traced = o->placement_trace || o->pin_from || o->pin_set || o->s.placement != MOE_LM_PLACE_EQUAL;
  if (!o->s.budget && traced) return "--placement, --placement-trace, --pin-from and --pin need --memory-budget";
  if ((o->s.placement == MOE_LM_PLACE_MISS_COST) != !!o->placement_trace)
    return "--placement miss-cost and --placement-trace T.csv go together";
  if (o->pin_set && !o->pin_from) return "--pin needs --pin-from";
  return NULL;
}

moe_status lm_budget_load(moe_lm_t *m, const char *dir, const moe_lm_config *c, const lm_budget_opts *o,
                          moe_lm_experts *x) {
  memset(x, 0, sizeof *x);
  if (!o->s.budget) return moe_lm_load(m, dir, c);
  moe_lm_config own;
  moe_status st = c ? MOE_OK : moe_lm_read_config(dir, &own);
  if (!c) c = &own;
  moe_lm_stream_config s = o->s;
  moe_trace place = {0}, pin = {0};
  if (st == MOE_OK && o->placement_trace) st = moe_trace_load(&place, o->placement_trace, c->moe.E);
  if (st == MOE_OK && o->pin_from) st = moe_trace_load(&pin, o->pin_from, c->moe.E);
  s.placement_trace = o->placement_trace ? &place : NULL;
  s.pin_trace = o->pin_from ? &pin : NULL;
  if (st == MOE_OK) st = moe_lm_load_streaming(m, dir, c, &s, x);
  else memset(m, 0, sizeof *m);
  moe_trace_free(&place);
  moe_trace_free(&pin);
  return st;
}

static double ratio(int64_t a, int64_t b) { return b ? (double)a / (double)b : 0.0; }

/* One layer's (or the sum's) fields into j. */
static void add_stats(cJSON *j, const moe_expert_cache_stats *s, int64_t tokens) {
  cJSON_AddNumberToObject(j, "hit_rate", s->accesses ? 1.0 - ratio(s->misses, s->accesses) : 1.0);
  cJSON_AddNumberToObject(j, "accesses", (double)s->accesses);
  cJSON_AddNumberToObject(j, "misses", (double)s->misses);
  cJSON_AddNumberToObject(j, "bytes_read", (double)s->bytes_read);
  cJSON_AddNumberToObject(j, "bytes_read_per_token", ratio(s->bytes_read, tokens));
  cJSON_AddNumberToObject(j, "stall_seconds", s->stall_seconds);
  cJSON_AddNumberToObject(j, "read_seconds", s->read_seconds);
  cJSON_AddNumberToObject(j, "prefetches", (double)s->prefetches);
  cJSON_AddNumberToObject(j, "prefetch_skipped", (double)s->prefetch_skipped);
  cJSON_AddNumberToObject(j, "prefetch_used", (double)s->prefetch_used);
  cJSON_AddNumberToObject(j, "prefetch_precision", ratio(s->predicted_hit, s->predicted));
  cJSON_AddNumberToObject(j, "prefetch_recall", ratio(s->predicted_hit, s->actual));
  cJSON_AddNumberToObject(j, "resident_bytes", (double)s->resident_bytes);
  cJSON_AddNumberToObject(j, "pinned", s->pinned);
}

cJSON *lm_budget_json(const moe_lm_experts *x, const lm_budget_opts *o, int64_t tokens) {
  if (!o->s.budget || !x->caches) return NULL;
  cJSON *j = cJSON_CreateObject(), *layers = cJSON_CreateArray();
  if (!j || !layers) return cJSON_Delete(j), cJSON_Delete(layers), NULL;
  moe_expert_cache_stats t = {0};
  for (int i = 0; i < x->n; i++) {
    if (!x->caches[i]) continue;
    moe_expert_cache_stats s;
    moe_expert_cache_get_stats(x->caches[i], &s);
    cJSON *l = cJSON_CreateObject();
    if (!l) continue;
    cJSON_AddNumberToObject(l, "layer", i);
    cJSON_AddNumberToObject(l, "slots", s.slots);
    add_stats(l, &s, tokens);
    cJSON_AddItemToArray(layers, l);
    t.accesses += s.accesses, t.misses += s.misses, t.bytes_read += s.bytes_read, t.stall_seconds += s.stall_seconds;
    t.prefetches += s.prefetches, t.prefetch_used += s.prefetch_used, t.predicted += s.predicted;
    t.read_seconds += s.read_seconds, t.prefetch_skipped += s.prefetch_skipped;
    t.predicted_hit += s.predicted_hit, t.actual += s.actual, t.resident_bytes += s.resident_bytes;
    t.pinned += s.pinned;
  }
  cJSON_AddNumberToObject(j, "memory_budget", (double)o->s.budget);
  cJSON_AddStringToObject(j, "policy", moe_cache_policy_name(o->s.policy));
  cJSON_AddStringToObject(j, "placement", moe_lm_placement_name(o->s.placement));
  cJSON_AddStringToObject(j, "prefetch", moe_prefetch_mode_name(o->s.prefetch));
  cJSON_AddBoolToObject(j, "page_cache_kept", o->s.keep_page_cache);
  cJSON_AddNumberToObject(j, "tokens", (double)tokens);
  add_stats(j, &t, tokens);
  cJSON_AddItemToObject(j, "layers", layers);
  return j;
}
