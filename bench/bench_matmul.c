/* bench_matmul.c - throughput of the CPU matmul kernels against the memory
 * bandwidth floor.
 *
 *   bench_matmul [--quick] [--mem] [--isa scalar|avx2|avx512] [--threads 1,2]
 *                [--dtype NAME]
 *
 * --mem measures only the memory bandwidth and the thread pool; --dtype
 * only that weight type (dtype_name's spelling: bf16, q8_0, q4_k, ...).
 * CLLM_CPU_QDIRECT, CLLM_CPU_QPANEL and CLLM_CPU_BF16DOT choose kernels as
 * they do for the backend.
 * For every dtype, shape and thread count it reports weights streamed
 * (GB/s) and arithmetic rate (GFLOP/s, 2 per multiply-add) for n = 1
 * (decode) and n = 128 (prefill). Weights are cycled through enough copies
 * to exceed the last-level cache, so decode numbers are DRAM numbers, as in
 * a real model. It also measures the memory bandwidth itself (read-sum and
 * memcpy of 1 GiB, before and after the matmuls since on a shared host it
 * drifts), the fork-join cost of the thread pool, and a whole
 * Qwen3-0.6B-shaped model's matmuls per token (Q8_0 and bf16). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "backend/cpu/matmul.h"
#include "base/env.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "model/quant.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* Enough distinct weight bytes per measurement to defeat a 32 MB L3. */
#define COLD_BYTES (256u << 20)


static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_matmul: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint32_t rng = 12345;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

static void fill_weights(void *data, enum dtype dt, int64_t rows, int64_t cols)
{
    size_t rb = dtype_row_bytes(dt, cols);
    float *tmp = xmalloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)data + (size_t)r * rb;
        for (int64_t k = 0; k < cols; k++)
            tmp[k] = rnd();
        for (int64_t k = 0; k < cols; k++) {
            if (dt == DT_F32)
                ((float *)row)[k] = tmp[k];
            else if (dt == DT_F16)
                ((uint16_t *)row)[k] = f32_to_f16(tmp[k]);
            else if (dt == DT_BF16)
                ((uint16_t *)row)[k] = f32_to_bf16(tmp[k]);
        }
        if (dt == DT_Q8_0)
            quantize_row_q8_0(tmp, (struct block_q8_0 *)row, cols);
        if (quant_is_low_bit(dt))
            quant_quantize_row(dt, tmp, row, cols);
    }
    free(tmp);
}

/* ---- interference ---- */

/* CPU seconds used by everybody (from /proc/stat) and by us, so a section
 * can say how much of the machine other processes took meanwhile: on a
 * shared host that is the difference between a result and noise. */
struct load_probe {
    double all_busy_s, self_s;
};

static struct load_probe load_now(void)
{
    struct load_probe p = {0, 0};
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        unsigned long long v[8] = {0};
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 8) {
            unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
            p.all_busy_s = (double)busy / (double)sysconf(_SC_CLK_TCK);
        }
        fclose(f);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    p.self_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec * 1e-6;
    return p;
}

static void load_report(struct load_probe a, double t0)
{
    struct load_probe b = load_now();
    double wall = clock_now_s() - t0;
    double others = (b.all_busy_s - a.all_busy_s) - (b.self_s - a.self_s);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("other processes used %.0f%% of %ld CPUs during this section%s\n",
           100.0 * (others > 0 ? others : 0) / (wall * (double)ncpu), ncpu,
           others > 0.05 * wall ? " (numbers above are disturbed)" : "");
}

/* ---- memory bandwidth ---- */

struct bw_job {
    uint8_t *src, *dst;
    size_t bytes;
    double sums[64];
};

__attribute__((target("avx2"))) static double bw_sum_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    int64_t v[4];
    _mm256_storeu_si256((__m256i *)v, s);
    return (double)(v[0] + v[1] + v[2] + v[3]);
}

static double bw_sum_scalar(const uint8_t *p, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        s += v;
    }
    return (double)s;
}

