#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer_cases.json: reference token ids from the
Hugging Face `tokenizers` library (the Rust implementation ringlm mirrors)
for the real Gemma 3 and Qwen 3 tokenizers, over a fixed list of strings.

Needs: pip install tokenizers (made with 0.23.2), and the tokenizer files
from scripts/fetch_tokenizers.sh in tests/fixtures/tokenizers/{gemma3,qwen3}/.
No network access is used. Run from anywhere:

    python3 scripts/make_tokenizer_fixture.py
    python3 scripts/make_tokenizer_fixture.py --strings-only   # just the inputs

tests/test_tokenizer.c compares ringlm's ids with these, case by case, and
checks that decoding gives the text back. The strings are built
deterministically below (no randomness): prose, code, scripts of many
languages, emoji sequences, whitespace runs, numbers, contractions, special
tokens written literally, control characters and edge cases.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer_cases.json")
MODELS = ["gemma3", "qwen3"]

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "In 1969, Apollo 11 landed on the Moon -- a giant leap for mankind.",
    "Mr. O'Neil's dog (a 3-year-old beagle) barked at 7:45 a.m.",
    "E-mail me at someone@example.com or visit https://example.org/path?q=1&x=y#frag.",
    "She said: \"Don't worry,\" and left... Really?!",
    "naïve café résumé coöperate façade jalapeño Ångström Zürich",
    "ŁÓDŹ, Kraków, Dvořák, Øresund, Þingvellir, straße, ĳ, ŉ",
]

CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "class A:\n    def __init__(self):\n        self.x = {'a': [1, 2, 3]}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "if x:\n\tif y:\n\t\treturn z\n\telse:\n\t\tpass\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"a\"><span>text</span></div>",
    "const add = (a, b) => a + b; // arrow\n/* block */",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "    \n        \n\t\t\n",
    "fn main() -> Result<(), Box<dyn Error>> {\n    Ok(())\n}",
    "$ ls -la | grep '^d' && echo \"done\" >> log.txt",
]

SCRIPTS = [
    "你好，世界！今天天气很好。",
    "日本語のテキストです。カタカナとひらがな、漢字。",
    "한국어 문장입니다. 안녕하세요!",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם, מה שלומך?",
    "Привет, мир! Как дела?",
    "Γειά σου κόσμε! αβγδε ΑΒΓΔΕ",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก",
    "Tiếng Việt có nhiều dấu: ường, ưỡng, ệ",
    "ሰላም ለዓለም",
    "Ողջույն աշխարհ",
    "mixed 中文 and English and العربية and עברית",
]

EMOJI = [
    "😀",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "👩🏿‍💻 coding",
    "🇫🇷🇯🇵🇺🇸",
    "1️⃣ 2️⃣ #️⃣",
    "❤️ ♥ ☺️",
    "🏳️‍🌈 🏴‍☠️",
    "emoji😀inside👍🏽words",
    "🤦🏼‍♂️🤷‍♀️",
    "𝕳𝖊𝖑𝖑𝖔 𝟙𝟚𝟛",
    "🦄🦀🐍",
]

WHITESPACE = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "\t",
    "\t\t\t",
    " \n ",
    "\r\n",
    "a\r\nb\r\n",
    "a  b",
    "a   b    c",
    " leading space",
    "   leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "  both  ",
    "line1\nline2\n\nline4",
    "tab\tseparated\tvalues",
    "mixed \t \n whitespace \n\t ",
    " " * 40,
    "\n" * 35,
    "\t" * 33,
    "word" + " " * 17 + "word",
    "\u00a0non-breaking\u00a0space",
    "ideographic\u3000space",
    "em\u2003space and thin\u2009space",
]

NUMBERS = [
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159265358979",
    "1,000,000",
    "-273.15",
    "1e-10",
    "0x1F 0b1010 0o777",
    "2024-01-15T12:34:56Z",
    "+1 (555) 123-4567",
    "٠١٢٣٤٥٦٧٨٩",
    "①②③ ⅠⅡⅢ ¼½¾",
    "１２３ ＡＢＣ",
]

