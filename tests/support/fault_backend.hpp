// FaultBackend: a Backend wrapper that fails chosen calls, for fault-injection tests. Every call is
// forwarded to the wrapped backend unless it is the one chosen to fail, which throws
// Error(kBackend, "injected ...") as a real device error would. refuse_maps() makes map_pages return
// false instead, as a full device does. during_reserve() runs a test's code inside reserve (which the
// cache calls with its device lock held), to hold that lock for as long as the test needs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "streamalloc/backend.hpp"

namespace streamalloc::testing {

class FaultBackend final : public Backend {
 public:
  enum class Op {
    kReserve,
    kCreateEvent,
    kRecordEvent,
    kQueryEvent,
    kQueryStream,
    kSynchronizeEvent,
    kStreamWait,
    kMemset
  };
  // The virtual-memory calls, apart: workloads that enumerate Op need not know them.
  enum class VmOp { kReserveAddressRange, kMapPages, kUnmapPages, kReleaseAddressRange };

  explicit FaultBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Fail the `nth` next call of `op` (1 = the next one).
  void fail(Op op, int nth = 1) { countdown_[op] = nth; }
  void fail(VmOp op, int nth = 1) { vm_countdown_[op] = nth; }
  // The next `count` map_pages calls return false without reaching the wrapped backend.
  void refuse_maps(int count) { maps_to_refuse_ = count; }
  int injected() const { return injected_; }  // COUNT of failures thrown and maps refused
  void during_reserve(std::function<void()> hook) { reserve_hook_ = std::move(hook); }

  std::string name() const override { return inner_->name(); }
  int device_count() const override { return inner_->device_count(); }
  void* reserve(int device, std::size_t bytes) override {
    trip(Op::kReserve, "reserve");
    if (reserve_hook_) reserve_hook_();
    return inner_->reserve(device, bytes);
  }
  void release(int device, void* ptr, std::size_t bytes) override { inner_->release(device, ptr, bytes); }
  Event create_event(int device) override {
    trip(Op::kCreateEvent, "create_event");
    return inner_->create_event(device);
  }
  void destroy_event(int device, Event event) override { inner_->destroy_event(device, event); }
  void record_event(int device, Event event, Stream stream) override {
    trip(Op::kRecordEvent, "record_event");
    inner_->record_event(device, event, stream);
  }
  bool query_event(int device, Event event) override {
    trip(Op::kQueryEvent, "query_event");
    return inner_->query_event(device, event);
  }
  bool query_stream(int device, Stream stream) override {
    trip(Op::kQueryStream, "query_stream");
    return inner_->query_stream(device, stream);
  }
  void synchronize_event(int device, Event event) override {
    trip(Op::kSynchronizeEvent, "synchronize_event");
    inner_->synchronize_event(device, event);
  }
  void stream_wait_event(int device, Stream stream, Event event) override {
    trip(Op::kStreamWait, "stream_wait_event");
    inner_->stream_wait_event(device, stream, event);
  }
  bool is_capturing(int device, Stream stream) override { return inner_->is_capturing(device, stream); }
  int relax_capture_mode() override { return inner_->relax_capture_mode(); }
  void restore_capture_mode(int previous) override { inner_->restore_capture_mode(previous); }
  void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) override {
    trip(Op::kMemset, "memset_async");
    inner_->memset_async(device, ptr, value, bytes, stream);
  }
  DeviceMemoryInfo memory_info(int device) override { return inner_->memory_info(device); }
  int stream_device(Stream stream) override { return inner_->stream_device(stream); }
  bool supports_virtual_memory(int device) override { return inner_->supports_virtual_memory(device); }
  std::size_t vm_granularity(int device) override { return inner_->vm_granularity(device); }
  void* reserve_address_range(int device, std::size_t bytes) override {
    trip(vm_countdown_, VmOp::kReserveAddressRange, "reserve_address_range");
    return inner_->reserve_address_range(device, bytes);
  }
  bool map_pages(int device, void* at, std::size_t bytes) override {
    trip(vm_countdown_, VmOp::kMapPages, "map_pages");
    if (maps_to_refuse_ > 0) {
      --maps_to_refuse_;
      ++injected_;
      return false;
    }
    return inner_->map_pages(device, at, bytes);
  }
  void unmap_pages(int device, void* at, std::size_t bytes) override {
    trip(vm_countdown_, VmOp::kUnmapPages, "unmap_pages");
    inner_->unmap_pages(device, at, bytes);
  }
  // Forwarded, never failed: it takes back what a growth mapped after a later map of the same growth
  // failed or was refused, and a fault there would be a second one on top of that.
  void unmap_unused_pages(int device, void* at, std::size_t bytes) override {
    inner_->unmap_unused_pages(device, at, bytes);
  }
  int export_piece(int device, void* piece) override { return inner_->export_piece(device, piece); }
  void release_address_range(int device, void* base, std::size_t bytes) override {
    trip(vm_countdown_, VmOp::kReleaseAddressRange, "release_address_range");
    inner_->release_address_range(device, base, bytes);
  }

 private:
  void trip(Op op, const char* call) { trip(countdown_, op, call); }
  template <typename Key>
  void trip(std::map<Key, int>& countdown, Key op, const char* call) {
    auto it = countdown.find(op);
    if (it == countdown.end() || --it->second > 0) return;
    countdown.erase(it);
    ++injected_;
    throw Error(ErrorCode::kBackend, std::string("injected ") + call + " failure");
  }

  std::shared_ptr<Backend> inner_;
  std::map<Op, int> countdown_;
  std::map<VmOp, int> vm_countdown_;
  int maps_to_refuse_ = 0;
  int injected_ = 0;
  std::function<void()> reserve_hook_;
};

}  // namespace streamalloc::testing
