/* moe tokenizer template: a model's chat template (tokenizer_config.json) rendered over the
 * conversation on stdin, as transformers.js renders it, so that a script can compare the text with
 * another renderer's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "text_io.h"

static const char *CMD = "tokenizer template";

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe tokenizer template --tokenizer DIR [--generation-prompt] [--now SECONDS] < conversation.json\n"
          "Prints the conversation rendered by DIR/tokenizer_config.json's chat_template (or the config file\n"
          "given), with its special tokens (bos_token, eos_token, ...) as transformers.js passes them.\n"
          "stdin: a JSON list of messages ({\"role\": ..., \"content\": ...}), or an object with \"messages\"\n"
          "  and other variables (tools, enable_thinking, ...).\n"
          "--generation-prompt: add_generation_prompt = true (the text then ends where the reply starts).\n"
          "--now: the time strftime_now formats, in seconds since 1970 UTC (default: the clock, local time).\n");
}

int cmd_tokenizer_template(int argc, char **argv) {
  if (cli_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  const char *tok = NULL;
  int gen = 0;
  long long now = -1;
  for (int i = 1; i < argc; i++) {
    if (cli_flag_is(argv[i], "generation-prompt")) {
      gen = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s: missing value (or unknown flag)", argv[i]);
    const char *f = argv[i], *v = argv[++i];
    char *end;
    if (cli_flag_is(f, "tokenizer")) {
      tok = v;
    } else if (cli_flag_is(f, "now")) {
      errno = 0;
      now = strtoll(v, &end, 10);
      if (errno || end == v || *end || now < 0) return cli_usage_error(CMD, "--now: '%s' is not a number of seconds >= 0", v);
    } else {
      usage(stderr);
      return cli_usage_error(CMD, "unknown flag '%s'", f);
    }
  }
  if (!tok) return cli_usage_error(CMD, "--tokenizer is required");
  size_t n;
  char *conv = cli_read_all(stdin, &n);
  if (!conv) return cli_usage_error(CMD, "cannot read stdin: %s", strerror(errno));
  char *text = NULL;
  size_t len = 0;
  moe_status st = moe_chat_template_render_config(tok, conv, gen, now, &text, &len);
  free(conv);
  if (st != MOE_OK) return cli_fail(CMD);
  int rc = fwrite(text, 1, len, stdout) == len ? 0 : cli_usage_error(CMD, "writing stdout: %s", strerror(errno));
  free(text);
  return rc;
}
