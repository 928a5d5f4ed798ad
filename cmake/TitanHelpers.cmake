# One line per program: titan_add_program(<name> <sources...>) links titan and reuses its PCH.
function(titan_add_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE titan::titan titan_warnings)
  if(TITAN_ENABLE_CUDA AND TARGET LibTorch::cuda)
    # Linking libtorch_cuda makes CUDA kernels register; harmless on a machine without a GPU.
    target_link_libraries(${name} PRIVATE LibTorch::cuda)
  endif()
  titan_precompiled_header(${name} lib)
endfunction()
