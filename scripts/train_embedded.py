#!/usr/bin/env python3
"""Trains ringlm's embedded default model and its draft model on the corpus
of scripts/prepare_corpus.py, on an NVIDIA GPU with torch and transformers
(made with torch 2.11, transformers 5.17, tokenizers 0.23 on one H200).

    python3 scripts/prepare_corpus.py build-corpus          # here (npm)
    python3 scripts/train_embedded.py build-corpus OUT [--minutes M] [--resume DIR]

Writes to OUT:
  tokenizer/        tokenizer.json (byte-level BPE, 8192 ids, trained here),
                    tokenizer_config.json (BOS/EOS, a chat template)
  main/, draft/     the bf16 checkpoints (config.json, model.safetensors,
                    generation_config.json): Gemma 4 text models
  train_log.json    steps, tokens, held-out loss per evaluation
  reference.json    transformers' held-out perplexity of the bf16 main
                    model and of its 8-bit MLX-dequantized weights (the
                    script's own MLX formula, the tensors `ringlm quantize
                    --quantize-embeddings` quantizes), over the windows
                    `ringlm perplexity --ctx 512` scores
  tok_check.json    the tokenizer's ids for held-out text, for ringlm to match

Training stops when the held-out loss has not improved for PATIENCE
evaluations or after --minutes; the best checkpoint (by held-out loss) is
kept. --resume DIR continues from DIR/main and DIR/draft (weights only: the
optimizer restarts with a short warm-up).
"""
import argparse
import json
import math
import os
import time

import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mlx_affine_fixture import quantize as mlx_quantize  # noqa: E402

VOCAB = 8192
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]  # ids 0..4
PAD, EOS, BOS, SOT, EOT = range(5)
CTX = 512          # training and evaluation window (the ring of 128 wraps)
WINDOW = 128       # sliding window of the local layers
PATIENCE = 6
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for m in messages -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + m['content'] | trim"
    " + '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")

MAIN = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
            num_key_value_heads=2, head_dim=64, global_head_dim=64,
            layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
            num_kv_shared_layers=2)
DRAFT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64, global_head_dim=64,
             layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0)


def train_tokenizer(train_txt, out_dir):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([train_txt], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", BOS)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
           "chat_template": CHAT_TEMPLATE, "model_max_length": CTX * 8,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    json.dump(cfg, open(os.path.join(out_dir, "tokenizer_config.json"), "w"), indent=1)
    return tok


def model_config(shape):
    return transformers.Gemma4TextConfig(
        vocab_size=VOCAB, sliding_window=WINDOW, max_position_embeddings=CTX * 8,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
        use_double_wide_mlp=False, rms_norm_eps=1e-6, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
        tie_word_embeddings=True, **shape)


def windows(ids, ctx):
    """ringlm perplexity's windows: BOS + ctx-1 text tokens, full ones."""
    body = ctx - 1
    n = len(ids) // body
    return torch.tensor([[BOS] + ids[i * body:(i + 1) * body] for i in range(n)])


@torch.no_grad()
def heldout_nll(model, wins, batch=16, autocast=True):
    """Mean NLL of every position after the first, as ringlm scores it."""
    total, count = 0.0, 0
    for i in range(0, len(wins), batch):
        x = wins[i:i + batch].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1)
        nll = -lp.gather(-1, x[:, 1:, None])[..., 0]
        total += float(nll.sum())
        count += nll.numel()
    return total / count


def train(name, shape, train_ids, test_wins, minutes, out_dir, resume, log):
    torch.manual_seed(1234)
    if resume and os.path.isdir(os.path.join(resume, name)):
        model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(resume, name), dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(model_config(shape), dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    model.cuda().train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"== {name}: {n_params / 1e6:.2f} M parameters", flush=True)
    data = torch.tensor(train_ids, dtype=torch.long)
    bsz, lr_max, warm = 32, 2e-3, 100 if resume else 300
    opt = torch.optim.AdamW(model.parameters(), lr=lr_max, betas=(0.9, 0.95), weight_decay=0.1)
    t0, step, best, bad, total_steps = time.time(), 0, float("inf"), 0, None
    g = torch.Generator().manual_seed(step + 7)
    history = []
    best_state = None
    while True:
        el = time.time() - t0
        if step == 50:  # the cosine schedule spans the time budget
            total_steps = int(50 * minutes * 60 / el)
        if el > minutes * 60 or (total_steps and step >= total_steps):
            break
        frac = min(1.0, step / total_steps) if total_steps else 0.0
        lr = lr_max * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        starts = torch.randint(0, len(data) - CTX, (bsz,), generator=g)
        x = torch.stack([torch.cat([torch.tensor([BOS]), data[s:s + CTX - 1]]) for s in starts]).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 250 == 0:
            model.eval()
            h = heldout_nll(model, test_wins)
            model.train()
            history.append({"step": step, "tokens": step * bsz * CTX, "train_loss": float(loss), "heldout_nll": h,
                            "minutes": (time.time() - t0) / 60})
            print(f"   step {step} train {float(loss):.3f} heldout {h:.4f} ppl {math.exp(h):.2f}", flush=True)
            if h < best - 1e-3:
                best, bad = h, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad += 1
                if bad >= PATIENCE:
                    print("   plateau: stopping", flush=True)
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    d = os.path.join(out_dir, name)
    model.to(torch.bfloat16).save_pretrained(d)
    transformers.GenerationConfig(bos_token_id=BOS, eos_token_id=[EOS, EOT], pad_token_id=PAD).save_pretrained(d)
    log[name] = {"params": n_params, "steps": step, "batch": bsz, "ctx": CTX, "best_heldout_nll": best,
                 "history": history}
    return model


