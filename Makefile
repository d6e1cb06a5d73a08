# The two commands of the README: `make run` (Piper's main job) and `make test` (the test suite).
# Both install missing packages, configure and build first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: run test build setup clean fault-matrix sanitize

run: build
	. scripts/env.sh && scripts/main-job.sh $(BUILD)/src/cli/piper

test: build
	. scripts/env.sh && cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

build: setup
	@if [ ! -f $(BUILD)/build.ninja ]; then cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS); fi
	cmake --build $(BUILD) -j$(JOBS)

# CI's sanitizer jobs: ASan + UBSan on the unit and MPI tests, TSan on the executor's multi-stream tests, in
# build-asan/ and build-tsan/ (docs/reliability.md "Sanitizers").
sanitize:
	scripts/ci-sanitizers.sh

setup:
	@scripts/setup.sh

# The whole kill-at-point matrix as a table (docs/reliability.md, "Faults"; a few minutes).
fault-matrix: build
	. scripts/env.sh && scripts/fault-matrix.sh $(BUILD)

clean:
	rm -rf $(BUILD)

# Hostile checkpoints against `piper train --resume`: every damage and edit refused, saying which
# (docs/reliability.md, *Checkpoints*).
.PHONY: checkpoint-campaign
checkpoint-campaign: build
	. scripts/env.sh && python3 scripts/checkpoint_campaign.py $(BUILD)/src/cli/piper
