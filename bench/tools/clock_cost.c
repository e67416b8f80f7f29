/* What one clock read costs on this host, ns per call (three rounds of 20 M calls each): the coarse
 * monotonic clock (block ages on the fast path), the TSC, and the precise monotonic clock.
 * Usage: cc -O2 bench/tools/clock_cost.c -o /tmp/clock_cost && /tmp/clock_cost */
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  const int n = 20000000;
  volatile long sink = 0;
  struct timespec ts;
  for (int round = 0; round < 3; ++round) {
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
      sink += ts.tv_nsec;
    }
    const double t1 = now();
    for (int i = 0; i < n; ++i) sink += (long)__rdtsc();
    const double t2 = now();
    for (int i = 0; i < n; ++i) {
      clock_gettime(CLOCK_MONOTONIC, &ts);
      sink += ts.tv_nsec;
    }
    const double t3 = now();
    printf("CLOCK_MONOTONIC_COARSE %.2f ns  rdtsc %.2f ns  CLOCK_MONOTONIC %.2f ns\n", (t1 - t0) / n * 1e9,
           (t2 - t1) / n * 1e9, (t3 - t2) / n * 1e9);
  }
  return 0;
}
