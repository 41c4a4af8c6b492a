/* moe gguf info: what a GGUF file holds: its metadata (arrays abbreviated to their first values) and
 * its tensor table (name, type, shape in ggml's order, bytes, offset), as text or one JSON line. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *CMD = "gguf";
#define SHOWN 8 /* array elements shown */

static void usage(FILE *f) {
  fprintf(f, "usage: moe gguf info FILE.gguf [--json]\n"
             "Prints the file's metadata (arrays abbreviated to their first %d values) and its tensors:\n"
             "name, type, shape as ggml orders it (ne0 = the row length first), bytes and file offset.\n"
             "--json: one JSON line {\"file\", \"alignment\", \"data_offset\", \"metadata\": [{\"key\", \"type\",\n"
             "\"value\"} or, for arrays, {\"key\", \"type\": \"array\", \"elem_type\", \"n\", \"head\": [...]}],\n"
             "\"tensors\": [{\"name\", \"type\", \"ne\", \"bytes\", \"offset\"}]}.\n",
          SHOWN);
}

/* Element j of entry i as text: strings quoted, control bytes escaped, long ones cut. */
static void text_value(const moe_gguf *g, int64_t i, moe_gguf_vtype t, uint64_t j, char *buf, size_t n) {
  int64_t v;
  double d;
  const char *s;
  size_t len;
  if (t == MOE_GGUFV_STRING && moe_gguf_kv_str(g, i, j, &s, &len) == MOE_OK) {
    size_t w = 0; /* at most 60 bytes shown, 4 characters each: buf's 512 hold them */
    buf[w++] = '"';
    for (size_t k = 0; k < len && w + 32 < n; k++) {
      unsigned char c = (unsigned char)s[k];
      if (k == 60) {
        w += (size_t)snprintf(buf + w, n - w, "...(%zu bytes)", len);
        break;
      }
      w += (size_t)(c < 32 || c == '"' || c == '\\' ? snprintf(buf + w, n - w, "\\x%02x", c)
                                                     : snprintf(buf + w, n - w, "%c", c));
    }
    snprintf(buf + w, n - w, "\"");
  } else if (t == MOE_GGUFV_BOOL && moe_gguf_kv_int(g, i, j, &v) == MOE_OK) {
    snprintf(buf, n, "%s", v ? "true" : "false");
  } else if ((t == MOE_GGUFV_F32 || t == MOE_GGUFV_F64) && moe_gguf_kv_float(g, i, j, &d) == MOE_OK) {
    snprintf(buf, n, "%.9g", d);
  } else if (moe_gguf_kv_int(g, i, j, &v) == MOE_OK) {
    snprintf(buf, n, "%" PRId64, v);
  } else if (moe_gguf_kv_float(g, i, j, &d) == MOE_OK) { /* a u64 beyond int64 */
    snprintf(buf, n, "%.0f", d);
  } else {
    snprintf(buf, n, "(%s)", moe_gguf_vtype_name(t));
  }
}

static cJSON *json_value(const moe_gguf *g, int64_t i, moe_gguf_vtype t, uint64_t j) {
  int64_t v;
  double d;
  const char *s;
  size_t len;
  if (t == MOE_GGUFV_STRING && moe_gguf_kv_str(g, i, j, &s, &len) == MOE_OK) return cJSON_CreateString(s);
  if (t == MOE_GGUFV_BOOL && moe_gguf_kv_int(g, i, j, &v) == MOE_OK) return cJSON_CreateBool(v != 0);
  if (t != MOE_GGUFV_ARRAY && moe_gguf_kv_float(g, i, j, &d) == MOE_OK) return cJSON_CreateNumber(d);
  return cJSON_CreateNull();
}

static void shape_text(const moe_gguf_tensor *t, char *buf, size_t n) {
  size_t w = 0;
  for (int d = 0; d < t->ndim; d++) w += (size_t)snprintf(buf + w, n - w, "%s%" PRId64, d ? " x " : "", t->ne[d]);
}

static const char *type_name(moe_gguf_type t) { return moe_gguf_type_name(t) ? moe_gguf_type_name(t) : "?"; }

