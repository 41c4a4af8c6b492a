/* Checking the language model against the PyTorch references of dev/mixtral_ref.py and
 * dev/lm_families_ref.py and dev/deepseek_ref.py (tests/fixtures/lm/<case>/), and fixtures changed for
 * error tests: lm_check.h. */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lm_check.h"
#include "test.h"

/* Max |a - b| over n values, and where. */
double lm_max_err(const float *a, const float *b, size_t n, size_t *at) {
  double worst = 0;
  *at = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= worst)) worst = d, *at = i;
  }
  return worst;
}

/* The fixture case's directory. */
const char *lm_case_dir(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/lm/%s", test_fixture_dir(), name);
  return buf;
}

/* Loads the case, runs forward and backward and compares everything with ref.safetensors; returns 0
 * (after printing) on a mismatch. */
int lm_check_case(const char *name) { return lm_check_case_config(name, NULL); }

int lm_check_case_config(const char *name, const moe_lm_config *c) {
  char dir[512], path[600];
  moe_lm_t m;
  moe_st *ref = NULL;
  int ok = 0;
  if (moe_lm_load(&m, lm_case_dir(name, dir, sizeof dir), c) != MOE_OK) {
    fprintf(stderr, "  %s: load: %s\n", name, moe_last_error());
    return 0;
  }
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  moe_tensor_view tok, tgt, logits;
  float loss, ce, aux;
  moe_lm_stats st;
  if (moe_st_open(&ref, path) || moe_st_get(ref, "tokens", &tok) || moe_st_get(ref, "targets", &tgt) ||
      moe_st_get(ref, "logits", &logits) || moe_st_get_f32(ref, "loss", &loss, 1) ||
      moe_st_get_f32(ref, "ce", &ce, 1) || moe_st_get_f32(ref, "aux", &aux, 1)) {
    fprintf(stderr, "  %s: %s\n", name, moe_last_error());
    goto done;
  }
  int B = (int)tok.shape[0], T = (int)tok.shape[1];
  moe_lm_zero_grad(&m);
  if (moe_lm_forward(&m, tok.data, tgt.data, B, T, &st)) {
    fprintf(stderr, "  %s: forward: %s\n", name, moe_last_error());
    goto done;
  }
  size_t at, nl = logits.nbytes / 4;
  double e = lm_max_err(moe_lm_logits(&m), logits.data, nl, &at);
  fprintf(stderr, "  %s: logits max err %.3g; loss %.7f vs %.7f, ce %.7f vs %.7f, aux %.7f vs %.7f\n", name, e,
          st.loss, loss, st.ce, ce, st.aux, aux);
  if (e > LM_TOL || fabs(st.loss - loss) > LM_TOL || fabs(st.ce - ce) > LM_TOL || fabs(st.aux - aux) > LM_TOL) {
    fprintf(stderr, "  %s: logits or losses differ (logit %zu: %g vs %g)\n", name, at, moe_lm_logits(&m)[at],
            ((const float *)logits.data)[at]);
    goto done;
  }
  if (moe_lm_backward(&m)) {
    fprintf(stderr, "  %s: backward: %s\n", name, moe_last_error());
    goto done;
  }
  double worst = 0;
  const char *wname = "";
  for (int i = 0; i < m.nrefs; i++) {
    const moe_tensor_ref *r = &m.refs[i];
    char gname[80];
    snprintf(gname, sizeof gname, "grad.%s", r->name);
    float *want = malloc(r->numel * 4);
    if (!want || moe_st_get_f32(ref, gname, want, r->numel)) {
      fprintf(stderr, "  %s: %s\n", name, moe_last_error());
      free(want);
      goto done;
    }
    double ge = lm_max_err(r->grad, want, r->numel, &at);
    if (ge > LM_TOL) fprintf(stderr, "  %s: %s[%zu] = %g, want %g\n", name, gname, at, r->grad[at], want[at]);
    if (ge > worst || i == 0) worst = ge, wname = r->name;
    free(want);
  }
  fprintf(stderr, "  %s: %d gradients, max err %.3g (%s)\n", name, m.nrefs, worst, wname);
  ok = worst <= LM_TOL;
done:
  moe_st_close(ref);
  moe_lm_free(&m);
  return ok;
}

