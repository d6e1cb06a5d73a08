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
