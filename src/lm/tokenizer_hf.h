/* The parts of a Hugging Face tokenizer.json beyond the vocabulary and merges, as tokenizer_steps.c
 * reads them and tokenizer_pipeline.c runs them. Sequences are flattened into arrays of steps. */
#ifndef MOE_LM_TOKENIZER_HF_H
#define MOE_LM_TOKENIZER_HF_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lm/tokenizer.h"

typedef enum {
  /* normalizers */
  STEP_PREPEND, STEP_REPLACE, STEP_NFC, STEP_NFKC, STEP_NFD, STEP_NFKD, STEP_LOWERCASE, STEP_STRIP,
  /* pre-tokenizers */
  STEP_SPLIT, STEP_PREFIX_SPACE, STEP_METASPACE,
  /* decoders (STEP_REPLACE and STEP_STRIP too) */
  STEP_BYTE_LEVEL, STEP_BYTE_FALLBACK, STEP_FUSE, STEP_META_DECODE
} step_kind;

/* How a Split keeps its matches (HF's SplitDelimiterBehavior). */
typedef enum { KEEP_ISOLATED, KEEP_REMOVED, KEEP_WITH_PREVIOUS, KEEP_WITH_NEXT, KEEP_CONTIGUOUS } keep_kind;

typedef struct {
  step_kind kind;
  char *text;      /* Prepend's text, Replace's literal pattern, Metaspace's replacement, Strip's content */
  size_t text_len;
  char *with;      /* Replace's content */
  size_t with_len;
  pcre2_code *re;  /* Split's pattern; Replace's when a regex */
  keep_kind keep;
  int invert;      /* Split: the pieces between matches are the matches */
  int a, b;        /* Strip: left, right (normalizer: flags; decoder: counts); Metaspace: prepend scheme
                      (0 never, 1 first, 2 always), split */
} moe__tok_step;

struct moe__tok_hf {
  moe__tok_step *norm, *pre, *dec;
  int n_norm, n_pre, n_dec;
  int byte_level;        /* the vocabulary is bytes (ByteLevel's characters read back): BPE over bytes */
  int gpt2_split;        /* the pre-tokenizer is ByteLevel with GPT-2's regex alone */
  int byte_fallback, fuse_unk;
  int32_t unk;           /* the unknown token, or -1 */
  int32_t byte_tok[256]; /* <0xNN>, or -1 */
};

#endif
