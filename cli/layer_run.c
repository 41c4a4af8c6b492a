/* moe layer-run: one MoE layer from files (DESIGN 4.2). Reads the weights and options from W, x (and
 * dy, daux, dz, dspec for --backward) from X, and writes y, aux_loss, z_loss, expert_counts,
 * dropped, capacity (and spec with --spec, grad.* with --backward) to OUT atomically: on any error nothing
 * is written. Inputs may be F32 or BF16; --out-dtype bf16 writes the float outputs as BF16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rank_errors.h"

static const char *CMD = "layer-run";

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe layer-run --weights W.safetensors --input X.safetensors --out OUT.safetensors\n"
          "                     [--backward] [--spec] [--top_k K] [--capacity_setting X]\n"
          "                     [--activation relu|gelu|silu|swiglu|swiglu_oai] [--normalize_topk true|false]\n"
          "                     [--dispatch dynamic|static] [--priority index|score]\n"
          "                     [--router linear|cosine] [--threads N] [--dtype f32|bf16]\n"
          "                     [--out-dtype f32|bf16] [--expert-capacity C0,C1,...]\n"
          "                     [--pipeline N|auto] [--memory-reuse none|s2|s3|s4]\n"
          "                     [--expert-parallel [--a2a linear|2dh|auto] [--ranks-per-node G] [--placement P.json]\n"
          "                                        [--parallel-r N|auto]]\n"
          "--dtype picks the experts' compute dtype (default: the file's \"dtype\" metadata, else f32);\n"
          "--out-dtype the dtype of the float tensors written (default f32). --expert-capacity gives each\n"
          "expert its own capacity (static dispatch; DynaMoE's per-expert capacities), E counts.\n"
          "--pipeline N runs the experts as N micro-batches (either dispatch; the same output bits; auto:\n"
          "the layer's adaptive choice), --memory-reuse s3|s2|s4 what backward restores instead of\n"
          "keeping (s3: the activations, recomputed; s2: the received rows, received again; s4: both).\n"
          "Under mpirun -np W, --expert-parallel spreads the experts over the ranks (each routes T/W of\n"
          "the tokens); rank 0 writes OUT, equal to the one-process output. --parallel-r shards every expert\n"
          "over the ranks instead (Tutel: r = 0 gathers the weights, r >= 1 moves tokens; any E and W).\n"
          "--a2a auto: the layer's dictionary of setups picks Linear or 2DH per capacity.\n"
          "The routing of open models comes from W: its __metadata__ score (softmax|sigmoid), n_group,\n"
          "topk_group, group_score (max|top2_sum) and routed_scale, and its tensors gate.select_bias and\n"
          "shared.* (shared experts; shared.gate.weight: gated); swiglu_oai's swiglu_alpha and swiglu_limit.\n");
}

typedef struct {
  const char *weights, *input, *out;
  int backward, spec, expert_parallel, ranks_per_node;
  const char *placement;
  int32_t *order; /* with --placement: the file's expert at each position (rank r owns r E/W ..) */
  moe_a2a a2a;
  int a2a_auto; /* --a2a auto */
  moe_dtype out_dt;
  const char *capacities; /* --expert-capacity: E comma-separated counts, or NULL */
  float *in[5]; /* the inputs read from X, as float32 */
  moe_layer_overrides ov;
  moe_dist *dist; /* with --expert-parallel */
  int parallel_r;  /* --parallel-r, MOE_PARALLEL_OFF without */
  moe_layer_t whole; /* --parallel-r: the layer whole, which the shards come from and the gradients go to */
} args_t;

