/* libmoe: Mixture-of-Experts layers on CPU (CBLAS + OpenMP).
 *
 * The one public header. Every exported symbol starts with moe_. Functions that can fail return
 * moe_status (0 = ok) and leave a message in moe_last_error(). Tensors are row-major float32 unless
 * said otherwise. The layer semantics are those of docs/DESIGN.md 4.1.
 */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_VERSION "0.1.0"

/* ---- status codes (X-macro: enum, name, description) ---- */
#define MOE_STATUS_LIST(X)                                                \
  X(MOE_OK, "ok")                                                         \
  X(MOE_ERR_ARG, "invalid argument")                                      \
  X(MOE_ERR_SHAPE, "shape mismatch")                                      \
  X(MOE_ERR_DTYPE, "wrong dtype")                                         \
  X(MOE_ERR_VALUE, "invalid value (NaN, Inf or out of range)")            \
  X(MOE_ERR_NOMEM, "out of memory")                                       \
  X(MOE_ERR_IO, "input/output error")                                     \
  X(MOE_ERR_FORMAT, "malformed file")                                     \
  X(MOE_ERR_MISSING, "missing tensor or field")                           \
  X(MOE_ERR_STATE, "call out of order")

typedef enum {
#define MOE__ENUM(e, s) e,
  MOE_STATUS_LIST(MOE__ENUM)
#undef MOE__ENUM
  MOE_STATUS_COUNT
} moe_status;

const char *moe_status_name(moe_status s); /* "MOE_ERR_SHAPE" */
const char *moe_status_str(moe_status s);  /* "shape mismatch" */
/* The message of the last failure on this thread: what failed, naming tensor/field/file and values. */
const char *moe_last_error(void);
/* Records the message (printf's fmt) as this thread's last error and returns st: for code built on
 * libmoe (the plots of plot/moe_plot.h) to report its failures where the library's go. */