static void print_text(const moe_gguf *g) {
  printf("%s: GGUF, alignment %" PRIu32 ", tensor data at offset %" PRIu64 "\n", moe_gguf_path(g),
         moe_gguf_alignment(g), moe_gguf_data_offset(g));
  printf("metadata (%" PRId64 "):\n", moe_gguf_kv_count(g));
  char buf[512];
  for (int64_t i = 0; i < moe_gguf_kv_count(g); i++) {
    moe_gguf_kv kv;
    if (moe_gguf_kv_at(g, i, &kv) != MOE_OK) continue;
    if (kv.type != MOE_GGUFV_ARRAY) {
      text_value(g, i, kv.type, 0, buf, sizeof buf);
      printf("  %-40s %-8s %s\n", kv.key, moe_gguf_vtype_name(kv.type), buf);
      continue;
    }
    char ty[32];
    snprintf(ty, sizeof ty, "[%s]", moe_gguf_vtype_name(kv.elem_type));
    printf("  %-40s %-8s %" PRIu64 ": [", kv.key, ty, kv.n);
    for (uint64_t j = 0; j < kv.n && j < SHOWN; j++) {
      text_value(g, i, kv.elem_type, j, buf, sizeof buf);
      printf("%s%s", j ? ", " : "", buf);
    }
    if (kv.n > SHOWN) printf(", ... %" PRIu64 " more", kv.n - SHOWN);
    printf("]\n");
  }
  printf("tensors (%" PRId64 "):\n  %-40s %-7s %-24s %12s %12s\n", moe_gguf_tensor_count(g), "name", "type",
         "shape (ne0 x ne1 ...)", "bytes", "offset");
  uint64_t total = 0;
  for (int64_t i = 0; i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    if (moe_gguf_tensor_at(g, i, &t) != MOE_OK) continue;
    shape_text(&t, buf, sizeof buf);
    printf("  %-40s %-7s %-24s %12zu %12" PRIu64 "\n", t.name, type_name(t.type), buf, t.nbytes, t.file_offset);
    total += t.nbytes;
  }
  printf("  %" PRIu64 " bytes of tensor data\n", total);
}

static void print_json(const moe_gguf *g) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "file", moe_gguf_path(g));
  cJSON_AddNumberToObject(o, "alignment", moe_gguf_alignment(g));
  cJSON_AddNumberToObject(o, "data_offset", (double)moe_gguf_data_offset(g));
  cJSON *meta = cJSON_AddArrayToObject(o, "metadata"), *tensors = cJSON_AddArrayToObject(o, "tensors");
  for (int64_t i = 0; i < moe_gguf_kv_count(g); i++) {
    moe_gguf_kv kv;
    if (moe_gguf_kv_at(g, i, &kv) != MOE_OK) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "key", kv.key);
    cJSON_AddStringToObject(e, "type", moe_gguf_vtype_name(kv.type));
    if (kv.type != MOE_GGUFV_ARRAY) {
      cJSON_AddItemToObject(e, "value", json_value(g, i, kv.type, 0));
    } else {
      cJSON_AddStringToObject(e, "elem_type", moe_gguf_vtype_name(kv.elem_type));
      cJSON_AddNumberToObject(e, "n", (double)kv.n);
      cJSON *head = cJSON_AddArrayToObject(e, "head");
      for (uint64_t j = 0; j < kv.n && j < SHOWN; j++) cJSON_AddItemToArray(head, json_value(g, i, kv.elem_type, j));
    }
    cJSON_AddItemToArray(meta, e);
  }
  for (int64_t i = 0; i < moe_gguf_tensor_count(g); i++) {
    moe_gguf_tensor t;
    if (moe_gguf_tensor_at(g, i, &t) != MOE_OK) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", t.name);
    cJSON_AddStringToObject(e, "type", type_name(t.type));
    cJSON *ne = cJSON_AddArrayToObject(e, "ne");
    for (int d = 0; d < t.ndim; d++) cJSON_AddItemToArray(ne, cJSON_CreateNumber((double)t.ne[d]));
    cJSON_AddNumberToObject(e, "bytes", (double)t.nbytes);
    cJSON_AddNumberToObject(e, "offset", (double)t.file_offset);
    cJSON_AddItemToArray(tensors, e);
  }
  cli_json_line(o);
}

int cmd_gguf(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  if (argc < 2 || strcmp(argv[1], "info")) {
    usage(stderr);
    return cli_usage_error(CMD, "unknown or missing subcommand%s%s (want info)", argc < 2 ? "" : " ",
                           argc < 2 ? "" : argv[1]);
  }
  const char *file = NULL;
  int json = 0;
  for (int i = 2; i < argc; i++) {
    if (cli_flag_is(argv[i], "json")) json = 1;
    else if (!file && strncmp(argv[i], "--", 2)) file = argv[i];
    else return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
  }
  if (!file) {
    usage(stderr);
    return cli_usage_error(CMD, "a GGUF file is needed");
  }
  moe_gguf *g;
  if (moe_gguf_open(&g, file) != MOE_OK) return cli_fail(CMD);
  if (json) print_json(g);
  else print_text(g);
  moe_gguf_close(g);
  return 0;
}
