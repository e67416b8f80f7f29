# streamalloc — one entry point for people and CI. `make help` lists the targets.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE ?= cmake
PYTHON ?= python3
# Set STREAMALLOC_NO_TORCH=1 to skip installing/building the PyTorch plugin.
STREAMALLOC_NO_TORCH ?=
# ON turns compiler warnings into errors (.ci/run sets it); unset keeps what the build directory has.
STREAMALLOC_WERROR ?=
CMAKE_ARGS ?=

GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
CCACHE := $(shell command -v ccache 2>/dev/null)
TORCH_MODE = $(if $(STREAMALLOC_NO_TORCH),OFF,AUTO)
PYTHON_PATH := $(shell command -v $(PYTHON) 2>/dev/null)
# The configure presets are CMakePresets.json's (default, gpu, asan, tsan, fuzz); the targets below add
# what only the Makefile knows. CMake finds Torch through this Python (cmake/StreamallocTorch.cmake).
TORCH_ARGS = -DSTREAMALLOC_TORCH=$(TORCH_MODE) $(if $(PYTHON_PATH),-DPython3_EXECUTABLE=$(PYTHON_PATH))
# The whole build (preset default): CUDA backend and PyTorch plugin where their toolkits are found.
FULL_ARGS = -DSTREAMALLOC_CUDA=AUTO $(TORCH_ARGS)
# What the Python side needs to find the build's libraries and the package.
RUN_ENV = STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib PYTHONPATH=$(abspath torch_plugin)
PYTEST = $(RUN_ENV) $(PYTHON) -m pytest -q -rs tests/python

# $(call configure,DIR,PRESET,ARGS): `cmake --preset PRESET` into DIR, ARGS on top. cmake's output goes
# to DIR/configure.log; shown are its "streamalloc:" lines (CUDA backend, PyTorch plugin, benchmark
# peers), or all of it when it fails.
define configure
@mkdir -p $(1)
@$(CMAKE) --preset $(2) -B $(1) $(if $(STREAMALLOC_WERROR),-DSTREAMALLOC_WERROR=$(STREAMALLOC_WERROR)) \
  $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache) \
  $(3) $(CMAKE_ARGS) >$(1)/configure.log 2>&1 || { cat $(1)/configure.log; echo "configure failed ($(1)/configure.log)"; exit 1; }
@sed -n 's/^-- streamalloc: /configure: /p' $(1)/configure.log
endef

# $(call build,DIR,PRESET,ARGS,TARGETS): configure DIR, then build TARGETS there (everything when empty).
define build
$(call configure,$(1),$(2),$(3))
@$(CMAKE) --build $(1) -j $(JOBS) $(if $(4),--target $(4))
endef

# Formatting and lint: clang-format (.clang-format) on the C/C++/CUDA sources below, ruff (ruff.toml) on
# every Python file. `make format` rewrites files; `make lint` changes nothing and fails on any difference.
CLANG_FORMAT ?= clang-format
FORMAT_DIRS = allocator planner torch_plugin/src torch_plugin/include tests bench examples
FORMAT_SOURCES = $(shell git ls-files -- $(foreach d,$(FORMAT_DIRS),$(foreach e,c h cpp hpp cu cuh,'$(d)/*.$(e)')))

.PHONY: help deps build test demo gpu-test upstream-tests gpu-sanitize gpu-soak traces bench bench-threads bench-report audit-overhead detection-rate fragmentation test-asan test-tsan fuzz format lint clean

