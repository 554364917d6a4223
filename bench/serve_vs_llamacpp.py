#!/usr/bin/env python3
"""ringlm serve against llama.cpp's llama-server, side by side, same weights.

Both servers run the Gemma-3-1B bench shape (ringlm: MLX 4-bit g64 with an
8-bit embedding, --act-bits 8; llama.cpp: Q4_0 with a Q8_0 embedding, the
same bits per tensor), on the same threads, one at a time, alternating
rounds. Two measurements:

  * aggregate decode: C concurrent streaming /v1/completions requests
    (different prompts, max_tokens N, ignore_eos) on a server with C rows /
    slots; completion tokens of all streams over the wall time of the round.
  * warm second turn: a chat whose history is about H tokens, sent once
    (cold), then the next turn (history + reply + a new question): time to
    the first streamed token of that second turn, which a prompt cache makes
    a prefill of the new messages only.

Prints a table and writes JSON (--json). Standard library only.
    python3 bench/serve_vs_llamacpp.py --ringlm build/ringlm \
        --llama-server /tmp/llama.cpp/build/bin/llama-server \
        --model build-bench/gemma3-1b-4bit --gguf build-bench/gemma3-1b-q4_0.gguf
"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

WORDS = ("the jury said city election county court report people state house "
         "time year government number work world family school water history").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_text(i, n_words):
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n_words))


class Server:
    def __init__(self, name, argv, port):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=os.setsid)
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: {' '.join(argv)}")
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not become healthy")

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def stream(port, path, body, out, ttft=False):
    """POSTs a streaming request; appends (completion tokens, t_first, t_end)."""
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:200]}")
    n, t_first, usage = 0, None, None  # usage: the last chunk's, if any
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            usage = d["usage"]
        for ch in d.get("choices", []):
            piece = ch.get("text") or (ch.get("delta") or {}).get("content")
            if piece:
                n += 1
                if t_first is None:
                    t_first = time.time() - t0
    if usage:
        n = usage["completion_tokens"]
    out.append((n, t_first, time.time() - t0, usage))


def aggregate(port, conc, n_prompt_words, n_gen, seed):
    out, ths = [], []
    t0 = time.time()
    for i in range(conc):
        body = {"prompt": prompt_text(seed * 1000 + i, n_prompt_words), "max_tokens": n_gen,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        ths.append(threading.Thread(target=stream, args=(port, "/v1/completions", body, out)))
        ths[-1].start()
    for t in ths:
        t.join()
    wall = time.time() - t0
    if len(out) != conc:
        raise RuntimeError("a stream failed")
    return sum(o[0] for o in out) / wall


def chat(port, messages, max_tokens):
    """A non-streaming chat completion: the reply text."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": messages, "max_tokens": max_tokens, "temperature": 0}),
        {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"chat: HTTP {r.status}: {d}")
    return d["choices"][0]["message"]["content"]


def second_turn_ttft(port, history_words, seed):
    history = prompt_text(seed, history_words)
    msgs = [{"role": "user", "content": "Read this: " + history}]
    reply = chat(port, msgs, 16)
    msgs += [{"role": "assistant", "content": reply},
             {"role": "user", "content": "Now say what the city did."}]
    out = []
    stream(port, "/v1/chat/completions",
           {"messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}, out)
    return out[0][1], out[0][3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ringlm", default="build/ringlm")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER",
                                                             "/tmp/llama.cpp/build/bin/llama-server"))
    ap.add_argument("--model", default="build-bench/gemma3-1b-4bit")
    ap.add_argument("--gguf", default="build-bench/gemma3-1b-q4_0.gguf")
    ap.add_argument("--conc", default="8,32", help="concurrent streams (and rows / slots)")
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("-n", type=int, default=32, help="max_tokens of each stream")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--history-words", type=int, default=3000,
                    help="second-turn test: words of history (~1.3 tokens each); 0: skip")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    concs = [int(x) for x in a.conc.split(",") if x]
    ctx_slot = 6144  # room per slot for the history test and the streams

    def start(which, conc):
        port = free_port()
        if which == "ringlm":
            argv = [a.ringlm, "serve", "-m", a.model, "--port", str(port), "-np", str(conc),
                    "-t", str(a.t), "--act-bits", "8", "-c", str(ctx_slot)]
        else:
            argv = [a.llama_server, "-m", a.gguf, "--port", str(port), "-np", str(conc),
                    "-t", str(a.t), "-c", str(ctx_slot * conc), "--host", "127.0.0.1"]
        return Server(which, argv, port)

    res = {"aggregate": {}, "ttft": {}}
    for conc in concs:
        cell = {"ringlm": [], "llama.cpp": []}
        for rnd in range(a.rounds):
            for which in (("ringlm", "llama.cpp") if rnd % 2 == 0 else ("llama.cpp", "ringlm")):
                s = start(which, conc)
                try:
                    aggregate(s.port, min(conc, 4), a.prompt_words, 4, 99)  # warm-up
                    cell[which].append(aggregate(s.port, conc, a.prompt_words, a.n, rnd))
                finally:
                    s.stop()
                print(f"C={conc} round {rnd} {which}: {cell[which][-1]:.2f} tok/s", file=sys.stderr)
        res["aggregate"][conc] = {k: statistics.median(v) for k, v in cell.items()}
    if a.history_words:
        for which in ("ringlm", "llama.cpp"):
            s = start(which, 1)
            try:
                res["ttft"][which], usage = second_turn_ttft(s.port, a.history_words, 5)
            finally:
                s.stop()
            res.setdefault("ttft_usage", {})[which] = usage
            print(f"second-turn TTFT {which}: {res['ttft'][which]:.3f} s, usage {usage}", file=sys.stderr)
    print("| streams | ringlm tok/s | llama-server tok/s | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    for conc, v in res["aggregate"].items():
        print(f"| {conc} | {v['ringlm']:.2f} | {v['llama.cpp']:.2f} | {v['ringlm'] / v['llama.cpp']:.2f}x |")
    if res["ttft"]:
        r, l = res["ttft"]["ringlm"], res["ttft"]["llama.cpp"]
        u = res["ttft_usage"]["ringlm"] or {}
        print(f"\nwarm second turn at {u.get('prompt_tokens', '?')} prompt tokens "
              f"({a.history_words} words of history): time to first token "
              f"ringlm {r:.3f} s, llama-server {l:.3f} s (ratio {l / r:.2f}x in ringlm's favour)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
