/* test_chat.c -- chat templates (src/chat/): jinja2 semantics on small
 * templates with expectations worked out by hand from jinja2's rules
 * (whitespace control with trim_blocks and lstrip_blocks, loops, scopes,
 * namespaces, slicing, filters, tests, string methods, Undefined, tojson),
 * clean one-line errors for bad templates, hostile templates and bad
 * input, every allocation failure, loading from a folder, concurrent
 * renders -- and, when the real tokenizer_config.json files of
 * scripts/fetch_tokenizers.sh are present, byte-for-byte agreement with
 * transformers on every case of tests/fixtures/chat_cases.json
 * (scripts/make_chat_fixture.py). Missing files: those cases print
 * "skipped: ..." and are not counted as passed.
 */
#include "test.h"

#include "base/base.h"

#include <jansson.h>
#include <pthread.h>
#include <sys/stat.h>

static char g_dir[256];  /* scratch folders */
static char g_src[512];  /* the source tree (fixtures) */

static const char k_user_hi[] = "[{\"role\": \"user\", \"content\": \"hi\"}]";
static const char k_three[] =
    "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U1\"},"
    " {\"role\": \"assistant\", \"content\": \"A1\"}, {\"role\": \"user\", \"content\": \"U2\"}]";

/* ------------------------------------------------------------------------
 * Helpers: render a template and compare, or expect an error.
 * ---------------------------------------------------------------------- */
static char g_got[16384];

/* The text, or "ERROR <status>: <msg>", in g_got. */
static const char *render_with(const char *src, const char *messages, const char *extra, bool gen,
                               rlm_status *rc_out) {
  rlm_error err = {0};
  rlm_chat_template *t = NULL;
  char *out = NULL;
  size_t len = 0;
  rlm_status rc = rlm_chat_template_parse(&t, src, strlen(src), &err);
  if (!rc) rc = rlm_chat_template_render(t, messages, extra, gen, &out, &len, &err);
  if (rc) snprintf(g_got, sizeof g_got, "ERROR %d: %s", rc, err.msg);
  else snprintf(g_got, sizeof g_got, "%.*s", (int)len, out);
  if (!rc && strlen(out) != len) snprintf(g_got, sizeof g_got, "bad length %zu", len);
  if (rc_out) *rc_out = rc;
  rlm_free(out);
  rlm_chat_template_free(t);
  return g_got;
}

static void expect_at(int line, const char *src, const char *messages, const char *extra, const char *want) {
  const char *got = render_with(src, messages ? messages : k_user_hi, extra, true, NULL);
  if (strcmp(got, want)) {
    char m[900];
    snprintf(m, sizeof m, "template %.160s\n       got  \"%.300s\"\n       want \"%.300s\"", src, got, want);
    t_failed(__FILE__, line, m);
  }
}
#define EXPECT(src, want) expect_at(__LINE__, src, NULL, NULL, want)
#define EXPECT_WITH(src, msgs, extra, want) expect_at(__LINE__, src, msgs, extra, want)

/* An error with this status whose message contains `part`, on one line. */
static void expect_error_at(int line, const char *src, const char *messages, rlm_status code, const char *part) {
  rlm_status rc;
  const char *got = render_with(src, messages ? messages : k_user_hi, NULL, true, &rc);
  if (rc != code || !strstr(got, part) || strchr(got, '\n')) {
    char m[900];
    snprintf(m, sizeof m, "template %.160s\n       got  \"%.300s\"\n       want %d with \"%.200s\"", src, got,
             code, part);
    t_failed(__FILE__, line, m);
  }
}
#define EXPECT_ERROR(src, code, part) expect_error_at(__LINE__, src, NULL, code, part)

/* ------------------------------------------------------------------------
 * Whitespace: trim_blocks drops the newline after a block tag, and
 * lstrip_blocks the indentation before one (never before {{ }}).
 * ---------------------------------------------------------------------- */
TEST(whitespace_trim_and_lstrip) {
  EXPECT("a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc");
  EXPECT("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", "  1\n  2\n");
  EXPECT("x {{ 'y' }}\n  {{ 'z' }}\n", "x y\n  z");               /* one trailing newline dropped */
  EXPECT("a  {% if true %}b{% endif %}", "a  b");                 /* not at a line start: kept */
  EXPECT("  {# note #}\nx", "x");                                   /* comments trim and lstrip too */
  EXPECT("a\r\n  {% if true %}\r\nb\r\n{% endif %}", "a\nb\n");   /* \r\n is \n */
  EXPECT("\t {% set x = 1 %}\n{{ x }}", "1");
}

