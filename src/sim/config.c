/* moe simulate's JSON config: a strict reader (unknown fields refused, so a typo is not a silent
 * default) and the sweep's setter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "sim/sim.h"

static const char *const FIELDS[] = {
    "nodes", "devices_per_node", "intra_bw", "intra_lat", "inter_bw", "inter_lat", "host_bw", "gemm_flops",
    "gemm_half_rows", "gemm_nt_flops", "gemm_nt_half_rows", "gemm_tn_flops", "gemm_tn_half_rows", "mem_bw",
    "memory_bytes", "tokens", "d_model", "hidden", "experts", "top_k", "capacity_factor", "dtype_bytes", "zipf",
    "load", "pipeline", "a2a", "reuse", "flex", "r", "dispatch", "serve_trace", "cache_experts", "cache_policy",
    "fetch_bw"};
static const char *const A2A_NAMES[] = {"linear", "2dh"}, *const DISPATCH_NAMES[] = {"dynamic", "static"};

/* A number in [lo, hi]; absent: *out unchanged unless required. */
static moe_status get_num(const char *path, const cJSON *r, const char *key, int required, double lo, double hi,
                          double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
  MOE_TRY(v || !required, MOE_ERR_FORMAT, "%s: field \"%s\" is required", path, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsNumber(v), MOE_ERR_FORMAT, "%s: \"%s\" is not a number", path, key);
  MOE_TRY(isfinite(v->valuedouble) && v->valuedouble >= lo && v->valuedouble <= hi, MOE_ERR_FORMAT,
          "%s: \"%s\" is %g, want a number in [%g, %g]", path, key, v->valuedouble, lo, hi);
  *out = v->valuedouble;
  return MOE_OK;
}

static moe_status get_int(const char *path, const cJSON *r, const char *key, int required, int lo, int hi, int *out) {
  double d = *out;
  MOE_CHECK(get_num(path, r, key, required, lo, hi, &d));
  MOE_TRY(d == floor(d), MOE_ERR_FORMAT, "%s: \"%s\" is %g, want a whole number", path, key, d);
  *out = (int)d;
  return MOE_OK;
}

static moe_status get_name(const char *path, const cJSON *r, const char *key, const char *const *names, int n,
                           int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
  if (!v) return MOE_OK;
  MOE_TRY(cJSON_IsString(v), MOE_ERR_FORMAT, "%s: \"%s\" must be a string", path, key);
  moe_status st = moe__parse_name(v->valuestring, key, names, n, out);
  MOE_TRY(st == MOE_OK, MOE_ERR_FORMAT, "%s: %s", path, moe_last_error());
  return MOE_OK;
}

static moe_status read_skew(const char *path, const cJSON *r, moe_sim_config *c) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, "load");
  MOE_CHECK(get_num(path, r, "zipf", 0, 0, 16, &c->zipf));
  if (!l) return MOE_OK;
  MOE_TRY(!cJSON_GetObjectItemCaseSensitive(r, "zipf"), MOE_ERR_FORMAT, "%s: give \"zipf\" or \"load\", not both",
          path);
  MOE_TRY(cJSON_IsArray(l) && cJSON_GetArraySize(l) == c->E, MOE_ERR_FORMAT,
          "%s: \"load\" must be an array of %d numbers (one per expert), has %d", path, c->E,
          cJSON_IsArray(l) ? cJSON_GetArraySize(l) : -1);
  c->load = malloc(sizeof *c->load * (size_t)c->E);
  MOE_TRY(c->load, MOE_ERR_NOMEM, "%s: \"load\" of %d experts", path, c->E);
  double sum = 0;
  int e = 0;
  for (const cJSON *v = l->child; v; v = v->next, e++) {
    MOE_TRY(cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= 0, MOE_ERR_FORMAT,
            "%s: \"load\"[%d] must be a number >= 0", path, e);
    sum += c->load[e] = v->valuedouble;
  }
  MOE_TRY(sum > 0, MOE_ERR_FORMAT, "%s: \"load\" sums to 0: no expert gets tokens", path);
  return MOE_OK;
}

/* The serving run's fields: the trace (a path as given), K slots (at most the experts), the policy
 * (not BELADY's: the loader cannot see the future) and the slow memory's bandwidth, needed with K. */
