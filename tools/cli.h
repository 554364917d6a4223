/* cli.h -- shared pieces of the ringlm command-line tool. The CLI sees
 * only the public header: anything it needs from the engine must be in
 * ringlm.h. Exit codes: 0 success, 1 the operation failed (one line on
 * stderr: "ringlm: <message>"), 2 bad usage. */
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
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Monotonic seconds, for the timings the commands print. */
double cli_now_s(void);
/* "1,2,3" -> *out (malloc'd); false after a usage message naming cmd. */
bool cli_parse_ids(const char *cmd, const char *s, int32_t **out, size_t *n);
/* The whole file, NUL-terminated (malloc'd); NULL with errno set. */
char *cli_read_file(const char *path, size_t *len);
/* text -> *ids (malloc'd) with t, as `ringlm tokenize` encodes it. */
rlm_status cli_encode(const rlm_tokenizer *t, const char *text, size_t len, bool add_special,
                      int32_t **ids, size_t *n, rlm_error *err);

int cmd_quantize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