/* The fixture's tokens (B, T), malloc'd. */
int32_t *lm_fixture_tokens(const char *dir, int *B, int *T) {
  char path[700];
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  moe_st *f = NULL;
  moe_tensor_view v;
  int32_t *out = NULL;
  if (moe_st_open(&f, path) == MOE_OK && moe_st_get(f, "tokens", &v) == MOE_OK && (out = malloc(v.nbytes))) {
    memcpy(out, v.data, v.nbytes);
    *B = (int)v.shape[0], *T = (int)v.shape[1];
  }
  moe_st_close(f);
  return out;
}

/* The fixture of `family` with config.json's `field` set to the JSON `value` (NULL: removed) and its
 * weights linked, in dir; with `drop`, the weights written again without that tensor. */
int lm_patched(const char *family, const char *field, const char *value, const char *drop, char *dir, size_t n) {
  static int made;
  char src[700], dst[700], name[96], fx[512];
  snprintf(name, sizeof name, "lm_fam_patched_%d", made++);
  test_tmp_path(name, dir, n);
  lm_case_dir(family, fx, sizeof fx);
  snprintf(src, sizeof src, "%s/config.json", fx);
  char *text = test_read_file(src, NULL);
  cJSON *c = text ? cJSON_Parse(text) : NULL, *v = value ? cJSON_Parse(value) : NULL;
  free(text);
  cJSON_DeleteItemFromObjectCaseSensitive(c, field);
  int ok = c && (!value || v) && mkdir(dir, 0755) == 0 && (!v || cJSON_AddItemToObject(c, field, v));
  if (!ok) cJSON_Delete(v);
  char *out = ok ? cJSON_Print(c) : NULL;
  cJSON_Delete(c);
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  ok = out && moe_write_file_atomic(dst, out, strlen(out)) == MOE_OK;
  free(out);
  snprintf(src, sizeof src, "%s/model.safetensors", fx);
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  if (!drop) return ok && symlink(src, dst) == 0;
  moe_st *f = NULL;
  moe_st_writer *w = NULL;
  ok = ok && moe_st_open(&f, src) == MOE_OK && moe_st_writer_new(&w) == MOE_OK;
  for (int i = 0; ok && i < moe_st_count(f); i++) {
    moe_tensor_view t;
    ok = moe_st_at(f, i, &t) == MOE_OK;
    if (ok && strcmp(t.name, drop)) ok = moe_st_writer_add(w, t.name, t.dtype, t.ndim, t.shape, t.data) == MOE_OK;
  }
  ok = ok && moe_st_writer_save(w, dst) == MOE_OK;
  moe_st_writer_free(w);
  moe_st_close(f);
  return ok;
}

float *lm_logits(moe_lm_t *m, const int32_t *t, int B, int T) {
  size_t n = (size_t)B * T * m->cfg.vocab;
  float *out = malloc(n * 4);
  if (!out || moe_lm_forward(m, t, NULL, B, T, NULL)) {
    fprintf(stderr, "  forward: %s\n", out ? moe_last_error() : "out of memory");
    return free(out), NULL;
  }
  return memcpy(out, moe_lm_logits(m), n * 4);
}

int lm_same_tensors(const char *what, const moe_lm_t *a, const moe_lm_t *b) {
  if (b->nrefs != a->nrefs) return fprintf(stderr, "  %s: %d parameters, want %d\n", what, b->nrefs, a->nrefs), 0;
  for (int i = 0; i < a->nrefs; i++) {
    const moe_tensor_ref *r = &a->refs[i], *s = moe_lm_find(b, r->name);
    if (!s || s->numel != r->numel || memcmp(s->data, r->data, r->numel * 4))
      return fprintf(stderr, "  %s: tensor '%s' differs\n", what, r->name), 0;
  }
  return 1;
}

