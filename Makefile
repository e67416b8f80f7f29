# streamalloc — one entry point for people and CI. `make help` lists the targets.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE ?= cmake
PYTHON ?= python3
# Set STREAMALLOC_NO_TORCH=1 to skip installing/building the PyTorch plugin.
STREAMALLOC_NO_TORCH ?=

TORCH_PREFIX = $(shell $(PYTHON) -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
CMAKE_ARGS ?=
CONFIGURE = $(CMAKE) -S . -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(if $(TORCH_PREFIX),-DCMAKE_PREFIX_PATH=$(TORCH_PREFIX)) $(CMAKE_ARGS)
PYTEST = STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib PYTHONPATH=$(abspath torch_plugin) $(PYTHON) -m pytest -q tests/python

.PHONY: help deps build test demo gpu-test gpu-sanitize gpu-soak traces bench audit-overhead detection-rate test-asan test-tsan fuzz clean

help:
	@echo "make demo      set up, build, run the allocation benchmark and the multi-stream pipeline report (+ build/demo_timeline.png)"
	@echo "make test      set up, build, run the whole test suite (GPU/torch tests skip without a GPU)"
	@echo "make gpu-test  on a GPU machine: build everything and run every test, GPU and PyTorch included"
	@echo "make traces    record allocation traces of real workloads (GPU machine, PyTorch)"
	@echo "make bench     full benchmark run; writes docs/benchmarks.md and plots (build/benchmarks.md without a GPU)"
	@echo "make audit-overhead  what audit/poison/check_sync/quarantine cost on the training loop (GPU machine)"
	@echo "make detection-rate  how often each debug option catches the seed's bugs, over repeated runs (GPU machine)"
	@echo "make gpu-sanitize  the GPU suite under compute-sanitizer memcheck"
	@echo "make gpu-soak  on a GPU machine: the pipeline soak (SOAK_SECONDS=600, SOAK_STREAMS=4 stream pairs), every byte checked"
	@echo "make test-asan / test-tsan   the CPU suite under ASan+UBSan / TSan"
	@echo "make fuzz      open-ended libFuzzer run (clang)"

deps:
	@.ci/setup-deps $(if $(STREAMALLOC_NO_TORCH),,--torch)

build: deps
	@$(CONFIGURE) -B $(BUILD) >/dev/null
	@$(CMAKE) --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600
	$(PYTEST) || [ $$? -eq 5 ]

# The main job: the allocation benchmark (short run, every peer on this machine), then the seed's
# multi-stream pipeline with the per-block stream report and a timeline of its pending bytes per stream
# ($(BUILD)/demo_timeline.png). Each says whether it ran on the GPU or the simulated device.
demo: build
	@$(BUILD)/bench/streamalloc_bench --short
	@$(BUILD)/bench/streamalloc_demo --timeline $(BUILD)/demo_pending_history.json
	@PYTHONPATH=$(abspath torch_plugin) $(PYTHON) -m streamalloc.report $(BUILD)/demo_pending_history.json \
	  --timeline $(BUILD)/demo_timeline.png

gpu-test:
	@.ci/setup-deps --torch || echo "gpu-test: could not install missing packages (offline?); building with what is here"
	@$(CONFIGURE) -B $(BUILD) -DSTREAMALLOC_CUDA=ON >/dev/null
	@$(CMAKE) --build $(BUILD) -j $(JOBS)
	@nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	ctest --test-dir $(BUILD) --output-on-failure -j 1 --timeout 900
	$(PYTEST) -rs
	@echo "gpu-test: GPU tests run (not skipped):"; \
	  ctest --test-dir $(BUILD) -L gpu -N | tail -1

# Memory-access errors fail the run. CUDA API errors are not reported: the error-path tests provoke
# them on purpose (OOM, bad handles, capture checks) and check that streamalloc turns them into errors.
gpu-sanitize: build
	compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 $(BUILD)/tests/streamalloc_gpu_tests

# The seed's pipeline with random sizes (512 B to 64 MiB) on SOAK_STREAMS stream pairs for SOAK_SECONDS,
# every byte every consumer reads checked, then a leak check (bench/soak_workload.hpp). Fails on any wrong
# byte, leak or broken invariant. The summary is also written to $(BUILD)/soak.json.
SOAK_SECONDS ?= 600
SOAK_STREAMS ?= 4
gpu-soak:
	@.ci/setup-deps || echo "gpu-soak: could not install missing packages (offline?); building with what is here"
	@$(CONFIGURE) -B $(BUILD) -DSTREAMALLOC_CUDA=ON >/dev/null
	@$(CMAKE) --build $(BUILD) -j $(JOBS) --target streamalloc_soak
	@nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	$(BUILD)/bench/streamalloc_soak --backend cuda --seconds $(SOAK_SECONDS) --streams $(SOAK_STREAMS) --json $(BUILD)/soak.json

# Record allocation traces of real workloads under PyTorch's native allocator (GPU machine).
traces:
	$(PYTHON) bench/traces/record_workloads.py

# Full run: the benchmark (3 repetitions, medians), every trace replayed on every peer, the PyTorch-level
# loop, then docs/benchmarks.md and its plots.
# The report goes to docs/benchmarks.md only where a GPU ran the peers; elsewhere (simulated rows only)
# to $(BUILD)/benchmarks.md, so a run on a CPU machine does not replace the H200 results.
BENCH_DOC ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo docs/benchmarks.md || echo $(BUILD)/benchmarks.md)
bench: build
	$(BUILD)/bench/streamalloc_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
	  --benchmark_out=$(BUILD)/bench.json --benchmark_out_format=json
	rm -f $(BUILD)/replay-*.json; for t in bench/traces/*.trace; do \
	  $(BUILD)/bench/streamalloc_replay "$$t" --peers all --json "$(BUILD)/replay-$$(basename "$$t" .trace).json" || exit 1; done
	STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib PYTHONPATH=$(abspath torch_plugin) $(PYTHON) bench/torch_empty.py \
	  --json $(BUILD)/torch_empty.json || true
	$(MAKE) --no-print-directory audit-overhead BUILD=$(BUILD) || true
	$(PYTHON) bench/report.py $(BUILD)/bench.json $(BUILD)/replay-*.json $(BUILD)/torch_empty.json $(BENCH_DOC)

# streamalloc's diagnostic modes (audit, poison, check_sync, quarantine) against its defaults and PyTorch's
# allocator on the seed's training loop (examples/train_with_prefetcher.py), one process per run, medians
# of interleaved repetitions (~6.5 min on an H200). Uses the libraries of an earlier `make build` or
# `make gpu-test`; skips without a GPU. AUDIT_OVERHEAD_ARGS adds options (e.g. --reps 3).
AUDIT_OVERHEAD_ARGS ?=
audit-overhead:
	STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib PYTHONPATH=$(abspath torch_plugin) $(PYTHON) bench/audit_overhead.py \
	  --json $(BUILD)/audit_overhead.json --markdown $(BUILD)/audit_overhead.md $(AUDIT_OVERHEAD_ARGS)

# Each seed pipeline example under each debug option, DETECTION_RUNS processes per row (about 5.6 s each on
# an H200, so ~6 min for 8 rows x 8 runs):
# in how many runs the bug showed (NaN, warnings) and, for the fixed pipelines, false alarms.
DETECTION_RUNS ?= 8
detection-rate:
	STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib PYTHONPATH=$(abspath torch_plugin) $(PYTHON) bench/detection_rate.py \
	  --runs $(DETECTION_RUNS) --json $(BUILD)/detection_rate.json --markdown $(BUILD)/detection_rate.md

# The sanitizer runs keep the model fuzzer to 50k ops per case (the full 10^6 run is in `make test`).
SANITIZER_FUZZ_OPS ?= 50000
test-asan:
	@.ci/setup-deps
	@$(CMAKE) -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSTREAMALLOC_SANITIZE="address;undefined" \
	  -DSTREAMALLOC_CUDA=OFF -DSTREAMALLOC_TORCH=OFF -DSTREAMALLOC_BUILD_BENCH=OFF >/dev/null
	@$(CMAKE) --build build-asan -j $(JOBS) --target streamalloc_tests
	STREAMALLOC_FUZZ_OPS=$(SANITIZER_FUZZ_OPS) ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L cpu --timeout 1200

test-tsan:
	@.ci/setup-deps
	@$(CMAKE) -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTREAMALLOC_SANITIZE=thread \
	  -DSTREAMALLOC_CUDA=OFF -DSTREAMALLOC_TORCH=OFF -DSTREAMALLOC_BUILD_BENCH=OFF >/dev/null
	@$(CMAKE) --build build-tsan -j $(JOBS) --target streamalloc_tests
	STREAMALLOC_FUZZ_OPS=$(SANITIZER_FUZZ_OPS) ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -L cpu --timeout 1200

# Open-ended libFuzzer run of the model-based fuzzer (clang). FUZZ_SECONDS bounds it (default 300).
FUZZ_SECONDS ?= 300
fuzz:
	@.ci/setup-deps
	@command -v clang++ >/dev/null || { echo "make fuzz needs clang (apt-get install clang)"; exit 1; }
	@CXX=clang++ CC=clang $(CMAKE) -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTREAMALLOC_CUDA=OFF \
	  -DSTREAMALLOC_TORCH=OFF -DSTREAMALLOC_BUILD_BENCH=OFF >/dev/null
	@$(CMAKE) --build build-fuzz -j $(JOBS) --target streamalloc_fuzz
	@mkdir -p build-fuzz/corpus
	build-fuzz/tests/fuzz/streamalloc_fuzz -max_len=8192 -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
