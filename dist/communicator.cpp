#include "dist/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#ifdef LINGTRAIN_MPI
#include <mpi.h>
#include <sched.h>

#include "dist/watchdog.h"
#include "tensor/cores.h"
#endif

namespace lt {

namespace {

void check_contiguous_cpu(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.defined() && t.is_cpu(), op, ": ", what, " must be a CPU tensor (the MPI communicator moves host memory), got ",
           t.defined() ? t.str() : "undefined");
}

// The element offsets of a buffer's parts (what: "send" or "receive", for the error).
std::vector<int64_t> part_offsets(const std::vector<int64_t>& counts, int ranks, const Tensor& t, const char* what) {
  LT_CHECK(static_cast<int>(counts.size()) == ranks, "all_to_all: ", counts.size(), " ", what,
           " counts for ", ranks, " ranks");
  std::vector<int64_t> offsets(counts.size());
  int64_t total = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    LT_CHECK(counts[j] >= 0, "all_to_all: ", what, " count ", counts[j], " for rank ", j, " is negative");
    offsets[j] = total;
    total += counts[j];
  }
  LT_CHECK(t.defined() && total == t.numel(), "all_to_all: the ", what, " counts add up to ", total,
           " elements, the buffer holds ", t.defined() ? t.numel() : 0);
  return offsets;
}

}  // namespace

AllToAllParts all_to_all_parts(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                               const std::vector<int64_t>& recv_counts, int ranks) {
  AllToAllParts parts{part_offsets(send_counts, ranks, in, "send"), part_offsets(recv_counts, ranks, out, "receive")};
  LT_CHECK(in.dtype() == out.dtype(), "all_to_all: out ", out.str(), " is not in's dtype ", dtype_name(in.dtype()));
  return parts;
}

namespace {

void check_float(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": ", what, " must be f32 or f64, got ", t.str());
}

void check_reducible(const Tensor& t, const char* op, const char* what) {
  check_contiguous_cpu(t, op, what);
  check_float(t, op, what);
}

// out[i] = sum over r of parts[r][i] in rank order (then / count for a mean): the fixed order is what
// makes the result independent of timing.
template <class T>
void sum_in_rank_order(const T* parts, int ranks, int64_t n, ReduceOp op, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = parts[i];
  for (int r = 1; r < ranks; ++r)
    for (int64_t i = 0; i < n; ++i) out[i] += parts[static_cast<int64_t>(r) * n + i];
  if (op == ReduceOp::Mean) {
    const T inv = static_cast<T>(1.0 / ranks);
    for (int64_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

void sum_in_rank_order(DType dtype, const void* parts, int ranks, int64_t n, ReduceOp op, void* out) {
  if (dtype == DType::F32) sum_in_rank_order(static_cast<const float*>(parts), ranks, n, op, static_cast<float*>(out));
  else sum_in_rank_order(static_cast<const double*>(parts), ranks, n, op, static_cast<double*>(out));
}

// A world of one: every collective is a copy (or nothing), of tensors on any device.
class SingleProcess : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single process"; }
  void all_reduce(Tensor& x, ReduceOp) override { check_float(x, "all_reduce", "x"); }
  void all_gather(const Tensor& in, Tensor& out) override {
    LT_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(), "all_gather: out must hold ", in.numel(),
             " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    out.copy_from(in.reshape(out.shape()));
  }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) override {
    check_float(in, "reduce_scatter", "in");
    LT_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(), "reduce_scatter: out must hold ", in.numel(),
             " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    out.copy_from(in.reshape(out.shape()));
  }
  void gather(const Tensor& in, Tensor& out, int root) override {
    LT_CHECK(root == 0, "gather: root ", root, " outside 1 rank");
    all_gather(in, out);
  }
  void broadcast(Tensor&, int root) override { LT_CHECK(root == 0, "broadcast: root ", root, " outside 1 rank"); }
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    all_to_all_parts(in, send_counts, out, recv_counts, 1);
    out.copy_from(in.reshape(out.shape()));
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }
};

#ifdef LINGTRAIN_MPI

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, message, &length);
  fail("MPI ", call, " failed: ", std::string(message, static_cast<size_t>(length)));
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::F32 ? MPI_FLOAT : MPI_DOUBLE; }

// Whether the launcher's processes on this machine outnumber the cores this one may use. A blocking
// collective busy-polls MPI's progress engine until the last rank arrives; with more ranks than cores
// the pollers take the cores from the ranks still computing. Four ranks on 2 vCPUs spent 94% of their
// time in MPICH and UCX that way, ~7 s a moe-s step. (A rank bound to one core of its own also counts
// as outnumbered; yielding costs it nothing where no other rank wants that core.)
bool ranks_outnumber_cores() {
  static const bool outnumber = processes_on_this_machine() > default_threads(1);
  return outnumber;
}

