// Threads for tests: a reusable barrier, and a worker thread that runs one function at a time.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace streamalloc::testing_support {

// All of `count` threads wait until the last arrives; reusable round after round.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long round = round_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++round_;
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [&] { return round_ != round; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int count_;
  int arrived_ = 0;
  long round_ = 0;
};

// Runs functions on one thread of its own, one at a time, each to its end before run() returns.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> work) {
    std::unique_lock<std::mutex> lock(mutex_);
    work_ = std::move(work);
    wake_.notify_all();
    wake_.wait(lock, [this] { return !work_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || static_cast<bool>(work_); });
      if (stop_) return;
      work_();
      work_ = nullptr;
      wake_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> work_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace streamalloc::testing_support
