/* threadpool.h - a fixed set of worker threads that run one data-parallel
 * function at a time (fork-join). The calling thread is worker 0, so a pool
 * of 1 thread runs everything inline. */
#ifndef CLLM_BASE_THREADPOOL_H
#define CLLM_BASE_THREADPOOL_H

#include "base/err.h"

struct threadpool;

/* fn is called once per worker with ith in [0, nth). */
typedef void (*tp_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means "as many as CPUs this process may run on". When
 * there are at least n_threads such CPUs, each worker thread is pinned to a
 * CPU of its own and the thread calling tp_run to the CPUs the workers do
 * not use (threads it creates later inherit that mask); CLLM_PIN_THREADS=0
 * leaves scheduling to the OS. */
struct threadpool *tp_create(int n_threads, struct err *e);
void tp_destroy(struct threadpool *tp);
int tp_size(const struct threadpool *tp);

/* Calls fn once for each ith in [0, nth), nth = tp_size, and returns when
 * all have returned. Each call runs on some thread of the pool, the caller
 * included, and one thread may make several calls one after another (the
 * threads that are running take the share of those the OS has not
 * scheduled), so fn must split work by ith, never by which thread runs it;
 * per-ith scratch is private to its call. Not reentrant: one tp_run at a
 * time per pool. */
void tp_run(struct threadpool *tp, tp_fn fn, void *ctx);

#endif
