/* moe layer-run: one MoE layer from files (DESIGN 4.2). Reads the weights and options from W, x (and
 * dy, daux, dz, dspec for --backward) from X, and writes y, aux_loss, z_loss, expert_counts,
 * dropped, capacity (and spec with --spec, grad.* with --backward) to OUT atomically: on any error nothing
 * is written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *CMD = "layer-run";

static void usage(void) {
  fprintf(stderr,
          "usage: moe layer-run --weights W.safetensors --input X.safetensors --out OUT.safetensors\n"
          "                     [--backward] [--spec] [--top_k K] [--capacity_setting X]\n"
          "                     [--activation relu|gelu|silu|swiglu] [--normalize_topk true|false]\n"
          "                     [--dispatch dynamic|static] [--priority index|score]\n"
          "                     [--router linear|cosine] [--threads N]\n");
}

typedef struct {
  const char *weights, *input, *out;
  int backward, spec;
  moe_layer_overrides ov;
} args_t;

static int parse_args(int argc, char **argv, args_t *a) {
  memset(a, 0, sizeof *a);
  moe_layer_overrides_init(&a->ov);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (cli_flag_is(f, "backward")) { a->backward = 1; continue; }
    if (cli_flag_is(f, "spec")) { a->spec = 1; continue; }
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
    } else if (cli_flag_is(f, "activation")) {
      moe_act x; st = moe_act_parse(v, "--activation", &x); a->ov.act = (int)x;
    } else if (cli_flag_is(f, "dispatch")) {
      moe_dispatch x; st = moe_dispatch_parse(v, "--dispatch", &x); a->ov.dispatch = (int)x;
    } else if (cli_flag_is(f, "priority")) {
      moe_priority x; st = moe_priority_parse(v, "--priority", &x); a->ov.priority = (int)x;
    } else if (cli_flag_is(f, "router")) {
      moe_router x; st = moe_router_parse(v, "--router", &x); a->ov.router = (int)x;
    } else {
      usage();
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
    if (st != MOE_OK) return cli_fail(CMD);
  }
  if (!a->weights || !a->input || !a->out) {
    usage();
    return cli_usage_error(CMD, "--weights, --input and --out are required");
  }
  return 0;
}

/* An F32 tensor of X with exactly the given shape (rows may be -1: any), finite; or an error. */
static int get_f32(const moe_st *f, const char *name, int ndim, int64_t rows, int64_t cols,
                   moe_tensor_view *v) {
  if (moe_st_get(f, name, v) != MOE_OK) return cli_fail(CMD);
  const char *p = moe_st_path(f);
  if (v->dtype != MOE_DT_F32)
    return cli_usage_error(CMD, "%s: tensor '%s' has dtype %s, want F32", p, name, moe_dtype_name(v->dtype));
  int ok = v->ndim == ndim && (rows < 0 || v->shape[0] == rows) && (ndim < 2 || v->shape[1] == cols);
  if (!ok) {
    if (ndim == 1) return cli_usage_error(CMD, "%s: tensor '%s' must have shape (%lld)", p, name, (long long)rows);
    return cli_usage_error(CMD, "%s: tensor '%s' must have shape (%s, %lld), got %d dims%s", p, name,
                           rows < 0 ? "T" : "rows", (long long)cols, v->ndim,
                           v->ndim == 2 ? " with other sizes" : "");
  }
  const float *d = v->data;
  for (size_t i = 0; i < v->nbytes / 4; i++)
    if (!isfinite(d[i]))
      return cli_usage_error(CMD, "%s: tensor '%s' has a non-finite value (%g) at flat index %zu", p, name,
                             (double)d[i], i);
  return 0;
}

