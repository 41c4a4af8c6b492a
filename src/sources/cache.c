/* Expert buffering (deployment paper VI; see moe.h): K slots in memory for the experts of one layer,
 * the rest in the slow tier (a lazily opened safetensors file, read with pread by a loader thread).
 * For each batch the active experts are served in increasing id order: loads of misses are queued
 * as far ahead as free or evictable slots allow, and each expert computes as soon as it is resident,
 * while the loader reads the next ones. Eviction: experts not active in this batch first, then by the
 * policy (LIFO as in the paper, LRU, FIFO, LFU, LFRU) among those already computed; an active expert not yet
 * computed is evicted only when K is smaller than the batch's active experts (it streams through).
 * A slot holds the expert's matrices in the layer's compute dtype (bf16: 2 bytes a value, what the
 * GEMMs read) and its biases in fp32; the file's tensors may be F32 or BF16 either way: a load reads
 * the bytes as they are when the dtypes agree, else reads and rounds (RNE) or widens. Every read is
 * checked (a NaN or Inf, a short file: an error naming the tensor and the expert) and, when asked
 * (moe_expert_cache_set_drop_pages: streamed experts), its pages dropped from the page cache
 * (posix_fadvise DONTNEED), so that the cache's own hit rate is what a run measures and the file's pages
 * do not fill the memory the budget leaves. Prefetch (moe_expert_cache_prefetch)
 * queues loads of the next batch's predicted experts on the same loader, which reads them while another
 * layer computes; under MOE_PREFETCH_AUTO only those whose read pays (moe__prefetch_pays) by the
 * precision, read time and compute window the cache has measured. Pinned experts (moe_expert_cache_pin)
 * are read once and their slots never chosen. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer/plugins.h"
#include "sources/cache_reader.h"
#include "base/worker.h"
#include "kernels/act.h"
#include "kernels/quant_matmul.h"

#define NT 6 /* fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight, fc3.bias */

struct moe_expert_cache {
  moe__st_files files;       /* where the tensors are (cache_reader.h): released with the cache */
  const moe_st *vf[NT];      /* the file holding each v[t] (the shards of a checkpoint may differ) */
  const moe_st **hff;        /* Hugging Face layout: (NT, E) the file holding each of hf's views */
  moe_tensor_view v[NT];     /* the (E, ...) tensors (Hugging Face layout: expert 0's); name NULL when absent */
  moe_tensor_view *hf;       /* Hugging Face layout (a tensor per expert, Mixtral's): (NT, E) views, or NULL */
  moe__expert_reader rd;     /* or the caller's reader (cache_reader.h): rd.read not NULL */
  moe__qffn qb;              /* stored types (rd.type[0] > 0): the types (qb.t) and the forward's activations */
  const uint8_t *(*qw)[3];   /* stored types: (E) the slots' fc1, fc2, fc3 for moe__qffn_forward */
  const float *(*qbias)[3];  /* stored types with biases: (E) the slots' fc1, fc2, fc3 biases, or NULL */
  int needed[NT];            /* the tensors the layer's experts have */
  size_t per[NT];            /* values per expert of each tensor (stored types: bytes) */
  size_t esz[NT], off[NT];   /* bytes per value in a slot (2 for bf16 matrices, stored types 1, else 4), offset in a slot */
  size_t slot_bytes;
  int E, K;
  moe_cache_policy policy;
  size_t file_bytes;         /* bytes one load reads from the file */
  int64_t *uses, *last;      /* (E) LFU: uses so far; LFRU: the access tick of the last use */
  double *score;             /* (E) LFRU: the score at the last use */
  int64_t tick;              /* accesses so far (LFU, LFRU) */
  char *predicted;           /* (E) the experts of the last prefetch, to score against the next batch */
  int have_prediction;
  moe_prefetch_mode prefetch; /* which predictions moe_expert_cache_prefetch reads */
  double read_s, window_s;    /* mean seconds of a load, and of compute from a prediction to its forward
                                 (0: none yet) */
  double predicted_at;        /* when the last prediction came */
  int64_t stalled_at;         /* stall_ns then */
  int fixed_costs;            /* read_s and window_s set by moe__expert_cache_set_costs (tests): not measured */
  int hold_loads;            /* the loader takes nothing until the next forward has dropped its
                              * unneeded prefetches (moe__expert_cache_hold_loads: tests) */
  char *ahead;               /* (K) the slot was loaded by a prefetch and not used since */
  char *pinned;              /* (K) the slot's expert is pinned (moe_expert_cache_pin): never a victim */
  int keep_pages;            /* reads leave the page cache as it is (moe_expert_cache_set_drop_pages) */
  unsigned char *slots;      /* (K, slot_bytes), 64-byte aligned, each tensor too */
  void *scratch;             /* the loader's buffer for tensors read in another dtype, or NULL */
  int *slot_expert;          /* (K) expert held, or -1 */
  int *where;                /* (E) slot of an expert, or -1 */
  int64_t *inserted, *used;  /* (K) clock at load and at last use */
  int64_t clock;
  /* the loader thread and its queue (at most K loads in flight) */
  moe__worker w; /* w.mu guards the queue */
  int *q_expert, *q_slot, qhead, qlen, *ready; /* ready: 0 loading, 1 loaded, -1 failed */
  int inflight;            /* the loader is reading a slot */
  int D, H, act, bias;     /* the layer shape the cache was opened for */
  moe_dtype dtype;         /* and its compute dtype: MOE_DT_F32 or MOE_DT_BF16 */
  moe_status load_status;
  char load_error[512];
  moe_expert_cache_stats stats;
};

/* Reads expert e's part of tensor t into dst (per[t] values of esz[t] bytes): straight from the file
 * when the dtypes agree, else through the scratch buffer, rounded to bf16 or widened to fp32; then checks
 * the values and drops the bytes read from the page cache. */
