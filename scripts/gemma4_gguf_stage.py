#!/usr/bin/env python3
"""gemma4_gguf_stage.py -- a tiny Gemma 4 fixture folder (tests/fixtures/
models/gemma4_*) made ready for llama.cpp's convert_hf_to_gguf.py, which
tests/fixtures/gguf/gemma4-* are made with (scripts/make_gguf_fixtures.sh
gemma4 says how and where).

    gemma4_gguf_stage.py FIXTURE_DIR OUT_DIR

What the converter needs that the fixture lacks, and nothing else:
  - config.json: transformers 5.17 writes a full layer's head dim and KV
    heads under "per_layer_config"; the converter reads the older
    "global_head_dim" and "num_global_key_value_heads". Both are added,
    from per_layer_config, beside the original keys.
  - a Gemma-style tokenizer (tokenizer.json: a BPE with byte fallback and
    the space -> U+2581 normalizer, as Gemma's; the converter refuses any
    other kind) with exactly the model's vocab_size tokens: the special
    tokens, U+2581, printable ASCII and merges learnt from the text given
    (this repository's README by default), plus a chat template in
    Gemma 4's turn format whose turn markers are special tokens, as
    Gemma 4's are (the converter then types them "control"). It is a toy, but HF `tokenizers` and llama.cpp
    both read it, so its ids are a reference for ringlm's GGUF tokenizer.
model.safetensors and generation_config.json are linked, not copied.
Pure Python; exit status 0, or 1 with a message.
"""
import collections
import json
import os
import sys

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
SPACE = "\u2581"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] }}<turn|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}")


def learn_merges(text, vocab, budget):
    """Greedy BPE over the words of text (each word keeps its leading
    U+2581), adding the most frequent adjacent pair until budget runs out."""
    words = collections.Counter(SPACE + w for w in text.split())
    seqs = {w: [c if c in vocab else None for c in w] for w in words}
    seqs = {w: s for w, s in seqs.items() if None not in s}
    merges = []
    while len(merges) < budget:
        pairs = collections.Counter()
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        vocab[a + b] = len(vocab)
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def tokenizer_json(n_vocab, text):
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for c in [SPACE] + [chr(b) for b in range(33, 127)]:
        vocab[c] = len(vocab)
    if len(vocab) > n_vocab:
        raise SystemExit("vocab_size %d is below the %d base tokens" % (n_vocab, len(vocab)))
    merges = learn_merges(text, vocab, n_vocab - len(vocab))
    if len(vocab) != n_vocab:
        raise SystemExit("the text gave only %d tokens for vocab_size %d" % (len(vocab), n_vocab))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    src, out = argv[1], argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    text_path = argv[3] if len(argv) == 4 else os.path.join(here, "..", "README.md")
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    plc = cfg.get("per_layer_config") or {}
    if full:
        first = plc.get(str(full[0]), {})
        cfg["global_head_dim"] = first.get("head_dim", cfg["head_dim"])
        if "num_key_value_heads" in first:
            cfg["num_global_key_value_heads"] = first["num_key_value_heads"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    with open(text_path, encoding="utf-8") as f:
        tok = tokenizer_json(cfg["vocab_size"], f.read())
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    tc = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
          "additional_special_tokens": SPECIALS[4:],
          "add_bos_token": True, "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
          "chat_template": TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=2)
    for name in ("model.safetensors", "generation_config.json"):
        dst = os.path.join(out, name)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.abspath(os.path.join(src, name)), dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
