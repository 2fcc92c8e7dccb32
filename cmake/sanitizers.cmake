# Sanitizer and fuzzing flags for every target of the build (included from the
# top-level CMakeLists.txt). TILEJIT_CONSUMER_FLAGS is what a program linked
# against this libtilejit must be compiled and linked with too (the consumer
# test passes it on): a sanitized shared library needs the runtime in the
# executable, which loads it first.
set(TILEJIT_SANITIZE_FLAGS "")
string(TOLOWER "${TILEJIT_SANITIZE}" _tilejit_san)
if(_tilejit_san STREQUAL "thread")
  set(TILEJIT_SANITIZE_FLAGS -fsanitize=thread)
elseif(_tilejit_san STREQUAL "address" OR TILEJIT_SANITIZE)
  set(TILEJIT_SANITIZE_FLAGS -fsanitize=address,undefined)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang's -fsanitize=function checks a signature word in front of every
    # indirectly called function: JIT-emitted kernels have none, and the word
    # in front of one at the start of a code mapping may not be readable.
    list(APPEND TILEJIT_SANITIZE_FLAGS -fno-sanitize=function)
  endif()
endif()
if(TILEJIT_SANITIZE_FLAGS)
  add_compile_options(${TILEJIT_SANITIZE_FLAGS} -fno-omit-frame-pointer)
  if(NOT _tilejit_san STREQUAL "thread")
    # A UBSan finding fails the run instead of scrolling past in the log.
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  add_link_options(${TILEJIT_SANITIZE_FLAGS})
endif()

if(TILEJIT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TILEJIT_FUZZ=ON needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++-19 (Debian: clang-19 libclang-rt-19-dev)")
  endif()
  # Coverage instrumentation in the library (tilejit_fuzz_instrument, called
  # at the end of the top-level CMakeLists.txt) and the harnesses, libFuzzer's
  # main only in the harnesses (fuzz/CMakeLists.txt): the library and the tests
  # of the same build stay ordinary programs, so one sanitizer build serves
  # both. The tests themselves are not instrumented: with the comparison
  # tracing in their own reference loops, gemm_test_amx and
  # attention_extend_test_amx passed their 120 s timeouts under ASan (72 s and
  # 78 s without). Linking with it is harmless everywhere (the sanitizer
  # runtime defines the coverage hooks).
  add_link_options(-fsanitize=fuzzer-no-link)
endif()

function(tilejit_fuzz_instrument)
  if(NOT TILEJIT_FUZZ)
    return()
  endif()
  foreach(t ${ARGN})
    if(TARGET ${t})
      target_compile_options(${t} PRIVATE -fsanitize=fuzzer-no-link)
    endif()
  endforeach()
endfunction()

set(TILEJIT_CONSUMER_FLAGS ${TILEJIT_SANITIZE_FLAGS})
if(TILEJIT_FUZZ)
  list(APPEND TILEJIT_CONSUMER_FLAGS -fsanitize=fuzzer-no-link)
endif()
list(JOIN TILEJIT_CONSUMER_FLAGS " " TILEJIT_CONSUMER_FLAGS)