static moe_status read_serving(const char *path, const cJSON *r, moe_sim_config *c) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "serve_trace"), *p = cJSON_GetObjectItemCaseSensitive(r, "cache_policy");
  c->cache_policy = MOE_CACHE_LIFO;
  MOE_CHECK(get_int(path, r, "cache_experts", 0, 0, c->E, &c->cache_k));
  MOE_CHECK(get_num(path, r, "fetch_bw", c->cache_k > 0, 1, 1e30, &c->fetch_bw));
  if (p) {
    MOE_TRY(cJSON_IsString(p) && moe_cache_policy_parse(p->valuestring, "cache_policy", &c->cache_policy) == MOE_OK &&
            c->cache_policy != MOE_CACHE_BELADY, MOE_ERR_FORMAT,
            "%s: \"cache_policy\" must be \"lifo\", \"lru\" or \"fifo\"", path);
  }
  MOE_TRY(t || (!c->cache_k && !p && !c->fetch_bw), MOE_ERR_FORMAT,
          "%s: \"cache_experts\", \"cache_policy\" and \"fetch_bw\" are for a serving run: \"serve_trace\" is required", path);
  if (!t) return MOE_OK;
  MOE_TRY(cJSON_IsString(t) && t->valuestring[0], MOE_ERR_FORMAT, "%s: \"serve_trace\" must be a file name", path);
  c->serve_trace = strdup(t->valuestring);
  MOE_TRY(c->serve_trace, MOE_ERR_NOMEM, "%s: \"serve_trace\"", path);
  return MOE_OK;
}

static moe_status read_config(const char *path, const cJSON *r, moe_sim_config *c) {
  MOE_TRY(cJSON_IsObject(r), MOE_ERR_FORMAT, "%s: the config must be a JSON object", path);
  for (const cJSON *v = r->child; v; v = v->next) {
    size_t i = 0;
    while (i < sizeof FIELDS / sizeof *FIELDS && strcmp(FIELDS[i], v->string)) i++;
    MOE_TRY(i < sizeof FIELDS / sizeof *FIELDS, MOE_ERR_FORMAT, "%s: unknown field \"%s\"", path, v->string);
  }
  const double BIG = 1e30;
  c->nodes = 1, c->k = 1, c->elem = 4, c->pipeline = 1;
  MOE_CHECK(get_int(path, r, "nodes", 0, 1, 1 << 16, &c->nodes));
  MOE_CHECK(get_int(path, r, "devices_per_node", 1, 1, 1 << 10, &c->dpn));
  MOE_CHECK(get_num(path, r, "intra_bw", 1, 1, BIG, &c->intra_bw));
  MOE_CHECK(get_num(path, r, "intra_lat", 1, 0, 1, &c->intra_lat));
  MOE_CHECK(get_num(path, r, "inter_bw", c->nodes > 1, 1, BIG, &c->inter_bw));
  MOE_CHECK(get_num(path, r, "inter_lat", c->nodes > 1, 0, 1, &c->inter_lat));
  MOE_CHECK(get_num(path, r, "host_bw", 0, 1, BIG, &c->host_bw));
  MOE_CHECK(get_num(path, r, "gemm_flops", 1, 1, BIG, &c->gemm_flops));
  MOE_CHECK(get_num(path, r, "gemm_half_rows", 0, 0, 1 << 20, &c->half_rows));
  MOE_CHECK(get_num(path, r, "gemm_nt_flops", 0, 1, BIG, &c->nt.flops));
  MOE_CHECK(get_num(path, r, "gemm_nt_half_rows", 0, 0, 1 << 20, &c->nt.half_rows));
  MOE_CHECK(get_num(path, r, "gemm_tn_flops", 0, 1, BIG, &c->tn.flops));
  MOE_CHECK(get_num(path, r, "gemm_tn_half_rows", 0, 0, 1 << 20, &c->tn.half_rows));
  MOE_CHECK(get_num(path, r, "mem_bw", 0, 1, BIG, &c->mem_bw));
  MOE_CHECK(get_num(path, r, "memory_bytes", 0, 0, BIG, &c->mem_bytes));
  MOE_CHECK(get_int(path, r, "tokens", 1, 1, 1 << 30, &c->T));
  MOE_CHECK(get_int(path, r, "d_model", 1, 1, 1 << 20, &c->D));
  MOE_CHECK(get_int(path, r, "hidden", 1, 1, 1 << 22, &c->H));
  MOE_CHECK(get_int(path, r, "experts", 1, 1, 1 << 20, &c->E));
  MOE_CHECK(get_int(path, r, "top_k", 0, 1, c->E, &c->k));
  MOE_CHECK(get_num(path, r, "capacity_factor", 0, 0, 1e6, &c->cf));
  MOE_CHECK(get_int(path, r, "dtype_bytes", 0, 1, 8, &c->elem));
  int W = moe__sim_devices(c);
  MOE_TRY(W <= MOE__SIM_MAX_DEVICES, MOE_ERR_FORMAT, "%s: %d nodes x %d devices is %d, more than the %d simulated",
          path, c->nodes, c->dpn, W, MOE__SIM_MAX_DEVICES);
  MOE_TRY(c->E % W == 0 || W % c->E == 0, MOE_ERR_FORMAT,
          "%s: \"experts\" is %d: neither a multiple nor a divisor of the %d devices", path, c->E, W);
  c->r = 1;
  MOE_CHECK(get_int(path, r, "r", 0, 0, moe__sim_r_max(c), &c->r));
  MOE_CHECK(get_name(path, r, "dispatch", DISPATCH_NAMES, 2, &c->padded));
  MOE_TRY(!c->padded || c->cf > 0, MOE_ERR_FORMAT, "%s: \"dispatch\" static pads to the capacity: "
          "\"capacity_factor\" is required", path);
  MOE_CHECK(read_skew(path, r, c));
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pipeline");
  if (cJSON_IsString(p))
    MOE_TRY(!strcmp(p->valuestring, "auto") && !(c->pipeline = 0), MOE_ERR_FORMAT,
            "%s: \"pipeline\" is \"%s\", want a count >= 1 or \"auto\"", path, p->valuestring);
  else
    MOE_CHECK(get_int(path, r, "pipeline", 0, 1, 1 << 10, &c->pipeline));
  int a = 0, s = 0;
  MOE_CHECK(get_name(path, r, "a2a", A2A_NAMES, 2, &a));
  MOE_CHECK(get_name(path, r, "reuse", moe__reuse_names, MOE__REUSE_COUNT, &s));
  c->a2a = (moe__a2a)a, c->reuse = (moe__reuse)s;
  MOE_TRY(c->reuse != MOE__REUSE_S1, MOE_ERR_FORMAT, "%s: \"reuse\" is \"s1\", want none, s2, s3 or s4", path);
  MOE_TRY(c->host_bw > 0 || (c->reuse != MOE__REUSE_S2 && c->reuse != MOE__REUSE_S3), MOE_ERR_FORMAT,
          "%s: \"reuse\" %s offloads to the host: \"host_bw\" is required", path, moe__reuse_names[c->reuse]);
  MOE_CHECK(read_serving(path, r, c));
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(r, "flex");
  MOE_TRY(!f || cJSON_IsBool(f), MOE_ERR_FORMAT, "%s: \"flex\" must be true or false", path);
  c->flex = cJSON_IsTrue(f);
  return MOE_OK;
}

