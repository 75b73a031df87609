/* threadpool.c - persistent fork-join workers for the compute kernels.
 *
 * tp_run is called a few hundred times per generated token, so waking the
 * workers must cost well under a microsecond. Each tp_run bumps a generation
 * counter; idle workers spin on it for a while (the next op usually follows
 * within microseconds) and only then sleep on a condition variable. The
 * caller waits for the workers the same way. Sleepers announce themselves in
 * a counter so the fast path never touches the mutex.
 *
 * The nth calls of a tp_run are slots that every thread, the caller too,
 * claims from a counter until none is left, and the run is over when all
 * slots have finished, not when every worker has been through it. Why: on a
 * machine that is busy with something else (a build, another model, the
 * agents themselves) a worker is often not running at the moment a run
 * starts, and a run that waited for each worker to come round waited a
 * scheduler time slice (milliseconds) for every one of a token's few
 * hundred ops: with one CPU-bound process beside it, 2-thread decode on 2
 * CPUs fell from 40 to 7 tok/s, with two to 1.7. Now the threads that are
 * running take the slots of those that are not. */
#include "base/threadpool.h"
#include "base/env.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* About 200 us of PAUSE (25 ns each on Zen 4): longer than the gap between two
 * ops of one forward pass, shorter than anything a user would notice as
 * burnt CPU after the last token. */
#define TP_SPIN_LONG (1 << 13)
/* With more threads than CPUs a spinning thread steals the core from the
 * thread it waits for, so sleep almost at once. */
#define TP_SPIN_SHORT 16

struct tp_worker {
    struct threadpool *tp;
    cpu_set_t cpus; /* used when the pool pins */
    pthread_t thread;
};

struct threadpool {
    /* The hot counters each get their own cache line: workers poll gen while
     * they finish and claim slots, the caller polls slots_done. */
    alignas(64) atomic_uint gen;
    alignas(64) atomic_int next_slot; /* the next slot of this run to claim */
    alignas(64) atomic_int slots_done;
    alignas(64) atomic_int worker_sleepers;
    atomic_int caller_sleeping;
    atomic_int stop;
    tp_fn fn;
    void *ctx;
    int n;
    int spin;
    int n_started;
    int pin;
    cpu_set_t caller_cpus; /* for whichever thread calls tp_run */
    int caller_pinned;     /* `caller` is the thread pinned last */
    pthread_t caller;
    cpu_set_t caller_before; /* its affinity before we pinned it */
    int caller_saved;
    struct tp_worker *workers; /* n - 1 of them: the caller is worker 0 */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
};

static inline void tp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

/* Failure (e.g. a cgroup forbids it) only costs speed, so it is ignored. */
static void tp_pin_self(const cpu_set_t *set)
{
    (void)pthread_setaffinity_np(pthread_self(), sizeof *set, set);
}

/* Why pin: a spinning waiter that shares a CPU with the thread it waits for
 * burns that thread's time slice, and some kernels (seen on VMs that pack
 * vCPUs) do put two busy threads of one process on one CPU while another
 * idles. Each worker gets a CPU of its own; the caller gets the allowed
 * CPUs the workers do not use. Returns 0 (no pinning) when there are fewer
 * allowed CPUs than threads or CLLM_PIN_THREADS=0. */
static int tp_plan_pinning(struct threadpool *tp)
{
    if (tp->n < 2 || !env_flag("CLLM_PIN_THREADS", true))
        return 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < tp->n)
        return 0;
    /* Workers take the highest CPUs, leaving CPU 0 (where interrupts and
     * housekeeping tend to land) to the caller and the rest of the process. */
    int i = tp->n - 1;
    for (int c = CPU_SETSIZE - 1; c >= 0 && i >= 1; c--) {
        if (CPU_ISSET(c, &allowed)) {
            CPU_ZERO(&tp->workers[i - 1].cpus);
            CPU_SET(c, &tp->workers[i - 1].cpus);
            CPU_CLR(c, &allowed);
            i--;
        }
    }
    tp->caller_cpus = allowed;
    return 1;
}

/* One spin-wait iteration. Yielding now and then lets the awaited thread
 * run should the scheduler have put it on our CPU (unpinned pools). */
static inline void tp_spin_once(int i)
{
    if ((i & 255) == 255)
        sched_yield();
    else
        tp_cpu_relax();
}

/* Returns the first generation different from seen (or any on stop). */
static unsigned tp_wait_work(struct threadpool *tp, unsigned seen)
{
    for (int i = 0; i < tp->spin; i++) {
        unsigned g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen)
            return g;
        tp_spin_once(i);
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->worker_sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop))
        pthread_cond_wait(&tp->cv_work, &tp->mu);
    atomic_fetch_sub(&tp->worker_sleepers, 1);
    pthread_mutex_unlock(&tp->mu);
    return g;
}

/* Claims and runs slots of the current run until none is left. fn and ctx
 * are read after a claim succeeds: the run that owns the slot cannot end,
 * and so the caller cannot overwrite them, before the slot is done. */
