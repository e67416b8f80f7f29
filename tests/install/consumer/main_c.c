/* The C ABI (libstreamalloc.so) from an installed package, on the simulated device. */
#include <stdio.h>

#include <streamalloc/streamalloc.h>

int main(void) {
  if (streamalloc_configure("backend:sim") != 0) {
    fprintf(stderr, "consumer_c: %s\n", streamalloc_last_error());
    return 1;
  }
  streamalloc_init(1);
  void* p = streamalloc_malloc(4096, 0, 0);
  if (p == NULL) {
    fprintf(stderr, "consumer_c: %s\n", streamalloc_last_error());
    return 1;
  }
  streamalloc_free(p, 4096, 0, 0);
  printf("consumer_c: C ABI allocation served and freed\n");
  return 0;
}
