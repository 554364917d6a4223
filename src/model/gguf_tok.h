/* gguf_tok.h -- the tokenizer and the chat template of a GGUF file, read
 * from the tokenizer.* keys llama.cpp's converter writes (gguf_tok.c).
 * This is the model layer's side: it reads the keys with gguf.h's typed
 * getters into the neutral description of src/tokenizer/vocab.h, which
 * the tokenizer layer turns into an rlm_tokenizer.
 *
 * gguf_tok.c also defines the public rlm_tokenizer_load and
 * rlm_chat_template_load, which take a GGUF file here and send anything
 * else to the Hugging Face loaders of the layers below.
 */
#ifndef RLM_GGUF_TOK_H
#define RLM_GGUF_TOK_H

#include "model/gguf.h"

/* tokenizer.ggml.model "gpt2" or "llama" (others RLM_ERR_UNSUPPORTED,
 * naming the key and the value; no key at all, or "none":
 * RLM_ERR_NOT_FOUND).
 * Malformed or inconsistent keys are RLM_ERR_FORMAT naming the file and
 * the key. g need not outlive the tokenizer. */
rlm_status rlm__gguf_tokenizer(const rlm_gguf *g, rlm_tokenizer **out, rlm_error *err);

/* tokenizer.chat_template (RLM_ERR_NOT_FOUND when absent), rendered with
 * bos_token and eos_token set to the text of tokenizer.ggml.bos_token_id
 * and eos_token_id, as llama.cpp passes them. */
rlm_status rlm__gguf_chat_template(const rlm_gguf *g, rlm_chat_template **out, rlm_error *err);

#endif /* RLM_GGUF_TOK_H */