help:
	@echo "make demo      set up, build what it runs, run the allocation benchmark (streamalloc against each peer"
	@echo "               that runs here) and the multi-stream pipeline report (+ build/demo_timeline.png)"
	@echo "make test      set up, build, run the whole test suite (GPU/torch tests skip without a GPU)"
	@echo "make build     set up and build everything (CUDA and the PyTorch plugin where they are found)"
	@echo "make gpu-test  on a GPU machine: build everything and run every test, GPU and PyTorch included"
	@echo "               (GPU_TEST_STEPS=\"cpu gpu python\" and GPU_TEST_PYTEST=paths run a part of it)"
	@echo "make traces    record allocation traces of real workloads (GPU machine, PyTorch)"
	@echo "make bench     full benchmark run; writes docs/benchmarks.md and plots (build/benchmarks.md without a GPU);"
	@echo "               the trace replays include the expandable-segments peers (torch_expandable, streamalloc_expandable)"
	@echo "make bench-threads OUT=dir  the allocator-bound inference server (small_mlp) and the varied-size threads scenarios,"
	@echo "               streamalloc against its peers at 1..16 threads, interleaved, medians of 3: JSON + markdown in dir"
	@echo "               (GPU machine for the server and the CUDA peers; elsewhere the threads scenarios on the simulated device)"
	@echo "make audit-overhead  what audit/poison/check_sync/quarantine cost on the training loop (GPU machine)"
	@echo "make detection-rate  how often each debug option catches the prefetch pipeline's bugs, over repeated runs (GPU machine)"
	@echo "make fragmentation  GPT-2 with random sequence lengths: peaks and largest batch under a cap, PyTorch's allocator and"
	@echo "               streamalloc, each with and without expandable segments (GPU machine, transformers; ~5 min on an H200)"
	@echo "make upstream-tests TEST_CUDA=path  PyTorch's own allocator tests (a copy of its test/test_cuda.py) under PyTorch's"
	@echo "               allocator and streamalloc (UPSTREAM_MODES, UPSTREAM_OUT=dir, UPSTREAM_ARGS=\"-- --collect-only\": dry run)"
	@echo "make gpu-sanitize  the GPU suite under compute-sanitizer memcheck"
	@echo "make gpu-soak  on a GPU machine: the pipeline soak (SOAK_SECONDS=600, SOAK_STREAMS=4 stream pairs), every byte checked"
	@echo "make test-asan / test-tsan   the CPU suite under ASan+UBSan / TSan"
	@echo "make fuzz      open-ended libFuzzer run (clang)"
	@echo "make format    apply clang-format to the C/C++ sources and ruff's fixes to the Python"
	@echo "make lint      check both without changing anything (clang-format --dry-run -Werror, ruff check)"
	@echo "Variables: BUILD=dir JOBS=n STREAMALLOC_NO_TORCH=1 STREAMALLOC_WERROR=ON CMAKE_ARGS=... (cmake's full output: DIR/configure.log)"

deps:
	@.ci/setup-deps $(if $(STREAMALLOC_NO_TORCH),,--torch)

build: deps
	$(call build,$(BUILD),default,$(FULL_ARGS))

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600
	$(PYTEST) || [ $$? -eq 5 ]

# The main job: the allocation benchmark as a short table (streamalloc against each peer that runs here),
# then the prefetch pipeline with the per-block stream report and a timeline of its pending
# bytes per stream ($(BUILD)/demo_timeline.png). Each says whether it ran on the GPU or the simulated
# device. Builds only what it runs. Without a GPU, a first demo leaves the CUDA backend and the PyTorch
# plugin out (nothing here would run them; `make test` adds them); an existing build is kept as configured.
DEMO_ARGS = $(if $(GPU),$(FULL_ARGS),\
  $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DSTREAMALLOC_CUDA=OFF -DSTREAMALLOC_TORCH=OFF))
demo:
	@.ci/setup-deps
	$(call build,$(BUILD),default,$(DEMO_ARGS),streamalloc_bench streamalloc_demo)
	@echo
	@$(BUILD)/bench/streamalloc_bench --summary
	@echo
	@$(BUILD)/examples/demo/streamalloc_demo --timeline $(BUILD)/demo_pending_history.json
	@echo
	@$(RUN_ENV) $(PYTHON) -m streamalloc.report $(BUILD)/demo_pending_history.json --timeline $(BUILD)/demo_timeline.png

