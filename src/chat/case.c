/* Case mapping as JavaScript's String.prototype.toUpperCase / toLowerCase do it: glibc's C.UTF-8
 * locale gives Unicode's simple mapping for every script; the SpecialCasing rules chat text meets
 * (ß to SS, İ to i̇, Σ at the end of a word to ς) are added here. */
#include <locale.h>
#include <pthread.h>
#include <wctype.h>

#include "chat.h"

static locale_t utf8_locale;
static void init_locale(void) { utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0); }

void cj_put_utf8(cj_ctx *c, cj_buf *b, uint32_t cp) {
  char u[4];
  if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate has no UTF-8 */
  if (cp < 0x80) {
    u[0] = (char)cp;
    cj_put(c, b, u, 1);
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
    cj_put(c, b, u, 2);
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 63)), u[2] = (char)(0x80 | (cp & 63));
    cj_put(c, b, u, 3);
  } else {
    u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 63)), u[2] = (char)(0x80 | ((cp >> 6) & 63)),
    u[3] = (char)(0x80 | (cp & 63));
    cj_put(c, b, u, 4);
  }
}

static int is_letter(uint32_t cp) { return utf8_locale ? iswalpha_l((wint_t)cp, utf8_locale) : cp < 128 && cj_is_word((unsigned char)cp); }

static uint32_t map(uint32_t cp, int upper) {
  if (cp < 128) return upper ? (cp >= 'a' && cp <= 'z' ? cp - 32 : cp) : (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
  if (!utf8_locale) return cp;
  return (uint32_t)(upper ? towupper_l((wint_t)cp, utf8_locale) : towlower_l((wint_t)cp, utf8_locale));
}

cj_val *cj_recase(cj_ctx *c, cj_str s, cj_case how) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_locale);
  cj_buf b = {0};
  cj_put(c, &b, "", 0);
  uint32_t prev = 0;
  size_t len;
  for (size_t i = 0; i < s.n; i += len) {
    uint32_t cp = cj_utf8_next(s.s, s.n, i, &len);
    int bad = cp == 0xFFFD && len == 1 && (unsigned char)s.s[i] >= 0x80; /* not UTF-8: kept as it is */
    int first = i == 0;
    if (bad || how == CJ_TITLE || (how == CJ_CAPITALIZE && (!first || cp >= 0x10000))) {
      int up = how == CJ_TITLE && cp < 128 && cj_is_word((unsigned char)cp) && (first || !cj_is_word((unsigned char)s.s[i - 1]));
      if (up) cj_put_utf8(c, &b, map(cp, 1));
      else cj_put(c, &b, s.s + i, len);
    } else if (how != CJ_LOWER && cp == 0xDF) {
      cj_put(c, &b, "SS", 2);
    } else if (how == CJ_LOWER && cp == 0x130) {
      cj_put(c, &b, "i\xCC\x87", 3);
    } else if (how == CJ_LOWER && cp == 0x3A3) { /* final sigma: after a letter, before none */
      size_t nl;
      int next = i + len < s.n && is_letter(cj_utf8_next(s.s, s.n, i + len, &nl));
      cj_put_utf8(c, &b, prev && is_letter(prev) && !next ? 0x3C2 : 0x3C3);
    } else {
      cj_put_utf8(c, &b, map(cp, how != CJ_LOWER));
    }
    prev = cp;
  }
  return cj_buf_string(c, &b);
}
