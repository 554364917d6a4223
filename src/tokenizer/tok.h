/* tok.h -- internals of the tokenizer (src/tokenizer/): the loaded
 * rlm_tokenizer and what the files of this directory share.
 *
 * A Hugging Face tokenizer.json describes a pipeline; we keep only the
 * parts real Llama 3 / Qwen 2.5-3 / Gemma 3 files use, and refuse the rest
 * with RLM_ERR_UNSUPPORTED at load (never a silent approximation):
 *
 *   text --added tokens (normalized=false)--> segments
 *        --normalizer (NFC, Replace, Prepend)--> normalized text
 *        --added tokens (normalized=true)--> segments
 *        --pre-tokenizer (Split by regex/string, ByteLevel)--> words
 *        --BPE model (byte-level, or chars with byte fallback)--> ids
 *        --post-processor (TemplateProcessing)--> ids with BOS etc.
 *
 * Decoding runs each id's token through the decoder chain once, at load
 * (tok_piece.out), so detokenizing is concatenation plus the UTF-8 repair
 * rules of decode.c.
 *
 * Files: tokenizer.c (load, vocab, added tokens, config), vocab.c (the
 * same tokenizer built from a GGUF vocabulary, see vocab.h), components.c
 * (normalizer / pre-tokenizer / post-processor / decoder from JSON),
 * hash.c (the maps), encode.c (the pipeline above), bpe.c (the merge
 * loop), nfc.c (Unicode NFC), decode.c (detokenize, stream), utf8.c.
 *
 * Everything here is immutable once built; per-call scratch
 * lives in a tok_ctx on the caller's stack, so one tokenizer serves many
 * threads.
 */
#ifndef RLM_TOK_H
#define RLM_TOK_H

#include "base/base.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ------------------------------------------------------------------------
 * Maps (hash.c): open addressing, linear probing, power-of-two capacity.
 * ---------------------------------------------------------------------- */
typedef struct tok_strslot {
  const char *key; /* not owned (arena); NULL = empty slot */
  uint32_t len;
  int32_t val;
} tok_strslot;

typedef struct tok_strmap {
  tok_strslot *slots;
  uint32_t cap; /* power of two */
  uint32_t n;
} tok_strmap;

typedef struct tok_u64map {
  uint64_t *keys; /* TOK_U64_EMPTY = empty slot */
  uint64_t *vals;
  uint32_t cap;
  uint32_t n;
} tok_u64map;

#define TOK_U64_EMPTY UINT64_MAX

rlm_status rlm__tok_strmap_init(tok_strmap *m, size_t n_expected);
void rlm__tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites; key must outlive the map. */
rlm_status rlm__tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val);
int32_t rlm__tok_strmap_get(const tok_strmap *m, const char *key, size_t len); /* -1 absent */

rlm_status rlm__tok_u64map_init(tok_u64map *m, size_t n_expected);
void rlm__tok_u64map_free(tok_u64map *m);
rlm_status rlm__tok_u64map_put(tok_u64map *m, uint64_t key, uint64_t val);
bool rlm__tok_u64map_get(const tok_u64map *m, uint64_t key, uint64_t *val);

/* ------------------------------------------------------------------------
 * The loaded tokenizer.
 * ---------------------------------------------------------------------- */
enum {
  TOK_PIECE_SPECIAL = 1, /* an added token with special=true          */
  TOK_PIECE_BYTE = 2,    /* "<0xXX>" under a ByteFallback decoder      */
};

/* The largest token id accepted: the id table is dense (32 bytes an id),
 * so one hostile id would cost gigabytes. 16x the largest vocabularies in
 * use (Gemma's 262,144). */
enum { TOK_MAX_ID = (1 << 22) - 1 };

/* One id. text is what tokenizer.json spells; out is what the decoder
 * chain makes of it alone (for a byte token: the one raw byte). */
typedef struct tok_piece {
  const char *text; /* NUL-terminated, arena; NULL: no token has this id */
  const char *out;  /* arena                                              */
  uint32_t text_len;
  uint32_t out_len;
  uint8_t flags;    /* TOK_PIECE_*                                        */
} tok_piece;

typedef struct tok_added {
  const char *content; /* arena */
  uint32_t len;
  int32_t id;
  bool special;
  bool lstrip;     /* the match swallows whitespace on its left  */
  bool rstrip;     /* ... and on its right                       */
  bool normalized; /* matched in the normalized text, not the raw */
} tok_added;

/* Byte trie over added-token contents, for leftmost-longest matching
 * (what the aho-corasick automaton of tokenizers does). Node 0 is the
 * root; edges live in a map keyed (node << 8 | byte). */
typedef struct tok_trie {
  tok_u64map edges;
  int32_t *term;  /* [n_nodes]: index into added[], or -1 */
  int32_t n_nodes;
  int32_t cap_nodes;
  bool empty;     /* no token was inserted: skip matching */
  bool first[256];/* bytes some token starts with         */
} tok_trie;

