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

# tandem_fuzz_test(<name> SOURCES <file>... LABEL <area> SECONDS <s> [PKG <module>...] [SEEDS <dir>])
# A libFuzzer program under AddressSanitizer + UBSan, and a CTest test that
# runs it for SECONDS (any crash, sanitizer report or abort() fails it).
# The project compiles with g++; libFuzzer needs clang (Debian's clang-14
# and libclang-rt-14-dev, installed by ./tandem), so the program is built by
# custom commands with clang++, one per source (absolute paths; headers
# tracked through depfiles), the code under test compiled here with
# coverage instrumentation rather than linked from the g++ libraries. PKG:
# pkg-config modules to link (abseil's). SEEDS: a directory of inputs the
# run starts from; it is only read (-seed_inputs), so what the fuzzer
# finds stays in memory, not in the source tree. Not built in a
# TANDEM_SANITIZE build, where it would be the same program again; left
# out with a warning where clang++ is missing.
function(tandem_fuzz_test name)
  cmake_parse_arguments(ARG "" "LABEL;SECONDS;SEEDS" "SOURCES;PKG" ${ARGN})
  if(TANDEM_SANITIZE)
    return()
  endif()
  # clang-14 (what ./tandem installs) has only clang++-14; the `clang`
  # package adds the clang++ name.
  find_program(CLANGXX NAMES clang++-14 clang++)
  if(NOT CLANGXX)
    message(WARNING "clang++ not found: the fuzz test ${name} is not built (./tandem installs clang)")
    return()
  endif()
  set(libs "")
  if(ARG_PKG)
    execute_process(COMMAND pkg-config --libs ${ARG_PKG} OUTPUT_VARIABLE libs OUTPUT_STRIP_TRAILING_WHITESPACE
                    COMMAND_ERROR_IS_FATAL ANY)
    separate_arguments(libs)
  endif()
  set(launcher "")
  if(CCACHE_PROGRAM)
    set(launcher ${CCACHE_PROGRAM})
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${name}.dir)
  file(MAKE_DIRECTORY ${dir})
  set(objects "")
  foreach(src ${ARG_SOURCES})
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
    string(REPLACE "/" "_" obj ${rel})
    set(obj ${dir}/${obj}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${launcher} ${CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined
              -I${PROJECT_SOURCE_DIR} -MD -MF ${obj}.d -c ${src} -o ${obj}
      DEPENDS ${src}
      DEPFILE ${obj}.d
      COMMENT "Building ${rel} for the fuzzer ${name} with clang"
      VERBATIM)
    list(APPEND objects ${obj})
  endforeach()
  set(fuzzer ${CMAKE_BINARY_DIR}/tests/${name})
  add_custom_command(
    OUTPUT ${fuzzer}
    COMMAND ${CLANGXX} -fsanitize=fuzzer,address,undefined ${objects} ${libs} -o ${fuzzer}
    DEPENDS ${objects}
    COMMENT "Linking the fuzzer ${name} (libFuzzer)"
    VERBATIM)
  add_custom_target(${name}_bin ALL DEPENDS ${fuzzer})
  set(seeds "")
  if(ARG_SEEDS)
    file(GLOB seed_files CONFIGURE_DEPENDS ${ARG_SEEDS}/*)
    list(JOIN seed_files "," seed_list)
    set(seeds -seed_inputs=${seed_list})
  endif()
  # -timeout: one input running this long is a finding (a hang), not a slow run.
  add_test(NAME ${name} COMMAND ${fuzzer} -max_total_time=${ARG_SECONDS} -timeout=10 -rss_limit_mb=1024
                                -print_final_stats=1 ${seeds})
  math(EXPR timeout "${ARG_SECONDS} + 60")
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${timeout})
endfunction()
