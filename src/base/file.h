/* file.h - whole files into memory, for the small texts the CLI and the
 * loaders read (templates, grammars, schemas, standard input). */
#ifndef CLLM_BASE_FILE_H
#define CLLM_BASE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/err.h"

/* Everything left in f, NUL-terminated (caller frees); *len (may be NULL)
 * gets the byte count. NULL when out of memory or on a read error. */
char *read_stream(FILE *f, size_t *len);
/* The file at path (or standard input for "-"); NULL with a message naming
 * the path when it cannot be opened or read. */
char *read_file(const char *path, size_t *len, struct err *e);

#endif
