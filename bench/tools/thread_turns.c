/* Threads taking turns on the simulated device: how many of their allocations stay on their stream's
 * own shard, how often they take the device lock and gather stats headroom. T threads, each with its
 * own stream, keep up to LIVE blocks each of the small_mlp server's tensor sizes (a batch of 1 to 64
 * rows of 512 or 2048 floats) and allocate or free one per turn; a seeded generator picks whose turn it
 * is, and the other threads wait, so the interleaving of T concurrent threads repeats exactly on any
 * machine (the counts too, but for the decisions that read the coarse clock).
 *
 *   thread_turns T TURNS [LIVE]     (STREAMALLOC_CONF: streamalloc's options, default backend:sim)
 *
 * Prints the allocations, the share served by their shard alone, device-lock acquisitions and headroom
 * gathers per allocation, the share of frees that took the device lock, fences recorded per allocation,
 * and the peak reserved bytes. bench/tools/thread_turns_ab.sh compares two builds. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void* streamalloc_malloc(size_t, int, void*);
void streamalloc_free(void*, size_t, int, void*);
int streamalloc_configure(const char*);
char* streamalloc_stats_json(int);

enum { kMaxThreads = 64, kMaxLive = 16 };

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next_random(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int threads, live_max = 6;
static void* held[kMaxThreads][kMaxLive];
static size_t held_bytes[kMaxThreads][kMaxLive];
static int live[kMaxThreads];
static uint64_t draw[kMaxThreads][2]; /* the scheduler's random numbers for the thread's next turn */
static int turn = -1, turn_done = 0, quit = 0;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

static int take_turn(int k) {
  void* stream = (void*)(uintptr_t)(1 + k);
  const uint64_t a = draw[k][0], b = draw[k][1];
  if (live[k] < live_max && (live[k] == 0 || (a & 1))) {
    static const size_t widths[3] = {512, 2048, 2048};
    const size_t bytes = (1 + (b >> 8) % 64) * widths[(b >> 20) % 3] * sizeof(float);
    void* p = streamalloc_malloc(bytes, 0, stream);
    if (p == NULL) return 1;
    held[k][live[k]] = p;
    held_bytes[k][live[k]] = bytes;
    ++live[k];
  } else {
    const int i = (int)((a >> 8) % (uint64_t)live[k]);
    streamalloc_free(held[k][i], held_bytes[k][i], 0, stream);
    --live[k];
    held[k][i] = held[k][live[k]];
    held_bytes[k][i] = held_bytes[k][live[k]];
  }
  return 0;
}

static void* thread_main(void* arg) {
  const int k = (int)(intptr_t)arg;
  pthread_mutex_lock(&mutex);
  for (;;) {
    while (turn != k && !quit) pthread_cond_wait(&changed, &mutex);
    if (quit) break;
    pthread_mutex_unlock(&mutex);
    const int failed = take_turn(k);
    pthread_mutex_lock(&mutex);
    if (failed) quit = 1;
    turn = -1;
    turn_done = 1;
    pthread_cond_broadcast(&changed);
  }
  pthread_mutex_unlock(&mutex);
  return NULL;
}

/* The number after "KEY": in the stats JSON, 0 when absent. */
static long long stat(const char* json, const char* key) {
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\":", key);
  const char* at = strstr(json, quoted);
  return at == NULL ? 0 : atoll(at + strlen(quoted));
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: thread_turns T TURNS [LIVE]\n");
    return 2;
  }
  threads = atoi(argv[1]);
  const long turns = atol(argv[2]);
  if (argc > 3) live_max = atoi(argv[3]);
  if (threads < 1 || threads > kMaxThreads || live_max < 1 || live_max > kMaxLive) return 2;
  const char* conf = getenv("STREAMALLOC_CONF");
  if (streamalloc_configure(conf != NULL && *conf ? conf : "backend:sim") != 0) return 2;
  pthread_t ids[kMaxThreads];
  for (int k = 0; k < threads; ++k) pthread_create(&ids[k], NULL, thread_main, (void*)(intptr_t)k);
  for (long t = 0; t < turns && !quit; ++t) {
    const int k = (int)(next_random() % (uint64_t)threads);
    draw[k][0] = next_random();
    draw[k][1] = next_random();
    pthread_mutex_lock(&mutex);
    turn_done = 0;
    turn = k;
    pthread_cond_broadcast(&changed);
    while (!turn_done) pthread_cond_wait(&changed, &mutex);
    pthread_mutex_unlock(&mutex);
  }
  pthread_mutex_lock(&mutex);
  const int failed = quit;
  quit = 1;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&mutex);
  for (int k = 0; k < threads; ++k) pthread_join(ids[k], NULL);
  if (failed) {
    fprintf(stderr, "thread_turns: an allocation failed\n");
    return 3;
  }
  const char* json = streamalloc_stats_json(0);
  const double allocs = (double)stat(json, "allocation.all.allocated");
  const double frees = (double)stat(json, "frees_cached") + (double)stat(json, "frees_device_locked");
  printf(
      "threads %d allocations %.0f cached_share %.3f device_locks_per_alloc %.3f gathers_per_alloc %.3f "
      "locked_free_share %.3f fences_per_alloc %.3f peak_reserved_mib %.1f\n",
      threads, allocs, stat(json, "allocations_cached") / allocs, stat(json, "device_lock_acquisitions") / allocs,
      stat(json, "headroom_gathers") / allocs, frees > 0 ? stat(json, "frees_device_locked") / frees : 0.0,
      stat(json, "fences_recorded") / allocs, stat(json, "reserved_bytes.all.peak") / 1048576.0);
  return 0;
}
