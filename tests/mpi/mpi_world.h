// The world of the dist_mpi_tests executable, set up in its main (test_collectives.cpp): every test
// file of it runs across the same mpiexec-launched ranks.
#pragma once
#include <memory>

#include "dist/communicator.h"

namespace lt::mpi_test {
extern std::unique_ptr<Communicator> world;
extern int expected_size;  // the rank count the test was launched for
}  // namespace lt::mpi_test