static int run(const args_t *a, moe_st *wf, moe_st *xf, moe_layer_t *l, moe_st_writer *w,
               float **bufs) {
  if (moe_layer_load(l, wf, &a->ov) != MOE_OK) return cli_fail(CMD);
  int D = l->cfg.D, k = l->cfg.top_k;
  moe_tensor_view x, dy, dspec, sc;
  if (get_f32(xf, "x", 2, -1, D, &x)) return 1;
  int T = (int)x.shape[0];
  float daux = 0, dz = 0;
  const float *dspec_p = NULL;
  if (a->backward) {
    if (get_f32(xf, "dy", 2, T, D, &dy)) return 1;
    if (moe_st_has(xf, "daux")) {
      if (get_f32(xf, "daux", 1, 1, 0, &sc)) return 1;
      daux = *(const float *)sc.data;
    }
    if (moe_st_has(xf, "dz")) {
      if (get_f32(xf, "dz", 1, 1, 0, &sc)) return 1;
      dz = *(const float *)sc.data;
    }
    if (moe_st_has(xf, "dspec")) {
      if (get_f32(xf, "dspec", 2, (int64_t)T * k, D, &dspec)) return 1;
      dspec_p = dspec.data;
    }
  }
  size_t td = (size_t)T * D;
  float *y = bufs[0] = malloc(td * 4 + 4);
  float *spec = bufs[1] = a->spec ? malloc(td * k * 4 + 4) : NULL;
  float *dx = bufs[2] = a->backward ? malloc(td * 4 + 4) : NULL;
  if (!y || (a->spec && !spec) || (a->backward && !dx)) return cli_usage_error(CMD, "out of memory");
  moe_layer_stats s;
  if (moe_layer_forward(l, x.data, T, y, spec, &s) != MOE_OK) return cli_fail(CMD);
  int64_t shp[2] = {T, D}, one = 1, E = l->cfg.E, spec_shape[2] = {(int64_t)T * k, D};
  int32_t dropped = s.dropped, capacity = s.capacity;
  if (moe_st_writer_add(w, "y", MOE_DT_F32, 2, shp, y) || moe_st_writer_add(w, "aux_loss", MOE_DT_F32, 1, &one, &s.aux_loss) ||
      moe_st_writer_add(w, "z_loss", MOE_DT_F32, 1, &one, &s.z_loss) ||
      moe_st_writer_add(w, "expert_counts", MOE_DT_I32, 1, &E, s.expert_counts) ||
      moe_st_writer_add(w, "dropped", MOE_DT_I32, 1, &one, &dropped) ||
      moe_st_writer_add(w, "capacity", MOE_DT_I32, 1, &one, &capacity) ||
      (spec && moe_st_writer_add(w, "spec", MOE_DT_F32, 2, spec_shape, spec)))
    return cli_fail(CMD);
  if (a->backward) {
    moe_layer_zero_grad(l);
    if (moe_layer_backward(l, dy.data, daux, dz, dspec_p, NULL, dx) != MOE_OK) return cli_fail(CMD);
    if (moe_st_writer_add(w, "grad.x", MOE_DT_F32, 2, shp, dx) || moe_layer_save_grads(l, w, "grad."))
      return cli_fail(CMD);
  }
  if (moe_st_writer_save(w, a->out) != MOE_OK) return cli_fail(CMD);
  return 0;
}

int cmd_layer_run(int argc, char **argv) {
  args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  moe_st *wf = NULL, *xf = NULL;
  moe_st_writer *w = NULL;
  moe_layer_t l = {0};
  float *bufs[3] = {NULL, NULL, NULL};
  if (moe_st_open(&wf, a.weights) != MOE_OK || moe_st_open(&xf, a.input) != MOE_OK ||
      moe_st_writer_new(&w) != MOE_OK)
    rc = cli_fail(CMD);
  else
    rc = run(&a, wf, xf, &l, w, bufs);
  for (int i = 0; i < 3; i++) free(bufs[i]);
  moe_layer_free(&l);
  moe_st_writer_free(w);
  moe_st_close(xf);
  moe_st_close(wf);
  return rc;
}
