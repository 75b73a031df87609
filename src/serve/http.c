/* http.c - the libmicrohttpd glue: one thread per connection, request body
 * collection with a cap (413), JSON parsing, routing, CORS, JSON replies and
 * the SSE writer that pulls a stream's bytes from its generation.
 *
 * Thread per connection (not internal polling + suspend/resume) because a
 * connection's work is inherently sequential and mostly waiting on one
 * engine channel: the handler and the content reader simply block on
 * engine_request_next with a short timeout and poll the socket for a hang-up
 * between waits. That needs no wake-up plumbing from the engine thread into
 * an event loop, a thread costs little next to a model, and the connection
 * limit bounds the count. */
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "serve/internal.h"

struct http {
    struct server *srv;
    struct MHD_Daemon *d;
    int quiesced_fd; /* the listen socket after http_quiesce, closed after the stop */
};

/* One HTTP request's state, from its headers to its completion. */
struct req {
    struct buf body;
    bool too_large;
    bool answered; /* a response was queued before the body was read */
    int status;
    double t0;
};

/* A streamed response's state. */
struct sconn {
    struct http *h;
    struct stream *s;
    struct MHD_Connection *c;
};

/* status 0: a client that left before its answer (a stream was already
 * counted with its 200 when it opened, so only the disconnect counts). */
void server_count_status(struct server *srv, int status)
{
    pthread_mutex_lock(&srv->mu);
    if (status > 0)
        srv->ctr.http_requests++;
    if (status >= 500)
        srv->ctr.status_5xx++;
    else if (status >= 400)
        srv->ctr.status_4xx++;
    else if (status > 0)
        srv->ctr.status_2xx++;
    else
        srv->ctr.disconnects++;
    pthread_mutex_unlock(&srv->mu);
}

/* ---- client presence ---- */

/* True when the peer closed or reset the connection. A readable socket with
 * data is a pipelined request, not a hang-up; a read of 0 bytes is EOF. */
static bool conn_gone(void *ctx)
{
    struct MHD_Connection *c = ctx;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL))
        return true;
    if (p.revents & POLLIN) {
        char b;
        return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

/* A generation may wait longer than the idle timeout (queue, long prefill);
 * switch the timeout off while it runs. Setting it back from 0 restarts the
 * timer (libmicrohttpd's documented behaviour). */
static void conn_timeout(struct MHD_Connection *c, unsigned s)
{
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s);
}

/* ---- replies ---- */

static void add_cors(struct MHD_Response *r)
{
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "*");
}

static enum MHD_Result queue(struct MHD_Connection *c, struct req *rq, int status,
                             struct MHD_Response *r)
{
    if (!r)
        return MHD_NO;
    add_cors(r);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    rq->status = status;
    return ok;
}