static moe_status load_tensor(moe_expert_cache *c, int t, int e, void *dst) {
  const moe_tensor_view *v = c->hf ? &c->hf[(size_t)t * c->E + e] : &c->v[t];
  const moe_st *f = c->hf ? c->hff[(size_t)t * c->E + e] : c->vf[t];
  size_t n = c->per[t], fsz = moe_dtype_size(v->dtype), off = c->hf ? 0 : (size_t)e * n * fsz;
  moe_status st = moe_st_read(f, v, off, n * fsz, fsz == c->esz[t] ? dst : c->scratch);
  if (!c->keep_pages) moe__st_drop_pages(f, v, off, n * fsz);
  MOE_CHECK(st);
  /* one thread, the loader's: the caller's GEMMs have the cores */
  if (fsz != c->esz[t] && v->dtype == MOE_DT_F32) moe__to_bf16(dst, c->scratch, n, 1);
  else if (fsz != c->esz[t]) moe__from_bf16(dst, c->scratch, n, 1);
  st = c->esz[t] == 2 ? moe__st_expect_finite_bf16(f, v, off / fsz, dst, n)
                      : moe__st_expect_finite(f, v, off / fsz, dst, n);
  MOE_TRY(st == MOE_OK, st, "expert %d: %s", e, moe_last_error());
  return MOE_OK;
}

/* Expert e through the caller's reader: stored types' bytes and fp32 straight into the slot's tensors,
 * the others through the scratch buffer and rounded to bf16 as a file's F32 tensor is. */
static moe_status read_expert(moe_expert_cache *c, int e, unsigned char *dst) {
  float *out[NT], *s = c->scratch;
  for (int t = 0; t < NT; t++) {
    out[t] = !c->needed[t] ? NULL : c->esz[t] != 2 ? (float *)(void *)(dst + c->off[t]) : s;
    if (c->needed[t] && c->esz[t] == 2) s += c->per[t];
  }
  moe_status st = c->rd.read(c->rd.ctx, e, out, !c->keep_pages);
  MOE_TRY(st == MOE_OK, st, "expert %d: %s", e, moe_last_error());
  for (int t = 0; t < NT; t++)
    if (out[t] && c->esz[t] == 2) moe__to_bf16((uint16_t *)(void *)(dst + c->off[t]), out[t], c->per[t], 1);
  return MOE_OK;
}

static moe_status load_expert(moe_expert_cache *c, int e, int slot) {
  unsigned char *dst = c->slots + (size_t)slot * c->slot_bytes;
  if (c->rd.read) return read_expert(c, e, dst);
  for (int t = 0; t < NT; t++)
    if (c->needed[t]) MOE_CHECK(load_tensor(c, t, e, dst + c->off[t]));
  return MOE_OK;
}

static void free_cache(moe_expert_cache *c) {
  if (c->rd.free) c->rd.free(c->rd.ctx);
  if (c->files.release) c->files.release(c->files.ctx);
  free(c->slots), free(c->scratch), free(c->slot_expert), free(c->where), free(c->inserted), free(c->hf), free(c->hff);
  free(c->uses), free(c->score), free(c->predicted), free(c->qw), free(c->qbias), free(c);
}

/* Every cache's stall so far, in nanoseconds: what of a prediction's window the disk spent on demand
 * reads (of any layer), so not a window a read ahead could hide in. */
static _Atomic int64_t stall_ns;

/* A running mean of the last few values (weight 1/4 to the new one), or v when there is none. */
static double mean_of(double m, double v) { return m > 0 ? 0.75 * m + 0.25 * v : v; }

static void *loader(void *arg) {
  moe_expert_cache *c = arg;
  pthread_mutex_lock(&c->w.mu);
  for (;;) {
    while ((!c->qlen || c->hold_loads) && !c->w.stop) pthread_cond_wait(&c->w.cv, &c->w.mu);
    if (c->w.stop) break;
    int e = c->q_expert[c->qhead], s = c->q_slot[c->qhead];
    c->qhead = (c->qhead + 1) % c->K;
    c->qlen--;
    c->inflight = 1;
    pthread_mutex_unlock(&c->w.mu);
    double t0 = moe__now();
    moe_status st = load_expert(c, e, s); /* the copy runs while the caller computes */
    double dt = moe__now() - t0;
    pthread_mutex_lock(&c->w.mu);
    c->inflight = 0;
    c->stats.read_seconds += dt;
    if (!c->fixed_costs) c->read_s = mean_of(c->read_s, dt);
    if (st != MOE_OK && c->load_status == MOE_OK) {
      c->load_status = st;
      snprintf(c->load_error, sizeof c->load_error, "%s", moe_last_error());
    }
    c->ready[s] = st == MOE_OK ? 1 : -1;
    c->stats.loads++;
    c->stats.bytes_read += (int64_t)c->file_bytes;
    pthread_cond_broadcast(&c->w.cv);
  }
  pthread_mutex_unlock(&c->w.mu);
  return NULL;
}

static const char *const tensor_names[NT] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
/* An expert's tensors under Hugging Face's names, one tensor per expert, for fc1, fc2 and fc3: Mixtral's
 * PREFIX<e>.w1.weight and the others' PREFIX<e>.gate_proj.weight; no biases. */
static const char *const hf_names[2][NT] = {{"w1.weight", NULL, "w2.weight", NULL, "w3.weight", NULL},
                                            {"gate_proj.weight", NULL, "down_proj.weight", NULL, "up_proj.weight", NULL}};

/* Which tensors layer l's experts have, their shapes past E (want[t][1] 0: a vector), and the slot's
 * layout: values per expert, bytes per value (matrices in the compute dtype, biases fp32) and offsets,
 * each tensor 64-byte aligned; returns the slot's bytes. */
