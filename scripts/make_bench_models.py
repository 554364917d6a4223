#!/usr/bin/env python3
"""Random-weight benchmark models with the shapes of real ones, written
twice with the same weights: a Hugging Face folder (bf16 safetensors, for
ringlm, which `ringlm quantize` turns into MLX 4-bit) and a GGUF file (for
llama.cpp; F16, which llama.cpp's `llama-quantize` turns into Q4_0/Q8_0),
so both engines run the same function. GGUF and safetensors are written
here by our own small writers (numpy only, for the weights: Debian's
python3-numpy, so /usr/bin/python3; the vocabulary needs only the
standard library).

    python3 scripts/make_bench_models.py OUT_DIR [gemma3-1b llama3.2-1b qwen3-0.6b]
        [--tokenizer DIR] [--no-gguf] [--parallel [N]]

Writes OUT_DIR/<name>/ (config.json, generation_config.json,
model.safetensors) and OUT_DIR/<name>-f16.gguf. RoPE scaling is left out
of both (it does not change the work). A llama GGUF's q/k rows are
interleaved per head as convert_hf_to_gguf.py interleaves them (the same
function for llama.cpp; ringlm's GGUF loader puts them back). Weights are
N(0, 0.02) from a fixed
seed, so every run writes the same bytes (--parallel N: each matrix from
its own seed, drawn by N processes, other bytes but again the same every
run); norms are 1 (for Gemma, whose
norms scale by 1 + w, the stored w is 0 and GGUF holds 1 + w, as
llama.cpp's converter writes it).

Without --tokenizer there is no vocabulary: llama.cpp gets tokenizer model
"none" with <arch>.vocab_size (llama-bench and llama-batched-bench draw
random ids; llama-server aborts on its first request), ringlm's bench
draws its own (`ringlm serve` refuses the folder).

--tokenizer DIR (a Hugging Face tokenizer folder: tokenizer.json and
tokenizer_config.json, e.g. tests/fixtures/tokenizers/gemma3 for
gemma3-1b) gives each named model a real vocabulary; the weights stay
byte for byte as without it, only metadata is added:
  - the folder gets copies of tokenizer.json and tokenizer_config.json
    (and special_tokens_map.json, chat_template.jinja where DIR has them).
    `ringlm quantize` copies such side files into its output, so the
    -4bit folder quantized from this one has them too.
  - the GGUF gets the vocabulary the way llama.cpp's convert_hf_to_gguf.py
    writes a Gemma 3 one (Gemma3Model.set_vocab, its SentencePiece path:
    _create_vocab_sentencepiece, then gguf.SpecialVocab):
    tokenizer.ggml.model "llama", pre "default", tokens, scores,
    token_type, the bos/eos/unk/pad ids (tokenizer_config.json, then
    config.json), add_bos/add_eos, add_space_prefix false and
    tokenizer.chat_template. Only SentencePiece-style tokenizer.json files
    (BPE with byte_fallback, as Gemma's) are taken. convert reads the
    scores from tokenizer.model, which tokenizer.json does not carry; the
    stand-in is score = -id for the base pieces (a SentencePiece BPE model
    lists its pieces in merge order, so merge priorities keep that order)
    and convert's -1000 for the added tokens. Ids past the model's
    vocab_size are left out, as convert leaves them out (Gemma 3's
    <image_soft_token>, 262144).
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

SHAPES = {
    "gemma3-1b": dict(arch="gemma3_text", gguf="gemma3", hidden=1152, inter=6912, layers=26, heads=4, kv=1,
                      head_dim=256, vocab=262144, window=512, theta=1e6, theta_local=1e4, qk_norm=True),
    "llama3.2-1b": dict(arch="llama", gguf="llama", hidden=2048, inter=8192, layers=16, heads=32, kv=8,
                        head_dim=64, vocab=128256, window=0, theta=5e5, qk_norm=False),
    "qwen3-0.6b": dict(arch="qwen3", gguf="qwen3", hidden=1024, inter=3072, layers=28, heads=16, kv=8,
                       head_dim=128, vocab=151936, window=0, theta=1e6, qk_norm=True),
    # The GPU's bench shape (issue 17), as the anchor's Llama 3.1 8B.
    "llama3.1-8b": dict(arch="llama", gguf="llama", hidden=4096, inter=14336, layers=32, heads=32, kv=8,
                        head_dim=128, vocab=128256, window=0, theta=5e5, qk_norm=False),
    # Tiny ones for the GGUF model tests (tests/fixtures/gguf: scripts/make_gguf_fixtures.sh):
    # rows of 256 so that llama-quantize's K-quants apply; gemma's pattern
    # key makes layer 0 slide and layer 1 attend fully.
    "tiny-llama": dict(arch="llama", gguf="llama", hidden=256, inter=256, layers=1, heads=4, kv=2,
                       head_dim=64, vocab=256, window=0, theta=5e5, qk_norm=False),
    "tiny-qwen3": dict(arch="qwen3", gguf="qwen3", hidden=256, inter=256, layers=1, heads=2, kv=1,
                       head_dim=128, vocab=256, window=0, theta=1e6, qk_norm=True),
    "tiny-gemma3": dict(arch="gemma3_text", gguf="gemma3", hidden=256, inter=256, layers=2, heads=2, kv=1,
                        head_dim=128, vocab=256, window=4, theta=1e6, theta_local=1e4, qk_norm=True, pattern=2),
}
DEFAULT = ["gemma3-1b", "llama3.2-1b", "qwen3-0.6b"]  # the CPU's; name llama3.1-8b to get it


def to_bf16(x):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


SEED = 1234


def layout(s):
    """(hf_name, gguf_name, shape) of every tensor, in the file's order;
    2-D shapes are matrices of N(0, 0.02), 1-D ones norms."""
    H, I, D, V = s["hidden"], s["inter"], s["head_dim"], s["vocab"]
    gemma = s["arch"] == "gemma3_text"
    out = [("model.embed_tokens.weight", "token_embd.weight", (V, H))]
    for i in range(s["layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [(p + "input_layernorm.weight", g + "attn_norm.weight", (H,)),
                (p + "self_attn.q_proj.weight", g + "attn_q.weight", (s["heads"] * D, H)),
                (p + "self_attn.k_proj.weight", g + "attn_k.weight", (s["kv"] * D, H)),
                (p + "self_attn.v_proj.weight", g + "attn_v.weight", (s["kv"] * D, H)),
                (p + "self_attn.o_proj.weight", g + "attn_output.weight", (H, s["heads"] * D))]
        if s["qk_norm"]:
            out += [(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", (D,)),
                    (p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", (D,))]
        if gemma:
            out += [(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight", (H,)),
                    (p + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", (H,)),
                    (p + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", (H,))]
        else:
            out += [(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (H,))]
        out += [(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (I, H)),
                (p + "mlp.up_proj.weight", g + "ffn_up.weight", (I, H)),
                (p + "mlp.down_proj.weight", g + "ffn_down.weight", (H, I))]
    out.append(("model.norm.weight", "output_norm.weight", (H,)))
    return out


def norm_weight(s, n):
    """A norm's stored weight: 1, or Gemma's w = 0 (it scales by 1 + w)."""
    gemma = s["arch"] == "gemma3_text"
    return to_bf16(np.zeros(n, np.float32) if gemma else np.ones(n, np.float32))


def tensors(s, seed=SEED):
    """(hf_name, gguf_name, bf16 array) in layout's order, every matrix
    drawn in turn from one generator (the default: the same bytes as
    every earlier run)."""
    rng = np.random.default_rng(seed)
    return [(h, g, to_bf16(rng.standard_normal(shape, dtype=np.float32) * 0.02) if len(shape) == 2
             else norm_weight(s, shape[0])) for h, g, shape in layout(s)]


def fill_matrix(task):
    """One matrix of a --parallel model, written in place: its own
    generator (SEED, spawn key = its index), rows drawn in chunks of about
    16 M values so a worker holds little."""
    path, offset, rows, cols, key = task
    rng = np.random.default_rng(np.random.SeedSequence(SEED, spawn_key=(key,)))
    m = np.memmap(path, dtype=np.uint16, mode="r+", offset=offset, shape=(rows, cols))
    step = max(1, (1 << 24) // cols)
    for r in range(0, rows, step):
        e = min(rows, r + step)
        m[r:e] = to_bf16(rng.standard_normal((e - r, cols), dtype=np.float32) * 0.02)
    m.flush()
    del m


def write_parallel(path, s, jobs):
    """--parallel: model.safetensors written straight to disk, each matrix
    from its own seed by `jobs` processes (the bytes do not depend on
    jobs, but differ from the default's single stream: same shapes, same
    distribution). Returns (hf_name, gguf_name, read-only view) as
    tensors() does, for the GGUF writer."""
    import multiprocessing
    spec = layout(s)
    head, offs, end = safetensors_head([(name, shape) for name, _, shape in spec])
    base = len(head)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(base + end)
    tasks = []
    for i, ((_, _, shape), o) in enumerate(zip(spec, offs)):
        if len(shape) == 2:
            tasks.append((path, base + o, shape[0], shape[1], i))
        else:
            m = np.memmap(path, dtype=np.uint16, mode="r+", offset=base + o, shape=shape)
            m[:] = norm_weight(s, shape[0])
            m.flush()
            del m
    tasks.sort(key=lambda t: -t[2] * t[3])  # the largest first, so the pool ends together
    with multiprocessing.Pool(jobs) as pool:
        for _ in pool.imap_unordered(fill_matrix, tasks):
            pass
    return [(hn, gn, np.memmap(path, dtype=np.uint16, mode="r", offset=base + o, shape=shape))
            for (hn, gn, shape), o in zip(spec, offs)]


def hf_config(s):
    c = {"architectures": [], "model_type": s["arch"], "vocab_size": s["vocab"], "hidden_size": s["hidden"],
         "intermediate_size": s["inter"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
         "num_key_value_heads": s["kv"], "head_dim": s["head_dim"], "rms_norm_eps": 1e-6,
         "rope_theta": s["theta"], "tie_word_embeddings": True, "max_position_embeddings": 32768,
         "torch_dtype": "bfloat16", "bos_token_id": 2, "eos_token_id": 1}
    if s["arch"] == "gemma3_text":
        c.update(sliding_window=s["window"], rope_local_base_freq=s["theta_local"],
                 query_pre_attn_scalar=s["head_dim"], hidden_activation="gelu_pytorch_tanh")
        period = s.get("pattern", 6)
        c["layer_types"] = ["sliding_attention" if i % period < period - 1 else "full_attention"
                            for i in range(s["layers"])]
    return c


def safetensors_head(entries):
    """The header of a safetensors file of bf16 tensors (name, shape), in
    order: (its bytes, each tensor's offset past it, the data's length)."""
    header, off, offs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, shape in entries:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        offs.append(off)
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h, offs, off


def write_safetensors(path, items):
    head, _, _ = safetensors_head([(name, arr.shape) for name, arr in items])
    with open(path, "wb") as f:
        f.write(head)
        for _, arr in items:
            f.write(np.ascontiguousarray(arr).tobytes())


# ---- GGUF (version 3): header, key/values, tensor infos, aligned data ----
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32


class Array:
    """A GGUF array value: elements of one GGUF type (string, i32 or f32)."""

    def __init__(self, typ, items):
        self.typ, self.items = typ, list(items)

    def pack(self):
        head = struct.pack("<IQ", self.typ, len(self.items))
        if self.typ == GGUF_STRING:
            return head + b"".join(gguf_str(x) for x in self.items)
        return head + struct.pack(f"<{len(self.items)}{'i' if self.typ == GGUF_I32 else 'f'}", *self.items)


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, value):
    if isinstance(value, Array):
        return gguf_str(key) + struct.pack("<I", GGUF_ARRAY) + value.pack()
    if isinstance(value, str):
        return gguf_str(key) + struct.pack("<I", GGUF_STRING) + gguf_str(value)
    if isinstance(value, bool):
        return gguf_str(key) + struct.pack("<I?", GGUF_BOOL, value)
    if isinstance(value, float):
        return gguf_str(key) + struct.pack("<If", GGUF_F32, value)
    return gguf_str(key) + struct.pack("<II", GGUF_U32, value)


# ---- the vocabulary, as convert_hf_to_gguf.py writes a SentencePiece one ----
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_USER_DEFINED, TOK_UNUSED, TOK_BYTE = 1, 2, 3, 4, 5, 6
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # required
TOKENIZER_EXTRA = ("special_tokens_map.json", "chat_template.jinja")  # copied where present
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # gguf.SpecialVocab's
SPECIAL_KEY = {"unk": "unknown", "sep": "seperator", "pad": "padding"}  # gguf's key names (sic)


def looks_special(text):
    """convert's does_token_look_special: added tokens it makes CONTROL though not marked special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_vocab(tok_dir, n_vocab, model_config):
    """The tokenizer.* GGUF keys for a model of n_vocab rows: the tokens,
    scores and types of _create_vocab_sentencepiece, then SpecialVocab's
    ids, add_* flags and chat template (see the module docstring)."""
    tj = load_json(os.path.join(tok_dir, "tokenizer.json"))
    tc = load_json(os.path.join(tok_dir, "tokenizer_config.json"))
    model = tj.get("model", {})
    if model.get("type") != "BPE" or not model.get("byte_fallback") or "ByteLevel" in json.dumps(tj.get("pre_tokenizer")):
        sys.exit(f"{tok_dir}: not a SentencePiece-style tokenizer.json (BPE with byte_fallback, as Gemma's), "
                 "the only kind written into GGUF here")
    vocab = model["vocab"]
    if max(vocab.values()) >= n_vocab:
        sys.exit(f"{tok_dir}: {max(vocab.values()) + 1} base pieces, more than the model's {n_vocab} rows")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]  # rows the tokenizer lacks, as convert fills them
    scores = [-10000.0] * n_vocab
    types = [TOK_UNUSED] * n_vocab
    for piece, i in vocab.items():
        tokens[i] = piece
        scores[i] = -float(i)  # stand-in for tokenizer.model's score (merge order)
        types[i] = (TOK_UNKNOWN if piece == model.get("unk_token") else
                    TOK_BYTE if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece) else TOK_NORMAL)
    added = tc.get("added_tokens_decoder") or {str(a["id"]): a for a in tj.get("added_tokens", [])}
    for key, a in added.items():
        i, text = int(key), a["content"]
        if i >= n_vocab:
            print(f"  added token {i} {text!r} is past the model's {n_vocab} rows: left out, as convert does")
            continue
        if a.get("special") or looks_special(text):
            types[i] = TOK_CONTROL
        else:
            text = text.replace("\u2581", " ")  # convert pre-normalizes user-defined spaces
            types[i] = TOK_USER_DEFINED
        tokens[i], scores[i] = text, -1000.0
    kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
          "tokenizer.ggml.tokens": Array(GGUF_STRING, tokens), "tokenizer.ggml.scores": Array(GGUF_F32, scores),
          "tokenizer.ggml.token_type": Array(GGUF_I32, types)}

    # SpecialVocab: add_bos/add_eos from a TemplateProcessing post-processor,
    # then tokenizer_config.json's add_<type>_token; the ids of the tokens
    # tokenizer_config.json names (among tokenizer.json's added tokens),
    # then config.json's <type>_token_id.
    content = lambda e: e.get("content") if isinstance(e, dict) else e
    ids, add = {}, {}
    post = tj.get("post_processor") or {}
    single = post.get("single", []) if post.get("type") == "TemplateProcessing" else []
    if len(single) > 1:
        first, last = (single[k].get("SpecialToken", {}).get("id") for k in (0, -1))
        if first:
            add["bos"] = first in (content(tc.get("bos_token")), content(tc.get("cls_token")))
        if last:
            add["eos"] = last == content(tc.get("eos_token"))
    for typ in SPECIAL_TYPES:
        if isinstance(tc.get(f"add_{typ}_token"), bool):
            add[typ] = tc[f"add_{typ}_token"]
        name = content(tc.get(f"{typ}_token"))
        if isinstance(name, str):
            i = next((a["id"] for a in tj.get("added_tokens", []) if a.get("content") == name), None)
            if isinstance(i, int) and i < n_vocab:
                ids.setdefault(typ, i)
    for typ in SPECIAL_TYPES:
        i = model_config.get(f"{typ}_token_id")
        if isinstance(i, int) and 0 <= i < n_vocab:
            ids.setdefault(typ, i)
    for typ, i in ids.items():
        kv[f"tokenizer.ggml.{SPECIAL_KEY.get(typ, typ)}_token_id"] = i
    for typ, v in add.items():
        if typ in ("bos", "eos", "sep"):  # the add_* keys GGUFWriter has
            kv[f"tokenizer.ggml.add_{typ}_token"] = v

    template = tc.get("chat_template")
    jinja = os.path.join(tok_dir, "chat_template.jinja")
    if os.path.isfile(jinja):  # SpecialVocab: the config's template, else this
        with open(jinja, encoding="utf-8") as f:
            template = tc.get("chat_template", f.read())
    if isinstance(template, list):  # [{"name", "template"}], as GGUFWriter.add_chat_template
        named = {re.sub(r"[^A-Za-z0-9]", "_", t.get("name", "")): t.get("template") for t in template}
        others = [n for n, t in named.items() if n and n != "default" and t is not None]
        for n in others:
            kv[f"tokenizer.chat_template.{n}"] = named[n]
        if others:
            kv["tokenizer.chat_templates"] = Array(GGUF_STRING, others)
        template = named.get("default")
    if isinstance(template, str):
        kv["tokenizer.chat_template"] = template
    kv["tokenizer.ggml.add_space_prefix"] = False  # Gemma3Model.set_vocab
    return kv


