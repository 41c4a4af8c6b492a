/* Running the moe command line from a test. */
#ifndef MOE_TEST_RUN_CLI_H
#define MOE_TEST_RUN_CLI_H

#include <stddef.h>

/* Runs `env_prefix moe args` through the shell (env_prefix may be NULL or "VAR=value ..."), stdout to
 * out_path (NULL: discarded); returns the exit status (128 if it did not exit) and leaves its stderr,
 * truncated to n - 1 bytes, in err (may be NULL). */
int run_moe(const char *env_prefix, const char *args, const char *out_path, char *err, size_t n);

#endif
