#!/usr/bin/env python3
"""gguf_to_hf.py -- the reference for ringlm's GGUF model loader: a GGUF
model's weights, dequantized by scripts/gguf_ref.py (the independent
decoder), written as a Hugging Face folder of float32 safetensors next to
a config.json that describes the same model (the one the GGUF was made
from, e.g. by scripts/make_bench_models.py).

    gguf_to_hf.py FILE.gguf --config CONFIG.json -o OUT_DIR

ringlm's logits on FILE.gguf must then equal its logits on OUT_DIR (tests/
test_gguf_model.c): the same weights reached by two independent routes
(this script's decoder, name table and row order against the C loader's).

What the script undoes, as llama.cpp's convert_hf_to_gguf.py does it:
  - names: token_embd -> model.embed_tokens, blk.N.attn_q -> model.layers.N.
    self_attn.q_proj, ... (the table below, per architecture);
  - llama q/k rows: convert interleaves each head's two halves (HF row
    j*half + i went to row 2i + j); they are put back;
  - gemma3 norms: convert stores 1 + w; w is written (ringlm adds the 1
    back, in float32, as transformers does); gemma4's are stored as they
    are used;
  - gemma4: rope_freqs.weight (its partial RoPE, which config.json
    states) is dropped; names that carry no ".weight" in transformers
    (layer_scalar, router.scale, the expert stacks) lose it;
  - a tied embedding: no lm_head is written (output.weight, when present,
    becomes lm_head.weight).
Requires numpy only (Debian's python3-numpy). Exit status 0, or 1 with a
message.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_ref  # noqa: E402

LAYER = {  # GGUF name in a block -> the Hugging Face name in a layer
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm",
    # gemma4
    "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm",
    "ffn_gate_inp": "router.proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1", "post_ffw_norm_2": "post_feedforward_layernorm_2",
}
BARE = {  # gemma4: GGUF name in a block -> a Hugging Face name without ".weight"
    "layer_output_scale.weight": "layer_scalar", "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale", "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
       "per_layer_token_embd": "model.embed_tokens_per_layer",
       "per_layer_model_proj": "model.per_layer_model_projection",
       "per_layer_proj_norm": "model.per_layer_projection_norm"}


def hf_name(name, gemma):
    base = name[:-len(".weight")] if name.endswith(".weight") else name
    if base in TOP:
        return TOP[base] + ".weight"
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in BARE:
        return "model.layers.%s.%s" % (parts[1], BARE[parts[2]])
    parts = base.split(".")
    if len(parts) != 3 or parts[0] != "blk":
        raise gguf_ref.GGUFError("tensor '%s' has no Hugging Face name here" % name)
    sub = parts[2]
    if sub == "ffn_norm":  # gemma: the pre-MLP norm; llama/qwen: the post-attention one
        hf = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
    elif sub == "post_attention_norm":
        hf = "post_attention_layernorm"
    elif sub in LAYER:
        hf = LAYER[sub]
    else:
        raise gguf_ref.GGUFError("tensor '%s' has no Hugging Face name here" % name)
    return "model.layers.%s.%s.weight" % (parts[1], hf)


def unpermute(w, heads):
    """Inverse of convert's llama permute: GGUF row 2i + j -> HF row j*half + i."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_safetensors(path, items):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, arr in items:
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, arr in items:
            f.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--config", required=True, help="the config.json of the model the GGUF holds")
    ap.add_argument("-o", "--out", required=True, help="the folder to write")
    a = ap.parse_args(argv)
    with open(a.config, encoding="utf-8") as f:
        cfg = json.load(f)
    arch = cfg["model_type"]
    gemma = arch.startswith("gemma")
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg.get("num_key_value_heads", cfg["num_attention_heads"])}
    with open(a.file, "rb") as f:
        data = f.read()
    infos, data_start = gguf_ref.parse(data)
    items = []
    for t in infos:
        if t.name == "rope_freqs.weight" and arch == "gemma4_text":
            continue
        if t.name == "rope_freqs.weight":
            raise gguf_ref.GGUFError("rope_freqs.weight: llama3 rope scaling is not mapped by this script")
        with np.errstate(invalid="ignore", over="ignore"):
            w = gguf_ref.dequantize(t, gguf_ref.tensor_bytes(t, data, data_start)).astype(np.float32)
        sub = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if arch in ("llama", "mistral") and sub in heads:
            w = unpermute(w, heads[sub])
        if arch.startswith("gemma3") and w.ndim == 1 and t.name.endswith("norm.weight"):
            w = (w - np.float32(1.0)).astype(np.float32)
        items.append((hf_name(t.name, gemma), w))
    os.makedirs(a.out, exist_ok=True)
    cfg = dict(cfg)
    cfg["tie_word_embeddings"] = not any(n == "lm_head.weight" for n, _ in items)
    with open(os.path.join(a.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(a.out, "model.safetensors"), items)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (gguf_ref.GGUFError, OSError, KeyError, ValueError) as e:
        print("gguf_to_hf.py: %s" % e, file=sys.stderr)
        sys.exit(1)
