/* cmd_chat.c -- `ringlm chat`: an interactive conversation. Each user line
 * joins the message list, the chat template (the model's, or
 * --chat-template FILE) renders the whole conversation with the
 * generation prompt, and only the tokens past what the session already
 * holds are fed (cli_conv in cli_chat.h: the session restarts when it
 * holds ids the new rendering lacks). Replies stream as they are
 * generated and end at an EOS id (generation_config.json), e.g.
 * <end_of_turn>, or at -n or a stop string, which is not shown and not
 * kept in the conversation.
 *
 * As llama.cpp users expect: on a terminal the lines are read with
 * libedit (line editing, history on the arrow keys), else from fd 0 as
 * they come (pipes, tests). Ctrl-C while a reply streams ends that reply
 * only (what came of it stays in the conversation); Ctrl-C while a line
 * is awaited ends the chat. A line that is not UTF-8 is refused and the
 * chat goes on. Lines starting with '/' are commands: /clear, /exit,
 * /quit. Messages to the user go to stderr; stdout carries the replies. */
#include "cli_chat.h"

#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char chat_help[] =
    "usage: ringlm chat [-m DIR] [--system TEXT] [--chat-template FILE] [options]\n"
    "Reads one user message per line from stdin (with line editing and history on a\n"
    "terminal) and streams each reply (at most -n tokens). The conversation is\n"
    "rendered with the model's chat template (tokenizer_config.json), or with the\n"
    "Jinja template of --chat-template FILE. Commands: /clear forgets the\n"
    "conversation (the system prompt stays), /exit or /quit ends it, as do an empty\n"
    "line and end of input (Ctrl-D). Ctrl-C stops a reply; at the prompt it ends the\n"
    "chat (exit status 130).\n";

/* Ctrl-C at the prompt: 128 + SIGINT, the status a shell reports for a
 * program Ctrl-C ended and the one llama.cpp exits with. */
enum { CHAT_INTERRUPTED = 128 + SIGINT };

/* ------------------------------------------------------------------------
 * Ctrl-C. The handler raises a flag, which mcli_generate polls between
 * tokens (model_opts.interrupt), and writes a byte to a pipe, which wakes
 * wait_input. A read cut short by EINTR would not do: the thread that
 * runs the handler may be any of the session's workers, and a Ctrl-C
 * just before the read began would be lost; its byte is not.
 * ---------------------------------------------------------------------- */

static volatile sig_atomic_t g_sigint;
static int g_wake[2] = {-1, -1}; /* the pipe: [0] polled, [1] the handler's */

static void on_sigint(int sig) {
  int saved = errno;
  (void)sig;
  g_sigint = 1;
  ssize_t r = write(g_wake[1], "", 1); /* full (EAGAIN): a byte waits already */
  (void)r;
  errno = saved;
}

/* The handler, with SA_RESTART so that the replies' writes go on, and
 * its pipe (non-blocking: the handler must never wait); *old to restore. */
static bool catch_sigint(struct sigaction *old) {
  if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK)) return false;
  struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, old);
  return true;
}

static void release_sigint(const struct sigaction *old) {
  sigaction(SIGINT, old, NULL);
  close(g_wake[0]);
  close(g_wake[1]);
  g_wake[0] = g_wake[1] = -1;
}

static void drain_wake(void) {
  char b[64];
  while (read(g_wake[0], b, sizeof b) > 0) continue;
}

/* A reply is over: the Ctrl-C that ended it is spent, and one from now
 * on is the prompt's (it ends the chat). */
static void sigint_spent(void) {
  g_sigint = 0;
  drain_wake();
}

/* Waits for input on stdin; false when Ctrl-C came, before the wait or
 * during it. */
static bool wait_input(void) {
  struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN},
                        {.fd = g_wake[0], .events = POLLIN}};
  while (!g_sigint) {
    if (poll(p, 2, -1) < 0 && errno != EINTR) return true; /* the read will report it */
    if (g_sigint) break;
    if (p[0].revents) return true;
    if (p[1].revents) drain_wake(); /* a byte whose flag sigint_spent cleared */
  }
  return false;
}

/* ------------------------------------------------------------------------
 * Reading lines: libedit on a terminal, else blocks of fd 0 cut at the
 * newlines (not stdio, whose buffer poll cannot see).
 * ---------------------------------------------------------------------- */

