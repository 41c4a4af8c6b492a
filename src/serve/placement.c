/* Expert placement from traces (deployment paper VII, DIGEST P1 1.4 and 4.1-4.3). For one layer,
 * A[m][b] is the fraction of batch (step) b's tokens routed to expert m. The placement puts E/N
 * experts on each of N devices, so that the per-batch share of the busiest device stays low:
 * - greedy: LPT on the mean share Ã_m with a cardinality limit (experts by descending Ã, each to the
 *   least-loaded device that still has room);
 * - anticorr: the same, but a device's load when placing expert a also counts corr * S_am for each
 *   expert m already there, S the Pearson correlation of the A series over the fit batches, so that
 *   experts that fire together are spread apart (corr = 0.5 as written in the paper).
 * Evaluation: Max Load = max over batches and devices of the device's share, Avg Max Load = mean over
 * batches of the busiest device's share. Batches with no tokens in the layer are skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "formats/json.h"

static const char *method_names[] = {"greedy", "anticorr"};

const char *moe_placement_method_name(moe_placement_method m) { return (unsigned)m < 2 ? method_names[m] : "?"; }

moe_status moe_placement_method_parse(const char *s, const char *field, moe_placement_method *out) {
  int v;
  MOE_CHECK(moe__parse_name(s, field ? field : "method", method_names, 2, &v));
  *out = (moe_placement_method)v;
  return MOE_OK;
}

static moe_status check_args(const moe_trace *t, int layer, int64_t s0, int64_t s1, int devices, const char *fn) {
  MOE_CHECK(moe__trace_check_range(t, layer, s0, s1, fn));
  MOE_TRY(devices >= 1, MOE_ERR_ARG, "%s: devices must be >= 1, got %d", fn, devices);
  return MOE_OK;
}

moe_status moe_placement_contiguous(int experts, int devices, int *expert_device) {
  MOE_TRY(expert_device, MOE_ERR_ARG, "moe_placement_contiguous: NULL output");
  MOE_TRY(experts >= 1 && devices >= 1 && experts % devices == 0, MOE_ERR_ARG,
          "the number of experts (%d) must be a positive multiple of the number of devices (%d)", experts, devices);
  for (int m = 0; m < experts; m++) expert_device[m] = m / (experts / devices);
  return MOE_OK;
}

/* The greedy order: descending mean share, ties to the lower id (insertion sort: stable, E small). */
static void sort_by_mean(int *order, const double *mean, int E) {
  for (int i = 0; i < E; i++) {
    int x = i, j = i;
    for (; j > 0 && mean[order[j - 1]] < mean[x]; j--) order[j] = order[j - 1];
    order[j] = x;
  }
}

moe_status moe_placement_fit(const moe_trace *t, int layer, int64_t s0, int64_t s1, int devices,
                             moe_placement_method method, double corr, int *expert_device) {
  MOE_CHECK(check_args(t, layer, s0, s1, devices, "moe_placement_fit"));
  MOE_TRY(expert_device, MOE_ERR_ARG, "moe_placement_fit: NULL output");
  MOE_TRY((unsigned)method < 2, MOE_ERR_ARG, "moe_placement_fit: unknown method %d", (int)method);
  MOE_TRY(isfinite(corr), MOE_ERR_VALUE, "moe_placement_fit: correlation weight is not finite");
  const int E = t->experts, L = t->layers, N = devices;
  MOE_TRY(E >= 1 && E % N == 0, MOE_ERR_ARG,
          "the number of experts (%d) must be a positive multiple of the number of devices (%d)", E, N);
  const int anti = method == MOE_PLACEMENT_ANTICORR;
  MOE_TRY(!anti || E <= MOE_PLACEMENT_ANTICORR_MAX_EXPERTS, MOE_ERR_ARG,
          "moe_placement_fit: anticorr keeps an experts x experts correlation matrix and places in experts^2 x devices "
          "steps: at most %d experts, the trace has %d (greedy has no such limit)",
          MOE_PLACEMENT_ANTICORR_MAX_EXPERTS, E);
  /* mean[m] = sum_b A[m][b] / nb; cross[a*E+m] = sum_b A[a][b] A[m][b] (anticorr only). */
  double *mean = calloc((size_t)E, sizeof *mean), *load = calloc((size_t)N, sizeof *load);
  double *cross = anti ? calloc((size_t)E * E, sizeof *cross) : NULL;
  double *share = malloc((size_t)E * sizeof *share);
  int *order = malloc((size_t)E * sizeof *order), *count = calloc((size_t)N, sizeof *count);
  int *nz = malloc((size_t)E * sizeof *nz);
  moe_status st = MOE_OK;
  if (!mean || !load || (anti && !cross) || !share || !order || !count || !nz) {
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "moe_placement_fit: out of memory for %d experts", E);
    goto done;
  }
  int64_t nb = 0;
  for (int64_t b = s0; b < s1; b++) {
    const int32_t *bt = t->tokens + ((size_t)b * L + layer) * E;
    double total = 0;
    int k = 0;
    for (int m = 0; m < E; m++)
      if (bt[m] > 0) total += bt[m], nz[k++] = m;
    if (total == 0) continue;
    nb++;
    for (int i = 0; i < k; i++) share[nz[i]] = bt[nz[i]] / total, mean[nz[i]] += share[nz[i]];
    if (anti) /* only the non-zero shares contribute to the cross products */
      for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) cross[(size_t)nz[i] * E + nz[j]] += share[nz[i]] * share[nz[j]];
  }
  for (int m = 0; m < E; m++) mean[m] = nb ? mean[m] / nb : 0;
  if (anti) { /* cross becomes the Pearson correlation S; a (numerically) constant series gives 0 */
    for (int a = 0; a < E; a++) share[a] = nb ? cross[(size_t)a * E + a] / nb - mean[a] * mean[a] : 0;
    for (int a = 0; a < E; a++)
      for (int m = 0; m < E; m++) {
        double va = share[a], vm = share[m], s = 0;
        if (va > 1e-12 && vm > 1e-12) {
          s = (cross[(size_t)a * E + m] / nb - mean[a] * mean[m]) / sqrt(va * vm);
          s = s > 1 ? 1 : s < -1 ? -1 : s;
        }
        cross[(size_t)a * E + m] = s;
      }
  }
  for (int m = 0; m < E; m++) expert_device[m] = -1;
  sort_by_mean(order, mean, E);
  for (int i = 0; i < E; i++) {
    int a = order[i], best = -1;
    double best_load = 0;
    for (int n = 0; n < N; n++) {
      if (count[n] == E / N) continue;
      double l = load[n];
      if (anti) {
        l = 0;
        for (int m = 0; m < E; m++)
          if (expert_device[m] == n) l += mean[m] + corr * cross[(size_t)a * E + m];
      }
      if (best < 0 || l < best_load) best = n, best_load = l;
    }
    expert_device[a] = best;
    count[best]++;
    load[best] += mean[a];
  }
