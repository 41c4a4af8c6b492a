/* Errors under mpirun, printed once: a check that fails alike on every rank would otherwise print W
 * times, each inside MPI_Abort's noise. Held errors are settled at points every rank reaches, where
 * rank 0 prints each distinct message once and every rank exits non-zero without MPI_Abort. */
#ifndef MOE_CLI_RANK_ERRORS_H
#define MOE_CLI_RANK_ERRORS_H

#include "moe.h"

/* From now on (when d has more than one rank) cli_fail and cli_usage_error hold this rank's first
 * message for cli_settle instead of printing it. */
void cli_hold_errors(const moe_dist *d);
/* Where errors go: printed, or held (the first one). */
void cli_report(const char *cmd, const char *msg);
/* True on ranks other than 0 while errors are held: they leave usage texts and notes to rank 0. */
int cli_quiet_rank(void);
/* A point every rank reaches (a collective): when any rank's rc is non-zero, rank 0 prints each
 * distinct held message once, naming the ranks that had it unless all did, and every rank returns
 * non-zero (its rc, or 1). rc unchanged when none failed, or with one process. */
int cli_settle(const moe_dist *d, const char *cmd, int rc);
/* The end of a command: a failure not settled (the other ranks may be waiting in a collective) prints
 * its message naming this rank and stops every rank (moe_dist_abort); else moe_dist_finalize. Returns rc. */
int cli_dist_end(moe_dist *d, const char *cmd, int rc);

#endif