def copy_tokenizer(tok_dir, dest):
    for name in TOKENIZER_FILES + TOKENIZER_EXTRA:
        src = os.path.join(tok_dir, name)
        if name in TOKENIZER_FILES or os.path.isfile(src):
            shutil.copyfile(src, os.path.join(dest, name))


def gguf_metadata(s, vocab_kv=None):
    a = s["gguf"]
    kv = {"general.architecture": a, "general.name": f"ringlm bench {a}", "general.alignment": ALIGN,
          f"{a}.vocab_size": s["vocab"], f"{a}.context_length": 32768, f"{a}.embedding_length": s["hidden"],
          f"{a}.block_count": s["layers"], f"{a}.feed_forward_length": s["inter"],
          f"{a}.attention.head_count": s["heads"], f"{a}.attention.head_count_kv": s["kv"],
          f"{a}.attention.key_length": s["head_dim"], f"{a}.attention.value_length": s["head_dim"],
          f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": float(s["theta"]),
          f"{a}.rope.dimension_count": s["head_dim"], "tokenizer.ggml.model": "none"}
    if s["window"]:
        kv[f"{a}.attention.sliding_window"] = s["window"]
        kv[f"{a}.rope.freq_base_swa"] = float(s["theta_local"])
    if "pattern" in s:
        kv[f"{a}.attention.sliding_window_pattern"] = s["pattern"]
    if vocab_kv:
        del kv["tokenizer.ggml.model"]
        kv.update(vocab_kv)
    return kv