int lm_check_save_load(const char *name, char *dir, size_t n) {
  char src[512], tmp[64];
  lm_case_dir(name, src, sizeof src);
  snprintf(tmp, sizeof tmp, "lm_saved_%s", name);
  test_tmp_path(tmp, dir, n);
  int B, T, ok = 0;
  int32_t *t = lm_fixture_tokens(src, &B, &T);
  moe_lm_t m, r;
  if (!t || moe_lm_load(&m, src, NULL)) return fprintf(stderr, "  %s: %s\n", name, moe_last_error()), free(t), 0;
  if (moe_lm_save(&m, dir) || moe_lm_load(&r, dir, NULL)) {
    fprintf(stderr, "  %s: save and load: %s\n", name, moe_last_error());
    moe_lm_free(&m);
    return free(t), 0;
  }
  float *a = lm_logits(&m, t, B, T), *b = lm_logits(&r, t, B, T);
  if (memcmp(&m.cfg, &r.cfg, sizeof m.cfg)) fprintf(stderr, "  %s: the saved config.json reads back as another config\n", name);
  else if (r.nrefs != m.nrefs) fprintf(stderr, "  %s: %d parameters saved, %d loaded\n", name, m.nrefs, r.nrefs);
  else if (!a || !b || memcmp(a, b, (size_t)B * T * m.cfg.vocab * 4)) fprintf(stderr, "  %s: the saved checkpoint's logits differ\n", name);
  else {
    ok = 1;
    for (int i = 0; ok && i < m.nrefs; i++)
      if (strcmp(m.refs[i].name, r.refs[i].name))
        ok = 0, fprintf(stderr, "  %s: parameter %d is %s, saved and loaded %s\n", name, i, m.refs[i].name, r.refs[i].name);
  }
  free(a), free(b), free(t);
  moe_lm_free(&m);
  moe_lm_free(&r);
  return ok;
}

int lm_check_train_from_checkpoint(const char *name, int threads, const char *keep) {
  char src[512], dir[512], tmp[64];
  lm_case_dir(name, src, sizeof src);
  int B, T;
  int32_t *t = lm_fixture_tokens(src, &B, &T);
  moe_lm_t m;
  if (!t || moe_lm_load(&m, src, NULL)) return fprintf(stderr, "  %s: %s\n", name, moe_last_error()), free(t), 0;
  if (threads) moe_lm_set_threads(&m, threads);
  const moe_tensor_ref *k = keep ? moe_lm_find(&m, keep) : NULL;
  float k0 = k ? k->data[0] : 0;
  double first = 0, last = 0;
  for (int step = 0; step <= 12; step++) {
    moe_lm_stats st;
    moe_lm_zero_grad(&m);
    moe_status s = moe_lm_forward(&m, t, t + 1, 1, B * T - 1, &st); /* the tokens as one sequence */
    if (s == MOE_OK && step < 12) s = moe_lm_backward(&m);
    if (s) {
      fprintf(stderr, "  %s step %d: %s\n", name, step, moe_last_error());
      moe_lm_free(&m);
      return free(t), 0;
    }
    if (step == 0) first = st.loss;
    last = st.loss;
    for (int i = 0; step < 12 && i < m.nrefs; i++)
      for (size_t j = 0; j < m.refs[i].numel; j++) m.refs[i].data[j] -= 0.2f * m.refs[i].grad[j];
    moe_lm_params_changed(&m);
  }
  int kept = !k || k->data[0] == k0;
  snprintf(tmp, sizeof tmp, "lm_trained_%s", name);
  moe_status s = moe_lm_save(&m, test_tmp_path(tmp, dir, sizeof dir));
  moe_lm_free(&m);
  moe_lm_stats again = {0};
  if (s == MOE_OK && (s = moe_lm_load(&m, dir, NULL)) == MOE_OK) {
    s = moe_lm_forward(&m, t, t + 1, 1, B * T - 1, &again);
    moe_lm_free(&m);
  }
  free(t);
  if (s) return fprintf(stderr, "  %s: trained, saved and loaded: %s\n", name, moe_last_error()), 0;
  fprintf(stderr, "  %s: loss %.4f -> %.4f after 12 SGD steps, %.4f reloaded\n", name, first, last, again.loss);
  if (!kept) fprintf(stderr, "  %s: %s changed in training\n", name, keep);
  return kept && last < 0.8 * first && fabs(again.loss - last) <= 1e-6;
}

