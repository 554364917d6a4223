/* cli_chat.h -- chat templates as the commands use them: the template of
 * the model folder, or --chat-template FILE in its place; a conversation
 * kept as the JSON messages array the template renders; one user message
 * (with --system) rendered into prompt ids for `run --chat`; and the
 * turns of `ringlm chat` (cli_conv): what its session holds and what each
 * turn feeds. cmd_chat.c holds the loop (lines, Ctrl-C, commands). */
#ifndef RLM_CLI_CHAT_H
#define RLM_CLI_CHAT_H

#include "model_cli.h"

/* o->chat_template's file when given, else the folder's template.
 * CLI_OK, or CLI_FAIL after a one-line message naming the file. */
int cli_chat_load_template(const model_opts *o, rlm_chat_template **out);

/* The extra variables a --chat-template file renders with (the
 * tokenizer's bos_token and eos_token, as JSON, malloc'd); NULL for the
 * folder's template, which has them from its config, or out of memory. */
char *cli_chat_extra(const model_ctx *c, const model_opts *o);

/* [system, user] rendered with the generation prompt and encoded (the
 * template writes the special tokens); *ids malloc'd. */
int cli_chat_prompt_ids(const model_ctx *c, const model_opts *o, const char *user, int32_t **ids,
                        size_t *n);

/* A conversation as a JSON array of {"role", "content"} messages, held
 * open ("[{...}, {...}"): rendering closes it for the call only. */
typedef struct cli_msgs {
  char *p;    /* NUL-terminated; NULL until the first add */
  size_t n;   /* bytes used, the NUL not counted          */
  size_t cap; /* bytes allocated                          */
} cli_msgs;

/* Appends one message (text JSON-escaped); false when out of memory. */
bool cli_msgs_add(cli_msgs *m, const char *role, const char *text);
/* Forgets every message added after the first n bytes (a cli_msgs.n
 * taken earlier), e.g. all but the system prompt. */
void cli_msgs_cut(cli_msgs *m, size_t n);
void cli_msgs_free(cli_msgs *m);

/* Renders m with the generation prompt (printed on stderr with
 * --verbose-prompt) and encodes it without adding special tokens. A
 * --chat-template file gets the tokenizer's BOS and EOS text as bos_token
 * and eos_token, which the folder's template takes from its config.
 * *ids malloc'd; CLI_OK or CLI_FAIL after a one-line message. */
int cli_chat_render_ids(const model_ctx *c, const model_opts *o, const rlm_chat_template *t,
                        cli_msgs *m, int32_t **ids, size_t *n);

/* Whether s[0:n) is well-formed UTF-8 as JSON needs it: no overlong
 * forms, surrogates or code points past U+10FFFF. */
bool cli_utf8_valid(const char *s, size_t n);

/* ------------------------------------------------------------------------
 * A conversation and the session that holds it. Invariant between turns:
 * the session's KV holds exactly held[0:n_held) (its position is n_held).
 * Each turn renders the whole conversation and feeds only the ids past
 * the longest common prefix of held and the rendering, as llama.cpp's
 * server reuses its cache; the ids are compared, never assumed. The
 * session may hold ids the rendering lacks: the reply's last id, never
 * fed when -n or a stop string ended it, matches the rendering only if
 * the template re-encodes the reply to the same ids, and a stop string
 * cut from the reply leaves ids in the session that no rendering has.
 * A session that holds ids past the common prefix forgets them
 * (rlm_session_rollback), or starts over when its rings cannot.
 * ---------------------------------------------------------------------- */
typedef struct cli_conv {
  model_ctx *c;                 /* model and session (c->s), not owned       */
  const rlm_chat_template *tpl; /* not owned                                 */
  cli_msgs msgs;                /* the conversation so far                   */
  size_t n_sys;                 /* msgs.n holding the system prompt alone    */
  int32_t *held;                /* ids whose KV the session holds, in order  */
  size_t n_held;                /* ids at held                               */
  size_t cap_held;              /* room at held                              */
  int32_t *gen;                 /* the last reply's ids (mcli_gen_room)      */
  long n_gen;                   /* ids at gen                                */
  long n_restarts;              /* turns that started a fresh session        */
  long n_rollbacks;             /* turns that forgot ids past the prefix     */
} cli_conv;

/* An empty conversation (with o->system's message) held by c's session.
 * CLI_OK, or CLI_FAIL after a one-line message. */
int cli_conv_init(cli_conv *v, model_ctx *c, const model_opts *o, const rlm_chat_template *t);
void cli_conv_free(cli_conv *v);
/* The user's line (valid UTF-8, the caller checked) joins the
 * conversation, and the reply, streamed by mcli_generate, joins it as
 * it was shown: cut before a stop string. */
int cli_conv_turn(cli_conv *v, const model_opts *o, const char *line);
/* /clear: the system prompt alone, and a fresh session. */
int cli_conv_clear(cli_conv *v, const model_opts *o);
/* Brings the session to the longest common prefix of held and ids[0:n),
 * rolling back (or starting over) when it holds more; *keep: the ids of that prefix, which
 * the caller does not feed again (keep < n: the last id is always fed,
 * its logits are what the reply samples from). */
int cli_conv_sync(cli_conv *v, const model_opts *o, const int32_t *ids, size_t n, size_t *keep);

#endif
