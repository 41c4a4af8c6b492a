/* Running the moe command line from a test. */
#ifndef MOE_TEST_RUN_CLI_H
#define MOE_TEST_RUN_CLI_H

#include <stddef.h>

/* Runs `env_prefix moe args` through the shell (env_prefix may be NULL or "VAR=value ..."), stdout to
 * out_path (NULL: discarded); returns the exit status (128 if it did not exit) and leaves its stderr,
 * truncated to n - 1 bytes, in err (may be NULL). */
int run_moe(const char *env_prefix, const char *args, const char *out_path, char *err, size_t n);

/* mpirun as root with more ranks than cores; LeakSanitizer off, since Open MPI keeps allocations
 * until exit. TEST_MPI_ENV alone, to put another command (timeout) before mpirun. */
#define TEST_MPI_ENV "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
#define TEST_MPIRUN TEST_MPI_ENV "mpirun --oversubscribe "
/* Whether the library has MPI and mpirun is on the PATH; marks the test skipped (test_skip) with the
 * reason otherwise. */
int test_have_mpirun(void);
/* Runs this test binary's test `name` again under mpirun with W ranks, for at most timeout_s seconds:
 * 0 when it ends with status 0 and "1 passed, 0 failed", else mpirun's status (124: a rank hung),
 * or -1 with status 0. The command goes to cmd and its output (stdout and stderr) to out, for the
 * failure's message. */
int test_mpirun_self(int W, const char *name, int timeout_s, char *cmd, size_t cn, char *out, size_t on);
/* The per-step losses of `moe train --log-steps` output in path (at most max); their number. */
int test_read_losses(const char *path, double *loss, int max);

#endif
