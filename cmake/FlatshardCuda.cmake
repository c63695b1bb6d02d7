# Decides whether the CUDA/NCCL targets are built and finds NCCL.
# Sets FLATSHARD_HAVE_CUDA (ON/OFF) and, when ON, the imported target flatshard::nccl.
set(FLATSHARD_HAVE_CUDA OFF)
if(NOT FLATSHARD_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FLATSHARD_CUDA must be AUTO, ON or OFF, got '${FLATSHARD_CUDA}'")
endif()

if(NOT FLATSHARD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include /usr/include)
    find_library(NCCL_LIBRARY nccl
      HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
            /usr/local/cuda/lib /usr/local/cuda/lib64)
    if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(FLATSHARD_HAVE_CUDA ON)
    endif()
  endif()
  if(FLATSHARD_CUDA STREQUAL "ON" AND NOT FLATSHARD_HAVE_CUDA)
    message(FATAL_ERROR "FLATSHARD_CUDA=ON but the CUDA toolkit or NCCL was not found "
      "(nvcc: '${CMAKE_CUDA_COMPILER}', nccl.h: '${NCCL_INCLUDE_DIR}', libnccl: '${NCCL_LIBRARY}')")
  endif()
endif()

if(FLATSHARD_HAVE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Hopper (H100/H200) and Ampere; PTX for anything newer.
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  # The kernels include the shared C++20 headers (core/, worker/device/). nvcc
  # 12+ speaks C++20, but CMake 3.25 only knows its flags up to C++17: teach it.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  add_library(flatshard::nccl UNKNOWN IMPORTED)
  set_target_properties(flatshard::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  message(STATUS "flatshard: CUDA/NCCL path ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, ${NCCL_LIBRARY})")
else()
  message(STATUS "flatshard: CUDA/NCCL path OFF (FLATSHARD_CUDA=${FLATSHARD_CUDA})")
endif()
