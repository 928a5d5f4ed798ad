# TITAN_SANITIZE: build titan, its tools and its tests with AddressSanitizer and/or UBSan
# (docs/sanitizers.md). Accepts "address", "undefined" or both, separated by ',' or ';'.
# titan_sanitize_flags(<target>) adds the flags to an INTERFACE target every titan target links,
# so the precompiled header is built with exactly the flags of the sources that reuse it.
set(TITAN_SANITIZE "" CACHE STRING "Sanitizers to build with: address, undefined or address,undefined")

set(_titan_san_accepted address undefined)
string(REPLACE "," ";" _titan_san_list "${TITAN_SANITIZE}")
list(REMOVE_DUPLICATES _titan_san_list)
foreach(_s IN LISTS _titan_san_list)
  if(NOT _s IN_LIST _titan_san_accepted)
    message(FATAL_ERROR "[titan] TITAN_SANITIZE: expected address, undefined or address,undefined, got "
                        "\"${TITAN_SANITIZE}\" (\"${_s}\" is not supported). Pass e.g. -DTITAN_SANITIZE=address,undefined "
                        "or -DTITAN_SANITIZE= to turn sanitizers off.")
  endif()
endforeach()

function(titan_sanitize_flags target)
  if(NOT _titan_san_list)
    return()
  endif()
  list(JOIN _titan_san_list "," _san)
  # Frame pointers give ASan's reports whole stacks through titan's optimised code.
  set(_flags -fsanitize=${_san} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _titan_san_list)
    # UBSan only prints and carries on by default: abort instead, so undefined behaviour fails the test.
    list(APPEND _flags -fno-sanitize-recover=undefined)
  endif()
  target_compile_options(${target} INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>"
    # GCC 12 under -fsanitize=address warns that libstdc++'s own <regex> states "may be used uninitialized"
    # (std_function.h, from every TU that includes <regex>): a false positive of the instrumented code that
    # would fail a -Werror build.
    "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>")
  target_link_options(${target} INTERFACE ${_flags})
endfunction()

if(_titan_san_list)
  list(JOIN _titan_san_list "," _titan_san_joined)
  message(STATUS "titan: building with -fsanitize=${_titan_san_joined}")
endif()