static size_t slot_layout(const moe_layer_config *l, int needed[NT], int64_t want[NT][2], size_t per[NT],
                          size_t esz[NT], size_t off[NT]) {
  int64_t D = l->D, H = l->H;
  const int64_t w[NT][2] = {{H, D}, {H, 0}, {D, H}, {D, 0}, {H, D}, {H, 0}};
  int nd[NT] = {1, l->expert_bias, 1, l->expert_bias, moe__act_gated(l->act),
                l->act == MOE_ACT_SWIGLU_OAI && l->expert_bias};
  size_t bytes = 0;
  for (int t = 0; t < NT; t++) {
    needed[t] = nd[t];
    want[t][0] = w[t][0], want[t][1] = w[t][1];
    per[t] = (size_t)w[t][0] * (w[t][1] ? (size_t)w[t][1] : 1);
    esz[t] = w[t][1] && l->dtype == MOE_DT_BF16 ? 2 : 4;
    off[t] = bytes;
    if (nd[t]) bytes += (per[t] * esz[t] + 63) & ~(size_t)63;
  }
  return bytes;
}

size_t moe_expert_cache_slot_bytes(const moe_layer_config *l) {
  int needed[NT];
  int64_t want[NT][2];
  size_t per[NT], esz[NT], off[NT];
  return slot_layout(l, needed, want, per, esz, off);
}

/* The slot of experts kept in their stored types (t: fc1's, fc2's, fc3's; cache_reader.h): each
 * projection's rows in ggml's layout, per[t] bytes (esz 1), and the layer's biases in fp32 (gpt-oss's:
 * fc1's and fc3's H values, fc2's D), each 64-byte aligned. */
static moe_status stored_layout(const moe_layer_config *l, const moe_gguf_type t[3], int needed[NT], size_t per[NT],
                                size_t esz[NT], size_t off[NT], size_t *bytes) {
  MOE_TRY(moe__act_gated(l->act) == (t[2] != 0) && (unsigned)l->act <= MOE_ACT_SWIGLU_OAI, MOE_ERR_ARG,
          "expert cache: experts in their stored types have fc3 exactly with a gated activation (swiglu, swiglu_oai)");
  int64_t want[NT][2];
  size_t vals[NT], fsz[NT], foff[NT];
  slot_layout(l, needed, want, vals, fsz, foff); /* which tensors, and the biases' values */
  const int64_t rows[3] = {l->H, l->D, l->H}, cols[3] = {l->D, l->H, l->D};
  *bytes = 0;
  for (int k = 0; k < NT; k++) {
    int j = k / 2;
    if (k % 2) per[k] = vals[k], esz[k] = 4;
    else per[k] = needed[k] ? (size_t)rows[j] * moe__qrow_bytes(t[j], cols[j]) : 0, esz[k] = 1;
    off[k] = *bytes;
    MOE_TRY(k % 2 || !needed[k] || moe__qmat_fits(t[j], cols[j]), MOE_ERR_ARG,
            "expert cache: fc%d in %s has no kernel here for rows of %lld values", j + 1, moe_gguf_type_name(t[j]),
            (long long)cols[j]);
    if (needed[k]) *bytes += (per[k] * esz[k] + 63) & ~(size_t)63;
  }
  return MOE_OK;
}

/* Whether the files have tensor `name` (a shard named for it but not opened yet is opened, and an
 * error opening it reported). */
static moe_status has(const moe__st_files *fs, const char *name, int *out) {
  const moe_st *f = NULL;
  MOE_CHECK(fs->file_of(fs->ctx, name, 0, &f));
  *out = f != NULL;
  return MOE_OK;
}

/* Into *out which of hf_names the files have under prefix (the first expert's fc1), or -1: the stacked
 * (E, ...) tensors. */
static moe_status hf_layout(const moe__st_files *fs, const char *prefix, int *out) {
  char name[192];
  int stacked = 0;
  snprintf(name, sizeof name, "%s%s", prefix, tensor_names[0]);
  MOE_CHECK(has(fs, name, &stacked));
  *out = -1;
  for (int k = 0; k < 2 && !stacked && *out < 0; k++) {
    int found;
    snprintf(name, sizeof name, "%s0.%s", prefix, hf_names[k][0]);
    MOE_CHECK(has(fs, name, &found));
    if (found) *out = k;
  }
  return MOE_OK;
}

/* A cache of K slots for layer l, its slots' layout set and nothing allocated past it (calloc'd: free_cache). */
static moe_status new_cache(moe_expert_cache **out, const moe_layer_config *l, int K, moe_cache_policy p) {
  MOE_TRY(K >= 1 && K <= l->E, MOE_ERR_ARG, "expert cache: K must be in [1, E=%d], got %d", l->E, K);
  MOE_TRY(p != MOE_CACHE_BELADY && (unsigned)p <= MOE_CACHE_LFRU, MOE_ERR_ARG,
          "expert cache: policy must be lifo, lru, fifo, lfu or lfru (belady knows the future: moe cachesim only)");
  MOE_TRY(l->dtype == MOE_DT_F32 || l->dtype == MOE_DT_BF16, MOE_ERR_ARG,
          "expert cache: the layer's dtype must be f32 or bf16, got %s", moe_dtype_name(l->dtype));
  moe_expert_cache *c = calloc(1, sizeof *c);
  MOE_TRY(c, MOE_ERR_NOMEM, "expert cache: out of memory");
  c->E = l->E;
  c->K = K;
  c->D = l->D;
  c->H = l->H;
  c->act = l->act;
  c->bias = l->expert_bias;
  c->dtype = l->dtype;
  c->policy = p;
  c->prefetch = MOE_PREFETCH_ON;
  c->keep_pages = 1;
  int64_t want[NT][2];
  c->slot_bytes = slot_layout(l, c->needed, want, c->per, c->esz, c->off);
  *out = c;
  return MOE_OK;
}

