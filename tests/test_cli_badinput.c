/* test_cli_badinput.c -- every command of the ringlm binary that reads
 * files, fed malformed ones (ringlm issue 15, point 6): a path that is
 * missing, an empty file, a real file cut in half, invalid JSON, values of
 * the wrong type or absurd size, a folder where a file belongs and a file
 * where a folder does, no read permission, and an output that cannot be
 * written. Each case must exit 1 (2 is for usage errors, and a bad file is
 * not one; a signal is a crash), print exactly one line on stderr that
 * names the bad file or folder, and leave no output (logits -o,
 * cache-prompt -o, quantize OUT, run --prompt-cache on a fresh path) nor
 * any *.tmp.* file behind.
 *
 * ONE table drives it (`cases`): a command template, what to break and
 * how, and what the message must say. Each case gets a folder of its own,
 * hard links to a pristine copy of the fixtures (tests/fixtures/models/
 * llama; models/brown-15m-4bit, which has a tokenizer and a chat template)
 * in which the broken path is first unlinked, so no fixture is touched.
 * A GGUF file for `inspect` is written with tests/gguf_write.h.
 * Runs the built binary ($RINGLM_BIN). As root, chmod 000 stops no read:
 * those cases run as nobody (setpriv) when they can, else they say
 * "skipped" with the reason and count as neither passed nor failed. */
#include "gguf_write.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

static char g_dir[256];
static const char *g_bin, *g_src;

/* How the case's target is broken (it is unlinked first, but for B_NONE). */
typedef enum break_kind {
  B_NONE,    /* nothing: the command itself fails (an unwritable output) */
  B_MISSING, /* the path does not exist                                  */
  B_EMPTY,   /* an empty file                                            */
  B_HALF,    /* the pristine file's first half                           */
  B_BADJSON, /* a JSON text cut inside an array                          */
  B_TEXT,    /* the file holds `from`                                    */
  B_EDIT,    /* the pristine file with `from` replaced by `to`           */
  B_DIR,     /* an empty folder where a file belongs                     */
  B_FILE,    /* a file where a folder belongs                            */
  B_HDR62,   /* a safetensors header length of 2^62                      */
  B_PERM,    /* chmod 000 (as root: run as nobody, or skipped)           */
} break_kind;

static const char *const brk_names[] = {"as-is",             "missing",      "empty",
                                        "truncated",         "invalid-json", "text",
                                        "edited",            "a-folder",     "a-file",
                                        "header-2^62",       "no-permission"};

typedef struct bad_case {
  const char *cmd;        /* shell command; {bin}: the binary, {d}: the case's
                             folder, {m}: its model {d}/m, {t}: the target,
                             {good}: an intact brown model               */
  const char *model;      /* "brown" or "llama": what {d}/m is a copy of  */
  const char *target;     /* what is broken, relative to {d}              */
  break_kind how;
  const char *from, *to;  /* B_EDIT: text and replacement; B_TEXT: content */
  const char *want;       /* the message contains this                    */
  const char *named;      /* ...and this path, relative to {d} (NULL: target) */
  const char *out;        /* must not exist afterwards, relative to {d}   */
} bad_case;

/* ---- the commands ---------------------------------------------------------- */

#define K_RUN "{bin} run -m {m} -p 'the jury' -n 2"
#define K_RUN_CHAT "{bin} run -m {m} -p 'the jury' -n 2 --chat"
#define K_RUN_IDS "{bin} run -m {m} --ids 1,2,3 -n 2"
#define K_LOGITS "{bin} logits -m {m} -p 'the jury' -o {d}/out.npy"
#define K_PPL "{bin} perplexity -m {m} -f {d}/prompt.txt -c 8"
#define K_CHAT "echo hello | {bin} chat -m {m} -n 2"
#define K_BENCH "{bin} bench -m {m} -p 4 -n 2 -r 1"
#define K_BATCH "{bin} batch -m {m} -f {d}/prompts.txt -n 2"
#define K_TOKENIZE "{bin} tokenize -m {m} -p 'the jury'"
#define K_CACHE "{bin} cache-prompt -m {m} -p 'the jury' -o {d}/out.cache"
#define K_PCACHE "{bin} run -m {m} -p 'the jury said' -n 2 --prompt-cache {d}/fresh.cache"
#define K_SERVE "{bin} serve -m {m} --port 0"
#define K_INSPECT_M "{bin} inspect -m {m}"
#define K_INSPECT "{bin} inspect {t}"
#define K_INSPECT_DIR "{bin} inspect {m}"
#define K_QUANTIZE "{bin} quantize {t} {d}/q"
#define K_DRAFT "{bin} run -m {good} -p 'the jury' -n 2 --draft {m}"
/* the prompt from a file */
#define K_RUN_F "{bin} run -m {m} -f {t} -n 2"
#define K_LOGITS_F "{bin} logits -m {m} -f {t} -o {d}/out.npy"
#define K_PPL_F "{bin} perplexity -m {m} -f {t} -c 8"
#define K_TOKENIZE_F "{bin} tokenize -m {m} -f {t}"
#define K_CACHE_F "{bin} cache-prompt -m {m} -f {t} -o {d}/out.cache"
#define K_BATCH_F "{bin} batch -m {m} -f {t} -n 2"
#define K_BENCH_F "{bin} bench -m {m} --lookup 2 -f {t} -p 0 -n 2 -r 1"
/* --chat-template FILE */
#define K_RUN_TPL "{bin} run -m {m} -p 'the jury' -n 2 --chat --chat-template {t}"
#define K_CHAT_TPL "echo hello | {bin} chat -m {m} -n 2 --chat-template {t}"
#define K_SERVE_TPL "{bin} serve -m {m} --port 0 --chat-template {t}"
/* a file size limit (dash's ulimit: 512-byte blocks) makes writes fail
 * with EFBIG, SIGXFSZ ignored */
