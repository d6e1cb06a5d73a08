# The CUDA backend (src/kernels/cuda, the GPU trainer): built when the CUDA toolkit and nvcc are found
# (PIPER_CUDA=AUTO), for one GPU architecture only (PIPER_CUDA_ARCH, default 90 = H100/H200) so that CI's cold
# build stays short. No GPU is needed to build; the GPU tests skip without one.
set(PIPER_CUDA "AUTO" CACHE STRING "Build the CUDA kernels: AUTO (when the toolkit is found), ON (required), OFF")
set_property(CACHE PIPER_CUDA PROPERTY STRINGS AUTO ON OFF)
set(PIPER_CUDA_ARCH "90" CACHE STRING "The one CUDA architecture the kernels are compiled for (90 = H100/H200)")
set(PIPER_HAVE_CUDA OFF)
if(NOT PIPER_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER AND TARGET CUDA::cublasLt)
    set(CMAKE_CUDA_ARCHITECTURES ${PIPER_CUDA_ARCH})
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    # ccache handles nvcc too: reuse the C++ launcher (CMAKE_CXX_COMPILER_LAUNCHER=ccache) unless one is set.
    if(NOT DEFINED CMAKE_CUDA_COMPILER_LAUNCHER AND NOT DEFINED ENV{CMAKE_CUDA_COMPILER_LAUNCHER}
       AND DEFINED ENV{CMAKE_CXX_COMPILER_LAUNCHER})
      set(CMAKE_CUDA_COMPILER_LAUNCHER $ENV{CMAKE_CXX_COMPILER_LAUNCHER})
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 13's C++20 flag; Piper's headers are C++20.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(PIPER_HAVE_CUDA ON)
  elseif(PIPER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PIPER_CUDA=ON but the CUDA toolkit (nvcc, cuBLAS, cuBLASLt) was not found: install it "
                        "(/usr/local/cuda) or configure with -DPIPER_CUDA=OFF")
  endif()
endif()
if(PIPER_HAVE_CUDA)
  message(STATUS "piper: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_${PIPER_CUDA_ARCH})")
else()
  message(STATUS "piper: CUDA backend OFF (PIPER_CUDA=${PIPER_CUDA}; toolkit not found or disabled)")
endif()
