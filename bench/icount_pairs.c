/* Instructions per alloc/free pair through the C ABI on the simulated device, counted by callgrind:
 * a measure that does not move with the machine's load, for comparing two builds (bench/icount_ab.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
void* streamalloc_malloc(size_t, int, void*);
void streamalloc_free(void*, size_t, int, void*);
void streamalloc_record_stream(void*, void*);
int streamalloc_configure(const char*);
int main(int argc, char** argv) {
  long n = atol(argv[2]);
  int cross = argv[1][0] == 'c';
  size_t bytes = argc > 3 ? (size_t)atol(argv[3]) : 4096;
  if (streamalloc_configure("backend:sim") != 0) return 2;
  void* s1 = (void*)(uintptr_t)1; void* s2 = (void*)(uintptr_t)2;
  for (long i = 0; i < n; ++i) {
    void* p = streamalloc_malloc(bytes, 0, s1);
    if (!p) return 3;
    if (cross) streamalloc_record_stream(p, s2);
    streamalloc_free(p, bytes, 0, s1);
  }
  return 0;
}
