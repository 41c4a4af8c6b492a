/* moe quantize: a GGUF file's weight matrices to another tensor type, as llama.cpp's quantize does
 * for one type: tensors of 2 or more dims are converted (from any type with a codec), except the
 * routers (ffn_gate_inp) and norms, which like the 1-D tensors (norms, biases) are kept as F32; the
 * metadata is copied, with general.file_type and general.quantization_version set for the new type.
 * Each tensor is converted as the file is written, a chunk of rows at a time: memory holds a chunk, not
 * the output. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *CMD = "quantize";

static void usage(FILE *f) {
  fprintf(f, "usage: moe quantize IN.gguf OUT.gguf --type Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|MXFP4|F16|BF16|F32\n"
             "Writes OUT (atomically) with IN's metadata and tensors: those of 2 or more dims in the type\n"
             "(rows whose length is not a multiple of its block: Q8_0 when a multiple of 32, else F16), the\n"
             "1-D ones, norms and routers (*_norm.weight, ffn_gate_inp.weight) in F32. One line per tensor.\n");
}

/* The type tensor t gets when the file's weights go to `want`. */
static moe_gguf_type target(const moe_gguf_tensor *t, moe_gguf_type want) {
  if (t->ndim < 2 || strstr(t->name, "_norm.weight") || strstr(t->name, "ffn_gate_inp.weight")) return MOE_GGUF_F32;
  if (t->ne[0] % moe_gguf_type_block(want) == 0) return want;
  return t->ne[0] % 32 == 0 ? MOE_GGUF_Q8_0 : MOE_GGUF_F16;
}

#define CHUNK (1 << 20) /* values converted at a time: rows are quantized together, blocks in parallel */

/* A tensor of the input converted as the file is written (the writer's fill): a chunk of rows at a
 * time into the writer's buffer (blocks never straddle rows, so a chunk quantizes as its rows would
 * one by one), through one shared buffer of floats; the output never held whole. */
typedef struct {
  const moe_gguf *g;
  moe_gguf_tensor t;
  moe_gguf_type to;
  size_t row;    /* bytes of an output row */
  float **x;     /* the shared buffer of a chunk's values */
} job;

static moe_status fill(void *ctx, size_t off, void *dst, size_t n) {
  const job *j = ctx;
  int64_t r0 = (int64_t)(off / j->row), nr = (int64_t)(n / j->row), ne0 = j->t.ne[0];
  moe_status st = MOE_OK;
  for (int64_t r = 0; st == MOE_OK && r < nr; r++) st = moe_gguf_tensor_row_f32(j->g, &j->t, r0 + r, *j->x + r * ne0);
  if (st == MOE_OK && (st = moe_gguf_quantize(j->to, *j->x, dst, nr * ne0)) != MOE_OK)
    st = moe_last_error_set(st, "%s: tensor '%s' rows %" PRId64 "-%" PRId64 " (of %" PRId64 " values each): %s",
                            moe_gguf_path(j->g), j->t.name, r0, r0 + nr - 1, ne0, moe_last_error());
  return st;
}

static int quantize(const moe_gguf *g, const char *out, moe_gguf_type want) {
  moe_gguf_writer *w = NULL;
  int64_t nt = moe_gguf_tensor_count(g), most = 1; /* values of the largest chunk */
  job *jobs = calloc((size_t)(nt ? nt : 1), sizeof *jobs);
  float *x = NULL;
  moe_status st = jobs ? moe_gguf_writer_new(&w) : moe_last_error_set(MOE_ERR_NOMEM, "out of memory");
  for (int64_t i = 0; st == MOE_OK && i < moe_gguf_kv_count(g); i++) st = moe_gguf_writer_copy_kv(w, g, i);
  if (st == MOE_OK) st = moe_gguf_writer_set_u32(w, "general.file_type", (uint32_t)moe_gguf_file_type(want));
  if (st == MOE_OK && moe_gguf_type_block(want) > 1) st = moe_gguf_writer_set_u32(w, "general.quantization_version", 2);
  uint64_t before = 0, after = 0;
  for (int64_t i = 0; st == MOE_OK && i < nt; i++) {
    job *j = &jobs[i];
    if ((st = moe_gguf_tensor_at(g, i, &j->t)) != MOE_OK) break;
    j->g = g, j->to = target(&j->t, want), j->x = &x;
    j->row = (size_t)(j->t.ne[0] / moe_gguf_type_block(j->to)) * moe_gguf_type_block_bytes(j->to);
    int64_t rows = j->t.ne[0] && j->t.ne[0] < CHUNK ? CHUNK / j->t.ne[0] : 1;
    if (rows * j->t.ne[0] > most) most = rows * j->t.ne[0];
    st = moe_gguf_writer_add_tensor_fill(w, j->t.name, j->to, j->t.ndim, j->t.ne, (size_t)rows * j->row, fill, j);
    size_t n = j->row * (size_t)j->t.nrows;
    if (st == MOE_OK)
      printf("%-40s %-6s -> %-6s %12zu -> %12zu bytes\n", j->t.name, moe_gguf_type_name(j->t.type),
             moe_gguf_type_name(j->to), j->t.nbytes, n);
    before += j->t.nbytes, after += n;
  }
  if (st == MOE_OK && !(x = malloc((size_t)most * sizeof *x)))
    st = moe_last_error_set(MOE_ERR_NOMEM, "out of memory for %" PRId64 " values", most);
  if (st == MOE_OK) st = moe_gguf_writer_save(w, out);
  if (st == MOE_OK) printf("%s: %" PRIu64 " -> %" PRIu64 " bytes of tensors\n", out, before, after);
  moe_gguf_writer_free(w);
  free(jobs), free(x);
  return st == MOE_OK ? 0 : cli_fail(CMD);
}

int cmd_quantize(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  const char *files[2] = {NULL, NULL}, *type = NULL;
  int nf = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "type") && i + 1 < argc) type = argv[++i];
    else if (nf < 2 && strncmp(argv[i], "--", 2)) files[nf++] = argv[i];
    else return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
  }
  if (nf != 2 || !type) {
    usage(stderr);
    return cli_usage_error(CMD, nf != 2 ? "IN.gguf and OUT.gguf are needed" : "--type is needed");
  }
  moe_gguf_type want;
  if (moe_gguf_type_parse(type, "--type", &want) != MOE_OK) return cli_fail(CMD);
  if (!moe_gguf_type_supported(want))
    return cli_usage_error(CMD, "--type %s: no codec for it (want Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|MXFP4|F16|BF16|F32)", type);
  moe_gguf *g;
  if (moe_gguf_open(&g, files[0]) != MOE_OK) return cli_fail(CMD);
  int rc = quantize(g, files[1], want);
  moe_gguf_close(g);
  return rc;
}
