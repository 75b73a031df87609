/* drafter.h - a small model that proposes the next tokens of a sequence for
 * the engine's speculation (--draft-model, the spec's two-model kind): its
 * own backend on the engine's device, its own K/V and the tokens that K/V
 * holds, so each proposal only feeds what changed since the last one.
 *
 * One sequence at a time (the engine speculates for a sequence decoding
 * alone): asked about another sequence, the drafter keeps the prefix the two
 * share and computes the rest. Proposals are the draft model's greedy picks,
 * a deterministic function of the tokens, which is what lets the engine's
 * verification treat each draft as certain (sampler_verify). The caller
 * makes sure both models read token ids alike (the server compares their
 * tokenizers). */
#ifndef CLLM_ENGINE_DRAFTER_H
#define CLLM_ENGINE_DRAFTER_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

struct drafter;

/* The drafter for m (borrowed: it must outlive the drafter) on device
 * ("cpu", "cuda[:N]", "auto"), holding K/V for up to ctx_len tokens (capped
 * by the model's own context) and half as much again of earlier contexts'
 * full blocks in its prefix index. compiled_decode: as engine_config's. */
struct drafter *drafter_create(const struct model *m, const char *device, int n_threads,
                               int ctx_len, int compiled_decode, struct err *e);
void drafter_free(struct drafter *d);

/* Up to max proposed tokens after toks[0..n) into out; stops early at an id
 * of vocab or above (one the target cannot take), where the drafter's
 * context ends, and, with p_min > 0, before a pick whose probability under
 * the draft model is below p_min (a draft it is unsure of seldom lands).
 * Returns how many (0 when none), -1 with a message when a forward failed
 * (the drafter is then empty and still usable). */
int drafter_propose(struct drafter *d, const int *toks, int n, int vocab, float p_min, int *out,
                    int max, struct err *e);

/* Bytes the drafter holds: its weights and its K/V pool (for memory budgets). */
size_t drafter_bytes(const struct drafter *d);

/* Tokens the drafter fed through its model, and tokens it took from its
 * prefix index instead (a prompt it had seen, another request's turn ago). */
struct drafter_stats {
    uint64_t computed, cached;
};
void drafter_get_stats(const struct drafter *d, struct drafter_stats *out);

#endif
