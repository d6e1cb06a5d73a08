# PIPER_SANITIZE: build everything (Piper's code and its tests) under sanitizers, e.g.
#   -DPIPER_SANITIZE=address,undefined   ASan + UBSan (any UBSan finding is fatal: -fno-sanitize-recover)
#   -DPIPER_SANITIZE=thread              ThreadSanitizer
# Empty (the default) builds without. scripts/ci-sanitizers.sh builds and runs both; docs/reliability.md
# "Sanitizers" says what runs and what is suppressed.
set(PIPER_SANITIZE "" CACHE STRING "Sanitizers to build with: a comma list of address, undefined, leak, thread")
if(PIPER_SANITIZE)
  string(REPLACE "," ";" piper_sanitizers "${PIPER_SANITIZE}")
  foreach(s ${piper_sanitizers})
    if(NOT s MATCHES "^(address|undefined|leak|thread)$")
      message(FATAL_ERROR "PIPER_SANITIZE: '${s}' is not one of address, undefined, leak, thread "
                          "(e.g. -DPIPER_SANITIZE=address,undefined or -DPIPER_SANITIZE=thread)")
    endif()
  endforeach()
  if("thread" IN_LIST piper_sanitizers AND ("address" IN_LIST piper_sanitizers OR "leak" IN_LIST piper_sanitizers))
    message(FATAL_ERROR "PIPER_SANITIZE: thread cannot be combined with address or leak; configure two builds")
  endif()
  set(piper_sanitize_flags -fsanitize=${PIPER_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST piper_sanitizers)
    list(APPEND piper_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  # g++ 12 at -O1 with ASan reports std::regex's std::function members as maybe-uninitialized (a known false
  # positive on the instrumented code, inside libstdc++); -Werror would stop the build on it.
  list(APPEND piper_sanitize_flags -Wno-maybe-uninitialized)
  # C++ only: the CUDA backend's device code (cmake/cuda.cmake) is not instrumented.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${piper_sanitize_flags}>")
  add_link_options(${piper_sanitize_flags})
  message(STATUS "Sanitizers: ${PIPER_SANITIZE}")
endif()