static int parse_args(int argc, char **argv, args_t *a) {
  memset(a, 0, sizeof *a);
  moe_layer_overrides_init(&a->ov);
  a->parallel_r = MOE_PARALLEL_OFF;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "backward")) { a->backward = 1; continue; }
    if (cli_flag_is(f, "spec")) { a->spec = 1; continue; }
    if (cli_flag_is(f, "expert_parallel")) { a->expert_parallel = 1; continue; }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", f);
    const char *v = argv[++i];
    moe_status st = MOE_OK;
    if (cli_flag_is(f, "weights")) a->weights = v;
    else if (cli_flag_is(f, "input")) a->input = v;
    else if (cli_flag_is(f, "out")) a->out = v;
    else if (cli_flag_is(f, "top_k")) {
      if (!cli_parse_int(v, &a->ov.top_k)) return cli_usage_error(CMD, "--top_k: '%s' is not an integer", v);
    } else if (cli_flag_is(f, "capacity_setting")) {
      if (!cli_parse_float(v, &a->ov.capacity_setting))
        return cli_usage_error(CMD, "--capacity_setting: '%s' is not a finite number", v);
    } else if (cli_flag_is(f, "threads")) {
      if (!cli_parse_int(v, &a->ov.threads) || a->ov.threads < 0)
        return cli_usage_error(CMD, "--threads: '%s' is not a count", v);
    } else if (cli_flag_is(f, "normalize_topk")) {
      if (strcmp(v, "true") && strcmp(v, "false"))
        return cli_usage_error(CMD, "--normalize_topk: '%s' (want true|false)", v);
      a->ov.normalize_topk = !strcmp(v, "true");
    } else if (cli_flag_is(f, "placement")) {
      a->placement = v;
    } else if (cli_flag_is(f, "a2a")) {
      if (!cli_parse_a2a(v, &a->a2a, &a->a2a_auto)) return cli_usage_error(CMD, "--a2a: '%s' (want linear|2dh|auto)", v);
    } else if (cli_flag_is(f, "ranks_per_node")) {
      if (!cli_parse_int(v, &a->ranks_per_node) || a->ranks_per_node < 0)
        return cli_usage_error(CMD, "--ranks-per-node: '%s' is not a count", v);
    } else if (cli_flag_is(f, "activation")) {
      moe_act x; st = moe_act_parse(v, "--activation", &x); a->ov.act = (int)x;
    } else if (cli_flag_is(f, "dispatch")) {
      moe_dispatch x; st = moe_dispatch_parse(v, "--dispatch", &x); a->ov.dispatch = (int)x;
    } else if (cli_flag_is(f, "priority")) {
      moe_priority x; st = moe_priority_parse(v, "--priority", &x); a->ov.priority = (int)x;
    } else if (cli_flag_is(f, "router")) {
      moe_router x; st = moe_router_parse(v, "--router", &x); a->ov.router = (int)x;
    } else if (cli_flag_is(f, "dtype")) {
      moe_dtype x; st = moe_dtype_parse(v, "--dtype", &x); a->ov.dtype = (int)x;
    } else if (cli_flag_is(f, "pipeline")) {
      if (!cli_parse_pipeline(v, &a->ov.pipeline))
        return cli_usage_error(CMD, "--pipeline: '%s' is not a count of micro-batches >= 1 nor auto", v);
    } else if (cli_flag_is(f, "memory_reuse")) {
      moe_reuse x; st = moe_reuse_parse(v, "--memory-reuse", &x); a->ov.memory_reuse = (int)x;
    } else if (cli_flag_is(f, "parallel_r")) {
      if (!cli_parse_parallel_r(v, &a->parallel_r)) return cli_usage_error(CMD, "--parallel-r: '%s' (want r >= 0 or auto)", v);
    } else if (cli_flag_is(f, "expert_capacity")) {
      a->capacities = v;
    } else if (cli_flag_is(f, "out_dtype")) {
      st = moe_dtype_parse(v, "--out-dtype", &a->out_dt);
    } else {
      if (!cli_quiet_rank()) usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (st != MOE_OK) return cli_fail(CMD);
  }
  if (!a->weights || !a->input || !a->out) {
    if (!cli_quiet_rank()) usage(stderr);
    return cli_usage_error(CMD, "--weights, --input and --out are required");
  }
  return 0;
}

/* An F32 or BF16 tensor of X with exactly the given shape (rows may be -1: any), finite, as float32
 * into a->in[slot]; or an error. */
