/* template.c - `cllm template`: renders a chat template for a message list. */
#include "cli/cli.h"

int cmd_template(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "cllm template: not available yet\n");
    return 2;
}
