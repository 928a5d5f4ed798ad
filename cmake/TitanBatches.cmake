# Sources compiled in batches: a batch file includes a few of a target's sources and is compiled once, so the
# LibTorch, fmt and Catch2 templates each of them instantiates are parsed, instantiated and code-generated once a
# batch instead of once a source. A cold build on 2 cores takes well under half as long (docs/testing.md).
#
# CMake's own UNITY_BUILD would do the same, but its batch files include each source by its absolute path, which
# lands in the preprocessed text, so ccache could no longer share objects between clones (cmake/TitanPch.cmake
# says why that matters). titan's batch files include their sources by paths relative to themselves.
#
# The price: names a source keeps to itself (an anonymous namespace, `static`) must not meet another source's in
# its batch; a clash is a compile error naming both. A test file with helpers of common names opens a namespace
# of its own. -DTITAN_BATCH_SIZE=1 compiles file by file, for the quickest rebuild of one changed source.
set(TITAN_BATCH_SIZE 8 CACHE STRING "Sources per batch file for the library and the tests (1: no batches)")

# titan_batch_sources(<target>)
# Replaces <target>'s plain C++ sources by batch files of TITAN_BATCH_SIZE of them, in the order given. A source
# with options, definitions or include directories of its own, or without the precompiled header, stays alone.
# Call before titan_precompiled_header(<target>).
function(titan_batch_sources target)
  if(TITAN_BATCH_SIZE LESS_EQUAL 1)
    return()
  endif()
  get_target_property(_sources ${target} SOURCES)
  get_target_property(_source_dir ${target} SOURCE_DIR)
  set(_dir "${CMAKE_CURRENT_BINARY_DIR}/batches/${target}")
  set(_kept "")
  set(_batch "")
  set(_count 0)
  foreach(_src IN LISTS _sources)
    set(_abs "${_src}")
    if(NOT IS_ABSOLUTE "${_abs}")
      set(_abs "${_source_dir}/${_src}")
    endif()
    set(_alone OFF)
    if(NOT _abs MATCHES "\\.cpp$")
      set(_alone ON)
    endif()
    foreach(_property COMPILE_DEFINITIONS COMPILE_OPTIONS COMPILE_FLAGS INCLUDE_DIRECTORIES SKIP_PRECOMPILE_HEADERS)
      get_source_file_property(_value "${_abs}" TARGET_DIRECTORY ${target} ${_property})
      if(_value)
        set(_alone ON)
      endif()
    endforeach()
    if(_alone)
      list(APPEND _kept "${_src}")
      continue()
    endif()
    file(RELATIVE_PATH _rel "${_dir}" "${_abs}")
    string(APPEND _batch "#include \"${_rel}\"\n")
    math(EXPR _count "${_count} + 1")
    math(EXPR _full "${_count} % ${TITAN_BATCH_SIZE}")
    if(_full EQUAL 0)
      math(EXPR _index "${_count} / ${TITAN_BATCH_SIZE} - 1")
      file(CONFIGURE OUTPUT "${_dir}/batch_${_index}.cpp" CONTENT "${_batch}")
      list(APPEND _kept "${_dir}/batch_${_index}.cpp")
      set(_batch "")
    endif()
  endforeach()
  if(NOT _batch STREQUAL "")
    math(EXPR _index "${_count} / ${TITAN_BATCH_SIZE}")
    file(CONFIGURE OUTPUT "${_dir}/batch_${_index}.cpp" CONTENT "${_batch}")
    list(APPEND _kept "${_dir}/batch_${_index}.cpp")
  endif()
  set_property(TARGET ${target} PROPERTY SOURCES ${_kept})
endfunction()
