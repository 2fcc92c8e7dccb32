# ctest steps (cmake -P): install the built tilejit into a fresh prefix, then
#   CHECK=consumer (default): configure, build and run tests/consumer against
#                             that prefix only;
#   CHECK=tool:               run the installed `tilejit cpuinfo` from the prefix.
#
#   -DTILEJIT_BUILD_DIR=<the tilejit build tree>  -DCONSUMER_SOURCE_DIR=<tests/consumer>
#   -DWORK_DIR=<scratch dir>  -DGENERATOR=<generator>  -DCXX_COMPILER=<c++ compiler>
#   -DWANTED_VERSION=<MAJOR.MINOR find_package asks for; empty: any>
if(NOT DEFINED CHECK)
  set(CHECK consumer)
endif()
foreach(var TILEJIT_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "[${name}] ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step '${name}' failed (exit ${rc})")
  endif()
endfunction()

step(install ${CMAKE_COMMAND} --install ${TILEJIT_BUILD_DIR} --prefix ${prefix})

# The installed tree: the public headers, the library, the package files.
foreach(f include/tilejit/tilejit.h include/tilejit/error.h include/tilejit/tilejit_c.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
file(GLOB_RECURSE configs ${prefix}/*/tilejitConfig.cmake)
file(GLOB_RECURSE versions ${prefix}/*/tilejitConfigVersion.cmake)
file(GLOB_RECURSE targets ${prefix}/*/tilejitTargets.cmake)
file(GLOB_RECURSE libs ${prefix}/*/libtilejit.so)
foreach(what configs versions targets libs)
  if(NOT ${what})
    message(FATAL_ERROR "install is missing the ${what} file(s) of the package")
  endif()
endforeach()
# Nothing private is installed: only include/tilejit/.
file(GLOB top_includes RELATIVE ${prefix}/include ${prefix}/include/*)
if(NOT top_includes STREQUAL "tilejit")
  message(FATAL_ERROR "install puts more than include/tilejit/ into include/: ${top_includes}")
endif()

if(CHECK STREQUAL "tool")
  # The installed command line must start from its prefix without
  # LD_LIBRARY_PATH (it needs an install RPATH to find lib/libtilejit.so).
  if(NOT EXISTS ${prefix}/bin/tilejit)
    message(FATAL_ERROR "install is missing bin/tilejit")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/tilejit cpuinfo
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "[tool] ${out}${err}")
  if(NOT rc EQUAL 0)
    file(READ_ELF ${prefix}/bin/tilejit RUNPATH runpath RPATH rpath)
    message(FATAL_ERROR "the installed ${prefix}/bin/tilejit does not run from its prefix "
            "(exit ${rc}); its RUNPATH is '${runpath}', RPATH '${rpath}': it needs an install "
            "RPATH such as $ORIGIN/../lib to find lib/libtilejit.so")
  endif()
  return()
endif()

# The C app's compiler: the C driver of the C++ one (clang++-19 -> clang-19,
# g++ -> gcc, c++ -> cc), so a sanitized build's runtimes match.
string(REGEX REPLACE "clang\\+\\+" "clang" c_compiler "${CXX_COMPILER}")
string(REGEX REPLACE "g\\+\\+" "gcc" c_compiler "${c_compiler}")
string(REGEX REPLACE "c\\+\\+" "cc" c_compiler "${c_compiler}")
step(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
     -DCMAKE_C_COMPILER=${c_compiler} "-DCMAKE_C_FLAGS=${CONSUMER_CXX_FLAGS}"
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
     -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
     "-DTILEJIT_WANTED_VERSION=${WANTED_VERSION}"
     # A sanitized libtilejit needs the sanitizer runtime loaded first: the
     # app is built with the same flags (else it segfaults at start-up).
     "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}")
step(build ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
# The app must find the installed library by itself (no LD_LIBRARY_PATH).
step(run ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK_DIR}/build/app)
step(run_c ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK_DIR}/build/c_app)
