/* logprobs.c - generated tokens' log-probabilities in the shapes of the
 * OpenAI chat, Responses and completions APIs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

/* A token's text: the bytes it adds to a text (a special token's piece, as
 * written in the vocabulary). */
static const char *token_text(const struct tokenizer *t, int id, int *n, char *byte)
{
    const char *s;
    int k = tok_id_bytes(t, id, &s, byte);
    if (k >= 0) {
        *n = k;
        return s;
    }
    s = tok_piece(t, id);
    *n = s ? (int)strlen(s) : 0;
    return s ? s : "";
}

/* A log-probability as JSON; -inf (a token the model rules out) as
 * OpenAI writes it, -9999.0, since JSON has no infinities. */
static json_t *lp_json(float v)
{
    return isfinite(v) ? json_float(v) : json_real(-9999.0);
}

/* {token, logprob, bytes}: the token as UTF-8 (a partial character's bytes
 * become U+FFFD there) and its exact bytes. */
static json_t *token_entry(const struct tokenizer *t, int id, float lp)
{
    char byte;
    int n;
    const char *s = token_text(t, id, &n, &byte);
    json_t *bytes = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)s[i]));
    return json_pack("{s:o, s:o, s:o}", "token", json_text(s, (size_t)n), "logprob",
                     lp_json(lp), "bytes", bytes);
}

json_t *logprobs_content(const struct tokenizer *t, const struct gen_logprob *e, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *x = token_entry(t, e[i].token, e[i].lp.logprob), *top = json_array();
        for (int j = 0; j < e[i].lp.n_top; j++)
            json_array_append_new(top, token_entry(t, e[i].lp.top_id[j], e[i].lp.top_lp[j]));
        json_object_set_new(x, "top_logprobs", top);
        json_array_append_new(a, x);
    }
    return a;
}

json_t *logprobs_completion(const struct tokenizer *t, const struct gen_logprob *e, int n)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    for (int i = 0; i < n; i++) {
        char byte;
        int k;
        const char *s = token_text(t, e[i].token, &k, &byte);
        json_array_append_new(tokens, json_text(s, (size_t)k));
        json_array_append_new(lps, e[i].none ? json_null() : lp_json(e[i].lp.logprob));
        json_array_append_new(offs, json_integer(e[i].offset));
        json_t *top = json_object();
        for (int j = 0; j < e[i].lp.n_top; j++) {
            s = token_text(t, e[i].lp.top_id[j], &k, &byte);
            json_t *key = json_text(s, (size_t)k);
            /* two ids of one text: the more likely one (listed first) stays */
            if (!json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key), lp_json(e[i].lp.top_lp[j]));
            json_decref(key);
        }
        json_array_append_new(tops, e[i].none ? (json_decref(top), json_null()) : top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}
