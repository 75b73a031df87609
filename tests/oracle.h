/* oracle.h - the model runner the oracle tests share (test_models on the
 * CPU, test_cuda on a GPU): a model on a backend with a forward state and a
 * KV pool, greedy decoding, every row's logits, and the checks against the
 * transformers fixtures (tests/fixtures/oracle/<name>/ref.json). Failures
 * go through CHECK. */
#ifndef CLLM_TESTS_ORACLE_H
#define CLLM_TESTS_ORACLE_H

#include <stdbool.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "model/model.h"

struct runner {
    struct model m;
    struct backend *be;
    bool own_be; /* runner_close destroys be */
    struct forward_state fs;
    struct kv_pool pool;
};

/* Loads path onto be (NULL: fails, as when the caller could not create
 * it) with room for batch tokens per forward and kv_blocks 16-token blocks. */
int runner_open(struct runner *r, const char *path, struct backend *be, bool own_be, int batch,
                int kv_blocks);
void runner_close(struct runner *r);
/* Greedy decoding after prompt: out gets up to n_gen ids, stopping after an
 * EOS id unless ignore_eos; last_logits (optional) gets the logits the last
 * id was chosen from. Returns the count. */
int runner_greedy(struct runner *r, const int *prompt, int n_prompt, int n_gen, int *out,
                  bool ignore_eos, float *last_logits);
/* runner_greedy's ids without stopping at EOS, each decode step queued
 * one ahead of the host (forward_pipe_issue / forward_pipe_take). */
int runner_greedy_ahead(struct runner *r, const int *prompt, int n_prompt, int n_gen, int *out);
/* The logits of every prompt position [n_prompt][vocab] (malloc'ed), or
 * NULL. */
float *runner_logits(struct runner *r, const int *prompt, int n_prompt);

/* Every case of dir's ref.json through r: logits within tol (the worst
 * relative error is returned); the bf16 fixtures' f32-model logits within
 * 3e-2 when f32src; greedy ids equal to the reference's (min_match < 0) or
 * at least their first min_match. label names the run in messages. */
double oracle_check(struct runner *r, const char *dir, double tol, int min_match, bool f32src,
                    const char *label);
/* Relative logits error of case `index` of dir's ref.json through r (a
 * model converted from dir, e.g. to GGUF), INFINITY when it cannot run. */
double oracle_case_err(struct runner *r, const char *dir, int index);
/* tinystories-656k (model_dir) through r against transformers' own logits
 * and greedy ids (fixtures_dir/oracle/tinystories_*): logits within 1e-4. */
void oracle_tinystories(struct runner *r, const char *fixtures_dir, const char *label);

/* m written as a GGUF of dtype dt at q (rows the format's blocks do not
 * divide fall back, as the writer does), and that file's weights widened
 * back into an f32 GGUF at f: the same values in both files. Returns the
 * layers' q and down matrices the format holds (>= 0), or -1 (CHECKed).
 * label names the model in messages. */
int oracle_gguf_pair(const struct model *m, enum dtype dt, const char *q, const char *f,
                     const char *label);

/* Calls fn(dir, name) for every fixture under fixtures_dir/oracle (a
 * folder holding a ref.json); returns how many (CHECKs the folder exists). */
int oracle_each(const char *fixtures_dir, void (*fn)(const char *dir, const char *name));

#endif
