# cmake/fuzz.cmake -- the libFuzzer harnesses of fuzz/ (docs/reliability.md,
# "Hostile input").  Off by default; a fuzz build is its own build dir:
#
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DQTG_FUZZ=ON -DQTG_SANITIZE=ON
#   cmake --build build-fuzz -j2 --target fuzz_settings fuzz_json fuzz_console fuzz_http fuzz_signer fuzz_pg fuzz_approver
#   fuzz/run [SECONDS]          # all seven, each from its corpus, bounded
#
# Each target links the code under test (qtgcore, instrumented for coverage
# here) with fuzz/libfuzzer_main.c.  The plain build replays the committed
# corpora through the same entry points as a ctest
# (spec/c/test_fuzz_regressions.c), so this file is not needed for that.
option(QTG_FUZZ "Build the libFuzzer harnesses in fuzz/ (clang only)" OFF)

function(qtg_fuzz_targets)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "QTG_FUZZ needs clang: -DCMAKE_C_COMPILER=clang "
                        "(Debian: apt-get install clang libclang-rt-14-dev)")
  endif()
  target_compile_options(qtgcore PRIVATE -fsanitize=fuzzer-no-link)
  foreach(t settings json console http signer pg approver)
    add_executable(fuzz_${t} ${CMAKE_SOURCE_DIR}/fuzz/libfuzzer_main.c
                             ${CMAKE_SOURCE_DIR}/fuzz/fuzz_${t}.c
                             ${CMAKE_SOURCE_DIR}/fuzz/fuzz_host.c)
    target_include_directories(fuzz_${t} PRIVATE ${CMAKE_SOURCE_DIR}/fuzz)
    target_compile_definitions(fuzz_${t} PRIVATE QTG_FUZZ_TARGET=qtg_fuzz_${t})
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${t} PRIVATE qtgcore)
    # LuaJIT C modules (cjson) resolve lua_* symbols from the executable.
    set_target_properties(fuzz_${t} PROPERTIES ENABLE_EXPORTS ON)
  endforeach()
endfunction()

if(QTG_FUZZ)
  # Included from CMakeLists.txt after qtgcore exists, or given as
  # -DCMAKE_PROJECT_INCLUDE=cmake/fuzz.cmake (fuzz/run does that), in which
  # case the targets are made once the top directory is processed.
  if(TARGET qtgcore)
    qtg_fuzz_targets()
  else()
    cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL qtg_fuzz_targets)
  endif()
endif()
