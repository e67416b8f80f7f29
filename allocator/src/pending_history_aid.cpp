// pending_history:N as a debugging aid: the last N changes of each stream's pending bytes.
#include <map>

#include <spdlog/fmt/fmt.h>

#include "debug_aid.hpp"
#include "pending_recorder.hpp"

namespace streamalloc {
namespace {

class PendingHistoryAid final : public DebugAid {
 public:
  explicit PendingHistoryAid(std::size_t capacity) : recorder_(capacity) {}

  void on_pending_changed(Clock::time_point when, Stream stream, const StreamPending& now) override {
    recorder_.record(when, stream, now);
  }
  bool pending_history(PendingHistory* out) const override {
    *out = recorder_.history();
    return true;
  }
  // Recorded where a stream's pending stats change, so each stream's newest sample still in the ring
  // is its pending stats now.
  void validate(const AidCheck& check) const override {
    const PendingHistory history = recorder_.history();
    std::map<Stream, const PendingSample*> newest;
    for (const PendingSample& s : history.samples) newest[s.stream] = &s;
    for (const auto& [stream, sample] : newest) {
      const StreamPending* now = check.pending_of(stream);
      if (now == nullptr || sample->pending_bytes != now->pending_bytes.current ||
          sample->pending_blocks != now->pending_blocks.current) {
        check.broken(
            "pending history of stream " + hex(stream) + " ends at " + std::to_string(sample->pending_bytes) +
            " bytes, but the stream has " +
            (now == nullptr ? std::string("no fence queue") : std::to_string(now->pending_bytes.current) + " pending"));
      }
    }
    if (history.samples.size() > history.capacity || history.recorded < history.samples.size()) {
      check.broken("pending history holds " + std::to_string(history.samples.size()) + " samples of capacity " +
                   std::to_string(history.capacity));
    }
  }

 private:
  static std::string hex(Stream value) { return fmt::format("{:#x}", value); }

  PendingRecorder recorder_;
};

}  // namespace

std::unique_ptr<DebugAid> make_pending_history_aid(const Options& options) {
  if (options.pending_history == 0) return nullptr;
  return std::make_unique<PendingHistoryAid>(options.pending_history);
}

}  // namespace streamalloc
