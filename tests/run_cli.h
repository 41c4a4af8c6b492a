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
/* Whether the library has MPI and mpirun is on the PATH; prints SKIP with the reason otherwise. */
int test_have_mpirun(void);
/* Per-step losses from the --log-steps lines of a file (at most max); returns how many. */
int test_read_losses(const char *path, double *loss, int max);

#endif
