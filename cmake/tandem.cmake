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

# tandem_test(<source.cc> LABEL <area> [DEPS ...] [TIMEOUT s] [ENV k=v ...])
# Registers one test file as one executable and one CTest test, named after
# the file (config_test.cc -> config_test) and labelled with its area so that
# `ctest -L <area>` runs one area.
function(tandem_test source)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "DEPS;ENV" ${ARGN})
  get_filename_component(name ${source} NAME_WE)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "TANDEM_BIN_DIR=${CMAKE_BINARY_DIR}/bin;${ARG_ENV}")
endfunction()
