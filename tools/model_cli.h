/* model_cli.h -- what the commands that run a model share (run, logits,
 * perplexity, chat): their options, opening model + session + tokenizer,
 * and the generation loop that streams text, stops on EOS and stop
 * strings, and ends with the stats line. */
#ifndef RLM_MODEL_CLI_H
#define RLM_MODEL_CLI_H

#include "cli.h"

enum { MCLI_MAX_STOPS = 16 };

typedef struct model_opts {
  const char *dir;
  const char *ids_arg, *prompt, *file, *out; /* inputs; logits: .npy path */
  long n_gen;                                /* tokens to generate        */
  long ctx;                                  /* perplexity window         */
  long max_windows;                          /* perplexity: 0 = all       */
  bool kl;                                   /* perplexity vs dense KV    */
  rlm_sampler_params smp;
  bool print_ids, ignore_eos;
  bool verbose_prompt, no_stats;             /* chat                      */
  const char *stops[MCLI_MAX_STOPS];
  int n_stops;
  const char *system;                        /* chat: system prompt       */
  rlm_session_params sp;
} model_opts;

/* Everything a model command holds open; free with mcli_close. */
typedef struct model_ctx {
  rlm_model *m;
  rlm_session *s;
  rlm_tokenizer *tok;                        /* NULL without tokenizer.json */
  long vocab;
} model_ctx;

model_opts mcli_defaults(void);
/* The embedded model's folder ($RINGLM_MODEL, else the installed copy,
 * else this source tree's models/), or NULL when none is there. */
const char *mcli_default_model(void);
/* CLI_OK, MCLI_HELP (help printed) or a usage exit code. */
enum { MCLI_HELP = -1 };
int mcli_parse(int argc, char **argv, model_opts *o, const char *cmd, const char *help);
/* need_tok: fail when the folder has no tokenizer. */
int mcli_open(const model_opts *o, model_ctx *c, bool need_tok);
void mcli_close(model_ctx *c);
/* The prompt as ids: --ids, or --prompt / -f encoded (with BOS as the
 * tokenizer adds it). *ids malloc'd. */
int mcli_prompt_ids(const model_opts *o, const model_ctx *c, const char *cmd, int32_t **ids, size_t *n);

/* Generates up to o->n_gen tokens after ids[0:n) fed at the session's
 * position: streams text (or ids with --print-ids) to stdout, stops at an
 * EOS id or a stop string, prints the stats line to stderr. The generated
 * ids land in gen (room for n_gen), their count in *n_out. */
int mcli_generate(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n, int32_t *gen,
                  long *n_out);

#endif
