/* Reading whole text files and streams for the commands that take text (tokenizer, train --task lm,
 * eval --task lm). */
#ifndef MOE_CLI_TEXT_IO_H
#define MOE_CLI_TEXT_IO_H

#include <stdio.h>

/* The whole stream in a malloc'd buffer, NUL-terminated (its length, without the NUL, in *n); NULL on
 * failure. */
char *cli_read_all(FILE *fp, size_t *n);
/* The file at path (or DIR/name when path is a directory) in a malloc'd buffer; the path used goes to
 * used (cap bytes). NULL on failure, errno telling why. */
char *cli_read_text(const char *path, const char *name, size_t *n, char *used, size_t cap);

#endif
