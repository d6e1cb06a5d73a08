# Helpers shared by every module's CMakeLists.txt.

set(PIPER_WARNINGS -Wall -Wextra -Wpedantic -Wshadow=local -Wno-unused-parameter)
if(PIPER_WERROR)
  list(APPEND PIPER_WARNINGS -Werror)
endif()
set_property(GLOBAL PROPERTY PIPER_LIBRARIES "")

# piper_module(<name> SOURCES ... DEPS ...): library piper_<name> built from the listed sources.
function(piper_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_LIBS" ${ARGN})
  add_library(piper_${name} STATIC ${ARG_SOURCES})
  target_include_directories(piper_${name} PUBLIC ${PIPER_INCLUDE_ROOT})
  target_compile_options(piper_${name} PRIVATE ${PIPER_WARNINGS})
  set(deps "")
  foreach(d ${ARG_DEPS})
    list(APPEND deps piper_${d})
  endforeach()
  target_link_libraries(piper_${name} PUBLIC ${deps} ${ARG_PUBLIC_LIBS})
  set_property(GLOBAL APPEND PROPERTY PIPER_LIBRARIES piper_${name})
endfunction()

# PIPER_FAST_TESTS (on by default): the test sources (tests/) compile at -O1 with line tables only (-g1) in the
# optimized builds (sanitizer builds are -O1 -g1 throughout), while Piper's own code keeps its build type's flags.
# A test's own code is mostly setup and assertions; what it runs is the library, optimized as a user builds it (the
# parity references in tests/runtime are plain loops, correct at any -O: no -ffast-math, no FMA contraction without
# -mfma). The test sources are about 40 % of the translation units and half of the compile time (gtest's macros,
# one TU per file): these flags cut their compile CPU by about a third (docs/reliability.md, "CI's time"). Off:
# every source gets the build type's flags.
option(PIPER_FAST_TESTS "Compile tests/ at -O1 -g1: a third less compile time" ON)
function(piper_fast_test_flags dir)
  if(NOT PIPER_FAST_TESTS)
    return()
  endif()
  if(PIPER_SANITIZE)
    # Sanitizer builds are -O1 -g1 throughout already (scripts/ci-sanitizers.sh). Not -O0 for the tests: the
    # deadlock check's independent oracles (tests/compile/verify_complete_test.cc) run in the test's own code and
    # took over 300 s at -O0 under ASan against 17 s at -O1.
    return()
  elseif(CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo")
    set(flags -O1 -g1)
  elseif(CMAKE_BUILD_TYPE MATCHES "^(Release|MinSizeRel)$")
    set(flags -O1)
  else()
    return()  # Debug or no build type: the test sources keep its flags
  endif()
  list(TRANSFORM flags REPLACE ".+" "$<$<COMPILE_LANGUAGE:CXX>:\\0>")
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "UTILITY")
      target_compile_options(${t} PRIVATE ${flags})
    endif()
  endforeach()
endfunction()

# piper_test_group(<label> <target>): <target> is built by the custom target piper_tests_<label>, one per test
# label (unit, mpi, e2e, fidelity, property), so a job that runs only some labels builds only their binaries
# (scripts/ci-sanitizers.sh: `piper piper_tests_unit piper_tests_mpi`).
function(piper_test_group label target)
  if(NOT TARGET piper_tests_${label})
    add_custom_target(piper_tests_${label})
  endif()
  add_dependencies(piper_tests_${label} ${target})
endfunction()

# piper_test(<name> SOURCES ... DEPS ... [LABELS ...]): one GoogleTest binary per module; every test case is
# registered with CTest at test time (no test runs during the build).
function(piper_test name)
  cmake_parse_arguments(ARG "SERIAL" "TIMEOUT" "SOURCES;DEPS;LABELS;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${PIPER_WARNINGS})
  set(deps "")
  foreach(d ${ARG_DEPS})
    list(APPEND deps piper_${d})
  endforeach()
  target_link_libraries(${name} PRIVATE ${deps} ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  # Tests find the source tree (configs/, test data) and the piper binary through these definitions.
  target_compile_definitions(${name} PRIVATE PIPER_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                             PIPER_BINARY_DIR="${CMAKE_BINARY_DIR}"
                                             PIPER_BIN_PATH="${CMAKE_BINARY_DIR}/src/cli/piper")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  foreach(label ${ARG_LABELS})
    piper_test_group(${label} ${name})
  endforeach()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # SERIAL: the test measures this machine (piper calibrate), so no other test may run beside it.
  set(serial "")
  if(ARG_SERIAL)
    set(serial RUN_SERIAL TRUE)
  endif()
  include(GoogleTest)
  # PIPER_CALIBRATION=none: a developer's own calibration of this machine (cli/calibration_file.h) never changes a
  # test's numbers; tests of the default location set their own.
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "PIPER_CALIBRATION=none" ${serial})
endfunction()