static int get_f32(args_t *a, int slot, const moe_st *f, const char *name, int ndim, int64_t rows, int64_t cols,
                   moe_tensor_view *v) {
  if (moe_st_get(f, name, v) != MOE_OK) return cli_fail(CMD);
  const char *p = moe_st_path(f);
  if (v->dtype != MOE_DT_F32 && v->dtype != MOE_DT_BF16)
    return cli_usage_error(CMD, "%s: tensor '%s' has dtype %s, want F32 or BF16", p, name, moe_dtype_name(v->dtype));
  int ok = v->ndim == ndim && (rows < 0 || v->shape[0] == rows) && (ndim < 2 || v->shape[1] == cols);
  if (!ok) {
    if (ndim == 1) return cli_usage_error(CMD, "%s: tensor '%s' must have shape (%lld)", p, name, (long long)rows);
    return cli_usage_error(CMD, "%s: tensor '%s' must have shape (%s, %lld), got %d dims%s", p, name,
                           rows < 0 ? "T" : "rows", (long long)cols, v->ndim,
                           v->ndim == 2 ? " with other sizes" : "");
  }
  size_t n = v->nbytes / moe_dtype_size(v->dtype);
  float *d = a->in[slot] = malloc(n * 4 + 4);
  if (!d) return cli_usage_error(CMD, "%s: out of memory for tensor '%s'", p, name);
  if (moe_st_view_f32(f, v, 0, n, d) != MOE_OK) return cli_fail(CMD);
  for (size_t i = 0; i < n; i++)
    if (!isfinite(d[i]))
      return cli_usage_error(CMD, "%s: tensor '%s' has a non-finite value (%g) at flat index %zu", p, name,
                             (double)d[i], i);
  return 0;
}

/* Rank 0 gets the ranks' pieces in rank order; without ranks, a and out are one buffer already. */
static int gather(const moe_dist *d, const float *a, size_t n, float *out) {
  return d && moe_dist_gather(d, a, (int)n, out) != MOE_OK ? cli_fail(CMD) : 0;
}

/* dst = src with expert e's `bytes` at the file's position order[e]. */
static void to_file_order(const args_t *a, int E, void *dst, const void *src, size_t bytes) {
  for (int e = 0; e < E; e++)
    memcpy((char *)dst + (size_t)a->order[e] * bytes, (const char *)src + (size_t)e * bytes, bytes);
}

/* The gradients of every weight: router gradients summed over the ranks, expert gradients gathered
 * from their owners into (E, ...) tensors. Rank 0 adds them to w. */
static int add_grads(args_t *a, moe_layer_t *l, moe_st_writer *w, float *scratch) {
  if (a->dist && moe_layer_reduce_grads(l) != MOE_OK) return cli_fail(CMD);
  int root = moe_dist_rank(a->dist) == 0, sharded = a->whole.params != NULL;
  if (sharded && moe_layer_shard_gather(l, 1, root ? &a->whole : NULL) != MOE_OK) return cli_fail(CMD);
  for (int i = 0; i < l->nparams; i++) {
    const moe_param_info *p = sharded ? &a->whole.info[i] : &l->info[i]; /* the same tensors in order */
    int64_t shape[3] = {p->shape[0], p->shape[1], p->shape[2]};
    const float *g = (sharded ? a->whole.grads : l->grads) + p->offset;
    int expert_rows = !strncmp(p->name, "experts.", 8), gate_rows = !strcmp(p->name, "gate.weight") ||
                                                                    !strcmp(p->name, "gate.bias");
    if (a->dist && expert_rows && !sharded) {
      if (gather(a->dist, g, p->numel, scratch)) return 1;
      shape[0] = l->cfg.E;
      g = scratch;
    }
    if (a->order && (expert_rows || gate_rows)) { /* back to the file's expert order */
      size_t per = (size_t)(p->numel * (expert_rows ? (size_t)moe_dist_size(a->dist) : 1)) / (size_t)l->cfg.E;
      float *u = scratch + (size_t)l->cfg.E * per;
      to_file_order(a, l->cfg.E, u, g, per * 4);
      g = u;
    }
    char name[128];
    snprintf(name, sizeof name, "grad.%s", p->name);
    if (root && moe_st_writer_add_f32(w, name, a->out_dt, p->ndim, shape, g) != MOE_OK) return cli_fail(CMD);
  }
  return 0;
}

/* --placement: rank r owns the experts the placement puts on device r (layer 0 of the file). */
static int placement_order(args_t *a, const moe_st *wf) {
  moe_tensor_view v;
  if (moe_st_get(wf, "experts.fc1.weight", &v) != MOE_OK) return cli_fail(CMD);
  int E = (int)v.shape[0], W = moe_dist_size(a->dist), n = 0;
  int *dev = malloc(sizeof(int) * (size_t)E);
  a->order = malloc(sizeof(int32_t) * (size_t)E);
  if (!dev || !a->order) {
    free(dev);
    return cli_usage_error(CMD, "out of memory");
  }
  if (moe_placement_load(a->placement, 0, E, W, dev) != MOE_OK) {
    free(dev);
    return cli_fail(CMD);
  }
  for (int d = 0; d < W; d++)
    for (int e = 0; e < E; e++)
      if (dev[e] == d) a->order[n++] = e;
  free(dev);
  a->ov.expert_order = a->order;
  return 0;
}

