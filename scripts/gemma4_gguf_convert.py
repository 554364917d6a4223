#!/usr/bin/env python3
"""gemma4_gguf_convert.py -- runs llama.cpp's own convert_hf_to_gguf.py on
a folder staged by gemma4_gguf_stage.py, unchanged but for one thing:
the hyperparameters it reads through transformers' AutoConfig keep the
config.json keys "global_head_dim" and "num_global_key_value_heads"
(transformers 5.17's Gemma 4 config drops them for "per_layer_config",
which this converter does not read).

    gemma4_gguf_convert.py LLAMA_CPP_DIR STAGED_DIR OUTTYPE OUTFILE

Needs what the converter needs (torch, transformers, numpy, pyyaml); run
it where those are (the device machine: scripts/make_gguf_fixtures.sh).
"""
import json
import os
import runpy
import sys


def main(argv):
    if len(argv) != 5:
        print("usage: gemma4_gguf_convert.py LLAMA_CPP_DIR STAGED_DIR OUTTYPE OUTFILE", file=sys.stderr)
        return 2
    llama, staged, outtype, outfile = argv[1:]
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    sys.path.insert(0, llama)
    from conversion import base  # llama.cpp's, from LLAMA_CPP_DIR

    loader = base.ModelBase.load_hparams

    def load_hparams(dir_model, is_mistral_format):
        h = loader(dir_model, is_mistral_format)
        with open(os.path.join(dir_model, "config.json"), encoding="utf-8") as f:
            raw = json.load(f)
        for key in ("global_head_dim", "num_global_key_value_heads"):
            if key in raw:
                h.setdefault(key, raw[key])
        return h

    base.ModelBase.load_hparams = staticmethod(load_hparams)
    sys.argv = ["convert_hf_to_gguf.py", staged, "--outtype", outtype, "--outfile", outfile]
    runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
