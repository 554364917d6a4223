/* model_cli.h -- what the commands that use a model folder share (run,
 * logits, perplexity, chat, bench, tokenize): ONE table of their options
 * (model_cli.c) that parses, validates and prints --help; opening model +
 * session + tokenizer; the prompt as ids; and the generation loop that
 * streams text, stops on EOS, stop strings, the context limit or an
 * interrupt, and ends with the stats line. */
#ifndef RLM_MODEL_CLI_H
#define RLM_MODEL_CLI_H

#include "cli.h"

#include <signal.h>

enum { MCLI_MAX_STOPS = 16 };

/* Every option of the table lands in one of these fields; the defaults
 * are mcli_defaults()'s, and a command may change one before mcli_parse
 * (chat: -n 512), which --help then shows. */
typedef struct model_opts {
  const char *cmd;                           /* "run", ...: for messages  */
  const char *dir;                           /* -m; NULL: embedded model  */
  const char *ids_arg, *prompt, *file, *out; /* inputs; logits: .npy path */
  long n_gen;                                /* -n; -1: until EOS         */
  long n_ctx;                                /* run/chat -c; 0: model's   */
  long ctx;                                  /* perplexity window (-c)    */
  long max_windows;                          /* perplexity: 0 = all       */
  bool kl;                                   /* perplexity vs dense KV    */
  rlm_sampler_params smp;
  bool print_ids, ignore_eos;
  bool no_display_prompt;                    /* run: no prompt echo       */
  bool verbose_prompt, no_stats;             /* chat                      */
  const char *stops[MCLI_MAX_STOPS];
  int n_stops;
  const char *system;                        /* chat, run --chat          */
  rlm_session_params sp;
  const char *chat_template;                 /* --chat-template FILE, or NULL */
  bool chat;                                 /* run --chat: template the prompt */
  volatile sig_atomic_t *interrupt;          /* set (SIGINT): the reply ends */
  const char *echo;                          /* printed before the reply  */
  long n_prompt, reps;                       /* bench -p, -r              */
  const char *depths;                        /* bench -d "0,4096"         */
  bool json;                                 /* bench --json              */
  bool alternate;                            /* bench --alternate         */
  bool decode, no_special, skip_special;     /* tokenize                  */
  const char *draft_dir;                     /* --draft: a draft model    */
  const char *device;                        /* --device cpu|cuda         */
  int draft_max;                             /* --draft-max               */
  int draft_adaptive;                        /* --draft-adaptive 0|1      */
  int lookup_n;                              /* --lookup: n-gram size     */
  int parallel;                              /* batch --parallel          */
  const char *batch_sizes;                   /* bench --batch "1,4,8"     */
  const char *host;                          /* serve --host              */
  long port;                                 /* serve --port; 0: any free */
  const char *api_key;                       /* serve --api-key           */
  const char *memory_budget;                 /* serve: SIZE, "0": none    */
  const char *prompt_cache;                  /* serve --prompt-cache-bytes */
  long max_body;                             /* serve --max-body-bytes    */
  long timeout_s;                            /* serve --timeout           */
  long queue;                                /* serve --queue             */
  const char *prompt_cache_file;             /* run --prompt-cache FILE   */
  bool prompt_cache_ro;                      /* run --prompt-cache-ro     */
} model_opts;

/* Everything a model command holds open; free with mcli_close. */
typedef struct model_ctx {
  rlm_model *m;
  rlm_session *s;
  rlm_tokenizer *tok;                        /* NULL without tokenizer.json */
  rlm_model *dm;                             /* --draft's model, or NULL  */
  rlm_session *ds;                           /* its session               */
  long vocab;
  long n_ctx;           /* positions a session may reach: -c; without -c
                           none, except that -n -1 stops at the model's
                           max_position_embeddings (4096 if not given);
                           0: no limit                                   */
  int64_t max_positions;                     /* 0: config.json gives none */
  bool warned_long;                          /* that warning printed once */
} model_ctx;

model_opts mcli_defaults(void);
/* The embedded model's folder ($RINGLM_MODEL, else the installed copy,
 * else this source tree's models/), or NULL when none is there. */
const char *mcli_default_model(void);
/* Parses argv[1:] with the option table for cmd; help is the command's
 * usage line and paragraph, to which --help adds every option with its
 * meaning and default. Options of other commands are ignored with a
 * warning. Returns CLI_OK, MCLI_HELP (help printed) or CLI_USAGE. */
enum { MCLI_HELP = -1 };
int mcli_parse(int argc, char **argv, model_opts *o, const char *cmd, const char *help);
/* need_tok: fail when the folder has no tokenizer. */
int mcli_open(const model_opts *o, model_ctx *c, bool need_tok);
void mcli_close(model_ctx *c);
/* The prompt as ids: --ids, or the text of --prompt / -f (run --chat:
 * through the chat template) encoded with BOS as the tokenizer adds it.
 * *ids malloc'd; *text (may be NULL) the text, malloc'd, NULL for --ids. */
int mcli_prompt_ids(const model_opts *o, const model_ctx *c, int32_t **ids, size_t *n, char **text);
/* One warning per session when `n` positions exceed the model's
 * max_position_embeddings; what: "the prompt", "the window", ... */
void mcli_warn_positions(model_ctx *c, const model_opts *o, int64_t n, const char *what);

/* Room the gen array of mcli_generate needs: -n, or with -n -1 the
 * context (no reply can be longer). */
long mcli_gen_room(const model_ctx *c, const model_opts *o);
/* Generates up to o->n_gen tokens (-1: until EOS) after the prompt
 * ids[0:n), of which the session already holds the first n_cached, through
 * the library's engine (rlm_gen; --draft / --lookup: speculative): streams
 * text (or ids with --print-ids) to stdout after o->echo, stops at an EOS
 * id, a stop string, the context limit c->n_ctx or *o->interrupt (no
 * error), and prints the stats line to stderr unless o->no_stats. Fails
 * when the prompt leaves no room in the context. The generated ids land
 * in gen (room for mcli_gen_room), their count in *n_out; the session then
 * holds the prompt and every generated id but the last. */
int mcli_generate(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n, size_t n_cached,
                  int32_t *gen, long *n_out);
/* run --prompt-cache (cmd_cache.c): loads o->prompt_cache_file into row 0
 * when the prompt ids begin with its tokens (*n_cached: how many the
 * session then holds, at most n - 1), else leaves the row empty; then,
 * unless --prompt-cache-ro, prefills up to n - 1 and saves the file when
 * it holds less. A corrupt or mismatched file fails (exit 1). */
int mcli_prompt_cache(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n,
                      size_t *n_cached);
/* inspect PATH for a KV snapshot: describes it (CLI_OK), fails on a bad
 * one, or sets *not_cache for a file that is no snapshot at all. */
int mcli_inspect_cache(const char *path, bool *not_cache);
/* batch's prompt-file parser alone (cmd_batch.c), for the fuzz target:
 * the number of lines read (-1: out of memory), *n_invalid of them
 * refused with a message. */
long mcli_batch_parse(model_ctx *c, const model_opts *o, const char *text, size_t len, long *n_invalid);
/* The engine parameters of --draft-max and --lookup. */
rlm_gen_params mcli_gen_params(const model_opts *o);
/* A generation request for ids[0:n) with the options' sampler, -n, -c,
 * --ignore-eos and --stop. */
rlm_gen_request mcli_request(const model_ctx *c, const model_opts *o, const int32_t *ids, size_t n);

#endif
