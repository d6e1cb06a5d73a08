# The two commands of the README: `make run` (Piper's main job) and `make test` (the test suite).
# Both install missing packages, configure and build first.
BUILD ?= build
JOBS ?= $(shell nproc)
# RelWithDebInfo with line tables only (-g1): stacks and sanitizer reports name file and line, and the build takes
# about a quarter less compile time than with full debug info (-g); configure with -DCMAKE_BUILD_TYPE=Debug to step
# through locals in a debugger. Test sources compile at -O1 (PIPER_FAST_TESTS, cmake/piper.cmake).
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"

.PHONY: run test build setup clean fault-matrix sanitize fuzz fidelity property-large experiments

run: build
	. scripts/env.sh && scripts/main-job.sh $(BUILD)/src/cli/piper

test: build
	. scripts/env.sh && cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

# The larger random draw of the strategy property test (128 strategies on 2, 4 and 8 ranks; tests/runtime).
property-large: build
	. scripts/env.sh && cd $(BUILD) && ctest -C property-large -L property-large --output-on-failure --timeout 1800

build: setup
	@if [ ! -f $(BUILD)/build.ninja ]; then cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS); fi
	cmake --build $(BUILD) -j$(JOBS)

# CI's sanitizer jobs: ASan + UBSan on the unit tests and a chosen set of MPI tests (ASAN_MPI=all: every one),
# TSan on the executor's multi-stream tests, in build-asan/ and build-tsan/ (docs/reliability.md "Sanitizers").
sanitize:
	scripts/ci-sanitizers.sh

setup:
	@scripts/setup.sh

# Every row of every fidelity table as docs/fidelity.md and docs/fidelity.json (regenerates the checked-in report).
fidelity: build
	. scripts/env.sh && scripts/fidelity.sh $(BUILD)

# The design's headline experiments (experiments/*.py): tables (markdown + JSON) and SVG plots under
# docs/experiments/, and the summary page docs/experiments.md (a few minutes on 2 cores).
experiments: build
	. scripts/env.sh && PIPER=$(BUILD)/src/cli/piper experiments/run_all.sh

# The whole kill-at-point matrix as a table (docs/reliability.md, "Faults"; a few minutes).
fault-matrix: build
	. scripts/env.sh && scripts/fault-matrix.sh $(BUILD)

# `make fuzz FUZZ_SECONDS=N`: builds the libFuzzer targets of fuzz/ with clang 14 (ASan + UBSan) in build-fuzz and
# runs each for N seconds with its seed corpus; new inputs go to a scratch directory (docs/reliability.md).
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZ_JOBS ?= 1
fuzz:
	@scripts/setup.sh fuzz
	@if [ ! -f $(FUZZ_BUILD)/build.ninja ]; then cmake -S . -B $(FUZZ_BUILD) -G Ninja -DPIPER_FUZZ=ON \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_targets
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_JOBS=$(FUZZ_JOBS) scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)

# Hostile checkpoints against `piper train --resume`: every damage and edit refused, saying which
# (docs/reliability.md, *Checkpoints*).
.PHONY: checkpoint-campaign
checkpoint-campaign: build
	. scripts/env.sh && python3 scripts/checkpoint_campaign.py $(BUILD)/src/cli/piper
