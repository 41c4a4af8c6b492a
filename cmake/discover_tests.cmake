# Included by ctest (the directory's TEST_INCLUDE_FILES): every test of one test binary as a ctest
# test of its own, run alone in its own process (`BIN --run NAME`), under a timeout, reported skipped
# when it exits with TEST_SKIP_CODE (tests/test.h). Set before including: MOE_TEST_BIN, the binary
# (its names are unique across binaries); MOE_TEST_DIR, where they run; MOE_TEST_TIMEOUT, seconds.
execute_process(COMMAND ${MOE_TEST_BIN} --list OUTPUT_VARIABLE moe_names RESULT_VARIABLE moe_rc)
if(NOT moe_rc EQUAL 0)
  # a binary that cannot list its tests (not built, or crashing) fails as a test of its own
  get_filename_component(moe_bin ${MOE_TEST_BIN} NAME)
  add_test(${moe_bin}_list ${MOE_TEST_BIN} --list)
  return()
endif()
string(REGEX REPLACE "\n$" "" moe_names "${moe_names}")
string(REPLACE "\n" ";" moe_names "${moe_names}")
# OpenMP's threads wait passively: `ctest -j` runs several tests at once, each with its own threads
# (and mpirun's ranks theirs), and libgomp's default spin before sleeping takes the cores that the
# other processes' threads wait for (two 2-thread tests on 2 cores ran 50-100x slower).
foreach(moe_name IN LISTS moe_names)
  add_test(${moe_name} ${MOE_TEST_BIN} --run ${moe_name})
  set_tests_properties(${moe_name} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT OMP_WAIT_POLICY=PASSIVE
                       TIMEOUT ${MOE_TEST_TIMEOUT} WORKING_DIRECTORY ${MOE_TEST_DIR})
endforeach()
