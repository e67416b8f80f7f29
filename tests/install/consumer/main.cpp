// streamalloc's C++ Allocator on the simulated device, from an installed package: one block used on a
// second stream and freed, its snapshot written for streamalloc_report.
//   consumer SNAPSHOT.json
#include <cstdio>
#include <fstream>

#include <streamalloc/allocator.hpp>
#include <streamalloc/sim_backend.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SNAPSHOT.json\n");
    return 2;
  }
  auto sim = std::make_shared<streamalloc::SimBackend>();
  streamalloc::Options options = streamalloc::Options::parse("backend:sim");
  streamalloc::Allocator allocator(options, sim);
  const streamalloc::Stream producer = sim->create_stream(0);
  const streamalloc::Stream consumer = sim->create_stream(0);
  void* block = allocator.allocate(1 << 20, 0, producer);
  allocator.record_stream(block, consumer);
  allocator.deallocate(block, 1 << 20, 0, producer);
  std::ofstream(argv[1]) << allocator.snapshot_json() << '\n';
  sim->synchronize_all();
  allocator.process_fences();
  allocator.validate();
  const streamalloc::DeviceStats stats = allocator.stats(0);
  std::printf("consumer: %lld allocation, %lld record_stream call\n",
              static_cast<long long>(stats.allocation[0].allocated), static_cast<long long>(stats.record_stream_calls));
  return stats.allocation[0].allocated == 1 && stats.record_stream_calls == 1 ? 0 : 1;
}
