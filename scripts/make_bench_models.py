#!/usr/bin/env python3
"""Random-weight benchmark models with the shapes of real ones, written
twice with the same weights: a Hugging Face folder (bf16 safetensors, for
ringlm, which `ringlm quantize` turns into MLX 4-bit) and a GGUF file (for
llama.cpp; F16, which llama.cpp's `llama-quantize` turns into Q4_0/Q8_0),
so both engines run the same function. GGUF and safetensors are written
here by our own small writers (numpy only: Debian's python3-numpy).

    python3 scripts/make_bench_models.py OUT_DIR [gemma3-1b llama3.2-1b qwen3-0.6b]

Writes OUT_DIR/<name>/ (config.json, generation_config.json,
model.safetensors) and OUT_DIR/<name>-f16.gguf. No tokenizer: llama.cpp
gets tokenizer model "none" with <arch>.vocab_size (its benchmark draws
random ids), ringlm's bench draws its own. RoPE scaling is left out of both
(it does not change the work). Weights are N(0, 0.02); norms are 1 (for
Gemma, whose norms scale by 1 + w, the stored w is 0 and GGUF holds 1 + w,
as llama.cpp's converter writes it).
"""
import json
import os
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
}


def to_bf16(x):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def tensors(s, seed=1234):
    """(hf_name, gguf_name, bf16 array) in a fixed order; gemma norms as w."""
    rng = np.random.default_rng(seed)
    H, I, D, V = s["hidden"], s["inter"], s["head_dim"], s["vocab"]
    gemma = s["arch"] == "gemma3_text"

    def w(rows, cols):
        return to_bf16(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)

    def norm(n):
        return to_bf16(np.zeros(n, np.float32) if gemma else np.ones(n, np.float32))

    out = [("model.embed_tokens.weight", "token_embd.weight", w(V, H))]
    for i in range(s["layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [(p + "input_layernorm.weight", g + "attn_norm.weight", norm(H)),
                (p + "self_attn.q_proj.weight", g + "attn_q.weight", w(s["heads"] * D, H)),
                (p + "self_attn.k_proj.weight", g + "attn_k.weight", w(s["kv"] * D, H)),
                (p + "self_attn.v_proj.weight", g + "attn_v.weight", w(s["kv"] * D, H)),
                (p + "self_attn.o_proj.weight", g + "attn_output.weight", w(H, s["heads"] * D))]
        if s["qk_norm"]:
            out += [(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", norm(D)),
                    (p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", norm(D))]
        if gemma:
            out += [(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight", norm(H)),
                    (p + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", norm(H)),
                    (p + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", norm(H))]
        else:
            out += [(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", norm(H))]
        out += [(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", w(I, H)),
                (p + "mlp.up_proj.weight", g + "ffn_up.weight", w(I, H)),
                (p + "mlp.down_proj.weight", g + "ffn_down.weight", w(H, I))]
    out.append(("model.norm.weight", "output_norm.weight", norm(H)))
    return out


def hf_config(s):
    c = {"architectures": [], "model_type": s["arch"], "vocab_size": s["vocab"], "hidden_size": s["hidden"],
         "intermediate_size": s["inter"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
         "num_key_value_heads": s["kv"], "head_dim": s["head_dim"], "rms_norm_eps": 1e-6,
         "rope_theta": s["theta"], "tie_word_embeddings": True, "max_position_embeddings": 32768,
         "torch_dtype": "bfloat16", "bos_token_id": 2, "eos_token_id": 1}
    if s["arch"] == "gemma3_text":
        c.update(sliding_window=s["window"], rope_local_base_freq=s["theta_local"], query_pre_attn_scalar=256,
                 hidden_activation="gelu_pytorch_tanh")
    return c


def write_safetensors(path, items):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, arr in items:
        n = arr.nbytes
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, arr in items:
            f.write(np.ascontiguousarray(arr).tobytes())


# ---- GGUF (version 3): header, key/values, tensor infos, aligned data ----
GGUF_U32, GGUF_F32, GGUF_STRING = 4, 6, 8
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, value):
    if isinstance(value, str):
        return gguf_str(key) + struct.pack("<I", GGUF_STRING) + gguf_str(value)
    if isinstance(value, float):
        return gguf_str(key) + struct.pack("<If", GGUF_F32, value)
    return gguf_str(key) + struct.pack("<II", GGUF_U32, value)


def gguf_metadata(s):
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
    return kv


def write_gguf(path, s, items):
    """items: (gguf_name, bf16 array); matrices as F16, norms as F32 (with
    Gemma's + 1). GGUF lists dims innermost first: [in, out]."""
    gemma = s["arch"] == "gemma3_text"
    prepared = []
    for name, arr in items:
        f = bf16_to_f32(arr)
        if arr.ndim == 1:
            prepared.append((name, (f + 1.0 if gemma else f).astype(np.float32), GGML_F32))
        else:
            prepared.append((name, f.astype(np.float16), GGML_F16))
    kv = gguf_metadata(s)
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
    out = sys.argv[1] if len(sys.argv) > 1 else "build-bench"
    names = sys.argv[2:] or list(SHAPES)
    for name in names:
        s = SHAPES[name]
        items = tensors(s)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        json.dump(hf_config(s), open(os.path.join(d, "config.json"), "w"), indent=1)
        json.dump({"bos_token_id": 2, "eos_token_id": 1}, open(os.path.join(d, "generation_config.json"), "w"))
        write_safetensors(os.path.join(d, "model.safetensors"), [(h, a) for h, _, a in items])
        write_gguf(os.path.join(out, f"{name}-f16.gguf"), s, [(g, a) for _, g, a in items])
        n = sum(a.size for _, _, a in items)
        print(f"{name}: {n / 1e9:.3f} B parameters -> {d}/, {name}-f16.gguf", flush=True)


if __name__ == "__main__":
    main()
