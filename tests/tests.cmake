# The test list: name, sources, ranks, labels (unit | mpi | gpu | slow).
quintet_add_test(test_cpu_kernels SOURCES kernels/test_cpu_kernels.cpp LABELS unit)
quintet_add_test(test_model SOURCES model/test_model.cpp LABELS unit)
quintet_add_test(test_tokenizer SOURCES io/test_tokenizer.cpp LABELS unit)
quintet_add_test(test_end_to_end SOURCES train/test_end_to_end.cpp LABELS mpi TIMEOUT 900 LAUNCHES_MPIRUN)
