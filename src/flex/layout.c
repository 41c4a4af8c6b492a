/* The replica placement of a model's blocks as text: checkpoints keep it (DESIGN 3.4), so that a run
 * resumed on as many ranks with as many slots continues with the placement it had; with another
 * number of ranks the experts start again from expert parallelism's blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flex/wire.h"

moe_status moe_flex_layout_write(const moe_model_t *m, char *buf, size_t n) {
  MOE_TRY(m->cfg.blocks > 0 && moe__flex_of(&m->layers[0]), MOE_ERR_ARG, "replicas: the model's layers have no "
          "replica slots (replica_slots 0), so no placement");
  const moe__flex_table *t0 = &moe__flex_of(&m->layers[0])->t;
  size_t at = (size_t)snprintf(buf, n, "%dx%d:", t0->W, t0->Ev);
  for (int b = 0; b < m->cfg.blocks && at < n; b++) {
    const moe__flex_table *t = &moe__flex_of(&m->layers[b])->t;
    for (int i = 0; i < t->W * t->Ev && at < n; i++)
      at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? "," : b ? "/" : "", t->slot[i]);
  }
  MOE_TRY(at < n, MOE_ERR_ARG, "replicas: the placement of %d blocks (%d ranks x %d slots) does not fit in %zu "
          "characters of the checkpoint's metadata", m->cfg.blocks, t0->W, t0->Ev, n);
  return MOE_OK;
}

moe_status moe__flex_layout_read(moe_model_t *m, const char *s, const char *what) {
  moe__flex_table *t0 = &moe__flex_of(&m->layers[0])->t;
  int W = 0, Ev = 0, at = 0;
  MOE_TRY(sscanf(s, "%dx%d:%n", &W, &Ev, &at) == 2 && at > 0, MOE_ERR_FORMAT,
          "%s: replica placement '%.40s' does not start with WxE_v:", what, s);
  if (W != t0->W || Ev != t0->Ev) return MOE_OK;
  int *slots = malloc(sizeof *slots * (size_t)W * Ev);
  MOE_TRY(slots, MOE_ERR_NOMEM, "%s: replica placement of %d x %d slots", what, W, Ev);
  const char *p = s + at;
  moe_status st = MOE_OK;
  for (int b = 0; st == MOE_OK && b < m->cfg.blocks; b++) {
    for (int i = 0; st == MOE_OK && i < W * Ev; i++) {
      char *end;
      long v = strtol(p, &end, 10);
      char want = i + 1 < W * Ev ? ',' : b + 1 < m->cfg.blocks ? '/' : 0;
      if (end == p || *end != want || v < -1 || v >= t0->E)
        st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: replica placement of block %d, slot %d: bad "
                        "entry at '%.20s' (want an expert in [-1, %d) then '%c')", what, b, i, p, t0->E,
                        want ? want : ' ');
      slots[i] = (int)v;
      p = end + (want != 0);
    }
    moe__flex_layer *f = moe__flex_of(&m->layers[b]);
    if (st == MOE_OK) moe__flex_table_set_slots(&f->t, slots);
    if (st == MOE_OK && (st = moe__flex_table_check(&f->t)) != MOE_OK) {
      char why[256];
      snprintf(why, sizeof why, "%s", moe_last_error());
      st = moe__error(MOE_ERR_FORMAT, __FILE__, __LINE__, "%s: replica placement of block %d: %s", what, b, why);
    }
    if (st == MOE_OK) moe__flex_layer_sync_held(f);
  }
  free(slots);
  return st;
}
