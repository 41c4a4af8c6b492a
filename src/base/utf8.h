/* UTF-8 checking for text that leaves the library as JSON or a stream (utf8.c). */
#ifndef MOE_BASE_UTF8_H
#define MOE_BASE_UTF8_H

#include <stddef.h>

/* Copies the n bytes of in to out as UTF-8 (room for 3 n bytes): well-formed sequences as they are,
 * each other byte as U+FFFD (as Python's errors="replace"). With final 0 an incomplete sequence at the
 * end is left for the next call (streaming: a character split over tokens). Returns the bytes written;
 * *used gets the input bytes consumed. */
size_t moe__utf8_clean(const char *in, size_t n, int final, char *out, size_t *used);

#endif