/* Whether the config read from a file is the model's in everything it computes; prints what differs. */
int lm_same_config(const char *what, const moe_lm_config *a, const moe_lm_config *b) {
  const moe_layer_config *x = &a->moe, *y = &b->moe;
  int dense = 0;
  for (int i = 0; i < a->n_layers; i++) dense |= moe_lm_layer_dense(a, i);
  const struct { const char *field; int same; } f[] = {
      {"family", a->family == b->family},
      {"sizes", a->vocab == b->vocab && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
                    a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->max_seq == b->max_seq},
      {"rope_theta, rms_eps", a->rope_theta == b->rope_theta && a->rms_eps == b->rms_eps},
      {"tie_embeddings", a->tie_embeddings == b->tie_embeddings},
      {"moe sizes", x->D == y->D && x->H == y->H && x->E == y->E && x->top_k == y->top_k},
      {"shared experts", x->shared_H == y->shared_H && x->shared_gate == y->shared_gate},
      {"dense layers", !memcmp(a->dense_layers, b->dense_layers, sizeof a->dense_layers) &&
                           (!dense || a->dense_H == b->dense_H)},
      {"mla", !memcmp(&a->mla, &b->mla, sizeof a->mla)},
      {"yarn", a->yarn.factor == b->yarn.factor && (a->yarn.factor == 0 || !memcmp(&a->yarn, &b->yarn, sizeof a->yarn))},
      {"score", x->score == y->score},
      {"select_bias", x->select_bias == y->select_bias},
      {"normalize_topk", x->normalize_topk == y->normalize_topk},
      {"routed_scale", x->routed_scale == y->routed_scale},
      {"n_group", x->n_group == y->n_group},
      {"biases, sinks", a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias && a->attn_sinks == b->attn_sinks &&
                            x->gate_bias == y->gate_bias && x->expert_bias == y->expert_bias},
      {"activation", x->act == y->act && x->swiglu_alpha == y->swiglu_alpha && x->swiglu_limit == y->swiglu_limit},
      {"sliding window", a->sliding_window == b->sliding_window &&
                             (!a->sliding_window || !memcmp(a->full_layers, b->full_layers, sizeof a->full_layers))},
  };
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    if (!f[i].same) return fprintf(stderr, "  %s: the file's %s differs from the model's\n", what, f[i].field), 0;
  return 1;
}

/* Whether a and b give the same logits on the fixture's tokens, bit for bit; prints how many differ. */
int lm_same_logits(const char *what, const char *fixture, moe_lm_t *a, moe_lm_t *b) {
  char dir[512];
  int B, T;
  int32_t *t = lm_fixture_tokens(lm_case_dir(fixture, dir, sizeof dir), &B, &T);
  float *x = t ? lm_logits(a, t, B, T) : NULL, *y = t ? lm_logits(b, t, B, T) : NULL;
  size_t n = (size_t)B * T * a->cfg.vocab, diff = 0;
  for (size_t i = 0; x && y && i < n; i++) diff += x[i] != y[i];
  if (diff) fprintf(stderr, "  %s: %zu of %zu logits differ\n", what, diff, n);
  int ok = x && y && !diff;
  free(t), free(x), free(y);
  return ok;
}

/* m saved to a new path is MOE_ERR_ARG whose message names `setting`, and no file is left there. */
int lm_gguf_refused(const moe_lm_t *m, const char *setting) {
  char path[512];
  test_tmp_path("refused.gguf", path, sizeof path);
  moe_status st = moe_lm_save_gguf(m, path, NULL);
  const char *e = moe_last_error();
  int ok = st == MOE_ERR_ARG && strstr(e, setting) && access(path, F_OK) != 0;
  if (!ok) fprintf(stderr, "  saving with %s: status %d, \"%s\"\n", setting, (int)st, st ? e : "");
  return ok;
}

/* src copied to dst with tensor `drop` left out, tensor `shrink` one row shorter, key `key` set to the
 * string `value` ("f32:<number>": that float; NULL: the key left out) (drop, shrink, key NULL:
 * unchanged). */
