/* cli.h -- shared pieces of the ringlm command-line tool. The CLI sees
 * only the public header: anything it needs from the engine must be in
 * ringlm.h. Exit codes: 0 success, 1 the operation failed (one line on
 * stderr: "ringlm: <message>"), 2 bad usage (one line naming the flag).
 * Options: model_cli.c holds the table of every model command's options;
 * main() (ringlm.c) splits --name=value into two arguments for all. */
#ifndef RLM_CLI_H
#define RLM_CLI_H

#include "ringlm.h"

#include <stdio.h>

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Parses a whole decimal integer in [lo, hi]; prints a usage error naming
 * `flag` and returns false otherwise. */
bool cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out);
/* Prints "ringlm: <msg>" for a failed call and returns CLI_FAIL. */
int cli_fail(const rlm_error *err);
/* Prints "ringlm: <what>: <msg>" (what: the file or flag the input came
 * from) and returns CLI_FAIL. */
int cli_fail_in(const char *what, const rlm_error *err);
/* One line "ringlm <cmd>: <msg> (see 'ringlm <cmd> --help')"; CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* One line "ringlm <cmd>: warning: <msg>" on stderr. */
void cli_warn(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic seconds, for the timings the commands print. */
double cli_now_s(void);
/* Token ids separated by commas and/or whitespace ("1,2,3", "1 2 3",
 * "1, 2\n3") -> *out (malloc'd); false after a usage message naming cmd. */
bool cli_parse_ids(const char *cmd, const char *s, int32_t **out, size_t *n);
/* The whole file ("-": stdin), NUL-terminated (malloc'd); NULL with errno
 * set. */
char *cli_read_file(const char *path, size_t *len);
/* How messages name a path: "<stdin>" for "-". */
const char *cli_path_name(const char *path);
/* text -> *ids (malloc'd) with t, as `ringlm tokenize` encodes it. On
 * failure err->msg is the problem without the "rlm_tokenize: " prefix,
 * for the caller to name the input (cli_fail_in). */
rlm_status cli_encode(const rlm_tokenizer *t, const char *text, size_t len, bool add_special,
                      int32_t **ids, size_t *n, rlm_error *err);

/* "222.1 KiB" (B, KiB, MiB, GiB) into buf; returns buf. */
const char *cli_bytes(double bytes, char *buf, size_t n);
/* "" when n == 1, else "s": "1 token", "2 tokens". */
const char *cli_s(long n);
/* The process's peak resident set size in bytes (getrusage ru_maxrss). */
double cli_peak_rss(void);
/* -t's default: the library's (rlm_cpu_info_get().n_physical) when 0. */
int cli_threads(int n_threads);

int cmd_quantize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_cache_prompt(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
