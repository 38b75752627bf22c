# The test list: name, sources, ranks, labels (unit | mpi | gpu | slow).
quintet_add_test(test_cpu_kernels SOURCES kernels/test_cpu_kernels.cpp LABELS unit)
quintet_add_test(test_model SOURCES model/test_model.cpp LABELS unit)
quintet_add_test(test_tokenizer SOURCES io/test_tokenizer.cpp LABELS unit)
quintet_add_test(test_end_to_end SOURCES train/test_end_to_end.cpp LABELS mpi TIMEOUT 900 LAUNCHES_MPIRUN)

# An independent PyTorch implementation of the same model and training semantics
# (scripts/torch_reference.py) must reproduce quintet's loss curve. Skipped without torch.
find_program(QUINTET_SYSTEM_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(QUINTET_SYSTEM_PYTHON)
  add_test(NAME test_against_torch
           COMMAND ${QUINTET_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/reference/test_against_torch.py
                   $<TARGET_FILE:quintet> ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/scratch/torch)
  set_tests_properties(test_against_torch PROPERTIES LABELS "mpi;reference" SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
quintet_add_test(test_deck SOURCES io/test_deck.cpp LABELS unit)
