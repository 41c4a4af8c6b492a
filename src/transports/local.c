/* The in-process transport: one process computes every expert, so the experts' groups are the
 * dispatch rows themselves and no token moves. */
#include "layer/layer_internal.h"

static moe_status local_begin(moe_layer_t *l, int T, size_t *route_bytes) {
  (void)l, (void)T;
  *route_bytes = 0;
  return MOE_OK;
}

static moe_status local_view(moe_layer_t *l, moe__view *v) { /* this process's tokens, as they are */
  (void)l, (void)v;
  return MOE_OK;
}

static moe_status local_groups(moe_layer_t *l) {
  moe__plan *p = &l->st->p;
  p->ng = l->cfg.E;
  p->grows = p->rows;
  p->goffs = p->offs;
  return MOE_OK;
}

static size_t local_work_bytes(const moe_layer_t *l) {
  (void)l;
  return 0;
}

static moe_status local_alloc(moe_layer_t *l) {
  l->st->gx = l->st->gout = l->st->gdx = l->st->xr = NULL;
  return MOE_OK;
}

static moe_status local_send(moe_layer_t *l, int way, int i, const float *from, float *to) {
  (void)l, (void)way, (void)i, (void)from, (void)to; /* in place: `to` is `from` */
  return MOE_OK;
}

static moe_status local_recv(moe_layer_t *l, int i, const float *from, float *to) {
  return local_send(l, 0, i, from, to);
}

const moe__transport moe__transport_local = {"local",          1,           local_begin, local_view, local_groups,
                                             local_work_bytes, local_alloc, local_send,  local_recv, NULL, NULL};
