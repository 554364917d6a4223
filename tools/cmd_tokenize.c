/* cmd_tokenize.c -- `ringlm tokenize`: text to ids and ids to text with a
 * model folder's tokenizer (a folder holding only tokenizer.json and
 * tokenizer_config.json is enough). */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ringlm tokenize -m DIR (--prompt TEXT | -f FILE) [--no-special]\n"
    "       ringlm tokenize -m DIR --decode --ids 1,2,3 [--skip-special]\n"
    "Encodes the text with DIR's tokenizer.json and prints the ids, space-separated,\n"
    "on one line, with the special tokens the tokenizer adds by default (e.g. BOS)\n"
    "unless --no-special. With --decode, prints the text of the ids and a newline.\n";

typedef struct tok_args {
  const char *dir, *prompt, *file, *ids;
  bool decode, no_special, skip_special;
} tok_args;

/* Returns CLI_OK, or the exit code of a usage error. */
static int parse_args(int argc, char **argv, tok_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    bool has_val = i + 1 < argc;
    if (!strcmp(f, "-m") && has_val) a->dir = argv[++i];
    else if (!strcmp(f, "--prompt") && has_val) a->prompt = argv[++i];
    else if (!strcmp(f, "-f") && has_val) a->file = argv[++i];
    else if (!strcmp(f, "--ids") && has_val) a->ids = argv[++i];
    else if (!strcmp(f, "--decode")) a->decode = true;
    else if (!strcmp(f, "--no-special")) a->no_special = true;
    else if (!strcmp(f, "--skip-special")) a->skip_special = true;
    else return cli_usage_error("tokenize", "unknown or incomplete option '%s'", f);
  }
  if (!a->dir) return cli_usage_error("tokenize", "-m DIR is required");
  if (a->decode && (!a->ids || a->prompt || a->file))
    return cli_usage_error("tokenize", "--decode takes --ids and no text");
  if (!a->decode && (a->ids || !a->prompt == !a->file))
    return cli_usage_error("tokenize", "give exactly one of --prompt TEXT and -f FILE");
  return CLI_OK;
}

static int decode_ids(const rlm_tokenizer *t, const tok_args *a) {
  int32_t *ids;
  size_t n, len = (size_t)-1;
  if (!cli_parse_ids("tokenize", a->ids, &ids, &n)) return CLI_USAGE;
  rlm_error err = {0};
  char *text = NULL;
  rlm_status rc = rlm_detokenize(t, ids, n, a->skip_special, NULL, 0, &len, &err);
  if (rc == RLM_ERR_INVALID && len != (size_t)-1) {
    text = malloc(len + 1);
    rc = text ? rlm_detokenize(t, ids, n, a->skip_special, text, len + 1, &len, &err) : RLM_ERR_NOMEM;
    if (!text) err = (rlm_error){.code = rc, .msg = "out of memory"};
  }
  int code = rc ? cli_fail(&err) : CLI_OK;
  if (!rc) fwrite(text, 1, len, stdout), fputc('\n', stdout);
  free(text);
  free(ids);
  return code;
}

static int encode_text(const rlm_tokenizer *t, const char *text, size_t len, bool add_special) {
  int32_t *ids;
  size_t n;
  rlm_error err = {0};
  if (cli_encode(t, text, len, add_special, &ids, &n, &err)) return cli_fail(&err);
  for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
  putchar('\n');
  free(ids);
  return CLI_OK;
}

int cmd_tokenize(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return fputs(help, stdout), CLI_OK;
  tok_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code) return code;
  rlm_error err = {0};
  rlm_tokenizer *t;
  if (rlm_tokenizer_load(&t, a.dir, &err)) return cli_fail(&err);
  if (a.decode) {
    code = decode_ids(t, &a);
  } else if (a.prompt) {
    code = encode_text(t, a.prompt, strlen(a.prompt), !a.no_special);
  } else {
    size_t len;
    char *text = cli_read_file(a.file, &len);
    if (!text) fprintf(stderr, "ringlm: %s: cannot read: %s\n", a.file, strerror(errno));
    code = text ? encode_text(t, text, len, !a.no_special) : CLI_FAIL;
    free(text);
  }
  rlm_tokenizer_free(t);
  return code;
}
