// The communicator: how the processes of one training run exchange tensors. Three implementations:
// one process (the default: nothing to exchange, no MPI involved), MPI across the processes that
// `mpirun -n N build/lingtrain ...` starts (CPU tensors), and NCCL between their GPUs (CUDA tensors,
// dist/nccl_communicator.h). The data-parallel and EDiT layers above speak only this interface, on
// slices of the flat parameter and gradient buffers.
//
// Determinism: a reduction gives the same bytes for the same world size whatever the timing. MPI's own
// reductions may combine partial sums in an order that depends on the algorithm it picks, so the
// reductions here never use them: every rank receives the values it owns from every other rank (an
// all-to-all), adds them in rank order, and the results are gathered back.
// NCCL's reductions are built the same way, so they give the same bytes as MPI's for the same data.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

enum class ReduceOp { Sum, Mean };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single process" or "MPI (N ranks)", for logs and errors.
  virtual std::string describe() const = 0;

  // x (any shape, f32 or f64, contiguous, on the implementation's device) becomes the sum (or mean) over the ranks of their
  // x, identical bytes on every rank.
  virtual void all_reduce(Tensor& x, ReduceOp op) = 0;
  // Rank r's `in` [n] goes to out[r n : (r + 1) n] on every rank; out [size n].
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // in [size n] on every rank; out [n] on rank r is the sum (or mean) over ranks of in[r n : (r + 1) n].
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // Rank r's `in` [n] goes to out[r n : (r + 1) n] on root (out [size n]); other ranks' out is not used.
  virtual void gather(const Tensor& in, Tensor& out, int root) = 0;
  // x takes root's value on every rank.
  virtual void broadcast(Tensor& x, int root) = 0;
  // Rank r's `in` holds size() consecutive parts, part j (send_counts[j] elements) for rank j; `out`
  // receives every rank's part for r, in rank order (recv_counts[j] elements from rank j, which must be
  // rank j's send_counts[r]). Any dtype, in and out alike; a part may be empty. A pure exchange, so the
  // same bytes whatever the timing; bytes_sent counts the parts that leave this rank. Checked before any
  // transfer: counts that do not fit in and out, or a count missing, is one clear error on that rank.
  virtual void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                          const std::vector<int64_t>& recv_counts) = 0;
  // Equal parts: in and out hold size() parts of in.numel() / size() elements each.
  void all_to_all(const Tensor& in, Tensor& out);
  virtual void barrier() = 0;
  // The ranks that pass the same color form a new communicator, ordered by key then by rank (the rows
  // and columns of a 2-D mesh). Collective: every rank calls it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Whether a thread other than the one that made the communicator may make its calls, one thread at a
  // time (MPI's MPI_THREAD_SERIALIZED): the gradient average that runs during the backward needs it
  // (dist/data_parallel.h).
  virtual bool callable_from_another_thread() const { return true; }

  // The payload bytes this rank has sent to other ranks through this communicator (what it puts on the
  // wire, whatever the library adds): the measure behind "bytes moved per step".
  int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  int64_t bytes_sent_ = 0;
};

// Every rank's `text` on root, in rank order (empty elsewhere): for per-rank state of any length.
std::vector<std::string> gather_text(Communicator& comm, const std::string& text, int root);

// Whether this process was started by an MPI launcher (mpirun / mpiexec set the process-manager
// variables); a plain run is one process and never initialises MPI.
bool launched_by_mpi();
// How many processes the launcher started on this machine, this one included, as it says in the
// environment (MPICH's MPI_LOCALNRANKS, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE); 1 when not launched by
// one. Read before MPI starts, so that each rank sizes its thread pool to its share of the cores.
int processes_on_this_machine();
// The world: MPI when launched by an MPI launcher (and compiled with MPI), else a single process.
// Fails with one clear line when launched by mpirun but built without MPI.
std::unique_ptr<Communicator> make_world_communicator();
std::unique_ptr<Communicator> make_single_process_communicator();

// The communicator of ranks whose models live on GPUs (one per rank): CUDA tensors (gradients,
// parameters, buffers, EDiT's pseudo-gradients) travel through `device` (NCCL), CPU tensors (the
// agreement between ranks, step statistics, EDiT's per-layer tables, checkpoint state) through `host`
// (MPI). Both span the same ranks in the same order; split() splits both, so the groups of an EDiT mesh
// route the same way. `host` must outlive the result.
std::unique_ptr<Communicator> route_by_device(Communicator& host, std::unique_ptr<Communicator> device);

// For the communicators' all_to_all: the element offsets of the parts of in and of out, after checking
// that they share a dtype and that each side's counts are `ranks` non-negative numbers tiling it exactly.
struct AllToAllParts {
  std::vector<int64_t> send_at, receive_at;
};
AllToAllParts all_to_all_parts(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                               const std::vector<int64_t>& recv_counts, int ranks);

// This process's rank in a multi-process run (the launcher's, before the world is joined), or -1 when it
// runs alone (for error messages).
int process_rank();
// Ends this rank of a multi-process run at once with exit_code, for an error: without MPI_Finalize
// (a collective, which would wait for the others), so the launcher sees a rank die and ends the rest,
// as it does for a killed rank. MPI_Abort would end them too, but can tear the launcher down before it
// forwards this rank's last error line. A rank launched by MPI that has not joined the world yet joins it
// first. Does nothing when the process runs alone.
void abort_all_ranks(int exit_code);

}  // namespace lt
