#!/usr/bin/env python3
"""gemma4_tok_cases.py -- the reference ids for ringlm's GGUF "gemma4"
tokenizer (tests/test_gguf_tok.c): what Hugging Face tokenizers and
transformers' AutoTokenizer make of each string with the tokenizer.json
that gemma4_gguf_stage.py staged (and llama.cpp's converter put into
tests/fixtures/gguf/gemma4_text-f32.gguf).

    gemma4_tok_cases.py STAGED_DIR OUT_JSON [STRINGS_JSON]

STRINGS_JSON: a list of strings, or a cases file whose "cases" hold
"text"s (default: tests/fixtures/gguf/gemma4_tok_cases.json, so the
committed strings are kept: lines of the README, hand-picked edge cases
and random word runs). Writes {"cases": [{"text", "ids" (no specials),
"ids_bos" (AutoTokenizer's default, with <bos>)}], versions}. Needs
tokenizers and transformers (the device machine has both).
"""
import json
import os
import sys


def main(argv):
    if len(argv) not in (3, 4):
        print("usage: gemma4_tok_cases.py STAGED_DIR OUT_JSON [STRINGS_JSON]", file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[3] if len(argv) == 4 else os.path.join(here, "..", "tests", "fixtures", "gguf",
                                                      "gemma4_tok_cases.json")
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    strings = [c["text"] for c in data["cases"]] if isinstance(data, dict) else data
    import tokenizers
    import transformers
    tk = tokenizers.Tokenizer.from_file(os.path.join(argv[1], "tokenizer.json"))
    at = transformers.AutoTokenizer.from_pretrained(argv[1])
    cases = [{"text": s, "ids": tk.encode(s, add_special_tokens=False).ids,
              "ids_bos": at.encode(s, add_special_tokens=True)} for s in strings]
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "transformers": transformers.__version__, "cases": cases},
                  f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
