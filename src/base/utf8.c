#include <string.h>

#include "base/utf8.h"
#include "moe.h"

/* Bytes of the well-formed sequence at s (n left): its length, 0 when it is not one, or -1 when the n
 * bytes are a well-formed start that more bytes may complete (RFC 3629). */
static int seq_len(const unsigned char *s, size_t n) {
  int k = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
        : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
  unsigned lo = s[0] == 0xE0 ? 0xA0 : s[0] == 0xF0 ? 0x90 : 0x80, hi = s[0] == 0xED ? 0x9F : s[0] == 0xF4 ? 0x8F : 0xBF;
  for (int i = 1; i < k; i++, lo = 0x80, hi = 0xBF) {
    if ((size_t)i == n) return -1;
    if (s[i] < lo || s[i] > hi) return 0;
  }
  return k;
}

size_t moe__utf8_clean(const char *in, size_t n, int final, char *out, size_t *used) {
  size_t i = 0, w = 0;
  while (i < n) {
    int k = seq_len((const unsigned char *)in + i, n - i);
    if (k < 0 && !final) break; /* the rest may come with the next token */
    if (k > 0) memcpy(out + w, in + i, (size_t)k), w += (size_t)k, i += (size_t)k;
    else memcpy(out + w, "\xef\xbf\xbd", 3), w += 3, i++;
  }
  *used = i;
  return w;
}

size_t moe_utf8_clean(const char *in, size_t n, char *out) {
  size_t used, w = moe__utf8_clean(in, n, 1, out, &used);
  out[w] = 0;
  return w;
}
