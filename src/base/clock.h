/* clock.h - seconds on CLOCK_MONOTONIC, what every elapsed time and event
 * stamp in cllm is measured in (the wall clock can step under NTP). */
#ifndef CLLM_BASE_CLOCK_H
#define CLLM_BASE_CLOCK_H

#include <time.h>

static inline double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
