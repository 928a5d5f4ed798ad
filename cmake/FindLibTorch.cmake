# FindLibTorch: LibTorch from the PyPI `torch` wheel, without torch's own CMake config (which
# demands a CUDA toolkit and cuDNN at configure time even for CPU-only use).
#
# Inputs:  LIBTORCH_ROOT (the wheel's torch/ dir) or Python3_EXECUTABLE to ask `import torch`.
# Outputs: LibTorch::cpu (libtorch_cpu + libc10) and, when the CUDA libs are present,
#          LibTorch::cuda (libtorch_cuda + libc10_cuda, linked --no-as-needed so kernels register).
include(FindPackageHandleStandardArgs)

if(NOT LIBTORCH_ROOT)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
      OUTPUT_VARIABLE _titan_torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import torch; print(torch.__version__.split('+')[0])"
      OUTPUT_VARIABLE LibTorch_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_titan_torch_dir)
      set(LIBTORCH_ROOT "${_titan_torch_dir}" CACHE PATH "torch package directory of the wheel")
    endif()
  endif()
endif()

find_path(LibTorch_INCLUDE_DIR ATen/ATen.h HINTS "${LIBTORCH_ROOT}/include" NO_DEFAULT_PATH)
find_library(LibTorch_CPU_LIBRARY torch_cpu HINTS "${LIBTORCH_ROOT}/lib" NO_DEFAULT_PATH)
find_library(LibTorch_C10_LIBRARY c10 HINTS "${LIBTORCH_ROOT}/lib" NO_DEFAULT_PATH)
find_library(LibTorch_CUDA_LIBRARY torch_cuda HINTS "${LIBTORCH_ROOT}/lib" NO_DEFAULT_PATH)
find_library(LibTorch_C10_CUDA_LIBRARY c10_cuda HINTS "${LIBTORCH_ROOT}/lib" NO_DEFAULT_PATH)

find_package_handle_standard_args(LibTorch
  REQUIRED_VARS LibTorch_INCLUDE_DIR LibTorch_CPU_LIBRARY LibTorch_C10_LIBRARY
  VERSION_VAR LibTorch_VERSION)

if(LibTorch_FOUND AND NOT TARGET LibTorch::cpu)
  add_library(LibTorch::c10 SHARED IMPORTED)
  set_target_properties(LibTorch::c10 PROPERTIES IMPORTED_LOCATION "${LibTorch_C10_LIBRARY}")
  add_library(LibTorch::cpu SHARED IMPORTED)
  set_target_properties(LibTorch::cpu PROPERTIES
    IMPORTED_LOCATION "${LibTorch_CPU_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LibTorch_INCLUDE_DIR};${LibTorch_INCLUDE_DIR}/torch/csrc/api/include"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${LibTorch_INCLUDE_DIR};${LibTorch_INCLUDE_DIR}/torch/csrc/api/include"
    # The wheels are built with the C++11 ABI and with c10d + Gloo; every TU must agree (ODR).
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1;USE_DISTRIBUTED;USE_C10D_GLOO"
    INTERFACE_LINK_LIBRARIES "LibTorch::c10;Threads::Threads"
    # The wheels are built by GCC. Clang 18 changed how it mangles templates whose constrained
    # parameters use enable_if (at::TensorBase::const_data_ptr<T>), so its calls into LibTorch would not
    # link; Clang 17's mangling is GCC's.
    INTERFACE_COMPILE_OPTIONS
      "$<$<AND:$<COMPILE_LANG_AND_ID:CXX,Clang>,$<VERSION_GREATER_EQUAL:$<CXX_COMPILER_VERSION>,18>>:-fclang-abi-compat=17>")
  find_package(Threads REQUIRED)
  if(LibTorch_CUDA_LIBRARY AND LibTorch_C10_CUDA_LIBRARY)
    add_library(LibTorch::cuda INTERFACE IMPORTED)
    set_target_properties(LibTorch::cuda PROPERTIES
      INTERFACE_COMPILE_DEFINITIONS "USE_CUDA;USE_C10D_NCCL"
      INTERFACE_LINK_LIBRARIES
        "-Wl,--no-as-needed;${LibTorch_CUDA_LIBRARY};${LibTorch_C10_CUDA_LIBRARY};-Wl,--as-needed;LibTorch::cpu")
  endif()
  get_filename_component(LibTorch_LIBRARY_DIR "${LibTorch_CPU_LIBRARY}" DIRECTORY)
endif()
mark_as_advanced(LibTorch_INCLUDE_DIR LibTorch_CPU_LIBRARY LibTorch_C10_LIBRARY
                 LibTorch_CUDA_LIBRARY LibTorch_C10_CUDA_LIBRARY)
