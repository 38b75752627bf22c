# The test list: name, sources, ranks, labels (unit | mpi | gpu | slow).
