/* ringlm.c -- the command-line tool: dispatch to one cmd_*.c per command,
 * --name=value split into two arguments for every command, `version`, and
 * the message helpers the commands share. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "rlm_commit.h" /* RLM_GIT_COMMIT, written at build time (cmake/git_commit.cmake) */

static const char usage[] =
    "usage: ringlm <command> [options]\n"
    "\n"
    "Every model command takes -m DIR, a Hugging Face model folder or a GGUF file\n"
    "(llama.cpp's; llama, qwen3, gemma3); without it, the embedded model\n"
    "(models/brown-15m-4bit, or $RINGLM_MODEL) runs.\n"
    "\n"
    "commands:\n"
    "  run [-m DIR] (-p TEXT | -f FILE | --ids 1,2,3) [-n N] [--chat] [--temp T] ...\n"
    "                  generate and stream text after the prompt (raw completion;\n"
    "                  --chat applies the chat template)\n"
    "                  --prompt-cache FILE: start from a saved prompt's KV\n"
    "  cache-prompt [-m DIR] (-p TEXT | -f FILE) -o CACHE [--kv-bits B] ...\n"
    "                  prefill a prompt once and save its KV snapshot (safetensors)\n"
    "  batch [-m DIR] -f PROMPTS [--parallel P] [-n N] ...\n"
    "                  every line of PROMPTS (text or JSON) in one continuous batch,\n"
    "                  results as JSON Lines in input order\n"
    "  serve [-m DIR] [--host ADDR] [--port N] [--parallel N] [--api-key KEY] ...\n"
    "                  an OpenAI-compatible HTTP server: chat completions and\n"
    "                  completions, streaming, continuous batching, speculative decoding\n"
    "  chat [-m DIR] [--system TEXT] [-n N] [--temp T] ...\n"
    "                  an interactive conversation with the model's chat template\n"
    "  logits [-m DIR] (--ids 1,2,3 | -p TEXT | -f FILE) -o FILE.npy ...\n"
    "                  logits of every position, as a NumPy file\n"
    "  perplexity [-m DIR] -f TEXT_FILE [-c N] [--kv-bits B] [--kl] ...\n"
    "                  perplexity of a text, in windows of N tokens\n"
    "  bench [-m DIR] [-p N] [-n N] [-d D1,D2] [-r REPS] [--kv-bits B] [--json] ...\n"
    "                  prefill and decode tokens/s at context depths, peak RSS;\n"
    "                  --batch 1,4,8: aggregate decode of B sequences at once;\n"
    "                  --draft DIR / --lookup N -f PROMPTS: speculative speed-up\n"
    "  tokenize [-m DIR] (-p TEXT | -f FILE) | --decode --ids 1,2,3\n"
    "                  text to token ids and back with the folder's tokenizer.json\n"
    "  quantize IN OUT [--bits B] [--group-size G] [--quantize-embeddings] [-t N]\n"
    "                  MLX affine-quantize a safetensors file or a Hugging Face folder\n"
    "  inspect PATH    list the tensors of a safetensors file or model folder;\n"
    "                  of a KV snapshot (cache-prompt): model, layers, tokens, bytes\n"
    "  inspect -m DIR  the model: layers, windows, parameters, KV bytes per --kv-bits\n"
    "  version         the version, the commit it was built from, the CPU features\n"
    "  help            this text\n"
    "\n"
    "Options take their value as '--name value' or '--name=value'.\n"
    "Run 'ringlm <command> --help' for a command's options and their defaults.\n"
    "Exit status: 0 ok, 1 the operation failed, 2 bad usage.\n";

/* "--name=value" (name: letters, digits, '-') splits into "--name" and
 * "value" in place: the NUL goes where the '=' was. */
static bool split_eq(char *a, char **value) {
  if (strncmp(a, "--", 2) || !isalnum((unsigned char)a[2])) return false;
  char *p = a + 2;
  while (isalnum((unsigned char)*p) || *p == '-') p++;
  if (*p != '=') return false;
  *p = 0;
  *value = p + 1;
  return true;
}

/* argv with every --name=value split, so all commands accept both forms;
 * malloc'd (NULL when out of memory). */
static char **split_args(int argc, char **argv, int *n_out) {
  char **v = malloc((2 * (size_t)argc + 1) * sizeof *v);
  int n = 0;
  for (int i = 0; v && i < argc; i++) {
    v[n++] = argv[i];
    if (i > 1 && split_eq(argv[i], &v[n])) n++; /* argv[1] is the command */
  }
  if (v) v[n] = NULL;
  *n_out = n;
  return v;
}

static int version(void) {
  rlm_cpu_info ci = rlm_cpu_info_get();
  printf("ringlm %s (commit %s), CPU: %s, %d physical core%s\n", rlm_version(), RLM_GIT_COMMIT,
         ci.features ? ci.features : "unknown", ci.n_physical, cli_s(ci.n_physical));
  return CLI_OK;
}

static int dispatch(int argc, char **argv) {
  static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
      {"quantize", cmd_quantize}, {"inspect", cmd_inspect}, {"run", cmd_run},
      {"logits", cmd_logits},     {"tokenize", cmd_tokenize}, {"perplexity", cmd_perplexity},
      {"chat", cmd_chat},         {"bench", cmd_bench},       {"batch", cmd_batch},
      {"serve", cmd_serve},       {"cache-prompt", cmd_cache_prompt}};
  const char *cmd = argv[1];
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
    if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) return version();
  fprintf(stderr, "ringlm: unknown command '%s'\n\n%s", cmd, usage);
  return CLI_USAGE;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
      !strcmp(argv[1], "-h")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? CLI_USAGE : CLI_OK;
  }
  int n;
  char **args = split_args(argc, argv, &n);
  if (!args) return fprintf(stderr, "ringlm: out of memory\n"), CLI_FAIL;
  int rc = dispatch(n, args);
  free(args);
  return rc;
}
