#include "sync_checker.hpp"

#include <algorithm>

namespace streamalloc {

void SyncChecker::merge(VectorClock& into, const VectorClock& from) {
  for (const auto& [stream, tick] : from) {
    Tick& mine = into[stream];
    mine = std::max(mine, tick);
  }
}

SyncChecker::Tick SyncChecker::tick(Stream producer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return clocks_[producer][producer];
}

void SyncChecker::on_event_record(std::uintptr_t event, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  VectorClock& clock = clocks_[stream];
  ++clock[stream];
  events_[event] = clock;
}

void SyncChecker::on_event_wait(std::uintptr_t event, Stream waiter) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return;  // an event never recorded: waiting on it orders nothing
  merge(clocks_[waiter], it->second);
}

// The host waited for everything enqueued on `stream` so far: all work enqueued later, on any
// stream, comes after it. Ticking first makes the producer's writes before the sync count.
void SyncChecker::on_stream_synchronize(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  VectorClock& clock = clocks_[stream];
  ++clock[stream];
  merge(host_, clock);
}

void SyncChecker::on_device_synchronize() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [stream, clock] : clocks_) {
    ++clock[stream];
    merge(host_, clock);
  }
}

bool SyncChecker::ordered_after(Stream consumer, Stream producer, Tick allocated_at) const {
  if (consumer == producer) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  Tick seen = 0;
  if (auto c = clocks_.find(consumer); c != clocks_.end()) {
    if (auto t = c->second.find(producer); t != c->second.end()) seen = t->second;
  }
  if (auto h = host_.find(producer); h != host_.end()) seen = std::max(seen, h->second);
  return seen > allocated_at;
}

}  // namespace streamalloc