/* --expert-capacity: exactly E non-negative counts, in the file's expert order. */
static int set_capacities(const args_t *a, moe_layer_t *l) {
  int E = l->cfg.E, n = 0;
  int32_t *cap = malloc(sizeof(int32_t) * 2 * (size_t)E), *by_layer = cap + E;
  if (!cap) return cli_usage_error(CMD, "out of memory");
  const char *p = a->capacities;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > (1 << 24) || (*end && (*end != ',' || !end[1])) || n == E) {
      free(cap);
      return cli_usage_error(CMD, "--expert-capacity: want %d counts in [0, 2^24] separated by commas, got '%s'", E,
                             a->capacities);
    }
    cap[n++] = (int32_t)v;
    p = *end ? end + 1 : end;
  }
  int rc = 0;
  if (n != E) rc = cli_usage_error(CMD, "--expert-capacity: %d counts for %d experts", n, E);
  else {
    for (int e = 0; e < E; e++) by_layer[e] = cap[a->order ? a->order[e] : e]; /* the layer's e is the file's order[e] */
    if (moe_layer_set_expert_capacity(l, by_layer, 0) != MOE_OK) rc = cli_fail(CMD);
  }
  free(cap);
  return rc;
}

/* --parallel-r: the layer whole from the file, then sharded over the ranks. */
static int load_sharded(args_t *a, moe_st *wf, moe_layer_t *l) {
  if (a->placement || !a->dist) return cli_usage_error(CMD, "--parallel-r needs --expert-parallel and no --placement");
  a->ov.dist = NULL;
  if (moe_layer_load(&a->whole, wf, &a->ov) != MOE_OK) return cli_fail(CMD);
  moe_layer_config c = a->whole.cfg;
  c.dist = a->dist;
  c.parallel_r = a->parallel_r;
  if (moe_layer_init(l, &c) != MOE_OK || moe_layer_shard_take(l, &a->whole) != MOE_OK) return cli_fail(CMD);
  return 0;
}