// Starts a collective (`start` fills the request) and waits for it: MPI_Wait where every rank has a core,
// else MPI_Test with sched_yield between polls, so that a waiting rank lends its core to a computing one.
template <class Start>
void run_collective(const char* call, Start start) {
  MPI_Request request;
  check_mpi(start(&request), call);
  if (!ranks_outnumber_cores()) {
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), call);
    return;
  }
  for (int done = 0;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    sched_yield();
  }
}

class Mpi : public Communicator {
 public:
  explicit Mpi(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~Mpi() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return "MPI (" + std::to_string(size_) + " ranks)"; }
  bool callable_from_another_thread() const override {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level >= MPI_THREAD_SERIALIZED;
  }

  // Rank r owns elements [r n / P, (r + 1) n / P): it receives them from everyone, sums them in rank
  // order, and the owned sums are gathered back into x.
  void all_reduce(Tensor& x, ReduceOp op) override {
    check_reducible(x, "all_reduce", "x");
    const WatchedCollective watch("all_reduce", x.nbytes());
    const int64_t n = x.numel(), element = static_cast<int64_t>(dtype_size(x.dtype()));
    std::vector<int> counts(size_), offsets(size_);
    for (int r = 0; r < size_; ++r) {
      offsets[r] = static_cast<int>(n * r / size_);
      counts[r] = static_cast<int>(n * (r + 1) / size_) - offsets[r];
    }
    const int mine = counts[rank_];
    scratch_.resize(static_cast<size_t>(mine * size_ * element + mine * element));
    char* received = scratch_.data();
    char* reduced = received + mine * size_ * element;
    std::vector<int> receive_counts(size_, mine), receive_offsets(size_);
    for (int r = 0; r < size_; ++r) receive_offsets[r] = r * mine;
    const MPI_Datatype type = mpi_type(x.dtype());
    run_collective("Ialltoallv", [&](MPI_Request* request) {
      return MPI_Ialltoallv(x.raw_data(), counts.data(), offsets.data(), type, received, receive_counts.data(),
                            receive_offsets.data(), type, comm_, request);
    });
    sum_in_rank_order(x.dtype(), received, size_, mine, op, reduced);
    run_collective("Iallgatherv", [&](MPI_Request* request) {
      return MPI_Iallgatherv(reduced, mine, type, x.raw_data(), counts.data(), offsets.data(), type, comm_, request);
    });
    // Out: every element this rank does not own, then its owned sums to each other rank.
    bytes_sent_ += ((n - mine) + static_cast<int64_t>(mine) * (size_ - 1)) * element;
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_contiguous_cpu(in, "all_gather", "in");
    check_contiguous_cpu(out, "all_gather", "out");
    LT_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "all_gather: out must hold ",
             in.numel() * size_, " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    const int bytes = static_cast<int>(in.nbytes());
    const WatchedCollective watch("all_gather", bytes);
    run_collective("Iallgather", [&](MPI_Request* request) {
      return MPI_Iallgather(in.raw_data(), bytes, MPI_BYTE, out.raw_data(), bytes, MPI_BYTE, comm_, request);
    });
    bytes_sent_ += static_cast<int64_t>(bytes) * (size_ - 1);
  }

