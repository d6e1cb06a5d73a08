# PIPER_FUZZ=ON: a build of the libFuzzer targets in fuzz/ and nothing else (no tests, benchmarks or CLI). Every
# library is instrumented for coverage (fuzzer-no-link) and checked by ASan + UBSan; the targets link libFuzzer.
# Clang only (libFuzzer is part of clang's compiler-rt): scripts/ci-fuzz.sh configures build-fuzz with clang++-14.
option(PIPER_FUZZ "Build only the libFuzzer targets in fuzz/ (clang; ASan + UBSan)" OFF)
if(PIPER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PIPER_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  set(PIPER_BUILD_TESTS OFF CACHE BOOL "" FORCE)
  set(PIPER_BUILD_BENCH OFF CACHE BOOL "" FORCE)
  set(PIPER_CUDA OFF CACHE STRING "" FORCE)
  # Any UBSan report aborts (libFuzzer then saves the input); frame pointers for readable stacks.
  set(PIPER_FUZZ_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(-fsanitize=fuzzer-no-link ${PIPER_FUZZ_SANITIZERS})
  add_link_options(${PIPER_FUZZ_SANITIZERS})
  # -Wshadow=local is GCC's spelling; clang's warnings differ from the g++ build that -Werror guards.
  set(PIPER_WARNINGS -Wall -Wextra -Wno-unused-parameter)
  # Whole modules the targets link; fuzz/CMakeLists.txt picks the loader files of ir, cost and runtime (whose
  # other files the targets do not need, and some of which clang 14 does not compile).
  set(PIPER_FUZZ_MODULES base spec strategy tensor balance)
endif()