def mlx_quantize_dequantize(w, bits=8, gs=64, dtype=torch.bfloat16):
    """MLX affine quantization round trip: codes from the float32 scale and
    bias (scripts/make_mlx_affine_fixture.py, MLX's GPU-kernel formula),
    scale and bias stored in the weight's dtype (bf16), as `ringlm quantize`
    writes them and reads them back."""
    r, c = w.shape
    codes, scale, bias = mlx_quantize(w.float(), bits, gs)
    scale, bias = scale.to(dtype).float(), bias.to(dtype).float()
    x = codes.float().reshape(r, c // gs, gs) * scale[..., None] + bias[..., None]
    return x.reshape(r, c).to(w.device)


def reference(out_dir, test_wins, log):
    """transformers' held-out perplexity of the bf16 checkpoint and of its
    8-bit dequantized weights, in float32 (ringlm computes in f32 too)."""
    d = os.path.join(out_dir, "main")
    ref = {}
    for label in ("bf16", "q8_dequantized"):
        # the bf16 values, widened exactly; dequantized weights stay float32
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).float()
        # the embedding scale as the bf16 checkpoint applies it (sqrt(hidden) in bf16)
        emb = m.model.embed_tokens
        emb.embed_scale.copy_(torch.tensor(emb.scalar_embed_scale).to(torch.bfloat16).float())
        if label != "bf16":
            with torch.no_grad():
                for name, p in m.named_parameters():
                    # ringlm quantize --quantize-embeddings: 2-D .weight, no norms
                    if p.dim() == 2 and "norm" not in name and p.shape[1] % 64 == 0:
                        p.copy_(mlx_quantize_dequantize(p.cpu(), 8, 64))
        m.config._attn_implementation = "eager"
        m.cuda().eval()
        h = heldout_nll(m, test_wins, autocast=False)
        ref[label] = {"mean_nll": h, "perplexity": math.exp(h)}
        print(f"   reference {label}: ppl {math.exp(h):.4f}", flush=True)
    ref["windows"] = len(test_wins)
    ref["tokens_scored"] = int(test_wins.shape[0] * (test_wins.shape[1] - 1))
    ref["ctx"] = CTX
    ref["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    json.dump(ref, open(os.path.join(out_dir, "reference.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--draft-minutes", type=float, default=1.0)
    ap.add_argument("--resume")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tdir = os.path.join(a.resume or a.out, "tokenizer")
    if a.resume and os.path.exists(os.path.join(tdir, "tokenizer.json")):
        tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
        os.makedirs(os.path.join(a.out, "tokenizer"), exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            open(os.path.join(a.out, "tokenizer", f), "wb").write(open(os.path.join(tdir, f), "rb").read())
    else:
        tok = train_tokenizer(os.path.join(a.corpus, "train.txt"), os.path.join(a.out, "tokenizer"))
    train_text = open(os.path.join(a.corpus, "train.txt"), encoding="utf-8").read()
    test_text = open(os.path.join(a.corpus, "test.txt"), encoding="utf-8").read()
    train_ids = tok.encode(train_text, add_special_tokens=False).ids
    test_ids = tok.encode(test_text, add_special_tokens=False).ids
    print(f"tokens: train {len(train_ids)}, test {len(test_ids)}", flush=True)
    json.dump({"text": test_text[:20000], "ids": tok.encode(test_text[:20000]).ids,
               "ids_no_special": tok.encode(test_text[:20000], add_special_tokens=False).ids},
              open(os.path.join(a.out, "tok_check.json"), "w"))
    test_wins = windows(test_ids, CTX)
    log = {"corpus_tokens": {"train": len(train_ids), "test": len(test_ids)},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    train("main", MAIN, train_ids, test_wins, a.minutes, a.out, a.resume, log)
    train("draft", DRAFT, train_ids, test_wins, a.draft_minutes, a.out, a.resume, log)
    json.dump(log, open(os.path.join(a.out, "train_log.json"), "w"), indent=1)
    reference(a.out, test_wins, log)


if __name__ == "__main__":
    main()
