# The precompiled header, in a form ccache can share between clones.
#
# CMake's own PCH passes clang `-Xclang -include -Xclang <clone>/build/.../cmake_pch.hxx`: an argument ccache's
# base_dir does not rewrite, so every object of a fresh clone (CI's) hashed that clone's path and missed the cache.
# With TITAN_PCH_DIR set (scripts/setup.sh sets it) and clang, titan builds the PCH by its own rule instead:
#   - the header is copied to <TITAN_PCH_DIR>/<hash of its text>/pch.hpp, a path that is the same for every clone;
#   - an OBJECT library compiles that copy as a C++ header (the "object" is the PCH) with the flags of the targets
#     that use it, so its command line is the same in every clone and ccache returns the same bytes;
#   - each source that may use it gets `-include-pch <path relative to the build folder>`, again the same text
#     in every clone (ninja runs compilers from the build folder).
# Without TITAN_PCH_DIR, or with another compiler, CMake's target_precompile_headers as before.
set(TITAN_PCH_DIR "" CACHE PATH "Folder outside the clone for the precompiled header's source (clang; empty: CMake's PCH)")
set(TITAN_PCH_HEADER "${PROJECT_SOURCE_DIR}/include/titan/detail/pch.hpp")

if(TITAN_PCH_DIR AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(TITAN_OWN_PCH ON)
  file(SHA256 "${TITAN_PCH_HEADER}" _titan_pch_hash)
  string(SUBSTRING "${_titan_pch_hash}" 0 16 _titan_pch_hash)
  set(TITAN_PCH_SOURCE "${TITAN_PCH_DIR}/${_titan_pch_hash}/pch.hpp")
  # COPYONLY keeps the copy's timestamp when its text is unchanged: nothing rebuilds on a new clone.
  configure_file("${TITAN_PCH_HEADER}" "${TITAN_PCH_SOURCE}" COPYONLY)
else()
  set(TITAN_OWN_PCH OFF)
endif()

# titan_define_pch(<name> LINK <libraries>... [OPTIONS <compile options>...])
# A PCH for the targets whose flags are those of LINK's usage requirements plus OPTIONS (every option that
# changes predefined macros, such as -O1, must be in both).
function(titan_define_pch name)
  cmake_parse_arguments(PARSE_ARGV 1 _pch "" "" "LINK;OPTIONS")
  if(NOT TITAN_OWN_PCH)
    return()
  endif()
  set(_lib titan_pch_${name})
  add_library(${_lib} OBJECT "${TITAN_PCH_SOURCE}")
  set_source_files_properties("${TITAN_PCH_SOURCE}" TARGET_DIRECTORY ${_lib} PROPERTIES LANGUAGE CXX)
  target_compile_options(${_lib} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-xc++-header>" ${_pch_OPTIONS})
  target_compile_features(${_lib} PRIVATE cxx_std_20)
  target_link_libraries(${_lib} PRIVATE ${_pch_LINK})
  # CMake names the object of a source outside both trees by its whole path, less the leading '/'.
  string(REGEX REPLACE "^/" "" _mangled "${TITAN_PCH_SOURCE}")
  set(_abs "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/${_lib}.dir/${_mangled}${CMAKE_CXX_OUTPUT_EXTENSION}")
  file(RELATIVE_PATH _rel "${CMAKE_BINARY_DIR}" "${_abs}")
  set_property(GLOBAL PROPERTY TITAN_PCH_${name}_ABS "${_abs}")
  set_property(GLOBAL PROPERTY TITAN_PCH_${name}_REL "${_rel}")
endfunction()

# titan_precompiled_header(<target> <name>)
# Gives <target>'s C++ sources (but those marked SKIP_PRECOMPILE_HEADERS) the PCH <name>. Call once <target> has
# all its sources. Without titan's own PCH: CMake's, the first target of a name holding it and the others reusing it.
function(titan_precompiled_header target name)
  if(NOT TITAN_OWN_PCH)
    get_property(_owner GLOBAL PROPERTY TITAN_CMAKE_PCH_${name})
    if(_owner)
      target_precompile_headers(${target} REUSE_FROM ${_owner})
    else()
      target_precompile_headers(${target} PRIVATE "${TITAN_PCH_HEADER}")
      set_property(GLOBAL PROPERTY TITAN_CMAKE_PCH_${name} ${target})
    endif()
    return()
  endif()
  get_property(_abs GLOBAL PROPERTY TITAN_PCH_${name}_ABS)
  get_property(_rel GLOBAL PROPERTY TITAN_PCH_${name}_REL)
  if(NOT _abs)
    message(FATAL_ERROR "[titan] titan_precompiled_header(${target} ${name}): expected titan_define_pch(${name}) "
                        "first, got no PCH of that name. Define it where the flags it needs are known.")
  endif()
  add_dependencies(${target} titan_pch_${name})
  get_target_property(_sources ${target} SOURCES)
  get_target_property(_source_dir ${target} SOURCE_DIR)
  foreach(_src IN LISTS _sources)
    if(NOT _src MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    if(NOT IS_ABSOLUTE "${_src}")
      set(_src "${_source_dir}/${_src}")
    endif()
    get_source_file_property(_skip "${_src}" TARGET_DIRECTORY ${target} SKIP_PRECOMPILE_HEADERS)
    if(_skip)
      continue()
    endif()
    set_property(SOURCE "${_src}" TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS
                 -include-pch "${_rel}")
    set_property(SOURCE "${_src}" TARGET_DIRECTORY ${target} APPEND PROPERTY OBJECT_DEPENDS "${_abs}")
  endforeach()
endfunction()