static void bw_read_worker(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    size_t part = j->bytes / (size_t)nth / 4096 * 4096;
    const uint8_t *p = j->src + part * (size_t)ith;
    j->sums[ith] = __builtin_cpu_supports("avx2") ? bw_sum_avx2(p, part) : bw_sum_scalar(p, part);
}

static void bw_copy_worker(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    size_t part = j->bytes / (size_t)nth / 4096 * 4096;
    memcpy(j->dst + part * (size_t)ith, j->src + part * (size_t)ith, part);
}

/* Returns the read bandwidth in GB/s: the decode floor. */
static double bench_bandwidth(struct threadpool *tp)
{
    struct bw_job j = {.bytes = (size_t)GIB};
    j.src = xmalloc(j.bytes);
    j.dst = xmalloc(j.bytes);
    memset(j.src, 1, j.bytes);
    memset(j.dst, 2, j.bytes);
    double best_r = 1e9, best_c = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = clock_now_s();
        tp_run(tp, bw_read_worker, &j);
        double t1 = clock_now_s();
        tp_run(tp, bw_copy_worker, &j);
        double t2 = clock_now_s();
        best_r = t1 - t0 < best_r ? t1 - t0 : best_r;
        best_c = t2 - t1 < best_c ? t2 - t1 : best_c;
    }
    printf("memory  threads=%d  read-sum 1 GiB: %6.1f GB/s   memcpy 1 GiB: %6.1f GB/s "
           "(read+write)\n",
           tp_size(tp), j.bytes / best_r / 1e9, 2.0 * j.bytes / best_c / 1e9);
    free(j.src);
    free(j.dst);
    return j.bytes / best_r / 1e9;
}

static void noop(void *ctx, int ith, int nth)
{
    (void)ctx;
    (void)ith;
    (void)nth;
}

static void bench_forkjoin(struct threadpool *tp)
{
    const int runs = 200000;
    double t0 = clock_now_s();
    for (int i = 0; i < runs; i++)
        tp_run(tp, noop, NULL);
    printf("tp_run  threads=%d  empty fork-join: %.2f us\n", tp_size(tp),
           (clock_now_s() - t0) / runs * 1e6);
}

/* ---- matmul ---- */

struct wset {
    enum dtype dt;
    int64_t rows, cols;
    int copies;
    void **data;
};

static struct wset wset_make(enum dtype dt, int64_t rows, int64_t cols)
{
    struct wset s = {dt, rows, cols, 0, NULL};
    size_t bytes = dtype_row_bytes(dt, cols) * (size_t)rows;
    s.copies = (int)((COLD_BYTES + bytes - 1) / bytes);
    if (s.copies < 2)
        s.copies = 2; /* cycling two big matrices also defeats the cache */
    if (bytes > (512u << 20))
        s.copies = 1; /* already ~20x the L3 */
    s.data = calloc((size_t)s.copies, sizeof *s.data);
    s.data[0] = xmalloc(bytes);
    fill_weights(s.data[0], dt, rows, cols);
    for (int i = 1; i < s.copies; i++) {
        s.data[i] = xmalloc(bytes);
        memcpy(s.data[i], s.data[0], bytes);
    }
    return s;
}

static void wset_free(struct wset *s)
{
    for (int i = 0; i < s->copies; i++)
        free(s->data[i]);
    free(s->data);
}

/* Seconds per call, best of a few timed batches of at least min_s. */
static double time_matmul(struct cpu_matmul *mm, struct wset *s, int n, const float *x,
                          float *out, double min_s)
{
    struct err e;
    double best = 1e30;
    int call = 0;
    /* Best of several batches: other processes on a shared host only ever
     * make a batch slower. */
    for (int batch = 0; batch < 5; batch++) {
        int calls = 0;
        double t0 = clock_now_s(), t;
        do {
            struct tensor w = {s->dt, s->rows, s->cols, s->data[call++ % s->copies]};
            if (cpu_matmul(mm, out, x, n, &w, &e)) {
                fprintf(stderr, "bench_matmul: %s\n", e.msg);
                exit(1);
            }
            calls++;
            t = clock_now_s() - t0;
        } while (t < min_s);
        if (t / calls < best)
            best = t / calls;
    }
    return best;
}

