/* vocab.h -- the tokenizer layer's entry points for the layers above it
 * (src/model): building an rlm_tokenizer from a vocabulary held in memory
 * as llama.cpp's GGUF files describe one, and the Hugging Face loader that
 * the public rlm_tokenizer_load falls back to.
 *
 * The description is neutral (no GGUF types): the model layer's
 * gguf_tok.c reads the tokenizer.ggml.* keys into it. Error messages name
 * those keys, since they are where every field comes from.
 *
 * Two kinds, each turned into the tokenizer.json pipeline (tok.h) that
 * Hugging Face tokenizers runs for the same model, so that ids agree:
 *
 *  RLM_TOK_VOCAB_GPT2 ("gpt2": Llama 3, Qwen 2/3): byte-level BPE. Normal
 *   tokens are in GPT-2's byte-to-unicode spelling, merges are "a b"
 *   strings in rank order. The pre-tokenizer regex (and Qwen's NFC) come
 *   from the `pre` name; control (3) and user-defined (4) tokens are the
 *   added tokens, in their raw text, matched whole before anything else.
 *
 *  RLM_TOK_VOCAB_SPM ("llama": Gemma 3, Llama 2): SentencePiece pieces
 *   with U+2581 for spaces, scores and no merges. Becomes a BPE with byte
 *   fallback (<0xXX> tokens) over characters, whose merges are every
 *   split of a piece into two pieces, ranked as transformers' converter
 *   ranks them: by the merged piece's score (highest first), then longer
 *   left part, then longer right part, then piece id. Spaces become U+2581
 *   (and one is prepended with add_space_prefix).
 *
 *  RLM_TOK_VOCAB_GEMMA4 ("gemma4": Gemma 4): the SPM pipeline (U+2581
 *   for spaces, byte fallback) with the merges listed, in rank order, as
 *   gpt2's: Gemma's tokenizer.json is a BPE whose merges are not
 *   derivable from scores. As llama.cpp reads the name, the text splits
 *   into runs of newlines and runs of the rest, and a run of newlines
 *   that is a token is taken whole. A merge splits at its first space
 *   after the first byte, as llama.cpp splits it.
 *
 * Token types are llama.cpp's (below). Unused tokens (the [PADn] filler
 * converters append up to the model's vocab size) keep their id but
 * neither encode nor decode to anything.
 */
#ifndef RLM_TOK_VOCAB_H
#define RLM_TOK_VOCAB_H

#include "base/base.h"

typedef enum rlm_tok_vocab_kind {
  RLM_TOK_VOCAB_GPT2, /* tokenizer.ggml.model "gpt2"  */
  RLM_TOK_VOCAB_SPM,  /* tokenizer.ggml.model "llama" */
  RLM_TOK_VOCAB_GEMMA4, /* tokenizer.ggml.model "gemma4" */
} rlm_tok_vocab_kind;

/* tokenizer.ggml.token_type values (persisted: the ids are the format's). */
enum {
  RLM_TOK_TYPE_UNDEFINED = 0, /* treated as normal */
  RLM_TOK_TYPE_NORMAL = 1,
  RLM_TOK_TYPE_UNKNOWN = 2,
  RLM_TOK_TYPE_CONTROL = 3,      /* an added token, special        */
  RLM_TOK_TYPE_USER_DEFINED = 4, /* an added token, not special    */
  RLM_TOK_TYPE_UNUSED = 5,
  RLM_TOK_TYPE_BYTE = 6,         /* "<0xXX>"                       */
};

typedef struct rlm_tok_str {
  const char *s; /* not NUL-terminated necessarily; copied by the build */
  size_t n;
} rlm_tok_str;

typedef struct rlm_tok_vocab {
  const char *path;           /* names the source in messages            */
  rlm_tok_vocab_kind kind;
  size_t n_tokens;            /* ids are 0..n_tokens-1                   */
  const rlm_tok_str *tokens;  /* [n_tokens]                              */
  const int32_t *types;       /* [n_tokens], RLM_TOK_TYPE_*; NULL: normal */
  const float *scores;        /* [n_tokens] (SPM); NULL: all 0           */
  size_t n_merges;
  const rlm_tok_str *merges;  /* [n_merges] "a b" (GPT2, GEMMA4), ranked */
  const char *pre;            /* GPT2 pre-tokenizer name; NULL: "default" */
  int32_t bos, eos, unk;      /* -1: none; else < n_tokens               */
  bool add_bos, add_eos;      /* what add_special adds around the text   */
  bool add_space_prefix;      /* SPM: a U+2581 before the text           */
} rlm_tok_vocab;

/* Builds a tokenizer from v (which need not outlive it). RLM_ERR_FORMAT
 * for an inconsistent description (a merge naming an unknown token, a
 * type out of range, ...), RLM_ERR_UNSUPPORTED for a pre-tokenizer name we
 * do not know; messages name v->path and the key. */
rlm_status rlm__tok_from_vocab(rlm_tokenizer **out, const rlm_tok_vocab *v, rlm_error *err);

/* The Hugging Face loader (tokenizer.c): a folder or a tokenizer.json. */
rlm_status rlm__tokenizer_load_hf(rlm_tokenizer **out, const char *path, rlm_error *err);

#endif /* RLM_TOK_VOCAB_H */