# The GPU targets build with the CUDA backend required (configure fails without the toolkit). Without
# network access they build with what is installed. gpu-test runs the CPU-only tests (the simulated
# device) in the background, in parallel, while the rest (GPU, bench, install, then pytest) runs one at a
# time, as they share the device; every step runs even when an earlier one fails, and any failure fails it.
# GPU_TEST_STEPS runs part of it (cpu: the CPU ctest, gpu: the GPU ctest, python: pytest) and
# GPU_TEST_PYTEST the pytest paths, so that the suite can be split over several shorter runs.
GPU_DEPS = .ci/setup-deps $(1) || echo "$@: could not install missing packages (offline?); building with what is here"
GPU_TEST_STEPS ?= cpu gpu python
GPU_TEST_PYTEST ?= tests/python
gpu-test:
	@$(call GPU_DEPS,--torch)
	$(call build,$(BUILD),gpu,$(TORCH_ARGS))
	@nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	@status=0; \
	$(if $(filter cpu,$(GPU_TEST_STEPS)),echo "gpu-test: the CPU ctest runs meanwhile into $(BUILD)/gpu-test-cpu.log"; \
	  (ctest --test-dir $(BUILD) --output-on-failure -L cpu -j $(JOBS) --timeout 900 > $(BUILD)/gpu-test-cpu.log 2>&1; \
	   echo $$? > $(BUILD)/gpu-test-cpu.status) & cpu=$$!;) \
	$(if $(filter gpu,$(GPU_TEST_STEPS)),ctest --test-dir $(BUILD) --output-on-failure -LE cpu -j 1 --timeout 900 || status=1;) \
	$(if $(filter python,$(GPU_TEST_STEPS)),$(RUN_ENV) $(PYTHON) -m pytest -q -rs $(GPU_TEST_PYTEST) || status=1;) \
	$(if $(filter cpu,$(GPU_TEST_STEPS)),wait $$cpu; echo "gpu-test: the CPU ctest:"; tail -n 30 $(BUILD)/gpu-test-cpu.log; \
	  [ "$$(cat $(BUILD)/gpu-test-cpu.status)" = 0 ] || status=1;) \
	echo "gpu-test: GPU tests run (not skipped):"; ctest --test-dir $(BUILD) -L gpu -N | tail -1; \
	[ $$status = 0 ] || echo "gpu-test: FAILED (see above$(if $(filter cpu,$(GPU_TEST_STEPS)), and $(BUILD)/gpu-test-cpu.log))"; \
	exit $$status

# Memory-access errors fail the run. CUDA API errors are not reported: the error-path tests provoke
# them on purpose (OOM, bad handles, capture checks) and check that streamalloc turns them into errors.
gpu-sanitize:
	@$(call GPU_DEPS)
	$(call build,$(BUILD),gpu,$(TORCH_ARGS),streamalloc_gpu_tests)
	compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 $(BUILD)/tests/streamalloc_gpu_tests

# The prefetch pipeline with random sizes (512 B to 64 MiB) on SOAK_STREAMS stream pairs for SOAK_SECONDS,
# every byte every consumer reads checked, then a leak check (tests/soak/soak_workload.hpp). Fails on any wrong
# byte, leak or broken invariant. The summary is also written to $(BUILD)/soak.json.
SOAK_SECONDS ?= 600
SOAK_STREAMS ?= 4
gpu-soak:
	@$(call GPU_DEPS)
	$(call build,$(BUILD),gpu,$(TORCH_ARGS),streamalloc_soak)
	@nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	$(BUILD)/tests/soak/streamalloc_soak --backend cuda --seconds $(SOAK_SECONDS) --streams $(SOAK_STREAMS) \
	  --json $(BUILD)/soak.json

# Record allocation traces of real workloads under PyTorch's native allocator (GPU machine).
traces:
	$(PYTHON) bench/replay/record_workloads.py

