/* libFuzzer target: a chat template (the input) parsed and rendered over a fixed conversation with a
 * system message, tool calls and a tool's answer, under tight bounds (memory, steps, list sizes,
 * nesting) so that no input hangs: every input ends in text or in an error. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/chat_render.h"

static const char CONTEXT[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"a\": [1, 2.5, null]}}}],"
    " \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\\ud83e\\udd99\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"42\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"more\"}, {\"type\": \"image\"}]}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  static cJSON *ctx;
  if (!ctx && !(ctx = cJSON_Parse(CONTEXT))) abort();
  static const cj_limits lim = {16u << 20, 200000, 10000, 64};
  char *tmpl = malloc(n + 1);
  if (!tmpl) return 0;
  if (n) memcpy(tmpl, data, n);
  tmpl[n] = 0;
  char *out = NULL;
  size_t len = 0;
  moe_status st = moe__chat_render(tmpl, n, ctx, 1720170487, &lim, &out, &len);
  if ((st == MOE_OK) != (out != NULL)) abort(); /* text exactly when it succeeds */
  free(out);
  free(tmpl);
  return 0;
}