static int run(args_t *a, moe_st *wf, moe_st *xf, moe_layer_t *l, moe_st_writer *w, float **bufs) {
  if (a->placement && placement_order(a, wf)) return 1;
  if (a->parallel_r != MOE_PARALLEL_OFF) {
    if (load_sharded(a, wf, l)) return 1;
  } else if (moe_layer_load(l, wf, &a->ov) != MOE_OK)
    return cli_fail(CMD);
  if (a->capacities && set_capacities(a, l)) return 1;
  l->cfg.a2a_auto = a->a2a_auto; /* read at each forward */
  int D = l->cfg.D, k = l->cfg.top_k;
  moe_tensor_view x, sc;
  if (get_f32(a, 0, xf, "x", 2, -1, D, &x)) return 1;
  int T = (int)x.shape[0];
  float daux = 0, dz = 0;
  const float *dspec_p = NULL;
  if (a->backward) {
    if (get_f32(a, 1, xf, "dy", 2, T, D, &sc)) return 1;
    if (moe_st_has(xf, "daux")) {
      if (get_f32(a, 2, xf, "daux", 1, 1, 0, &sc)) return 1;
      daux = a->in[2][0];
    }
    if (moe_st_has(xf, "dz")) {
      if (get_f32(a, 3, xf, "dz", 1, 1, 0, &sc)) return 1;
      dz = a->in[3][0];
    }
    if (moe_st_has(xf, "dspec")) {
      if (get_f32(a, 4, xf, "dspec", 2, (int64_t)T * k, D, &sc)) return 1;
      dspec_p = a->in[4];
    }
  }
  /* expert-parallel, rank r takes tokens [t0, t1) of x */
  int W = moe_dist_size(a->dist), r = moe_dist_rank(a->dist);
  int t0 = (int)((int64_t)T * r / W), t1 = (int)((int64_t)T * (r + 1) / W), Tl = t1 - t0;
  size_t td = (size_t)T * D, tl = (size_t)Tl * D, expert_max = 0;
  for (int i = 0; i < l->nparams; i++) expert_max = l->info[i].numel * (size_t)W > expert_max ? l->info[i].numel * (size_t)W : expert_max;
  /* this rank's outputs (yl, specl, dxl), gathered on rank 0 into (y, spec, dx): one process, the same */
  float *yl = bufs[0] = malloc(tl * (size_t)(k + 2) * 4 + 16);
  float *scratch = bufs[1] = malloc((2 * expert_max + (size_t)l->cfg.E) * 4 + 16);
  float *y = a->dist ? (bufs[2] = malloc(td * (size_t)(k + 2) * 4 + 16)) : yl;
  if (!yl || !scratch || !y) return cli_usage_error(CMD, "out of memory");
  float *spec = y + td, *dx = spec + td * k;
  float *specl = yl + tl, *dxl = specl + tl * k;
  moe_layer_stats s;
  if (moe_layer_forward(l, a->in[0] + (size_t)t0 * D, Tl, yl, a->spec ? specl : NULL, &s) != MOE_OK)
    return cli_fail(CMD);
  int64_t shp[2] = {T, D}, one = 1, E = l->cfg.E, spec_shape[2] = {(int64_t)T * k, D};
  int32_t dropped = s.dropped, capacity = s.capacity, *counts = (int32_t *)s.expert_counts;
  if (a->order) { /* the counts in the file's expert order */
    counts = (int32_t *)(scratch + 2 * expert_max);
    to_file_order(a, l->cfg.E, counts, s.expert_counts, sizeof *counts);
  }
  if (gather(a->dist, yl, tl, y) || (a->spec && gather(a->dist, specl, tl * k, spec))) return 1;
  int root = r == 0;
  if (root && (moe_st_writer_add_f32(w, "y", a->out_dt, 2, shp, y) ||
               moe_st_writer_add_f32(w, "aux_loss", a->out_dt, 1, &one, &s.aux_loss) ||
               moe_st_writer_add_f32(w, "z_loss", a->out_dt, 1, &one, &s.z_loss) ||
               moe_st_writer_add(w, "expert_counts", MOE_DT_I32, 1, &E, counts) ||
               moe_st_writer_add(w, "dropped", MOE_DT_I32, 1, &one, &dropped) ||
               moe_st_writer_add(w, "capacity", MOE_DT_I32, 1, &one, &capacity) ||
               (a->spec && moe_st_writer_add_f32(w, "spec", a->out_dt, 2, spec_shape, spec))))
    return cli_fail(CMD);
  if (a->backward) {
    moe_layer_zero_grad(l);
    const float *dyl = a->in[1] + (size_t)t0 * D;
    const float *dsl = dspec_p ? dspec_p + (size_t)t0 * k * D : NULL;
    if (moe_layer_backward(l, dyl, daux, dz, dsl, NULL, dxl) != MOE_OK) return cli_fail(CMD);
    if (gather(a->dist, dxl, tl, dx)) return 1;
    if (root && moe_st_writer_add_f32(w, "grad.x", a->out_dt, 2, shp, dx)) return cli_fail(CMD);
    if (add_grads(a, l, w, scratch)) return 1;
  }
  if (root && moe_st_writer_save(w, a->out) != MOE_OK) return cli_fail(CMD);
  return 0;
}

/* Tensor `name` of f's shape as a number (0 when absent) and as text "(d0, d1)": for agree(). */
static double shape_of(const moe_st *f, const char *name, char *text, size_t n) {
  moe_tensor_view v;
  if (moe_st_get(f, name, &v) != MOE_OK) return snprintf(text, n, "(absent)"), 0;
  int w = snprintf(text, n, "(");
  for (int d = 0; d < v.ndim && w < (int)n; d++) w += snprintf(text + w, n - w, "%s%lld", d ? ", " : "", (long long)v.shape[d]);
  if (w < (int)n) snprintf(text + w, n - w, ")");
  return cli_hash(v.shape, sizeof v.shape[0] * (size_t)v.ndim) + v.ndim;
}

/* Under mpirun every rank must run the same layer on the same shapes: its options and its files'
 * shapes and options against rank 0's (moe_dist_agree), before the first collective (the 2DH split). */
