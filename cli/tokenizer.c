/* moe tokenizer train|encode|decode: a byte-level BPE tokenizer learned from a text (the Brown
 * corpus of scripts/get-brown.sh by default), saved as a Hugging Face tokenizer.json; text on stdin to
 * ids, and ids back to text, with libmoe's tokenizers or a model's (a tokenizer.json or its directory). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "text_io.h"

static const char *CMD = "tokenizer";

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe tokenizer train [--data DIR|FILE] [--vocab N] --out tokenizer.json [--json]\n"
          "       moe tokenizer encode --tokenizer F [--special] [--add-special] [--json]  < text > ids\n"
          "       moe tokenizer decode --tokenizer F                                       < ids  > text\n"
          "train: learns byte-level BPE merges from FILE, or DIR/train.txt (default data/brown, made by\n"
          "  scripts/get-brown.sh), up to N ids in all (default 4096, <|endoftext|> included); prints the\n"
          "  time taken and, when DIR has a valid.txt, its bytes per token (a JSON line with --json).\n"
          "F: a tokenizer.json (libmoe's, or a Hugging Face BPE one: GPT-2, Llama 2/3, Mistral, Qwen,\n"
          "  DeepSeek-V3, gpt-oss, Gemma 3) or a directory holding one and, optionally, tokenizer_config.json.\n"
          "encode: the ids of stdin's bytes, separated by spaces (a JSON array with --json); --special\n"
          "  turns special tokens written in the text (<|endoftext|>) into their ids; --add-special adds\n"
          "  the tokens the tokenizer puts around a text (BOS/EOS: its post-processor, or the directory's\n"
          "  tokenizer_config.json add_bos_token/add_eos_token), as Hugging Face's add_special_tokens=True.\n"
          "decode: ids separated by spaces, commas or newlines (a JSON array too) to text (libmoe's and\n"
          "  byte-level tokenizers: the exact bytes).\n");
}

static int train(const char *data, int vocab, const char *out, int json) {
  char path[4096];
  size_t n;
  char *text = cli_read_text(data, "train.txt", &n, path, sizeof path);
  if (!text)
    return cli_usage_error(CMD, "%s: cannot read: %s (scripts/get-brown.sh fetches data/brown)", path, strerror(errno));
  moe_tokenizer *t = NULL;
  double t0 = cli_now();
  moe_status st = moe_tokenizer_train(&t, text, n, vocab);
  double secs = cli_now() - t0;
  free(text);
  if (st != MOE_OK || moe_tokenizer_save(t, out) != MOE_OK) {
    moe_tokenizer_free(t);
    return cli_fail(CMD);
  }
  int32_t v = moe_tokenizer_vocab_size(t);
  if (json) printf("{\"data\": \"%s\", \"bytes\": %zu, \"vocab\": %d, \"seconds\": %.3f", path, n, v, secs);
  else printf("%s: %d ids from %zu bytes of %s in %.2f s\n", out, v, n, path, secs);
  /* Compression on the validation text beside the training text, when there is one. */
  char vpath[4096];
  struct stat s;
  size_t vn = 0, k = 0;
  char *valid =
      stat(data, &s) == 0 && S_ISDIR(s.st_mode) ? cli_read_text(data, "valid.txt", &vn, vpath, sizeof vpath) : NULL;
  int32_t *ids = valid ? malloc((vn ? vn : 1) * sizeof *ids) : NULL;
  int rc = 0;
  if (ids && moe_tokenizer_encode(t, valid, vn, 0, ids, &k) != MOE_OK) rc = cli_fail(CMD);
  else if (ids && json) printf(", \"valid_bytes\": %zu, \"valid_tokens\": %zu, \"bytes_per_token\": %.4f", vn, k, (double)vn / (double)k);
  else if (ids) printf("%s: %zu bytes -> %zu tokens, %.3f bytes per token\n", vpath, vn, k, (double)vn / (double)k);
  if (json) printf("}\n");
  free(ids);
  free(valid);
  moe_tokenizer_free(t);
  return rc;
}