TEST(whitespace_control_signs) {
  EXPECT("a   {{- 'b' -}}   \n\n c", "abc");
  EXPECT("a\n  {%- if true -%}\n  b  \n  {%- endif %}\nc", "abc");
  EXPECT("a\n  {%+ if true %}b{% endif %}", "a\n  b");            /* + keeps the indentation */
  EXPECT("{% if true +%}\nb{% endif %}", "\nb");                    /* +%} keeps the newline */
  EXPECT("x {#- c -#}   y", "xy");
  EXPECT("{% raw %}{{ not run }}{% endraw %}", "{{ not run }}");
  EXPECT("a\n  {%- raw -%}  {{ x }}  {%- endraw %}\nb", "a{{ x }}b");
}

/* ------------------------------------------------------------------------
 * Loops and scopes.
 * ---------------------------------------------------------------------- */
TEST(loop_variables) {
  EXPECT_WITH("{% for m in messages %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.length }}/{{ loop.revindex0 }}"
              "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}",
              k_three, NULL, "0/1/4/3F 1/2/4/2 2/3/4/1 3/4/4/0L ");
  EXPECT("{% for x in 'abc' %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') }} {% endfor %}",
         "-ab abc bc- ");
  EXPECT("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba");
  EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", "empty");
  EXPECT("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}", "2/2 4/2 ");
  EXPECT("{% for x in range(6) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
         "{{ x }}{% endfor %}",
         "023");
  EXPECT("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", "37");
  EXPECT("{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "x=1;y=2;");
  EXPECT("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", "ba"); /* insertion order */
  EXPECT("{% for i in [1, 2] %}{% for j in 'ab' %}{{ loop.index }}{{ j }}{% endfor %}{{ loop.index }};{% endfor %}",
         "1a2b1;1a2b2;");
}

TEST(scopes_and_namespace) {
  EXPECT("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", "11 11 1");
  EXPECT("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", "2");
  EXPECT("{% set ns = namespace(total=0, seen=false) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}"
         "{% endfor %}{{ ns.total }} {{ ns.seen }}",
         "6 False");
  EXPECT("{% set a, b = 'xy' %}{{ b }}{{ a }}", "yx");
  EXPECT("{% set t %}[{{ 1 + 1 }}]{% endset %}{{ t }}{{ t|length }}", "[2]3");
  EXPECT("{% macro tag(name, kind='x') %}<{{ kind }}:{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', kind='y') }}",
         "<x:a><y:b>");
  EXPECT("{% macro m() %}{{ late }}{% endmacro %}{% set late = 'seen' %}{{ m() }}", "seen");
  EXPECT("{% set ns = namespace(a=1) %}{{ ns }}", "<Namespace {'a': 1}>");
}

/* ------------------------------------------------------------------------
 * Expressions.
 * ---------------------------------------------------------------------- */
TEST(slicing_and_indexing) {
  EXPECT_WITH("{{ messages[1:]|length }} {{ messages[-1].content }} {{ messages[0]['role'] }} "
              "{% for m in messages[::-1] %}{{ m.content }}{% endfor %}",
              k_three, NULL, "3 U2 system U2A1U1S");
  EXPECT("{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[-2:] }} {{ 'abcdef'[::2] }}",
         "é él olléh lo ace");
  EXPECT("{{ [1, 2, 3, 4][1:-1] }} {{ [1, 2, 3][5:] }} {{ (1, 2, 3)[::-2] }} {{ [1, 2][-1] }}",
         "[2, 3] [] (3, 1) 2");
  EXPECT("[{{ [1][5] }}][{{ {'a': 1}.b }}][{{ 'ab'[9] }}]", "[][][]"); /* misses are undefined */
}

TEST(operators) {
  EXPECT("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }}",
         "7 3 -4 2 3.5 1024 64");
  EXPECT("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' + 'c' }} {{ [1] + [2] }} {{ 'ab' * 2 }}", "a1NoneTrue abc [1, 2] abab");
  EXPECT("{{ 1 if 2 > 1 else 0 }} {{ 'x' if false else 'y' }} [{{ 'z' if false }}]", "1 y []");
  EXPECT("{{ 1 < 2 < 3 }} {{ 3 > 2 > 4 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 0} }}",
         "True False True True True True");
  EXPECT("{{ true and 'x' }} {{ 0 or 'y' }} {{ not '' }} {{ none }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 2.0 }}",
         "x y True None 0.30000000000000004 1e+16 2.0");
  EXPECT("{{ -2 ** 2 }} {{ (messages|length) - 1 }}", "4 0");
  EXPECT_ERROR("{{ 'a' + 1 }}", RLM_ERR_INVALID, "line 1: can only concatenate str (not \"int\") to str");
  EXPECT_ERROR("{{ 1 // 0 }}", RLM_ERR_INVALID, "integer division or modulo by zero");
  EXPECT_ERROR("{{ 1 < 'a' }}", RLM_ERR_INVALID, "'<' not supported between instances of 'int' and 'str'");
}

TEST(filters) {
  EXPECT("[{{ '  a b \n'|trim }}] {{ 'xxhixx'|trim('x') }} {{ [1, 2]|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }}",
         "[a b] hi 2 5 1");
  EXPECT("{{ 'Ab'|upper }} {{ 'Ab'|lower }} {{ 'hELLO'|capitalize }} {{ 'one two-three'|title }}",
         "AB ab Hello One Two-Three");
  EXPECT("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }}",
         "d  d None");
  EXPECT("{{ [1, 'a']|join(', ') }} {{ [1, 2]|first }} {{ [1, 2]|last }} {{ 'ab'|list }} {{ 12|string ~ '!' }}",
         "1, a 1 2 ['a', 'b'] 12!");
  EXPECT("{{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int }} {{ 3.9|int }} {{ '2.5'|float }}", "43 4 0 3 2.5");
  EXPECT("{{ {'a': 1, 'b': 2}|items|list }} {{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }}",
         "[('a', 1), ('b', 2)] a+b+c bba");
  EXPECT_WITH("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('|') }} "
              "{{ messages|rejectattr('role', 'in', ['user', 'system'])|list|length }}",
              k_three, NULL, "U1|U2 1");
  EXPECT("{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a']|sort }} {{ [1, 1, 2]|unique|list }} {{ [1, 2, 3]|sum }} "
         "{{ [4, 9, 2]|max }} {{ {'b': 1, 'a': 2}|dictsort }}",
         "[1, 2, 3] ['A', 'a', 'b'] [1, 2] 6 9 [('a', 2), ('b', 1)]");
  EXPECT_ERROR("{{ 'a'|nosuch }}", RLM_ERR_FORMAT, "line 1: no filter named 'nosuch'");
  EXPECT_ERROR("\n{{ 'a'|wordwrap }}", RLM_ERR_UNSUPPORTED, "line 2: filter 'wordwrap' is not supported");
}

TEST(tests) {
  EXPECT("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1.5 is number }} "
         "{{ true is number }} {{ true is integer }} {{ 3 is integer }}",
         "False True True True True True False True");
  EXPECT("{{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ {} is mapping }} {{ [] is mapping }} "
         "{{ 'a' is sequence }} {{ 5 is sequence }}",
         "True True False True False True False");
  EXPECT("{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is boolean }} {{ false is boolean }}",
         "True False True False True");
  EXPECT("{{ 1 is not none }} {{ x is not defined }} {{ 'a' is not string }} {{ 4 is even }} {{ 9 is divisibleby 3 }}",
         "True True False True True");
  EXPECT_WITH("{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}",
              NULL, "{\"enable_thinking\": false}", "off");
  EXPECT_ERROR("{{ 1 is nosuch }}", RLM_ERR_FORMAT, "no test named 'nosuch'");
}

TEST(string_and_dict_methods) {
  EXPECT("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }}",
         "True True ['a', 'b', '', 'c'] ['a', 'b']");
  EXPECT("[{{ '  x \n'.strip() }}] [{{ '\n\nx\n'.lstrip('\n') }}] [{{ 'x\n\n'.rstrip('\n') }}] [{{ '--x-'.strip('-') }}]",
         "[x] [x\n] [x] [x]");
  EXPECT("{{ 'Straße'.upper() }} {{ 'ÀB'.lower() }} {{ 'a.b.c'.replace('.', '/') }} "
         "{{ 'x</think>y'.split('</think>')[-1] }}",
         "STRASSE àb a/b/c y");
  EXPECT("{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z') }} {{ {'a': 1}.get('z', 0) }} {{ {'a': 1, 'b': 2}.keys()|list }} "
         "{{ {'a': 1}.values()|list }} {{ {'a': 1}.items()|list }}",
         "1 None 0 ['a', 'b'] [1] [('a', 1)]");
  EXPECT("{{ {'items': 5}.items is callable }} {{ {'items': 5}['items'] }}", "True 5"); /* attribute first */
  EXPECT("{{ '{} and {name}'.format(1, name='é') }} {{ '{{x}}{0}{0}'.format(none) }} {{ 'abcb'.rfind('b') }}",
         "1 and é {x}NoneNone 3");
  EXPECT_ERROR("{{ {}.pop('a') }}", RLM_ERR_INVALID, "access to attribute 'pop' of 'dict' object is unsafe.");
}

TEST(undefined_behaviour) {
  EXPECT("[{{ nope }}] {{ nope|length }} {{ nope is defined }} {% if nope %}t{% else %}f{% endif %} "
         "{% for x in nope %}x{% endfor %}{{ nope == nope }} {{ nope|default('d') }} [{{ nope ~ '' }}]",
         "[] 0 False f True d []");
  EXPECT_WITH("{{ messages[0].missing is defined }} [{{ messages[0].missing }}] [{{ messages[5] }}]",
              NULL, NULL, "False [] []");
  EXPECT_ERROR("{{ nope.attr }}", RLM_ERR_INVALID, "line 1: 'nope' is undefined");
  EXPECT_ERROR("{{ nope() }}", RLM_ERR_INVALID, "'nope' is undefined");
  EXPECT_ERROR("{{ nope + 1 }}", RLM_ERR_INVALID, "'nope' is undefined");
  EXPECT_ERROR("{{ [1, 2].startswith('x') }}", RLM_ERR_INVALID, "'list object' has no attribute 'startswith'");
  EXPECT_ERROR("{{ {'a': 1}.b.c }}", RLM_ERR_INVALID, "'dict object' has no attribute 'b'");
  EXPECT("{{ [nope] }}", "[Undefined]");
}

TEST(tojson_python_dumps) {
  EXPECT("{{ {'a': [1, 2.0, none, true], 'é': {'k': 'ü\\n\"'}}|tojson }}",
         "{\"a\": [1, 2.0, null, true], \"é\": {\"k\": \"ü\\n\\\"\"}}");
  EXPECT("{{ {'a': {'b': []}, 'c': {}}|tojson(indent=2) }}", "{\n  \"a\": {\n    \"b\": []\n  },\n  \"c\": {}\n}");
  EXPECT("{{ 'é😀\\x01'|tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
         "\"\\u00e9\\ud83d\\ude00\\u0001\" {\"a\": 2, \"b\": 1}");
  EXPECT("{{ [1, (2, 3)]|tojson(separators=(',', ':')) }} {{ {1: 'x', none: 'y'}|tojson }} {{ 1e16|tojson }}",
         "[1,[2,3]] {\"1\": \"x\", \"null\": \"y\"} 1e+16");
  EXPECT_WITH("{{ tools|tojson }}", NULL,
              "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
              " \"parameters\": {\"z\": 1, \"a\": 2}}}]}",
              "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"z\": 1, \"a\": 2}}}]");
  EXPECT_ERROR("{{ nope|tojson }}", RLM_ERR_INVALID, "Object of type Undefined is not JSON serializable");
}

TEST(variables_passed) {
  EXPECT("{{ add_generation_prompt }} {{ tools }} {{ documents }} [{{ bos_token }}]", "True None None []");
  EXPECT_WITH("{{ bos_token }}{{ tools|length }}", NULL, "{\"bos_token\": \"<s>\", \"tools\": [1, 2]}", "<s>2");
  EXPECT_WITH("{% for m in messages %}{{ m.content[0].text if m.content is not string }}"
              "{{ m.tool_calls[0].function.arguments.city if m.tool_calls }}"
              "{% endfor %}",
              "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"T\"}]},"
              " {\"role\": \"assistant\", \"content\": \"\","
              " \"tool_calls\": [{\"function\": {\"arguments\": {\"city\": \"P\"}}}]}]",
              NULL, "TP");
}

TEST(raise_exception_message) {
  rlm_status rc;
  const char *got = render_with("{% if messages|length > 0 %}{{ raise_exception('Roles must ' ~ 'alternate') }}{% endif %}",
                                k_user_hi, NULL, true, &rc);
  CHECK_EQ(rc, RLM_ERR_INVALID);
  CHECK(!strcmp(got, "ERROR -2: Roles must alternate"));
}

/* ------------------------------------------------------------------------
 * Bad templates and bad input: clean, one-line errors.
 * ---------------------------------------------------------------------- */
TEST(syntax_errors) {
  EXPECT_ERROR("a\n{{ x ", RLM_ERR_FORMAT, "chat template line 2: unexpected end of template: '{{' is never closed");
  EXPECT_ERROR("{% if x %}", RLM_ERR_FORMAT,
               "line 1: unexpected end of template: 'if' is never closed (expected 'elif' or 'else' or 'endif')");
  EXPECT_ERROR("\n\n{% for x in y %}{{ x }}", RLM_ERR_FORMAT, "line 3: unexpected end of template: 'for' is never closed");
  EXPECT_ERROR("{% endif %}", RLM_ERR_FORMAT, "unknown or misplaced tag 'endif'");
  EXPECT_ERROR("{% for x in y %}{% endif %}", RLM_ERR_FORMAT, "unknown or misplaced tag 'endif'");
  EXPECT_ERROR("{% include 'x' %}", RLM_ERR_UNSUPPORTED, "'include' tags are not supported");
  EXPECT_ERROR("{{ 'abc }}", RLM_ERR_FORMAT, "unterminated string literal");
  EXPECT_ERROR("{# never closed", RLM_ERR_FORMAT, "missing end of comment tag");
  EXPECT_ERROR("{{ (1 }}", RLM_ERR_FORMAT, "unexpected '}'");
  EXPECT_ERROR("{{ 1 + }}", RLM_ERR_FORMAT, "unexpected 'end of print statement'");
  EXPECT_ERROR("{% break %}", RLM_ERR_FORMAT, "'break' outside of a for loop");
  EXPECT_ERROR("{% set 1 = 2 %}", RLM_ERR_FORMAT, "can't assign");
  EXPECT_ERROR("{{ x is string is string }}", RLM_ERR_FORMAT, "you cannot chain multiple tests with is");
  EXPECT_ERROR("{{ x is defined if true else 1 }}", RLM_ERR_FORMAT, "expected end of print statement, got 'true'");
  EXPECT_ERROR("{{ '\xff' }}", RLM_ERR_FORMAT, "not valid UTF-8");
}

TEST(hostile_templates) {
  EXPECT_ERROR("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               RLM_ERR_INVALID, "more than 1000000 loop iterations");
  EXPECT_ERROR("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", RLM_ERR_INVALID, "larger than 16 MiB");
  EXPECT_ERROR("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", RLM_ERR_INVALID, "macro calls nested deeper");
  EXPECT_ERROR("{% set ns = namespace(l=[]) %}{% for i in range(500) %}{% set ns.l = [ns.l] %}{% endfor %}",
               RLM_ERR_INVALID, "values nested deeper than");
  EXPECT_ERROR("{{ range(1000000) }}", RLM_ERR_INVALID, "Range too big");
  EXPECT_ERROR("{{ 'x' * 10000000000 }}", RLM_ERR_INVALID, "repetition is too large");
  EXPECT_ERROR("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}",
               RLM_ERR_INVALID, "MiB of memory");
  char deep[2048] = "", *p = deep;
  for (int i = 0; i < 100; i++) p += sprintf(p, "{%% if true %%}");
  EXPECT_ERROR(deep, RLM_ERR_FORMAT, "blocks nested deeper than 64");
  p = deep + sprintf(deep, "{{ ");
  for (int i = 0; i < 100; i++) *p++ = '(';
  *p++ = '1';
  for (int i = 0; i < 100; i++) *p++ = ')';
  sprintf(p, " }}");
  EXPECT_ERROR(deep, RLM_ERR_FORMAT, "expression nested deeper than 64 levels");
  static char chain[20000];
  p = chain + sprintf(chain, "{{ 1");
  for (int i = 0; i < 2000; i++) p += sprintf(p, " + 1");
  sprintf(p, " }}");
  EXPECT_ERROR(chain, RLM_ERR_FORMAT, "expression nested deeper than 256 levels");
  EXPECT("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "<Namespace {'me': <Namespace {...}>}>");
  /* the step limit: few loop iterations, each a lot of work */
  EXPECT_ERROR("{% set l = range(50000) | list %}{% for i in range(2000) %}{% if -1 in l %}{% endif %}{% endfor %}",
               RLM_ERR_INVALID,
               "more than 50000000 steps of work");
  /* messages JSON nested past the value depth limit */
  static char msgs[4096];
  p = msgs + sprintf(msgs, "[{\"role\": \"user\", \"content\": \"hi\", \"x\": ");
  for (int i = 0; i < 300; i++) *p++ = '[';
  for (int i = 0; i < 300; i++) *p++ = ']';
  sprintf(p, "}]");
  expect_error_at(__LINE__, "{{ messages[0].content }}", msgs, RLM_ERR_INVALID, "JSON input nested deeper than 128");
}

TEST(bad_arguments) {
  rlm_chat_template *t = NULL;
  rlm_error err = {0};
  char *out = (char *)1;
  size_t len = 1;
  CHECK_EQ(rlm_chat_template_parse(NULL, "x", 1, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_chat_template_parse(&t, NULL, 3, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_chat_template_parse(&t, "{{ messages|length }}", 21, &err), RLM_OK);
  CHECK_EQ(rlm_chat_template_render(t, "[{\"role\": ", NULL, true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK(out == NULL && len == 0);
  CHECK_STR_CONTAINS(err.msg, "messages_json: invalid JSON at line 1");
  CHECK_EQ(rlm_chat_template_render(t, "{\"role\": \"user\"}", NULL, true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "messages_json is not a JSON array");
  CHECK_EQ(rlm_chat_template_render(t, "[]", "[1]", true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "extra_json is not a JSON object");
  CHECK_EQ(rlm_chat_template_render(t, "[]", "{\"messages\": []}", true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "may not set \"messages\"");
  CHECK_EQ(rlm_chat_template_render(t, NULL, NULL, true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_chat_template_render(NULL, "[]", NULL, true, &out, &len, &err), RLM_ERR_INVALID);
  char deep[700] = "";
  for (int i = 0; i < 300; i++) strcat(deep, "[");
  for (int i = 0; i < 300; i++) strcat(deep, "]");
  CHECK_EQ(rlm_chat_template_render(t, deep, NULL, true, &out, &len, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "nested deeper than");
  CHECK_EQ(rlm_chat_template_render(t, "[1, 2]", NULL, true, &out, NULL, NULL), RLM_OK);
  CHECK(out && !strcmp(out, "2"));
  rlm_free(out);
  CHECK_EQ(rlm_chat_template_render(t, "[]", NULL, true, &out, &len, NULL), RLM_OK);
  CHECK(out && !strcmp(out, "0") && len == 1);
  rlm_free(out);
  rlm_chat_template_free(t);
  rlm_chat_template_free(NULL);
  CHECK_EQ(rlm_chat_template_parse(&t, "", 0, &err), RLM_OK); /* empty template, empty text */
  CHECK_EQ(rlm_chat_template_render(t, "[]", NULL, false, &out, &len, &err), RLM_OK);
  CHECK(out && out[0] == 0 && len == 0);
  rlm_free(out);
  rlm_chat_template_free(t);
}

/* ------------------------------------------------------------------------
 * Loading from a folder.
 * ---------------------------------------------------------------------- */
static void write_file(const char *dir, const char *name, const char *text) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  fputs(text, f);
  fclose(f);
}

static rlm_status load_render(const char *dir, char *got, size_t n, rlm_error *err) {
  rlm_chat_template *t = NULL;
  char *out = NULL;
  rlm_status rc = rlm_chat_template_load(&t, dir, err);
  if (!rc) rc = rlm_chat_template_render(t, k_user_hi, NULL, false, &out, NULL, err);
  if (!rc) snprintf(got, n, "%s", out);
  rlm_free(out);
  rlm_chat_template_free(t);
  return rc;
}

TEST(load_from_folder) {
  char dir[400], got[256];
  rlm_error err = {0};
  snprintf(dir, sizeof dir, "%s/model", g_dir);
  CHECK_EQ(mkdir(dir, 0755), 0);
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_ERR_NOT_FOUND); /* no config at all */
  CHECK_STR_CONTAINS(err.msg, "tokenizer_config.json");
  write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_CONTAINS(err.msg, "tokenizer_config.json: no chat_template");
  write_file(dir, "tokenizer_config.json",
             "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
             " \"chat_template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}[{{ pad_token }}]\"}");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_OK);
  CHECK(!strcmp(got, "<s>hi</s>[]"));
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
             " {\"name\": \"default\", \"template\": \"D\"}]}");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_OK);
  CHECK(!strcmp(got, "D"));
  write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_CONTAINS(err.msg, "no template named \"default\"");
  write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"line one\\n{% if %}\"}");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_ERR_FORMAT);
  CHECK_STR_CONTAINS(err.msg, "tokenizer_config.json: chat_template line 2: ");
  write_file(dir, "chat_template.jinja", "J{{ messages|length }}\n");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_OK); /* the .jinja file wins */
  CHECK(!strcmp(got, "J1"));
  write_file(dir, "tokenizer_config.json", "[1]");
  CHECK_EQ(load_render(dir, got, sizeof got, &err), RLM_ERR_FORMAT);
  CHECK_EQ(rlm_chat_template_load(NULL, dir, &err), RLM_ERR_INVALID);
  CHECK_EQ(load_render("/nonexistent/model", got, sizeof got, &err), RLM_ERR_NOT_FOUND);
  CHECK_STR_CONTAINS(err.msg, "/nonexistent/model: no such folder");
}

/* ------------------------------------------------------------------------
 * Every allocation failure is RLM_ERR_NOMEM and leaks nothing (ASan).
 * ---------------------------------------------------------------------- */
TEST(out_of_memory_paths) {
  static const char src[] =
      "{% set ns = namespace(n=0) %}{% macro m(x) %}<{{ x|upper }}>{% endmacro %}"
      "{% for msg in messages if msg.role != 'x' %}{% set ns.n = ns.n + 1 %}{{ m(msg.content) }}"
      "{{ msg|tojson }}{{ msg.content.split(' ')|join('+') }}{{ [msg.role, loop.index]|string }}{% endfor %}"
      "{{ ns.n }}{{ (nope.x is defined) if false else 'ok' }}";
  int failures = 0;
  for (int64_t k = 0; k < 5000; k++) {
    rlm__alloc_fail_at(k);
    rlm_chat_template *t = NULL;
    char *out = NULL;
    rlm_status rc = rlm_chat_template_parse(&t, src, sizeof src - 1, NULL);
    if (!rc) rc = rlm_chat_template_render(t, k_three, "{\"x\": [1, {\"y\": 2}]}", true, &out, NULL, NULL);
    rlm__alloc_fail_at(-1);
    rlm_free(out);
    rlm_chat_template_free(t);
    if (!rc) break;
    CHECK_EQ(rc, RLM_ERR_NOMEM);
    failures++;
  }
  CHECK(failures > 20);
}

/* ------------------------------------------------------------------------
 * One compiled template rendered on several threads at once.
 * ---------------------------------------------------------------------- */
typedef struct render_job {
  const rlm_chat_template *t;
  char text[256];
  rlm_status rc;
} render_job;

static void *render_thread(void *arg) {
  render_job *j = arg;
  for (int i = 0; i < 200 && !j->rc; i++) {
    char *out = NULL;
    j->rc = rlm_chat_template_render(j->t, k_three, NULL, true, &out, NULL, NULL);
    if (!j->rc) snprintf(j->text, sizeof j->text, "%s", out);
    rlm_free(out);
  }
  return NULL;
}

TEST(concurrent_renders) {
  static const char src[] = "{% for m in messages %}{{ m.role[0]|upper }}{{ loop.index }}{% endfor %}";
  rlm_chat_template *t = NULL;
  CHECK_EQ(rlm_chat_template_parse(&t, src, sizeof src - 1, NULL), RLM_OK);
  pthread_t th[4];
  render_job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (render_job){.t = t};
    CHECK_EQ(pthread_create(&th[i], NULL, render_thread, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ(jobs[i].rc, RLM_OK);
    CHECK(!strcmp(jobs[i].text, "S1U2A3U4"));
  }
  rlm_chat_template_free(t);
}

/* ------------------------------------------------------------------------
 * The real templates against transformers (tests/fixtures/chat_cases.json).
 * ---------------------------------------------------------------------- */
static const char *const g_models[] = {"gemma3", "qwen3", "llama3"};
static rlm_chat_template *g_real[3];
static json_t *g_cases;

/* One case: the same text byte for byte, or the same raise_exception. */
static bool check_case(const json_t *c) {
  const char *model = json_string_value(json_object_get(c, "model"));
  int m = 0;
  while (m < 3 && strcmp(model, g_models[m])) m++;
  if (m == 3 || !g_real[m]) return false;
  char *messages = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
  char *extra = json_dumps(json_object_get(c, "extra"), JSON_COMPACT);
  char *out = NULL;
  size_t len = 0;
  rlm_error err = {0};
  bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
  rlm_status rc = rlm_chat_template_render(g_real[m], messages, extra, gen, &out, &len, &err);
  bool same;
  if (json_is_true(json_object_get(c, "error"))) {
    const char *want = json_string_value(json_object_get(c, "message"));
    size_t n = strlen(err.msg), w = strlen(want);
    same = rc == RLM_ERR_INVALID && n >= w && !strcmp(err.msg + n - w, want); /* after "line N: " if any */
  } else {
    const json_t *text = json_object_get(c, "text");
    same = !rc && len == json_string_length(text) && !memcmp(out, json_string_value(text), len);
  }
  if (!same)
    fprintf(stderr, "  %s '%s' (gen=%d): rc %d %s\n  got  %.300s\n", model,
            json_string_value(json_object_get(c, "name")), json_is_true(json_object_get(c, "add_generation_prompt")), rc,
            err.msg, out ? out : "");
  free(messages); /* jansson's */
  free(extra);
  rlm_free(out);
  return same;
}

TEST(real_fixture_cases) {
  const json_t *cases = json_object_get(g_cases, "cases");
  int total = 0, good = 0;
  CHECK(json_array_size(cases) >= 80);
  for (size_t i = 0; i < json_array_size(cases); i++) {
    bool ok = check_case(json_array_get(cases, i));
    CHECK(ok);
    total++;
    good += ok;
  }
  printf("     %d of %d renders match %s\n", good, total, json_string_value(json_object_get(g_cases, "source")));
}

static void find_src(void) {
  const char *src = getenv("RINGLM_SOURCE_DIR");
  if (src) {
    snprintf(g_src, sizeof g_src, "%s", src);
    return;
  }
  snprintf(g_src, sizeof g_src, "%s", __FILE__); /* run by hand: <src>/tests/test_chat.c */
  for (int k = 0; k < 2; k++) {
    char *slash = strrchr(g_src, '/');
    if (slash) *slash = 0;
  }
}

static void run_real(void) {
  bool have = true;
  for (int m = 0; m < 3 && have; m++) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizers/%s", g_src, g_models[m]);
    rlm_error err = {0};
    have = rlm__path_exists(dir);
    if (have && rlm_chat_template_load(&g_real[m], dir, &err)) {
      fprintf(stderr, "FAIL loading %s: %s\n", dir, err.msg);
      t_fail++;
    }
  }
  char path[700];
  snprintf(path, sizeof path, "%s/tests/fixtures/chat_cases.json", g_src);
  if (!have) {
    t_skip("real_fixture_cases (tests/fixtures/tokenizers/{gemma3,qwen3,llama3} missing: "
           "run scripts/fetch_tokenizers.sh)");
  } else if (!rlm__path_exists(path) || rlm__json_load_file(path, &g_cases, NULL)) {
    t_skip("real_fixture_cases (%s missing or unreadable: it is committed)", path);
  } else {
    RUN(real_fixture_cases);
    json_decref(g_cases);
  }
  for (int m = 0; m < 3; m++) rlm_chat_template_free(g_real[m]);
}

int main(void) {
  find_src();
  t_tmpdir(g_dir, sizeof g_dir, "chat");
  RUN(whitespace_trim_and_lstrip);
  RUN(whitespace_control_signs);
  RUN(loop_variables);
  RUN(scopes_and_namespace);
  RUN(slicing_and_indexing);
  RUN(operators);
  RUN(filters);
  RUN(tests);
  RUN(string_and_dict_methods);
  RUN(undefined_behaviour);
  RUN(tojson_python_dumps);
  RUN(variables_passed);
  RUN(raise_exception_message);
  RUN(syntax_errors);
  RUN(hostile_templates);
  RUN(bad_arguments);
  RUN(load_from_folder);
  RUN(out_of_memory_paths);
  RUN(concurrent_renders);
  run_real();
  return t_finish(g_dir);
}
