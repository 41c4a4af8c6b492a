/* Token streams of a text directory's splits (the library's moe_lm_stream_encode of each file). */
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
  int rc = moe_lm_stream_encode(t, text, len, ids, n) != MOE_OK ? cli_fail(cmd) : 0;
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
