/* Checking the language model against the PyTorch references of dev/mixtral_ref.py and
 * dev/lm_families_ref.py and dev/deepseek_ref.py (tests/fixtures/lm/<case>/), and fixtures changed for
 * error tests: lm_check.h. */
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
