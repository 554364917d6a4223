/* spec.h -- the math of speculative decoding, without the engine: the
 * sampler's distribution as a dense vector, draws from such vectors, the
 * speculative sampling rule that keeps a prefix of a proposal, and n-gram
 * prompt lookup as a proposer.
 *
 * One step, as the engine runs it: a proposer suggests d_1..d_k (a draft
 * model sampling from q_0..q_{k-1}, or rlm__ngram_propose, whose proposals
 * are one-hot); the target scores the k + 1 positions in one pass, giving
 * p_0..p_k (p_j the target's distribution after d_1..d_j, from
 * rlm__sampler_probs); rlm__spec_accept keeps d_1..d_n and draws one more
 * token, so every step emits n + 1 tokens distributed exactly as the
 * target sampler's own draws would be (Leviathan et al. 2023; Chen et al.
 * 2023).
 *
 * Nothing here allocates; every [vocab] buffer is the caller's. The
 * penalties read the sampler's history: for p_j to be exact the
 * history must hold d_1..d_j when p_j is computed (the engine's job; the
 * sampler has no way to take accepted ids back). */
#ifndef RLM_SPEC_H
#define RLM_SPEC_H

#include "base/base.h"
#include "generate/sampler_internal.h"

/* The distribution rlm_sampler_sample(s, logits) draws from, as
 * probs[vocab] summing to 1 (zeros outside the kept set). Applies the
 * penalties to logits in place first, as sampling does; temp == 0
 * gives a one-hot at the same argmax, and so do logits with no weight to
 * keep (all -inf or NaN). ids and w are [vocab] scratch. Draws nothing:
 * the sampler's generator is untouched. */
void rlm__sampler_probs(rlm_sampler *s, float *logits, float *probs, int32_t *ids, float *w);

/* The inverse-CDF draw for u in [0, 1) from weights p[vocab], in id order:
 * u is scaled by their sum, so rounding in a normalisation biases nothing.
 * Ids of weight <= 0 (or NaN) are never drawn; rounding that runs past the
 * end gives the last drawable id; -1 if there is none. */
int32_t rlm__dist_draw(const float *p, int32_t vocab, double u);

/* The speculative sampling rule over s->vocab ids. p[0..k] are the target's
 * distributions (dense, normalised), q[0..k-1] the proposal's that draft[j]
 * was drawn from, or q == NULL when every proposal is one-hot at draft[j]
 * (n-gram lookup, a greedy draft). For j = 0..k-1, draft[j] is kept with
 * probability min(1, p_j(d) / q_j(d)), one uniform from s each; at the first
 * rejection *next is drawn from normalise(max(0, p_j - q_j)), which resid
 * ([vocab] scratch) holds on return, and j is returned. When all k are kept,
 * *next is drawn from p_k and k is returned. Either way the tokens emitted,
 * draft[0..ret) then *next, follow p exactly. A draft id outside the
 * vocabulary is rejected. */
int rlm__spec_accept(rlm_sampler *s, const float *const *p, const float *const *q,
                     const int32_t *draft, int k, float *resid, int32_t *next);

/* One position of the rule, for callers that compute p_j only once d_j's
 * predecessors are kept (the penalties' history must hold them):
 * true when d is kept; else *next is drawn from the residual and false. */
bool rlm__spec_accept_one(rlm_sampler *s, const float *p, const float *q, int32_t d, float *resid,
                          int32_t *next);

/* Prompt lookup: the most recent earlier occurrence of the last n tokens of
 * hist[n_hist] (the row's prompt and output so far), one ending before the
 * last position, and up to k of the tokens that followed it copied into
 * out[k] (they may run into the suffix itself, which is what repeats a
 * loop). Returns how many: fewer than k where the history ends, 0 with no
 * match or n_hist <= n. O(n_hist * n) at worst; one token compared per
 * position in practice. */
int rlm__ngram_propose(const int32_t *hist, int64_t n_hist, int n, int k, int32_t *out);

/* The adaptive proposal length after a verification that kept `kept` of
 * n_draft >= 1 proposals: k + 2 (at most k_max) when it kept them all,
 * else at most kept + 1 and k - 1, down to 0. A row at 0 makes a
 * one-token probe every RLM_SPEC_PROBE decode steps (rlm__spec_probe),
 * so text where proposals start to hold brings k back. */
int rlm__spec_next_k(int k, int kept, int n_draft, int k_max);
enum { RLM_SPEC_PROBE = 8 };
/* Proposals a row at adaptive length k may make this step: k, or at k = 0
 * one on every RLM_SPEC_PROBE-th call (*idle counts the calls). */
int rlm__spec_probe(int k, int *idle);

/* Room in s for any piece of up to piece_max bytes, so that rlm_stop_push
 * never allocates afterwards (a generation step must not fail halfway). */
rlm_status rlm__stop_reserve(rlm_stop *s, size_t piece_max, rlm_error *err);

#endif
