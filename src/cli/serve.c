/* serve.c - `cllm serve`: builds the config snapshot (CLLM_* environment,
 * then flags) and runs the HTTP server until SIGINT/SIGTERM. */
#include <stdio.h>

#include "cli/cli.h"
#include "serve/config.h"
#include "serve/serve.h"

int cmd_serve(int argc, char **argv)
{
    struct serve_config cfg;
    struct err e = {{0}};
    if (serve_config_from_env(&cfg, &e)) {
        fprintf(stderr, "cllm serve: %s\n", e.msg);
        return 2;
    }
    int rc = serve_config_parse_args(&cfg, argc, argv, stderr, &e);
    if (rc == 1) {
        serve_usage(stdout);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "cllm serve: %s\n", e.msg);
        return 2;
    }
    if (serve_main(&cfg, &e)) {
        fprintf(stderr, "cllm serve: %s\n", e.msg);
        return 1;
    }
    return 0;
}