typedef enum tok_norm_kind { TOK_NORM_NFC, TOK_NORM_REPLACE, TOK_NORM_PREPEND } tok_norm_kind;

/* A normalizer step, or a decoder Replace step (kind REPLACE only). */
typedef struct tok_norm {
  tok_norm_kind kind;
  const char *pat; /* REPLACE: the literal searched for (arena) */
  const char *with;/* REPLACE: its replacement; PREPEND: prefix */
  uint32_t pat_len;
  uint32_t with_len;
} tok_norm;

typedef enum tok_behavior {
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_MERGED_PREV,
  TOK_SPLIT_MERGED_NEXT,
} tok_behavior;

/* A Split pre-tokenizer: a regex (PCRE2, UTF+UCP) or a literal string. */
typedef struct tok_split {
  pcre2_code *re;  /* NULL for a literal */
  const char *lit; /* arena              */
  uint32_t lit_len;
  tok_behavior behavior;
} tok_split;

#define TOK_MAX_STEPS 16

struct rlm_tokenizer {
  char *path;                /* the tokenizer.json (or GGUF) read, for messages */
  rlm_arena arena;           /* every string below                       */
  int32_t n_vocab;           /* largest id + 1                           */
  tok_piece *pieces;         /* [n_vocab]                                */
  size_t max_out_len;        /* longest piece.out (stream scratch size)  */

  /* model: BPE */
  tok_strmap vocab;          /* model token string -> id                 */
  tok_u64map merges;         /* (left << 32 | right) -> rank << 32 | id  */
  uint32_t n_ranks;          /* merges listed (ranks are 0..n_ranks-1)    */
  int32_t unk_id;            /* -1: none                                 */
  bool byte_fallback;        /* unknown chars become <0xXX> tokens       */
  bool fuse_unk;             /* consecutive unknown chars: one unk       */
  bool ignore_merges;        /* a word in the vocab is taken whole       */
  bool whole_newlines;       /* a word of newlines in the vocab is whole  */
  int32_t byte_tok[256];     /* byte fallback: id of "<0xXX>", -1 none   */

  /* pre-tokenizer */
  bool byte_level;           /* ByteLevel: BPE symbols are bytes         */
  int32_t byte_sym[256];     /* byte-level: id of each byte's char       */
  uint16_t byte_cp[256];     /* GPT-2 byte-to-unicode: byte -> code point */
  int16_t cp_byte[324];      /* its inverse over U+0000..U+0143, -1 none  */
  tok_split splits[TOK_MAX_STEPS];
  int n_splits;

  /* normalizer */
  tok_norm norms[TOK_MAX_STEPS];
  int n_norms;

  /* added tokens */
  tok_added *added;
  int32_t n_added;
  tok_trie trie_raw;         /* normalized=false tokens                  */
  tok_trie trie_norm;        /* normalized=true tokens                   */

  /* post-processor (TemplateProcessing "single"), with add_special */
  int32_t prefix[TOK_MAX_STEPS];
  int32_t suffix[TOK_MAX_STEPS];
  int n_prefix, n_suffix;

  /* decoder */
  bool dec_byte_level;       /* reverse the GPT-2 byte-to-unicode map    */
  bool dec_byte_fallback;    /* "<0xXX>" is the raw byte                 */
  bool dec_join_space;       /* no decoder at all: tokens joined by " "  */
  tok_norm dec_replace[TOK_MAX_STEPS];
  int n_dec_replace;
  uint32_t strip_char;       /* Strip decoder: code point, with counts   */
  int strip_start, strip_stop;

  int32_t bos, eos;          /* -1: none                                 */
};

/* tokenizer.c, shared with vocab.c (which builds a tokenizer from a GGUF
 * vocabulary rather than from JSON): an empty tokenizer (no tokens, byte
 * map set, bos/eos/unk -1) whose messages name `path`; the added-token
 * tries; and, once pieces[].text/flags are filled, each piece's decoded
 * out and the byte-level initial symbols. */
rlm_status rlm__tok_create(rlm_tokenizer **out, const char *path, rlm_error *err);
rlm_status rlm__tok_trie_init(tok_trie *tr, rlm_error *err);
rlm_status rlm__tok_trie_insert(tok_trie *tr, const char *s, size_t n, int32_t idx, rlm_error *err);
rlm_status rlm__tok_finish_pieces(rlm_tokenizer *t, rlm_error *err);
/* components.c: appends an Isolated Split by regex re (NUL-terminated). */
rlm_status rlm__tok_add_regex_split(rlm_tokenizer *t, const char *re, rlm_error *err);

/* PCRE2 allocator hooks over rlm__malloc (components.c). */
pcre2_general_context *rlm__tok_pcre_context(void);

