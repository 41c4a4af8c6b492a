/* GPT-2's pre-tokenizer: its regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * run by PCRE2 over the text's UTF-8 with Unicode classes, as GPT-2's encoder runs it over code points
 * (letters, numbers and spaces of every script, not only ASCII's). The text is bytes: a byte that is
 * not part of valid UTF-8 matches nothing and is a pre-token of its own. The pattern is compiled once
 * (JIT where PCRE2 has it); each caller has its own match data. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"
#include "lm/tokenizer.h"

static const char GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static pcre2_code *code;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void compile(void) {
  int err;
  PCRE2_SIZE at;
  code = pcre2_compile((PCRE2_SPTR)GPT2, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                       &at, NULL);
  if (code) pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* the interpreter runs it when JIT is missing */
}

struct moe__pretok {
  pcre2_match_data *md;
  size_t start, end; /* the last match: [start, end) of the text */
};

moe_status moe__pretok_new(moe__pretok **out) {
  pthread_once(&once, compile);
  MOE_TRY(code, MOE_ERR_NOMEM, "tokenizer: cannot compile the pre-tokenizer's pattern (out of memory)");
  moe__pretok *p = calloc(1, sizeof *p);
  if (p) p->md = pcre2_match_data_create_from_pattern(code, NULL);
  if (!p || !p->md) {
    moe__pretok_free(p);
    MOE_TRY(0, MOE_ERR_NOMEM, "tokenizer: out of memory for the pre-tokenizer");
  }
  p->start = p->end = (size_t)-1;
  *out = p;
  return MOE_OK;
}

void moe__pretok_free(moe__pretok *p) {
  if (!p) return;
  pcre2_match_data_free(p->md);
  free(p);
}

size_t moe__pretok_next(moe__pretok *p, const unsigned char *s, size_t n, size_t i) {
  if (p->start == (size_t)-1 || p->start < i) { /* the next match at or after i (a gap of invalid bytes before it) */
    int rc = pcre2_match(code, s, n, i, 0, p->md, NULL);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
    p->start = rc > 0 ? ov[0] : n;
    p->end = rc > 0 ? ov[1] : n;
  }
  if (p->start > i) return i + 1; /* a byte of invalid UTF-8 */
  p->start = (size_t)-1;
  return p->end;
}
