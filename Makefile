# The two commands of the README: `make run` (Piper's main job) and `make test` (the test suite).
# Both install missing packages, configure and build first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: run test build setup clean sanitize

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

clean:
	rm -rf $(BUILD)
