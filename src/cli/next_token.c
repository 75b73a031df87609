/* next_token.c - one forward pass that yields the next token, as `cllm run`
 * and `cllm bench` decode: picked on the device when the backend can (its
 * argmax, or its sampler with the request's draw), else from the logits row
 * on the host with the same draw. */
#include "cli/cli.h"

#include "engine/sampler.h"
#include "model/forward.h"

int cli_forward_next(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                     const int *toks, int n, float *logits, struct sampler *smp, int *next,
                     struct err *e)
{
    if (sampler_is_greedy(smp)) /* the host fallback is sample_argmax's rule */
        return forward_tokens_greedy(fs, pool, seq, toks, n, logits, next, e);
    /* one uniform draw per token, taken before the step, as the engine does */
    struct sample_params sp = {.temperature = smp->p.temperature, .top_k = smp->p.top_k,
                               .top_p = smp->p.top_p, .min_p = smp->p.min_p,
                               .u = rng_uniform(&smp->rng)};
    if (forward_tokens_sampled(fs, pool, seq, toks, n, logits, &sp, next, e))
        return -1;
    if (*next < 0) /* the backend returned the row: draw on the host */
        *next = sampler_pick(&smp->p, logits, smp->vocab, sp.u, smp->probs, smp->idx);
    return 0;
}

int cli_decode_n(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq, int n,
                 float *logits, struct sampler *smp, int *next, struct err *e)
{
    if (n <= 0)
        return 0;
    if (!sampler_is_greedy(smp)) {
        for (int i = 0; i < n; i++) {
            int tok = *next;
            if (cli_forward_next(fs, pool, seq, &tok, 1, logits, smp, next, e))
                return -1;
        }
        return 0;
    }
    /* greedy: each step queued before the one ahead of it has been read */
    int tok = *next;
    if (forward_pipe_issue(fs, pool, seq, &tok, e))
        return -1;
    for (int i = 0; i < n; i++)
        if ((i + 1 < n && forward_pipe_issue(fs, pool, seq, NULL, e)) ||
            forward_pipe_take(fs, next, e)) {
            struct err ignored = {{0}};
            forward_pipe_drop(fs, &ignored);
            return -1;
        }
    return 0;
}