typedef struct line_in {
  EditLine *el;    /* NULL: stdin is not a terminal              */
  History *hist;   /* the lines typed so far, for the arrow keys  */
  FILE *echo;      /* where libedit draws the prompt and the line */
  char *line;      /* the line read, NUL-terminated               */
  size_t cap;      /* bytes allocated at line                     */
  char *buf;       /* not a terminal: bytes read past the line    */
  size_t n_buf;    /* bytes at buf                                */
  size_t cap_buf;  /* bytes allocated at buf                      */
  bool eof;        /* fd 0 has no more                            */
} line_in;

enum { LINE_EOF = -1, LINE_INTERRUPTED = -2 };

static bool grow(char **p, size_t *cap, size_t need) {
  if (need <= *cap) return true;
  char *q = realloc(*p, need * 2);
  if (!q) return false;
  *p = q;
  *cap = need * 2;
  return true;
}

static char *prompt_text(EditLine *el) {
  static char prompt[] = "> ";
  (void)el;
  return prompt;
}

static void line_in_close(line_in *in) {
  if (in->el) el_end(in->el);
  if (in->hist) history_end(in->hist);
  free(in->line);
  free(in->buf);
  memset(in, 0, sizeof *in);
}

/* libedit decodes keys in the locale's charset; the model reads UTF-8,
 * so a C or POSIX locale falls back to C.UTF-8. */
static void utf8_ctype(void) {
  if (!setlocale(LC_CTYPE, "") || strcmp(nl_langinfo(CODESET), "UTF-8"))
    setlocale(LC_CTYPE, "C.UTF-8");
}

/* libedit's read of one character (EL_GETCFN), so that Ctrl-C reaches
 * it through wait_input: 1 with *wc, 0 at end of input, -1 for Ctrl-C.
 * Decodes the locale's multibyte characters as libedit's own read does;
 * a byte that cannot start one is dropped. */
static int read_key(EditLine *el, wchar_t *wc) {
  char b;
  mbstate_t st;
  (void)el;
  memset(&st, 0, sizeof st);
  for (;;) {
    if (!wait_input()) return -1;
    ssize_t got = read(STDIN_FILENO, &b, 1);
    if (got <= 0) return got == 0 ? 0 : -1;
    size_t r = mbrtowc(wc, &b, 1, &st);
    if (r == (size_t)-2) continue; /* more bytes to come */
    if (r != (size_t)-1) return 1;
    memset(&st, 0, sizeof st);
  }
}

static bool line_in_open(line_in *in) {
  HistEvent ev;
  memset(in, 0, sizeof *in);
  if (!isatty(STDIN_FILENO)) return true;
  utf8_ctype();
  /* the echo goes where the user looks, also when the replies go to a file */
  in->echo = isatty(STDOUT_FILENO) ? stdout : stderr;
  in->el = el_init("ringlm", stdin, in->echo, stderr);
  in->hist = history_init();
  if (!in->el || !in->hist) {
    line_in_close(in);
    return false;
  }
  history(in->hist, &ev, H_SETSIZE, 1000);
  el_set(in->el, EL_EDITOR, "emacs");
  el_set(in->el, EL_PROMPT, prompt_text);
  el_set(in->el, EL_HIST, history, in->hist);
  el_set(in->el, EL_GETCFN, read_key);
  el_source(in->el, NULL); /* ~/.editrc, as in other libedit programs */
  return true;
}

/* libedit's line (its buffer) into in->line, where it can be trimmed. */
static ssize_t edit_line(line_in *in) {
  int count = 0;
  const char *s = el_gets(in->el, &count);
  size_t n = s && count > 0 ? strlen(s) : 0;
  if (!n || !grow(&in->line, &in->cap, n + 1)) return -1;
  memcpy(in->line, s, n + 1);
  return (ssize_t)n;
}

/* The next line of fd 0, its newline included, into in->line; the bytes
 * read past it wait in in->buf. -1 at the end of input or for Ctrl-C. */
static ssize_t pipe_line(line_in *in) {
  char *nl = NULL;
  while (!(in->n_buf && (nl = memchr(in->buf, '\n', in->n_buf))) && !in->eof) {
    if (!wait_input() || !grow(&in->buf, &in->cap_buf, in->n_buf + 4096)) return -1;
    ssize_t got = read(STDIN_FILENO, in->buf + in->n_buf, 4096);
    if (got > 0) in->n_buf += (size_t)got;
    else if (got == 0 || errno != EINTR) in->eof = true;
  }
  size_t n = nl ? (size_t)(nl - in->buf) + 1 : in->n_buf;
  if (!n || !grow(&in->line, &in->cap, n + 1)) return -1;
  memcpy(in->line, in->buf, n);
  in->line[n] = 0;
  memmove(in->buf, in->buf + n, in->n_buf - n);
  in->n_buf -= n;
  return (ssize_t)n;
}

