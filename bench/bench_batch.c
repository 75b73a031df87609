/* bench_batch.c - kept for the commands recorded in docs/benchmarks.md: it
 * runs `cllm bench MODEL --batch S,...` (the cllm next to this binary),
 * which measures the same thing through the engine API and more (prefill,
 * batch-1 decode, floors, TTFT p50/p99). Arguments map one to one:
 *
 *   bench_batch MODEL [--streams 1,4,8] [--prompt 64] [--gen 64] [--threads N]
 *               [--device cpu|cuda]      (anything else is passed on)
 *
 * The aggregate decode figure now counts only the window in which all S
 * streams decode (last stream's first token to first stream's last token);
 * before, the window ran until the last stream finished, so it included the
 * tail in which early streams had already ended and fewer than S decoded,
 * which understated the S-stream rate when streams start at different steps. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_batch MODEL [--streams 1,4,8] [--prompt P] [--gen G] "
                        "[--threads N] [--device D]  (runs cllm bench MODEL --batch ...)\n");
        return 2;
    }
    char cllm[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", cllm, sizeof cllm - 8);
    if (n <= 0) {
        perror("bench_batch: /proc/self/exe");
        return 1;
    }
    cllm[n] = 0;
    char *slash = strrchr(cllm, '/');
    strcpy(slash ? slash + 1 : cllm, "cllm");

    /* The old defaults: 1,4,8 streams of a 64-token prompt and 64 tokens. */
    char **av = calloc((size_t)argc + 16, sizeof *av);
    if (!av)
        return 1;
    int k = 0;
    av[k++] = cllm;
    av[k++] = (char *)"bench";
    av[k++] = argv[1]; /* av[4], av[6], av[8]: the values --streams, --prompt, --gen set */
    const char *defaults[] = {"--batch", "1,4,8", "-p", "64", "-n", "64"};
    for (int i = 0; i < 6; i++)
        av[k++] = (char *)defaults[i];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 < argc && !strcmp(a, "--streams"))
            av[4] = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--prompt"))
            av[6] = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--gen"))
            av[8] = argv[++i];
        else if (!strcmp(a, "--threads"))
            av[k++] = (char *)"-t";
        else
            av[k++] = argv[i];
    }
    av[k] = NULL;
    execv(cllm, av);
    fprintf(stderr, "bench_batch: cannot run %s: ", cllm);
    perror(NULL);
    return 1;
}