moe_status moe_last_error_set(moe_status st, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Writes n bytes to path atomically, as every file the library writes: path.tmp.<pid>, flushed and
 * fsynced, then renamed to path; on failure path is left as it was (MOE_ERR_IO names both files).
 * A path.tmp.<pid> that a killed writer left (its pid gone, its lock free) is removed first. */
moe_status moe_write_file_atomic(const char *path, const void *data, size_t n);

/* ---- safetensors (strict reader, atomic writer) ---- */
typedef enum { MOE_DT_F32, MOE_DT_I32, MOE_DT_BF16, MOE_DT_F16, MOE_DT_F64, MOE_DT_I64, MOE_DT_U8,
               MOE_DT_COUNT } moe_dtype;
const char *moe_dtype_name(moe_dtype dt); /* "F32" as in safetensors */
size_t moe_dtype_size(moe_dtype dt);

/* bfloat16, the upper half of a float32 (uint16_t bits). To bf16 rounds to nearest even, as
 * PyTorch's .to(torch.bfloat16); NaN stays NaN. To f32 is exact. */
void moe_bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void moe_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
/* The experts' compute dtype from "f32" or "bf16" (MOE_ERR_ARG naming `field` otherwise), and back. */
moe_status moe_dtype_parse(const char *s, const char *field, moe_dtype *out);
const char *moe_compute_dtype_name(moe_dtype dt);
/* 1 when bf16 GEMMs run on the CPU's AVX512-BF16 instructions; 0 when this CPU (or DNNL_MAX_CPU_ISA)
 * lacks them and they take a correct but slower path (said once on stderr when first used). */
int moe_bf16_native(void);

#define MOE_MAX_DIMS 8
typedef struct {
  const char *name;
  moe_dtype dtype;
  int ndim;
  int64_t shape[MOE_MAX_DIMS];
  const void *data; /* a 64-byte aligned copy of the file's data; NULL when opened lazily */
  size_t nbytes;
  uint64_t file_offset; /* where the tensor's bytes start in the file */
} moe_tensor_view;

typedef struct moe_st moe_st; /* a loaded, validated safetensors file (opaque) */
/* Loads and validates the whole file: header length bounded, JSON well-formed, dtypes known, shapes
 * consistent with byte counts, offsets in range, sorted-free and non-overlapping, data fully covered. */
moe_status moe_st_open(moe_st **out, const char *path);
/* The same checks without reading the data region: views have data NULL; read with moe_st_read.
 * For files larger than memory, and for the slow tier of expert buffering. */
moe_status moe_st_open_lazy(moe_st **out, const char *path);
/* Copies n bytes of tensor v from byte `off` into dst: from memory, or with pread when lazy. */
moe_status moe_st_read(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, void *dst);
void moe_st_close(moe_st *f);
const char *moe_st_path(const moe_st *f);
int moe_st_count(const moe_st *f);
moe_status moe_st_at(const moe_st *f, int i, moe_tensor_view *v); /* i in [0, count) */
/* Returns MOE_ERR_MISSING (message names tensor and file) when absent. */
moe_status moe_st_get(const moe_st *f, const char *name, moe_tensor_view *v);
int moe_st_has(const moe_st *f, const char *name);
/* Values [off, off + n) of an F32 or BF16 tensor as float32, from memory or, opened lazily, from the
 * file; MOE_ERR_DTYPE naming file and tensor for other dtypes. moe_st_get_f32: the whole tensor
 * `name`, which must hold n values. */
moe_status moe_st_view_f32(const moe_st *f, const moe_tensor_view *v, size_t off, size_t n, float *dst);
moe_status moe_st_get_f32(const moe_st *f, const char *name, float *dst, size_t n);
/* __metadata__ string value or NULL. */
const char *moe_st_meta(const moe_st *f, const char *key);

/* Bytes [off, off + n) of a tensor's stored data into dst, for a writer's filled tensor
 * (moe_st_writer_add_fill, moe_gguf_writer_add_tensor_fill): off a multiple of the tensor's chunk and n
 * the chunk but for the last. The writer makes every filled tensor at save, its chunks in order in one
 * buffer of the largest chunk, each written before the next is made; a fill's error (its message kept)
 * ends the save, the file unwritten. */
typedef moe_status (*moe_fill_fn)(void *ctx, size_t off, void *dst, size_t n);

typedef struct moe_st_writer moe_st_writer; /* collects tensors, then writes atomically */
moe_status moe_st_writer_new(moe_st_writer **out);
void moe_st_writer_free(moe_st_writer *w);
/* data is copied. shape has ndim entries. */
moe_status moe_st_writer_add(moe_st_writer *w, const char *name, moe_dtype dt, int ndim,
                             const int64_t *shape, const void *data);
/* Adds float32 data stored as dt: MOE_DT_F32, or MOE_DT_BF16 (rounded to nearest even); other dtypes
 * are MOE_ERR_ARG. Copied. */
moe_status moe_st_writer_add_f32(moe_st_writer *w, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                                 const float *data);
/* A tensor whose bytes fill makes at save (moe_fill_fn; chunk 0: the whole tensor in one call). ctx
 * must stay valid until save. */
moe_status moe_st_writer_add_fill(moe_st_writer *w, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                                  size_t chunk, moe_fill_fn fill, void *ctx);
moe_status moe_st_writer_meta(moe_st_writer *w, const char *key, const char *value);
/* Writes path.tmp.<pid>, flushes and fsyncs it, then renames it to path. */
moe_status moe_st_writer_save(moe_st_writer *w, const char *path);

/* ---- GGUF (llama.cpp's format, version 3): tensor types, reader, writer (DESIGN 4.8) ----
 * Tensor element types by their ggml ids (the values GGUF files store). Every id ggml defines has its
 * block size and name (so files with any of them open and list), but only the types below have a
 * codec: moe_gguf_dequantize and moe_gguf_quantize refuse the others with MOE_ERR_DTYPE. */
typedef enum {
  MOE_GGUF_F32 = 0, MOE_GGUF_F16 = 1, MOE_GGUF_Q4_0 = 2, MOE_GGUF_Q8_0 = 8, MOE_GGUF_Q4_K = 12,
  MOE_GGUF_Q5_K = 13, MOE_GGUF_Q6_K = 14, MOE_GGUF_BF16 = 30, MOE_GGUF_MXFP4 = 39
} moe_gguf_type;
/* "Q4_K" as ggml names it; NULL for an id ggml does not define (or no longer does). */
const char *moe_gguf_type_name(moe_gguf_type t);
/* The type named s (case-insensitive, "q8_0" or "Q8_0"), any ggml type; MOE_ERR_ARG naming `field`. */
moe_status moe_gguf_type_parse(const char *s, const char *field, moe_gguf_type *out);
/* Values per block (1 for F32/F16/BF16, 32 for Q8_0/Q4_0/MXFP4, 256 for the K-quants) and bytes per
 * block; 0 for an unknown id. A row of n values (n a multiple of the block) takes
 * n / block * block_bytes bytes. */
int moe_gguf_type_block(moe_gguf_type t);
size_t moe_gguf_type_block_bytes(moe_gguf_type t);
/* 1 when the type has a codec here (the nine of moe_gguf_type). */
int moe_gguf_type_supported(moe_gguf_type t);
/* n values (a multiple of the type's block) from stored bytes to float32, as ggml dequantizes them
 * (K-quants: (d * scale) * q - dmin * min per sub-block; MXFP4: e2m1 value * 2^(e - 127)). */
moe_status moe_gguf_dequantize(moe_gguf_type t, const void *src, float *dst, int64_t n);
/* n float32 values to the type, by round-to-nearest reference quantizers (Q8_0: scale amax / 127;
 * Q4_0: scale max / -8; K-quants: a least-squares search of each sub-block's scale (and min), the
 * scales quantized to 6 or 8 bits under an f16 super-block scale; MXFP4: a power-of-two scale from
 * amax, each value to the nearest e2m1). MOE_ERR_VALUE for a non-finite value, or one beyond +-65504
 * for the types with f16 values or scales. */
moe_status moe_gguf_quantize(moe_gguf_type t, const float *src, void *dst, int64_t n);

/* Metadata value types (the ids files store). */
typedef enum {
  MOE_GGUFV_U8, MOE_GGUFV_I8, MOE_GGUFV_U16, MOE_GGUFV_I16, MOE_GGUFV_U32, MOE_GGUFV_I32, MOE_GGUFV_F32,
  MOE_GGUFV_BOOL, MOE_GGUFV_STRING, MOE_GGUFV_ARRAY, MOE_GGUFV_U64, MOE_GGUFV_I64, MOE_GGUFV_F64,
  MOE_GGUFV_COUNT
} moe_gguf_vtype;
const char *moe_gguf_vtype_name(moe_gguf_vtype t); /* "u32", "string", "array", ... */

/* One metadata entry: a scalar (n = 1) or an array of n values of elem_type (an array of arrays has
 * elem_type MOE_GGUFV_ARRAY: it is read and checked, but its values are not accessible). */
typedef struct {
  const char *key;
  moe_gguf_vtype type, elem_type; /* elem_type == type for scalars */
  uint64_t n;
} moe_gguf_kv;

/* A tensor as stored: ne[0] is the row length (the innermost dimension, ggml's order, the reverse of
 * PyTorch's shape), ne[1..ndim) the outer ones; data points into the mapped file. */
typedef struct {
  const char *name;
  moe_gguf_type type;
  int ndim;               /* 1..4 */
  int64_t ne[4];          /* unused dimensions are 1 */
  int64_t nrows;          /* ne[1] * ne[2] * ne[3] */
  const void *data;       /* aligned to the file's alignment (relative to the mapping) */
  size_t nbytes;
  uint64_t file_offset;   /* where data starts in the file */
} moe_gguf_tensor;

typedef struct moe_gguf moe_gguf; /* an open, validated GGUF file (mmap'd, read-only) */
/* Maps the file and checks all of it before returning: magic, version 3, counts, every key and value
 * (types known, strings and arrays within the file, keys unique, printable ASCII), general.alignment
 * (a power of two, u32), the tensor infos (names unique and at most 64 bytes, 1-4 dims, known types,
 * rows a multiple of the block, sizes without overflow) and the data (offsets aligned, inside the
 * file, not overlapping). MOE_ERR_FORMAT (MOE_ERR_DTYPE for an unknown tensor type) naming the file,
 * the field, key or tensor and the value. */
moe_status moe_gguf_open(moe_gguf **out, const char *path);
void moe_gguf_close(moe_gguf *g);
const char *moe_gguf_path(const moe_gguf *g);
uint32_t moe_gguf_alignment(const moe_gguf *g);
uint64_t moe_gguf_data_offset(const moe_gguf *g); /* file offset of the tensor data section */

int64_t moe_gguf_kv_count(const moe_gguf *g);
moe_status moe_gguf_kv_at(const moe_gguf *g, int64_t i, moe_gguf_kv *kv); /* i in [0, count) */
int64_t moe_gguf_find_key(const moe_gguf *g, const char *key);            /* its index, or -1 */
/* Element j of entry i (j = 0 for a scalar): as an integer (any integer type or bool; MOE_ERR_VALUE for
 * a u64 beyond INT64_MAX), as a double (any numeric type), or as a string (NUL-terminated; len, when
 * not NULL, counts embedded NULs too). MOE_ERR_DTYPE naming the key otherwise. */
moe_status moe_gguf_kv_int(const moe_gguf *g, int64_t i, uint64_t j, int64_t *out);
moe_status moe_gguf_kv_float(const moe_gguf *g, int64_t i, uint64_t j, double *out);
moe_status moe_gguf_kv_str(const moe_gguf *g, int64_t i, uint64_t j, const char **s, size_t *len);
/* Scalars by key: MOE_ERR_MISSING when absent, MOE_ERR_DTYPE when of another kind (an integer getter
 * takes any integer type whose value fits: files store counts as u32 or u64), MOE_ERR_VALUE when it
 * does not fit; each naming the file, the key, its type and value. f32 takes f32 or f64. */
moe_status moe_gguf_get_u32(const moe_gguf *g, const char *key, uint32_t *out);
moe_status moe_gguf_get_i32(const moe_gguf *g, const char *key, int32_t *out);
moe_status moe_gguf_get_u64(const moe_gguf *g, const char *key, uint64_t *out);
moe_status moe_gguf_get_f32(const moe_gguf *g, const char *key, float *out);
moe_status moe_gguf_get_bool(const moe_gguf *g, const char *key, int *out);
moe_status moe_gguf_get_str(const moe_gguf *g, const char *key, const char **out);
/* Arrays by key: their length and element type; then elements j in [0, n) of an array of strings,
 * of integers (into int64_t) or of floats (f32/f64 into float). */
moe_status moe_gguf_get_arr(const moe_gguf *g, const char *key, moe_gguf_vtype *elem_type, uint64_t *n);
moe_status moe_gguf_get_arr_str(const moe_gguf *g, const char *key, uint64_t j, const char **s, size_t *len);
moe_status moe_gguf_get_arr_int(const moe_gguf *g, const char *key, int64_t *dst, uint64_t n);
moe_status moe_gguf_get_arr_f32(const moe_gguf *g, const char *key, float *dst, uint64_t n);

int64_t moe_gguf_tensor_count(const moe_gguf *g);
moe_status moe_gguf_tensor_at(const moe_gguf *g, int64_t i, moe_gguf_tensor *t); /* in file order */
/* MOE_ERR_MISSING naming the tensor and the file when absent. */
moe_status moe_gguf_tensor_get(const moe_gguf *g, const char *name, moe_gguf_tensor *t);
int moe_gguf_has_tensor(const moe_gguf *g, const char *name);
/* Row r (of t->nrows) as ne[0] floats; MOE_ERR_DTYPE naming the file and tensor for a type without a
 * codec. */
moe_status moe_gguf_tensor_row_f32(const moe_gguf *g, const moe_gguf_tensor *t, int64_t r, float *dst);

/* Collects metadata and tensors, then writes a GGUF v3 file atomically. Keys are written in the order
 * first set (setting a key again replaces its value in place); tensors in the order added, each at an
 * offset aligned to general.alignment (32 unless set, as a u32), padded with zeros. */
typedef struct moe_gguf_writer moe_gguf_writer;
moe_status moe_gguf_writer_new(moe_gguf_writer **out);
void moe_gguf_writer_free(moe_gguf_writer *w);
moe_status moe_gguf_writer_set_u32(moe_gguf_writer *w, const char *key, uint32_t v);
moe_status moe_gguf_writer_set_i32(moe_gguf_writer *w, const char *key, int32_t v);
moe_status moe_gguf_writer_set_u64(moe_gguf_writer *w, const char *key, uint64_t v);
moe_status moe_gguf_writer_set_f32(moe_gguf_writer *w, const char *key, float v);
moe_status moe_gguf_writer_set_bool(moe_gguf_writer *w, const char *key, int v);
moe_status moe_gguf_writer_set_str(moe_gguf_writer *w, const char *key, const char *v);
moe_status moe_gguf_writer_set_arr_str(moe_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
moe_status moe_gguf_writer_set_arr_i32(moe_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
moe_status moe_gguf_writer_set_arr_f32(moe_gguf_writer *w, const char *key, const float *v, uint64_t n);
/* Entry i of an open file, whatever its type, as it is stored there. */
moe_status moe_gguf_writer_copy_kv(moe_gguf_writer *w, const moe_gguf *g, int64_t i);
/* A tensor of ndim (1-4) dims ne (ggml's order, ne[0] the row length, a multiple of the type's
 * block) and nbytes bytes of stored data. The data is NOT copied: it must stay valid until save. */
moe_status moe_gguf_writer_add_tensor(moe_gguf_writer *w, const char *name, moe_gguf_type type, int ndim,
                                      const int64_t *ne, const void *data, size_t nbytes);
/* A tensor whose stored bytes fill makes at save (moe_fill_fn; chunk 0: the whole tensor in one call);
 * its size follows from ne and type. ctx must stay valid until save. */
moe_status moe_gguf_writer_add_tensor_fill(moe_gguf_writer *w, const char *name, moe_gguf_type type, int ndim,
                                           const int64_t *ne, size_t chunk, moe_fill_fn fill, void *ctx);
moe_status moe_gguf_writer_save(moe_gguf_writer *w, const char *path);
/* llama.cpp's general.file_type (enum llama_ftype) of a file whose weights are of type t (the K-quants'
 * all-one-type variants: Q4_K_S 14, Q5_K_S 16; MXFP4: MOSTLY_MXFP4_MOE 38); -1 for a type without a codec. */
int moe_gguf_file_type(moe_gguf_type t);

/* ---- datasets: IDX files (the MNIST format) ---- */
typedef struct {
  int n;           /* samples */
  int rows, cols;  /* image size; features = rows * cols */
  int classes;     /* largest label + 1 */
  float *images;   /* (n, rows * cols) pixel / 255, in [0, 1] */
  uint8_t *labels; /* (n) */
} moe_dataset;
/* Reads an IDX3 ubyte image file and an IDX1 ubyte label file, strictly: magic numbers, dimensions
 * against the file size, and matching counts; errors name the file and the field. */
moe_status moe_dataset_load_idx(moe_dataset *d, const char *images_path, const char *labels_path);
void moe_dataset_free(moe_dataset *d);
/* The validation split: the last n samples of d copied into val, d keeping the others. MOE_ERR_ARG
 * when n is not in [1, d->n - 1]. */
moe_status moe_dataset_hold_out(moe_dataset *d, int n, moe_dataset *val);

/* ---- processes: MPI when built with it, else one process ----
 * moe_dist_init calls MPI_Init (when the library has MPI) and describes this process's place among
 * the ranks; a layer given a moe_dist in its config runs expert-parallel over them. */
typedef struct moe_dist moe_dist;
moe_status moe_dist_init(moe_dist **out, int *argc, char ***argv);
void moe_dist_finalize(moe_dist *d); /* MPI_Finalize; NULL is fine */
int moe_dist_rank(const moe_dist *d);
int moe_dist_size(const moe_dist *d);
int moe_dist_has_mpi(void);
/* Ends every rank with `code` (MPI_Abort): one rank's failure must not leave the others waiting in
 * a collective. Returns only without MPI. */
void moe_dist_abort(const moe_dist *d, int code);
/* The all-to-all of the token exchange: Linear (MPI_Alltoallv) or 2DH (Tutel's two-phase, intra-node
 * then inter-node); ranks_per_node 0 = the real nodes (MPI_COMM_TYPE_SHARED), else an override so
 * that 2DH runs on one machine. Collective: every rank calls it with the same arguments. */
typedef enum { MOE_A2A_LINEAR, MOE_A2A_2DH } moe_a2a;
moe_status moe_dist_set_a2a(moe_dist *d, moe_a2a algo, int ranks_per_node);
/* Sums a (n) doubles over all ranks, in place. */
moe_status moe_dist_allreduce(const moe_dist *d, double *a, int n);
/* Rank 0 gets the concatenation over ranks of each rank's `n` floats (n may differ per rank); out is
 * used on rank 0 only and must hold the total. */
moe_status moe_dist_gather(const moe_dist *d, const float *a, int n, float *out);
/* Start-up check that every rank runs the same configuration (options, shapes, data sizes, dtype,
 * seed): rank r's n settings against rank 0's, by value. Collective: every rank calls it with the same
 * names in the same order, before any other collective (ranks that disagree would hang in one or
 * compute wrong answers). MOE_ERR_ARG on every rank when any differs, naming the first rank that does,
 * the setting and both texts ("rank 1 has --epochs = 3, rank 0 has 1"). */
typedef struct {
  const char *name;  /* e.g. "--epochs", "train images" */
  double value;      /* compared exactly: an integer up to 2^53, a float, an enum, a hash */
  const char *text;  /* shown in the message (NULL: the value); 31 characters are carried */
} moe_dist_setting;
moe_status moe_dist_agree(const moe_dist *d, const moe_dist_setting *s, int n);

/* ---- the MoE layer ---- */
/* MOE_ACT_SWIGLU_OAI ("swiglu_oai"): gpt-oss's clamped SwiGLU of gate a1 = fc1 x and up a3 = fc3 x,
 *   g = min(a1, limit), u = clamp(a3, -limit, limit), h = (u + 1) g sigmoid(alpha g),
 * alpha and limit from the config (swiglu_alpha, swiglu_limit); the gradient is 0 where a value was
 * clamped (torch's clamp). With expert_bias its experts have experts.fc3.bias too. */
typedef enum { MOE_ACT_RELU, MOE_ACT_GELU, MOE_ACT_SILU, MOE_ACT_SWIGLU, MOE_ACT_SWIGLU_OAI } moe_act;
typedef enum { MOE_DISPATCH_DYNAMIC, MOE_DISPATCH_STATIC } moe_dispatch;
typedef enum { MOE_PRIORITY_INDEX, MOE_PRIORITY_SCORE } moe_priority;
typedef enum { MOE_ROUTER_LINEAR, MOE_ROUTER_COSINE } moe_router;
typedef enum { MOE_REUSE_NONE, MOE_REUSE_S4, MOE_REUSE_S2, MOE_REUSE_S3, MOE_REUSE_AUTO } moe_reuse;
typedef enum { MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID } moe_score;
typedef enum { MOE_GROUP_MAX, MOE_GROUP_TOP2_SUM } moe_group_score;

const char *moe_act_name(moe_act a);
const char *moe_dispatch_name(moe_dispatch d);
const char *moe_priority_name(moe_priority p);
const char *moe_router_name(moe_router r);
const char *moe_reuse_name(moe_reuse r);
const char *moe_score_name(moe_score s);             /* "softmax", "sigmoid" */
const char *moe_group_score_name(moe_group_score g); /* "max", "top2_sum" */
/* Parse the names above ("relu", "static", ...); MOE_ERR_ARG naming `field` on an unknown value. */
moe_status moe_act_parse(const char *s, const char *field, moe_act *out);
moe_status moe_dispatch_parse(const char *s, const char *field, moe_dispatch *out);
moe_status moe_priority_parse(const char *s, const char *field, moe_priority *out);
moe_status moe_router_parse(const char *s, const char *field, moe_router *out);
moe_status moe_reuse_parse(const char *s, const char *field, moe_reuse *out); /* "none", "s4", "auto" */
moe_status moe_score_parse(const char *s, const char *field, moe_score *out);
moe_status moe_group_score_parse(const char *s, const char *field, moe_group_score *out);

typedef struct {
  int D;                  /* model dim */
  int H;                  /* expert hidden dim */
  int E;                  /* experts */
  int top_k;              /* 1 <= k <= E; may be changed per call with moe_layer_set_top_k */
  float capacity_setting; /* >0 fixed factor, 0 minimal no-drop, <0 adaptive bounded by -x (static only) */
  int normalize_topk;     /* 1, 0, or -1 = auto (true iff k > 1) */
  moe_act act;
  moe_dispatch dispatch;
  moe_priority priority;
  moe_router router;
  int proj_dim;           /* cosine router projection dim, default 256 */
  int gate_bias;          /* linear router has gate.bias (E) */
  int expert_bias;        /* experts have fc1.bias / fc2.bias */
  int threads;            /* OpenMP and BLAS threads; 0 = all cores */
  int inner_experts;      /* hierarchical MoE (DynaMoE): > 0 makes each expert an MoE layer of this
                             many FFN experts with its own router; 0 = FFN experts */
  int inner_top_k;        /* k of the inner layers (which normalize their weights when it is > 1) */
  const moe_dist *dist;   /* expert parallelism: each of the W ranks routes its own tokens and holds
                             experts [rank*E/W, (rank+1)*E/W); NULL = one process */
  int external_experts;   /* serving: no expert tensors in the layer; their weights come through an
                             expert cache (moe_layer_set_expert_cache); forward only */
  moe_dtype dtype;        /* the experts' GEMMs: MOE_DT_F32 (default), or MOE_DT_BF16: bf16 weights
                             and GEMM inputs, fp32 accumulation and outputs; the fp32 parameters stay
                             the master copy (see moe_layer_params_changed) */
  int pipeline;           /* MPipeMoE: the experts' stage runs as this many micro-batches, each a run of
                             experts (dynamic dispatch; expert-parallel, each its own exchange, and
                             every rank must give the same n); 1 = the whole batch at once (default);
                             0 = adaptive: Tutel's dictionary (moe_layer_setup) picks n per capacity
                             from timed trial steps (stats.pipeline says which). Outputs, losses and all
                             gradients are the same bits for every n */
  moe_reuse memory_reuse; /* with pipeline > 1: what backward restores instead of keeping (MPipeMoE
                             Table II on a CPU, where offloading to host memory keeps the tensor):
                             MOE_REUSE_NONE keeps every micro-batch's tensors; S3 keeps one micro-
                             batch's fc1/fc3/activation buffer (T_M) and recomputes it in backward;
                             S2 keeps the received rows (T_DI) and the expert outputs (T_DO) of two
                             micro-batches only and receives T_DI again in backward (expert-parallel;
                             in one process T_DI is the dispatch rows, kept); S4 does both; AUTO:
                             the strategy MPipeMoE's Eq. 10 models fastest among those whose
                             workspace fits memory_budget, from the experts' GEMM and exchange rates
                             measured over the first step (run with S4) and summed over the ranks,
                             so every rank picks alike (stats.memory_reuse says which) */
  size_t memory_budget;   /* memory_reuse AUTO: the bytes the layer's workspace may reserve (its
                             routing and expert buffers, of which moe_layer_peak_bytes reports the
                             part a step used); when no strategy fits, S4 */
  int parallel_r;         /* Tutel's adaptive parallelism (with dist, dynamic dispatch, pipeline 1 or 0):
                             MOE_PARALLEL_OFF (default) is expert parallelism with whole experts per
                             rank; otherwise every rank holds a shard of every expert (see the section
                             "Adaptive parallelism r" below) and runs r = 0 (weights all-gathered,
                             tokens local), 1 <= r <= ceil(W/E) (clipped), or -1: chosen per capacity */
  int replica_slots;      /* FlexMoE (expert-parallel, dynamic dispatch, one micro-batch): each rank has
                             this many expert slots E_v >= E/W, holding replicas of hot experts that
                             moe_flex_trainer places; its expert tensors have E_v rows, the distinct
                             experts it holds in ascending id, then zeros. 0 = off: block ownership */
  int a2a_auto;           /* expert-parallel: Tutel's dictionary picks Linear or 2DH per capacity
                             (moe_layer_setup); 2DH needs the grid moe_dist_set_a2a(2DH) makes, and
                             is offered only with more than one node of more than one rank */
  /* The routers and shared experts of open MoE models (DESIGN 4.1b). */
  moe_score score;        /* the router's scores: MOE_SCORE_SOFTMAX over all experts (default: Mixtral,
                             Qwen, OLMoE; gpt-oss's softmax over the k selected logits is this with
                             normalize_topk 1, equal in exact arithmetic), or MOE_SCORE_SIGMOID
                             (DeepSeek-V3): each expert's score is sigmoid(logit), and the balance loss
                             takes the scores normalized per token in place of probabilities */
  int select_bias;        /* gate.select_bias (E): added to the scores to choose the groups and the top-k,
                             not to the combine weights (DeepSeek-V3's e_score_correction_bias); not
                             trained by gradient: moe_layer_balance_bias moves it */
  int n_group;            /* group-limited selection: the experts as n_group groups of E / n_group in id
                             order; the topk_group groups of best group score kept and the top-k chosen
                             among their experts (the others' scores taken as 0, as transformers'
                             DeepSeek code does); 0 = off */
  int topk_group;
  moe_group_score group_score; /* a group's score: its best expert's (MAX, DeepSeek-V2) or the sum of its
                                  best two (TOP2_SUM, V3), from the scores with the selection bias */
  float routed_scale;     /* the combine weights times this after any renormalization
                             (routed_scaling_factor); 1 by default */
  int shared_H;           /* shared experts: the width of one always-on FFN (the layer's activation, no
                             biases; n shared experts of width h are one of width n h) whose output is
                             added to the routed output of every token; 0 = none */
  int shared_gate;        /* the shared output scaled per token by sigmoid(shared.gate.weight . x)
                             (Qwen2-MoE's shared_expert_gate) */
  float swiglu_alpha;     /* act swiglu_oai: the sigmoid's gain (1.702 by default) and the clamp */
  float swiglu_limit;     /* (7.0 by default), gpt-oss's swiglu_alpha and swiglu_limit */
  float seq_aux_alpha;    /* DeepSeek-V3's sequence-wise balance loss (its paper, eq. 17-20), which
                             moe_layer_backward differentiates along with the output: alpha times the
                             mean over the sequences of sum_i f_i P_i, f_i = E / (k T_s) x the tokens
                             of the sequence that chose expert i (any of the k slots, before dropping),
                             P_i = the mean over its tokens of the scores normalized per token (the
                             probabilities, with softmax scores); stats.seq_aux_loss; 0 = off. One
                             process, FFN experts only */
  int seq_len;            /* the sequences of that loss: tokens [s seq_len, (s + 1) seq_len) of a forward
                             (T a multiple of it); 0 = the whole forward is one sequence */
  int expert_type;        /* -1 (default) or MOE_GGUF_F32: the experts are fp32 parameters, computed in
                             dtype. A moe_gguf_type with kernels (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
                             MXFP4, BF16, F16):
                             the experts' weights are bytes of that type, for inference (backward is
                             MOE_ERR_ARG), given with moe_layer_bind_experts; the parameter table then
                             has no experts.*.weight (experts.fc1/fc2/fc3.bias stay fp32). It is fc1's
                             type: needs D a multiple of its block (fc2's type, H), dtype f32, pipeline 1, no dist, no inner
                             experts; with external_experts, an expert cache whose slots hold the
                             stored types' bytes (moe_lm_load_streaming of a GGUF file). See also
                             moe_layer_quantize_experts */
} moe_layer_config;

/* Defaults: k=2, capacity 1.0, normalize auto, relu, dynamic, index, linear, proj 256, biases on,
 * pipeline 1, no memory reuse, softmax scores, no groups, routed_scale 1, no shared experts,
 * swiglu_alpha 1.702, swiglu_limit 7. */
void moe_layer_config_default(moe_layer_config *c);

/* Parameters and their gradients live in one allocation each, described by a table of named tensors:
 *   gate.weight        (E, D) linear, (E, P) cosine: the expert embeddings
 *   gate.bias          (E)            linear router with gate_bias
 *   gate.proj.weight   (P, D)         cosine router
 *   gate.proj.bias     (P)            cosine router
 *   gate.logit_scale   (1)            cosine router: logits are multiplied by exp(min(s, ln 100))
 *   experts.fc1.weight (E, H, D)   experts.fc1.bias (E, H)
 *   experts.fc2.weight (E, D, H)   experts.fc2.bias (E, D)
 *   experts.fc3.weight (E, H, D)   swiglu and swiglu_oai only
 *   experts.fc3.bias   (E, H)         swiglu_oai with expert_bias (gpt-oss's up-projection bias)
 *   gate.select_bias   (E)            select_bias: not trained (moe_layer_balance_bias)
 *   shared.fc1.weight  (Hs, D)        shared_H = Hs > 0: the shared FFN (fc3 only for swiglu)
 *   shared.fc3.weight  (Hs, D)        shared.fc2.weight (D, Hs)
 *   shared.gate.weight (1, D)         shared_gate
 * Expert-parallel, the experts.* tensors hold this rank's E/W experts: (E/W, H, D) and so on. */
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[3];
  size_t offset; /* in floats, into params and grads */
  size_t numel;
} moe_param_info;

typedef struct moe__layer_state moe__layer_state; /* internal: the layer's private state (src/layer/layer.c) */

/* A hierarchical layer (inner_experts > 0) has only the gate tensors itself; expert e is the MoE
 * layer inner[e] (D, H, inner_experts, inner_top_k, the same options otherwise). Its aux_loss and
 * z_loss are the outer layer's plus the sums of the inner layers'. */
typedef struct moe_layer {
  moe_layer_config cfg;
  struct moe_layer *inner; /* (E) inner layers, or NULL */
  struct moe_expert_cache *cache; /* serving: where the experts' weights come from, or NULL */
  int32_t *expert_capacity;       /* (E) per-expert capacities for static dispatch, or NULL */
  int expert_capacity_tokens;     /* the batch (tokens) they are for; 0: for any batch */
  const int32_t *cached;          /* (T, k) experts for the next forward only, or NULL */
  int cached_T;
  int nparams;
  moe_param_info info[16];
  size_t numel;  /* total parameter floats */
  float *params; /* (numel) */
  float *grads;  /* (numel); backward adds into it */
  moe__layer_state *st;
} moe_layer_t;

/* Per-call results of the forward pass. */
typedef struct {
  float aux_loss;      /* GShard balance loss, DESIGN 4.1 */
  float z_loss;        /* mean over tokens of logsumexp(logits)^2 */
  int capacity;        /* C used (static dispatch), or the largest expert count (dynamic) */
  int dropped;         /* assignments dropped for capacity */
  const int32_t *expert_counts; /* (E) assignments per expert before dropping; valid until next forward */
  const int32_t *experts;       /* (T, k) expert of each slot, slot 0 the most probable */
  const float *weights;         /* (T, k) combine weights (after normalize_topk) */
  const int32_t *fresh;         /* (T, k) the router's own top-k, which differs from experts under
                                   sample-assignment caching */
  int router_overlapped;        /* the router ran alongside the experts: cached experts, priority
                                   index, the layer's own experts (not inner layers nor a cache) */
  int pipeline;                 /* micro-batches this forward ran (pipeline 0: the adaptive choice) */
  int pipeline_trial;           /* the layer's dictionary (moe_layer_setup) tried a setup, not its entry */
  moe_reuse memory_reuse;       /* the strategy this forward ran (memory_reuse AUTO: its choice) */
  double router_seconds;        /* this forward's router (gate logits, softmax, top-k, losses), apart
                                   from what ran alongside the experts */
  float seq_aux_loss;           /* seq_aux_alpha > 0: the sequence-wise balance loss, alpha included */
} moe_layer_stats;

moe_status moe_layer_init(moe_layer_t *l, const moe_layer_config *cfg);
void moe_layer_free(moe_layer_t *l);
/* Initializes parameters from seed (uniform +-1/sqrt(fan_in), biases 0, logit scale ln(1/0.07)). */
void moe_layer_init_params(moe_layer_t *l, uint64_t seed);
float *moe_layer_param(moe_layer_t *l, const char *name);      /* NULL if the layer has none */
float *moe_layer_grad(moe_layer_t *l, const char *name);
const moe_param_info *moe_layer_param_find(const moe_layer_t *l, const char *name);
void moe_layer_zero_grad(moe_layer_t *l);
/* Tells a bf16 layer that its fp32 parameters changed (an optimizer step, a write through
 * moe_layer_param): the bf16 copies of the expert weights are made again before the next forward.
 * A new layer (moe_layer_init, moe_layer_load) starts with the copies due and moe_layer_init_params
 * calls it; any other writer of the parameters must. */
void moe_layer_params_changed(moe_layer_t *l);
moe_status moe_layer_set_top_k(moe_layer_t *l, int k);
/* DeepSeek-V3's aux-loss-free balancing (select_bias), called after a step: each expert's
 * gate.select_bias moves by gamma towards balance, down when the last forward gave it more assignments
 * (all k slots, before any dropping) than the mean over the experts, up when fewer, unchanged when
 * equal; the counts summed over the ranks (a collective when expert-parallel). MOE_ERR_STATE without
 * select_bias or before a forward. */
moe_status moe_layer_balance_bias(moe_layer_t *l, float gamma);
/* DynaMoE's per-expert capacities (static dispatch): expert e keeps at most cap[e] assignments in a
 * batch of `tokens` tokens (over all ranks, expert-parallel), and cap[e] T / tokens (rounded up) in a
 * batch of T; tokens = 0: cap[e] whatever the batch. They override capacity_setting; NULL returns to
 * it. Copied. Only the workspace whose size changes is reallocated, at the next forward; weights are
 * untouched. */
moe_status moe_layer_set_expert_capacity(moe_layer_t *l, const int32_t *cap, int tokens);
/* DynaMoE 4.2, sample-assignment caching: the next forward (only) sends token t's slot j to expert
 * experts[t k + j] (checked: ids in range, distinct per token) instead of the router's top-k; the
 * combine weights are still the gate's probabilities of those experts. The array must stay valid until
 * that forward. stats.fresh reports what the router chose, for the cache of the next epoch. */
moe_status moe_layer_set_cached_experts(moe_layer_t *l, const int32_t *experts, int T);
/* Changes threads for later calls (0 = all cores). */
void moe_layer_set_threads(moe_layer_t *l, int threads);
/* Quantized experts (DESIGN 4.8b): forward only, each expert's rows dotted with the rows of its tokens
 * quantized per block (Q8_0 blocks for Q8_0, Q4_0 and MXFP4 weights, ggml's Q8_K for the K-quants), by
 * kernels chosen at run time by the CPU's features (moe_cpu_info names them).
 * moe_layer_quantize_experts: the layer's fp32 experts (experts.fc1/fc2/fc3.weight) quantized to
 * `type` into memory the layer owns, which its forwards then read (cfg.expert_type becomes type); the
 * fp32 parameters stay the master copy: after moe_layer_params_changed they are quantized again before
 * the next forward. Values beyond what the type holds (not finite, or past the f16 range of its scales)
 * are MOE_ERR_VALUE. A layer made with expert_type set has no fp32 experts: MOE_ERR_STATE.
 * moe_layer_bind_experts: the experts' weights are the caller's bytes of type `type` in ggml's layout
 * (a GGUF file's ffn_gate_exps, ffn_down_exps, ffn_up_exps tensors, e.g. mmap'd): fc1 (the gate,
 * ne = [D, H, E]: E H rows of D values), fc2 (the down projection, ne = [H, D, E]), fc3 (the up, ne =
 * [D, H, E]; swiglu and swiglu_oai only, NULL otherwise), not copied: they must stay valid and unchanged while the
 * layer computes with them (until moe_layer_free, or another bind or quantize). Any fp32 experts of the
 * layer are left as they are and not read. Both: backward is MOE_ERR_ARG afterwards; the configuration
 * must allow the type (see expert_type). */
moe_status moe_layer_quantize_experts(moe_layer_t *l, moe_gguf_type type);
moe_status moe_layer_bind_experts(moe_layer_t *l, moe_gguf_type type, const void *fc1, const void *fc2,
                                  const void *fc3);
/* The same with a type for each of fc1, fc2, fc3 (types[2] unused without swiglu or swiglu_oai), as
 * llama.cpp's mixed files (Q4_K_M: some down projections Q6_K beside Q4_K gates; a Q8_0 down projection
 * where H is not a multiple of 256) store them; each type must have kernels and hold its rows in whole
 * blocks (fc1's and fc3's D values, fc2's H). The layer's expert_type becomes fc1's. */
moe_status moe_layer_bind_experts_typed(moe_layer_t *l, const moe_gguf_type types[3], const void *fc1, const void *fc2,
                                        const void *fc3);
/* The type fc (1, 2 or 3) of the layer's experts is computed in: the bound or quantized type, else F32. */
moe_gguf_type moe_layer_expert_type(const moe_layer_t *l, int fc);
/* Changes the micro-batches and memory strategy for later calls (checked as in the config). */
moe_status moe_layer_set_pipeline(moe_layer_t *l, int n, moe_reuse r);

/* x (T, D) -> y (T, D). spec, if not NULL, gets the unweighted per-assignment expert outputs
 * (T*k, D), row t*k+j for slot j of token t, zeros where the assignment was dropped (DynaMoE
 * AggregateSpec). Saves what backward needs; x must stay valid until backward. T = 0 is allowed. */
moe_status moe_layer_forward(moe_layer_t *l, const float *x, int T, float *y, float *spec,
                             moe_layer_stats *stats);
/* Gradients of loss = <dy, y> + daux * aux_loss + dz * z_loss + <dspec, spec> + <dweights, weights>,
 * where weights (T, k) are the combine weights (stats.weights): a loss that weighs each expert's own
 * prediction by its gate (DynaMoE's specification loss) passes their gradient here. dy (T, D), dspec
 * (T*k, D) and dweights (T, k) may be NULL (zero). dx (T, D) is overwritten; parameter gradients are
 * added into l->grads. */
moe_status moe_layer_backward(moe_layer_t *l, const float *dy, float daux, float dz,
                              const float *dspec, const float *dweights, float *dx);
/* Expert-parallel: time spent in, and bytes this rank sent to other ranks by, the exchanges of tokens
 * and gradients (sizes, tokens, outputs) since the last reset; the bytes of static dispatch are its
 * fixed-size buffers. */
typedef struct {
  double seconds;
  double bytes;
  int exchanges;
} moe_comm_stats;
void moe_layer_comm_stats(const moe_layer_t *l, moe_comm_stats *out);
void moe_layer_comm_reset(moe_layer_t *l);
/* Expert-parallel: sums the gradients of the replicated (router) parameters over the ranks, so every
 * rank holds the gradient of the global loss; expert gradients stay on their owner. */
moe_status moe_layer_reduce_grads(moe_layer_t *l);
/* Peak bytes of the layer's workspace arena since init. */
size_t moe_layer_peak_bytes(const moe_layer_t *l);

/* Reads a layer from safetensors: D, H, E (and P, shared_H) from the tensor shapes, options from __metadata__
 * (top_k, capacity_setting, activation, normalize_topk, dispatch, priority, router, score, n_group,
 * topk_group, group_score, routed_scale; select_bias and shared_gate by their tensors), then checks every
 * tensor's dtype and shape. o, if not NULL, is applied after the metadata: a field left at its unset
 * value (see moe_layer_overrides_init) keeps the file's value. */
typedef struct {
  int top_k;              /* -1 unset */
  float capacity_setting; /* NAN unset */
  int normalize_topk;     /* -2 unset, -1 auto, 0, 1 */
  int act, dispatch, priority, router; /* -1 unset */
  int threads;            /* -1 unset */
  int dtype;              /* -1 unset, else a moe_dtype (F32 or BF16): the experts' compute dtype */
  int pipeline;           /* -1 unset, else micro-batches (0: adaptive) */
  int memory_reuse;       /* -1 unset, else a moe_reuse */
  const moe_dist *dist;   /* NULL unset: expert-parallel over these ranks (the file holds all experts) */
  const int32_t *expert_order; /* NULL unset: the layer's expert p is the file's expert order[p] (E
                                  entries, a permutation), e.g. so that a placement's experts for rank
                                  r are the positions [r E/W, (r+1) E/W) that rank owns */
} moe_layer_overrides;
void moe_layer_overrides_init(moe_layer_overrides *o);
/* A NaN or Inf weight is MOE_ERR_VALUE naming the file, the tensor and the first bad index. */
moe_status moe_layer_load(moe_layer_t *l, const moe_st *f, const moe_layer_overrides *o);
/* Adds every parameter (and, with grads, "grad.<name>" tensors) to a writer, config to metadata. */
moe_status moe_layer_save_params(const moe_layer_t *l, moe_st_writer *w);
moe_status moe_layer_save_grads(const moe_layer_t *l, moe_st_writer *w, const char *prefix);

/* ---- a classifier: dense input projection, L pre-norm MoE blocks, LayerNorm and softmax head ----
 *   h0 = x Win^T + bin;  h_{i+1} = h_i + MoE_i(LN_i(h_i));  logits = LN_f(h_L) Whead^T + bhead.
 * Losses (DynaMoE eq. 1 and 2): cooperation = CE(softmax(logits), label); specification = the
 * gate-weighted sum over the last block's k assignments of CE of the prediction made with that
 * expert's output alone (h_{L-1} + out_j in place of h_L). Plus aux_weight * sum of the blocks'
 * balance losses and z_weight * sum of their z-losses. Accuracy always uses the combined output. */
typedef enum { MOE_LOSS_COOPERATION, MOE_LOSS_SPECIFICATION } moe_loss_kind;
const char *moe_loss_name(moe_loss_kind k);
moe_status moe_loss_parse(const char *s, const char *field, moe_loss_kind *out);

typedef struct {
  int in_dim;            /* features per sample */
  int classes;
  int blocks;            /* L >= 1 */
  moe_layer_config moe;  /* D, H, E, k, ... of every block; moe.threads is the model's thread count */
  moe_loss_kind loss;
  float aux_weight;      /* default 0.01 */
  float z_weight;        /* default 0 */
} moe_model_config;
void moe_model_config_default(moe_model_config *c);

/* A named parameter tensor of a model, with its gradient. */
typedef struct {
  char name[64];
  int ndim;
  int64_t shape[3];
  size_t numel;
  float *data, *grad;
} moe_tensor_ref;

typedef struct moe__model_state moe__model_state;
typedef struct {
  moe_model_config cfg;
  moe_layer_t *layers;   /* (L) */
  int nrefs;
  moe_tensor_ref *refs;  /* every parameter, dense ones and the layers', in a fixed order */
  size_t numel;          /* total parameters */
  float *dense, *dense_grad; /* one allocation for the non-MoE parameters */
  moe_st *file;              /* serving: the checkpoint, open lazily for the experts' weights */
  struct moe_expert_cache **caches; /* serving: (L) one expert cache per block */
  moe__model_state *st;
} moe_model_t;

typedef struct {
  double loss;    /* mean over the batch of the training loss (without aux and z terms) */
  double aux, z;  /* sums over blocks */
  int correct;    /* argmax hits (when labels were given) */
  int dropped;    /* assignments dropped, over blocks */
  int capacity_max; /* largest capacity (or expert count) over blocks */
} moe_model_stats;

moe_status moe_model_init(moe_model_t *m, const moe_model_config *c);
void moe_model_free(moe_model_t *m);
void moe_model_init_params(moe_model_t *m, uint64_t seed);
void moe_model_zero_grad(moe_model_t *m);
const moe_tensor_ref *moe_model_find(const moe_model_t *m, const char *name);
/* x (B, in_dim); labels (B) or NULL for inference. Keeps what backward needs. An activation that goes
 * NaN or Inf (a diverged model) is MOE_ERR_VALUE naming the first one: its block, tensor and index;
 * under expert parallelism on every rank, after the forward's collectives. */
moe_status moe_model_forward(moe_model_t *m, const float *x, const uint8_t *labels, int B,
                             moe_model_stats *st);
/* Predicted classes (B) of the last forward. */
const int32_t *moe_model_predictions(const moe_model_t *m);
/* Layer i's stats of the last forward (expert counts for traces). */
const moe_layer_stats *moe_model_layer_stats(const moe_model_t *m, int i);
/* Adds the gradients of the last forward's loss (with labels) into every ref's grad; a non-finite
 * gradient is MOE_ERR_VALUE naming it ("grad.<ref>" and index; on every rank). */
moe_status moe_model_backward(moe_model_t *m);
void moe_model_set_threads(moe_model_t *m, int threads);

/* ---- optimizers over a model's parameters ---- */
typedef enum { MOE_OPT_ADAM, MOE_OPT_SGD } moe_opt_kind;
const char *moe_opt_name(moe_opt_kind k);
moe_status moe_opt_parse(const char *s, const char *field, moe_opt_kind *out);
typedef struct {
  moe_opt_kind kind;
  float beta1, beta2, eps; /* Adam: 0.9, 0.999, 1e-8 */
  float momentum;          /* SGD: 0.9 */
  float weight_decay;      /* on weight matrices only (not biases, norms, scales): decoupled for Adam
                              (AdamW), added to the gradient for SGD; default 0 */
} moe_optim_config;
void moe_optim_config_default(moe_optim_config *c);
typedef struct {
  moe_optim_config cfg;
  int64_t step;      /* updates done */
  size_t n;          /* parameters */
  float *m, *v;      /* (n) Adam moments or SGD velocity (m), in the model's ref order */
} moe_optim_t;
moe_status moe_optim_init(moe_optim_t *o, const moe_optim_config *c, const moe_model_t *m);
/* Whether weight decay applies to r: weight matrices, not biases (experts' are 2-D), norms, scales. */
int moe_param_decays(const moe_tensor_ref *r);
void moe_optim_free(moe_optim_t *o);
void moe_optim_step(moe_optim_t *o, moe_model_t *m, float lr);
/* MOE_ERR_VALUE naming the first parameter, or with o the first optimizer state ("optim.m.<ref>",
 * "optim.v.<ref>"), holding a NaN or Inf, and its index (after an update, say); under expert
 * parallelism a collective whose answer all ranks share. */
moe_status moe_model_check_finite(const moe_model_t *m, const moe_optim_t *o);
/* Learning rate at step s of total: linear warm-up over warmup steps, then cosine decay to 0. */
float moe_lr_schedule(float base, int64_t s, int64_t warmup, int64_t total);

/* ---- checkpoints: safetensors with the parameters, optimizer state and the configuration ---- */
typedef struct {
  int epoch;          /* epochs completed */
  int64_t step;       /* optimizer steps done */
  uint64_t seed;
  char extra[1024];   /* caller's options as "key=value;..." kept in __metadata__["train"] */
} moe_train_state;
/* Writes path atomically. o may be NULL (weights only). A model whose layers run expert-parallel
 * (cfg.moe.dist over W > 1 ranks) is saved by all ranks together: rank 0 gathers every rank's experts
 * and their optimizer state and writes the one-process file (the other ranks return MOE_OK). */
moe_status moe_checkpoint_save(const char *path, const moe_model_t *m, const moe_optim_t *o,
                               const moe_train_state *ts);
/* Builds m (and o when not NULL and the file has optimizer state) from the file. A NaN or Inf in any
 * tensor it reads is MOE_ERR_VALUE naming the file, the tensor and the first bad index (also for
 * moe_checkpoint_load_serving, which scans the experts it leaves in the file once). */
moe_status moe_checkpoint_load(const char *path, moe_model_t *m, moe_optim_t *o, moe_train_state *ts);

/* ---- expert buffering (deployment paper VI): the experts' weights stay in a slow tier (a
 * safetensors file opened with moe_st_open_lazy, read with pread) and K slots in memory hold the
 * ones in use. Per batch, the active experts (tokens > 0) are made resident in increasing id order;
 * a loader thread reads misses while the experts already resident compute. Outputs equal the
 * all-resident layer's bit for bit. */
typedef struct moe_expert_cache moe_expert_cache;
typedef enum { MOE_CACHE_LIFO, MOE_CACHE_LRU, MOE_CACHE_FIFO, MOE_CACHE_BELADY, MOE_CACHE_LFU, MOE_CACHE_LFRU } moe_cache_policy;
/* Reads the (E, ...) tensors `prefix`fc1.weight, fc1.bias, fc2.weight, fc2.bias (and fc3.weight for
 * swiglu) of f, for the layer l (D, H, E, activation, biases, dtype), through K slots. f must stay open.
 * A slot holds the matrices in l->dtype (bf16: 2 bytes a value, about half an fp32 slot) and the biases
 * in fp32. The file's tensors may be F32 or BF16 whatever l->dtype: BF16 into a bf16 slot and F32 into
 * an fp32 slot are read as they are, F32 into bf16 is rounded to nearest even, BF16 into fp32 widened.
 * BELADY needs the future and is for moe_cachesim only. */
moe_status moe_expert_cache_open(moe_expert_cache **out, const moe_st *f, const char *prefix,
                                 const moe_layer_config *l, int K, moe_cache_policy p);
void moe_expert_cache_free(moe_expert_cache *c);
typedef struct {
  int64_t accesses, misses; /* active experts asked for, and those not resident nor on their way */
  size_t resident_bytes;    /* the K slots: K * expert_bytes */
  size_t expert_bytes;      /* one slot: the expert's matrices at the dtype's size (2 bytes bf16, 4 f32)
                               and its biases at 4, each tensor padded to a multiple of 64 bytes */
  moe_dtype dtype;          /* the slots' matrices: MOE_DT_F32 or MOE_DT_BF16 (the layer's dtype) */
  int slots;                /* K */
  int64_t loads;            /* experts read from the file (misses and prefetches) */
  int64_t bytes_read;       /* bytes read from the file by those loads */
  double stall_seconds;     /* the caller's time waiting for a load to finish */
  int64_t prefetches;       /* loads asked ahead by moe_expert_cache_prefetch */
  int64_t prefetch_used;    /* of those, experts active in the next batch before their eviction */
  int64_t predicted, predicted_hit, actual; /* the predictions' experts, those the next batch used, and
                               that batch's active experts: precision predicted_hit / predicted, recall
                               predicted_hit / actual (over the batches that had a prediction) */
  int pinned;               /* slots holding pinned experts (moe_expert_cache_pin), inside the K */
  double read_seconds;      /* the loader's time reading those loads */
  int64_t prefetch_skipped; /* predicted experts not read ahead because it would not pay (MOE_PREFETCH_AUTO) */
} moe_expert_cache_stats;
void moe_expert_cache_get_stats(const moe_expert_cache *c, moe_expert_cache_stats *out);
/* The bytes of one slot (expert_bytes) of a cache opened for layer l: what a memory budget is divided by. */
size_t moe_expert_cache_slot_bytes(const moe_layer_config *l);
/* Reads the n experts (ids in [0, E)) ahead into free slots, or slots whose experts the policy would
 * evict and which are not among them, without waiting: the next batch's predicted experts. Experts already
 * resident stay; the prediction is scored against the next forward's active experts (stats). Outputs
 * never change: only which experts are resident does. */
moe_status moe_expert_cache_prefetch(moe_expert_cache *c, const int *experts, int n);
/* Which predictions moe_expert_cache_prefetch reads: OFF none (it only scores them), ON all (the
 * default), AUTO those that pay by the costs measured so far. A read ahead right with probability p (the
 * cache's precision so far) saves min(r, w) of stall and a wrong one spends max(r - w, 0) of the disk's
 * time that the demand reads behind it wait for, r the loader's mean seconds a load and w the mean
 * seconds from a prediction to the forward it is for less what any cache stalled for reads in between
 * (the compute it can hide behind: while a forward waits for a read, the disk is busy): AUTO reads when
 * p min(r, w) > (1 - p) max(r - w, 0), so always when the reads hide in the compute, and on a disk
 * slower than the compute only for p near 1; nothing before a forward has scored a prediction and a
 * load has been timed. */
typedef enum { MOE_PREFETCH_OFF, MOE_PREFETCH_ON, MOE_PREFETCH_AUTO } moe_prefetch_mode;
/* MOE_ERR_ARG (the mode left as it was) for a mode that is none of the three. */
moe_status moe_expert_cache_set_prefetch(moe_expert_cache *c, moe_prefetch_mode mode);
const char *moe_prefetch_mode_name(moe_prefetch_mode m); /* "off", "on", "auto" */
moe_status moe_prefetch_mode_parse(const char *s, const char *field, moe_prefetch_mode *out);
/* Reads the n experts into free slots now (waiting for the reads) and keeps them there: never evicted,
 * so never a miss. n < K (a slot stays for the others) unless n = K = E. Their reads count as loads and
 * bytes read, not as misses. MOE_ERR_ARG for an id out of range or no free slot; a failed read is its
 * error (naming the tensor), the slot left free. */
moe_status moe_expert_cache_pin(moe_expert_cache *c, const int *experts, int n);
/* Whether each read drops its pages from the page cache (posix_fadvise DONTNEED), so that the slots are
 * the only cache (moe_lm_load_streaming's default); 0, the default of moe_expert_cache_open, leaves them
 * to the kernel (a second cache, outside any budget). */
void moe_expert_cache_set_drop_pages(moe_expert_cache *c, int drop);
/* The layer (config.external_experts) takes its experts from c; NULL detaches. MOE_ERR_SHAPE for a cache
 * of another shape, or of slots in stored types for a layer without expert_type > 0 (and the reverse). */
moe_status moe_layer_set_expert_cache(moe_layer_t *l, moe_expert_cache *c);
/* Serving a checkpoint for inference, with its experts computing in `dtype`: -1 for the checkpoint's
 * own (its metadata "dtype"), else MOE_DT_F32 or MOE_DT_BF16, whatever dtype the file stores the expert
 * matrices in (F32 or BF16: rounded to nearest even, or widened, where they differ).
 * K >= 1, expert buffering: m without its experts' weights, which are read from the file (opened
 * lazily and kept open by m) through K slots per block under policy p (dispatch=dynamic and no
 * hierarchical experts). K = 0: every expert resident, in m's parameters as moe_checkpoint_load gives
 * them (the file is closed, p is unused): the same outputs as buffering, bit for bit. */
moe_status moe_checkpoint_load_serving(const char *path, moe_model_t *m, int K, moe_cache_policy p, int dtype);

/* ---- expert traces (DESIGN 4.4) and what serving computes from them ----
 * CSV with header "step,layer,expert,tokens", one row per (step, layer, expert) with tokens > 0.
 * Ids are below these limits, and the dense table (steps x layers x experts int32 cells) may have at
 * most MOE_TRACE_CELLS_PER_ROW cells per row of the file, or MOE_TRACE_MIN_CELLS in all, so that a
 * few rows with far-apart ids are an error rather than gigabytes of zeros. */
#define MOE_TRACE_MAX_STEPS (INT64_C(1) << 31)
#define MOE_TRACE_MAX_LAYERS 4096
#define MOE_TRACE_MAX_EXPERTS 65536
#define MOE_TRACE_CELLS_PER_ROW 4096
#define MOE_TRACE_MIN_CELLS (INT64_C(1) << 22)
typedef struct {
  int64_t steps;   /* max step + 1 */
  int layers;      /* max layer + 1 */
  int experts;     /* max expert + 1, or the count given to the loader */
  int32_t *tokens; /* (steps, layers, experts) tokens, 0 where the trace has no row */
} moe_trace;
/* Strict reader: header, four non-negative integers per row, tokens > 0, expert < experts when
 * experts > 0 (0 = infer from the rows; at most MOE_TRACE_MAX_EXPERTS), no duplicate (step, layer,
 * expert), the limits above; errors give the file, line number and field. */
moe_status moe_trace_load(moe_trace *t, const char *path, int experts);
void moe_trace_free(moe_trace *t);
/* Writes a trace moe_trace_load reads: rows kept in memory, the file written atomically by close.
 * Opened at step `from` > 0 (a resumed run), the existing file's rows of earlier steps stay. add: one
 * row (tokens 0: none); add_model: the classifier's last forward, a row per layer and expert used;
 * add_counts: a language model's decode (moe_lm_cache_expert_counts), a row per layer and expert used;
 * close writes (MOE_ERR_IO naming the path when it cannot) and frees (NULL: nothing). */
typedef struct moe_trace_writer moe_trace_writer;
moe_status moe_trace_writer_open(moe_trace_writer **out, const char *path, int64_t from);
moe_status moe_trace_writer_add(moe_trace_writer *t, int64_t step, int layer, int expert, int tokens);
moe_status moe_trace_writer_add_model(moe_trace_writer *t, const moe_model_t *m, int64_t step);
/* counts: (layers, experts) tokens per layer and expert (moe_lm_cache_expert_counts): a row for each > 0. */
moe_status moe_trace_writer_add_counts(moe_trace_writer *t, int64_t step, const int32_t *counts, int layers, int experts);
moe_status moe_trace_writer_close(moe_trace_writer *t);

/* Expert-cache policies (deployment paper VI): on a miss with the cache full, evict an expert not
 * active in this batch first, then by the policy: LIFO (the paper's), LRU, FIFO, LFU (the fewest uses
 * since the cache opened, evicted or not; ties to the least recently used), LFRU (a frequency-recency
 * mix: each use adds 1 to a score that halves every E accesses of the layer; the lowest score goes);
 * BELADY evicts the expert whose next use is farthest (MIN, knows the future). The access sequence is, batch after
 * batch, the active experts (tokens > 0) in increasing id order; an active expert not yet computed in
 * the current batch is never evicted. */
const char *moe_cache_policy_name(moe_cache_policy p);
moe_status moe_cache_policy_parse(const char *s, const char *field, moe_cache_policy *out);
/* Simulates a K-slot cache of layer `layer`'s experts over steps [s0, s1) of t. */
moe_status moe_cachesim(const moe_trace *t, int layer, int64_t s0, int64_t s1, moe_cache_policy p, int K,
                        int64_t *accesses, int64_t *misses);

/* Expert placement over devices (deployment paper VII), fitted on a trace layer's steps [s0, s1).
 * A[m][b] = the fraction of step b's tokens (in this layer) routed to expert m; steps with no tokens
 * in the layer are skipped. GREEDY: experts by descending mean A (ties to the lower id), each to the
 * device of least load (the sum of its experts' mean A) among those holding fewer than E/N experts
 * (ties to the lower device). ANTICORR: the same, with the load of device n when placing expert a
 * being the sum over its experts m of mean A_m + corr * S_am, S the Pearson correlation of A over
 * the steps (0 where a series is constant); the paper's corr is 0.5. E = t->experts must be a
 * multiple of `devices`; expert_device gets E entries. */
typedef enum { MOE_PLACEMENT_GREEDY, MOE_PLACEMENT_ANTICORR } moe_placement_method;
#define MOE_PLACEMENT_ANTICORR_MAX_EXPERTS 4096 /* its E x E matrix of doubles: 128 MiB */
const char *moe_placement_method_name(moe_placement_method m);
moe_status moe_placement_method_parse(const char *s, const char *field, moe_placement_method *out);
moe_status moe_placement_fit(const moe_trace *t, int layer, int64_t s0, int64_t s1, int devices,
                             moe_placement_method m, double corr, int *expert_device);
/* Reads the expert_device of `layer` (E entries) from a placement written by moe placement, checking
 * the devices, the expert count and E/devices experts per device; errors name the file and field. */
moe_status moe_placement_load(const char *path, int layer, int experts, int devices, int *expert_device);
/* The default expert-parallel layout: expert m on device m / (E / devices). */
moe_status moe_placement_contiguous(int experts, int devices, int *expert_device);
/* Over the steps of [s0, s1) with tokens in the layer (*batches gets their count): Max Load, the
 * largest fraction of a step's tokens that one device receives, and Avg Max Load, the mean over
 * the steps of that step's largest device fraction (both 0 when there is no such step). */
moe_status moe_placement_eval(const moe_trace *t, int layer, int64_t s0, int64_t s1, int devices,
                              const int *expert_device, double *max_load, double *avg_max_load,
                              int64_t *batches);

/* ---- RECOMPILE (DynaMoE section 3 and appendix B): the training loop pushes each iteration's
 * metrics without waiting; a trigger runs on its own thread with the most recent metrics while
 * iterations go on, and an adjustment it returns for the metrics of iteration j takes effect at the
 * start of iteration j + delta_launch + 1 (the launch frontier is delta_launch iterations ahead of
 * the execution frontier). Training waits for a trigger only when it is still running on the metrics
 * of iteration i - delta_launch - 1 when iteration i starts: a stall, counted. */
typedef struct {
  int64_t iter;          /* the iteration these metrics are of */
  double loss;
  int experts;
  const int32_t *counts; /* (experts) assignments per expert; copied by moe_recompile_push */
  double frac_same;      /* sample-assignment caching: fraction of samples not reassigned */
} moe_metrics;
typedef struct {
  int64_t apply_at;      /* set by the engine: the iteration it takes effect at */
  int set_capacity;      /* capacity (experts) holds per-expert capacities */
  int32_t *capacity;     /* owned by the engine: (experts), filled by the trigger */
  int set_caching, caching;
  int set_top_k, top_k;
  int set_placement;     /* capacity holds a FlexMoE placement instead (moe_flex_trainer's own layout);
                            of several due at once, the newest */
} moe_adjustment;
/* Returns 1 when it filled `out` with an adjustment, 0 for none. Runs on the trigger thread. */
typedef int (*moe_trigger_fn)(const moe_metrics *m, moe_adjustment *out, void *user);
typedef struct moe_recompile moe_recompile;
typedef struct {
  int64_t triggers;      /* trigger calls */
  int64_t adjustments;   /* adjustments applied */
  int64_t stalls;        /* iterations that waited for a trigger */
  double stall_seconds;
} moe_recompile_stats;
moe_status moe_recompile_new(moe_recompile **out, int experts, int delta_launch, moe_trigger_fn fn, void *user);
void moe_recompile_free(moe_recompile *r);
/* delta_launch may change while training goes on; it counts from the next metrics on. */
moe_status moe_recompile_set_delta(moe_recompile *r, int delta_launch);
/* At the start of iteration i: *has = 1 and *adj (valid until the next call) when an adjustment takes
 * effect now. */
moe_status moe_recompile_begin(moe_recompile *r, int64_t i, const moe_adjustment **adj, int *has);
/* After iteration m->iter: hands its metrics to the trigger thread; never waits for the trigger. */
moe_status moe_recompile_push(moe_recompile *r, const moe_metrics *m);
void moe_recompile_get_stats(const moe_recompile *r, moe_recompile_stats *out);
/* DynaMoE 4.1's per-expert capacities as a policy [libmoe choice: the paper gives none]: each
 * expert's capacity follows its measured need (count) with headroom, and is recomputed only when a
 * need exceeds its capacity or falls below capacity / (1 + 2 headroom) (hysteresis), so recompiles
 * stay rare. Fills out (E) with ceil(need * (1 + headroom)), at least 1, and returns 1 when a
 * recompile is due, else 0 (out = cur). */
int moe_dynamic_capacity(const int32_t *need, const int32_t *cur, int E, float headroom, int32_t *out);

/* The BLAS in use and its kernel set, e.g. "OpenBLAS 0.3.21 (kernels SkylakeX, OpenMP)". */
const char *moe_blas_info(void);
/* Ends the OpenMP worker threads that the calling thread's parallel work (a model's init, load or steps)
 * left waiting for its next parallel region. Every thread that runs the library's parallel work keeps
 * such a team; once the teams' threads outnumber the processors, libgomp makes all of them spin less
 * before sleeping, and each of the many small parallel regions of a decode step waits for its workers
 * to wake: decoding on one thread after another did the loading ran 1.8-3.7x slower. A thread that
 * hands a model to another (loads it, then serves it from an engine) calls this; moe_engine_new does
 * it for its caller. A later parallel region of the thread starts a new team. */
void moe_threads_release(void);
/* The CPU as the kernels see it, on one line: its model name, family and model, the features they are
 * chosen by (AVX2, FMA, F16C, AVX-512's, VNNI, BF16, AMX), its data caches and logical CPUs, and the
 * kernels chosen on it (small-GEMM kernels with their blocking, which follows the L2's size;
 * activations, bf16 GEMMs, quantized dot products), e.g. "AMD EPYC (family 25 model 17): avx2 fma ...;
 * L1d 32K L2 1024K L3 32768K, 2 CPUs; kernels: small GEMMs AVX-512 (blocks of K: NN 512, NT up to 1024,
 * for an L2 of 1024K; 536 KiB scratch a thread), ...". MOE_CPU_CACHE_L1D, MOE_CPU_CACHE_L2 and
 * MOE_CPU_CACHE_L3 (bytes, or with a K or M suffix), set before the library's first GEMM, stand for the
 * caches found, to test the choices made for other CPUs (NT's blocks change the summation order). */
const char *moe_cpu_info(void);
/* The same as one JSON object: "model", "vendor", "family", "model_number", "features" (a list of names
 * as /proc/cpuinfo spells them), "l1d_bytes", "l2_bytes", "l3_bytes" (0: unknown), "caches_from"
 * ("sysfs", "cpuid" or "none", "+env" where the environment set one), "cpus", "small_gemm" ("AVX-512"
 * or "off"), "gemm_kc", "gemm_kc_nt" (the blocks of K), "gemm_scratch_bytes" (a thread's; 0 when
 * off), "activations", "bf16_gemm", "quant_dot". */
const char *moe_cpu_json(void);
/* OpenBLAS picks its kernels when it loads and takes this Zen 5 CPU for a Haswell (AVX2), as does an
 * OPENBLAS_CORETYPE=Haswell in the environment. Returns the OPENBLAS_CORETYPE value of faster
 * kernels this CPU supports ("SKYLAKEX" for AVX-512) when slower ones were loaded, else NULL (also
 * when MOE_KEEP_BLAS_CORETYPE or MOE_BLAS_REEXEC is set). A program sets OPENBLAS_CORETYPE and
 * MOE_BLAS_REEXEC=1 and re-executes itself to get them, as the moe command does. */
const char *moe_blas_better_coretype(void);
/* GFLOP/s of an n x n x n sgemm with `threads` BLAS threads: the best of `reps` runs. */
double moe_sgemm_gflops(int n, int threads, int reps);

/* ---- checkpoints under expert parallelism ---- */
/* moe_checkpoint_load on each of d's ranks, keeping this rank's experts (and their optimizer state):
 * m runs expert-parallel over d (E must divide by its ranks), whatever number of ranks saved the file.
 * One rank (d NULL or of size 1): moe_checkpoint_load. */
moe_status moe_checkpoint_load_ranks(const char *path, const moe_dist *d, moe_model_t *m, moe_optim_t *o,
                                     moe_train_state *ts);
/* The same with FlexMoE's replica slots per rank (replica_slots; 0: none): with the file's replica
 * placement when as many ranks with as many slots saved it, else expert parallelism's blocks of
 * experts, from a file any number of ranks saved. */
moe_status moe_checkpoint_load_replicas(const char *path, const moe_dist *d, int slots, moe_model_t *m,
                                        moe_optim_t *o, moe_train_state *ts);
/* The slots per rank a run resumed from checkpoint path on W ranks takes by default: its placement's
 * E_v when W ranks saved it with replicas, so that the run continues with that placement; else one
 * spare slot per rank, E/W + 1. 0 when the file cannot be read (moe_last_error says why). */
int moe_checkpoint_replica_slots(const char *path, int W);
/* The placement of m's blocks as text, kept in checkpoints (DESIGN 3.4): "WxE_v:" then each block's
 * slots (rank-major, -1 empty) comma-separated, the blocks separated by '/'. MOE_ERR_ARG naming the
 * size when it does not fit in n characters. */
moe_status moe_flex_layout_write(const moe_model_t *m, char *buf, size_t n);

/* ---- BPE tokenizer (GPT-2's byte-level scheme; Hugging Face tokenizer.json) ----
 * Text is bytes. libmoe's own tokenizers are GPT-2's byte-level BPE: the pre-tokenizer cuts text as
 * GPT-2's regex does over UTF-8 with Unicode classes (contractions, letters, digits, other symbols,
 * each with an optional leading space, and whitespace; a byte of invalid UTF-8 is a piece of its own),
 * then each piece is merged by BPE rank; any bytes encode and decode gives them back byte for byte.
 * Hugging Face tokenizer.json files of BPE models run as the tokenizers library runs them: byte-level
 * vocabularies (GPT-2, Llama 3, Qwen2/3, DeepSeek-V3, gpt-oss) and vocabularies of strings with
 * byte_fallback <0xNN> tokens, unk_token and fuse_unk (Llama 2, Mistral); ignore_merges; normalizers
 * Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD, Lowercase, Strip; pre-tokenizers Split (the file's
 * regex, PCRE2 with Unicode classes; every behavior, invert), ByteLevel, Metaspace, Digits, Punctuation,
 * Sequence; added tokens (special or not, lstrip/rstrip/single_word) matched in the raw text before
 * the rest; the post-processors TemplateProcessing, Roberta/BertProcessing, ByteLevel; decoders
 * ByteLevel, ByteFallback, Metaspace, Fuse, Strip, Replace, Sequence. Anything else in a file is
 * refused naming the field and value. A tokenizer is read-only once made: encode and decode may run on
 * many threads at once. */
typedef struct moe_tokenizer moe_tokenizer;
/* The one special token moe_tokenizer_train adds (the last id): GPT-2's end of text, which is also the
 * beginning of the next one (documents are joined with it). */
#define MOE_TOKENIZER_EOT "<|endoftext|>"
/* Flags of moe_tokenizer_encode. SPECIAL: the strings of special added tokens in the text become their
 * ids (non-special added tokens always do, as in Hugging Face); without it they are plain text, as HF's
 * split_special_tokens. ADD_SPECIAL: the post-processor's tokens around the text (BOS/EOS), as HF's
 * add_special_tokens=True; tokenizers without one add nothing. */
#define MOE_TOKENIZER_SPECIAL 1
#define MOE_TOKENIZER_ADD_SPECIAL 2
/* Learns merges from the n bytes of text until the vocabulary has vocab_size ids (>= 257): ids 0..255
 * the bytes (GPT-2's order), then one per merge, then MOE_TOKENIZER_EOT. Each merge takes the most
 * frequent adjacent pair within pre-tokens (ties: the smaller left id, then the smaller right id);
 * deterministic. Fewer merges when the text runs out of pairs (moe_tokenizer_vocab_size tells). */
moe_status moe_tokenizer_train(moe_tokenizer **out, const char *text, size_t n, int32_t vocab_size);
/* Reads a tokenizer.json (ours or a Hugging Face BPE one, above), or a directory holding one: then its
 * tokenizer_config.json, when there, sets the tokens ADD_SPECIAL adds from add_bos_token/add_eos_token
 * and bos_token/eos_token when it gives either flag (as transformers' Llama tokenizers do). Other models
 * (Unigram, WordPiece), BPE dropout, subword prefixes and unsupported steps: MOE_ERR_FORMAT naming the
 * field and value. */
moe_status moe_tokenizer_load(moe_tokenizer **out, const char *path);
/* Writes the tokenizer.json atomically (readable by Hugging Face tokenizers): byte-level BPE without
 * normalizers, post-processor or added-token options only (MOE_ERR_ARG for others). */
moe_status moe_tokenizer_save(const moe_tokenizer *t, const char *path);
void moe_tokenizer_free(moe_tokenizer *t);
int32_t moe_tokenizer_vocab_size(const moe_tokenizer *t);
/* The ids of the n bytes of text into ids, their count in *n_ids; flags: MOE_TOKENIZER_* above (0 or
 * 1 as before: 1 turns <|endoftext|> written in the text into its id). Room for n ids is enough for
 * GPT-2-style tokenizers without ADD_SPECIAL; other tokenizers can give more ids than bytes (a prepended
 * "▁", byte fallback, NFKC), which is MOE_ERR_ARG here: moe_tokenizer_encode_alloc has no such bound. */
moe_status moe_tokenizer_encode(const moe_tokenizer *t, const char *text, size_t n, int flags, int32_t *ids,
                                size_t *n_ids);
/* As moe_tokenizer_encode, into a new array *ids (free() it; NULL on error) of *n_ids ids. */
moe_status moe_tokenizer_encode_alloc(const moe_tokenizer *t, const char *text, size_t n, int flags, int32_t **ids,
                                      size_t *n_ids);
/* The text of n ids into out (cap bytes, not NUL-terminated); *len = its length, set also when cap is
 * too small (MOE_ERR_ARG): call with cap 0 to learn it. Byte-level tokenizers give the tokens' bytes;
 * others run the file's decoders (a run of <0xNN> tokens that is not UTF-8 gives U+FFFD per byte, as
 * HF). MOE_ERR_VALUE naming an id out of range. */
moe_status moe_tokenizer_decode(const moe_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                                size_t *len);
/* As moe_tokenizer_decode, into a new buffer *out (NUL-terminated after its *len bytes; free() it; NULL
 * on error), decoding once. */
moe_status moe_tokenizer_decode_alloc(const moe_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);
/* The bytes of one id (not NUL-terminated, *len of them): a byte-level token's bytes, another
 * vocabulary's token string (as "▁the", "<0x0A>"); NULL when out of range. */
const char *moe_tokenizer_token_bytes(const moe_tokenizer *t, int32_t id, size_t *len);
/* The id of the token whose bytes are the string (an added token such as MOE_TOKENIZER_EOT, or a
 * vocabulary token by its bytes as moe_tokenizer_token_bytes gives them), or -1. */
int32_t moe_tokenizer_token_id(const moe_tokenizer *t, const char *token);
/* moe_tokenizer_load also reads a GGUF file's tokenizer (a path ending in ".gguf" or a file starting
 * with GGUF; DESIGN 4.8): tokenizer.ggml.model "gpt2" (byte-level BPE; tokenizer.ggml.pre one of gpt-2,
 * olmo, llama-bpe, qwen2, deepseek-v3, gpt-4o, another an error naming it) or "llama" (SentencePiece
 * BPE with byte fallback, merged by the scores), ADD_SPECIAL adding BOS / EOS as add_bos_token /
 * add_eos_token say. moe_tokenizer_gguf_to_hf writes that tokenizer as dir/tokenizer.json and
 * dir/tokenizer_config.json (chat_template, the special tokens, add_bos_token / add_eos_token), each
 * atomically: moe_tokenizer_load(dir) then encodes as moe_tokenizer_load(path). */
moe_status moe_tokenizer_gguf_to_hf(const char *path, const char *dir);
/* Text as it is generated, token by token (what a stream shows; Hugging Face's DecodeStream, vLLM's
 * incremental detokenizing): each push gives the text its token completes, as UTF-8 (bytes that are
 * not UTF-8 as U+FFFD). A character split over tokens, or a byte-fallback run still incomplete, waits
 * for the tokens that complete it; the decoders run over a window of the last tokens, so a piece such
 * as SentencePiece's "▁the" gives " the" and the first token of the text no leading space, as the whole
 * text's decode has it. The texts of every push and then the flush, one after another, are
 * moe_tokenizer_decode of all the ids, with bytes that are not UTF-8 as U+FFFD. *text (*len bytes, not
 * NUL-terminated) stays valid until the next call on d. */
typedef struct moe_detokenizer moe_detokenizer;
moe_status moe_detokenizer_new(moe_detokenizer **out, const moe_tokenizer *t);
moe_status moe_detokenizer_push(moe_detokenizer *d, int32_t id, const char **text, size_t *len);
/* The text still held (an incomplete character at the end, as U+FFFD); then d starts a new text. */
moe_status moe_detokenizer_flush(moe_detokenizer *d, const char **text, size_t *len);
/* d starts a new text that continues after the n context ids (a prompt, whose text is not given): the
 * first token's text is then what it adds after them, as a server's completion follows its prompt
 * (SentencePiece's "\u2581the" gives " the" there, not "the"); what d held is dropped. */
moe_status moe_detokenizer_follow(moe_detokenizer *d, const int32_t *ids, size_t n);
void moe_detokenizer_free(moe_detokenizer *d);

/* ---- a Mixtral-architecture language model and its relatives (DESIGN 4.5) ----
 * Token embedding; n_layers pre-norm blocks h += Attn(RMSNorm(h)), h += FFN(RMSNorm(h)) with causal
 * grouped-query attention and rotary position embeddings (Hugging Face's rotate_half); the feed-forward
 * is the libmoe layer (SwiGLU experts, softmax top-k router, and with shared_H its always-on shared
 * expert) or, in the layers dense_layers marks, a dense SwiGLU MLP of width dense_H; RMSNorm and an
 * output head, tied to the embedding or not. Loss: mean cross-entropy over the counted targets plus
 * aux_coef times the load-balancing loss (HF load_balancing_loss_func: all MoE layers' tokens and all
 * k slots together). The family decides the Hugging Face tensor names and config.json; the attention
 * options (qkv_bias, qk_norm, clip_qkv) are what its modeling file does:
 *   Mixtral (model_type "mixtral"): block_sparse_moe.gate, block_sparse_moe.experts.<e>.w1/w2/w3;
 *   Qwen2-MoE ("qwen2_moe"): q/k/v biases, mlp.gate, mlp.experts.<e>.gate_proj/up_proj/down_proj, the
 *     shared expert mlp.shared_expert.* scaled by sigmoid(mlp.shared_expert_gate x), dense layers;
 *   Qwen3-MoE ("qwen3_moe"): self_attn.q_norm/k_norm over each head's head_dim, mlp.* as Qwen2-MoE
 *     without the shared expert, dense layers;
 *   OLMoE ("olmoe"): self_attn.q_norm/k_norm over the whole q (n_heads head_dim) and k (n_kv_heads
 *     head_dim) projections, optional clip_qkv, mlp.* as Qwen3-MoE, no dense layers;
 *   gpt-oss ("gpt_oss"): q/k/v/o biases, attention sinks (self_attn.sinks), sliding-window layers
 *     between full ones (full_layers), mlp.router.weight/bias (the router's bias; the softmax over the k
 *     selected logits, which is normalize_topk 1), experts with biases and the clamped SwiGLU (moe.act
 *     swiglu_oai). Its checkpoint's fused experts (mlp.experts.gate_up_proj (E, D, 2H) with gate and up
 *     in interleaved columns, gate_up_proj_bias (E, 2H), down_proj (E, H, D)) are held as the layer's
 *     tensors under the names mlp.experts.fc1.weight/bias (gate), fc3.weight/bias (up), fc2.weight
 *     (E, D, H), and converted on load and save; mlp.experts.down_proj_bias keeps its name;
 *   DeepSeek-V2 / V2-Lite ("deepseek_v2") and DeepSeek-V3 ("deepseek_v3"): multi-head latent attention
 *     (moe_lm_mla below; head_dim is qk_rope_head_dim, n_kv_heads is n_heads), mlp.gate (softmax or
 *     sigmoid scores, groups, the selection bias mlp.gate.e_score_correction_bias, routed_scale: the
 *     moe fields), mlp.experts.<e>.*, the ungated shared experts mlp.shared_experts.* (moe.shared_H),
 *     dense layers; aux_coef 0 (transformers adds no balance loss for them). */
typedef enum {
  MOE_LM_MIXTRAL = 0,
  MOE_LM_QWEN2_MOE,
  MOE_LM_QWEN3_MOE,
  MOE_LM_OLMOE,
  MOE_LM_GPT_OSS,
  MOE_LM_DEEPSEEK_V2,
  MOE_LM_DEEPSEEK_V3
} moe_lm_family;
/* The family's model_type ("mixtral", ...); NULL when out of range. */
const char *moe_lm_family_name(moe_lm_family f);
typedef enum {
  MOE_QK_NORM_NONE = 0,
  MOE_QK_NORM_HEAD, /* RMSNorm of each head of q and k over head_dim, weights (head_dim) (Qwen3-MoE) */
  MOE_QK_NORM_FULL, /* RMSNorm of the whole q and k projections, weights (n_heads / n_kv_heads x head_dim) (OLMoE) */
} moe_lm_qk_norm;
#define MOE_LM_MAX_LAYERS 1024
#define MOE_LM_MAX_EOS 16 /* room enough for the end ids of any model (moe_lm_eos_ids) */
/* YaRN rotary scaling (rope_scaling {"type": "yarn"}; transformers' _compute_yarn_parameters, DeepSeek's
 * DeepseekV2YarnRotaryEmbedding): dimension pair i keeps its frequency theta^(-2i/d) when it turns more
 * than beta_fast times within original_max_pos, takes it divided by factor below beta_slow turns, and
 * a linear ramp between (the ramp's ends floored and ceiled when truncate, transformers' default;
 * gpt-oss sets false); cos and sin are scaled by get_mscale(factor, mscale) / get_mscale(factor,
 * mscale_all_dim), get_mscale(s, m) = 0.1 m ln(s) + 1 (1 when s <= 1); the latent attention also
 * multiplies its softmax scale by get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is not 0. */
typedef struct {
  float factor;                 /* > 1 turns YaRN on; 0: off */
  int original_max_pos;         /* original_max_position_embeddings */
  float beta_fast, beta_slow;   /* 32 and 1 in the configs that leave them out */
  float mscale, mscale_all_dim; /* 1 and 0 in the configs that leave them out */
  int truncate;                 /* 1 in the configs that leave it out */
} moe_lm_yarn;
/* Multi-head latent attention (DeepSeek-V2/V3): q = q_b_proj(RMSNorm(q_a_proj x)) when q_lora_rank > 0,
 * else q_proj x: n_heads heads of qk_nope_dim + head_dim; kv_a_proj_with_mqa x gives the latent
 * (kv_lora_rank, normed by kv_a_layernorm) and one rotary key (head_dim) that every head shares;
 * kv_b_proj maps the normed latent to each head's key (qk_nope_dim) and value (v_head_dim); the rotary
 * embedding turns the last head_dim of each q head and the shared key (pairs of adjacent dimensions
 * with rope_interleave, DeepSeek's checkpoints; else rotate_half); softmax scale 1/sqrt(qk_nope_dim +
 * head_dim), times YaRN's correction; o_proj (D, n_heads v_head_dim). A KV cache holds per token and
 * layer the normed latent and the rotated key, kv_lora_rank + head_dim floats, and decodes with the
 * key and value projections absorbed into the queries and outputs. */
typedef struct {
  int kv_lora_rank;       /* > 0 turns MLA on */
  int q_lora_rank;        /* 0: q_proj */
  int qk_nope_dim, v_head_dim;
  int rope_interleave;
} moe_lm_mla;
typedef struct {
  int vocab, n_layers, n_heads, n_kv_heads, head_dim; /* n_heads a multiple of n_kv_heads, head_dim even */
  int max_seq;           /* longest context; the rotary tables and a KV cache grow up to it as used */
  float rope_theta;      /* 1e6 as Mixtral */
  float rms_eps;         /* 1e-5 */
  float aux_coef;        /* router_aux_loss_coef: 0.001 as Mixtral; 0 leaves the balance loss out */
  int tie_embeddings;    /* the head reuses model.embed_tokens.weight */
  int sliding_window;    /* 0: none; else a query sees its own key and the sliding_window - 1 before it */
  moe_layer_config moe;  /* D (the model width), H (the experts' intermediate size), E, top_k,
                            seq_aux_alpha (DeepSeek's sequence-wise balance loss over each batch row, for
                            training: a caller sets it, config.json's aux_loss_alpha is not read; one
                            process; moe_lm_stats.seq_aux),
                            normalize_topk (norm_topk_prob), shared_H / shared_gate (Qwen2-MoE's shared
                            expert), capacity, dispatch, dtype...; act swiglu, no biases, linear router
                            (gpt-oss: swiglu_oai with router and expert biases);
                            moe.threads for the model */
  moe_lm_family family;  /* MOE_LM_MIXTRAL by default */
  int qkv_bias;          /* q_proj, k_proj and v_proj have biases (Qwen2-MoE, gpt-oss) */
  moe_lm_qk_norm qk_norm; /* RMSNorm (eps rms_eps) of q and k after the projections, before RoPE */
  float clip_qkv;        /* > 0: q, k and v clamped to [-clip_qkv, clip_qkv] after the norms (OLMoE); 0: no clamp */
  int dense_H;           /* the dense layers' intermediate_size (Qwen2/3-MoE's intermediate_size) */
  uint8_t dense_layers[MOE_LM_MAX_LAYERS / 8]; /* bit i % 8 of byte i / 8: layer i is a dense SwiGLU MLP
                            (mlp.gate_proj/up_proj/down_proj, dense_H wide) instead of a MoE layer */
  int o_bias;            /* o_proj has a bias (gpt-oss's attention_bias, with qkv_bias) */
  int attn_sinks;        /* self_attn.sinks (n_heads): each head's learned logit joins its softmax's
                            denominator, with no value (gpt-oss) */
  uint8_t full_layers[MOE_LM_MAX_LAYERS / 8]; /* with sliding_window, bit i % 8 of byte i / 8: layer i
                            attends to every earlier position (gpt-oss's "full_attention" layer_types);
                            the others (all, when none is set) keep the window */
  moe_lm_yarn yarn;      /* YaRN rotary scaling: yarn.factor 0 (default) leaves it off */
  moe_lm_mla mla;        /* the DeepSeek families' latent attention; mla.kv_lora_rank 0 for the others */
} moe_lm_config;
/* Whether layer i of c is a dense MLP layer (moe_lm_t.layers[i] is then unused: all zero). */
int moe_lm_layer_dense(const moe_lm_config *c, int i);
void moe_lm_config_default(moe_lm_config *c);
/* Sets c->family to f and the options its modeling code fixes, for a new model of the sizes c has:
 * Qwen2-MoE q/k/v biases and a gated shared expert (moe.H wide unless shared_H is set); Qwen3-MoE and
 * OLMoE their q/k norms, OLMoE's top-k not renormalized; gpt-oss q/k/v/o biases, sinks, the router's and
 * experts' biases, the clamped SwiGLU, normalize_topk 1 and no balance loss (aux_coef 0); DeepSeek-V2 and
 * V3 the latent attention (head_dim, the per-head size given, becomes the key's and value's non-rotary
 * width, with a rotary part half as wide; kv latent D / 4, V3's q latent D / 2), a dense first layer,
 * shared experts (two routed experts wide for V2, one for V3), V2's softmax routing without
 * renormalization, V3's sigmoid routing with the selection bias, renormalized, times 2.5, in 4 groups
 * of which 2 are kept (when E is a multiple of 4 and top_k <= E / 2); Mixtral none of them. Sizes,
 * windows and the rest are left as they are. */
void moe_lm_config_set_family(moe_lm_config *c, moe_lm_family f);

typedef struct moe__lm_state moe__lm_state;
typedef struct {
  moe_lm_config cfg;
  moe_layer_t *layers;  /* (n_layers) the MoE feed-forwards; a dense layer's entry is all zero */
  int nrefs;
  moe_tensor_ref *refs; /* every parameter under its Hugging Face name, in HF order; an expert's w1, w2,
                           w3 are views into its layer's stacked experts.fc1/fc2/fc3 tensors */
  size_t numel;
  float *dense, *dense_grad; /* the parameters outside the MoE layers */
  moe__lm_state *st;
} moe_lm_t;

typedef struct {
  double loss;    /* ce + aux_coef * aux + seq_aux: what backward differentiates */
  double ce;      /* mean cross-entropy over the counted targets */
  double aux;     /* the load-balancing loss */
  int tokens;     /* targets counted (those >= 0) */
  int dropped;    /* assignments dropped for capacity, over the layers */
  double seq_aux; /* with moe.seq_aux_alpha > 0: DeepSeek's sequence-wise balance loss (each batch row a
                     sequence), alpha included, summed over the MoE layers; else 0 */
} moe_lm_stats;

moe_status moe_lm_init(moe_lm_t *m, const moe_lm_config *c);
void moe_lm_free(moe_lm_t *m);
/* Weights ~ uniform with standard deviation 0.02 (HF's initializer_range), norms 1, from seed. */
void moe_lm_init_params(moe_lm_t *m, uint64_t seed);
void moe_lm_zero_grad(moe_lm_t *m);
/* After the parameters were written (an optimizer step, a load): refreshes the layers' bf16 copies. */
void moe_lm_params_changed(moe_lm_t *m);
void moe_lm_set_threads(moe_lm_t *m, int threads);
const moe_tensor_ref *moe_lm_find(const moe_lm_t *m, const char *name);
/* The type parameter `name` is computed in: MOE_GGUF_F32 for the fp32 ones (its ref's data), or the
 * quantized type of a GGUF file's weight that moe_lm_load kept in its stored bytes (the ref's data is
 * then unused; see moe_lm_load). MOE_GGUF_F32 also for a name m does not have. */
moe_gguf_type moe_lm_param_type(const moe_lm_t *m, const char *name);
/* tokens (B, T) in [0, vocab), T <= max_seq; targets (B, T) the next tokens (< 0: not counted), or
 * NULL for logits only. Keeps what backward needs. */
moe_status moe_lm_forward(moe_lm_t *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                          moe_lm_stats *st);
/* (B, T, vocab) logits of the last forward; backward overwrites them. */
const float *moe_lm_logits(const moe_lm_t *m);
/* Adds the gradient of the last forward's loss (which had targets) into every ref's grad. */
moe_status moe_lm_backward(moe_lm_t *m);
/* DeepSeek-V3's aux-loss-free balancing for training: moe_layer_balance_bias(gamma) on every MoE layer
 * (its mlp.gate.e_score_correction_bias moved by -gamma, +gamma or 0 by the last forward's
 * assignments against their mean), after an optimizer step; MOE_ERR_STATE without moe.select_bias or
 * before a forward. Call moe_lm_params_changed afterwards as after any write. */
moe_status moe_lm_balance_bias(moe_lm_t *m, float gamma);

/* Hugging Face checkpoint directories of the seven families: config.json with model.safetensors, or
 * with the shards that model.safetensors.index.json lists ("weight_map": tensor name -> file). The
 * family is config.json's model_type ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss",
 * "deepseek_v2", "deepseek_v3"), else its
 * architectures entry, else Mixtral. c gets the fields the config gives: vocab_size, hidden_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads, max_position_embeddings, rope_theta (or
 * rope_parameters of rope_type default), rms_norm_eps, tie_word_embeddings, num_experts_per_tok and
 * router_aux_loss_coef, which counts only when output_router_logits is true, as in transformers; then
 *   mixtral: intermediate_size, head_dim, num_local_experts, sliding_window (null or a window);
 *   qwen2_moe: moe_intermediate_size (moe.H), intermediate_size (dense_H), num_experts, norm_topk_prob,
 *     decoder_sparse_step and mlp_only_layers (dense_layers), shared_expert_intermediate_size (moe.shared_H,
 *     gated), qkv_bias (default true), layer_types (all "full_attention");
 *   qwen3_moe: as qwen2_moe without the shared expert and qkv_bias, with head_dim (q/k norms per head);
 *   olmoe: intermediate_size (moe.H), num_experts, norm_topk_prob, clip_qkv (null or > 0);
 *   gpt_oss: intermediate_size (moe.H), num_local_experts, head_dim, sliding_window, layer_types
 *     ("sliding_attention" / "full_attention" per layer; absent: transformers' alternation, even layers
 *     sliding), attention_bias (default true), swiglu_alpha and swiglu_limit; rope_theta 150000 by
 *     default; rope_scaling yarn (moe_lm_yarn; absent: GptOssConfig's default, factor 32 over 4096
 *     positions, betas 32 and 1, truncate false) or null; output_router_logits must be false (its
 *     balance loss is over the router's top-k scores); experts_per_token and initial_context_length of
 *     the released configs are known and ignored. Experts stored in MXFP4 (gate_up_proj_blocks and
 *     _scales, down_proj_blocks and _scales, with "quantization_config" {"quant_method": "mxfp4"}) are
 *     dequantized on load;
 *   deepseek_v2, deepseek_v3: kv_lora_rank, q_lora_rank (null: q_proj), qk_nope_head_dim,
 *     qk_rope_head_dim (head_dim), v_head_dim (moe_lm_mla), rope_interleave (true), rope_scaling null or
 *     yarn (moe_lm_yarn), n_routed_experts, moe_intermediate_size (moe.H), n_shared_experts (moe.shared_H
 *     = n x H), intermediate_size (dense_H), first_k_dense_replace and moe_layer_freq (dense_layers),
 *     scoring_func (softmax, sigmoid), topk_method (greedy; group_limited_greedy: groups, MAX;
 *     noaux_tc: select_bias, groups, TOP2_SUM), n_group, topk_group, norm_topk_prob (only for top_k > 1),
 *     routed_scaling_factor (V3 after the normalization, V2 only without it); aux_loss_alpha, seq_aux,
 *     ep_size, pretraining_tp, num_nextn_predict_layers and auto_map known and ignored;
 *     quantization_config, attention_bias or mlp_bias true refused; tensors of layers numbered from
 *     num_hidden_layers (multi-token prediction) skipped on load with a note on stderr;
 * absent fields take the family's transformers defaults (qwen: rms_norm_eps 1e-6, rope_theta 1e4,
 * norm_topk_prob false...). Fields that change nothing computed are known and ignored (torch_dtype,
 * transformers_version, bos/eos/pad_token_id, use_cache, initializer_range, a Qwen sliding_window or
 * max_window_layers while use_sliding_window is false, OLMoE's router_z_loss_coef, which transformers
 * does not add); any other field is MOE_ERR_FORMAT naming the file and the field, and so are values
 * not implemented: rope_scaling other than null (or DeepSeek's and gpt-oss's yarn), use_sliding_window or attention_bias true, hidden_act
 * other than silu, attention_dropout or router_jitter_noise other than 0. The rest is
 * moe_lm_config_default's. Errors name the file and the field. */
moe_status moe_lm_read_config(const char *dir, moe_lm_config *c);
/* Builds m from c (NULL: moe_lm_read_config(dir), which a caller reads first to change layer options
 * or max_seq), after checking c's sizes against the tensors' shapes (MOE_ERR_SHAPE naming config.json,
 * the field and its value, before any allocation of their size), and reads every parameter, F32, BF16 or F16
 * (gpt-oss's experts also MXFP4), into fp32 (the experts' bf16 copies follow
 * when c->moe.dtype is bf16). A tensor absent is MOE_ERR_MISSING, one of another shape MOE_ERR_SHAPE,
 * one of another dtype MOE_ERR_DTYPE, a NaN or Inf MOE_ERR_VALUE: each naming the file and the tensor
 * (and both shapes). A tensor the model does not have is MOE_ERR_FORMAT naming the file and the tensor
 * (except rotary_emb.inv_freq tables, which older transformers saved and are recomputed).
 * A checkpoint whose weights take more than half of the memory available (MemAvailable) is mapped:
 * the parameters stored as the model keeps them (F32, whole, unpermuted; a GGUF file's too) become
 * private copy-on-write pages of the file, which the model unmaps when freed (a write to one, training,
 * copies that page; the file is never written; a file changed on disk while a model maps it changes
 * the model: do not), and a GGUF file's weights kept in their stored type are its mapped bytes. One that
 * fits is read into memory (2 MiB pages: decode reads it faster). MOE_NO_MMAP=1 in the environment
 * always reads, MOE_NO_MMAP=0 always maps. See DESIGN 4.8c. */
moe_status moe_lm_load(moe_lm_t *m, const char *dir, const moe_lm_config *c);
/* Bytes of m's weights that are pages of its checkpoint file, not copies: the fp32 ones moe_lm_load
 * mapped, and a GGUF file's weights kept in their stored type where they lie. Resident memory counts
 * them as the file's pages (RssFile, shared with the page cache, once touched); 0 when all were read. */
size_t moe_lm_mapped_bytes(const moe_lm_t *m);
/* Writes dir/model.safetensors (F32, the family's HF names, {"format": "pt"}) and dir/config.json (the
 * family's model_type and fields; dense layers as mlp_only_layers), each atomically,
 * creating dir when missing; an index json there is removed, since it would name other files. Expert-
 * parallel (cfg.moe.dist), a collective: the one-process model, every rank's experts, written by rank 0.
 * (Loading under expert parallelism reads each rank's own experts by name.) */
moe_status moe_lm_save(const moe_lm_t *m, const char *dir);
/* The ids that end generation for the checkpoint directory dir (what Hugging Face's generate stops at):
 * config.json's and generation_config.json's eos_token_id (an id or a list), tokenizer_config.json's
 * eos_token by its id in t (a chat model's end of turn, such as "<|im_end|>"), and t's
 * MOE_TOKENIZER_EOT; t may be NULL (the last two are then left out); files other than config.json may
 * be absent. A GGUF file (moe_lm_load's): its tokenizer.ggml.eos_token_id and eot_token_id, and t's
 * MOE_TOKENIZER_EOT. Each once, into eos (room for cap), *n of them; MOE_ERR_FORMAT naming the file, field and
 * value for one that is not a token id in [0, vocab), MOE_ERR_ARG when more than cap. */
moe_status moe_lm_eos_ids(const char *dir, const moe_tokenizer *t, int vocab, int32_t *eos, int cap, int *n);

/* GGUF files (llama.cpp's format, DESIGN 4.8) stand wherever a checkpoint directory does: given a path
 * ending in ".gguf" or a file starting with the GGUF magic, moe_lm_read_config reads the config from
 * llama.cpp's keys (general.architecture llama with experts (Mixtral), qwen2moe, qwen3moe, olmoe,
 * gpt-oss (its sliding window, layer pattern and YaRN keys; swiglu_alpha 1.702 and swiglu_limit 7, YaRN
 * truncated, as llama.cpp computes it) or deepseek2 (DeepSeek-V2/V3: the latent attention's, router's
 * and YaRN's keys, README's GGUF section);
 * {arch}.block_count, .embedding_length, .feed_forward_length, .expert_feed_forward_length,
 * .attention.head_count(_kv), .attention.key_length, .context_length, .rope.freq_base,
 * .attention.layer_norm_rms_epsilon, .expert_count, .expert_used_count, ...; the vocabulary from
 * token_embd.weight, tied embeddings when there is no output.weight) and moe_lm_load reads the weights
 * by llama.cpp's tensor names (blk.N.attn_q, ffn_gate_exps...; llama's q and k rows, which llama.cpp's
 * converter permutes per head, put back), every supported type dequantized to fp32 but the experts:
 * moe_lm_read_config sets moe.expert_type to the first gate stack's type when every MoE layer's three
 * stacks are of types (one, or a mix as llama.cpp's _M files have: moe_layer_bind_experts_typed)
 * that moe_layer_bind_experts takes (D and H whole blocks of it), and moe_lm_load then binds them where
 * they lie in the mapped file, kept open until moe_lm_free, and so the attention projections (q, k and v
 * together), dense layers' MLPs, the embedding and the head whose types have kernels and whose rows are
 * whole blocks (moe_lm_param_type; their refs are then unused) (expert_type -1: all dequantized;
 * moe_lm_save, moe_lm_save_gguf and moe_lm_backward refuse a model with bound bytes). A tensor absent is
 * MOE_ERR_MISSING, one of another shape MOE_ERR_SHAPE naming the file, the tensor and both shapes, an
 * unknown architecture or a tensor the model does not have MOE_ERR_FORMAT naming it. */
typedef struct {
  moe_gguf_type type;    /* the weights' type: 2-D weights but norms and routers (those stay F32); a row
                            not a multiple of the type's block is Q8_0 (a multiple of 32) or F16, as in
                            moe quantize */
  const char *tokenizer; /* NULL, or a tokenizer.json or a directory holding one (and tokenizer_config.json):
                            written as llama.cpp's tokenizer.ggml.* keys (moe_tokenizer_load reads them) */
  const char *name;      /* general.name; NULL: the family's model_type */
} moe_lm_gguf_options;
/* Writes m as llama.cpp's converter does (general.file_type, {arch}.* keys, tensor names, experts
 * stacked in 3-D tensors), atomically. o NULL: F32, no tokenizer. MOE_ERR_ARG for a model spread over
 * ranks or with a sliding window (llama's architecture has none), gpt-oss with a setting llama.cpp's
 * gpt-oss keys cannot say (swiglu_alpha and swiglu_limit other than 1.702 and 7, YaRN truncate 0 or
 * other mscales, full_layers other than the last of every n, no window, tied embeddings, no attention
 * biases), or DeepSeek with a setting deepseek2's keys cannot say (limiting expert groups, moe_layer_freq > 1,
 * rope_interleave 0, YaRN with other betas than 32 and 1, untruncated, or mscale other than
 * mscale_all_dim), naming it. */
moe_status moe_lm_save_gguf(const moe_lm_t *m, const char *path, const moe_lm_gguf_options *o);
/* The checkpoint src (a directory or a GGUF file, as moe_lm_load reads it; its experts dequantized)
 * written to dst as the loaded model would be, the very same bytes, without ever holding its experts:
 * dst ending in ".gguf" as moe_lm_save_gguf writes (options o), else a directory as moe_lm_save writes
 * (o unused). The dense weights are loaded (fp32) and each expert tensor made at save from src one
 * expert's projection at a time (read as moe_lm_load_streaming reads it). Held at once: the dense
 * weights, one expert's projection in fp32 (and the file's bytes of it when they are another type),
 * one chunk of the output tensor; a sharded directory's experts are read from whichever shard holds
 * each (gpt-oss's fused tensors, plain or MXFP4, and their biases too). A short or corrupt expert
 * tensor, or a shard missing or short, is an error naming it and the file, and dst is left unwritten.
 * numel (or NULL): the model's parameters. moe convert. */
moe_status moe_lm_convert(const char *src, const char *dst, const moe_lm_gguf_options *o, size_t *numel);

/* Generation: a KV cache of B sequences (every layer's rotated keys and values, or with latent attention
 * each token's normed latent and rotated shared key (moe_lm_mla), each sequence's
 * buffers grown as it reaches further, up to max_seq positions; a slot reset frees its own). moe_lm_decode runs tokens (B, T) at positions [len, len + T) of the cache's sequences,
 * appends their keys and values, and leaves their (B, T, vocab) logits in moe_lm_logits: the logits a
 * full forward of the whole sequences gives, to rounding. len + T <= max_seq. */
typedef struct moe_lm_cache moe_lm_cache;
moe_status moe_lm_cache_new(moe_lm_cache **out, const moe_lm_t *m, int B);
void moe_lm_cache_free(moe_lm_cache *c);
int moe_lm_cache_len(const moe_lm_cache *c);
void moe_lm_cache_reset(moe_lm_cache *c);
moe_status moe_lm_decode(moe_lm_t *m, moe_lm_cache *c, const int32_t *tokens, int T);
/* on: c's decodes (moe_lm_decode, moe_lm_decode_slots, moe_lm_decode_ragged) leave the logits of each row's last position only,
 * (rows, vocab) in moe_lm_logits, skipping the output layer for a prompt's other positions (generating
 * reads only the last); off (a new cache's): (rows, T, vocab). */
void moe_lm_cache_last_logits(moe_lm_cache *c, int on);
/* The next token from logits (V) into *token: temperature 0 takes the argmax (ties to the lower id); else
 * softmax(logits / temperature) cut to the smallest set of most probable tokens whose mass reaches top_p
 * (in (0, 1]; ties by id) and drawn with one uniform from *rng (splitmix64 state): the same seed gives
 * the same tokens. */
moe_status moe_lm_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng,
                         int32_t *token);
/* Token's log-probability under logits (V), their softmax at temperature 1, into *lp; and the n most
 * probable tokens (most probable first, ties to the lower id) and theirs into top_ids and top_lp (n of
 * each; NULL when n is 0). */
moe_status moe_lm_logprobs(const float *logits, int V, int32_t token, int n, float *lp, int32_t *top_ids,
                           float *top_lp);

/* ---- optimizers over any parameter table (the language model's refs, say) ----
 * moe_optim_init and moe_optim_step are these over a moe_model_t's refs. The state (n = numel) is in
 * the table's order; a step updates every ref's data from its grad (the caller refreshes derived
 * copies after: moe_lm_params_changed), on `threads` threads (0: one per processor) for a large table;
 * the bits do not depend on the thread count. */
moe_status moe_optim_init_n(moe_optim_t *o, const moe_optim_config *c, size_t numel);
void moe_optim_step_refs(moe_optim_t *o, moe_tensor_ref *refs, int nrefs, float lr, int threads);

/* ---- moe simulate: one training step (forward + backward) of one MoE layer over a simulated cluster
 * of nodes x devices, from the cost models the runtime decides with (DESIGN 4.6). A discrete-event
 * simulation: per device a compute stream, a communication stream and a host-copy stream; every
 * all-to-all is a collective of alpha-beta transfers over the two-level topology. ---- */
typedef struct moe_sim_config moe_sim_config;
/* Reads the JSON config (fields in DESIGN 4.6). An unknown field, a missing required one or a bad value
 * is MOE_ERR_FORMAT naming the file, the field and the value. Free with moe_sim_config_free. */
moe_status moe_sim_config_load(const char *path, moe_sim_config **out);
void moe_sim_config_free(moe_sim_config *c);
/* One value of a sweep: "devices" (nodes = value / devices_per_node; the experts per device are kept),
 * "batch" (tokens per device) or "capacity" (capacity factor). MOE_ERR_ARG naming the key and value. */
moe_status moe_sim_config_set(moe_sim_config *c, const char *key, double value);

typedef struct {
  int devices, nodes, experts, tokens; /* tokens per device */
  double capacity_factor;
  int n;                  /* micro-batches simulated: the config's, or Algorithm 1's when "auto" */
  int auto_n;             /* 1 when n is Algorithm 1's choice from simulated trial steps */
  const char *a2a;        /* "linear" or "2dh" */
  const char *reuse;      /* memory reuse simulated: "none", "s2", "s3", "s4" */
  int a2a_msgs;           /* messages each device sends in one all-to-all */
  double step_s;          /* the step: when the slowest device ends */
  double compute_s;       /* the busiest device's compute (forward + backward): the experts, and the
                             token-side passes when the machine's mem_bw is set */
  double compute_min_s;   /* the least busy device's */
  int slowest;            /* the busiest device */
  double comm_s;          /* the communication stream's busy time (all-to-alls, replica all-reduces) */
  double exposed_comm_s;  /* step_s - compute_s: what overlap did not hide on the busiest device */
  double peak_bytes;      /* the largest device's high-water mark (states + activation pools) */
  int fits;               /* peak_bytes <= the device memory (1 when the config gives none) */
  double eq6_phi;         /* with reuse: MPipeMoE's Eq. 6 bound on the memory it saves (text's buffers) */
  const char *eq10_reuse; /* the memory-saving strategy Eq. 10 picks for this micro-batch size */
  int r;                  /* Tutel's parallelism degree simulated (0 DP, 1 EP+DP, up to W/E: EP+DP+MP) */
  int tutel_r;            /* Tutel's dictionary's degree r, pipelining degree and all-to-all for this capacity */
  int tutel_d;
  const char *tutel_a2a;
  int flex;               /* replicas simulated: the fields below are set */
  double balance_before, balance_after; /* Eq. 6 before and after FlexMoE's plan */
  double step_before_s;   /* the step without the plan (step_s is with it) */
  double flex_xfer_s;     /* the plan's one-off transfers */
  int flex_ops;           /* Expand / Shrink / Migrate operations in the plan */
} moe_sim_result;
moe_status moe_sim_run(const moe_sim_config *c, moe_sim_result *r);
/* This machine's rates for a config (moe simulate --calibrate): the sgemm rate of one rank while every
 * rank runs them (threads each: the experts' GEMMs at 512 and 32 rows), and the token exchange among d's ranks fitted to lat + bytes / bw, bytes
 * being what a rank sends one peer (with one rank: the exchange's copy to itself). Every rank calls it. */
typedef struct {
  int devices;       /* the ranks measured: devices_per_node */
  double gemm_flops; /* FLOP/s of a large GEMM (Hockney's r_inf) */
  double gemm_half_rows; /* rows at which a GEMM reaches half that rate (n_1/2): gemm_half_rows */
  double bw, lat;    /* bytes/s and seconds: intra_bw, intra_lat */
} moe_sim_machine;
moe_status moe_sim_calibrate(const moe_dist *d, int threads, moe_sim_machine *out);
/* The same measurements as a config for moe_sim_config_load (moe simulate --calibrate's JSON: one node of
 * d's ranks, every GEMM kind's rate, mem_bw, the exchange's intra_bw and intra_lat, and a layer to
 * simulate on them) into buf (n bytes; MOE_ERR_ARG when it does not fit). Every rank calls it. */
moe_status moe_sim_calibrate_config(const moe_dist *d, int threads, char *buf, size_t n);
/* A serving run (a config with "serve_trace"): the trace's decode steps on one device with the
 * config's expert cache (at most 16384 steps). moe_sim_config_serves: whether c is one. MOE_ERR_ARG
 * for a config without a trace, a trace of another expert count or too many steps. */
typedef struct {
  int64_t steps, tokens, accesses, misses; /* tokens: of every step, through its first layer's router */
  int layers;
  int cache_experts;        /* the cache's slots per layer (0: every expert resident) */
  const char *cache_policy; /* its policy's name */
  double hit_rate;          /* 1 - misses / accesses */
  double time_s;            /* the run: every layer of every step, one after another */
  double token_s;           /* time_s / tokens */
  double fetch_s;           /* the misses' reads at fetch_bw */
  double fetch_wait_s;      /* what of them the compute waited for (the rest ran beside the hits) */
} moe_sim_serve_result;
int moe_sim_config_serves(const moe_sim_config *c);
moe_status moe_sim_serve(const moe_sim_config *c, moe_sim_serve_result *r);

/* ---- language-model training: the MoE layers' stats and where a step's time goes ---- */
/* Layer i's stats of the last forward (expert counts, the router's choices), as moe_model_layer_stats;
 * all zero for a dense layer. */
const moe_layer_stats *moe_lm_layer_stats(const moe_lm_t *m, int i);
/* Seconds in the transformer layers of moe_lm_forward and moe_lm_backward calls (not decodes) since
 * the last reset: the MoE layers (moe_layer_forward and _backward: their dispatch, expert GEMMs,
 * combine and the router's backward), the router (the layers' forward routers, stats.router_seconds,
 * and the balance loss: the router probabilities it recomputes and their gradient), and attention with
 * its norms and residual adds (the rest of a layer, a dense layer's MLP included). Embedding, final norm, output head and
 * cross-entropy are in none of them. */
typedef struct {
  double attention, experts, router;
} moe_lm_times;
void moe_lm_times_get(const moe_lm_t *m, moe_lm_times *out);
void moe_lm_times_reset(moe_lm_t *m);

/* Adaptive parallelism r (Tutel, moe_layer_config.parallel_r): one sharded layout for every r, so
 * that switching r moves no data. Rank q of W holds rows [H q / W, H (q + 1) / W) of every expert's
 * hidden dimension (experts.fc1.weight (E, Hq, D), fc1.bias (E, Hq), fc2.weight (E, D, Hq), fc3.weight
 * (E, Hq, D)) and columns [D q / W, D (q + 1) / W) of experts.fc2.bias (E, Dq). Any W and E (W > E
 * too). Files and checkpoints keep the whole tensors. */
#define MOE_PARALLEL_OFF (-2)
#define MOE_PARALLEL_AUTO (-1)
/* This layer's r from the next forward on (every rank must give the same); a sharded layer only. */
moe_status moe_layer_set_parallel_r(moe_layer_t *l, int r);
/* The r the last forward ran (clipped to [0, ceil(W/E)]; the adaptive choice under MOE_PARALLEL_AUTO),
 * -1 before the first. */
int moe_layer_parallel_r(const moe_layer_t *l);
/* Whether the last forward was a trial of the adaptive r (MOE_PARALLEL_AUTO: the dictionary of setups
 * per capacity window, Tutel's P2 1.7, searching), not its choice. */
int moe_layer_parallel_r_trial(const moe_layer_t *l);
/* Whole tensors <-> this rank's shards. whole is a layer of l's configuration without dist. gather
 * (collective): rank 0 gets every tensor of l's parameters (grads: its gradients) whole in whole's
 * parameters (grads), the others may pass NULL; take: l's parameters from whole's, no exchange. */
moe_status moe_layer_shard_gather(const moe_layer_t *l, int grads, moe_layer_t *whole);
moe_status moe_layer_shard_take(moe_layer_t *l, const moe_layer_t *whole);
/* moe_checkpoint_load_ranks with the model's layers sharded (parallel_r, not OFF: any r, any W; the file
 * is the one-process format, whatever W and r saved it). */
moe_status moe_checkpoint_load_sharded(const char *path, const moe_dist *d, int parallel_r, moe_model_t *m,
                                       moe_optim_t *o, moe_train_state *ts);

/* ---- FlexMoE: replicas of hot experts (DESIGN 3.4) ----
 * Each rank has E_v expert slots; a slot holds a replica of one expert, and an expert's tokens are
 * split over its replicas. The scheduler (balance ratio over a threshold) and the policy maker (the
 * step-time model of Eqs. 5, 7-9) decide Expand / Shrink / Migrate operations. */
#define MOE_FLEX_RATE_BUCKETS 8 /* moe_flex_env's rate profile: at most this many sizes */
typedef struct {
  double tps;                /* expert tokens per second, forward + backward (Eq. 7), where rate_n is 0 */
  double a2a_lat, a2a_bw;    /* a message between two ranks: seconds, bytes per second (Eq. 8) */
  double ar_lat, ar_bw;      /* an all-reduce: seconds, bytes per second each rank sends (Eq. 9) */
  double token_bytes;        /* one token's row */
  double expert_bytes;       /* one expert's gradients (its weights); Expand and Migrate copy 3x this
                                (weights and AdamW's two moments) */
  /* The rate by rows per expert (0 to MOE_FLEX_RATE_BUCKETS sizes, rate_rows ascending and > 0): an
   * expert's per-row cost changes with its rows, and the model takes the rate at each expert's rows
   * from these (per-row seconds interpolated linearly in log rows, the end sizes' beyond them). */
  int rate_n;
  double rate_rows[MOE_FLEX_RATE_BUCKETS], rate_tps[MOE_FLEX_RATE_BUCKETS];
} moe_flex_env;
/* The policy maker over a sequence of steps' counts, as in training: the placement carries over from
 * step to step. ranks <= 64, slots * ranks >= experts; the initial placement is expert parallelism's
 * blocks (each rank's own experts repeated in its spare slots). */
typedef struct moe_flex_sim moe_flex_sim;
typedef struct {
  double balance_before, balance_after; /* Eq. 6: busiest rank's tokens over the mean */
  double time_before, time_after;       /* Eq. 5's modelled step time (s) */
  double xfer_s;                        /* the plan's state copies, one after another (s) */
  int expands, shrinks, migrates;
} moe_flex_step;
moe_status moe_flex_sim_new(moe_flex_sim **out, int ranks, int slots, int experts, const moe_flex_env *env,
                            double threshold);
void moe_flex_sim_free(moe_flex_sim *s);
/* One step: src (ranks, experts) tokens of each rank for each expert. Runs the scheduler, applies its
 * plan and reports it. */
moe_status moe_flex_sim_step(moe_flex_sim *s, const int64_t *src, moe_flex_step *out);
/* The model's terms measured on c's ranks (c->dist with more than one rank; a collective, every rank
 * gets rank 0's values of the mean over ranks, bit for bit): tokens per second of the experts (a
 * one-expert layer of c's shape timed forward and backward) at 64, 128, ... rows, as many sizes as
 * about 12 s of compute allows (tps: the largest size's), the all-to-all's and the all-reduce's
 * latency and bandwidth, each fitted over 4 sizes. */
moe_status moe_flex_profile(const moe_layer_config *c, moe_flex_env *out);
/* A layer with replica slots: the scheduler and policy maker once over its last forward's counts (plans
 * kept when `horizon` steps, 0 for 10, repay their copies), the placement landing at once with the
 * experts' weights (a collective; a layer outside a model has no optimizer state to move). */
moe_status moe_layer_flex_rebalance(moe_layer_t *l, const moe_flex_env *env, double threshold, int horizon,
                                    moe_flex_step *out);
/* Training with replicas: a model whose layers have replica_slots > 0 (expert-parallel). new profiles
 * the experts' tokens per second and the all-to-all's and all-reduce's latency and bandwidth (a
 * collective: every rank calls it; moe_flex_trainer_env gives the fitted terms). After every step,
 * push hands the blocks' counts to a RECOMPILE trigger running the scheduler (balance ratio over
 * `threshold`) and the policy maker (a plan is kept when `horizon` steps, 0 for the default 10, of
 * its modelled gain repay its copies); begin, before every step, lands the placements decided
 * delta_launch + 1 steps earlier (rank 0's, on every rank), moving the experts' weights and optimizer
 * state point to point. ops (NULL: none), a test hook that replaces the policy: "STEP:expand:E:G",
 * "STEP:shrink:E:G" or "STEP:migrate:A:I:B:J" (A on rank I swaps with B on rank J), comma-separated,
 * each landing at the start of STEP on every block. Training equals the run without replicas. */
typedef struct moe_flex_trainer moe_flex_trainer;
typedef struct {
  int64_t steps, placements;            /* steps pushed, placement changes landed */
  int64_t expands, shrinks, migrates;   /* their operations */
  double bytes_moved;                   /* expert states copied between ranks, all ranks together */
  double balance_sum, balance_last;     /* Eq. 6 with the replicas, the blocks' mean: summed over steps, last */
  double balance_blocks_sum;            /* the same without replicas (expert parallelism's blocks) */
} moe_flex_stats;
moe_status moe_flex_trainer_new(moe_flex_trainer **out, moe_model_t *m, double threshold, int horizon,
                                int delta_launch, const char *ops);
void moe_flex_trainer_free(moe_flex_trainer *t);
void moe_flex_trainer_env(const moe_flex_trainer *t, moe_flex_env *env);
moe_status moe_flex_trainer_begin(moe_flex_trainer *t, moe_model_t *m, moe_optim_t *o, int64_t step);
moe_status moe_flex_trainer_push(moe_flex_trainer *t, const moe_model_t *m, int64_t step, double loss);
void moe_flex_trainer_stats(const moe_flex_trainer *t, moe_flex_stats *s);

/* ---- continuous batching (moe serve): the B slots of a KV cache hold sequences of their own lengths,
 * which join and leave between decode steps. A cache is used either through moe_lm_decode (all slots at
 * one length) or through these. ---- */
/* Slot `slot`'s length (-1 when out of range); reset empties it for a new sequence. */
int moe_lm_cache_slot_len(const moe_lm_cache *c, int slot);
void moe_lm_cache_slot_reset(moe_lm_cache *c, int slot);
/* tokens (n, T): row i runs at positions [len, len + T) of slot slots[i] (n distinct slots), appending
 * its keys and values there; the (n, T, vocab) logits go to moe_lm_logits. A row's logits are those of
 * decoding its sequence alone, to rounding (the batch's GEMMs have other shapes). */
moe_status moe_lm_decode_slots(moe_lm_t *m, moe_lm_cache *c, const int *slots, int n, const int32_t *tokens,
                               int T);
/* The ragged form, what a continuous-batching step runs in one forward (new prompts of any length and
 * running sequences' next tokens): slot slots[i] gets counts[i] >= 1 tokens, at positions [len, len +
 * counts[i]) of it; tokens holds row 0's counts[0], then row 1's, ...; the (sum of counts, vocab) logits
 * go to moe_lm_logits in that order (with moe_lm_cache_last_logits on, (n, vocab): row i slot slots[i]'s
 * last position). moe_lm_decode_slots is the case of counts all T. Each row's logits are those of its
 * sequence alone, to rounding. */
moe_status moe_lm_decode_ragged(moe_lm_t *m, moe_lm_cache *c, const int *slots, int n, const int32_t *tokens,
                                const int *counts);
/* (n_layers, E) tokens each expert got in the last decode through c (expert traces, moe serve --trace). */
const int32_t *moe_lm_cache_expert_counts(const moe_lm_cache *c);

/* ---- the continuous-batching engine (DESIGN 4.7; moe serve's, usable from C with no HTTP) ----
 * One thread owns the model and a KV cache of `slots` sequences. Between steps finished and released
 * requests leave their slots and every queued one that finds a free slot joins; then one forward
 * (moe_lm_decode_ragged) runs the prompts that joined, of any lengths, in join order while they fit in
 * MOE_ENGINE_PREFILL_TOKENS (the first always; the rest wait for the next step), and the last token of
 * every running request: each gets its next token from the logits of its last position, as moe
 * generate runs a prompt. A prompt wanting prompt_logprobs runs alone first, with every position's
 * logits. Each request samples with its own generator, so a request gives the tokens it gets
 * alone, and moe generate's for the same seed (greedy: the same; sampled: to rounding of the logits). */
typedef struct moe_engine moe_engine;
typedef struct moe_engine_req moe_engine_req;
typedef struct {
  int rows;             /* running requests' tokens in the step's forward (0: prompts only) */
  int tokens;           /* tokens generated (an end token not counted) */
  int prompt_tokens;    /* prompt tokens read */
  double seconds;       /* the step's forwards */
  int prefills;         /* forwards that ran prompts: the step's one when it held any, and one for each
                           prompt wanting prompt_logprobs (alone) */
  int prompts;          /* prompts in the step's forward (beside the `rows` running requests' tokens) */
  int forwards;         /* forwards through the model: 1, and one for each prompt wanting prompt_logprobs */
} moe_engine_step;
#define MOE_ENGINE_PREFILL_TOKENS 512
typedef struct {
  int slots;                /* sequences decoded together (>= 1) */
  const moe_tokenizer *tok; /* the text of tokens, for stop strings and moe_engine_text (NULL: requests
                               may have no stop strings) */
  const int32_t *eos;       /* n_eos ids (copied) that end a request, not kept, unless it ignores them */
  int n_eos;
  /* called on the engine's thread (NULL: not called): after each step with work, and after each
   * forward through the model (a prompt, or a step's decode) with its (n_layers, E) tokens per expert
   * (moe_lm_cache_expert_counts: expert traces) */
  void (*on_step)(void *ctx, const moe_engine_step *s);
  void (*on_decode)(void *ctx, const int32_t *expert_counts);
  void *ctx;
} moe_engine_config;
typedef struct {
  const int32_t *prompt;    /* n_prompt >= 1 ids in [0, vocab) (copied) */
  int n_prompt;
  int max_tokens;           /* >= 1 (0 with prompt_logprobs); n_prompt + max_tokens <= the model's max_seq */
  float temperature, top_p; /* as moe_lm_sample */
  uint64_t seed;
  int ignore_eos;           /* go on past the end tokens */
  const char *const *stop;  /* n_stop strings (copied, at most MOE_ENGINE_STOPS): generation ends with */
  int n_stop;               /* the token whose text completes one; the text to show ends before it */
  int logprobs;             /* 1: each token's log-probability under the model (its softmax at
                               temperature 1) and those of the top_logprobs most probable tokens (at most
                               MOE_ENGINE_TOP_LOGPROBS; ties to the lower id); 0: none */
  int top_logprobs;
  int prompt_logprobs;      /* with logprobs 1: the prompt's tokens' log-probabilities and top_logprobs
                               alternatives too (each from the logits of the position before it; the
                               first token has none: NaN), what a completions server's echo gives;
                               max_tokens may then be 0 (the prompt scored, nothing generated) */
} moe_engine_params;
#define MOE_ENGINE_STOPS 16
#define MOE_ENGINE_TOP_LOGPROBS 20
typedef struct {
  int n;                 /* tokens generated so far */
  const int32_t *tokens; /* (n) valid until moe_engine_release; those given never change */
  int done;              /* 0 running or queued, 1 finished, -1 failed (error says why) */
  int stop;              /* finished at an end token or a stop string, not at max_tokens */
  size_t text_safe;      /* with a tokenizer: the bytes of the tokens' text (moe_engine_text) that may
                            be shown: complete characters (a moe_detokenizer's text), not a stop string
                            nor the start of one; it only grows; 0 without a tokenizer */
  const char *error;     /* when failed, valid until release */
  double ttft_s, total_s; /* seconds from submit to the first token and to the end; -1 until known */
  const float *logprobs; /* (n) with params.logprobs, else NULL */
  const int32_t *top_ids; /* (n, n_top) the most probable tokens at each step, most probable first */
  const float *top_logprobs; /* (n, n_top) their log-probabilities */
  int n_top;
  const float *prompt_logprobs;      /* (n_prompt) with params.prompt_logprobs once done or with a token
                                        (the first NaN), else NULL */
  const int32_t *prompt_top_ids;     /* (n_prompt, n_top) */
  const float *prompt_top_logprobs;  /* (n_prompt, n_top) */
} moe_engine_state;
typedef struct {
  int queued, running;   /* requests waiting for a slot, and in one */
  int64_t steps, tokens, prompt_tokens;
  double busy_s;         /* the thread's time in steps */
  int64_t prefills;      /* forwards that ran prompts (moe_engine_step) */
  int64_t forwards;      /* forwards through the model (moe_engine_step) */
} moe_engine_stats;

/* Starts the engine's thread over m (which it owns until moe_engine_free; m's threads run the steps),
 * after releasing the calling thread's OpenMP workers (moe_threads_release). */
moe_status moe_engine_new(moe_engine **out, moe_lm_t *m, const moe_engine_config *c);
/* Queues a request; *out is the caller's handle until moe_engine_release. MOE_ERR_STATE once draining,
 * MOE_ERR_ARG naming the field for a bad one. */
moe_status moe_engine_submit(moe_engine *e, const moe_engine_params *p, moe_engine_req **out);
/* Waits until r has more than `have` tokens or is done (have -1: returns at once) and reports it. */
void moe_engine_wait(moe_engine *e, moe_engine_req *r, int have, moe_engine_state *st);
/* Bytes [from, to) of r's text (to <= a state's text_safe) into a new NUL-terminated buffer *out of *len
 * bytes (free() it): UTF-8, as the tokenizer's decoders give the tokens' text. MOE_ERR_STATE without the
 * engine's tokenizer, MOE_ERR_ARG for bytes not yet shown. */
moe_status moe_engine_text(moe_engine *e, moe_engine_req *r, size_t from, size_t to, char **out, size_t *len);
/* Drops the handle: an unfinished request is cancelled (it leaves its slot before the next step). */
void moe_engine_release(moe_engine *e, moe_engine_req *r);
void moe_engine_get_stats(moe_engine *e, moe_engine_stats *st);
/* Takes no more requests, finishes those queued and running, and ends the thread; then free. */
void moe_engine_drain(moe_engine *e);
int moe_engine_draining(moe_engine *e);
/* Drains first. Release every request handle before (their memory is freed by the last release). */
void moe_engine_free(moe_engine *e);

/* Expert buffering for a loaded model (deployment paper VI, moe serve --cache K): every MoE layer's
 * experts are freed and served instead by an expert cache of K slots (policy p) reading dir's
 * model.safetensors, or the shards of its index, lazily (any family, gpt-oss's fused experts too); the
 * outputs do not change. The experts' refs get data NULL: the model serves forward and decode only.
 * Free m (moe_lm_free) before x. On an error m may be half converted: free it. */
typedef struct {
  moe_expert_cache **caches; /* (n) one per MoE layer (NULL for a dense layer) */
  int n;
  struct moe_lm_prefetch *prefetch; /* moe_lm_load_streaming's predictor, or NULL */
  size_t budget;             /* moe_lm_load_streaming: the budget asked for; the slots' bytes are the
                                caches' resident_bytes, summed (at most the budget) */
} moe_lm_experts;
moe_status moe_lm_buffer_experts(moe_lm_t *m, const char *dir, int K, moe_cache_policy p, moe_lm_experts *x);
void moe_lm_experts_free(moe_lm_experts *x);

/* ---- experts streamed from the checkpoint under a memory budget (DESIGN 4.11; moe generate, eval and
 * serve --memory-budget SIZE): the model's dense weights are read and stay resident; the experts' are
 * never read at load, but on demand from dir's model.safetensors or the shards of its index, each shard
 * opened once for every layer (F32 or BF16 tensors per expert or stacked; or gpt-oss's fused ones, dense
 * or MXFP4, an expert's slab at a time), or from a GGUF file's
 * stacked experts dequantized per expert (any type with a codec; MOE_ERR_ARG when c's expert_type says the
 * experts compute in their stored type: moe.expert_type -1 streams them dequantized) into expert caches (moe_expert_cache) whose slots together take at most
 * `budget` bytes. Every read drops its pages from the page cache, and runs on each layer's loader
 * thread while the experts already resident compute. With prefetch, before MoE layer l computes, the
 * next MoE layer's router (after its post-attention norm) is applied to layer l's hidden state and its
 * top-k experts (the union over the batch's rows) are read ahead into that layer's cache; each cache's
 * stats score the prediction (precision and recall). Outputs are the all-resident model's bit for bit,
 * whatever the budget, policy and prefetch: only when an expert is read changes. */
typedef enum { MOE_LM_PLACE_EQUAL, MOE_LM_PLACE_MISS_COST } moe_lm_placement;
typedef struct {
  size_t budget;             /* bytes of expert slots over all MoE layers (>= one expert per layer) */
  moe_cache_policy policy;   /* LIFO, LRU, FIFO, LFU or LFRU (default LRU) */
  moe_prefetch_mode prefetch; /* the next layer's predicted experts: OFF not predicted, ON read ahead,
                                AUTO (default) read ahead where that pays (moe_expert_cache_set_prefetch) */
  int keep_page_cache;       /* 1: leave the file's pages in the page cache (the kernel's cache beside the
                                slots, as with mmap); default 0: every read drops them */
  moe_lm_placement placement; /* how the budget's slots are placed across the MoE layers (default EQUAL) */
  const moe_trace *placement_trace; /* MISS_COST: a trace of this model (layer = the model's layer index) */
  const moe_trace *pin_trace; /* or NULL: pin each MoE layer's most used experts in this trace */
  int pin;                   /* pinned per MoE layer (0: half the layer's slots), at most its slots - 1 */
} moe_lm_stream_config;
void moe_lm_stream_config_default(moe_lm_stream_config *s);
const char *moe_lm_placement_name(moe_lm_placement p); /* "equal", "miss-cost" */
moe_status moe_lm_placement_parse(const char *s, const char *field, moe_lm_placement *out);
/* Loads m as moe_lm_load does (c NULL: dir's config.json), without the experts' weights, and serves
 * its experts through x (free m, then x). A slot takes moe_expert_cache_slot_bytes (a GGUF file's
 * experts in their stored types: their bytes, each layer its own). EQUAL: budget / (one slot of every
 * MoE layer) slots each, at most E. MISS_COST: each layer's misses for every slot count are simulated
 * (moe_cachesim, s->policy) over placement_trace, and the counts that minimise the bytes the layers'
 * misses read (each a slot's; with slots of one size, the fewest misses) with their slots' bytes within
 * the budget, at least 1 and at most E a layer, are taken (dynamic programming over the layers and the
 * budget in units of the slots' common divisor, exact up to max(2 layers E, 16384) units, coarser units
 * rounded up past that; ties to more slots). With pin_trace,
 * each MoE layer's `pin` experts active in the most of the trace's steps (ties to the lower id; never
 * one the trace does not use) are read at load into its slots and never evicted (moe_expert_cache_pin). */
moe_status moe_lm_load_streaming(moe_lm_t *m, const char *dir, const moe_lm_config *c, const moe_lm_stream_config *s,
                                 moe_lm_experts *x);

/* ---- OpenAI-compatible request bodies (DESIGN 4.7): what moe serve parses, for any front-end ----
 * The parsers of POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize bodies, apart
 * from HTTP (and fuzzed: fuzz/fuzz_completion.c), giving a moe_request that maps onto moe_engine_params. */
#define MOE_REQUEST_STOPS 4        /* stop strings at most, as OpenAI */
#define MOE_REQUEST_STOP_BYTES 256 /* bytes of a stop string at most */

typedef struct {
  int32_t *ids;      /* the prompt's token ids (malloc'd; free with moe_request_free) */
  int n_ids;
  int max_tokens;    /* >= 1 (0 with echo); when absent 16 as OpenAI, or fewer to fit the context */
  float temperature; /* >= 0, 1 when absent; 0 is greedy */
  float top_p;       /* (0, 1], 1 when absent */
  uint64_t seed;     /* 0 when absent (moe generate's default) */
  int stream;        /* server-sent events */
  int ignore_eos;    /* go on past the end-of-text token */
  int echo;          /* completions: the prompt's text (and with logprobs its tokens') before the answer */
  int logprobs;      /* each token's log-probability, and those of the top_logprobs most probable */
  int top_logprobs;
  char *stop[MOE_REQUEST_STOPS]; /* the text ends before the first of these found (malloc'd) */
  int n_stop;
} moe_request;

/* Parses the n bytes of body (none may be a \u0000 escape: cJSON's strings end at the NUL): a JSON
 * object with "prompt" (a string, through tok, or an array of token
 * ids in [0, vocab); tok NULL refuses strings), and optional "max_tokens", "temperature", "top_p",
 * "seed" (integers >= 0 for the integers), "stream", "ignore_eos" and "echo" (booleans; echo lets
 * max_tokens be 0), "logprobs" (null, or the alternatives per token in [0, 5]), "stop" (a string or up
 * to 4 in an array, each 1 to 256 bytes; it needs tok); "model" and "user" (strings) have no effect.
 * OpenAI's fields the server does not implement are taken only with the value that turns them off or
 * null ("n" 1, "best_of" 1, "logit_bias" {}, the penalties 0, "suffix" null); any other value, and any other field, is refused by name.
 * The prompt and max_tokens must fit the context of max_seq positions. MOE_ERR_FORMAT (not JSON, not
 * an object) or MOE_ERR_VALUE (a field missing, of the wrong type or out of range), naming the field
 * and its value. */
moe_status moe_request_parse_completion(const char *body, size_t n, const moe_tokenizer *tok, int vocab, int max_seq,
                                 moe_request *out);
/* POST /v1/chat/completions' body: "messages" (a non-empty list of {"role": system|developer|user|
 * assistant|tool, "content": a string, a list of parts, or null for an assistant's}) rendered by the chat
 * template (moe_chat_template_apply with the generation prompt; NULL: chat is refused) and encoded with the template's special tokens as tokens; then
 * "max_tokens" (or "max_completion_tokens"), "temperature", "top_p", "seed", "stream", "ignore_eos" and
 * "stop" as for completions, "logprobs" (a boolean) with "top_logprobs" (0 to 20), OpenAI's other fields as
 * there. Errors as
 * moe_request_parse_completion's, and the template's. */
typedef struct moe_chat_template moe_chat_template;
moe_status moe_request_parse_chat(const char *body, size_t n, const moe_tokenizer *tok,
                                  const moe_chat_template *chat_template, int max_seq, moe_request *out);
/* POST /tokenize's body {"prompt": text, "add_special_tokens": bool} (vLLM's): its ids (special tokens
 * written in the text as theirs; BOS/EOS with add_special_tokens) into c->ids; POST /detokenize's
 * {"tokens": [ids]}: the ids, each in [0, vocab). "model" is taken; other fields are refused by name. */
moe_status moe_request_parse_tokenize(const char *body, size_t n, const moe_tokenizer *tok, moe_request *out);
moe_status moe_request_parse_detokenize(const char *body, size_t n, int vocab, moe_request *out);
void moe_request_free(moe_request *c);
/* The n bytes of in as UTF-8 into out (room for 3 n + 1 bytes; NUL-terminated): well-formed sequences as
 * they are, every other byte as U+FFFD (Python's errors="replace"), as JSON needs text. Its length. */
size_t moe_utf8_clean(const char *in, size_t n, char *out);

/* ---- a checked optimizer step ----
 * moe_optim_step and then moe_model_check_finite(m, o) in the same pass over the parameters: the
 * update notes whether each value it writes is finite, and only when one is not are they scanned
 * for the first bad one to name. MOE_ERR_VALUE as moe_model_check_finite (on every rank). The
 * gradients it read are left zeroed, as moe_model_zero_grad leaves them (the same pass, not another). */
moe_status moe_optim_step_checked(moe_optim_t *o, moe_model_t *m, float lr);

/* ---- Tutel's dictionary of setups (P2 1.7): parallel_r -1, pipeline 0 or a2a_auto ---- */
/* A layer with any of them adaptive keeps one dictionary: key floor(capacity / window), value (r,
 * micro-batches n, all-to-all algorithm), each entry found once by trial steps (the paper's ternary
 * search over r per (n, algorithm) offered) and then returned without trials. The setup of the last
 * forward; returns 0 (and *out zeroed) when the layer has no dictionary. */
typedef struct {
  int capacity, key, window; /* the forward's capacity, floor(capacity / window) */
  int r;                     /* parallel_r that ran (-1: experts not sharded) */
  int n;                     /* micro-batches */
  moe_a2a a2a;
  int trial;                 /* a trial step of the search, not the entry */
  int searched;              /* what the dictionary chooses: bit 1 r, 2 n, 4 the all-to-all */
  long long trials;          /* distinct setups tried so far, all keys */
  int entries;               /* keys with an entry */
  double bound;              /* the paper's trials per key for this search: (log_1.5 ceil(W/E) + 2)
                                per (n, algorithm) offered when r is searched, else 1 each */
  const char *note;          /* what the entries do not offer and why; "" when nothing is held back */
} moe_layer_setup_info;
int moe_layer_setup(const moe_layer_t *l, moe_layer_setup_info *out);
/* "r 1, n 2, linear" and the rest of info in one line (no newline), for the CLI. */
void moe_layer_setup_format(const moe_layer_setup_info *info, char *buf, size_t size);

/* ---- language model under expert parallelism: vectors in the one-process order ---- */
/* A vector over m's parameters in the order of m->refs (its weights, Adam's moments): under expert
 * parallelism a rank's holds its own experts only. The one-process model's has moe_lm_whole_numel
 * floats (m->numel with one process). moe_lm_gather (a collective) gives every rank the one-process
 * vector of every rank's local ones (the replicated parameters rank 0's); moe_lm_scatter takes this
 * rank's part of one (no exchange), as a resumed run does with the trainer state's moments. */
size_t moe_lm_whole_numel(const moe_lm_t *m);
moe_status moe_lm_gather(const moe_lm_t *m, const float *local, float *whole);
moe_status moe_lm_scatter(const moe_lm_t *m, const float *whole, float *local);

/* ---- chat templates (Hugging Face's Jinja chat_template; DESIGN 4.9) ----
 * A template renders byte for byte as @huggingface/jinja (the renderer of transformers.js) renders it,
 * its JavaScript semantics included: numbers are doubles, `==` is JavaScript's loose equality, strip()
 * and lstrip()/rstrip() take no argument and strip all whitespace, undefined names are undefined rather
 * than errors. What it does not implement (a filter, test, method or statement it lacks: it has no
 * `format`, `round` or string `split` filter either) is an error, MOE_ERR_FORMAT for the syntax and
 * MOE_ERR_VALUE when rendering, naming the construct and its line:col in the template; so is
 * raise_exception(msg) ("raise_exception: msg at L:C"). upper/lower/title/capitalize map ASCII
 * letters only. A render is bounded (256 MiB of memory, 50 million steps, lists of 2^20 items,
 * nesting 200 deep): past a bound it fails, naming it.
 * now: the time strftime_now formats (Unix seconds, in UTC), or -1 for the clock in local time. */
/* Renders tmpl over context_json, a JSON object whose members are the template's variables
 * (messages, add_generation_prompt, bos_token, tools, ...; NULL or "" for none). *out: the text
 * (malloc'd, NUL-terminated; free() it), *len its length (may be NULL). */
moe_status moe_chat_template_render(const char *tmpl, const char *context_json, int64_t now, char **out, size_t *len);
/* A model's chat template: tokenizer is a tokenizer_config.json or the directory holding it; its
 * chat_template (a string, or the "default" of a list of {name, template}) renders over the
 * conversation with the variables transformers.js's apply_chat_template gives it: messages,
 * add_generation_prompt (0 or 1), tools and documents (none), the config's bos_token, eos_token,
 * unk_token, sep_token, pad_token, cls_token and mask_token that are set (a string, or an object with
 * a "content" string). conversation_json: a list of messages ({"role", "content", ...}), or an object
 * with "messages" whose other members (tools, enable_thinking, ...) are variables too, overriding the
 * others. MOE_ERR_MISSING without a template. */
moe_status moe_chat_template_render_config(const char *tokenizer, const char *conversation_json,
                                           int add_generation_prompt, int64_t now, char **out, size_t *len);
/* The same in two steps, so that a server reads the template once: moe_chat_template_load reads
 * tokenizer's chat template and special tokens (errors as above), moe_chat_template_apply renders it
 * over a conversation (any number of times, from any threads at once). */
moe_status moe_chat_template_load(moe_chat_template **out, const char *tokenizer);
moe_status moe_chat_template_apply(const moe_chat_template *t, const char *conversation_json,
                                   int add_generation_prompt, int64_t now, char **out, size_t *len);
void moe_chat_template_free(moe_chat_template *t);
/* Frees what a moe_ function handed out malloc'd (the rendered text above), for callers that do not
 * share the library's C allocator (Python's ctypes). */
void moe_free(void *p);

/* ---- training: moe_trainer, one loop over a model interface (DESIGN 4.10) ----
 * A step: the model's batch for the step (a function of the seed and the step, so that a resumed run
 * sees the batches the uninterrupted one would have), forward with the loss, backward, the optimizer's
 * update at the schedule's rate (linear warm-up, cosine decay over the steps, or with a time budget
 * over the training seconds); every eval_every steps, at stop_after and at the end: the validation
 * loss, a checkpoint (the model's files and trainer_state.safetensors) and, when the loss is the
 * lowest so far, the model alone in keep_best. Under expert parallelism (the model's dist) every rank
 * runs the trainer on its slice of each batch; the training seconds are rank 0's, the files are
 * written by rank 0. Resuming from a checkpoint gives the uninterrupted run's steps bit for bit. */
typedef struct {
  double loss;         /* what backward differentiates: the task's loss and its auxiliary terms */
  double ce;           /* the task's loss (the language model's mean cross-entropy) */
  int tokens;          /* targets counted */
  int dropped;         /* expert assignments dropped for capacity, over the MoE layers and ranks */
  double assigned;     /* expert assignments, over the MoE layers and ranks */
  double expert_flops; /* this rank's experts' FLOPs, forward and backward (about) */
  double attention_s, experts_s, router_s; /* where the step's time went, as moe_lm_times */
  double aux;          /* the classifier's auxiliary losses (moe_model_stats.aux; 0 for the language model) */
  int correct;         /* the classifier's right predictions on this rank's slice of the batch */
} moe_train_batch_stats;
/* The model interface: what a trainer needs of a model and its data. self is the implementation's;
 * refs (parameters with their gradients, the optimizer's table) and numel this rank's. */
typedef struct {
  void *self;
  moe_tensor_ref *refs;
  int nrefs;
  size_t numel;
  const moe_dist *dist;          /* expert parallelism over its ranks; NULL: one process */
  const moe_layer_config *layer; /* the MoE layers' options (kept in the trainer state) */
  size_t whole_numel;            /* parameters of the one-process model (numel with one process) */
  int64_t samples;               /* the training data's samples: batch's sample ids are below it */
  int steps_per_epoch;           /* steps a pass over the training data takes */
  /* The MoE layers DynaMoE's adjustments change (NULL: the model has none to adjust), all of
   * configuration `layer`, their stats of the last forward, and the rows a step's batch puts through
   * them (over all ranks: tokens for the language model, samples for the classifier). */
  moe_layer_t *moe_layers;
  int n_moe_layers;
  const moe_layer_stats *(*layer_stats)(void *self, int i);
  int rows;
  /* Step's batch (its sample ids into *samples, *n: sample-assignment caching's samples). */
  moe_status (*batch)(void *self, int64_t step, const int32_t **samples, int *n);
  /* Zeroes the gradients, then the batch's loss (keeping what backward needs) into st. */
  moe_status (*forward)(void *self, moe_train_batch_stats *st);
  /* Adds the loss's gradients into the refs' grads; the seconds of forward and backward into st. A
   * non-finite activation or gradient may be MOE_ERR_VALUE from forward or backward (naming it): the
   * trainer takes it for a non-finite loss. */
  moe_status (*backward)(void *self, moe_train_batch_stats *st);
  void (*params_changed)(void *self); /* after an update: derived copies (bf16 experts) */
  /* The model's own update at rate lr (NULL: the optimizer over refs, then params_changed): it updates
   * the parameters and their derived copies, and returns MOE_ERR_VALUE naming the first parameter or
   * optimizer state it left non-finite (the classifier's moe_optim_step_checked). */
  moe_status (*update)(void *self, moe_optim_t *opt, float lr);
  /* The validation loss, and the accuracy where the model has one (the classifier: its loss is the
   * error rate; *accuracy is NAN when the model leaves it). */
  moe_status (*evaluate)(void *self, double *loss, double *accuracy);
  moe_status (*save)(void *self, const char *dir);  /* the model's files (a collective) */
  /* Vectors over the refs <-> the one-process order (Adam's moments in the trainer state); as
   * moe_lm_gather (a collective) and moe_lm_scatter. */
  moe_status (*gather)(void *self, const float *local, float *whole);
  moe_status (*scatter)(void *self, const float *whole, float *local);
  /* The model's own checkpoint, one file at path with the optimizer's state and the steps done (the
   * classifier's moe_checkpoint_save), written in place of moe_trainer_save's directory; NULL: that. */
  moe_status (*checkpoint)(void *self, const char *path, const moe_optim_t *opt, int64_t step);
  /* DeepSeek-V3's aux-loss-free balancing after an update: every MoE layer's selection bias moved by
   * gamma by the last forward's expert counts, summed over the ranks (moe_layer_balance_bias); NULL:
   * the model has no selection bias. */
  moe_status (*balance_bias)(void *self, float gamma);
  void (*free)(void *self);
} moe_train_model;

/* DynaMoE's adjustments (RECOMPILE, moe_recompile_*), which the trainer runs over the model's MoE
 * layers: per-expert dynamic capacity (4.1: every step's expert counts go to a trigger thread, whose
 * capacities (moe_dynamic_capacity over smoothed counts) take effect delta_launch + 1 steps later,
 * rank 0's on every rank) and sample-assignment caching (4.2: each sample's experts recorded per epoch;
 * at an epoch's end the fraction not reassigned, frac_same, switches caching on (>= on, from epoch
 * min_epoch) or off (< off), delta_launch + 1 steps later; while on, a batch is routed with its samples'
 * assignments of the previous epoch). Kept in the trainer state. */
typedef struct {
  float on, off; /* caching switches on at frac_same >= on (from epoch min_epoch), off below off */
  int min_epoch;
} moe_cache_switch;
typedef struct {
  int dynamic_capacity, delta_launch; /* per-expert capacities through RECOMPILE, decisions delta late */
  float headroom;
  int cache_assignments;              /* DynaMoE 4.2's sample-assignment caching */
  moe_cache_switch cache;
} moe_train_adjust;

typedef enum {
  MOE_ON_NAN_STOP = 0, /* a non-finite loss ends training: MOE_ERR_VALUE "step S: training diverged (loss X)",
                          or the model's own MOE_ERR_VALUE */
  MOE_ON_NAN_SKIP,     /* the step's update is dropped (a non-finite loss or gradient) or undone (one that
                          made a parameter or Adam's state non-finite); counted in skipped */
} moe_on_nan;

typedef struct moe_train_step moe_train_step;
typedef struct {
  float lr;            /* the peak rate (1e-3) */
  int steps;           /* the schedule's length (1000) */
  int warmup;          /* warm-up steps; -1 (the default): steps / 20 */
  float time_budget;   /* > 0: train until the training steps took that many seconds (evaluations and
                          checkpoints not counted), the schedule over the seconds (warm-up its first
                          5%); steps still stops it. 0 (default): steps decide */
  int stop_after;      /* > 0: this run ends after step stop_after of the schedule */
  int eval_every;      /* steps between evaluations (100) */
  moe_optim_config optim; /* AdamW, weight decay 0.1 */
  moe_on_nan on_nan;
  const char *checkpoint; /* directory of the checkpoint written at each evaluation, or NULL */
  const char *keep_best;  /* directory of the model of the lowest validation loss, or NULL */
  /* The data of the language model (moe_train_lm): windows of context + 1 tokens, batch of them a
   * step, eval_windows fixed validation windows; the seed of the batch order (and the initialization).
   * The classifier (moe_train_classifier) takes batch and seed. */
  int context, batch, eval_windows; /* 64, 8, 64 */
  uint64_t seed;                    /* 1 */
  moe_train_adjust adjust;          /* off; delta_launch 2, headroom 0.25, caching 0.96 / 0.90 from epoch 10 */
  /* DeepSeek-V3's aux-loss-free load balancing (its paper's bias update speed gamma): after each update
   * that is not skipped, every MoE layer's selection bias (gate.select_bias, e_score_correction_bias)
   * moves by -bias_rate for an expert that got more than the mean of the step's assignments (all k
   * slots, summed over the ranks) and +bias_rate for one that got fewer (the model's balance_bias).
   * 0 (default): off, the bias stays what it was; DeepSeek-V3 trained with 0.001 (config.json carries no
   * rate, so none is taken from it). > 0 needs a model with a selection bias (MOE_ERR_ARG). Kept in the
   * trainer state; the biases are parameters of the model's files. */
  float bias_rate;
  /* Callbacks (NULL: none), on every rank; a status other than MOE_OK ends the step with it. on_batch
   * runs after the step's batch is made and the capacities due applied, before the cached assignments
   * and the forward; on_step after the update and the adjustments' records (an epoch's end included),
   * before an evaluation; on_eval after an evaluation, before the checkpoint. */
  moe_status (*on_batch)(void *ctx, int64_t step, const int32_t *samples, int n);
  moe_status (*on_step)(void *ctx, const moe_train_step *s);
  moe_status (*on_eval)(void *ctx, const moe_train_step *s);
  void *ctx;
} moe_trainer_config;
void moe_trainer_config_default(moe_trainer_config *c);
/* What a step did. */
struct moe_train_step {
  int64_t step;            /* steps done (this one's number, 1-based) */
  float lr;
  double seconds;          /* this step's (batch, callbacks, forward, backward, update) */
  double train_seconds;    /* all training steps' so far, resumed runs' included (rank 0's) */
  moe_train_batch_stats batch;
  int skipped;             /* MOE_ON_NAN_SKIP dropped or undid this step's update */
  int epoch_end;           /* with assignment caching, the step ended an epoch: */
  double frac_same;        /* its samples not reassigned since the epoch before (-1: no such epoch) */
  int caching;             /* caching on now, */
  int64_t caching_from;    /* from this step (-1: never on) */
  int evaluated;           /* an evaluation followed the step: */
  double valid_loss;       /* its loss (NAN when none) */
  int best;                /* the lowest validation loss so far (keep_best rewritten) */
  double valid_accuracy;   /* its accuracy (the classifier's; NAN when none) */
};
/* The learning rate of step (0-based) that begins with train_s seconds of training behind it. */
float moe_trainer_lr(const moe_trainer_config *c, int64_t step, double train_s);

/* The language model on token streams (moe_lm_stream_encode): step s trains on c->batch windows of the
 * training stream, in an order that is a permutation of its windows per epoch (a function of seed and
 * epoch), under expert parallelism rank r of W taking rows [B r / W, B (r + 1) / W); evaluation is the
 * mean cross-entropy over c->eval_windows windows of the validation stream (moe_lm_eval_windows); save
 * writes the model (moe_lm_save) and, when t is not NULL, its tokenizer.json. m, t and the streams are
 * the caller's, kept until the model's free. MOE_ERR_ARG for a stream shorter than one window. */
moe_status moe_train_lm(moe_train_model *out, moe_lm_t *m, const moe_tokenizer *t, const int32_t *train,
                        size_t n_train, const int32_t *valid, size_t n_valid, const moe_trainer_config *c);

/* The classifier m (moe_model_t) on images: step s of epoch e = s / steps_per_epoch (train->n / c->batch
 * steps) trains on c->batch training samples in an order that is a permutation per epoch (a function of
 * c->seed and e), each image augmented by aug (NULL: none) as a function of (seed, epoch, position); under
 * expert parallelism rank r of W takes samples [B r / W, B (r + 1) / W) of each batch. Its update is
 * moe_optim_step_checked (a non-finite parameter or moment named, MOE_ERR_VALUE); evaluation is the
 * accuracy on valid (moe_model_accuracy, batches of 500), the loss its error rate; its checkpoint is
 * moe_checkpoint_save's one file (epoch, step, seed and in extra the training options a resumed run
 * keeps, moe_classifier_options_format's of c and aug: `moe train --resume` goes on from a checkpoint
 * written from C or Python). m, the datasets and aug are the caller's, kept until the model's free.
 * MOE_ERR_ARG when the batch is larger than the training set. */
typedef struct {
  int shift;           /* a shift of up to shift pixels each way (moe train's 2), zeros shifted in */
  float rotate, scale; /* then, when either is not 0, a rotation by up to +-rotate degrees (15) and a
                          scaling by a factor in [1 - scale, 1 + scale] (0.15) about the centre, bilinear */
} moe_augment;
moe_status moe_train_classifier(moe_train_model *out, moe_model_t *m, const moe_dataset *train,
                                const moe_dataset *valid, const moe_augment *aug, const moe_trainer_config *c);
/* The classifier's training options in its checkpoint (moe_train_state.extra, DESIGN 4.10):
 * "epochs=%d;batch=%d;warmup=%d;augment=%d;lr=%.9g;dynamic_capacity=%d;delta_launch=%d;headroom=%.9g;
 * cache_assignments=%d;cache_on=%.9g;cache_off=%.9g;cache_min_epoch=%d;augment_rotate=%.9g;
 * augment_scale=%.9g" (augment: the shift). warmup -1 is one epoch, the default of moe train, which
 * moe_train_classifier writes for a warm-up of steps_per_epoch steps. _parse: 1, or 0 for a missing or
 * out-of-range field; checkpoints older than the adjustments have the first 5 fields, then 12, and
 * without the rotation and scaling those read as 0 (they trained without). */
typedef struct {
  int epochs, batch, warmup;
  float lr;
  moe_train_adjust adjust;
  moe_augment aug;
} moe_classifier_options;
void moe_classifier_options_format(const moe_classifier_options *o, char *buf, size_t n);
int moe_classifier_options_parse(const char *s, moe_classifier_options *o);
/* The fraction of d's samples whose argmax prediction is the label, B samples a forward (under expert
 * parallelism each rank forwards its slice of each and the hits are summed: a collective). */
moe_status moe_model_accuracy(moe_model_t *m, const moe_dataset *d, int B, double *acc);

typedef struct moe_trainer moe_trainer;
/* A trainer of model (which it owns from now on, freeing it with itself, even on failure) under c:
 * the optimizer at step 0 (moe_trainer_resume continues a checkpoint). */
moe_status moe_trainer_new(moe_trainer **out, const moe_trainer_config *c, moe_train_model *model);
void moe_trainer_free(moe_trainer *t);
/* Whether training is over: the last step done (stop_after, or steps), or the time budget spent. */
int moe_trainer_done(const moe_trainer *t);
/* One step (and the evaluation, checkpoint and keep-best it is due), into *out (may be NULL). On a
 * failure the step is not counted; MOE_ERR_VALUE when the loss went non-finite under MOE_ON_NAN_STOP. */
moe_status moe_trainer_step(moe_trainer *t, moe_train_step *out);
/* The validation loss now (the model's evaluate). */
moe_status moe_trainer_evaluate(moe_trainer *t, double *loss);
/* Writes a checkpoint to dir: the model's files, then trainer_state.safetensors, each atomically (the
 * state last, so that it never runs ahead of the weights); a model with its own checkpoint (the
 * classifier's) writes that file at dir instead. A collective under expert parallelism. */
moe_status moe_trainer_save(moe_trainer *t, const char *dir);
/* Steps done, training seconds so far, updates skipped (MOE_ON_NAN_SKIP), and the last of the
 * schedule this run does. */
typedef struct {
  int64_t step, last, skipped;
  double train_seconds, best_loss; /* best_loss: the lowest validation loss so far (INFINITY: none) */
} moe_trainer_info;
void moe_trainer_get_info(const moe_trainer *t, moe_trainer_info *out);
/* The trainer's optimizer (its moments in the model's ref order, opt->step the updates done), for a
 * model whose checkpoints hold it in their own format (the classifier's moe_checkpoint_save and _load),
 * and the steps done, set when resuming from such a checkpoint. */
moe_optim_t *moe_trainer_optim(moe_trainer *t);
/* With dynamic capacity: its recompile stats (recompiles are `adjustments`), and 1; else 0. */
int moe_trainer_capacity_stats(const moe_trainer *t, moe_recompile_stats *out);
void moe_trainer_set_step(moe_trainer *t, int64_t step);

/* trainer_state.safetensors in a checkpoint directory (DESIGN 4.10): F32 optim.m and optim.v (Adam's
 * moments in the one-process model's ref order), __metadata__ step, seed, train_seconds and train (the
 * options "context=..;batch=..;steps=..;..."). moe_trainer_state_read: the options into c (context,
 * batch, steps, warmup, lr, optim.weight_decay, eval_every, eval_windows, time_budget, seed, adjust,
 * bias_rate: written only when not 0, so 0 when absent)
 * and layer (capacity_setting, dispatch, dtype; NULL: not read), and the training seconds (may be
 * NULL), before the model is built; MOE_ERR_FORMAT naming the file for a missing or bad field.
 * moe_trainer_resume: a new trainer over the checkpoint's model goes on from the state's step with its
 * moments and seconds (MOE_ERR_STATE when the step is past c->steps). */
moe_status moe_trainer_state_read(const char *dir, moe_trainer_config *c, moe_layer_config *layer,
                                  double *train_seconds);
moe_status moe_trainer_resume(moe_trainer *t, const char *dir);

/* The language model's data. A text's token stream: documents separated by an empty line ("\n\n"),
 * each preceded by the tokenizer's <|endoftext|> (which ends the one before); *ids malloc'd (free()),
 * *n of them. MOE_ERR_ARG when the tokenizer has no <|endoftext|>. */
moe_status moe_lm_stream_encode(const moe_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n);
/* The mean cross-entropy of m over up to max_windows (0: all) non-overlapping windows of T + 1 tokens of
 * ids (n >= T + 1), evenly spaced over it, B at a time: the same windows on every call. */
moe_status moe_lm_eval_windows(moe_lm_t *m, const int32_t *ids, size_t n, int T, int B, int max_windows,
                               double *loss);
/* perm (n) := a permutation of 0..n-1, a function of seed and epoch (Fisher-Yates over splitmix64):
 * the trainers' data orders. */
void moe_train_shuffle(int32_t *perm, int n, uint64_t seed, int epoch);

#ifdef __cplusplus
}
#endif
#endif