/* components.c: each parses one top-level key of tokenizer.json into t. */
rlm_status rlm__tok_parse_normalizer(rlm_tokenizer *t, const json_t *j, rlm_error *err);
rlm_status rlm__tok_parse_pre_tokenizer(rlm_tokenizer *t, const json_t *j, rlm_error *err);
rlm_status rlm__tok_parse_post_processor(rlm_tokenizer *t, const json_t *j, rlm_error *err);
rlm_status rlm__tok_parse_decoder(rlm_tokenizer *t, const json_t *j, rlm_error *err);
/* Id of a token string: added tokens first, then the model vocab; -1. */
int32_t rlm__tok_lookup(const rlm_tokenizer *t, const char *s, size_t len);

/* Every occurrence of pat replaced by with (pat_len > 0); out NULL: only
 * measures. Returns the length written. */
size_t rlm__tok_replace(const char *s, size_t n, const tok_norm *r, char *out);

/* ------------------------------------------------------------------------
 * Per-call scratch (encode.c, bpe.c), owned by the caller of rlm_tokenize.
 * ---------------------------------------------------------------------- */
typedef struct tok_span {
  size_t start, end;
} tok_span;

/* 12 bytes: a long word has one per byte, so its size is the merge loop's
 * memory traffic. */
typedef struct tok_sym {
  int32_t id;         /* -1: merged into its left neighbour */
  int32_t prev, next; /* -1 at the ends                     */
} tok_sym;

typedef struct tok_merge {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
} tok_merge;

/* Long words (bpe.c): candidate merges bucketed by rank. A bucket is a
 * vector of positions, in push order, in one arena; the per-rank arrays are
 * all zero between words. */
typedef struct tok_buckets {
  uint32_t *off;        /* [n_ranks]: where the bucket starts in pos         */
  uint32_t *len;        /* [n_ranks]: its positions; 0: empty                */
  uint32_t *cap;        /* [n_ranks]: its room                               */
  int32_t *new_id;      /* [n_ranks]: the id its pair merges into            */
  uint64_t *live;       /* [n_ranks / 64 + 1]: bit set: the bucket has entries */
  int32_t *pos;         /* the arena: every bucket, moved on when it grows   */
  size_t cap_pos;
  uint32_t n_pos;       /* arena slots used in this word                     */
  int64_t cur;          /* the rank being merged; -1 before the first        */
  bool on;              /* merging a long word: pushes go to the buckets     */
  bool fallback;        /* a push broke rank order: the heap took over       */
} tok_buckets;

typedef struct tok_ctx {
  const rlm_tokenizer *t;
  int32_t *ids;        /* output so far */
  size_t n_ids, cap_ids;
  tok_sym *syms;
  size_t cap_syms;
  tok_merge *heap;
  size_t cap_heap, n_heap;
  tok_buckets bq;      /* instead of the heap for long words */
  char *word;          /* byte-level ignore_merges: the mapped word */
  size_t cap_word;
  tok_span *spans[2];  /* pre-tokenizer: pieces before / after a Split */
  size_t cap_spans[2];
  pcre2_general_context *gc; /* PCRE2 allocations through rlm__malloc */
  pcre2_match_data *md;
  pcre2_match_context *mc;   /* the match limit, set per subject */
  rlm_error *err;
} tok_ctx;

/* Asks for huge pages for a big scratch block (a hint; encode.c). */
void rlm__tok_hint_huge(void *p, size_t bytes);
/* Grows *p to hold at least `need` elements of `size` bytes. */
rlm_status rlm__tok_reserve(void **p, size_t *cap, size_t need, size_t size, rlm_error *err);
rlm_status rlm__tok_push_id(tok_ctx *c, int32_t id);
/* BPE of one pre-tokenized word, appending its ids (bpe.c). */
rlm_status rlm__tok_bpe_word(tok_ctx *c, const char *w, size_t n);

/* ------------------------------------------------------------------------
 * UTF-8 (utf8.c) and NFC (nfc.c).
 * ---------------------------------------------------------------------- */
/* Length of the valid UTF-8 character at s[0..n), or 0 if the bytes there
 * are not one (invalid, or cut off by n). *cp receives the code point. */
size_t rlm__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
size_t rlm__utf8_encode(uint32_t cp, char *out); /* 1..4 bytes */
bool rlm__utf8_valid(const char *s, size_t n);
/* Length of the prefix of s[0..n) that is an incomplete but so far valid
 * UTF-8 sequence at the end of s: 0 if s ends on a character boundary. */
size_t rlm__utf8_incomplete_tail(const uint8_t *s, size_t n);
/* Writes s with every maximal invalid subpart replaced by U+FFFD (Rust's
 * String::from_utf8_lossy); out NULL: only measures. Returns the length. */
size_t rlm__utf8_lossy(const uint8_t *s, size_t n, char *out);

/* NFC of valid UTF-8 s[0..n) into a new heap string *out (*out_len). */
rlm_status rlm__nfc(const char *s, size_t n, char **out, size_t *out_len, rlm_error *err);

#endif /* RLM_TOK_H */
