/* cli.h - one function per `cllm` verb; each parses its own arguments and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef CLLM_CLI_CLI_H
#define CLLM_CLI_CLI_H

#include <stdio.h>

#include "base/err.h"

void cli_usage(FILE *f);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Parses a comma- or space-separated list of token ids, each below limit,
 * into *out (malloc'ed; the caller frees it). Returns the count (0 for an
 * empty list) or -1 with e naming flag. */
int cli_parse_ids(const char *flag, const char *s, long limit, int **out, struct err *e);

/* flag's value v (may be NULL) as an integer in [lo, hi] into *out: 0, or
 * -1 with "cmd: flag needs an integer in [lo, hi]" on stderr. */
int cli_parse_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out);
/* A number flag's value, base/parse.h's rule (a finite float): 0, or -1
 * with the message "CMD: FLAG needs a number (got ...)" on stderr. */
int cli_parse_float(const char *cmd, const char *flag, const char *v, float *out);
/* An on/off flag's value (on, off, true, false, 1, 0) as 1 (on) or -1
 * (off) into *out: 0, or -1 with "CMD: FLAG needs on or off" on stderr. */
int cli_parse_onoff(const char *cmd, const char *flag, const char *v, int *out);

struct forward_state;
struct kv_pool;
struct kv_seq;
struct sampler;
/* One forward pass over n tokens of seq that yields the next token in
 * *next as smp picks it (greedy, or sampled with one uniform draw from
 * smp's RNG): on the device when the backend has the op, else from the
 * last logits row (logits, one row) on the host. 0, or -1 with e set. */
int cli_forward_next(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                     const int *toks, int n, float *logits, struct sampler *smp, int *next,
                     struct err *e);
/* n decode steps of seq from the token *next, as n cli_forward_next calls
 * of one token each: *next = the last step's token. Greedy steps go one
 * ahead of the host (forward_pipe_issue). */
int cli_decode_n(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq, int n,
                 float *logits, struct sampler *smp, int *next, struct err *e);

#endif
