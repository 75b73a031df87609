/* bench_batch.c - aggregate decode throughput of the continuous-batching
 * engine, driven directly through the engine API (no HTTP): S concurrent
 * greedy streams of a P-token prompt and G generated tokens, for each S in
 * the list. Reports aggregate decode tokens/s (the tokens produced after
 * the last stream's first token, when no prefill is left, over that window)
 * and the mean time to first token.
 *
 *   bench_batch MODEL [--streams 1,4,8] [--prompt 64] [--gen 64] [--threads N]
 *               [--device cpu|cuda] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "model/model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_batch MODEL [--streams 1,4,8] [--prompt P] [--gen G] "
                        "[--threads N] [--device D]\n");
        return 2;
    }
    const char *path = argv[1], *streams = "1,4,8", *device = NULL;
    int n_prompt = 64, n_gen = 64, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--streams"))
            streams = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt"))
            n_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen"))
            n_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
    }
    struct model m;
    struct err e = {{0}};
    if (model_load(&m, path, &e)) {
        fprintf(stderr, "bench_batch: %s\n", e.msg);
        return 1;
    }
    printf("model %s, prompt %d, gen %d\n", path, n_prompt, n_gen);
    printf("%8s %12s %14s %12s\n", "streams", "decode tok/s", "per stream", "ttft ms");
    char list[256];
    snprintf(list, sizeof list, "%s", streams);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int S = atoi(tok);
        if (S <= 0 || S > 256)
            continue;
        struct engine_config cfg = {.n_threads = threads, .ctx_len = n_prompt + n_gen + 16,
                                    .kv_tokens = S * (n_prompt + n_gen + 32),
                                    .prefill_chunk = 128, .max_queue = 512, .max_running = S,
                                    .prompt_cache_bytes = -1, .device = device};
        struct engine *eng = engine_create(&m, &cfg, &e);
        if (!eng) {
            fprintf(stderr, "bench_batch: %s\n", e.msg);
            return 1;
        }
        struct engine_request **rs = calloc((size_t)S, sizeof *rs);
        int *prompt = malloc(sizeof(int) * (size_t)n_prompt);
        int *got = calloc((size_t)S, sizeof(int));
        double *t_first = calloc((size_t)S, sizeof(double));
        double t0 = now_s(), t_end = 0, t_all = 0; /* t_all: every stream has started */
        long total = 0, at_all = 0;
        int started = 0;
        for (int s = 0; s < S; s++) {
            for (int i = 0; i < n_prompt; i++) /* distinct prompts: no prefix sharing */
                prompt[i] = 100 + (s * 7919 + i * 104729) % (m.cfg.vocab_size - 200);
            struct engine_params p = {.sp = {.temperature = 0, .top_p = 1},
                                      .max_tokens = n_gen, .ignore_eos = true};
            rs[s] = engine_request_new(prompt, n_prompt, &p, &e);
            if (!rs[s] || engine_submit(eng, rs[s], &e)) {
                fprintf(stderr, "bench_batch: %s\n", e.msg);
                return 1;
            }
        }
        for (int done = 0; done < S;) {
            done = 0;
            for (int s = 0; s < S; s++) {
                struct engine_event ev;
                while (engine_request_next(rs[s], &ev, 0) == 1) {
                    if (ev.finish != ENGINE_FINISH_NONE) {
                        got[s] = -got[s] - 1; /* negative: finished */
                        t_end = now_s();
                        break;
                    }
                    total++;
                    if (got[s]++ == 0) {
                        t_first[s] = now_s();
                        if (++started == S) {
                            t_all = t_first[s];
                            at_all = total;
                        }
                    }
                }
                done += got[s] < 0;
            }
            if (done < S)
                nanosleep(&(struct timespec){0, 100000}, NULL);
        }
        double ttft = 0;
        for (int s = 0; s < S; s++)
            ttft += t_first[s] - t0;
        ttft /= S;
        /* Decode only: the tokens after every stream has started (no prefill
         * left in the batch), over that window. */
        double tps = t_end > t_all ? (double)(total - at_all) / (t_end - t_all) : 0;
        printf("%8d %12.1f %14.1f %12.1f\n", S, tps, tps / S, ttft * 1e3);
        fflush(stdout);
        for (int s = 0; s < S; s++)
            engine_request_release(rs[s]);
        free(rs);
        free(prompt);
        free(got);
        free(t_first);
        engine_destroy(eng);
    }
    model_free(&m);
    return 0;
}