/* c's slots, bookkeeping and loader thread, with `scratch` bytes for the loader; frees c on an error. */
static moe_status start_cache(moe_expert_cache *c, size_t scratch, moe_expert_cache **out) {
  int K = c->K, E = c->E;
  moe_status st = MOE_OK;
  c->slots = aligned_alloc(64, (size_t)K * c->slot_bytes);
  c->scratch = scratch ? aligned_alloc(64, (scratch + 63) & ~(size_t)63) : NULL;
  c->slot_expert = malloc(sizeof(int) * (size_t)K * 5);
  c->where = malloc(sizeof(int) * (size_t)E);
  c->inserted = calloc((size_t)K * 2, sizeof(int64_t));
  c->uses = calloc((size_t)E * 2, sizeof(int64_t));
  c->score = calloc((size_t)E, sizeof(double));
  c->predicted = calloc((size_t)E + 2 * (size_t)K, 1);
  if (!c->slots || (scratch && !c->scratch) || !c->slot_expert || !c->where || !c->inserted || !c->uses ||
      !c->score || !c->predicted)
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert cache: cannot allocate %d slots", K);
  if (st != MOE_OK) {
    free_cache(c);
    return st;
  }
  c->used = c->inserted + K;
  c->last = c->uses + E;
  c->ahead = c->predicted + E;
  c->pinned = c->ahead + K;
  c->q_expert = c->slot_expert + K;
  c->q_slot = c->q_expert + K;
  c->ready = c->q_slot + K;
  for (int s = 0; s < K; s++) c->slot_expert[s] = -1;
  for (int e = 0; e < E; e++) c->where[e] = -1;
  c->stats.resident_bytes = (size_t)K * c->slot_bytes;
  c->stats.expert_bytes = c->slot_bytes;
  c->stats.dtype = c->dtype;
  c->stats.slots = K;
  if (!moe__worker_start(&c->w, loader, c)) {
    free_cache(c);
    MOE_TRY(0, MOE_ERR_NOMEM, "expert cache: cannot start the loader thread");
  }
  *out = c;
  return MOE_OK;
}

moe_status moe__expert_cache_open_reader(moe_expert_cache **out, const moe_layer_config *l, int K, moe_cache_policy p,
                                         const moe__expert_reader *r) {
  moe_expert_cache *c = NULL;
  moe_status st = out && l && r && r->read ? new_cache(&c, l, K, p)
                                             : moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "expert cache: NULL argument");
  if (st != MOE_OK) {
    if (r && r->free) r->free(r->ctx);
    return st;
  }
  c->rd = *r;
  c->file_bytes = r->file_bytes;
  if (r->type[0]) {
    st = stored_layout(l, r->type, c->needed, c->per, c->esz, c->off, &c->slot_bytes);
    memcpy(c->qb.t, r->type, sizeof c->qb.t);
    if (!c->qb.t[2]) c->qb.t[2] = c->qb.t[0];
    if (st == MOE_OK && (!(c->qw = calloc((size_t)l->E, sizeof *c->qw)) ||
                         (l->expert_bias && !(c->qbias = calloc((size_t)l->E, sizeof *c->qbias)))))
      st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert cache: out of memory");
    if (st != MOE_OK) {
      free_cache(c);
      return st;
    }
  }
  size_t scratch = 0; /* the bf16 matrices' fp32 values */
  for (int t = 0; t < NT; t++)
    if (c->needed[t] && c->esz[t] == 2) scratch += c->per[t] * 4;
  return start_cache(c, scratch, out);
}

moe_status moe__expert_cache_reader_slot_bytes(const moe_layer_config *l, const moe__expert_reader *r, size_t *out) {
  int needed[NT];
  size_t per[NT], esz[NT], off[NT];
  *out = moe_expert_cache_slot_bytes(l);
  return r->type[0] ? stored_layout(l, r->type, needed, per, esz, off, out) : MOE_OK;
}

/* c's views of the experts' tensors under prefix in fs (c takes fs), and into *scratch the bytes of the
 * largest part read in another dtype than its slot's; frees c on an error. */
