/* moe bench --optimizer-params: the optimizer step's time and memory bandwidth (bench_optim.c). */
#ifndef MOE_CLI_BENCH_OPTIM_H
#define MOE_CLI_BENCH_OPTIM_H

/* "N,N,..." into n (at most max); the count, or -1 for a bad list. */
int bench_optim_parse(const char *s, long *n, int max);
/* One line (or JSON line) per parameter count; 0, or 1 after printing what failed. */
int bench_optim_run(const long *n, int count, int threads, int reps, int json);

#endif
