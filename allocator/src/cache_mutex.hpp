// CacheMutex: the device cache's lock; option `lock` chooses how a waiter waits.
//
// Why not plain std::mutex: a cached alloc or free holds the lock for a few tens of nanoseconds, while
// putting a thread to sleep on a futex and waking it costs microseconds. Threads allocating at once on
// their own streams then form a convoy of sleeps and wake-ups (8 threads on the 16-core H200 machine
// did 0.07x the pairs per second of one thread). `lock:adaptive` uses glibc's adaptive mutex, which
// spins a bounded number of times before it sleeps: enough to cover a cached operation, and it still
// sleeps while the holder is slow (cudaMalloc, a host sync). `lock:blocking` sleeps at once, which is
// better when runnable threads outnumber cores. Both are the same pthread mutex, so the hot path has no
// branch on the mode. Without glibc's adaptive type both behave as `blocking`.
#pragma once

#include <pthread.h>

#include "streamalloc/options.hpp"

namespace streamalloc {

class CacheMutex {
 public:
  explicit CacheMutex(LockMode mode) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP  // glibc, with _GNU_SOURCE (g++ and clang++ define it)
    pthread_mutexattr_settype(&attr, mode == LockMode::kAdaptive ? PTHREAD_MUTEX_ADAPTIVE_NP : PTHREAD_MUTEX_NORMAL);
#else
    (void)mode;
#endif
    pthread_mutex_init(&mutex_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~CacheMutex() { pthread_mutex_destroy(&mutex_); }
  CacheMutex(const CacheMutex&) = delete;
  CacheMutex& operator=(const CacheMutex&) = delete;

  // Lockable. pthread_mutex_lock fails only for error-checking or robust mutexes, which this is not.
  void lock() { pthread_mutex_lock(&mutex_); }
  bool try_lock() { return pthread_mutex_trylock(&mutex_) == 0; }
  void unlock() { pthread_mutex_unlock(&mutex_); }

 private:
  pthread_mutex_t mutex_;
};

}  // namespace streamalloc
