# Helpers shared by every CMakeLists.txt in the tree.

# tandem_library(<name> SOURCES ... [DEPS ...])
# One static library per module directory; includes are rooted at the repo
# root, so code says #include "src/common/log.h".
function(tandem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# tandem_test_timeout(<var>): a test's CTest timeout, 120 s unless it names
# one; three times that under TANDEM_SANITIZE, where code runs 2-3x slower.
macro(tandem_test_timeout var)
  if(NOT ${var})
    set(${var} 120)
  endif()
  if(TANDEM_SANITIZE)
    math(EXPR ${var} "${${var}} * 3")
  endif()
endmacro()

# tandem_test(<source.cc> LABEL <area> [DEPS ...] [TIMEOUT s] [ENV k=v ...])
# Registers one test file as one executable and one CTest test, named after
# the file (config_test.cc -> config_test) and labelled with its area so that
# `ctest -L <area>` runs one area.
function(tandem_test source)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "DEPS;ENV" ${ARGN})
  get_filename_component(name ${source} NAME_WE)
  add_executable(${name} ${source})
  # A test's own code is glue: -O1 compiles it in about half the time of
  # -O3 (kubelet_test.cc: 11 s against 19 s), and the libraries it tests
  # keep the build's optimisation. Benchmarks are not tests: they keep it too.
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
    target_compile_options(${name} PRIVATE -O1)
  endif()
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  tandem_test_timeout(ARG_TIMEOUT)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "TANDEM_BIN_DIR=${CMAKE_BINARY_DIR}/bin;${ARG_ENV}")
endfunction()

# tandem_test_variants(<test> LABEL <area> KIND simd|openblas VALUES v... [TIMEOUT s])
# Runs the binary of tandem_test <test> again under each CPU variant through
# tests/cpu_variant.sh: KIND simd sets TANDEM_CPU_SIMD (the engine's kernels
# run that level), KIND openblas sets OPENBLAS_CORETYPE (OpenBLAS runs that
# core's kernels). Each is its own CTest test, `<test>.<kind>=<value>`,
# skipped (saying which CPU flag is missing) where this CPU cannot run it.
function(tandem_test_variants name)
  cmake_parse_arguments(ARG "" "LABEL;KIND;TIMEOUT" "VALUES" ${ARGN})
  tandem_test_timeout(ARG_TIMEOUT)
  foreach(value ${ARG_VALUES})
    set(variant "${name}.${ARG_KIND}=${value}")
    add_test(NAME ${variant} COMMAND ${PROJECT_SOURCE_DIR}/tests/cpu_variant.sh ${ARG_KIND} ${value}
                                     $<TARGET_FILE:${name}>)
    set_tests_properties(${variant} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77
                         ENVIRONMENT "TANDEM_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
  endforeach()
endfunction()
