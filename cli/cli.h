/* Shared helpers of the moe subcommands: flag parsing and error reporting. Includes only moe.h. */
#ifndef MOE_CLI_H
#define MOE_CLI_H

#include "moe.h"

/* Prints "moe <cmd>: <moe_last_error()>" to stderr (or holds it under mpirun: rank_errors.h) and
 * returns 1 (the exit status). */
int cli_fail(const char *cmd);
/* Prints (or holds) "moe <cmd>: <message>" and returns 1. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True when an argument asks for help (--help or -h): the subcommand prints its usage to stdout, exits 0. */
int cli_wants_help(int argc, char **argv);
/* True when arg is "--name" or "--name" with '_' and '-' treated alike. */
int cli_flag_is(const char *arg, const char *name);
/* Parses a whole-string integer / float; returns 0 on garbage. */
int cli_parse_int(const char *s, int *out);
/* Prints o as one compact JSON line on stdout (cJSON escapes the strings) and deletes it. */
struct cJSON;
void cli_json_line(struct cJSON *o);
/* --pipeline: a count of micro-batches >= 1, or "auto" (0: the layer's adaptive choice). */
int cli_parse_pipeline(const char *s, int *out);
/* --parallel-r: r >= 0 or auto (MOE_PARALLEL_AUTO); _rs: a comma-separated list of them (at most
 * max), their number (0: not valid). cli/parallel_r.c */
int cli_parse_parallel_r(const char *s, int *out);
int cli_parse_parallel_rs(const char *s, int *out, int max);
/* --a2a linear|2dh|auto: the algorithm to set on the dist; auto sets 2DH's grid and *autom (the
 * layers' dictionary picks per capacity). cli/parallel_r.c */
int cli_parse_a2a(const char *s, moe_a2a *algo, int *autom);
/* The layer's dictionary entry (moe_layer_setup) as a line for the text table ("" without one), or as a
 * JSON member to append (", \"setup\": {...}"). cli/parallel_r.c */
void cli_setup_text(const moe_layer_t *l, int json, char *buf, size_t n);
int cli_parse_float(const char *s, float *out);
/* A size in MiB (a number > 0, fractions allowed) into bytes. */
int cli_parse_mib(const char *s, size_t *bytes);

/* "--task" among the arguments: 1 for "lm", 0 for "classifier" or none; -1 after printing for another
 * (train and eval serve both models). */
int cli_task_is_lm(const char *cmd, int argc, char **argv);

/* A 52-bit FNV-1a hash of n bytes: a value moe_dist_agree compares exactly. */
double cli_hash(const void *p, size_t n);

/* CPUs this process may run on (its affinity mask). */
int cli_cpu_count(void);
/* v (n values) in ascending order; their median (sorting them: n >= 1). */
void cli_sort_doubles(double *v, int n);
double cli_median(double *v, int n);
/* Seconds on a monotonic clock. */
double cli_now(void);

int cmd_layer_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_lm(int argc, char **argv); /* moe bench --lm (bench_lm.c) */
int cmd_compare(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_cachesim(int argc, char **argv);
int cmd_placement(int argc, char **argv);
int cmd_plot_trace(int argc, char **argv);
int cmd_infer(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_tokenizer_template(int argc, char **argv); /* moe tokenizer template (chat_template.c) */
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_gguf(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_convert(int argc, char **argv);

#endif
