# grpc++ as the IMPORTED target PkgConfig::GRPCPP (the name pkg_check_modules gives it), from one `pkg-config --cflags`
# and one `--libs`; sets GRPCPP_FOUND. pkg_check_modules asks pkg-config 16 times (each field, shared and static),
# and grpc++'s .pc file pulls in some 90 absl modules: 18 s of a 2-core machine for every configure, titan's and each
# consumer's of the installed package (titanConfig.cmake), where these two calls take 3 s.
# grpc++ by pkg-config at all: Debian's CMake package for it also links libprotobuf, which the client does not need.
macro(titan_find_grpcpp)
  set(GRPCPP_FOUND FALSE)
  if(TARGET PkgConfig::GRPCPP)
    set(GRPCPP_FOUND TRUE)
  elseif(PKG_CONFIG_EXECUTABLE)
    execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --cflags grpc++ RESULT_VARIABLE _titan_grpcpp_cflags_status
                    OUTPUT_VARIABLE _titan_grpcpp_cflags OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --libs grpc++ RESULT_VARIABLE _titan_grpcpp_libs_status
                    OUTPUT_VARIABLE _titan_grpcpp_libs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_titan_grpcpp_cflags_status EQUAL 0 AND _titan_grpcpp_libs_status EQUAL 0)
      separate_arguments(_titan_grpcpp_cflags UNIX_COMMAND "${_titan_grpcpp_cflags}")
      separate_arguments(_titan_grpcpp_libs UNIX_COMMAND "${_titan_grpcpp_libs}")
      set(_titan_grpcpp_includes "${_titan_grpcpp_cflags}")
      list(FILTER _titan_grpcpp_includes INCLUDE REGEX "^-I")
      list(TRANSFORM _titan_grpcpp_includes REPLACE "^-I" "")
      list(FILTER _titan_grpcpp_cflags EXCLUDE REGEX "^-I")
      add_library(PkgConfig::GRPCPP INTERFACE IMPORTED)
      # The link words in pkg-config's order (-L, -l and -Wl,--push-state ... --pop-state around -latomic).
      set_target_properties(PkgConfig::GRPCPP PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_titan_grpcpp_includes}"
                            INTERFACE_COMPILE_OPTIONS "${_titan_grpcpp_cflags}"
                            INTERFACE_LINK_LIBRARIES "${_titan_grpcpp_libs}")
      set(GRPCPP_FOUND TRUE)
    endif()
  endif()
endmacro()
