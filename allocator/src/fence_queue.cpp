#include "fence_queue.hpp"

#include <algorithm>

namespace streamalloc {

EventPool::~EventPool() {
  for (Event event : free_) {
    try {
      backend_.destroy_event(device_, event);
    } catch (...) {
      // Destroying events at teardown must not throw; the runtime may already be gone.
    }
  }
}

Event EventPool::acquire() {
  if (!free_.empty()) {
    Event event = free_.back();
    free_.pop_back();
    return event;
  }
  return backend_.create_event(device_);
}

void FenceQueue::leave_as_user(const Block* block) {
  auto leave = [&](std::vector<Block*>& list) {
    auto it = std::find(list.begin(), list.end(), block);
    if (it == list.end()) return false;
    list.erase(it);
    note_pending_released(block);
    return true;
  };
  if (leave(open_pending_)) return;
  for (Fence& fence : in_flight_) {
    if (leave(fence.pending)) return;
  }
}

bool FenceQueue::close_batch(Backend& backend, EventPool& pool, int device, Clock::time_point now) {
  if (!has_open_batch()) return false;
  Fence fence;
  fence.seq = open_seq_;
  fence.event = pool.acquire();
  try {
    backend.record_event(device, fence.event, stream_);
  } catch (...) {
    pool.release(fence.event);  // the batch stays open; a later close retries
    throw;
  }
  fence.pending.swap(open_pending_);
  fence.recorded_at = now;
  last_recorded_at_ = fence.recorded_at;
  in_flight_.push_back(std::move(fence));
  ++open_seq_;
  open_has_members_.store(false, std::memory_order_relaxed);
  return true;
}

bool FenceQueue::complete_open_batch(Fence* out, Clock::time_point now) {
  if (!has_open_batch() || !in_flight_.empty()) return false;
  Fence fence;
  fence.seq = open_seq_;
  fence.pending.swap(open_pending_);
  fence.recorded_at = now;
  *out = std::move(fence);
  ++open_seq_;
  open_has_members_.store(false, std::memory_order_relaxed);
  mark_completed(out->seq);
  return true;
}

bool FenceQueue::pop_completed(Backend& backend, int device, Fence* out, std::uint64_t* queries) {
  if (in_flight_.empty()) return false;
  ++*queries;
  if (!backend.query_event(device, in_flight_.front().event)) return false;
  *out = std::move(in_flight_.front());
  in_flight_.pop_front();
  mark_completed(out->seq);
  return true;
}

bool FenceQueue::synchronize_oldest(Backend& backend, int device, Fence* out) {
  if (in_flight_.empty()) return false;
  backend.synchronize_event(device, in_flight_.front().event);
  *out = std::move(in_flight_.front());
  in_flight_.pop_front();
  mark_completed(out->seq);
  return true;
}

const Fence* FenceQueue::find(std::uint64_t seq) const {
  for (const Fence& fence : in_flight_) {
    if (fence.seq == seq) return &fence;
  }
  return nullptr;
}

}  // namespace streamalloc
