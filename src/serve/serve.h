/* serve.h - `cllm serve` as one call: load the model, start the engine and
 * the HTTP server, serve until SIGINT/SIGTERM, drain, return. */
#ifndef CLLM_SERVE_SERVE_H
#define CLLM_SERVE_SERVE_H

#include "base/err.h"
#include "serve/config.h"

/* True when something already accepts TCP connections on host:port (the
 * spec's pre-flight: refuse to start rather than fail after loading). */
bool serve_port_in_use(const char *host, int port);

/* Runs the server with a finished config snapshot. Returns 0 after a clean
 * shutdown, -1 with a message when it cannot start. */
int serve_main(const struct serve_config *cfg, struct err *e);

#endif
