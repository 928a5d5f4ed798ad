# ccache for C++ (and CUDA). PCH needs the sloppiness below; base_dir makes a fresh clone elsewhere
# (CI) hit the cache entries of the developer's tree.
find_program(TITAN_CCACHE ccache)
if(TITAN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(_launcher "${CMAKE_COMMAND}" -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" "CCACHE_NOHASHDIR=1" "${TITAN_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_launcher})
endif()