moe_status moe_sim_config_load(const char *path, moe_sim_config **out) {
  *out = NULL;
  moe_sim_config *c = calloc(1, sizeof *c);
  MOE_TRY(c, MOE_ERR_NOMEM, "%s: the simulator's config", path);
  cJSON *root;
  moe_status st = moe__json_read(path, "simulator config", 1 << 20, &root);
  if (st == MOE_OK) st = read_config(path, root, c);
  cJSON_Delete(root);
  if (st != MOE_OK) {
    moe_sim_config_free(c);
    return st;
  }
  *out = c;
  return MOE_OK;
}

void moe_sim_config_free(moe_sim_config *c) {
  if (!c) return;
  free(c->load);
  free(c->serve_trace);
  free(c);
}

moe_status moe_sim_config_set(moe_sim_config *c, const char *key, double v) {
  MOE_TRY(isfinite(v) && v > 0, MOE_ERR_ARG, "sweep %s: value %g, want > 0", key, v);
  if (!strcmp(key, "capacity")) {
    c->cf = v;
    return MOE_OK;
  }
  MOE_TRY(v == floor(v) && v <= 1 << 30, MOE_ERR_ARG, "sweep %s: value %g, want a whole number", key, v);
  if (!strcmp(key, "batch")) {
    c->T = (int)v;
    return MOE_OK;
  }
  MOE_TRY(!strcmp(key, "devices"), MOE_ERR_ARG, "sweep: unknown key '%s' (want devices, batch or capacity)", key);
  int W = (int)v;
  MOE_TRY(W <= MOE__SIM_MAX_DEVICES, MOE_ERR_ARG, "sweep devices: %d, more than the %d simulated", W,
          MOE__SIM_MAX_DEVICES);
  MOE_TRY(W % c->dpn == 0, MOE_ERR_ARG, "sweep devices: %d is not a multiple of devices_per_node %d", W, c->dpn);
  MOE_TRY(!c->load, MOE_ERR_ARG, "sweep devices: the config's \"load\" fixes the experts at %d", c->E);
  int W0 = moe__sim_devices(c), m = moe__sim_r_max(c); /* devices per expert, kept */
  MOE_TRY(W % m == 0, MOE_ERR_ARG, "sweep devices: %d is not a multiple of the config's %d devices per expert",
          W, m);
  c->E = c->E >= W0 ? c->E / W0 * W : W / m;
  c->nodes = W / c->dpn;
  MOE_TRY(c->nodes == 1 || c->inter_bw > 0, MOE_ERR_ARG,
          "sweep devices: %d devices span %d nodes but the config has no inter_bw", W, c->nodes);
  return MOE_OK;
}
