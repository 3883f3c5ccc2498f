// The NCCL communicator: the collectives of dist/communicator.h on CUDA tensors, one GPU per rank.
// The processes are the ones an MPI launcher started; the MPI communicator (the bootstrap) only hands
// every rank NCCL's id for the group, after which the tensors travel between GPUs through NCCL.
//
// Determinism, as for MPI: NCCL's own reductions (ring or tree, chosen by message size and topology)
// add partial sums in an order that depends on the algorithm, so they are never used. Every rank
// receives the slice it owns from every rank (grouped ncclSend / ncclRecv), one kernel adds the parts
// in rank order, and the owned sums are gathered back (ncclAllGather moves bytes, so it is exact).
// The sums are the same additions, in the same dtype and order, as the MPI communicator's, so the two
// give the same bytes for the same data.
#pragma once
#include <memory>

#include "dist/communicator.h"

namespace lt {

// The GPU that rank `rank` of the bootstrap drives: rank % (the GPUs this process sees). Ranks are
// placed on the machines in blocks (mpirun's default), so on each machine consecutive ranks take
// its GPUs in turn. Fails with one clear line when there is no usable CUDA device.
Device nccl_device(int rank);

// A communicator over the same ranks as `bootstrap` (the MPI world), each on nccl_device(rank).
// Collective: every rank of bootstrap calls it. Fails with one clear line on every rank when some rank
// has no GPU, when NCCL fails (its own message), or when lingtrain was built without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap);

}  // namespace lt
