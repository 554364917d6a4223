#!/usr/bin/env python3
"""Writes tests/fixtures/chat_cases.json: the chat templates of the real
Gemma 3, Qwen 3 and Llama 3 tokenizer_config.json files rendered by Hugging
Face transformers (the renderer every model card assumes) over a fixed list
of conversations. tests/test_chat.c renders the same conversations with
ringlm's Jinja subset and compares the text byte for byte.

Needs transformers (made with 5.17) and the tokenizer_config.json files of
scripts/fetch_tokenizers.sh. Usage:

    python3 scripts/make_chat_fixture.py TOKENIZER_DIR OUT.json

where TOKENIZER_DIR holds {gemma3,qwen3,llama3}/tokenizer_config.json.
A case whose template raises (roles that do not alternate) is recorded with
"error": true and no text.
"""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

MODELS = ["gemma3", "qwen3", "llama3"]

SYS = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "  And of Japan?\n\n"}
A2 = {"role": "assistant", "content": "Tokyo — 東京 🗼"}
U3 = {"role": "user", "content": "Write \"hello\" in C: printf(\"%s\\n\", s);\ttab"}
THINK = {"role": "assistant", "content": "<think>\nThe user wants a city.\n</think>\n\nBerlin."}
TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Paris", "days": 2}}}]}
TOOL_RESULT = {"role": "tool", "content": "{\"temp\": 21}"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]

CONVERSATIONS = [
    ("one user turn", [U1], {}),
    ("system and user", [SYS, U1], {}),
    ("two turns", [U1, A1, U2], {}),
    ("three turns with system", [SYS, U1, A1, U2, A2, U3], {}),
    ("ends with assistant", [U1, A1], {}),
    ("unicode and escapes", [U3], {}),
    ("list content", [{"role": "user", "content": [{"type": "text", "text": " Describe this. "}]}], {}),
    ("empty user", [{"role": "user", "content": ""}], {}),
    ("assistant with think", [U1, THINK, U2], {}),
    ("last assistant with think", [U1, THINK], {}),
    ("thinking disabled", [U1], {"enable_thinking": False}),
    ("tools", [SYS, U1], {"tools": TOOLS}),
    ("tool call and result", [U1, TOOL_CALL, TOOL_RESULT], {"tools": TOOLS}),
    ("roles do not alternate", [U1, U2], {}),
    ("system only", [SYS], {}),
]


def render(template, cfg, messages, gen, extra):
    # What apply_chat_template passes: the messages, the flag, the special
    # tokens of the tokenizer config, and the caller's extra variables.
    compiled = _compile_jinja_template(template)
    kw = dict(extra)
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        tok = cfg.get(key)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok is not None:
            kw[key] = tok
    return compiled.render(messages=messages, add_generation_prompt=gen, **kw)


def main():
    tok_dir, out = sys.argv[1], sys.argv[2]
    cases = []
    for model in MODELS:
        with open(f"{tok_dir}/{model}/tokenizer_config.json", encoding="utf-8") as f:
            cfg = json.load(f)
        for name, messages, extra in CONVERSATIONS:
            if "tools" in extra and model != "qwen3":
                continue  # only Qwen's template reads tools
            for gen in (True, False):
                case = {"model": model, "name": name, "add_generation_prompt": gen,
                        "messages": messages, "extra": extra}
                try:
                    case["text"] = render(cfg["chat_template"], cfg, messages, gen, extra)
                except Exception as e:  # the template's raise_exception
                    case["error"] = True
                    case["message"] = str(e)
                cases.append(case)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"source": "transformers chat template rendering", "cases": cases}, f,
                  ensure_ascii=False, indent=1)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
