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

#endif