CONTRACTIONS = [
    "don't",
    "Don't",
    "DON'T",
    "I'M",
    "I'm",
    "we'll",
    "WE'LL",
    "they've",
    "it's",
    "It'S",
    "She'd",
    "you're",
    "YOU'RE",
    "'s 't 're 've 'm 'll 'd",
    "rock'n'roll",
    "the '90s",
    "'quoted'",
    "it’s (curly)",
]

SPECIALS = [
    "<bos>",
    "<bos>Hello",
    "<eos>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>",
    "<pad><unk><mask>",
    "<unused0> <unused99>",
    "<start_of_image>",
    "<|im_start|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<bos",
    "< bos>",
    "<|im_start",
    "<<bos>>",
    "text<bos>text",
    "<|im_end|><|im_end|>",
]

CONTROL = [
    "\x00",
    "a\x00b",
    "\x01\x02\x03",
    "\x07 bell",
    "\x1b[31mred\x1b[0m",
    "\x7f",
    "\x85",
    "next\x85line",
    "zero\u200bwidth",
    "\ufeffBOM",
    "soft\u00adhyphen",
    "line\u2028separator\u2029para",
    "rtl \u202eoverride\u202c",
    "\ufffd replacement",
    # Oniguruma's \s (White_Space) has U+0085 and not U+FEFF; JS and PCRE2 differ.
    "x\x85\x85 y",
    "\x85\x85\n",
    "\ufeff\ufeff x",
    "a \u2028 b\u2029\u2029",
]

EDGE = [
    "▁",
    "▁▁hello",
    "hello▁world",
    "e\u0301",                   # NFC composes this
    "cafe\u0301 vs caf\u00e9",
    "A\u030a and \u212b",       # Å two ways, Angstrom sign
    "\u2126 ohm",               # Ohm sign -> Omega under NFC
    "\u1100\u1161\u11a8",       # Hangul jamo -> 각
    "\uf900",                   # CJK compatibility ideograph
    "o\u0308\u0301 stacked",
    "q\u0323\u0307",
    "'ſ and 'K",               # long s, Kelvin sign
    "ﬁ ligature",
    "x" * 120,
    "ab" * 60,
    "=" * 80,
    "-" * 64 + "\n",
    "😀" * 20,
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "A.B.C.D.",
    "...",
    "!!!???",
    "#$%&*+,-./:;<=>?@[\\]^_`{|}~",
    "\"quotes\" and 'apostrophes'",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "http://a.b/c?d=e",
]


def combos():
    """A grid of prefixes x bodies x suffixes: exercises boundaries between
    whitespace, specials and words that the single strings do not."""
    prefixes = ["", " ", "\n", "<bos>", "<|im_start|>", "  "]
    bodies = ["hello", "Hello world", "don't", "123456", "你好", "👍🏽", "\tx"]
    suffixes = ["", " ", "\n", "!", "  \n"]
    out = []
    for p in prefixes:
        for b in bodies:
            for s in suffixes:
                out.append(p + b + s)
    return out


def strings():
    seen, out = set(), []
    for s in PROSE + CODE + SCRIPTS + EMOJI + WHITESPACE + NUMBERS + CONTRACTIONS + SPECIALS + \
            CONTROL + EDGE + combos():
        if s not in seen:
            seen.add(s)
            out.append(s)
    # One longer document: all the prose and code joined.
    out.append("\n\n".join(PROSE + CODE + SCRIPTS))
    return out


def main():
    if "--strings-only" in sys.argv:
        json.dump(strings(), sys.stdout, ensure_ascii=False)
        return
    import tokenizers
    from tokenizers import Tokenizer

    toks = {}
    for m in MODELS:
        path = os.path.join(TOK_DIR, m, "tokenizer.json")
        if not os.path.exists(path):
            sys.exit("make_tokenizer_fixture: %s is missing; run scripts/fetch_tokenizers.sh" % path)
        toks[m] = Tokenizer.from_file(path)
    cases = []
    for s in strings():
        case = {"text": s}
        for m in MODELS:
            case[m] = {
                "special": toks[m].encode(s, add_special_tokens=True).ids,
                "plain": toks[m].encode(s, add_special_tokens=False).ids,
            }
        cases.append(case)
    doc = {"tokenizers_version": tokenizers.__version__, "models": MODELS, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("make_tokenizer_fixture: wrote %d cases to %s (%d bytes)" % (len(cases), OUT, os.path.getsize(OUT)))


if __name__ == "__main__":
    main()
