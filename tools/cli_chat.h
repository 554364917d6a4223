/* cli_chat.h -- chat templates as the commands use them: the template of
 * the model folder, or --chat-template FILE in its place; a conversation
 * kept as the JSON messages array the template renders; one user message
 * (with --system) rendered into prompt ids for `run --chat`. `chat` holds
 * the loop (cmd_chat.c); this is what it shares with `run --chat`. */
#ifndef RLM_CLI_CHAT_H
#define RLM_CLI_CHAT_H

#include "model_cli.h"

/* o->chat_template's file when given, else the folder's template.
 * CLI_OK, or CLI_FAIL after a one-line message naming the file. */
int cli_chat_load_template(const model_opts *o, rlm_chat_template **out);

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

#endif