  // In bytes, so that any dtype travels; MPI's counts are ints.
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    check_contiguous_cpu(in, "all_to_all", "in");
    check_contiguous_cpu(out, "all_to_all", "out");
    const AllToAllParts parts = all_to_all_parts(in, send_counts, out, recv_counts, size_);
    const int64_t element = static_cast<int64_t>(dtype_size(in.dtype()));
    auto in_bytes = [&](const std::vector<int64_t>& elements) {
      std::vector<int> bytes(elements.size());
      for (size_t j = 0; j < elements.size(); ++j) {
        LT_CHECK(elements[j] * element <= std::numeric_limits<int>::max(), "all_to_all: ", elements[j] * element,
                 " bytes at one offset exceed MPI's int counts");
        bytes[j] = static_cast<int>(elements[j] * element);
      }
      return bytes;
    };
    const std::vector<int> sends = in_bytes(send_counts), send_at = in_bytes(parts.send_at);
    const std::vector<int> receives = in_bytes(recv_counts), receive_at = in_bytes(parts.receive_at);
    const WatchedCollective watch("all_to_all", in.nbytes());
    run_collective("Ialltoallv", [&](MPI_Request* request) {
      return MPI_Ialltoallv(in.raw_data(), sends.data(), send_at.data(), MPI_BYTE, out.raw_data(), receives.data(),
                            receive_at.data(), MPI_BYTE, comm_, request);
    });
    for (int j = 0; j < size_; ++j)
      if (j != rank_) bytes_sent_ += sends[static_cast<size_t>(j)];
  }

  void gather(const Tensor& in, Tensor& out, int root) override {
    check_contiguous_cpu(in, "gather", "in");
    LT_CHECK(root >= 0 && root < size_, "gather: root ", root, " outside ", size_, " ranks");
    if (rank_ == root) {
      check_contiguous_cpu(out, "gather", "out");
      LT_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "gather: out must hold ",
               in.numel() * size_, " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    }
    const int bytes = static_cast<int>(in.nbytes());
    const WatchedCollective watch("gather", bytes);
    run_collective("Igather", [&](MPI_Request* request) {
      return MPI_Igather(in.raw_data(), bytes, MPI_BYTE, rank_ == root ? out.raw_data() : nullptr, bytes, MPI_BYTE,
                         root, comm_, request);
    });
    if (rank_ != root) bytes_sent_ += bytes;
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check_reducible(in, "reduce_scatter", "in");
    check_contiguous_cpu(out, "reduce_scatter", "out");
    LT_CHECK(in.numel() == out.numel() * size_ && out.dtype() == in.dtype(), "reduce_scatter: in must hold ", size_,
             " x ", out.numel(), " elements of ", dtype_name(out.dtype()), ", got ", in.str());
    const int n = static_cast<int>(out.numel());
    scratch_.resize(static_cast<size_t>(in.nbytes()));
    const WatchedCollective watch("reduce_scatter", in.nbytes());
    run_collective("Ialltoall", [&](MPI_Request* request) {
      return MPI_Ialltoall(in.raw_data(), n, mpi_type(in.dtype()), scratch_.data(), n, mpi_type(in.dtype()), comm_,
                           request);
    });
    bytes_sent_ += static_cast<int64_t>(n) * (size_ - 1) * static_cast<int64_t>(dtype_size(in.dtype()));
    sum_in_rank_order(in.dtype(), scratch_.data(), size_, n, op, out.raw_data());
  }

  void broadcast(Tensor& x, int root) override {
    check_contiguous_cpu(x, "broadcast", "x");
    LT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside ", size_, " ranks");
    const WatchedCollective watch("broadcast", x.nbytes());
    run_collective("Ibcast", [&](MPI_Request* request) {
      return MPI_Ibcast(x.raw_data(), static_cast<int>(x.nbytes()), MPI_BYTE, root, comm_, request);
    });
    if (rank_ == root) bytes_sent_ += static_cast<int64_t>(x.nbytes()) * (size_ - 1);
  }

  void barrier() override {
    const WatchedCollective watch("barrier", 0);
    run_collective("Ibarrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    const WatchedCollective watch("split", 0);
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_unique<Mpi>(sub, true);
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<char> scratch_;  // reused across calls: steady-state steps allocate nothing
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

#endif  // LINGTRAIN_MPI

}  // namespace

namespace {
#ifdef LINGTRAIN_MPI
// Whether MPI is up (initialised, not yet finalised) with more than one rank.
bool mpi_world_running(int& rank) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return size > 1;
}
#endif
}  // namespace

int process_rank() {
#ifdef LINGTRAIN_MPI
  int rank = 0;
  if (mpi_world_running(rank)) return rank;
#endif
  // Not in the world yet (an error before it is joined): the launcher's rank of this process.
  if (launched_by_mpi())
    for (const char* variable : {"PMI_RANK", "OMPI_COMM_WORLD_RANK"})
      if (const char* value = std::getenv(variable)) return std::atoi(value);
  return -1;
}

void abort_all_ranks(int exit_code) {
#ifdef LINGTRAIN_MPI
  // A rank that fails before joining the world (a flag it cannot read) joins it first: the other ranks
  // wait for it there, in MPI_Init or a collective, and the launcher ends them for a rank that dies as a
  // member of the world, not for a process that leaves before it ever joined (the job hung).
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && launched_by_mpi()) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  }
  int rank = 0;
  if (mpi_world_running(rank)) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(exit_code);
  }
#else
  (void)exit_code;
#endif
}

