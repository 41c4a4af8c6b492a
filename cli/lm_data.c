/* Token streams of a text directory's splits (the library's moe_lm_stream_encode of each file). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "formats/json.h" /* moe__json_read, as the library reads config.json */
#include "lm_data.h"
#include "rank_errors.h"
#include "text_io.h"

/* Adds id to eos when it is a token id; 0 when not. */
static int add_eos(const cJSON *id, int vocab, int32_t *eos, int *n) {
  double x = cJSON_IsNumber(id) ? id->valuedouble : -1;
  if (x < 0 || x >= vocab || x != (int32_t)x) return 0;
  eos[(*n)++] = (int32_t)x;
  return 1;
}

int lm_eos_ids(const char *cmd, const char *dir, const moe_tokenizer *t, int vocab, int32_t *eos) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  cJSON *r;
  if (moe__json_read(path, "config", 1 << 20, &r) != MOE_OK) return cli_fail(cmd), -1;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "eos_token_id"), *e;
  int n = 0, ok = !v || cJSON_IsNull(v);
  if (cJSON_IsNumber(v)) ok = add_eos(v, vocab, eos, &n);
  if (cJSON_IsArray(v)) {
    ok = cJSON_GetArraySize(v) < LM_MAX_EOS;
    cJSON_ArrayForEach(e, v) ok = ok && add_eos(e, vocab, eos, &n);
  }
  char *text = ok ? NULL : cJSON_PrintUnformatted(v);
  if (!ok) cli_usage_error(cmd, "%s: \"eos_token_id\" %.60s is not a token id in [0, %d) or a list of at most %d",
                           path, text ? text : "?", vocab, LM_MAX_EOS - 1);
  free(text);
  cJSON_Delete(r);
  int32_t eot = t ? moe_tokenizer_token_id(t, MOE_TOKENIZER_EOT) : -1;
  if (ok && eot >= 0 && eot < vocab && !lm_is_eos(eos, n, eot)) eos[n++] = eot;
  return ok ? n : -1;
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