/* The next line in in->line without its line ending: its length, or
 * LINE_EOF, or LINE_INTERRUPTED when Ctrl-C ended the wait. */
static ssize_t line_in_read(line_in *in) {
  ssize_t n = in->el ? edit_line(in) : pipe_line(in);
  if (n < 0 && in->el) fputc('\n', in->echo); /* Ctrl-D or Ctrl-C left us on the prompt's line */
  if (n < 0) return g_sigint ? LINE_INTERRUPTED : LINE_EOF;
  while (n > 0 && (in->line[n - 1] == '\n' || in->line[n - 1] == '\r')) in->line[--n] = 0;
  HistEvent ev;
  if (in->hist && n > 0) history(in->hist, &ev, H_ENTER, in->line);
  return n;
}

/* ------------------------------------------------------------------------
 * The conversation.
 * ---------------------------------------------------------------------- */

typedef struct chat {
  model_ctx c;
  rlm_chat_template *tpl;
  cli_conv conv; /* the messages and what the session holds of them */
} chat;

/* A user message and its reply; a line that is not UTF-8 is refused
 * before it joins the conversation. */
static int user_turn(chat *ch, const model_opts *o, const char *line, size_t len) {
  if (!cli_utf8_valid(line, len)) {
    fputs("ringlm chat: that line is not valid UTF-8; type it again\n", stderr);
    return CLI_OK;
  }
  int rc = cli_conv_turn(&ch->conv, o, line);
  sigint_spent();
  return rc;
}

/* Whether line is the command name, trailing blanks allowed. */
static bool is_command(const char *line, const char *name) {
  size_t n = strlen(name);
  return !strncmp(line, name, n) && !line[n + strspn(line + n, " \t")];
}

/* A line starting with '/'; *end for /exit and /quit. */
static int command(chat *ch, const model_opts *o, const char *line, bool *end) {
  if (is_command(line, "/exit") || is_command(line, "/quit")) {
    *end = true;
    return CLI_OK;
  }
  if (is_command(line, "/clear")) return cli_conv_clear(&ch->conv, o);
  fprintf(stderr, "ringlm chat: '%.*s' is not a command; the commands are /clear (forget the "
          "conversation), /exit and /quit\n", (int)strcspn(line, " \t"), line);
  return CLI_OK;
}

static int converse(chat *ch, const model_opts *o) {
  struct sigaction old;
  line_in in;
  int rc = CLI_OK;
  bool end = false;
  if (!catch_sigint(&old))
    return cli_fail(&(rlm_error){RLM_ERR_IO, "cannot make the pipe that Ctrl-C wakes"});
  if (!line_in_open(&in)) {
    rc = cli_fail(&(rlm_error){RLM_ERR_IO, "cannot start line editing on the terminal"});
    goto out_release_sigint;
  }
  if (in.el) fputs("type /clear to forget, /exit or Ctrl-D to end, Ctrl-C stops a reply\n", stderr);
  while (!rc && !end) {
    ssize_t n = line_in_read(&in);
    if (n == LINE_INTERRUPTED) rc = CHAT_INTERRUPTED;
    else if (n <= 0) end = true;
    else if (in.line[0] == '/') rc = command(ch, o, in.line, &end);
    else rc = user_turn(ch, o, in.line, (size_t)n);
  }
  line_in_close(&in);
out_release_sigint:
  release_sigint(&old);
  return rc;
}

int cmd_chat(int argc, char **argv) {
  model_opts o = mcli_defaults();
  o.n_gen = 512;
  int rc = mcli_parse(argc, argv, &o, "chat", chat_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (o.ids_arg || o.prompt || o.print_ids)
    return cli_usage_error("chat", "reads its messages from stdin "
                                   "(no --ids, --prompt or --print-ids)");
  if (o.system && !cli_utf8_valid(o.system, strlen(o.system)))
    return cli_usage_error("chat", "--system is not valid UTF-8");
  chat ch = {0};
  if ((rc = cli_chat_load_template(&o, &ch.tpl))) return rc; /* before the model: fail fast */
  if ((rc = mcli_open(&o, &ch.c, true))) goto out_free_template;
  o.no_stats = true; /* a conversation, not a benchmark */
  o.interrupt = &g_sigint;
  if (!(rc = cli_conv_init(&ch.conv, &ch.c, &o, ch.tpl))) rc = converse(&ch, &o);
  cli_conv_free(&ch.conv);
  mcli_close(&ch.c);
out_free_template:
  rlm_chat_template_free(ch.tpl);
  return rc;
}
