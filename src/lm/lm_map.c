/* Loading by mapping the checkpoint: see lm_map.h and DESIGN 4.8c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_map.h"
#include "internal.h"
#include "lm_map.h"

static int mapping = -1; /* -1: as the environment and the machine say */
void moe__lm_set_mapping(int on) { mapping = on; }

int moe__lm_map_choice(const char *env, uint64_t bytes, uint64_t avail) {
  if (env && !strcmp(env, "1")) return 0;
  if (env && !strcmp(env, "0")) return 1;
  return !avail || bytes > avail / 2;
}

/* MemAvailable in /proc/meminfo, in bytes; 0 when it cannot be read. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  return (uint64_t)kb * 1024;
}

int moe__lm_mapping(uint64_t bytes) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return mapping >= 0 ? mapping : moe__lm_map_choice(getenv("MOE_NO_MMAP"), bytes, mem_available());
#else
  (void)bytes;
  return 0; /* the files' F32 is little-endian: only on such a machine are its bytes the floats */
#endif
}

/* The buffer ref r lies in (0: m->dense, 1 + i: layer i's parameters) and its byte offset there. */
static int buffer_of(const moe_lm_t *m, const moe_tensor_ref *r, size_t *at) {
  if (r->data >= m->dense && r->data < m->dense + moe__lm_dense_floats(m)) {
    *at = (size_t)(r->data - m->dense) * 4;
    return 0;
  }
  for (int i = 0; i < m->cfg.n_layers; i++) {
    const moe_layer_t *l = &m->layers[i];
    if (l->params && r->data >= l->params && r->data < l->params + l->numel) {
      *at = (size_t)(r->data - l->params) * 4;
      return 1 + i;
    }
  }
  return -1;
}

/* Per buffer, the place in a page of its first byte that lines up the most bytes of its items (a
 * multiple of 4: the floats' alignment, all the kernels ask of a weight; an item whose file offset
 * is not one is read). */
#define CANDIDATES 8
static moe_status choose_phases(const moe_lm_t *m, const moe__lm_map_item *x, int n, size_t *phase) {
  int nb = 1 + m->cfg.n_layers;
  size_t pg = moe__map_page(), (*cand)[CANDIDATES][2] = calloc((size_t)nb, sizeof *cand);
  MOE_TRY(cand, MOE_ERR_NOMEM, "moe_lm_load: out of memory");
  memset(phase, 0, (size_t)nb * sizeof *phase);
  for (int k = 0; k < n; k++) {
    const moe_tensor_ref *r = &m->refs[x[k].ref];
    size_t at;
    int b = buffer_of(m, r, &at);
    if (b < 0 || x[k].off % 4) continue;
    size_t p = (size_t)((x[k].off - at) % pg), j = 0; /* unsigned wrap: still the offset mod pg */
    while (j < CANDIDATES && cand[b][j][1] && cand[b][j][0] != p) j++;
    if (j == CANDIDATES) continue;
    cand[b][j][0] = p, cand[b][j][1] += r->numel * 4;
  }
  for (int b = 0; b < nb; b++)
    for (size_t j = 0, best = 0; j < CANDIDATES; j++)
      if (cand[b][j][1] > best) best = cand[b][j][1], phase[b] = cand[b][j][0];
  free(cand);
  return MOE_OK;
}

static int by_file(const void *a, const void *b) {
  const moe__lm_map_item *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

moe_status moe__lm_map_items(moe_lm_t *m, moe__lm_map_item *x, int n, const int *fds, const char *const *paths) {
  if (!n) return MOE_OK; /* nothing to map: the buffers stay as moe_lm_init made them */
  size_t *phase = malloc((1 + (size_t)m->cfg.n_layers) * sizeof *phase), total = 0;
  MOE_TRY(phase, MOE_ERR_NOMEM, "%s: out of memory", paths[0]);
  moe_status st = choose_phases(m, x, n, phase);
  if (st == MOE_OK) st = moe__lm_place(m, phase);
  free(phase);
  MOE_CHECK(st);
  qsort(x, (size_t)n, sizeof *x, by_file);
  for (int k = 0; k < n;) {
    const moe_tensor_ref *r = &m->refs[x[k].ref];
    char *dst = (char *)r->data;
    size_t len = r->numel * 4;
    int j = k + 1;
    for (; j < n && x[j].file == x[k].file && x[j].off == x[k].off + len && (char *)m->refs[x[j].ref].data == dst + len; j++)
      len += m->refs[x[j].ref].numel * 4;
    size_t got;
    char what[160];
    if (j == k + 1) snprintf(what, sizeof what, "tensor '%s'", r->name);
    else snprintf(what, sizeof what, "tensors '%s' to '%s'", r->name, m->refs[x[j - 1].ref].name);
    MOE_CHECK(moe__map_into(fds[x[k].file], paths[x[k].file], what, x[k].off, dst, len, &got));
    total += got;
    k = j;
  }
  moe__lm_add_mapped_bytes(m, total);
  return MOE_OK;
}