static enum MHD_Result send_json(struct http *h, struct MHD_Connection *c, struct req *rq,
                                 int status, json_t *body, const char *allow)
{
    size_t n = 0;
    char *s = body ? json_compact(body, &n) : NULL;
    json_decref(body);
    if (!s) { /* never partial JSON: a fixed 500 body */
        static const char oom[] = "{\"error\":{\"message\":\"internal error: cannot format the "
                                  "response\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        s = strdup(oom);
        n = s ? strlen(s) : 0;
        status = 500;
        if (!s)
            return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    server_count_status(h->srv, status);
    return queue(c, rq, status, r);
}

static enum MHD_Result send_error(struct http *h, struct MHD_Connection *c, struct req *rq,
                                  int status, enum api_shape shape, const char *allow,
                                  const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(struct http *h, struct MHD_Connection *c, struct req *rq,
                                  int status, enum api_shape shape, const char *allow,
                                  const char *fmt, ...)
{
    struct api_error ae;
    const char *type = status == 404 ? "not_found_error"
                       : status >= 500 ? "server_error" : "invalid_request_error";
    char msg[sizeof ae.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_fail(&ae, status, type, NULL, "%s", msg); /* which makes it one line of UTF-8 */
    return send_json(h, c, rq, status, api_error_body(&ae, shape), allow);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct sconn *sc = cls;
    struct client cl = {conn_gone, sc->c};
    int rc = stream_fill(sc->s, &cl);
    if (rc < 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (rc == 0) {
        conn_timeout(sc->c, (unsigned)sc->h->srv->cfg->conn_timeout_s);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    struct stream *s = sc->s;
    size_t n = s->out.n - s->off;
    if (n > max)
        n = max;
    memcpy(buf, s->out.p + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_done(void *cls)
{
    struct sconn *sc = cls;
    if (sc->s->phase != 2) /* the stream never reached its last event: the client left */
        server_count_status(sc->h->srv, 0);
    stream_free(sc->s); /* cancels the generation when the client left early */
    free(sc);
}

static enum MHD_Result send_stream(struct http *h, struct MHD_Connection *c, struct req *rq,
                                   struct stream *s)
{
    struct sconn *sc = calloc(1, sizeof *sc);
    if (!sc) {
        stream_free(s);
        return send_error(h, c, rq, 500, SHAPE_OPENAI, NULL, "out of memory");
    }
    sc->h = h;
    sc->s = s;
    sc->c = c;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_done);
    if (!r) {
        stream_done(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    server_count_status(h->srv, 200);
    return queue(c, rq, 200, r);
}

/* ---- routing ---- */

typedef void (*gen_route)(struct server *, const json_t *, const struct client *,
                          struct reply *);

static enum MHD_Result run_generation(struct http *h, struct MHD_Connection *c, struct req *rq,
                                      gen_route fn, enum api_shape shape)
{
    if (rq->body.n == 0)
        return send_error(h, c, rq, 400, shape, NULL, "the request body is empty (send JSON)");
    json_error_t je;
    json_t *req = json_loadb(rq->body.p, rq->body.n, 0, &je);
    if (!req)
        return send_error(h, c, rq, 400, shape, NULL, "invalid JSON in the request body: %s "
                          "(line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(req)) {
        json_decref(req);
        return send_error(h, c, rq, 400, shape, NULL, "the request body must be a JSON object");
    }
    struct client cl = {conn_gone, c};
    struct reply rp = {0};
    conn_timeout(c, 0);
    fn(h->srv, req, &cl, &rp);
    json_decref(req);
    if (rp.stream)
        return send_stream(h, c, rq, rp.stream);
    conn_timeout(c, (unsigned)h->srv->cfg->conn_timeout_s);
    if (rp.status == 0) { /* the client left while we generated: close */
        server_count_status(h->srv, 499);
        server_count_status(h->srv, 0);
        rq->status = 499;
        return MHD_NO;
    }
    return send_json(h, c, rq, rp.status, rp.body, NULL);
}

static bool is(const char *url, const char *path) { return !strcmp(url, path); }

/* Anthropic routes answer errors in Anthropic's shape. */
static enum api_shape shape_of(const char *url)
{
    return !strncmp(url, "/v1/messages", 12) ? SHAPE_ANTHROPIC : SHAPE_OPENAI;
}

static enum MHD_Result route(struct http *h, struct MHD_Connection *c, struct req *rq,
                             const char *url, const char *method)
{
    struct server *srv = h->srv;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    static const struct {
        const char *path;
        gen_route fn;
        enum api_shape shape;
    } gens[] = {
        {"/v1/chat/completions", openai_chat, SHAPE_OPENAI},
        {"/v1/completions", openai_completions, SHAPE_OPENAI},
        {"/v1/messages", anthropic_messages, SHAPE_ANTHROPIC},
        {"/v1/messages/count_tokens", anthropic_count_tokens, SHAPE_ANTHROPIC},
        {"/v1/responses", responses_create, SHAPE_OPENAI},
    };
    for (size_t i = 0; i < sizeof gens / sizeof gens[0]; i++)
        if (is(url, gens[i].path)) {
            if (!post)
                return send_error(h, c, rq, 405, gens[i].shape, "POST, OPTIONS",
                                  "%s %s: use POST", method, url);
            return run_generation(h, c, rq, gens[i].fn, gens[i].shape);
        }
    if (is(url, "/metrics")) {
        if (!get)
            return send_error(h, c, rq, 405, SHAPE_OPENAI, "GET, HEAD, OPTIONS",
                              "%s %s: use GET", method, url);
        size_t n = 0;
        char *text = metrics_text(srv, &n);
        struct MHD_Response *r =
            text ? MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!r) {
            free(text);
            return send_error(h, c, rq, 500, SHAPE_OPENAI, NULL, "cannot format the metrics");
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
        server_count_status(h->srv, 200);
        return queue(c, rq, 200, r);
    }
    json_t *body = NULL;
    bool known = true;
    if (is(url, "/health") || is(url, "/v1/health"))
        body = get ? health_json(srv) : NULL;
    else if (is(url, "/stats"))
        body = get ? stats_json(srv) : NULL;
    else if (is(url, "/v1/models"))
        body = get ? openai_models(srv) : NULL;
    else if (!strncmp(url, "/v1/models/", 11) && url[11])
        body = get ? openai_model(srv, url + 11) : NULL; /* any name rides the loaded model */
    else if (!strncmp(url, "/v1/responses/", 14) && url[14]) {
        if (get) {
            body = responses_get(srv, url + 14);
            if (!body)
                return send_error(h, c, rq, 404, SHAPE_OPENAI, NULL,
                                  "no stored response with id '%s'", url + 14);
        }
    } else
        known = false;
    if (!known)
        return send_error(h, c, rq, 404, SHAPE_OPENAI, NULL, "no route for %s %s", method, url);
    if (!get)
        return send_error(h, c, rq, 405, SHAPE_OPENAI, "GET, HEAD, OPTIONS", "%s %s: use GET",
                          method, url);
    int status = 200;
    if ((is(url, "/health") || is(url, "/v1/health")) && atomic_load(&srv->draining))
        status = 503;
    return send_json(h, c, rq, status, body, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct http *h = cls;
    size_t cap = h->srv->cfg->max_body_bytes;
    struct req *rq = *con_cls;
    if (!rq) { /* headers are in; the body (if any) comes in later calls */
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return MHD_NO;
        rq->t0 = clock_now_s();
        *con_cls = rq;
        atomic_fetch_add(&h->srv->active, 1);
        const char *len =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (len && strtoull(len, NULL, 10) > cap) { /* refuse before reading it */
            rq->answered = true;
            return send_error(h, c, rq, 413, shape_of(url), NULL, "the request body has %s bytes; the limit is %zu "
                              "(CLLM_MAX_BODY_BYTES)", len, cap);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->answered && !rq->too_large) {
            if (rq->body.n + *upload_size > cap) {
                rq->too_large = true;
                buf_free(&rq->body);
            } else {
                buf_putn(&rq->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->answered)
        return MHD_YES;
    if (rq->too_large)
        return send_error(h, c, rq, 413, shape_of(url), NULL, "the request body is larger than the limit of %zu bytes "
                          "(CLLM_MAX_BODY_BYTES)", cap);
    if (rq->body.oom)
        return send_error(h, c, rq, 500, SHAPE_OPENAI, NULL, "out of memory reading the body");
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                       "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", want ? want : "*");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        server_count_status(h->srv, 204);
        return queue(c, rq, 204, r);
    }
    /* "/v1/models/" and "/v1/models" are the same route */
    char path[512];
    snprintf(path, sizeof path, "%s", url);
    size_t n = strlen(path);
    if (n > 1 && path[n - 1] == '/')
        path[n - 1] = 0;
    return route(h, c, rq, path, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c;
    struct http *h = cls;
    struct req *rq = *con_cls;
    if (!rq)
        return;
    if (h->srv->cfg->log_requests) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        fprintf(stderr, "cllm serve: %d %.1f ms%s\n", ci ? (int)ci->http_status : rq->status,
                (clock_now_s() - rq->t0) * 1e3,
                why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    }
    buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
    atomic_fetch_sub(&h->srv->active, 1); /* its answer is out (or the client is gone) */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode what)
{
    (void)c;
    (void)socket_ctx;
    struct http *h = cls;
    atomic_fetch_add(&h->srv->connections, what == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    struct http *h = cls;
    if (!h->srv->cfg->log_requests) /* client resets etc. are routine */
        return;
    fprintf(stderr, "cllm serve: http: ");
    vfprintf(stderr, fmt, ap);
}

struct http *http_start(struct server *srv, int listen_fd, struct err *e)
{
    struct http *h = calloc(1, sizeof *h);
    if (!h) {
        err_set(e, "out of memory");
        return NULL;
    }
    h->srv = srv;
    h->quiesced_fd = -1;
    h->d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, listen_fd,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->cfg->conn_timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg->max_connections,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION,
        on_connection, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        err_set(e, "cannot start the HTTP server (libmicrohttpd)");
        return NULL;
    }
    return h;
}

void http_quiesce(struct http *h)
{
    if (!h || h->quiesced_fd >= 0)
        return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd == MHD_INVALID_SOCKET)
        return;
    /* Stop listening now (new connections are refused instead of waiting in
     * the backlog); the descriptor itself is closed only after the daemon
     * stops, as libmicrohttpd requires. */
    shutdown(fd, SHUT_RDWR);
    h->quiesced_fd = fd;
}

void http_stop(struct http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* closes the listen socket unless quiesced */
    if (h->quiesced_fd >= 0)
        close(h->quiesced_fd);
    free(h);
}