static void bench_shape(struct cpu_matmul *mm, enum dtype dt, int64_t rows, int64_t cols,
                        double min_s, double read_gbs)
{
    struct wset s = wset_make(dt, rows, cols);
    size_t wbytes = dtype_row_bytes(dt, cols) * (size_t)rows;
    const int ns[2] = {1, 128};
    float *x = xmalloc(sizeof(float) * 128 * (size_t)cols);
    float *out = xmalloc(sizeof(float) * 128 * (size_t)rows);
    for (int64_t i = 0; i < 128 * cols; i++)
        x[i] = rnd();
    printf("%-5s %6lldx%-5lld thr=%d", dtype_name(dt), (long long)rows, (long long)cols,
           tp_size(mm->tp));
    for (int i = 0; i < 2; i++) {
        double t = time_matmul(mm, &s, ns[i], x, out, min_s);
        printf("   n=%-3d %8.3f ms %6.1f GB/s %7.1f GFLOP/s", ns[i], t * 1e3, wbytes / t / 1e9,
               2.0 * ns[i] * rows * cols / t / 1e9);
        if (ns[i] == 1)
            printf(" (%3.0f%% of read bw)", 100.0 * wbytes / t / 1e9 / read_gbs);
    }
    printf("\n");
    fflush(stdout);
    free(x);
    free(out);
    wset_free(&s);
}

/* ---- a whole model's matmuls ---- */

struct lin {
    int64_t rows, cols;
};

/* Qwen3-0.6B: 28 layers of q,k,v,o,gate,up,down and a tied 151936-row
 * output head. The head runs for one token per step, as in generation. */
static void bench_model(struct cpu_matmul *mm, enum dtype dt, int n_prefill, double read_gbs)
{
    const struct lin layer[7] = {{2048, 1024}, {1024, 1024}, {1024, 1024}, {1024, 2048},
                                 {3072, 1024}, {3072, 1024}, {1024, 3072}};
    const int n_layers = 28;
    struct tensor w[28 * 7 + 1];
    size_t total = 0;
    for (int l = 0; l < n_layers; l++) {
        for (int i = 0; i < 7; i++) {
            struct tensor *t = &w[l * 7 + i];
            *t = (struct tensor){dt, layer[i].rows, layer[i].cols, NULL};
            size_t b = dtype_row_bytes(dt, t->cols) * (size_t)t->rows;
            void *p = xmalloc(b);
            fill_weights(p, dt, t->rows, t->cols);
            t->data = p;
            total += b;
        }
    }
    struct tensor *head = &w[n_layers * 7];
    *head = (struct tensor){dt, 151936, 1024, NULL};
    size_t hb = dtype_row_bytes(dt, 1024) * 151936;
    void *hp = xmalloc(hb);
    fill_weights(hp, dt, 151936, 1024);
    head->data = hp;
    total += hb;

    float *x = xmalloc(sizeof(float) * (size_t)n_prefill * 3072);
    float *out = xmalloc(sizeof(float) * (size_t)n_prefill * 151936);
    for (int64_t i = 0; i < (int64_t)n_prefill * 3072; i++)
        x[i] = rnd();
    struct err e;
    for (int pass = 0; pass < 2; pass++) {
        int n = pass == 0 ? 1 : n_prefill;
        double best = 1e30;
        for (int rep = 0; rep < (n == 1 ? 6 : 3); rep++) {
            double t0 = clock_now_s();
            for (int i = 0; i < n_layers * 7; i++)
                cpu_matmul(mm, out, x, n, &w[i], &e);
            cpu_matmul(mm, out, x, 1, head, &e);
            double t = clock_now_s() - t0;
            best = t < best ? t : best;
        }
        if (n == 1)
            printf("model qwen3-0.6b-shaped %s thr=%d decode:  %6.1f ms/token = %5.1f tok/s, "
                   "%.0f MB weights -> %5.1f GB/s (%.0f%% of read bw; floor %.1f tok/s)\n",
                   dtype_name(dt), tp_size(mm->tp), best * 1e3, 1.0 / best, total / 1e6,
                   total / best / 1e9, 100.0 * total / best / 1e9 / read_gbs,
                   read_gbs * 1e9 / total);
        else
            printf("model qwen3-0.6b-shaped %s thr=%d prefill: %6.1f ms for %d tokens = %6.1f "
                   "tok/s (matmuls only)\n",
                   dtype_name(dt), tp_size(mm->tp), best * 1e3, n, n / best);
        fflush(stdout);
    }
    for (int i = 0; i <= n_layers * 7; i++)
        free((void *)w[i].data);
    free(x);
    free(out);
}