#define FILE_S "(the file's)"
static moe_status agree(const args_t *a, const moe_st *wf, const moe_st *xf) {
  const moe_layer_overrides *o = &a->ov;
  const char *caps = a->capacities ? a->capacities : "";
  moe_dist_setting s[40] = {
      {"--backward", a->backward, NULL}, {"--spec", a->spec, NULL}, {"--a2a", a->a2a + 2 * a->a2a_auto, a->a2a_auto ? "auto" : a->a2a ? "2dh" : "linear"},
      {"--ranks-per-node", a->ranks_per_node, NULL}, {"--placement", a->placement != NULL, a->placement},
      {"--expert-capacity", cli_hash(caps, strlen(caps)), caps}, {"--top_k", o->top_k, o->top_k < 0 ? FILE_S : NULL},
      {"--capacity_setting", o->capacity_setting, NULL}, {"--normalize_topk", o->normalize_topk, NULL},
      {"--activation", o->act, o->act < 0 ? FILE_S : moe_act_name(o->act)},
      {"--dispatch", o->dispatch, o->dispatch < 0 ? FILE_S : moe_dispatch_name(o->dispatch)},
      {"--priority", o->priority, o->priority < 0 ? FILE_S : moe_priority_name(o->priority)},
      {"--router", o->router, o->router < 0 ? FILE_S : moe_router_name(o->router)},
      {"--dtype", o->dtype, o->dtype < 0 ? FILE_S : moe_compute_dtype_name(o->dtype)},
      {"--pipeline", o->pipeline, NULL}, /* each micro-batch is an exchange: the counts must match */
      {"--parallel-r", a->parallel_r, NULL},
  };
  int n = 16;
  static const char *tensors[] = {"experts.fc1.weight", "experts.fc3.weight", "gate.weight", "gate.proj.weight",
                                  "x", "dy", "daux", "dz", "dspec"};
  static const char *meta[] = {"top_k", "capacity_setting", "normalize_topk", "activation", "dispatch",
                               "priority", "router", "dtype", "score", "n_group", "topk_group", "group_score",
                               "routed_scale", "swiglu_alpha", "swiglu_limit"};
  enum { NMETA = sizeof meta / sizeof meta[0] };
  char names[9 + NMETA][48], shapes[9][32];
  for (int i = 0; i < 9; i++, n++) {
    snprintf(names[i], sizeof names[i], "the shape of '%s'", tensors[i]);
    double v = shape_of(i < 4 ? wf : xf, tensors[i], shapes[i], sizeof shapes[i]);
    s[n] = (moe_dist_setting){names[i], v, shapes[i]};
  }
  for (int i = 0; i < NMETA; i++, n++) {
    const char *v = moe_st_meta(wf, meta[i]);
    snprintf(names[9 + i], sizeof names[9 + i], "the weights' __metadata__ %s", meta[i]);
    s[n] = (moe_dist_setting){names[9 + i], v ? cli_hash(v, strlen(v)) : -1, v ? v : "(none)"};
  }
  return moe_dist_agree(a->dist, s, n);
}
#undef FILE_S

int cmd_layer_run(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  moe_dist *dist = NULL;
  for (int i = 1; i < argc; i++) /* before parsing, so that its errors are held too (printed once) */
    if (cli_flag_is(argv[i], "expert_parallel")) {
      if (moe_dist_init(&dist, &argc, &argv) != MOE_OK) return cli_fail(CMD);
      cli_hold_errors(dist);
      break;
    }
  args_t a;
  int rc = parse_args(argc, argv, &a);
  a.dist = dist;
  a.ov.dist = dist;
  moe_st *wf = NULL, *xf = NULL;
  moe_st_writer *w = NULL;
  moe_layer_t l = {0};
  float *bufs[3] = {NULL, NULL, NULL};
  if (!rc && (moe_st_open(&wf, a.weights) != MOE_OK || moe_st_open(&xf, a.input) != MOE_OK ||
              moe_st_writer_new(&w) != MOE_OK))
    rc = cli_fail(CMD);
  rc = cli_settle(a.dist, CMD, rc);
  if (!rc && a.dist && agree(&a, wf, xf) != MOE_OK) rc = cli_fail(CMD); /* every rank knows: none is left waiting */
  rc = cli_settle(a.dist, CMD, rc);
  if (!rc && a.dist && moe_dist_set_a2a(a.dist, a.a2a, a.ranks_per_node) != MOE_OK)
    rc = cli_fail(CMD); /* other ranks may be inside the split: stopped by cli_dist_end */
  else if (!rc)
    rc = run(&a, wf, xf, &l, w, bufs);
  for (int i = 0; i < 3; i++) free(bufs[i]);
  for (int i = 0; i < 5; i++) free(a.in[i]);
  free(a.order);
  moe_layer_free(&l);
  moe_layer_free(&a.whole);
  moe_st_writer_free(w);
  moe_st_close(xf);
  moe_st_close(wf);
  return cli_dist_end(a.dist, CMD, rc); /* a failure not settled stops every rank */
}
