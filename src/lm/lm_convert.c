/* A checkpoint converted without its experts in memory (moe.h, moe_lm_convert): the model is loaded
 * with external experts (its dense weights fp32, no expert read), and the writers (moe_lm_save_gguf's,
 * moe_lm_save's) read each expert's tensors at save through the readers the streamed experts use:
 * a directory's per-expert or stacked F32/BF16 tensors, or gpt-oss's fused ones (plain or MXFP4, with
 * their biases; lm_gptoss.h), in model.safetensors or in whichever shard of the index holds each
 * (over lm_shards.h's files, each shard opened once for every layer), or a GGUF file's stacks (and
 * gpt-oss's biases) dequantized (moe__lm_gguf_expert_reader). Their values are moe_lm_load's, so the
 * file is the loaded model's byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lm_family.h"
#include "lm_gguf.h"
#include "lm_gptoss.h"
#include "lm_shards.h"

/* The open layer's reader closed (another's is opened next). */
static void close_reader(moe__lm_expert_src *s) {
  if (s->rd.free) s->rd.free(s->rd.ctx);
  s->rd = (moe__expert_reader){0};
  s->layer = -1;
}

moe_status moe__lm_expert_src_read(moe__lm_expert_src *s, int layer, int t, int e, float *dst, const char *what) {
  if (s->layer != layer) {
    close_reader(s);
    MOE_CHECK(s->open(s->ctx, layer, &s->rd));
    s->layer = layer;
  }
  float *out[6] = {0};
  out[t] = dst;
  moe_status st = s->rd.read(s->rd.ctx, e, out, 1);
  MOE_TRY(st == MOE_OK, st, "writing '%s': %s", what, moe_last_error()); /* the reader names the expert */
  return MOE_OK;
}

float *moe__lm_expert_src_scratch(moe__lm_expert_src *s, size_t n, const char *what) {
  if (n <= s->scratch_n) return s->scratch;
  float *b = realloc(s->scratch, n * sizeof *b);
  if (!b) {
    moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "writing '%s': out of memory for an expert", what);
    return NULL;
  }
  s->scratch = b, s->scratch_n = n;
  return b;
}

void moe__lm_expert_src_close(moe__lm_expert_src *s) {
  close_reader(s);
  free(s->scratch);
  s->scratch = NULL, s->scratch_n = 0;
}

typedef struct {
  const moe_lm_t *m;
  moe__lm_shards *files; /* a directory's model.safetensors or shards, or NULL: src is a GGUF file */
  moe_gguf *g;           /* else the GGUF file, parsed once */
  moe__lm_gguf_fd *fd;   /* and its descriptor, which every layer's reader shares */
} converter;

static moe_status open_experts(void *ctx, int layer, moe__expert_reader *out) {
  const converter *v = ctx;
  const moe_lm_config *c = &v->m->cfg;
  if (!v->files) return moe__lm_gguf_expert_reader(v->g, v->fd, c, layer, out);
  char prefix[96];
  snprintf(prefix, sizeof prefix, "model.layers.%d.%s.experts.", layer, moe__lm_family(c->family)->ffn);
  moe__st_files fs;
  moe__lm_shards_files(v->files, &fs);
  if (c->family == MOE_LM_GPT_OSS) return moe__gptoss_expert_reader(&fs, c, layer, out);
  return moe__expert_st_reader(&fs, prefix, &v->m->layers[layer].cfg, out);
}

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !strcmp(s + n - k, tail);
}

moe_status moe_lm_convert(const char *src, const char *dst, const moe_lm_gguf_options *o, size_t *numel) {
  MOE_TRY(src && dst, MOE_ERR_ARG, "moe_lm_convert: NULL %s", src ? "destination" : "source");
  moe_lm_config c;
  MOE_CHECK(moe_lm_read_config(src, &c));
  c.moe.expert_type = -1; /* every weight as fp32 values, which the writers take */
  int gguf = moe__lm_gguf_is(src);
  int stream = !c.moe.dist;
  c.moe.external_experts = stream;
  moe_lm_t m;
  MOE_CHECK(moe_lm_load(&m, src, &c));
  converter v = {&m, NULL, NULL, NULL};
  moe__lm_expert_src in = {.open = open_experts, .ctx = &v, .layer = -1};
  moe_status st = stream && !gguf ? moe__lm_shards_open(&v.files, src, 0) : MOE_OK;
  if (st == MOE_OK && stream && gguf && (st = moe_gguf_open(&v.g, src)) == MOE_OK) st = moe__lm_gguf_fd_open(&v.fd, src);
  if (st == MOE_OK)
    st = ends_with(dst, ".gguf") ? moe__lm_save_gguf(&m, dst, o, stream ? &in : NULL)
                                 : moe__lm_save_dir(&m, dst, stream ? &in : NULL);
  size_t D = (size_t)c.moe.D, H = (size_t)c.moe.H, expert = 3 * D * H + (c.moe.expert_bias ? 2 * H + D : 0);
  if (st == MOE_OK && numel) /* with the experts read, and gpt-oss's biases */
    *numel = m.numel + (stream ? (size_t)moe__lm_moe_layers(&c) * (size_t)c.moe.E * expert : 0);
  moe__lm_gguf_fd_release(v.fd);
  moe_gguf_close(v.g);
  moe__lm_shards_release(v.files);
  moe_lm_free(&m);
  return st;
}