# Full run: the benchmark (3 repetitions, medians), every trace replayed on every peer (`--peers all`: with
# torch_expandable, PyTorch's allocator under expandable_segments:True in a child process of the replay, and
# streamalloc_expandable, whose row says "not run" where the option is not in the build), the PyTorch-level
# loop, the torch.compile(mode="reduce-overhead") loop ($(BUILD)/graphs_bench.md), then docs/benchmarks.md
# and its plots.
# The report goes to docs/benchmarks.md only where a GPU ran the peers; elsewhere (simulated rows only)
# to $(BUILD)/benchmarks.md, so a run on a CPU machine does not replace the H200 results.
BENCH_DOC ?= $(if $(GPU),docs/benchmarks.md,$(BUILD)/benchmarks.md)
bench: build
	@echo "(Google Benchmark's 'Library was built as DEBUG' below means Debian built libbenchmark without NDEBUG; streamalloc is RelWithDebInfo)"
	$(BUILD)/bench/streamalloc_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
	  --benchmark_report_aggregates_only=true \
	  --benchmark_out=$(BUILD)/bench.json --benchmark_out_format=json
	rm -f $(BUILD)/replay-*.json; for t in bench/replay/traces/*.trace; do \
	  $(BUILD)/bench/streamalloc_replay "$$t" --peers all --json "$(BUILD)/replay-$$(basename "$$t" .trace).json" || exit 1; done
	$(RUN_ENV) $(PYTHON) bench/studies/torch_empty.py --json $(BUILD)/torch_empty.json || true
	$(RUN_ENV) $(PYTHON) bench/studies/graphs_bench.py --json $(BUILD)/graphs_bench.json \
	  --markdown $(BUILD)/graphs_bench.md || true
	$(MAKE) --no-print-directory audit-overhead BUILD=$(BUILD) || true
	$(PYTHON) bench/report.py $(BUILD)/bench.json $(BUILD)/replay-*.json $(BUILD)/torch_empty.json $(BENCH_DOC)

# How streamalloc scales with threads (bench/studies/threads_scaling.py): the allocator-bound inference server
# (model small_mlp: every allocator of the build, one process per allocator and round, 3 rounds interleaved) and
# streamalloc_bench's threads_varied and threads scenarios (streamalloc, torch_native, cudaMallocAsync, rmm_arena;
# repetitions interleaved), T = 1,2,4,8,16, medians of 3, with streamalloc's path counts; JSON and markdown in
# $(OUT). Builds only the two programs (the server where LibTorch and the plugin are found). About 5 min on an H200.
OUT ?= $(BUILD)/bench-threads
BENCH_THREADS_ARGS ?=
bench-threads:
	$(call build,$(BUILD),$(if $(GPU),gpu,default),$(if $(GPU),$(TORCH_ARGS),$(DEMO_ARGS)),streamalloc_bench \
	  $(if $(GPU),streamalloc_inference_server))
	$(RUN_ENV) $(PYTHON) bench/studies/threads_scaling.py $(OUT) --build $(BUILD) $(BENCH_THREADS_ARGS)

# docs/benchmarks.md, its plots and the README's headline table, regenerated from stored runs without running
# anything; each kind of result (scenarios, replays, torch.empty, training, inference, debugging options,
# soak, test logs) comes from the first folder that has it.
BENCH_RESULTS ?= bench/results/2026-12-03-h200-c617b95 bench/results/2026-12-02-h200-6a419e1 \
  bench/results/2026-12-01-h200-352e9e1 bench/results/2026-12-01-h200-805a628 \
  bench/results/2026-11-30-h200-310979c bench/results/2026-11-30-h200-6e9adf8
bench-report:
	$(PYTHON) bench/report.py $(addprefix --from=,$(BENCH_RESULTS)) docs/benchmarks.md

# streamalloc's diagnostic modes (audit, poison, check_sync, quarantine) against its defaults and PyTorch's
# allocator on the copy-overlap training loop (examples/train_with_prefetcher.py), one process per run, medians
# of interleaved repetitions (~6.5 min on an H200). Uses the libraries of an earlier `make build` or
# `make gpu-test`; skips without a GPU. AUDIT_OVERHEAD_ARGS adds options (e.g. --reps 3).
AUDIT_OVERHEAD_ARGS ?=
audit-overhead:
	$(RUN_ENV) $(PYTHON) bench/studies/audit_overhead.py \
	  --json $(BUILD)/audit_overhead.json --markdown $(BUILD)/audit_overhead.md $(AUDIT_OVERHEAD_ARGS)

# Each prefetch pipeline example under each debug option, DETECTION_RUNS processes per row (about 5.6 s each on
# an H200, so ~6 min for 8 rows x 8 runs):
# in how many runs the bug showed (NaN, warnings) and, for the fixed pipelines, false alarms.
DETECTION_RUNS ?= 8
detection-rate:
	$(RUN_ENV) $(PYTHON) bench/studies/detection_rate.py \
	  --runs $(DETECTION_RUNS) --json $(BUILD)/detection_rate.json --markdown $(BUILD)/detection_rate.md

# GPT-2 training with a random sequence length per step (bench/studies/fragmentation.py): peak reserved / allocated
# and ms/step at batch 8, then the largest batch that trains under a 24 GiB cap (bisection, one process per trial),
# for PyTorch's allocator and streamalloc, each with and without expandable segments (~5 min on an H200). Uses the
# libraries of an earlier `make build` or `make gpu-test`; needs transformers; skips without a GPU. FRAGMENTATION_ARGS
# adds options (e.g. --cap-gib 12 --bracket 2:17).
FRAGMENTATION_ARGS ?=
fragmentation:
	$(RUN_ENV) $(PYTHON) bench/studies/fragmentation.py \
	  --json $(BUILD)/fragmentation.json --markdown $(BUILD)/fragmentation.md $(FRAGMENTATION_ARGS)

# PyTorch's own allocator tests (tests/upstream/run_test_cuda.py; docs/pytorch.md, "PyTorch's own allocator
# tests"): TEST_CUDA is a copy of pytorch's test/test_cuda.py, one pytest process per mode, the table in
# UPSTREAM_OUT. Uses the libraries of an earlier `make build` or `make gpu-test`; PYTHONPATH is kept (the runner
# adds the package), so test dependencies installed elsewhere (expecttest) are found. UPSTREAM_ARGS adds the
# runner's options (e.g. --timeout 180, or "-- --collect-only": collect without running, no GPU needed).
UPSTREAM_MODES ?= native,streamalloc,streamalloc-expandable
UPSTREAM_OUT ?= $(BUILD)/upstream
upstream-tests:
	@test -n "$(TEST_CUDA)" || { echo "upstream-tests: set TEST_CUDA=path/to/test_cuda.py (docs/pytorch.md)"; exit 2; }
	STREAMALLOC_LIBRARY_DIR=$(abspath $(BUILD))/lib $(PYTHON) tests/upstream/run_test_cuda.py $(TEST_CUDA) --out $(UPSTREAM_OUT) \
	  --modes $(UPSTREAM_MODES) $(UPSTREAM_ARGS)

# The CPU suite under sanitizers, in build-asan / build-tsan (presets asan, tsan: configure, build and
# test). The runs keep the model fuzzer to 50k ops per case (the test presets' STREAMALLOC_FUZZ_OPS; the
# full 10^6 run is in `make test`).
test-asan test-tsan:
	@.ci/setup-deps
	$(call configure,build-$(@:test-%=%),$(@:test-%=%))
	@$(CMAKE) --build --preset $(@:test-%=%) -j $(JOBS)
	ctest --preset $(@:test-%=%) -j $(JOBS)

# Open-ended libFuzzer run of the model-based fuzzer (clang; preset fuzz). FUZZ_SECONDS bounds it (default 300).
FUZZ_SECONDS ?= 300
fuzz:
	@.ci/setup-deps
	@command -v clang++ >/dev/null || { echo "make fuzz needs clang (apt-get install clang)"; exit 1; }
	$(call configure,build-fuzz,fuzz)
	@$(CMAKE) --build --preset fuzz -j $(JOBS)
	@mkdir -p build-fuzz/corpus
	build-fuzz/tests/fuzz/streamalloc_fuzz -max_len=8192 -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus

format:
	@.ci/setup-deps --lint
	$(CLANG_FORMAT) -i $(FORMAT_SOURCES)
	$(PYTHON) -m ruff check --fix .

lint:
	@.ci/setup-deps --lint
	@status=0; \
	  $(CLANG_FORMAT) --dry-run -Werror $(FORMAT_SOURCES) || status=1; \
	  $(PYTHON) -m ruff check . || status=1; \
	  exit $$status

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
