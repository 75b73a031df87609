/* main.c - the cllm command line: dispatches a verb to its cli/ file. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        cli_usage(f);
        /* cli_usage (run.c) lists the other verbs and run's options. */
        fprintf(f, "\nmore commands:\n"
                   "  bench <model> [options]  prefill and decode tok/s against the memory-bandwidth\n"
                   "                           floor; --batch S,S,... adds concurrent streams (see\n"
                   "                           cllm bench --help)\n");
        return argc < 2 ? 2 : 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } verbs[] = {
        {"run", cmd_run},
        {"serve", cmd_serve},
        {"tokenize", cmd_tokenize},
        {"template", cmd_template},
        {"bench", cmd_bench},
    };
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (!strcmp(argv[1], verbs[i].name))
            return verbs[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "cllm: unknown command \"%s\" (see cllm --help)\n", argv[1]);
    return 2;
}
