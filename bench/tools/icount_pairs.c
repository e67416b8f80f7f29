/* Instructions per alloc/free pair through the C ABI on the simulated device, counted by callgrind:
 * a measure that does not move with the machine's load, for comparing two builds (bench/tools/icount_ab.sh).
 *
 *   icount_pairs same|cross N [BYTES] [OTHERS]
 *                                       N pairs of BYTES (default 4096) on one stream; `cross` records
 *                                       each block on a second stream before its free. OTHERS (default
 *                                       0) more streams allocate and free one block each first, as
 *                                       the other streams of a long-running process would have
 *   icount_pairs turns N [STREAMS]      N turns of the `many_streams` benchmark: one stream (round robin
 *                                       over STREAMS, default 1) allocates a working set of 22 blocks,
 *                                       64 KiB to 16 MiB, then frees it; 22 pairs per turn */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
void* streamalloc_malloc(size_t, int, void*);
void streamalloc_free(void*, size_t, int, void*);
void streamalloc_record_stream(void*, void*);
int streamalloc_configure(const char*);

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
/* bench/scenarios/bench_many_streams.cpp's working set */
static const size_t kWorkingSet[22] = {12 * MIB,  8 * MIB,   2 * MIB,   2 * MIB,   2 * MIB,   2 * MIB,
                                       512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB,
                                       512 * KIB, 512 * KIB, 64 * KIB,  64 * KIB,  64 * KIB,  64 * KIB,
                                       64 * KIB,  64 * KIB,  64 * KIB,  16 * MIB};

static int turns(long n, long streams) {
  void* held[22];
  for (long t = 0; t < n; ++t) {
    void* stream = (void*)(uintptr_t)(1 + t % streams);
    for (int i = 0; i < 22; ++i) {
      held[i] = streamalloc_malloc(kWorkingSet[i], 0, stream);
      if (!held[i]) return 3;
    }
    for (int i = 0; i < 22; ++i) streamalloc_free(held[i], kWorkingSet[i], 0, stream);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  long n = atol(argv[2]);
  if (streamalloc_configure("backend:sim") != 0) return 2;
  if (argv[1][0] == 't') return turns(n, argc > 3 ? atol(argv[3]) : 1);
  int cross = argv[1][0] == 'c';
  size_t bytes = argc > 3 ? (size_t)atol(argv[3]) : 4096;
  long others = argc > 4 ? atol(argv[4]) : 0;
  for (long k = 0; k < others; ++k) {
    void* other = (void*)(uintptr_t)(3 + k);
    void* p = streamalloc_malloc(4096, 0, other);
    if (!p) return 3;
    streamalloc_free(p, 4096, 0, other);
  }
  void* s1 = (void*)(uintptr_t)1;
  void* s2 = (void*)(uintptr_t)2;
  for (long i = 0; i < n; ++i) {
    void* p = streamalloc_malloc(bytes, 0, s1);
    if (!p) return 3;
    if (cross) streamalloc_record_stream(p, s2);
    streamalloc_free(p, bytes, 0, s1);
  }
  return 0;
}