done:
  free(mean), free(load), free(cross), free(share), free(order), free(count), free(nz);
  return st;
}

moe_status moe_placement_eval(const moe_trace *t, int layer, int64_t s0, int64_t s1, int devices,
                              const int *expert_device, double *max_load, double *avg_max_load,
                              int64_t *batches) {
  MOE_CHECK(check_args(t, layer, s0, s1, devices, "moe_placement_eval"));
  MOE_TRY(expert_device && max_load && avg_max_load, MOE_ERR_ARG, "moe_placement_eval: NULL argument");
  const int E = t->experts, L = t->layers, N = devices;
  for (int m = 0; m < E; m++)
    MOE_TRY(expert_device[m] >= 0 && expert_device[m] < N, MOE_ERR_ARG,
            "moe_placement_eval: expert %d on device %d, out of range [0, %d)", m, expert_device[m], N);
  double *dev = malloc((size_t)N * sizeof *dev);
  MOE_TRY(dev, MOE_ERR_NOMEM, "moe_placement_eval: out of memory");
  double mx = 0, sum = 0;
  int64_t nb = 0;
  for (int64_t b = s0; b < s1; b++) {
    const int32_t *bt = t->tokens + ((size_t)b * L + layer) * E;
    double total = 0;
    for (int n = 0; n < N; n++) dev[n] = 0;
    for (int m = 0; m < E; m++)
      if (bt[m] > 0) total += bt[m], dev[expert_device[m]] += bt[m];
    if (total == 0) continue;
    double bm = 0;
    for (int n = 0; n < N; n++)
      if (dev[n] / total > bm) bm = dev[n] / total;
    nb++;
    sum += bm;
    if (bm > mx) mx = bm;
  }
  free(dev);
  *max_load = mx;
  *avg_max_load = nb ? sum / nb : 0;
  if (batches) *batches = nb;
  return MOE_OK;
}

moe_status moe_placement_load(const char *path, int layer, int experts, int devices, int *expert_device) {
  MOE_TRY(path && expert_device && devices > 0 && experts > 0, MOE_ERR_ARG, "moe_placement_load: bad arguments");
  cJSON *root;
  moe_status st = moe__json_read(path, "placement", (size_t)1 << 26, &root);
  MOE_CHECK(st);
  const cJSON *dv = cJSON_GetObjectItemCaseSensitive(root, "devices");
  const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers"), *found = NULL, *it;
  if (!cJSON_IsNumber(dv) || dv->valuedouble != devices)
    st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: \"devices\" is not %d (the ranks of this run)", path,
                    devices);
  const cJSON *none = NULL, *ls = cJSON_IsArray(layers) ? layers : none;
  cJSON_ArrayForEach(it, ls) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(it, "layer");
    if (cJSON_IsNumber(l) && l->valuedouble == layer) {
      if (found && st == MOE_OK)
        st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: layer %d appears twice", path, layer);
      found = cJSON_GetObjectItemCaseSensitive(it, "expert_device");
    }
  }
  if (st == MOE_OK && (!cJSON_IsArray(found) || cJSON_GetArraySize(found) != experts))
    st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: no \"expert_device\" of %d experts for layer %d", path,
                    experts, layer);
  int *per = st == MOE_OK ? calloc((size_t)devices, sizeof *per) : NULL;
  if (st == MOE_OK && !per) st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "out of memory");
  int e = 0;
  const cJSON *items = st == MOE_OK ? found : none;
  cJSON_ArrayForEach(it, items) {
    int d = cJSON_IsNumber(it) ? it->valueint : -1;
    if (d < 0 || d >= devices || it->valuedouble != d) {
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: layer %d expert_device[%d] is not a device in [0, %d)",
                      path, layer, e, devices);
      break;
    }
    expert_device[e++] = d;
    per[d]++;
  }
  for (int d = 0; st == MOE_OK && d < devices; d++)
    if (per[d] != experts / devices || experts % devices)
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: layer %d puts %d experts on device %d, want %d", path,
                      layer, per[d], d, experts / devices);
  free(per);
  cJSON_Delete(root);
  return st;
}