def llama_permute(w, heads):
    """Rows of q/k as convert_hf_to_gguf.py writes them for a llama model:
    within each head, HF row j * half + i goes to row 2 i + j (llama.cpp's
    RoPE rotates adjacent pairs, transformers' the two halves)."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(path, s, items, vocab_kv=None):
    """items: (gguf_name, bf16 array); matrices as F16, norms as F32 (with
    Gemma's + 1). GGUF lists dims innermost first: [in, out]."""
    gemma = s["arch"] == "gemma3_text"
    prepared = []
    for name, arr in items:
        f = bf16_to_f32(arr)
        heads = {"attn_q.weight": s["heads"], "attn_k.weight": s["kv"]}.get(name.split(".", 2)[-1])
        if s["gguf"] == "llama" and heads:
            f = llama_permute(f, heads)
        if arr.ndim == 1:
            prepared.append((name, (f + 1.0 if gemma else f).astype(np.float32), GGML_F32))
        else:
            prepared.append((name, f.astype(np.float16), GGML_F16))
    kv = gguf_metadata(s, vocab_kv)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(prepared), len(kv)) + b"".join(gguf_kv(k, v) for k, v in kv.items())
    infos, off = [], 0
    for name, arr, typ in prepared:
        dims = list(reversed(arr.shape))
        infos.append(gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", typ, off))
        off += arr.nbytes
        off += (ALIGN - off % ALIGN) % ALIGN
    blob = head + b"".join(infos)
    with open(path, "wb") as f:
        f.write(blob + b"\0" * ((ALIGN - len(blob) % ALIGN) % ALIGN))
        for _, arr, _ in prepared:
            f.write(arr.tobytes())
            f.write(b"\0" * ((ALIGN - arr.nbytes % ALIGN) % ALIGN))


def main():
    ap = argparse.ArgumentParser(description="Random-weight benchmark models (see the module docstring).")
    ap.add_argument("out", nargs="?", default="build-bench", help="output folder (default: build-bench)")
    ap.add_argument("names", nargs="*", metavar="name",
                    help=f"models among {' '.join(SHAPES)} (default: {' '.join(DEFAULT)})")
    ap.add_argument("--no-gguf", action="store_true", help="write only the Hugging Face folders")
    ap.add_argument("--parallel", type=int, nargs="?", const=0, metavar="N",
                    help="each matrix from its own seed, drawn by N processes (default: every core) and "
                         "written straight to disk: for the 8B on a device machine. Other weights than "
                         "without it (same shapes and distribution), the same whatever N")
    ap.add_argument("--tokenizer", metavar="DIR", help="a tokenizer folder (tokenizer.json, "
                    "tokenizer_config.json) that gives the models a vocabulary (default: none)")
    args = ap.parse_args()
    names = args.names or DEFAULT
    for name in names:
        if name not in SHAPES:
            sys.exit(f"unknown model {name!r} (known: {' '.join(SHAPES)})")
    for f in TOKENIZER_FILES if args.tokenizer else ():
        if not os.path.isfile(os.path.join(args.tokenizer, f)):
            sys.exit(f"{args.tokenizer}: no {f}")
    vocabs = {n: read_vocab(args.tokenizer, SHAPES[n]["vocab"], hf_config(SHAPES[n])) if args.tokenizer else None
              for n in names}  # every name checked before anything is written
    for name in names:
        s, vocab_kv = SHAPES[name], vocabs[name]
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        json.dump(hf_config(s), open(os.path.join(d, "config.json"), "w"), indent=1)
        json.dump({"bos_token_id": 2, "eos_token_id": 1}, open(os.path.join(d, "generation_config.json"), "w"))
        if args.parallel is not None:
            items = write_parallel(os.path.join(d, "model.safetensors"), s, args.parallel or os.cpu_count())
        else:
            items = tensors(s)
            write_safetensors(os.path.join(d, "model.safetensors"), [(h, a) for h, _, a in items])
        if args.tokenizer:
            copy_tokenizer(args.tokenizer, d)
        if not args.no_gguf:
            write_gguf(os.path.join(args.out, f"{name}-f16.gguf"), s, [(g, a) for _, g, a in items], vocab_kv)
        n = sum(a.size for _, _, a in items)
        vocab = f", vocabulary of {args.tokenizer}" if args.tokenizer else ""
        print(f"{name}: {n / 1e9:.3f} B parameters -> {d}/, {name}-f16.gguf{vocab}", flush=True)


if __name__ == "__main__":
    main()