static moe_status open_views(moe_expert_cache *c, const moe__st_files *fs, const char *prefix, const moe_layer_config *l,
                             size_t *scratch_out) {
  c->files = *fs;
  int64_t want[NT][2]; /* the shapes past E (the layout again: new_cache keeps only the slot's) */
  size_t per[NT], esz[NT], off[NT];
  int *needed = c->needed;
  slot_layout(l, needed, want, per, esz, off);
  size_t scratch = 0; /* bytes of the largest tensor part read in another dtype than its slot's */
  char name[192];
  int hf = -1;
  moe_status st = hf_layout(fs, prefix, &hf);
  if (st == MOE_OK && hf >= 0 && (!(c->hf = calloc((size_t)NT * l->E, sizeof *c->hf)) ||
                                  !(c->hff = calloc((size_t)NT * l->E, sizeof *c->hff))))
    st = moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "expert cache: out of memory for %d experts' views", l->E);
  for (int t = 0; t < NT && st == MOE_OK; t++) {
    if (!needed[t]) continue;
    int nd = want[t][1] ? 3 : 2, ok = 1, per_expert = hf >= 0;
    const moe_st *f = NULL; /* the file of the tensor last looked at */
    for (int e = 0; e < (per_expert ? l->E : 1) && ok && st == MOE_OK; e++) { /* hf: each expert's tensor */
      if (per_expert && !hf_names[hf][t]) {
        st = moe__error(MOE_ERR_MISSING, __FILE__, __LINE__, "%s: the experts under '%s' have no %s (one tensor per expert has no biases)",
                        moe_st_path(c->vf[0]), prefix, tensor_names[t]);
        break;
      }
      if (per_expert) snprintf(name, sizeof name, "%s%d.%s", prefix, e, hf_names[hf][t]);
      else snprintf(name, sizeof name, "%s%s", prefix, tensor_names[t]);
      moe_tensor_view *v = per_expert ? &c->hf[(size_t)t * l->E + e] : &c->v[t];
      const moe_st **vf = per_expert ? &c->hff[(size_t)t * l->E + e] : &c->vf[t];
      if ((st = fs->file_of(fs->ctx, name, 1, &f)) != MOE_OK || (st = moe_st_get(f, name, v)) != MOE_OK) break;
      *vf = f;
      if (per_expert && !e) c->v[t] = *v, c->vf[t] = f;
      moe_dtype dt = v->dtype;
      const int64_t *sh = v->shape + !per_expert; /* past the stacked tensors' leading E */
      ok = (dt == MOE_DT_F32 || dt == MOE_DT_BF16) && dt == c->v[t].dtype && v->ndim == nd - per_expert &&
           (per_expert || v->shape[0] == l->E) && sh[0] == want[t][0] && (nd == 2 || sh[1] == want[t][1]);
    }
    if (st != MOE_OK) break;
    if (!ok)
      st = moe__error(MOE_ERR_SHAPE, __FILE__, __LINE__, "%s: tensor '%s' is not F32 or BF16 (%s%lld%s%lld)",
                      moe_st_path(f), name, per_expert ? "" : "E, ", (long long)want[t][0], nd == 3 ? ", " : "",
                      nd == 3 ? (long long)want[t][1] : 0LL);
    size_t fsz = moe_dtype_size(c->v[t].dtype);
    c->file_bytes += c->per[t] * fsz;
    if (ok && fsz != c->esz[t] && c->per[t] * fsz > scratch) scratch = c->per[t] * fsz;
  }
  if (st != MOE_OK) free_cache(c);
  *scratch_out = scratch;
  return st;
}

/* One file's tensors as moe__st_files: every name is f's (a missing one is moe_st_get's error). */
static moe_status one_file(void *ctx, const char *name, int required, const moe_st **f) {
  *f = required || moe_st_has(ctx, name) ? ctx : NULL;
  return MOE_OK;
}

moe_status moe__expert_cache_open_files(moe_expert_cache **out, const moe__st_files *fs, const char *prefix,
                                        const moe_layer_config *l, int K, moe_cache_policy p) {
  moe_expert_cache *c;
  size_t scratch;
  moe_status st = new_cache(&c, l, K, p);
  if (st != MOE_OK && fs->release) fs->release(fs->ctx);
  MOE_CHECK(st);
  MOE_CHECK(open_views(c, fs, prefix, l, &scratch));
  return start_cache(c, scratch, out);
}

moe_status moe_expert_cache_open(moe_expert_cache **out, const moe_st *f, const char *prefix,
                                 const moe_layer_config *l, int K, moe_cache_policy p) {
  MOE_TRY(out && f && prefix && l, MOE_ERR_ARG, "moe_expert_cache_open: NULL argument");
  moe__st_files fs = {(void *)f, one_file, NULL};
  return moe__expert_cache_open_files(out, &fs, prefix, l, K, p);
}

static moe_status st_read(void *ctx, int e, float *const out[6], int drop) {
  moe_expert_cache *c = ctx;
  c->keep_pages = !drop;
  for (int t = 0; t < NT; t++)
    if (out[t] && c->needed[t]) MOE_CHECK(load_tensor(c, t, e, out[t]));
  return MOE_OK;
}

static void st_free(void *ctx) { free_cache(ctx); }

moe_status moe__expert_st_reader(const moe__st_files *fs, const char *prefix, const moe_layer_config *l,
                                 moe__expert_reader *out) {
  moe_layer_config fp32 = *l; /* fp32 values whatever the layer computes in */
  fp32.dtype = MOE_DT_F32;
  moe_expert_cache *c;
  size_t scratch;
  moe_status st = new_cache(&c, &fp32, 1, MOE_CACHE_LRU);
  if (st != MOE_OK && fs->release) fs->release(fs->ctx);
  MOE_CHECK(st);
  MOE_CHECK(open_views(c, fs, prefix, &fp32, &scratch));
  if (scratch && !(c->scratch = aligned_alloc(64, (scratch + 63) & ~(size_t)63))) {
    free_cache(c);
    MOE_TRY(0, MOE_ERR_NOMEM, "expert reader: out of memory for an expert's tensor (%zu bytes)", scratch);
  }
  *out = (moe__expert_reader){.ctx = c, .read = st_read, .free = st_free, .file_bytes = c->file_bytes};
  return MOE_OK;
}

void moe_expert_cache_free(moe_expert_cache *c) {
  if (!c) return;
  moe__worker_stop(&c->w);
  free_cache(c);
}

void moe_expert_cache_get_stats(const moe_expert_cache *c, moe_expert_cache_stats *out) {
  moe_expert_cache *w = (moe_expert_cache *)c; /* the loader adds its loads under the lock */
  pthread_mutex_lock(&w->w.mu);
  *out = c->stats;
  pthread_mutex_unlock(&w->w.mu);
}

double moe__lfru_score(double s, int64_t since, int half) { return s * exp2(-(double)since / half); }

/* Expert e is used (computed) now: the policies' counts. */
static void count_use(moe_expert_cache *c, int e) {
  int v = c->where[e];
  c->used[v] = ++c->clock;
  c->score[e] = moe__lfru_score(c->score[e], c->tick - c->last[e], c->E) + 1;
  c->last[e] = c->tick++;
  c->uses[e]++;
  if (c->ahead[v]) c->stats.prefetch_used++, c->ahead[v] = 0;
}

