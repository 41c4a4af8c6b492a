/* moe convert: a language model between a Hugging Face checkpoint directory and a GGUF file, as
 * llama.cpp's convert_hf_to_gguf.py writes it (moe_lm_convert: the experts streamed from SRC one
 * at a time, never all in memory): the weights in --type (norms, routers and 1-D tensors F32), the
 * tokenizer of SRC/tokenizer.json (or --tokenizer) as tokenizer.ggml.* keys; back, a GGUF file to
 * config.json and model.safetensors (F32, the experts streamed too), tokenizer.json and
 * tokenizer_config.json. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const char *CMD = "convert";

static void usage(FILE *f) {
  fprintf(f, "usage: moe convert SRC DST [--type F32|F16|BF16|Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|MXFP4] [--tokenizer PATH]\n"
             "                  [--name NAME]\n"
             "SRC a Hugging Face checkpoint directory (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss, DeepSeek-V2/V3)\n"
             "and DST a .gguf file: writes DST (atomically) as llama.cpp's converter does (architecture llama,\n"
             "qwen2moe, qwen3moe, olmoe, gpt-oss or deepseek2; a setting its keys cannot say, such as DeepSeek's\n"
             "expert groups or gpt-oss's swiglu_limit other than 7, is an error naming it): the weights in --type\n"
             "(default F32; norms, routers, biases and 1-D tensors stay F32, rows not a\n"
             "multiple of the type's block Q8_0 or F16), the tokenizer of --tokenizer or SRC/tokenizer.json\n"
             "(with tokenizer_config.json) when there is one, general.name NAME.\n"
             "SRC a GGUF file and DST a directory: config.json and model.safetensors (F32) of the model, and its\n"
             "tokenizer as tokenizer.json and tokenizer_config.json when it has one.\n"
             "Either way the experts are read from SRC one at a time while DST is written: memory holds the dense\n"
             "weights and about one expert's tensor, from model.safetensors or its shards (gpt-oss is loaded whole).\n");
}

static int is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !strcmp(s + n - k, tail);
}

int cmd_convert(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  const char *files[2] = {NULL, NULL}, *type = "F32", *tok = NULL, *name = NULL;
  int nf = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "type") && i + 1 < argc) type = argv[++i];
    else if (cli_flag_is(argv[i], "tokenizer") && i + 1 < argc) tok = argv[++i];
    else if (cli_flag_is(argv[i], "name") && i + 1 < argc) name = argv[++i];
    else if (nf < 2 && strncmp(argv[i], "--", 2)) files[nf++] = argv[i];
    else return cli_usage_error(CMD, "unexpected argument '%s'", argv[i]);
  }
  if (nf != 2) {
    usage(stderr);
    return cli_usage_error(CMD, "SRC and DST are needed");
  }
  int to_gguf = ends_with(files[1], ".gguf");
  if (to_gguf == !is_dir(files[0]))
    return cli_usage_error(CMD, to_gguf ? "%s: not a checkpoint directory (to convert a GGUF file's type: moe quantize)"
                                        : "%s: not a directory, and %s does not end in .gguf",
                           files[0], files[1]);
  moe_lm_gguf_options o = {MOE_GGUF_F32, tok, name};
  if (moe_gguf_type_parse(type, "--type", &o.type) != MOE_OK) return cli_fail(CMD);
  if (!moe_gguf_type_supported(o.type))
    return cli_usage_error(CMD, "--type %s: no codec for it (want F32|F16|BF16|Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|MXFP4)", type);
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", files[0]);
  if (to_gguf && !tok && access(path, R_OK) == 0) o.tokenizer = files[0];
  moe_lm_config c;
  if (moe_lm_read_config(files[0], &c) != MOE_OK) return cli_fail(CMD);
  size_t numel = 0;
  moe_status st = moe_lm_convert(files[0], files[1], &o, &numel); /* the experts streamed */
  int has_tok = 0;
  moe_gguf *g;
  if (st == MOE_OK && !to_gguf && (st = moe_gguf_open(&g, files[0])) == MOE_OK) {
    has_tok = moe_gguf_find_key(g, "tokenizer.ggml.model") >= 0;
    moe_gguf_close(g);
  }
  if (st == MOE_OK && has_tok) st = moe_tokenizer_gguf_to_hf(files[0], files[1]);
  if (st == MOE_OK)
    printf("%s: %s model, %zu parameters%s%s\n", files[1], moe_lm_family_name(c.family), numel,
           to_gguf ? ", weights " : "", to_gguf ? moe_gguf_type_name(o.type) : "");
  return st == MOE_OK ? 0 : cli_fail(CMD);
}
