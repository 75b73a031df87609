/* tokenize.c - `cllm tokenize`: text to ids and back with a model's tokenizer. */
#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "cllm tokenize: not available yet\n");
    return 2;
}