/* Queues the load of expert e into slot v (under the lock). */
static void queue_load(moe_expert_cache *c, int e, int v) {
  if (c->slot_expert[v] >= 0) c->where[c->slot_expert[v]] = -1;
  c->slot_expert[v] = e;
  c->where[e] = v;
  c->ready[v] = 0;
  c->ahead[v] = 0;
  c->inserted[v] = ++c->clock;
  int tail = (c->qhead + c->qlen) % c->K;
  c->q_expert[tail] = e;
  c->q_slot[tail] = v;
  c->qlen++;
  pthread_cond_broadcast(&c->w.cv);
}

/* The slot to load expert `need` into, or -1 if none can be given now. By class: an empty slot, then
 * an expert not active in this batch, then one already computed (by the policy within a class), and
 * last, when K is smaller than the batch's active experts, a resident one still to compute that comes
 * after `need` (the one that comes last: it streams through again later). Slots being loaded stay.
 * Loading ahead (`now` false) takes only the first two classes, so evictions among this batch's
 * experts happen in the paper's order: the expert is needed next and the others have run. */
static int victim(const moe_expert_cache *c, const char *state, int need, int now) {
  int best = -1, best_class = 4;
  for (int s = 0; s < c->K; s++) {
    int e = c->slot_expert[s];
    if ((e >= 0 && c->ready[s] != 1) || c->pinned[s]) continue;
    int cls = e < 0 ? 0 : state[e] == 0 ? 1 : state[e] == 2 ? 2 : e > need ? 3 : 4; /* 0 inactive 1 to do 2 done */
    if (cls == 4 || (!now && cls > 1)) continue; /* loading ahead takes only free or idle slots */
    int better = cls < best_class;
    if (!better && cls == best_class && cls > 0) {
      int b = c->slot_expert[best];
      switch (cls == 3 ? MOE_CACHE_BELADY : c->policy) {
        case MOE_CACHE_LIFO: better = c->inserted[s] > c->inserted[best]; break;
        case MOE_CACHE_FIFO: better = c->inserted[s] < c->inserted[best]; break;
        case MOE_CACHE_LRU: better = c->used[s] < c->used[best]; break;
        case MOE_CACHE_LFU:
          better = c->uses[e] < c->uses[b] || (c->uses[e] == c->uses[b] && c->used[s] < c->used[best]);
          break;
        case MOE_CACHE_LFRU:
          better = moe__lfru_score(c->score[e], c->tick - c->last[e], c->E) <
                   moe__lfru_score(c->score[b], c->tick - c->last[b], c->E);
          break;
        default: better = e > b; break; /* needed last in this batch */
      }
    }
    if (better) {
      best = s;
      best_class = cls;
    }
  }
  return best;
}

/* The weights of the expert in slot v, as moe__ffn_forward reads them: the matrices through the
 * fp32 pointers (w1, w2, w3) or the bf16 ones (w1h, w2h, w3h) by the dtype, the biases fp32. */
static moe__expert_w slot_weights(const moe_expert_cache *c, int v) {
  const unsigned char *base = c->slots + (size_t)v * c->slot_bytes;
  const void *p[NT];
  for (int t = 0; t < NT; t++) p[t] = c->needed[t] ? base + c->off[t] : NULL;
  moe__expert_w w = {.b1 = p[1], .b2 = p[3], .b3 = p[5]};
  if (c->dtype == MOE_DT_BF16) {
    w.w1h = p[0];
    w.w2h = p[2];
    w.w3h = p[4];
  } else {
    w.w1 = p[0];
    w.w2 = p[2];
    w.w3 = p[4];
  }
  return w;
}

/* Prefetches still queued for experts this batch does not run (state[e] 0) are dropped and their slots
 * left free (under the lock): a wrong prediction then costs at most the read already under way, not the
 * disk's time for the batch's own misses queued behind it. */
static void cancel_unneeded_prefetches(moe_expert_cache *c, const char *state) {
  int kept = 0;
  for (int i = 0; i < c->qlen; i++) {
    int at = (c->qhead + i) % c->K, e = c->q_expert[at], v = c->q_slot[at];
    if (c->ahead[v] && !state[e]) {
      c->where[e] = -1, c->slot_expert[v] = -1, c->ahead[v] = 0;
      continue;
    }
    int to = (c->qhead + kept++) % c->K;
    c->q_expert[to] = e, c->q_slot[to] = v;
  }
  c->qlen = kept;
}