bool launched_by_mpi() {
  // MPICH's hydra (and other PMI launchers) set PMI_SIZE; Open MPI sets OMPI_COMM_WORLD_SIZE.
  return std::getenv("PMI_SIZE") != nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

int processes_on_this_machine() {
  for (const char* variable : {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (const char* value = std::getenv(variable)) {
      const int processes = std::atoi(value);
      if (processes > 0) return processes;
    }
  return 1;
}

std::vector<std::string> gather_text(Communicator& comm, const std::string& text, int root) {
  // Lengths first, then every text padded to the longest (a gather takes equal parts), as raw bytes in
  // i64 words.
  Tensor length = Tensor::full({1}, static_cast<double>(text.size()), DType::I64);
  Tensor lengths = Tensor::empty({comm.size()}, DType::I64);
  comm.all_gather(length, lengths);
  const std::vector<int64_t> sizes = lengths.to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  const int64_t words = (longest + 7) / 8;
  Tensor own = Tensor::zeros({words}, DType::I64);
  std::memcpy(own.raw_data(), text.data(), text.size());
  Tensor all = Tensor::empty({words * comm.size()}, DType::I64);
  comm.gather(own, all, root);
  std::vector<std::string> out;
  if (comm.rank() != root) return out;
  const char* bytes = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < comm.size(); ++r)
    out.emplace_back(bytes + static_cast<int64_t>(r) * words * 8, static_cast<size_t>(sizes[static_cast<size_t>(r)]));
  return out;
}

std::unique_ptr<Communicator> make_single_process_communicator() { return std::make_unique<SingleProcess>(); }

void Communicator::all_to_all(const Tensor& in, Tensor& out) {
  const int ranks = size();
  LT_CHECK(in.defined() && in.numel() % ranks == 0, "all_to_all: ", in.defined() ? in.numel() : 0,
           " elements do not split into ", ranks, " equal parts");
  const std::vector<int64_t> counts(static_cast<size_t>(ranks), in.numel() / ranks);
  all_to_all(in, counts, out, counts);
}

namespace {

class DeviceRouted : public Communicator {
 public:
  DeviceRouted(Communicator& host, std::unique_ptr<Communicator> owned_host, std::unique_ptr<Communicator> device)
      : host_(host), owned_host_(std::move(owned_host)), device_(std::move(device)) {
    LT_CHECK(device_->size() == host_.size() && device_->rank() == host_.rank(), "route_by_device: the device group (rank ",
             device_->rank(), " of ", device_->size(), ") is not the host group (rank ", host_.rank(), " of ",
             host_.size(), ")");
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string describe() const override { return device_->describe() + " with " + host_.describe() + " for host data"; }
  bool callable_from_another_thread() const override {
    return host_.callable_from_another_thread() && device_->callable_from_another_thread();
  }

  void all_reduce(Tensor& x, ReduceOp op) override {
    route(x, [&](Communicator& c) { c.all_reduce(x, op); });
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    route(in, [&](Communicator& c) { c.all_gather(in, out); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    route(in, [&](Communicator& c) { c.reduce_scatter(in, out, op); });
  }
  void gather(const Tensor& in, Tensor& out, int root) override {
    route(in, [&](Communicator& c) { c.gather(in, out, root); });
  }
  void broadcast(Tensor& x, int root) override {
    route(x, [&](Communicator& c) { c.broadcast(x, root); });
  }
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    route(in, [&](Communicator& c) { c.all_to_all(in, send_counts, out, recv_counts); });
  }
  void barrier() override { host_.barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_.split(color, key);
    Communicator& host_ref = *host;
    return std::make_unique<DeviceRouted>(host_ref, std::move(host), device_->split(color, key));
  }

 private:
  // The communicator for `t`'s memory; what it sends counts as this one's.
  template <class Call>
  void route(const Tensor& t, Call call) {
    Communicator& target = t.defined() && !t.is_cpu() ? *device_ : host_;
    const int64_t before = target.bytes_sent();
    call(target);
    bytes_sent_ += target.bytes_sent() - before;
  }

  Communicator& host_;
  std::unique_ptr<Communicator> owned_host_;  // set for the groups of a split, which own their host side
  std::unique_ptr<Communicator> device_;
};

}  // namespace

std::unique_ptr<Communicator> route_by_device(Communicator& host, std::unique_ptr<Communicator> device) {
  return std::make_unique<DeviceRouted>(host, nullptr, std::move(device));
}

std::unique_ptr<Communicator> make_world_communicator() {
  if (!launched_by_mpi()) return make_single_process_communicator();
#ifdef LINGTRAIN_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Serialized: the gradient average may run on a thread of its own while the main thread makes no call.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
    std::atexit(finalize_mpi);
  }
  return std::make_unique<Mpi>(MPI_COMM_WORLD, false);
#else
  fail("launched by an MPI launcher, but this lingtrain was built without MPI (install libmpich-dev and rebuild)");
#endif
}

}  // namespace lt