static void tp_run_slots(struct threadpool *tp)
{
    int n = tp->n;
    for (;;) {
        /* acquire: pairs with tp_run's release store of next_slot = 0, after
         * which fn, ctx and slots_done are the new run's */
        int s = atomic_fetch_add_explicit(&tp->next_slot, 1, memory_order_acquire);
        if (s >= n)
            return;
        tp->fn(tp->ctx, s, n);
        /* seq_cst pairs with the caller's store to caller_sleeping: either the
         * caller sees every slot done or we see that it sleeps, never neither. */
        if (atomic_fetch_add(&tp->slots_done, 1) == n - 1 && atomic_load(&tp->caller_sleeping)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->cv_done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

static void *tp_worker_main(void *arg)
{
    struct tp_worker *w = arg;
    struct threadpool *tp = w->tp;
    if (tp->pin)
        tp_pin_self(&w->cpus);
    unsigned seen = 0;
    for (;;) {
        seen = tp_wait_work(tp, seen);
        if (atomic_load(&tp->stop))
            break;
        tp_run_slots(tp);
    }
    return NULL;
}

static void tp_wait_done(struct threadpool *tp)
{
    for (int i = 0; i < tp->spin; i++) {
        if (atomic_load_explicit(&tp->slots_done, memory_order_acquire) == tp->n)
            return;
        tp_spin_once(i);
    }
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->caller_sleeping, 1);
    while (atomic_load(&tp->slots_done) != tp->n)
        pthread_cond_wait(&tp->cv_done, &tp->mu);
    atomic_store(&tp->caller_sleeping, 0);
    pthread_mutex_unlock(&tp->mu);
}

static void tp_stop_workers(struct threadpool *tp)
{
    atomic_store(&tp->stop, 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->gen, 1);
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_started; i++)
        pthread_join(tp->workers[i].thread, NULL);
}

/* CPUs this process may run on (a cpuset or taskset can make that fewer
 * than are online). */
static int tp_usable_cpus(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
        return CPU_COUNT(&allowed);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

struct threadpool *tp_create(int n_threads, struct err *e)
{
    int ncpu = tp_usable_cpus();
    if (n_threads <= 0)
        n_threads = ncpu;
    if (n_threads > 1024) {
        err_set(e, "thread pool: %d threads is more than the supported 1024", n_threads);
        return NULL;
    }
    struct threadpool *tp = aligned_alloc(64, sizeof *tp);
    if (!tp) {
        err_set(e, "thread pool: out of memory");
        return NULL;
    }
    memset(tp, 0, sizeof *tp);
    tp->n = n_threads;
    atomic_init(&tp->next_slot, n_threads); /* no slot to claim before the first run */
    tp->spin = n_threads > ncpu ? TP_SPIN_SHORT : TP_SPIN_LONG;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_work, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    tp->workers = calloc((size_t)n_threads, sizeof *tp->workers);
    if (!tp->workers) {
        err_set(e, "thread pool: out of memory");
        tp_destroy(tp);
        return NULL;
    }
    tp->pin = tp_plan_pinning(tp);
    for (int i = 1; i < n_threads; i++) {
        struct tp_worker *w = &tp->workers[i - 1];
        w->tp = tp;
        int rc = pthread_create(&w->thread, NULL, tp_worker_main, w);
        if (rc != 0) {
            err_set(e, "thread pool: cannot start thread %d of %d: %s", i, n_threads,
                    strerror(rc));
            tp_destroy(tp);
            return NULL;
        }
        tp->n_started++;
    }
    return tp;
}

void tp_destroy(struct threadpool *tp)
{
    if (!tp)
        return;
    if (tp->workers)
        tp_stop_workers(tp);
    /* A caller pinned for this pool's sake gets its CPUs back: a process
     * that goes on with another pool on another thread (cllm bench's engine
     * runs after its direct runs) must not keep this thread on the CPU that
     * pool's caller is pinned to. Only the caller itself can be trusted to
     * still exist, so only it is restored. */
    if (tp->caller_pinned && tp->caller_saved && pthread_equal(tp->caller, pthread_self()))
        tp_pin_self(&tp->caller_before);
    free(tp->workers);
    pthread_cond_destroy(&tp->cv_done);
    pthread_cond_destroy(&tp->cv_work);
    pthread_mutex_destroy(&tp->mu);
    free(tp);
}

int tp_size(const struct threadpool *tp) { return tp->n; }

void tp_run(struct threadpool *tp, tp_fn fn, void *ctx)
{
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (tp->pin && !(tp->caller_pinned && pthread_equal(tp->caller, pthread_self()))) {
        tp->caller_saved = pthread_getaffinity_np(pthread_self(), sizeof tp->caller_before,
                                                  &tp->caller_before) == 0;
        tp_pin_self(&tp->caller_cpus);
        tp->caller = pthread_self();
        tp->caller_pinned = 1;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->slots_done, 0, memory_order_relaxed);
    /* release: a thread whose claim reads this 0 (or a later claim's value)
     * sees fn, ctx and slots_done above. A worker late from the last run
     * may claim here before the generation moves; it runs this run's slot. */
    atomic_store_explicit(&tp->next_slot, 0, memory_order_release);
    /* seq_cst: pairs with the sleepers' increment in tp_wait_work, so a
     * worker that went to sleep before this store is always woken. */
    atomic_fetch_add(&tp->gen, 1);
    if (atomic_load(&tp->worker_sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv_work);
        pthread_mutex_unlock(&tp->mu);
    }
    tp_run_slots(tp);
    tp_wait_done(tp);
}