/* The expert source of a layer with external experts: each expert computes as soon as the cache has it. */
static moe_status cache_forward(void *self, const moe__env *env, const moe__plan *p, const moe__groups *g,
                                const moe__ffn *f, const moe__side_work *side) {
  (void)p, (void)side; /* never given: the source does not take side work */
  moe_expert_cache *c = self;
  int E = g->n;
  moe__expert_w *w = f->w;
  char *state = f->state;
  int *order = f->order;
  memset(w, 0, (size_t)E * sizeof *w); /* inactive experts have no rows, and no weights either */
  int n = 0;
  for (int e = 0; e < E; e++) {
    state[e] = g->offs[e + 1] > g->offs[e];
    if (state[e]) order[n++] = e;
  }
  c->stats.accesses += n;
  pthread_mutex_lock(&c->w.mu);
  cancel_unneeded_prefetches(c, state);
  if (c->hold_loads) c->hold_loads = 0, pthread_cond_broadcast(&c->w.cv);
  if (c->have_prediction) { /* the last prefetch's experts against this batch's, and the time between */
    /* the time between less every cache's stall in it: the disk was busy with demand reads then */
    double w = moe__now() - c->predicted_at - (double)(atomic_load(&stall_ns) - c->stalled_at) * 1e-9;
    if (!c->fixed_costs) c->window_s = mean_of(c->window_s, w > 1e-6 ? w : 1e-6);
    for (int e = 0; e < E; e++) c->stats.predicted += c->predicted[e], c->stats.predicted_hit += c->predicted[e] && state[e];
    c->stats.actual += n;
    c->have_prediction = 0;
  }
  moe_status computed = MOE_OK; /* the first failure of the experts' GEMMs, reported after the loads settle */
  for (int i = 0; i < n && c->load_status == MOE_OK;) {
    /* queue the loads of the experts still missing, in order, while a slot can be given */
    for (int j = i; j < n; j++) {
      int e = order[j];
      if (c->where[e] >= 0) continue; /* resident, or on its way */
      int v = victim(c, state, e, j == i);
      if (v < 0) break;
      queue_load(c, e, v);
      c->stats.misses++;
    }
    int e = order[i];
    if (c->where[e] < 0 || c->ready[c->where[e]] != 1) { /* not yet: wait for a load to finish */
      double t0 = moe__now();
      pthread_cond_wait(&c->w.cv, &c->w.mu);
      double dt = moe__now() - t0;
      c->stats.stall_seconds += dt;
      atomic_fetch_add(&stall_ns, (int64_t)(dt * 1e9));
      continue;
    }
    /* compute the run of consecutive resident experts starting at i, unlocked: the loader goes on */
    int run = i;
    while (run < n && c->where[order[run]] >= 0 && c->ready[c->where[order[run]]] == 1) {
      int ej = order[run++];
      if (c->qw) {
        const unsigned char *base = c->slots + (size_t)c->where[ej] * c->slot_bytes;
        for (int j = 0; j < 3; j++) c->qw[ej][j] = c->needed[2 * j] ? base + c->off[2 * j] : NULL;
        for (int j = 0; j < 3 && c->qbias; j++)
          c->qbias[ej][j] = c->needed[2 * j + 1] ? (const float *)(const void *)(base + c->off[2 * j + 1]) : NULL;
      } else {
        w[ej] = slot_weights(c, c->where[ej]);
      }
      count_use(c, ej);
      state[ej] = 3; /* being computed: its slot stays */
    }
    pthread_mutex_unlock(&c->w.mu);
    moe_status cst = MOE_OK;
    if (c->qw)
      moe__qffn_forward(&c->qb, env->l, g, f, (const uint8_t *const (*)[3])c->qw, (const float *const (*)[3])c->qbias,
                        order + i, run - i, env->threads);
    else
      cst = moe__ffn_forward(env, g, f, e, order[run - 1] + 1, w, NULL); /* experts between: no rows */
    if (computed == MOE_OK) computed = cst;
    pthread_mutex_lock(&c->w.mu);
    for (int j = i; j < run; j++) state[order[j]] = 2;
    i = run;
  }
  moe_status st = c->load_status;
  char msg[sizeof c->load_error];
  if (st != MOE_OK) { /* let queued loads finish, then forget every slot that is not loaded */
    while (c->qlen || c->inflight) pthread_cond_wait(&c->w.cv, &c->w.mu);
    for (int v = 0; v < c->K; v++)
      if (c->ready[v] != 1 && c->slot_expert[v] >= 0) c->where[c->slot_expert[v]] = -1, c->slot_expert[v] = -1;
    snprintf(msg, sizeof msg, "%s", c->load_error);
    c->load_status = MOE_OK; /* reported once */
  }
  pthread_mutex_unlock(&c->w.mu);
  MOE_TRY(st == MOE_OK, st, "expert cache: %s", msg);
  return computed;
}

moe_status moe_expert_cache_pin(moe_expert_cache *c, const int *experts, int n) {
  MOE_TRY(c && (experts || !n) && n >= 0, MOE_ERR_ARG, "moe_expert_cache_pin: NULL argument");
  pthread_mutex_lock(&c->w.mu);
  int room = c->K - c->stats.pinned - (c->K < c->E); /* a slot stays for the experts not pinned */
  moe_status st = MOE_OK;
  for (int i = 0; i < n && st == MOE_OK; i++) {
    int e = experts[i], v = e >= 0 && e < c->E ? c->where[e] : -1;
    if (e < 0 || e >= c->E) st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "moe_expert_cache_pin: expert %d is not in [0, %d)", e, c->E);
    else if (v >= 0 && c->pinned[v]) continue;
    else if (room <= 0)
      st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "moe_expert_cache_pin: %d slots, %d experts: no slot to pin expert %d in "
                      "(one stays for the experts not pinned)", c->K, c->E, e);
    for (int s = 0; st == MOE_OK && v < 0 && s < c->K; s++)
      if (c->slot_expert[s] < 0) queue_load(c, e, v = s);
    if (st == MOE_OK && v < 0) st = moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "moe_expert_cache_pin: no free slot for expert %d", e);
    while (st == MOE_OK && c->ready[v] == 0) pthread_cond_wait(&c->w.cv, &c->w.mu);
    if (st == MOE_OK && c->ready[v] < 0) { /* the read's error, now rather than at a forward */
      c->where[e] = -1, c->slot_expert[v] = -1;
      st = moe__error(c->load_status, __FILE__, __LINE__, "moe_expert_cache_pin: %s", c->load_error);
      c->load_status = MOE_OK;
    }
    if (st == MOE_OK) c->pinned[v] = 1, c->stats.pinned++, room--;
  }
  pthread_mutex_unlock(&c->w.mu);
  return st;
}

void moe_expert_cache_set_drop_pages(moe_expert_cache *c, int drop) {
  pthread_mutex_lock(&c->w.mu); /* the loader reads the flag under the same lock's ordering */
  c->keep_pages = !drop;
  pthread_mutex_unlock(&c->w.mu);
}

int moe__prefetch_pays(double p, double read_s, double window_s) {
  if (read_s <= 0 || window_s <= 0) return 0; /* nothing measured yet */
  double hidden = read_s < window_s ? read_s : window_s, spent = read_s > window_s ? read_s - window_s : 0;
  return p * hidden > (1 - p) * spent;
}