static int encode(const moe_tokenizer *t, int flags, int json) {
  size_t n, k = 0;
  char *text = cli_read_all(stdin, &n);
  int32_t *ids = NULL;
  if (!text) return cli_usage_error(CMD, "cannot read stdin: %s", strerror(errno));
  int rc = moe_tokenizer_encode_alloc(t, text, n, flags, &ids, &k) != MOE_OK ? cli_fail(CMD) : 0;
  const char *sep = json ? ", " : " ";
  if (!rc && json) printf("[");
  for (size_t i = 0; !rc && i < k; i++) printf("%s%d", i ? sep : "", ids[i]);
  if (!rc) printf(json ? "]\n" : "\n");
  free(ids);
  free(text);
  return rc;
}

static int decode(const moe_tokenizer *t) {
  size_t n, k = 0, len;
  char *text = cli_read_all(stdin, &n), *end;
  int32_t *ids = text ? malloc((n / 2 + 1) * sizeof *ids) : NULL; /* an id and a separator: 2 bytes at least */
  if (!ids) {
    free(text);
    return cli_usage_error(CMD, "cannot read stdin: %s", strerror(errno));
  }
  int rc = 0;
  static const char SEP[] = " \t\r\n,[]";
  for (size_t i = 0; i < n;) {
    if (text[i] && strchr(SEP, text[i])) {
      i++;
      continue;
    }
    errno = 0;
    long v = strtol(text + i, &end, 10);
    if (end == text + i || errno || v < INT32_MIN || v > INT32_MAX || (*end && !strchr(SEP, *end))) {
      rc = cli_usage_error(CMD, "stdin: byte %zu: not a token id", i);
      break;
    }
    ids[k++] = (int32_t)v;
    i = (size_t)(end - text);
  }
  char *out = NULL;
  if (!rc && moe_tokenizer_decode_alloc(t, ids, k, &out, &len) != MOE_OK) rc = cli_fail(CMD);
  else if (!rc && fwrite(out, 1, len, stdout) != len) rc = cli_usage_error(CMD, "writing stdout: %s", strerror(errno));
  free(out);
  free(ids);
  free(text);
  return rc;
}

int cmd_tokenizer(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "template")) return cmd_tokenizer_template(argc - 1, argv + 1);
  if (cli_wants_help(argc, argv)) { usage(stdout); return 0; }
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  const char *sub = argv[1], *data = "data/brown", *out = NULL, *tok = NULL;
  int vocab = 4096, json = 0, flags = 0;
  for (int i = 2; i < argc; i++) {
    if (cli_flag_is(argv[i], "json")) json = 1;
    else if (cli_flag_is(argv[i], "special")) flags |= MOE_TOKENIZER_SPECIAL;
    else if (cli_flag_is(argv[i], "add-special")) flags |= MOE_TOKENIZER_ADD_SPECIAL;
    if (cli_flag_is(argv[i], "json") || cli_flag_is(argv[i], "special") || cli_flag_is(argv[i], "add-special")) continue;
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", argv[i]);
    const char *f = argv[i], *v = argv[++i];
    if (cli_flag_is(f, "data")) data = v;
    else if (cli_flag_is(f, "out")) out = v;
    else if (cli_flag_is(f, "tokenizer")) tok = v;
    else if (cli_flag_is(f, "vocab")) {
      if (!cli_parse_int(v, &vocab) || vocab < 257) return cli_usage_error(CMD, "--vocab: '%s' is not a number >= 257", v);
    } else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
  }
  if (!strcmp(sub, "train")) {
    if (!out) return cli_usage_error(CMD, "train: --out is required");
    return train(data, vocab, out, json);
  }
  if (strcmp(sub, "encode") && strcmp(sub, "decode")) {
    usage(stderr);
    return cli_usage_error(CMD, "unknown subcommand '%s' (train, encode, decode)", sub);
  }
  if (!tok) return cli_usage_error(CMD, "%s: --tokenizer is required", sub);
  moe_tokenizer *t;
  if (moe_tokenizer_load(&t, tok) != MOE_OK) return cli_fail(CMD);
  int rc = !strcmp(sub, "encode") ? encode(t, flags, json) : decode(t);
  moe_tokenizer_free(t);
  return rc;
}
