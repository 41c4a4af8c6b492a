/* Internal helpers shared by the library's files: error recording and the check macro.
 * Nothing here is exported; internal non-static symbols start with moe__. */
#ifndef MOE_INTERNAL_H
#define MOE_INTERNAL_H

#include <time.h>

#include "moe.h"

/* Records the message as the thread's last error and returns st (file and line are for debuggers). The
 * arguments may include moe_last_error(), to prefix the callee's message. */
moe_status moe__error(moe_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Seconds on a monotonic clock (timing of exchanges, stalls, the sgemm probe). */
static inline double moe__now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The buffers a step sweeps through memory (a layer's parameters and gradients, its workspace, the
 * optimizer's moments): 64-byte aligned, and from 4 MiB on whole 2 MiB pages
 * advised as transparent huge pages, so that sweeping them takes a TLB entry per 2 MiB instead of per
 * 4 KiB (BENCHMARKS.md, "Huge pages"). Freed with free(); NULL (ENOMEM) for sizes that overflow.
 * moe__calloc_big zeroes n * size bytes by writing them, so it is for buffers the next step writes
 * anyway: a calloc's untouched pages cost nothing until used (a model's gradients when serving). */
void *moe__alloc_big(size_t bytes);
void *moe__calloc_big(size_t n, size_t size);
/* A big buffer of n zero bytes (untouched pages: free until used) whose first byte lies `phase` bytes
 * into a page (phase < the page size; 0: aligned as moe__alloc_big's), its own mapping so that a
 * file's pages can be mapped into it (base/file_map.h: a model's parameters loaded from a checkpoint).
 * Freed with moe__map_free(p, n, phase), the file's pages with it; NULL when out of memory. */
void *moe__map_alloc(size_t n, size_t phase);
void moe__map_free(void *p, size_t n, size_t phase);

/* splitmix64: a tiny, well-mixed generator, so that initialization depends only on the seed. */
static inline uint64_t moe__splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Uniform in [-1, 1) from the generator. */
static inline float moe__uniform(uint64_t *s) { return (float)((moe__splitmix(s) >> 40) * 0x1.0p-24) * 2.0f - 1.0f; }

/* float -> bf16 bits, round to nearest even (as PyTorch); NaN stays a quiet NaN with its sign. */
static inline uint16_t moe__bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
/* n values to bf16, and back (exact), on nt threads (bf16.c). */
void moe__to_bf16(uint16_t *dst, const float *src, size_t n, int nt);
void moe__from_bf16(float *dst, const uint16_t *src, size_t n, int nt);

/* Check cond; on failure record the message and return st from the calling function. */
#define MOE_TRY(cond, st, ...)                                                  \
  do {                                                                          \
    if (!(cond)) return moe__error((st), __FILE__, __LINE__, __VA_ARGS__);      \
  } while (0)

/* Propagate a failing status unchanged (the callee already set the message). */
#define MOE_CHECK(expr)                                                         \
  do {                                                                          \
    moe_status moe__s = (expr);                                                 \
    if (moe__s != MOE_OK) return moe__s;                                        \
  } while (0)

/* Threads to use for a requested count (0 = all cores) (base/threads.c). */
int moe__threads(int requested);
/* Whether a parallel region over `values` floats of row-wise work is worth its threads: below
 * MOE__PAR_MIN (a decode step's single row: some 200 such regions a token) the fork and join cost
 * more than a second thread gives. Such regions take `if (moe__par_worth(n))`; each row is computed
 * the same either way, so the bits are too. */
#define MOE__PAR_MIN ((size_t)1 << 14)
static inline int moe__par_worth(size_t values) { return values >= MOE__PAR_MIN; }

/* The LFRU cache policy's score (sources/cache.c, serve/cachesim.c): a score s, `since` accesses of the
 * layer later, halved every `half` accesses; each use adds 1 to it. */
double moe__lfru_score(double s, int64_t since, int half);

/* Index of s in names[n] into *out; otherwise MOE_ERR_ARG naming `field`, the value and the choices
 * (base/names.c). */
moe_status moe__parse_name(const char *s, const char *field, const char *const *names, int n, int *out);

/* MOE_ERR_VALUE naming the file, the tensor and the index of the first non-finite value of x, which
 * holds the flat values [off, off + n) of tensor v of f (safetensors.c); NaN/Inf weights are refused
 * when loaded rather than spread through every output. */
moe_status moe__st_expect_finite(const moe_st *f, const moe_tensor_view *v, size_t off, const float *x, size_t n);
/* The same over n bf16 values (a slot of the expert cache). */
moe_status moe__st_expect_finite_bf16(const moe_st *f, const moe_tensor_view *v, size_t off, const uint16_t *x,
                                      size_t n);
/* Drops bytes [off, off + n) of tensor v of a lazily opened f from the page cache (posix_fadvise
 * DONTNEED: advice, no error); nothing for a file read into memory. */
void moe__st_drop_pages(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n);
/* The same over the whole of an F32 or BF16 tensor, read in chunks (for weights left in the file). */
moe_status moe__st_scan_finite(const moe_st *f, const moe_tensor_view *v);
/* The index of x's first NaN or Inf, or n when all n are finite (at memory speed: a load checks
 * every weight it reads or maps). */
size_t moe__first_nonfinite(const float *x, size_t n);
/* The descriptor a lazily opened file reads through (-1 when it was read whole): a view's file_offset
 * is an offset in it. */
int moe__st_fd(const moe_st *f);

/* MOE_ERR_SHAPE naming the file, the tensor and both shapes unless v (tensor `name` of f) has shape
 * (ndim) (safetensors.c). */
moe_status moe__st_expect_shape(const moe_st *f, const moe_tensor_view *v, const char *name, int ndim,
                                const int64_t *shape);

/* __metadata__ values of a safetensors file (model/layer_io.c): absent keys leave *out as it is; values
 * that do not parse are MOE_ERR_FORMAT naming the file and key. */
moe_status moe__meta_int(const moe_st *f, const char *key, int *out);
moe_status moe__meta_float(const moe_st *f, const char *key, float *out);
moe_status moe__meta_bool(const moe_st *f, const char *key, int *out);
/* The layer options (top_k, capacity_setting, normalize_topk, activation, dispatch, priority,
 * router) to and from __metadata__. */
moe_status moe__layer_meta_read(const moe_st *f, moe_layer_config *c);
moe_status moe__layer_meta_write(const moe_layer_config *c, moe_st_writer *w);

/* layer.c: the layer's parameters (zero, none set yet) moved to a buffer that a file's pages can be
 * mapped into (base/file_map.h), its first byte `phase` bytes into a page; freed by moe_layer_free. */
moe_status moe__layer_params_at(moe_layer_t *l, size_t phase);

/* serve/trace.c: MOE_ERR_ARG, named after the caller fn, unless t is a trace with layer `layer` and
 * steps [s0, s1) in range. */
moe_status moe__trace_check_range(const moe_trace *t, int layer, int64_t s0, int64_t s1, const char *fn);

/* checkpoint_dist.c: moe_checkpoint_save of a model spread over ranks (a collective; rank 0 writes). */
moe_status moe__checkpoint_save_ranks(const char *path, const moe_model_t *m, const moe_optim_t *o,
                                      const moe_train_state *ts);

/* refs.c: the entry of a parameter table (n refs) named `name`, or NULL. */
const moe_tensor_ref *moe__ref_find(const moe_tensor_ref *refs, int n, const char *name);

/* model.c: moe_model_check_finite, scanning the parameters and state for the first bad value only
 * when scan is set (an optimizer pass already found every value finite otherwise); under expert
 * parallelism the ranks agree either way. */
moe_status moe__model_check_finite(const moe_model_t *m, const moe_optim_t *o, int scan);

#endif