moe_status moe_expert_cache_set_prefetch(moe_expert_cache *c, moe_prefetch_mode mode) {
  MOE_TRY(c, MOE_ERR_ARG, "moe_expert_cache_set_prefetch: NULL cache");
  MOE_TRY((unsigned)mode <= MOE_PREFETCH_AUTO, MOE_ERR_ARG,
          "moe_expert_cache_set_prefetch: mode %d is not MOE_PREFETCH_OFF, _ON or _AUTO", (int)mode);
  pthread_mutex_lock(&c->w.mu);
  c->prefetch = mode;
  pthread_mutex_unlock(&c->w.mu);
  return MOE_OK;
}

static const char *const prefetch_names[] = {"off", "on", "auto"};

const char *moe_prefetch_mode_name(moe_prefetch_mode m) { return (unsigned)m < 3 ? prefetch_names[m] : "?"; }

moe_status moe_prefetch_mode_parse(const char *s, const char *field, moe_prefetch_mode *out) {
  int v;
  MOE_CHECK(moe__parse_name(s, field ? field : "prefetch", prefetch_names, 3, &v));
  *out = (moe_prefetch_mode)v;
  return MOE_OK;
}

void moe__expert_cache_set_costs(moe_expert_cache *c, double read_s, double window_s) {
  pthread_mutex_lock(&c->w.mu);
  c->read_s = read_s, c->window_s = window_s, c->fixed_costs = 1;
  pthread_mutex_unlock(&c->w.mu);
}

void moe__expert_cache_hold_loads(moe_expert_cache *c) {
  pthread_mutex_lock(&c->w.mu);
  c->hold_loads = 1;
  pthread_mutex_unlock(&c->w.mu);
}

moe_status moe_expert_cache_prefetch(moe_expert_cache *c, const int *experts, int n) {
  MOE_TRY(c && (experts || !n) && n >= 0, MOE_ERR_ARG, "moe_expert_cache_prefetch: NULL argument");
  for (int i = 0; i < n; i++)
    MOE_TRY(experts[i] >= 0 && experts[i] < c->E, MOE_ERR_ARG, "moe_expert_cache_prefetch: expert %d is not in [0, %d)",
            experts[i], c->E);
  pthread_mutex_lock(&c->w.mu);
  memset(c->predicted, 0, (size_t)c->E);
  for (int i = 0; i < n; i++) c->predicted[experts[i]] = 1; /* as victim's state: 1, to run, is kept */
  c->have_prediction = 1;
  c->predicted_at = moe__now();
  c->stalled_at = atomic_load(&stall_ns);
  int read = c->prefetch == MOE_PREFETCH_ON ||
             (c->prefetch == MOE_PREFETCH_AUTO && c->stats.predicted &&
              moe__prefetch_pays((double)c->stats.predicted_hit / (double)c->stats.predicted, c->read_s, c->window_s));
  for (int i = 0; i < n && c->load_status == MOE_OK; i++) {
    int e = experts[i];
    if (c->where[e] >= 0) continue;
    if (!read) {
      c->stats.prefetch_skipped++;
      continue;
    }
    int v = victim(c, c->predicted, e, 0); /* free slots, then experts not predicted */
    if (v < 0) break;
    queue_load(c, e, v);
    c->ahead[v] = 1;
    c->stats.prefetches++;
  }
  pthread_mutex_unlock(&c->w.mu);
  return MOE_OK;
}

/* Whether a cache was opened for this layer's shape (E, D, H, activation, biases, dtype), with slots in
 * stored types exactly when the layer's experts compute in them (expert_type > 0). */
static int cache_fits(const moe_expert_cache *c, const moe_layer_config *l) {
  return c->E == l->E && c->D == l->D && c->H == l->H && c->act == (int)l->act && c->bias == l->expert_bias &&
         c->dtype == l->dtype && !c->qw == (l->expert_type <= 0);
}

static const moe__expert_src cached_experts = {"expert cache", 0,    NULL,           NULL,           NULL,
                                               moe__ffn_bytes, moe__ffn_alloc, cache_forward, NULL, NULL};

/* A cache of slots in stored types: the fp32 FFN's activations and bookkeeping, and the quantized ones. */
static size_t qcache_bytes(void *self, const moe__env *env, int ng, int rows) {
  const moe_expert_cache *c = self;
  return moe__ffn_bytes(self, env, ng, rows) + moe__qffn_bytes(&env->l->cfg, c->qb.t, rows);
}

static moe_status qcache_alloc(void *self, const moe__env *env, int ng, int rows, moe__ffn *f) {
  moe_expert_cache *c = self;
  MOE_CHECK(moe__ffn_alloc(self, env, ng, rows, f));
  moe__qffn_alloc(env->work, &env->l->cfg, c->qb.t, rows, &c->qb);
  MOE_TRY(c->qb.hq || rows == 0, MOE_ERR_STATE, "internal: expert workspace too small");
  return MOE_OK;
}

static const moe__expert_src cached_stored_experts = {"expert cache (stored types)", 0, NULL, NULL, NULL,
                                                      qcache_bytes, qcache_alloc, cache_forward, NULL, NULL};

moe_status moe_layer_set_expert_cache(moe_layer_t *l, moe_expert_cache *c) {
  MOE_TRY(l->cfg.external_experts || !c, MOE_ERR_ARG, "moe_layer_set_expert_cache: the layer was not made with external_experts");
  MOE_TRY(!c || cache_fits(c, &l->cfg), MOE_ERR_SHAPE,
          "moe_layer_set_expert_cache: the cache was opened for another layer shape (E, D, H, activation, biases, dtype; "
          "slots in stored types exactly for expert_type > 0)");
  l->cache = c;
  if (l->cfg.external_experts) moe__layer_set_source(l, !c ? NULL : c->qw ? &cached_stored_experts : &cached_experts, c);
  return MOE_OK;
}
