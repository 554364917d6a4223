/* ringlm.c -- the command-line tool: dispatch to one cmd_*.c per command,
 * and the argument helpers they share. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ringlm <command> [options]\n"
    "\n"
    "commands:\n"
    "  quantize IN OUT [--bits B] [--group-size G] [--quantize-embeddings] [-t N]\n"
    "                  MLX affine-quantize a safetensors file or a Hugging Face folder\n"
    "  inspect PATH    list the tensors of a safetensors file or model folder\n"
    "  inspect -m DIR  the model: layers, windows, parameters, KV bytes per --kv-bits\n"
    "  run -m DIR (--prompt TEXT | --ids 1,2,3) [-n N] [--print-ids] [--temp T] ...\n"
    "                  generate and stream text (greedy by default)\n"
    "  chat [-m DIR] [--system TEXT] [--temp T] ...\n"
    "                  an interactive conversation with the model's chat template\n"
    "  logits -m DIR --ids 1,2,3 -o FILE.npy [--kv-bits B] ...\n"
    "                  logits of every position, as a NumPy file\n"
    "  perplexity -m DIR -f TEXT_FILE [--ctx N] [--kv-bits B] ...\n"
    "                  perplexity of a text, in windows of N tokens\n"
    "  bench [-m DIR] [-p N] [-n N] [-d D1,D2] [--kv-bits B] [--json] ...\n"
    "                  prefill and decode tokens/s at context depths, peak RSS\n"
    "  tokenize -m DIR (--prompt TEXT | -f FILE) | --decode --ids 1,2,3\n"
    "                  text to token ids and back with DIR's tokenizer.json\n"
    "  version         print the library version\n"
    "\n"
    "Run 'ringlm <command> --help' for a command's options.\n";

bool cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "ringlm: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi,
            s ? s : "(nothing)");
    return false;
  }
  *out = v;
  return true;
}

int cli_fail(const rlm_error *err) {
  fprintf(stderr, "ringlm: %s\n", err->msg[0] ? err->msg : rlm_status_str(err->code));
  return CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ringlm %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see 'ringlm %s --help')\n", cmd);
  va_end(ap);
  return CLI_USAGE;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
      !strcmp(argv[1], "-h")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? CLI_USAGE : CLI_OK;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
  if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "logits")) return cmd_logits(argc - 1, argv + 1);
  if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
  if (!strcmp(cmd, "chat")) return cmd_chat(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("ringlm %s\n", rlm_version());
    return CLI_OK;
  }
  fprintf(stderr, "ringlm: unknown command '%s'\n\n%s", cmd, usage);
  return CLI_USAGE;
}
