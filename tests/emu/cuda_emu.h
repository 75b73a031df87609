/* cuda_emu.h - runs a CUDA kernel written in the subset sample.cu keeps to
 * (shared memory and __syncthreads; no warp intrinsics, atomics or
 * cooperative groups) on the host, for test_sample_emu. One block at a
 * time; each thread is a ucontext fiber that runs until its next barrier.
 * Every phase between two barriers runs the threads in a freshly shuffled
 * order, so a missing barrier shows as a result that depends on the
 * schedule; a barrier that not every thread reaches, or that threads reach
 * at different lines, is reported and ends the run. Host code only. */
#ifndef CLLM_TESTS_EMU_CUDA_EMU_H
#define CLLM_TESTS_EMU_CUDA_EMU_H

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n)

struct emu_dim {
    unsigned x, y, z;
};
inline emu_dim threadIdx, blockIdx, blockDim;

inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The build compiles this with -ffp-contract=off: nothing is fused. */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned long long __float2ull_rn(float f) { return (unsigned long long)llrintf(f); }
inline void cuk_pdl_start() {}

struct emu_state {
    std::vector<ucontext_t> ctx;
    struct jump {
        jmp_buf b;
    };
    std::vector<jump> jb; /* a started thread's place at its barrier */
    jmp_buf main_jb;
    std::vector<bool> started;
    std::vector<std::vector<char>> stack;
    std::vector<int> st; /* 0 runnable, 1 at a barrier, 2 returned */
    std::vector<int> line;
    ucontext_t main;
    int cur = 0;
    std::function<void()> body;
    std::mt19937 rng{12345};
    bool failed = false;
};
inline emu_state emu;

/* Switches: swapcontext enters a thread's stack the first time; after
 * that _setjmp/_longjmp (no signal-mask system call per switch, which made
 * swapcontext the whole cost). */
inline void emu_sync(int line)
{
    emu.st[emu.cur] = 1;
    emu.line[emu.cur] = line;
    if (!_setjmp(emu.jb[emu.cur].b))
        _longjmp(emu.main_jb, 1);
}
#define __syncthreads() emu_sync(__LINE__)

inline void emu_entry()
{
    emu.body();
    emu.st[emu.cur] = 2;
    _longjmp(emu.main_jb, 1);
}

/* k<<<grid, block>>>(args...), block after block; false (with a message)
 * when a barrier was not reached alike by every thread. */
template <typename K, typename... A>
bool emu_launch(unsigned grid, unsigned block, unsigned seed, K k, A... args)
{
    const size_t stack_bytes = 256 << 10;
    emu.rng.seed(seed);
    emu.ctx.resize(block);
    emu.jb.resize(block);
    emu.started.assign(block, false);
    emu.stack.resize(block);
    emu.st.assign(block, 0);
    emu.line.assign(block, 0);
    emu.body = [&] { k(args...); };
    blockDim = {block, 1, 1};
    std::vector<unsigned> order;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        for (unsigned i = 0; i < block; i++) {
            emu.stack[i].resize(stack_bytes);
            getcontext(&emu.ctx[i]);
            emu.ctx[i].uc_stack.ss_sp = emu.stack[i].data();
            emu.ctx[i].uc_stack.ss_size = stack_bytes;
            emu.ctx[i].uc_link = &emu.main;
            makecontext(&emu.ctx[i], emu_entry, 0);
            emu.st[i] = 0;
            emu.started[i] = false;
        }
        for (;;) {
            order.clear();
            for (unsigned i = 0; i < block; i++)
                if (emu.st[i] == 0)
                    order.push_back(i);
            std::shuffle(order.begin(), order.end(), emu.rng);
            for (unsigned i : order) {
                emu.cur = (int)i;
                threadIdx = {i, 0, 0};
                if (_setjmp(emu.main_jb))
                    continue; /* back from thread i */
                if (!emu.started[i]) {
                    emu.started[i] = true;
                    swapcontext(&emu.main, &emu.ctx[i]);
                }
                _longjmp(emu.jb[i].b, 1);
            }
            unsigned waiting = 0, done = 0;
            for (unsigned i = 0; i < block; i++) {
                waiting += emu.st[i] == 1;
                done += emu.st[i] == 2;
            }
            if (done == block)
                break;
            if (done > 0) {
                fprintf(stderr, "emu: block %u: %u threads returned while %u wait at line %d\n",
                        b, done, waiting, emu.line[std::find(emu.st.begin(), emu.st.end(), 1) -
                                                   emu.st.begin()]);
                emu.failed = true;
                return false;
            }
            for (unsigned i = 1; i < block; i++)
                if (emu.line[i] != emu.line[0]) {
                    fprintf(stderr, "emu: block %u: thread 0 waits at line %d, thread %u at %d\n",
                            b, emu.line[0], i, emu.line[i]);
                    emu.failed = true;
                    return false;
                }
            for (unsigned i = 0; i < block; i++)
                emu.st[i] = 0;
        }
    }
    return true;
}

#endif