moe_status lm_gguf_rewrite(const char *src, const char *dst, const char *drop, const char *shrink, const char *key,
                          const char *value) {
  moe_gguf *g;
  moe_gguf_writer *w = NULL;
  moe_status st = moe_gguf_open(&g, src);
  if (st != MOE_OK) return st;
  st = moe_gguf_writer_new(&w);
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_kv_count(g); i++) {
    moe_gguf_kv kv;
    st = moe_gguf_kv_at(g, i, &kv);
    if (st == MOE_OK && !(key && !value && !strcmp(kv.key, key))) st = moe_gguf_writer_copy_kv(w, g, i);
  }
  if (st == MOE_OK && key && value)
    st = !strncmp(value, "f32:", 4) ? moe_gguf_writer_set_f32(w, key, strtof(value + 4, NULL))
                                    : moe_gguf_writer_set_str(w, key, value);
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    st = moe_gguf_tensor_at(g, i, &t);
    if (st != MOE_OK || (drop && !strcmp(t.name, drop))) continue;
    int cut = shrink && !strcmp(t.name, shrink);
    if (cut) t.nbytes -= t.nbytes / (size_t)t.ne[1], t.ne[1]--; /* a row of every matrix of the stack */
    st = moe_gguf_writer_add_tensor(w, t.name, t.type, t.ndim, t.ne, t.data, t.nbytes);
  }
  if (st == MOE_OK) st = moe_gguf_writer_save(w, dst);
  moe_gguf_writer_free(w);
  moe_gguf_close(g);
  return st;
}

/* Whether the last error names every one of the strings. */
int lm_error_names(const char *a, const char *b, const char *c) {
  const char *e = moe_last_error();
  int ok = strstr(e, a) && (!b || strstr(e, b)) && (!c || strstr(e, c));
  if (!ok) fprintf(stderr, "  error \"%s\" does not name %s %s %s\n", e, a, b ? b : "", c ? c : "");
  return ok;
}

int lm_load_edited(const char *name, void (*edit)(moe_lm_config *c, int e), int e, moe_lm_t *m) {
  char dir[512];
  moe_lm_config c;
  lm_case_dir(name, dir, sizeof dir);
  if (moe_lm_read_config(dir, &c) != MOE_OK) return fprintf(stderr, "  %s: %s\n", name, moe_last_error()), 0;
  edit(&c, e);
  if (moe_lm_load(m, dir, &c) != MOE_OK) return fprintf(stderr, "  %s: %s\n", name, moe_last_error()), 0;
  return 1;
}

int lm_gguf_u32_is(const moe_gguf *g, const char *key, uint32_t want) {
  int64_t k = moe_gguf_find_key(g, key);
  moe_gguf_kv kv;
  uint32_t v = 0;
  int ok = k >= 0 && moe_gguf_kv_at(g, k, &kv) == MOE_OK && kv.type == MOE_GGUFV_U32 &&
           moe_gguf_get_u32(g, key, &v) == MOE_OK && v == want;
  if (!ok) fprintf(stderr, "  key %s: %s, want u32 %u\n", key, k < 0 ? "absent" : "another type or value", want);
  return ok;
}

int lm_gguf_tensor_is(const moe_gguf *g, const char *name, const char *ne, moe_gguf_type type) {
  int64_t want[3] = {1, 1, 1};
  moe_gguf_tensor t;
  sscanf(ne, "%" SCNd64 " %" SCNd64 " %" SCNd64, &want[0], &want[1], &want[2]);
  int ok = moe_gguf_tensor_get(g, name, &t) == MOE_OK && t.ne[0] == want[0] && t.ne[1] == want[1] &&
           t.ne[2] == want[2] && t.type == type;
  if (!ok) fprintf(stderr, "  tensor %s: not %s [%s] (%s)\n", name, moe_gguf_type_name(type), ne, moe_last_error());
  return ok;
}

/* Prints what failed (a step's error, or nothing when a check printed) and gives 0. */
static int round_trip_failed(const char *name, const char *step, moe_status st) {
  if (st != MOE_OK) fprintf(stderr, "  %s: %s: %s\n", name, step, moe_last_error());
  return 0;
}

