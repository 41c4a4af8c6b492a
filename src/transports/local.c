/* The in-process transport: one process computes every expert, so the experts' groups are the
 * dispatch rows themselves and no token moves. */
#include "layer/plugins.h"

static moe_status local_begin(void *self, const moe__env *env, int T, size_t *route_bytes) {
  (void)self, (void)env, (void)T;
  *route_bytes = 0;
  return MOE_OK;
}

static moe_status local_view(void *self, const moe__env *env, const moe__plan *p, moe__view *v) {
  (void)self, (void)env, (void)p, (void)v; /* this process's tokens, as they are */
  return MOE_OK;
}

static moe_status local_groups(void *self, const moe__env *env, moe__plan *p) {
  (void)self;
  p->ng = env->l->cfg.E;
  p->grows = p->rows;
  p->goffs = p->offs;
  return MOE_OK;
}

static size_t local_work_bytes(void *self, const moe__env *env, const moe__plan *p) {
  (void)self, (void)env, (void)p;
  return 0;
}

static moe_status local_alloc(void *self, const moe__env *env, const moe__plan *p, moe__expert_bufs *b) {
  (void)self, (void)env, (void)p;
  *b = (moe__expert_bufs){0};
  return MOE_OK;
}

static moe_status local_send(void *self, const moe__env *env, const moe__plan *p, int way, int i, const float *from,
                             float *to) {
  (void)self, (void)env, (void)p, (void)way, (void)i, (void)from, (void)to; /* in place: `to` is `from` */
  return MOE_OK;
}

static moe_status local_recv(void *self, const moe__env *env, const moe__plan *p, int i, const float *from, float *to) {
  return local_send(self, env, p, 0, i, from, to);
}

const moe__transport moe__transport_local = {"local",     1,          NULL,        NULL,       local_begin,
                                             local_view,  local_groups, local_work_bytes, local_alloc, local_send,
                                             local_recv,  NULL,       NULL,        NULL,       NULL,
                                             NULL};
