# One line per program: titan_add_program(<name> [CPU_ONLY] <sources...>) links titan and reuses its PCH.
# CPU_ONLY links titan_cpu instead (titan less its CUDA glue): for a tool that never touches a GPU, which then
# loads no CUDA library and starts in about half the time.
# Every program links tools/program_exit.cpp: its process ends without LibTorch's static destructors (that file says
# why).
function(titan_add_program name)
  cmake_parse_arguments(PARSE_ARGV 1 _program "CPU_ONLY" "" "")
  if(NOT TARGET titan_program_exit)
    add_library(titan_program_exit OBJECT "${PROJECT_SOURCE_DIR}/tools/program_exit.cpp")
    target_link_libraries(titan_program_exit PRIVATE titan_warnings)
  endif()
  add_executable(${name} ${_program_UNPARSED_ARGUMENTS} $<TARGET_OBJECTS:titan_program_exit>)
  if(_program_CPU_ONLY)
    target_link_libraries(${name} PRIVATE titan_cpu titan_warnings)
  else()
    target_link_libraries(${name} PRIVATE titan::titan titan_warnings)
    if(TITAN_ENABLE_CUDA AND TARGET LibTorch::cuda)
      # Linking libtorch_cuda makes CUDA kernels register; harmless on a machine without a GPU.
      target_link_libraries(${name} PRIVATE LibTorch::cuda)
    endif()
  endif()
  titan_precompiled_header(${name} lib)
endfunction()
