/* Token streams of a text directory's splits, and the loss over fixed windows of one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "lm_data.h"
#include "rank_errors.h"
#include "text_io.h"
#include "train_data.h"

static int is_file(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

const char *lm_tokenizer_path(const char *ck, char *buf, size_t n) {
  snprintf(buf, n, is_file(ck) ? "%s" : "%s/tokenizer.json", ck);
  return buf;
}

/* Whether the GGUF file has key; 0 when it cannot be opened (the model's loading says why). */
static int gguf_has(const char *path, const char *key) {
  moe_gguf *g;
  if (moe_gguf_open(&g, path) != MOE_OK) return 0;
  int has = moe_gguf_find_key(g, key) >= 0;
  moe_gguf_close(g);
  return has;
}

int lm_has_tokenizer(const char *ck) {
  char path[4096];
  return is_file(ck) ? gguf_has(ck, "tokenizer.ggml.model") : access(lm_tokenizer_path(ck, path, sizeof path), F_OK) == 0;
}

const char *lm_chat_template_path(const char *ck, char *buf, size_t n) {
  if (is_file(ck)) return gguf_has(ck, "tokenizer.chat_template") ? ck : NULL;
  snprintf(buf, n, "%s/tokenizer_config.json", ck);
  return access(buf, R_OK) ? NULL : buf;
}

int lm_is_eos(const int32_t *eos, int n, int32_t id) {
  for (int i = 0; i < n; i++)
    if (eos[i] == id) return 1;
  return 0;
}

int lm_stream_load(const char *cmd, const moe_tokenizer *t, const char *dir, const char *split, int context,
                   int32_t **ids, size_t *n) {
  char path[4096], name[64];
  size_t len;
  snprintf(name, sizeof name, "%s.txt", split);
  char *text = cli_read_text(dir, name, &len, path, sizeof path);
  if (!text)
    return cli_usage_error(cmd, "%s: cannot read: %s (scripts/get-brown.sh fetches data/brown)", path, strerror(errno));
  int32_t eot = moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT);
  *ids = malloc((len + 2) * sizeof **ids); /* a token is a byte at least; the EOTs fit in the separators */
  *n = 0;
  int rc = eot < 0 ? cli_usage_error(cmd, "the tokenizer has no %s token", MOE_TOKENIZER_EOT)
                   : !*ids ? cli_usage_error(cmd, "%s: out of memory", path) : 0;
  for (char *doc = text; !rc && doc < text + len;) {
    char *end = strstr(doc, "\n\n"), *stop = end ? end : text + len;
    size_t k = 0;
    (*ids)[(*n)++] = eot;
    if (moe_tokenizer_encode(t, doc, (size_t)(stop - doc), 0, *ids + *n, &k) != MOE_OK) rc = cli_fail(cmd);
    *n += k;
    doc = end ? end + 2 : stop;
  }
  free(text);
  if (!rc && *n < (size_t)context + 1)
    rc = cli_usage_error(cmd, "%s: %zu tokens, fewer than one window of --context %d + 1", path, *n, context);
  if (rc) {
    free(*ids);
    *ids = NULL;
  }
  return rc;
}

int lm_dist_start(const char *cmd, moe_dist **d, int *argc, char ***argv) {
  *d = NULL;
  if (moe_dist_init(d, argc, argv) != MOE_OK) return cli_fail(cmd);
  if (moe_dist_size(*d) < 2) {
    moe_dist_finalize(*d);
    *d = NULL;
    return 0;
  }
  cli_hold_errors(*d); /* printed once, by rank 0, where every rank meets */
  if (moe_dist_rank(*d) != 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 reports */
    return cli_usage_error(cmd, "rank %d: cannot silence stdout", moe_dist_rank(*d));
  return 0;
}

int lm_eval_loss(const char *cmd, moe_lm_t *m, const int32_t *ids, size_t n, int T, int B, int max_windows,
                 double *loss) {
  size_t count = (n - 1) / (size_t)T;
  size_t use = max_windows > 0 && (size_t)max_windows < count ? (size_t)max_windows : count;
  int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
  if (!x || !y) {
    free(x);
    free(y);
    return cli_usage_error(cmd, "evaluating: out of memory");
  }
  moe_status st = MOE_OK;
  double sum = 0;
  long tokens = 0;
  for (size_t w = 0; st == MOE_OK && w < use; w += (size_t)B) {
    int b = use - w < (size_t)B ? (int)(use - w) : B;
    for (int i = 0; i < b; i++) {
      const int32_t *s = ids + (w + (size_t)i) * count / use * T; /* evenly spaced windows */
      memcpy(x + (size_t)i * T, s, (size_t)T * sizeof *x);
      memcpy(y + (size_t)i * T, s + 1, (size_t)T * sizeof *y);
    }
    moe_lm_stats ls;
    st = moe_lm_forward(m, x, y, b, T, &ls);
    sum += ls.ce * ls.tokens;
    tokens += ls.tokens;
  }
  free(x);
  free(y);
  if (st != MOE_OK) return cli_fail(cmd);
  *loss = tokens ? sum / (double)tokens : 0;
  return 0;
}

int lm_order_init(lm_order *o, const int32_t *ids, size_t n, int T, int B, uint64_t seed) {
  size_t nwin = (n - 1) / (size_t)T;
  *o = (lm_order){ids, T, B, nwin < INT32_MAX / (size_t)T ? (int)nwin : INT32_MAX / T, 0, -1, seed, NULL};
  o->per_epoch = o->nwin / B > 0 ? o->nwin / B : 1; /* fewer windows than B: a batch repeats some */
  o->perm = malloc((size_t)o->nwin * sizeof *o->perm);
  return !o->perm;
}

void lm_order_fill(lm_order *o, int64_t s, int32_t *x, int32_t *y, int32_t *sample) {
  int T = o->T, epoch = (int)(s / o->per_epoch);
  if (epoch != o->epoch) train_shuffle(o->perm, o->nwin, o->seed, o->epoch = epoch);
  for (int b = 0; b < o->B; b++) {
    int w = o->perm[((size_t)(s % o->per_epoch) * o->B + (size_t)b) % (size_t)o->nwin];
    const int32_t *src = o->ids + (size_t)w * T;
    memcpy(x + (size_t)b * T, src, (size_t)T * sizeof *x);
    memcpy(y + (size_t)b * T, src + 1, (size_t)T * sizeof *y);
    for (int t = 0; t < T; t++) sample[b * T + t] = w * T + t;
  }
}

void lm_order_free(lm_order *o) {
  free(o->perm);
  o->perm = NULL;
}