static enum cpu_isa parse_isa(const char *s)
{
    int i = cpu_isa_from_name(s);
    return i < 0 ? CPU_ISA_AVX512 : (enum cpu_isa)i;
}

int main(int argc, char **argv)
{
    int quick = 0, mem_only = 0, only = -1;
    struct err isa_err;
    int detected = cpu_isa_detect(&isa_err);
    if (detected < 0) {
        fprintf(stderr, "bench_matmul: %s\n", isa_err.msg);
        return 2;
    }
    enum cpu_isa isa = (enum cpu_isa)detected;
    int threads[8] = {1, 2}, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--mem") == 0) {
            mem_only = 1;
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            enum cpu_isa want = parse_isa(argv[++i]);
            isa = want < cpu_isa_hw() ? want : cpu_isa_hw();
        } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char *name = argv[++i];
            for (int dt = 0; dt < DT_COUNT; dt++)
                if (strcmp(dtype_name((enum dtype)dt), name) == 0)
                    only = dt;
            if (only < 0) {
                fprintf(stderr, "bench_matmul: unknown --dtype '%s' (bf16, q8_0, q4_k, ...)\n",
                        name);
                return 2;
            }
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            n_threads = 0;
            for (char *p = argv[++i]; *p && n_threads < 8;) {
                threads[n_threads++] = (int)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] [--mem] [--isa scalar|avx2|avx512] [--threads 1,2] "
                    "[--dtype NAME]\n",
                    argv[0]);
            return 2;
        }
    }
    printf("bench_matmul: isa %s (hardware %s, avx512 vnni %s)\n", cpu_isa_name(isa),
           cpu_isa_name(cpu_isa_hw()), cpu_has_avx512_vnni() ? "yes" : "no");
    const struct lin shapes[4] = {{1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}};
    for (int ti = 0; ti < n_threads; ti++) {
        struct err e;
        struct threadpool *tp = tp_create(threads[ti], &e);
        if (!tp) {
            fprintf(stderr, "bench_matmul: %s\n", e.msg);
            return 1;
        }
        struct cpu_matmul mm;
        if (cpu_matmul_init(&mm, tp, isa, &e)) {
            fprintf(stderr, "bench_matmul: %s\n", e.msg);
            return 1;
        }
        /* as the backend: CLLM_CPU_QDIRECT=0 unpacks Q4_K for decode too */
        mm.direct = env_flag("CLLM_CPU_QDIRECT", true);
        mm.panel = env_flag("CLLM_CPU_QPANEL", true);
        if (!env_flag("CLLM_CPU_BF16DOT", true))
            mm.bf16dot = 0;
        struct load_probe probe = load_now();
        double t_section = clock_now_s();
        bench_forkjoin(tp);
        double read_gbs = bench_bandwidth(tp);
        if (mem_only) {
            load_report(probe, t_section);
            tp_destroy(tp);
            continue;
        }
        for (int dt = 0; dt < DT_COUNT; dt++)
            for (int s = 0; s < 4 && (only < 0 || dt == only); s++)
                bench_shape(&mm, (enum dtype)dt, shapes[s].rows, shapes[s].cols,
                            quick ? 0.05 : 0.2, read_gbs);
        if (only < 0 || only == DT_Q8_0)
            bench_model(&mm, DT_Q8_0, 128, read_gbs);
        if (only == DT_BF16 || (only < 0 && !quick))
            bench_model(&mm, DT_BF16, 128, read_gbs);
        /* On shared hosts the bandwidth drifts; a second sample shows by how much. */
        bench_bandwidth(tp);
        load_report(probe, t_section);
        cpu_matmul_free(&mm);
        tp_destroy(tp);
    }
    return 0;
}
