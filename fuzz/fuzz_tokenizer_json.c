/* libFuzzer target: Hugging Face tokenizer.json files of every kind the loader takes (byte-level BPE
 * with Split and ByteLevel pre-tokenizers, SentencePiece-style BPE with byte fallback, Metaspace,
 * normalizers, post-processors, decoders; seeds in fuzz/corpus/tokenizer_json). A file that loads
 * encodes a fixed text with each combination of flags, and its ids decode; the ids are in range, and
 * moe_tokenizer_encode (room for the text's bytes) agrees with moe_tokenizer_encode_alloc whenever it
 * succeeds. GPT-2's byte-level BPE alone must give the text back. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "lm/tokenizer.h"

static const char TEXT[] = "The jury said it's 1961. \xef\xac\x81 CAF\xc3\x89 \xe6\x97\xa5\xe6\x9c\xac 123456 <s>x</s> "
                           "<mask>  \n\n\t<|endoftext|> \xf0\x9f\xa6\x99 \xc3\xa9t\xff\x00 end "
                           "thethethethethethethethethethethethethethethethethethethethethethethethethethe"; /* a long word */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  const char *path = fuzz_file(0, "tokenizer_json", data, n);
  moe_tokenizer *t = NULL;
  if (moe_tokenizer_load(&t, path) != MOE_OK) return 0;
  for (int flags = 0; flags < 4; flags++) {
    int32_t *ids = NULL, fixed[sizeof TEXT];
    size_t k = 0, kf = 0, len = 0;
    if (moe_tokenizer_encode_alloc(t, TEXT, sizeof TEXT, flags, &ids, &k) != MOE_OK) continue; /* e.g. no unk token */
    for (size_t i = 0; i < k; i++)
      if (ids[i] < 0 || ids[i] >= moe_tokenizer_vocab_size(t)) abort();
    if (moe_tokenizer_encode(t, TEXT, sizeof TEXT, flags, fixed, &kf) == MOE_OK &&
        (kf != k || memcmp(fixed, ids, k * sizeof *ids)))
      abort(); /* the two encoders disagree */
    moe_status st = moe_tokenizer_decode(t, ids, k, NULL, 0, &len);
    char *back = st == MOE_OK || st == MOE_ERR_ARG ? malloc(len + 1) : NULL;
    if (!back || moe_tokenizer_decode(t, ids, k, back, len, &len) != MOE_OK) abort();
    if (flags == 1 && moe__tok_round_trips(t) && (len != sizeof TEXT || memcmp(back, TEXT, len))) abort();
    free(back);
    free(ids);
  }
  moe_tokenizer_free(t);
  return 0;
}
