/* cmd_tokenize.c -- `ringlm tokenize`: text to ids and ids to text with a
 * model folder's tokenizer (a folder holding only tokenizer.json and
 * tokenizer_config.json is enough; the embedded model's by default).
 * Options: the table in model_cli.c. */
#include "model_cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ringlm tokenize [-m DIR] (-p TEXT | -f FILE) [--no-special]\n"
    "       ringlm tokenize [-m DIR] --decode --ids 1,2,3 [--skip-special]\n"
    "Encodes the text with DIR's tokenizer.json and prints the ids, space-separated,\n"
    "on one line, with the special tokens the tokenizer adds by default (e.g. BOS)\n"
    "unless --no-special. With --decode, prints the text of the ids (separated by\n"
    "commas or spaces, so tokenize's own output decodes) and a newline.\n";

static int decode_ids(const rlm_tokenizer *t, const model_opts *o) {
  int32_t *ids;
  size_t n, len = (size_t)-1;
  if (!cli_parse_ids("tokenize", o->ids_arg, &ids, &n)) return CLI_USAGE;
  rlm_error err = {0};
  char *text = NULL;
  rlm_status rc = rlm_detokenize(t, ids, n, o->skip_special, NULL, 0, &len, &err);
  if (rc == RLM_ERR_INVALID && len != (size_t)-1) {
    text = malloc(len + 1);
    rc = text ? rlm_detokenize(t, ids, n, o->skip_special, text, len + 1, &len, &err)
              : RLM_ERR_NOMEM;
    if (!text) err = (rlm_error){.code = rc, .msg = "out of memory"};
  }
  int code = rc ? cli_fail(&err) : CLI_OK;
  if (!rc) fwrite(text, 1, len, stdout), fputc('\n', stdout);
  free(text);
  free(ids);
  return code;
}

/* what: where the text came from ("--prompt" or the file), for errors. */
static int encode_text(const rlm_tokenizer *t, const char *what, const char *text, size_t len,
                       bool add_special) {
  int32_t *ids;
  size_t n;
  rlm_error err = {0};
  if (cli_encode(t, text, len, add_special, &ids, &n, &err)) return cli_fail_in(what, &err);
  for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
  putchar('\n');
  free(ids);
  return CLI_OK;
}

static int encode_file(const rlm_tokenizer *t, const model_opts *o) {
  size_t len;
  const char *name = cli_path_name(o->file);
  char *text = cli_read_file(o->file, &len);
  if (!text)
    return fprintf(stderr, "ringlm: %s: cannot read: %s\n", name, strerror(errno)), CLI_FAIL;
  int code = encode_text(t, name, text, len, !o->no_special);
  free(text);
  return code;
}

int cmd_tokenize(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int code = mcli_parse(argc, argv, &o, "tokenize", help);
  if (code) return code == MCLI_HELP ? CLI_OK : code;
  rlm_error err = {0};
  rlm_tokenizer *t;
  if (rlm_tokenizer_load(&t, o.dir, &err)) return cli_fail(&err);
  if (o.decode) code = decode_ids(t, &o);
  else if (o.prompt) code = encode_text(t, "--prompt", o.prompt, strlen(o.prompt), !o.no_special);
  else code = encode_file(t, &o);
  rlm_tokenizer_free(t);
  return code;
}
