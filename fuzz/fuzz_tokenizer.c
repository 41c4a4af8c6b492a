/* libFuzzer target: tokenizer.json (moe_tokenizer_load); a file that loads also encodes and decodes a
 * fixed text, which must come back byte for byte when the tokenizer is GPT-2's byte-level BPE alone
 * (fuzz_tokenizer_json runs the other kinds). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "lm/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "tokenizer.json", data, n);
  moe_tokenizer *t = NULL;
  if (moe_tokenizer_load(&t, path) != MOE_OK) return 0;
  static const char text[] = "The jury said it's 1961.\n\t<|endoftext|> \xc3\xa9t\xff\x00 end";
  int32_t ids[sizeof text];
  size_t nid = 0, len = 0;
  char back[sizeof text];
  if (!moe__tok_round_trips(t)) {
    moe_tokenizer_free(t);
    return 0;
  }
  if (moe_tokenizer_encode(t, text, sizeof text, 0, ids, &nid) != MOE_OK ||
      moe_tokenizer_decode(t, ids, nid, back, sizeof back, &len) != MOE_OK || len != sizeof text ||
      memcmp(back, text, len))
    abort(); /* a tokenizer that loads must round-trip */
  moe_tokenizer_free(t);
  return 0;
}