int lm_gguf_round_trip(const char *name, moe_lm_t *hf, const char *gguf) {
  char back[512], tmp[96];
  moe_lm_t g, h2;
  moe_lm_config c;
  moe_status st;
  if ((st = moe_lm_save_gguf(hf, gguf, NULL)) || (st = moe_lm_read_config(gguf, &c)))
    return round_trip_failed(name, "saved as GGUF and its config read", st);
  if (!lm_same_config(name, &hf->cfg, &c)) return 0;
  if ((st = moe_lm_load(&g, gguf, NULL))) return round_trip_failed(name, "loaded from GGUF", st);
  int ok = g.numel == hf->numel && lm_same_logits(name, name, hf, &g);
  snprintf(tmp, sizeof tmp, "%s_back", name);
  test_tmp_path(tmp, back, sizeof back);
  if (ok && ((st = moe_lm_save(&g, back)) || (st = moe_lm_load(&h2, back, NULL))))
    ok = round_trip_failed(name, "saved and loaded as a checkpoint directory", st);
  else if (ok) {
    ok = lm_same_tensors(name, hf, &h2) && lm_same_config(name, &hf->cfg, &h2.cfg); /* after HF -> GGUF -> HF */
    moe_lm_free(&h2);
  }
  if (ok) fprintf(stderr, "  %s: logits equal, %d tensors back\n", name, hf->nrefs);
  moe_lm_free(&g);
  return ok;
}

int lm_copy_fixture(const char *family, const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s/lm/%s/config.json' '%s/lm/%s/model.safetensors' '%s'",
           dir, dir, test_fixture_dir(), family, test_fixture_dir(), family, dir);
  return system(cmd) == 0;
}

const char *lm_shard_path(const char *dir, int k, int n, char *buf, size_t size) {
  snprintf(buf, size, "%s/model-%05d-of-%05d.safetensors", dir, k, n);
  return buf;
}

int lm_shard_checkpoint(const char *src, const char *dir, int n) {
  char cmd[2048], path[1024];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s/config.json' '%s'", dir, dir, src, dir);
  snprintf(path, sizeof path, "%s/model.safetensors", src);
  moe_st *f = NULL;
  moe_st_writer *w[8] = {0};
  cJSON *index = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(index, "weight_map");
  int ok = n >= 1 && n <= 8 && system(cmd) == 0 && moe_st_open(&f, path) == MOE_OK && map;
  for (int k = 0; ok && k < n; k++) ok = moe_st_writer_new(&w[k]) == MOE_OK;
  for (int i = 0; ok && i < moe_st_count(f); i++) {
    moe_tensor_view v;
    ok = moe_st_at(f, i, &v) == MOE_OK && moe_st_writer_add(w[i % n], v.name, v.dtype, v.ndim, v.shape, v.data) == MOE_OK &&
         cJSON_AddStringToObject(map, v.name, strrchr(lm_shard_path(dir, i % n + 1, n, path, sizeof path), '/') + 1);
  }
  for (int k = 0; ok && k < n; k++) ok = moe_st_writer_save(w[k], lm_shard_path(dir, k + 1, n, path, sizeof path)) == MOE_OK;
  char *text = ok ? cJSON_Print(index) : NULL;
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  FILE *out = text ? fopen(path, "w") : NULL;
  ok = out && fputs(text, out) >= 0;
  if (out) ok &= fclose(out) == 0;
  for (int k = 0; k < n; k++) moe_st_writer_free(w[k]);
  moe_st_close(f);
  cJSON_Delete(index);
  free(text);
  return ok;
}

long long lm_st_offset(const char *dir, const char *name, size_t *nbytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  moe_st *f;
  if (moe_st_open_lazy(&f, path)) return -1;
  moe_tensor_view v;
  long long off = moe_st_get(f, name, &v) ? -1 : (long long)v.file_offset;
  *nbytes = v.nbytes;
  moe_st_close(f);
  return off;
}

long long lm_st_poison(const char *dir, const char *name, long long at, size_t *nb) {
  char path[1024];
  long long off = lm_st_offset(dir, name, nb);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int fd = off > 0 ? open(path, O_WRONLY) : -1;
  const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f}; /* little-endian */
  int ok = fd >= 0 && pwrite(fd, nan, 4, off + at) == 4;
  if (fd >= 0) close(fd);
  return ok ? off : -1;
}

long long lm_status_kib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, strlen(key))) v = atoll(line + strlen(key));
  if (f) fclose(f);
  return v;
}

long long lm_peak_reset_kib(void) {
  FILE *cr = fopen("/proc/self/clear_refs", "w");
  if (!cr || fputs("5", cr) < 0 || fclose(cr) != 0) return -1;
  return lm_status_kib("VmHWM:") < 0 ? -1 : lm_status_kib("VmRSS:");
}