#define K_LIMIT "trap '' XFSZ; ulimit -f 16; "

/* One break of a model file, crossed with every command that loads the
 * model (brown); the outputs of logits, cache-prompt and run
 * --prompt-cache must not appear. */
#define EVERY_MODEL_COMMAND(target, how, from, to, want, named)                                  \
  {K_RUN, "brown", target, how, from, to, want, named, NULL},                                    \
  {K_LOGITS, "brown", target, how, from, to, want, named, "out.npy"},                            \
  {K_PPL, "brown", target, how, from, to, want, named, NULL},                                    \
  {K_CHAT, "brown", target, how, from, to, want, named, NULL},                                   \
  {K_BENCH, "brown", target, how, from, to, want, named, NULL},                                  \
  {K_BATCH, "brown", target, how, from, to, want, named, NULL},                                  \
  {K_CACHE, "brown", target, how, from, to, want, named, "out.cache"},                           \
  {K_PCACHE, "brown", target, how, from, to, want, named, "fresh.cache"},                        \
  {K_SERVE, "brown", target, how, from, to, want, named, NULL},                                  \
  {K_INSPECT_M, "brown", target, how, from, to, want, named, NULL},                              \
  {K_DRAFT, "brown", target, how, from, to, want, named, NULL}

/* One break of tokenizer.json, crossed with every command that loads it. */
#define EVERY_TOKENIZER_COMMAND(how, want)                                                       \
  {K_RUN, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                       \
  {K_LOGITS, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, "out.npy"},               \
  {K_PPL, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                       \
  {K_CHAT, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                      \
  {K_BENCH, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                     \
  {K_BATCH, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                     \
  {K_TOKENIZE, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL},                  \
  {K_CACHE, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, "out.cache"},              \
  {K_SERVE, "brown", "m/tokenizer.json", how, NULL, NULL, want, NULL, NULL}

/* One break of the prompt file given with -f, crossed with every command
 * that reads one. */
#define EVERY_PROMPT_FILE_COMMAND(how, want)                                                     \
  {K_RUN_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, NULL},                           \
  {K_LOGITS_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, "out.npy"},                   \
  {K_PPL_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, NULL},                           \
  {K_TOKENIZE_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, NULL},                      \
  {K_CACHE_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, "out.cache"},                  \
  {K_BATCH_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, NULL},                         \
  {K_BENCH_F, "brown", "prompt.txt", how, NULL, NULL, want, NULL, NULL}

/* One break of the --chat-template file, crossed with its three users. */
#define EVERY_TEMPLATE_COMMAND(how, from, want)                                                  \
  {K_RUN_TPL, "brown", "tpl.jinja", how, from, NULL, want, NULL, NULL},                          \
  {K_CHAT_TPL, "brown", "tpl.jinja", how, from, NULL, want, NULL, NULL},                         \
  {K_SERVE_TPL, "brown", "tpl.jinja", how, from, NULL, want, NULL, NULL}

static const bad_case cases[] = {
    /* -- the model folder and its weights, every command that loads them */
    /* (the wording differs: config.json, tokenizer.json or the template
     * is what a command looks for first) */
    EVERY_MODEL_COMMAND("m", B_MISSING, NULL, NULL, "", NULL),
    EVERY_MODEL_COMMAND("m", B_FILE, NULL, NULL, "", NULL),
    EVERY_MODEL_COMMAND("m/config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL),
    EVERY_MODEL_COMMAND("m/config.json", B_HALF, NULL, NULL, "invalid JSON", NULL),
    EVERY_MODEL_COMMAND("m/config.json", B_EDIT, "\"num_hidden_layers\": 8",
                        "\"num_hidden_layers\": \"three\"", "num_hidden_layers is not an integer",
                        NULL),
    EVERY_MODEL_COMMAND("m/model.safetensors", B_HALF, NULL, NULL, "truncated", NULL),
    EVERY_MODEL_COMMAND("m/model.safetensors", B_HDR62, NULL, NULL, "header length", NULL),
    /* -- config.json, more ways */
    {K_RUN, "brown", "m/config.json", B_MISSING, NULL, NULL, "cannot open", NULL, NULL},
    {K_SERVE, "brown", "m/config.json", B_MISSING, NULL, NULL, "cannot open", NULL, NULL},
    {K_INSPECT_M, "brown", "m/config.json", B_MISSING, NULL, NULL, "cannot open", NULL, NULL},
    {K_RUN, "brown", "m/config.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_BENCH, "brown", "m/config.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_RUN, "brown", "m/config.json", B_DIR, NULL, NULL, "not a regular file", NULL, NULL},
    {K_CACHE, "brown", "m/config.json", B_DIR, NULL, NULL, "not a regular file", NULL, "out.cache"},
    {K_RUN, "brown", "m/config.json", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_RUN, "brown", "m/config.json", B_TEXT, "[1, 2, 3]", NULL, "not a JSON object", NULL, NULL},
    {K_RUN, "brown", "m/config.json", B_EDIT, "\"vocab_size\": 8192", "\"vocab_size\": -5",
     "vocab_size is -5", NULL, NULL},
    {K_LOGITS, "brown", "m/config.json", B_EDIT, "\"vocab_size\": 8192", "\"vocab_size\": -5",
     "vocab_size is -5", NULL, "out.npy"},
    {K_RUN, "brown", "m/config.json", B_EDIT, "\"hidden_size\": 384", "\"hidden_size\": 1e30",
     "hidden_size 1000000000000000019884624838656 is out of range", NULL, NULL},
    {K_BATCH, "brown", "m/config.json", B_EDIT, "\"hidden_size\": 384", "\"hidden_size\": 1e30",
     "hidden_size 1000000000000000019884624838656 is out of range", NULL, NULL},
    {K_RUN, "brown", "m/config.json", B_EDIT, "\"num_hidden_layers\": 8",
     "\"num_hidden_layers\": 1000000000", "at most 512 layers", NULL, NULL},
    {K_INSPECT_M, "brown", "m/config.json", B_EDIT, "\"num_hidden_layers\": 8",
     "\"num_hidden_layers\": 1000000000", "at most 512 layers", NULL, NULL},
    /* 10^9 vocabulary ids: the weights, which have 8192, are named */
    {K_RUN, "brown", "m/config.json", B_EDIT, "\"vocab_size\": 8192", "\"vocab_size\": 1000000000",
     "expected [1000000000, ", "m/model.safetensors", NULL},
    {K_PPL, "brown", "m/config.json", B_EDIT, "\"vocab_size\": 8192", "\"vocab_size\": 1000000000",
     "expected [1000000000, ", "m/model.safetensors", NULL},
    {K_RUN_IDS, "llama", "m/config.json", B_EDIT, "\"tie_word_embeddings\": false",
     "\"tie_word_embeddings\": \"yes\"", "tie_word_embeddings is neither true nor false", NULL,
     NULL},
    {K_INSPECT_M, "llama", "m/config.json", B_EDIT, "\"tie_word_embeddings\": false",
     "\"tie_word_embeddings\": \"yes\"", "tie_word_embeddings is neither true nor false", NULL,
     NULL},
    {K_RUN_IDS, "llama", "m/config.json", B_EDIT, "\"eos_token_id\": 2", "\"eos_token_id\": \"2\"",
     "eos_token_id is neither a token id nor a list of them", NULL, NULL},
    /* -- model.safetensors, more ways */
    {K_RUN, "brown", "m/model.safetensors", B_MISSING, NULL, NULL, "neither model.safetensors",
     "m", NULL},
    {K_INSPECT_DIR, "brown", "m/model.safetensors", B_MISSING, NULL, NULL,
     "neither model.safetensors", "m", NULL},
    {K_RUN, "brown", "m/model.safetensors", B_EMPTY, NULL, NULL, "truncated", NULL, NULL},
    {K_INSPECT, "brown", "m/model.safetensors", B_EMPTY, NULL, NULL, "0 bytes", NULL, NULL},
    {K_RUN, "brown", "m/model.safetensors", B_DIR, NULL, NULL, "not a regular file", NULL, NULL},
    {K_INSPECT, "brown", "m/model.safetensors", B_DIR, NULL, NULL, "folder has neither", NULL,
     NULL},
    {K_RUN, "brown", "m/model.safetensors", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_INSPECT, "brown", "m/model.safetensors", B_PERM, NULL, NULL, "Permission denied", NULL,
     NULL},
    {K_RUN, "brown", "m/model.safetensors.index.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL,
     NULL},
    /* -- the model folder, more ways */
    {K_RUN, "brown", "m", B_DIR, NULL, NULL, "config.json: cannot open", NULL, NULL},
    {K_INSPECT_M, "brown", "m", B_DIR, NULL, NULL, "config.json: cannot open", NULL, NULL},
    {K_RUN, "brown", "m", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_INSPECT, "brown", "m", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    /* -- generation_config.json */
    {K_RUN, "brown", "m/generation_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_SERVE, "brown", "m/generation_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL,
     NULL},
    {K_INSPECT_M, "brown", "m/generation_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL,
     NULL},
    {K_RUN, "brown", "m/generation_config.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_RUN, "brown", "m/generation_config.json", B_HALF, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_RUN, "brown", "m/generation_config.json", B_DIR, NULL, NULL, "not a regular file", NULL,
     NULL},
    {K_RUN, "brown", "m/generation_config.json", B_PERM, NULL, NULL, "Permission denied", NULL,
     NULL},
    {K_RUN, "brown", "m/generation_config.json", B_TEXT, "[1, 4]", NULL, "not a JSON object", NULL,
     NULL},
    {K_RUN, "brown", "m/generation_config.json", B_EDIT, "\"eos_token_id\": [",
     "\"eos_token_id\": \"x\", \"e\": [", "eos_token_id is neither a token id nor a list of them",
     NULL, NULL},
    {K_CHAT, "brown", "m/generation_config.json", B_EDIT, "\"eos_token_id\": [",
     "\"eos_token_id\": \"x\", \"e\": [", "eos_token_id is neither a token id nor a list of them",
     NULL, NULL},
    {K_BATCH, "brown", "m/generation_config.json", B_EDIT, "    4\n", "    1e30\n",
     "eos_token_id[1] is not a token id", NULL, NULL},
    {K_RUN, "brown", "m/generation_config.json", B_EDIT, "\"bos_token_id\": 2",
     "\"bos_token_id\": true", "bos_token_id is not a token id", NULL, NULL},
    /* -- tokenizer.json, every command that loads it */
    EVERY_TOKENIZER_COMMAND(B_BADJSON, "invalid JSON"),
    EVERY_TOKENIZER_COMMAND(B_HALF, "invalid JSON"),
    /* missing: nothing can encode text (the folder is named) */
    {K_RUN, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "no tokenizer.json", "m", NULL},
    {K_TOKENIZE, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "tokenizer.json", "m", NULL},
    {K_PPL, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "tokenizer.json", "m", NULL},
    {K_CHAT, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "tokenizer.json", "m", NULL},
    {K_SERVE, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "tokenizer.json", "m", NULL},
    {K_CACHE, "brown", "m/tokenizer.json", B_MISSING, NULL, NULL, "no tokenizer.json", "m",
     "out.cache"},
    {K_RUN, "brown", "m/tokenizer.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_RUN, "brown", "m/tokenizer.json", B_DIR, NULL, NULL, "not a regular file", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer.json", B_DIR, NULL, NULL, "not a regular file", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer.json", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer.json", B_EDIT, "\"vocab\": {", "\"vocab\": [], \"v\": {",
     "vocab", NULL, NULL},
    {K_RUN, "brown", "m/tokenizer.json", B_EDIT, "\"type\": \"BPE\"", "\"type\": 5", "model type",
     NULL, NULL},
    /* -- tokenizer_config.json (the tokenizer's special tokens, the chat template) */
    {K_RUN, "brown", "m/tokenizer_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL,
     NULL},
    {K_CHAT, "brown", "m/tokenizer_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_SERVE, "brown", "m/tokenizer_config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL,
     NULL},
    {K_RUN, "brown", "m/tokenizer_config.json", B_EMPTY, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_RUN, "brown", "m/tokenizer_config.json", B_HALF, NULL, NULL, "invalid JSON", NULL, NULL},
    {K_TOKENIZE, "brown", "m/tokenizer_config.json", B_DIR, NULL, NULL, "not a regular file", NULL,
     NULL},
    {K_RUN, "brown", "m/tokenizer_config.json", B_PERM, NULL, NULL, "Permission denied", NULL,
     NULL},
    {K_RUN_CHAT, "brown", "m/tokenizer_config.json", B_EDIT, "\"chat_template\": \"",
     "\"chat_template\": 5, \"x\": \"", "chat_template is neither", NULL, NULL},
    {K_CHAT, "brown", "m/tokenizer_config.json", B_EDIT, "\"chat_template\": \"",
     "\"chat_template\": 5, \"x\": \"", "chat_template is neither", NULL, NULL},
    {K_SERVE, "brown", "m/tokenizer_config.json", B_EDIT, "\"chat_template\": \"",
     "\"chat_template\": 5, \"x\": \"", "chat_template is neither", NULL, NULL},
    /* a template that renders nothing: the folder is named */
    {K_RUN_CHAT, "brown", "m/tokenizer_config.json", B_EDIT, "\"chat_template\": \"",
     "\"chat_template\": \"\", \"x\": \"", "renders the conversation to no tokens", "m", NULL},
    {K_CHAT, "brown", "m/tokenizer_config.json", B_EDIT, "\"chat_template\": \"",
     "\"chat_template\": \"\", \"x\": \"", "renders the conversation to no tokens", "m", NULL},
    /* -- --chat-template FILE */
    EVERY_TEMPLATE_COMMAND(B_MISSING, NULL, "cannot read the chat template"),
    EVERY_TEMPLATE_COMMAND(B_EMPTY, NULL, "is empty"),
    EVERY_TEMPLATE_COMMAND(B_DIR, NULL, "cannot read the chat template"),
    EVERY_TEMPLATE_COMMAND(B_TEXT, "{% for m in messages %}{{ m.content }", "unexpected"),
    EVERY_TEMPLATE_COMMAND(B_HALF, NULL, "line 1"),
    {K_RUN_TPL, "brown", "tpl.jinja", B_TEXT, "{{ '' }}", NULL,
     "renders the conversation to no tokens", NULL, NULL},
    {K_RUN_TPL, "brown", "tpl.jinja", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    /* -- -f FILE, every command that reads a prompt or text file */
    EVERY_PROMPT_FILE_COMMAND(B_MISSING, "cannot read"),
    EVERY_PROMPT_FILE_COMMAND(B_DIR, "cannot read"),
    {K_RUN_F, "brown", "prompt.txt", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_PPL_F, "brown", "prompt.txt", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    {K_PPL_F, "brown", "prompt.txt", B_EMPTY, NULL, NULL, "fewer than 2 tokens", NULL, NULL},
    {K_BENCH_F, "brown", "prompt.txt", B_EMPTY, NULL, NULL, "no prompts", NULL, NULL},
    {K_RUN_F, "brown", "prompt.txt", B_TEXT, "\xff\xfe not UTF-8", NULL, "UTF-8", NULL, NULL},
    /* -- run --prompt-cache FILE */
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_EMPTY, NULL, NULL, "not a safetensors file",
     NULL, NULL},
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_HALF, NULL, NULL, "truncated", NULL, NULL},
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_HDR62, NULL, NULL, "header length", NULL,
     NULL},
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_DIR, NULL, NULL, "not a regular file", NULL,
     NULL},
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_TEXT, "not a cache\n", NULL,
     "header length", NULL, NULL},
    {K_RUN " --prompt-cache {t}", "brown", "p.cache", B_PERM, NULL, NULL, "Permission denied", NULL,
     NULL},
    {K_RUN " --prompt-cache {d}/nodir/new.cache", "brown", "nodir", B_MISSING, NULL, NULL,
     "cannot create", "nodir/new.cache", "nodir"},
    /* -- inspect PATH */
    {K_INSPECT, "brown", "x.safetensors", B_MISSING, NULL, NULL, "cannot open", NULL, NULL},
    {K_INSPECT, "brown", "m/model.safetensors", B_HALF, NULL, NULL, "truncated", NULL, NULL},
    {K_INSPECT, "brown", "m/model.safetensors", B_HDR62, NULL, NULL, "header length", NULL, NULL},
    {K_INSPECT, "brown", "prompt.txt", B_NONE, NULL, NULL, "header length", NULL, NULL},
    {K_INSPECT, "brown", "p.cache", B_HALF, NULL, NULL, "truncated", NULL, NULL},
    {K_INSPECT, "brown", "p.cache", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    /* -- inspect FILE.gguf (pristine: a valid file of tests/gguf_write.h) */
    {K_INSPECT, "brown", "model.gguf", B_HALF, NULL, NULL, "truncated", NULL, NULL},
    {K_INSPECT, "brown", "model.gguf", B_EMPTY, NULL, NULL, "truncated: 0 bytes", NULL, NULL},
    {K_INSPECT, "brown", "model.gguf", B_TEXT, "not a GGUF file\n", NULL, "bad magic", NULL, NULL},
    {K_INSPECT, "brown", "model.gguf", B_TEXT, "GGUF\x04\x01\x01\x01", NULL,
     "GGUF version 16843012 is not supported", NULL, NULL},
    {K_INSPECT, "brown", "model.gguf", B_DIR, NULL, NULL, "not a regular file", NULL, NULL},
    {K_INSPECT, "brown", "model.gguf", B_PERM, NULL, NULL, "Permission denied", NULL, NULL},
    /* no .gguf in the name: known by its magic */
    {K_INSPECT, "brown", "gguf.bin", B_HALF, NULL, NULL, "truncated", NULL, NULL},
    /* a GGUF file as the model: its metadata lacks llama's sizes, named by
     * key (not "model.gguf/config.json: Not a directory") */
    {"{bin} run -m {t} -p 'the jury' -n 2", "brown", "model.gguf", B_NONE, NULL, NULL,
     "model.gguf: key 'llama.embedding_length' is missing", NULL, NULL},
    /* -- quantize IN OUT (the dense llama fixture; OUT never appears) */
    {K_QUANTIZE, "llama", "nothing", B_MISSING, NULL, NULL, "no such file or folder", NULL, "q"},
    {K_QUANTIZE, "llama", "in.safetensors", B_EMPTY, NULL, NULL, "0 bytes", NULL, "q"},
    {K_QUANTIZE, "llama", "m/model.safetensors", B_HALF, NULL, NULL, "truncated", NULL, "q"},
    {K_QUANTIZE, "llama", "m/model.safetensors", B_HDR62, NULL, NULL, "header length", NULL, "q"},
    {K_QUANTIZE, "llama", "m/model.safetensors", B_PERM, NULL, NULL, "Permission denied", NULL,
     "q"},
    {"{bin} quantize {m} {d}/q", "llama", "m/config.json", B_BADJSON, NULL, NULL, "invalid JSON",
     NULL, "q"},
    {"{bin} quantize {m} {d}/q", "llama", "m/config.json", B_HALF, NULL, NULL, "invalid JSON",
     NULL, "q"},
    {"{bin} quantize {m} {d}/q", "llama", "m/config.json", B_DIR, NULL, NULL, "not a regular file",
     NULL, "q"},
    {"{bin} quantize {m} {d}/q", "llama", "m/model.safetensors", B_MISSING, NULL, NULL,
     "neither model.safetensors", "m", "q"},
    {"{bin} quantize {m} {d}/q", "llama", "m/model.safetensors", B_DIR, NULL, NULL,
     "not a regular file", NULL, "q"},
    {"{bin} quantize {m} {t}/q", "llama", "nodir", B_MISSING, NULL, NULL, "does not exist",
     "nodir/q", "nodir"},
    {"{bin} quantize {m} {t}/q", "llama", "afile", B_FILE, NULL, NULL, "Not a directory", "afile/q",
     NULL},
    /* -- --draft DIR of the commands that speculate */
    {"{bin} bench -m {good} --draft {m} -f {d}/prompts.txt -p 0 -n 2 -r 1", "brown",
     "m/config.json", B_BADJSON, NULL, NULL, "invalid JSON", NULL, NULL},
    {"{bin} batch -m {good} --draft {m} -f {d}/prompts.txt -n 2", "brown", "m/config.json",
     B_BADJSON, NULL, NULL, "invalid JSON", NULL, NULL},
    {"{bin} serve -m {good} --draft {m} --port 0", "brown", "m/config.json", B_BADJSON, NULL,
     NULL, "invalid JSON", NULL, NULL},
    {"{bin} serve -m {good} --draft {m} --port 0", "brown", "m/model.safetensors", B_HALF, NULL,
     NULL, "truncated", NULL, NULL},
    /* -- outputs that cannot be written: nothing partial is left */
    {K_LIMIT K_LOGITS, "brown", "out.npy", B_NONE, NULL, NULL, "File too large", NULL, "out.npy"},
    {K_LIMIT K_CACHE, "brown", "out.cache", B_NONE, NULL, NULL, "File too large", NULL,
     "out.cache"},
    {K_LIMIT K_PCACHE, "brown", "fresh.cache", B_NONE, NULL, NULL, "File too large", NULL,
     "fresh.cache"},
    {K_LIMIT "{bin} quantize {m} {d}/q", "llama", "q", B_NONE, NULL, NULL, "File too large", NULL,
     "q"},
    {"{bin} logits -m {m} -p 'the jury' -o {t}", "brown", "odir", B_DIR, NULL, NULL,
     "cannot write the logits", NULL, NULL},
    {"{bin} logits -m {m} -p 'the jury' -o {t}/x.npy", "brown", "nodir", B_MISSING, NULL, NULL,
     "cannot write the logits", "nodir/x.npy", "nodir"},
    {"{bin} cache-prompt -m {m} -p 'the jury' -o {t}", "brown", "odir", B_DIR, NULL, NULL,
     "Is a directory", NULL, NULL},
};

/* ---- running one case ----------------------------------------------------- */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* tmpl with {bin}, {d}, {m}, {t} and {good} filled in. */
static void expand(char *out, size_t n, const char *tmpl, const char *d, const char *t) {
  char bin[1200], m[1024], good[1024];
  /* a command that is wrongly still running (a server that listens) is
   * stopped, and reads as exit status 124 */
  snprintf(bin, sizeof bin, "timeout -k 5 60 %s", g_bin);
  snprintf(m, sizeof m, "%s/m", d);
  snprintf(good, sizeof good, "%s/pristine/brown/m", g_dir);
  const struct { const char *key, *val; } subs[] = {
      {"{bin}", bin}, {"{d}", d}, {"{m}", m}, {"{t}", t}, {"{good}", good}};
  size_t k = 0;
  for (const char *p = tmpl; *p && k + 1 < n;) {
    size_t i = 0;
    while (i < N_OF(subs) && strncmp(p, subs[i].key, strlen(subs[i].key))) i++;
    if (i == N_OF(subs)) {
      out[k++] = *p++;
      continue;
    }
    k += (size_t)snprintf(out + k, n - k, "%s", subs[i].val);
    if (k >= n) k = n - 1;
    p += strlen(subs[i].key);
  }
  out[k] = 0;
}

static bool write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

/* Breaks t (the pristine copy of the same path: base); false when the
 * case cannot be set up. */
static bool apply_break(const bad_case *c, const char *t, const char *base) {
  size_t n = 0;
  char *img = NULL;
  bool ok = true;
  if (c->how == B_NONE) return true;
  if (sh("rm -rf '%s'", t) != 0) return false;
  switch (c->how) {
  case B_EMPTY: ok = write_bytes(t, "", 0); break;
  case B_BADJSON: ok = write_bytes(t, "{\"a\": [1, 2,", 12); break;
  case B_TEXT: ok = write_bytes(t, c->from, strlen(c->from)); break;
  case B_DIR: ok = mkdir(t, 0755) == 0; break;
  case B_FILE: ok = write_bytes(t, "a file, not a folder\n", 21); break;
  case B_HALF:
  case B_EDIT:
  case B_HDR62:
  case B_PERM:
    if (!(img = t_read_file(base, &n))) return false;
    break;
  default: break;
  }
  if (c->how == B_HALF) ok = write_bytes(t, img, n / 2);
  if (c->how == B_HDR62 || c->how == B_PERM) {
    const uint64_t len = 1ull << 62; /* little-endian, as the header length is */
    for (int i = 0; c->how == B_HDR62 && i < 8 && (size_t)i < n; i++)
      img[i] = (char)(len >> (8 * i));
    ok = write_bytes(t, img, n);
  }
  if (c->how == B_EDIT) {
    char *at = strstr(img, c->from);
    ok = at != NULL;
    FILE *f = ok ? fopen(t, "wb") : NULL;
    if (f) {
      fwrite(img, 1, (size_t)(at - img), f);
      fputs(c->to, f);
      fputs(at + strlen(c->from), f);
      ok = fclose(f) == 0;
    } else {
      ok = false;
    }
  }
  free(img);
  return ok && (c->how != B_PERM || chmod(t, 0) == 0);
}

/* ---- chmod 000 as root ------------------------------------------------------ */

/* Root reads a chmod 000 file all the same, so a B_PERM case would test
 * nothing. There the case runs as nobody (setpriv, uid/gid 65534) when
 * nobody can run the binary and read the fixtures; else it is skipped,
 * with the reason. */
#define AS_NOBODY "setpriv --reuid=65534 --regid=65534 --clear-groups "
static bool g_nobody_ok; /* root, and nobody can run the cases */
static bool g_as_nobody; /* the current case runs as nobody */

static bool readable(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    if (d) closedir(d);
    return d != NULL;
  }
  FILE *f = fopen(path, "rb");
  if (f) fclose(f);
  return f != NULL;
}

static void probe_nobody(void) {
  if (geteuid() != 0) return;
  chmod(g_dir, 0755); /* mkdtemp's 0700 */
  g_nobody_ok = sh(AS_NOBODY "sh -c \"test -x '%s' && test -r '%s/pristine/brown/m/config.json'\" "
                   ">/dev/null 2>&1", g_bin, g_dir) == 0;
}

/* For a B_PERM case whose target reads anyway: NULL when it can run as
 * nobody (g_as_nobody set), else why it is skipped. */
static const char *perm_fallback(const char *case_dir, const char *t) {
  if (!g_nobody_ok) return "chmod 000 does not stop reads when running as root, and setpriv "
                           "cannot run the case as nobody";
  if (sh(AS_NOBODY "test -r '%s'", t) == 0) return "chmod 000 does not stop reads, even as nobody";
  chmod(case_dir, 0777); /* nobody may write there: an output could appear */
  g_as_nobody = true;
  return NULL;
}

/* The names under folder `dir` that contain ".tmp." (leftover temporaries). */
static int n_tmp_in(const char *dir, char *first, size_t n) {
  DIR *d = opendir(dir);
  int k = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".tmp.") && k++ == 0) snprintf(first, n, "%s/%s", dir, e->d_name);
  closedir(d);
  return k;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static const bad_case *g_case;
static char g_case_dir[300];

/* Runs g_case in g_case_dir (broken already) and checks what it did. */
static void check_case(void) {
  const bad_case *c = g_case;
  const char *d = g_case_dir;
  char t[800], cmd[8192], tmpl[4096], named[800], outp[800], errp[700], tmp[1400] = "";
  snprintf(t, sizeof t, "%s/%s", d, c->target);
  snprintf(named, sizeof named, "%s/%s", d, c->named ? c->named : c->target);
  snprintf(errp, sizeof errp, "%s/stderr.txt", g_dir);
  expand(tmpl, sizeof tmpl, c->cmd, d, t);
  snprintf(cmd, sizeof cmd, "%s/case.sh", g_dir);
  CHECK(write_bytes(cmd, tmpl, strlen(tmpl)));
  snprintf(cmd, sizeof cmd, "%ssh %s/case.sh </dev/null >%s/stdout.txt 2>%s",
           g_as_nobody ? AS_NOBODY : "", g_dir, g_dir, errp);
  int st = system(cmd);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  size_t n = 0;
  char *err = t_read_file(errp, &n);
  if (!err) err = xmalloc(1);
  test_note("exit %d, stderr: %.200s", rc, err);
  CHECK(rc >= 0 && rc < 128); /* not killed by a signal (a crash) */
  CHECK(rc != 124);           /* not still running after 60 s */
  CHECK_EQ(rc, 1);
  CHECK_EQ(count_lines(err), 1);
  CHECK(n > 0 && err[n - 1] == '\n');
  CHECK_STR_CONTAINS(err, named);
  CHECK_STR_CONTAINS(err, c->want);
  struct stat sb;
  if (c->out) {
    snprintf(outp, sizeof outp, "%s/%s", d, c->out);
    CHECK(lstat(outp, &sb) != 0); /* no output, not even a partial one */
  }
  char m[700];
  snprintf(m, sizeof m, "%s/m", d);
  CHECK_EQ(n_tmp_in(d, tmp, sizeof tmp) + n_tmp_in(m, tmp, sizeof tmp), 0);
  if (tmp[0]) test_note("left behind: %s", tmp);
  free(err);
}

/* "run/m/config.json/edited" */
static void case_name(const bad_case *c, char *out, size_t n) {
  const char *w = strstr(c->cmd, "{bin} ");
  w = w ? w + 6 : c->cmd;
  size_t len = strcspn(w, " ");
  const char *extra = strstr(c->cmd, "--chat-template") ? "+template"
                      : strstr(c->cmd, "--draft")       ? "+draft"
                      : strstr(c->cmd, "--prompt-cache") ? "+prompt-cache"
                      : strstr(c->cmd, "ulimit")         ? "+ulimit"
                      : strstr(c->cmd, " --chat")        ? "+chat"
                                                         : "";
  snprintf(out, n, "%.*s%s/%s/%s", (int)len, w, extra, c->target, brk_names[c->how]);
}

static void run_case(int i) {
  const bad_case *c = &cases[i];
  char name[300], t[800], base[800];
  const char *skip = NULL;
  case_name(c, name, sizeof name);
  snprintf(g_case_dir, sizeof g_case_dir, "%s/c%03d", g_dir, i);
  snprintf(t, sizeof t, "%s/%s", g_case_dir, c->target);
  snprintf(base, sizeof base, "%s/pristine/%s/%s", g_dir, c->model, c->target);
  /* hard links: each broken path is unlinked before it is written */
  bool ok = sh("cp -al '%s/pristine/%s' '%s'", g_dir, c->model, g_case_dir) == 0;
  struct stat sb;
  g_as_nobody = false;
  if (ok && c->how == B_PERM && stat(base, &sb) == 0 && S_ISDIR(sb.st_mode))
    ok = chmod(t, 0) == 0; /* the case's own folder: only files are hard links */
  else if (ok) ok = apply_break(c, t, base);
  if (ok && c->how == B_PERM && readable(t)) skip = perm_fallback(g_case_dir, t);
  if (!ok) {
    t_cur_name = name;
    t_cur_failed = 0;
    t_note[0] = 0;
    t_failed(__FILE__, __LINE__, "the case could not be set up");
    t_fail++;
    fprintf(stderr, "FAIL %s (setup)\n", name);
  } else if (skip) {
    printf("skipped: %s: %s\n", name, skip);
  } else {
    g_case = c;
    t_run(name, check_case);
  }
  sh("chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", g_case_dir, g_case_dir);
}

/* ---- the fixtures --------------------------------------------------------- */

/* pristine/<model>: m/ (the model) and the files the commands are given. */
static bool make_pristine(void) {
  char p[700];
  const char *d = g_dir;
  bool ok = sh("mkdir -p %s/pristine/brown %s/pristine/llama && "
               "cp -r %s/models/brown-15m-4bit %s/pristine/brown/m && "
               "cp -r %s/tests/fixtures/models/llama %s/pristine/llama/m",
               d, d, g_src, d, g_src, d) == 0;
  static const char *const models[] = {"brown", "llama"};
  for (int i = 0; ok && i < 2; i++) {
    const char *mo = models[i];
    snprintf(p, sizeof p, "%s/pristine/%s/prompt.txt", d, mo);
    ok = write_bytes(p, "The jury said it was time to hear the story\n", 44);
    snprintf(p, sizeof p, "%s/pristine/%s/prompts.txt", d, mo);
    ok = ok && write_bytes(p, "The jury said\nthe story of the county\n", 38);
    snprintf(p, sizeof p, "%s/pristine/%s/tpl.jinja", d, mo);
    ok = ok && write_bytes(p, "{% for m in messages %}{{ m.content }}\n{% endfor %}\n", 53);
    snprintf(p, sizeof p, "%s/pristine/%s/in.safetensors", d, mo);
    ok = ok && sh("cp %s/pristine/%s/m/model.safetensors %s", d, mo, p) == 0;
  }
  gw gguf = {0};
  gw_model(&gguf, 3, 0, NULL);
  snprintf(p, sizeof p, "%s/pristine/brown/model.gguf", d);
  ok = ok && write_bytes(p, gguf.p, gguf.n);
  snprintf(p, sizeof p, "%s/pristine/brown/gguf.bin", d);
  ok = ok && write_bytes(p, gguf.p, gguf.n);
  free(gguf.p);
  ok = ok && sh("%s inspect %s >/dev/null 2>&1", g_bin, p) == 0;
  /* the pristine files must be whole and right: run each once */
  ok = ok && sh("%s cache-prompt -m %s/pristine/brown/m -p 'The jury said' -o "
                "%s/pristine/brown/p.cache >/dev/null 2>&1", g_bin, d, d) == 0;
  ok = ok && sh("%s run -m %s/pristine/brown/m -p 'the jury' -n 2 --chat --chat-template "
                "%s/pristine/brown/tpl.jinja >/dev/null 2>&1", g_bin, d, d) == 0;
  ok = ok && sh("%s run -m %s/pristine/llama/m --ids 1,2,3 -n 2 >/dev/null 2>&1", g_bin, d) == 0;
  return ok;
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_dir, sizeof g_dir, "clibad");
  if (!make_pristine()) {
    fprintf(stderr, "FAIL: the pristine fixtures could not be made in %s\n", g_dir);
    return 1;
  }
  probe_nobody();
  for (int i = 0; i < N_OF(cases); i++) run_case(i);
  printf("%d cases\n", N_OF(cases));
  return t_finish(g_dir);
}
