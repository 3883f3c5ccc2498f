#include "dist/nccl_communicator.h"

#ifdef LINGTRAIN_NCCL
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cuda/cuda_runtime.h"
#endif

namespace lt {

Device nccl_device(int rank) {
  const int gpus = cuda_device_count();
  LT_CHECK(gpus > 0, "NCCL communicator: no usable CUDA device (cudaGetDeviceCount failed or found none)");
  return Device::cuda(rank % gpus);
}

#ifdef LINGTRAIN_NCCL

// out[i] = sum over r of parts[r n + i] in rank order (then / ranks for a mean), f32 or f64, on the
// current device's default stream. Defined in dist/nccl_sum.cu.
void sum_in_rank_order_cuda(DType dtype, const void* parts, int ranks, int64_t n, ReduceOp op, void* out);

namespace {

// Every kernel and copy of the tensor layer runs on the legacy default stream (tensor/cuda/
// cuda_runtime.h), so the collectives run there too: they start after the kernels that wrote their
// tensors and finish before the kernels that read them, with no synchronisation here.
const cudaStream_t kStream = nullptr;

// The status names only the class of error; NCCL keeps the detail (e.g. "Duplicate GPU detected") as
// the process's last error, whatever the communicator, hence none is passed.
std::string nccl_message(ncclResult_t status) {
  const char* detail = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(status)) + (detail && *detail ? std::string(" (") + detail + ")" : "");
}

void check_nccl(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) fail("NCCL ", call, " failed: ", nccl_message(status));
}

ncclDataType_t nccl_type(DType dtype) { return dtype == DType::F32 ? ncclFloat32 : ncclFloat64; }

// Whether `ok_here` holds on every rank of `bootstrap`. Asked before a step that every rank must
// enter together, so that a rank that cannot take part makes all of them stop with an error, rather
// than leaving the others waiting inside NCCL for it.
bool every_rank_agrees(Communicator& bootstrap, bool ok_here) {
  Tensor failures = Tensor::full({1}, ok_here ? 0.0 : 1.0, DType::F64);
  bootstrap.all_reduce(failures, ReduceOp::Sum);
  return failures.item() == 0.0;
}

class Nccl : public Communicator {
 public:
  Nccl(ncclComm_t comm, Device device) : comm_(comm), device_(device) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  // Finalize and destroy are collective (NCCL waits for the other ranks' calls), so every rank must
  // destroy its communicators in the same order. A destructor does not throw: errors are dropped.
  ~Nccl() override {
    ncclCommFinalize(comm_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return "NCCL (" + std::to_string(size_) + " ranks, this one on " + device_.str() + ")";
  }

  // Rank r owns elements [r c, (r + 1) c) with c = ceil(n / P), fewer at the end: it receives them
  // from everyone, sums them in rank order, and the owned sums are gathered back into x. The chunks
  // are equal (the last ones padded) because ncclAllGather takes one count for all ranks.
  void all_reduce(Tensor& x, ReduceOp op) override {
    check_reducible(x, "all_reduce", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    const int64_t chunk = (n + size_ - 1) / size_, element = static_cast<int64_t>(dtype_size(x.dtype()));
    std::vector<int64_t> offsets(size_), counts(size_);
    for (int r = 0; r < size_; ++r) {
      offsets[r] = std::min(n, r * chunk);
      counts[r] = std::min(n, (r + 1) * chunk) - offsets[r];
    }
    const cuda::DeviceGuard guard(device_.index);
    // When the chunks fill x exactly, the sums are written into x and gathered in place; otherwise
    // into a padded buffer, of which the first n elements are copied back.
    const bool in_place = chunk * size_ == n;
    char* received = scratch((size_ * chunk + (in_place ? 0 : size_ * chunk)) * element);
    char* gathered = in_place ? static_cast<char*>(x.raw_data()) : received + size_ * chunk * element;
    char* owned = gathered + rank_ * chunk * element;
    exchange_owned_slices(x, offsets, counts, received);
    sum_in_rank_order_cuda(x.dtype(), received, size_, counts[rank_], op, owned);
    check_nccl(ncclAllGather(owned, gathered, static_cast<size_t>(chunk * element), ncclUint8, comm_, kStream),
               "ncclAllGather");
    if (!in_place)
      LT_CUDA_CHECK(cudaMemcpyAsync(x.raw_data(), gathered, x.nbytes(), cudaMemcpyDeviceToDevice, kStream));
    bytes_sent_ += ((n - counts[rank_]) + chunk * (size_ - 1)) * element;
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_on_device(in, "all_gather", "in");
    check_on_device(out, "all_gather", "out");
    LT_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "all_gather: out must hold ",
             in.numel() * size_, " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    const cuda::DeviceGuard guard(device_.index);
    check_nccl(ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, comm_, kStream), "ncclAllGather");
    bytes_sent_ += static_cast<int64_t>(in.nbytes()) * (size_ - 1);
  }

  // Point to point into root's slices (NCCL has no gather of its own); root copies its own part.
  void gather(const Tensor& in, Tensor& out, int root) override {
    check_on_device(in, "gather", "in");
    LT_CHECK(root >= 0 && root < size_, "gather: root ", root, " outside ", size_, " ranks");
    const size_t bytes = in.nbytes();
    const cuda::DeviceGuard guard(device_.index);
    if (rank_ != root) {
      check_nccl(ncclSend(in.raw_data(), bytes, ncclUint8, root, comm_, kStream), "ncclSend");
      bytes_sent_ += static_cast<int64_t>(bytes);
      return;
    }
    check_on_device(out, "gather", "out");
    LT_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "gather: out must hold ",
             in.numel() * size_, " elements of ", dtype_name(in.dtype()), ", got ", out.str());
    char* slices = static_cast<char*>(out.raw_data());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size_; ++q)
      if (q != root) check_nccl(ncclRecv(slices + q * bytes, bytes, ncclUint8, q, comm_, kStream), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    LT_CUDA_CHECK(cudaMemcpyAsync(slices + root * bytes, in.raw_data(), bytes, cudaMemcpyDeviceToDevice, kStream));
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check_reducible(in, "reduce_scatter", "in");
    check_on_device(out, "reduce_scatter", "out");
    LT_CHECK(in.numel() == out.numel() * size_ && out.dtype() == in.dtype(), "reduce_scatter: in must hold ", size_,
             " x ", out.numel(), " elements of ", dtype_name(out.dtype()), ", got ", in.str());
    const int64_t n = out.numel();
    std::vector<int64_t> offsets(size_), counts(size_, n);
    for (int r = 0; r < size_; ++r) offsets[r] = r * n;
    const cuda::DeviceGuard guard(device_.index);
    char* received = scratch(in.nbytes());
    exchange_owned_slices(in, offsets, counts, received);
    sum_in_rank_order_cuda(in.dtype(), received, size_, n, op, out.raw_data());
    bytes_sent_ += n * (size_ - 1) * static_cast<int64_t>(dtype_size(in.dtype()));
  }

  // Point to point, every pair in one group (NCCL has no all-to-all of its own), in bytes so that any dtype
  // travels. Both sides of a pair see the same count, so skipping the empty parts keeps the pairs matched.
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    check_on_device(in, "all_to_all", "in");
    check_on_device(out, "all_to_all", "out");
    const AllToAllParts parts = all_to_all_parts(in, send_counts, out, recv_counts, size_);
    const auto element = static_cast<int64_t>(dtype_size(in.dtype()));
    const char* data = static_cast<const char*>(in.raw_data());
    char* received = static_cast<char*>(out.raw_data());
    const cuda::DeviceGuard guard(device_.index);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size_; ++q) {
      const auto j = static_cast<size_t>(q);
      if (send_counts[j] > 0)
        check_nccl(ncclSend(data + parts.send_at[j] * element, static_cast<size_t>(send_counts[j] * element), ncclUint8, q,
                            comm_, kStream),
                   "ncclSend");
      if (recv_counts[j] > 0)
        check_nccl(ncclRecv(received + parts.receive_at[j] * element, static_cast<size_t>(recv_counts[j] * element),
                            ncclUint8, q, comm_, kStream),
                   "ncclRecv");
      if (q != rank_) bytes_sent_ += send_counts[j] * element;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void broadcast(Tensor& x, int root) override {
    check_on_device(x, "broadcast", "x");
    LT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside ", size_, " ranks");
    const cuda::DeviceGuard guard(device_.index);
    check_nccl(ncclBroadcast(x.raw_data(), x.raw_data(), x.nbytes(), ncclUint8, root, comm_, kStream),
               "ncclBroadcast");
    if (rank_ == root) bytes_sent_ += static_cast<int64_t>(x.nbytes()) * (size_ - 1);
  }

  // An all-reduce of one integer (its value is never read), waited for on the host: once it has
  // finished, every rank has reached the barrier.
  void barrier() override {
    const cuda::DeviceGuard guard(device_.index);
    char* token = scratch(sizeof(uint32_t));
    check_nccl(ncclAllReduce(token, token, 1, ncclUint32, ncclSum, comm_, kStream), "ncclAllReduce");
    device_count::host_sync();
    LT_CUDA_CHECK(cudaStreamSynchronize(kStream));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    // NCCL reads a negative color (NCCL_SPLIT_NOCOLOR) as "in no new communicator".
    LT_CHECK(color >= 0, "split: color must be >= 0, got ", color);
    const cuda::DeviceGuard guard(device_.index);
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_unique<Nccl>(sub, device_);
  }

 private:
  void check_on_device(const Tensor& t, const char* op, const char* what) const {
    LT_CHECK(t.defined() && t.device() == device_, op, ": ", what, " must be a CUDA tensor on ", device_.str(),
             " (the NCCL communicator moves that GPU's memory), got ", t.defined() ? t.str() : "undefined");
  }

  void check_reducible(const Tensor& t, const char* op, const char* what) const {
    check_on_device(t, op, what);
    LT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": ", what, " must be f32 or f64, got ",
             t.str());
  }

  // Rank r sends counts[q] elements from offsets[q] of x to each rank q (itself included), and receives
  // counts[r] from each rank q into received[q counts[r] ...]: every rank ends with every rank's copy
  // of the slice it owns, in rank order. One group, so that the transfers progress together (issued
  // one by one, every rank would wait in its first send for a receive not yet posted).
  void exchange_owned_slices(const Tensor& x, const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts,
                             char* received) {
    const ncclDataType_t type = nccl_type(x.dtype());
    const int64_t element = static_cast<int64_t>(dtype_size(x.dtype())), mine = counts[rank_];
    const char* data = static_cast<const char*>(x.raw_data());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size_; ++q) {
      // Both sides of a pair see the same count, so skipping the empty ones keeps the pairs matched.
      if (counts[q] > 0)
        check_nccl(ncclSend(data + offsets[q] * element, static_cast<size_t>(counts[q]), type, q, comm_, kStream),
                   "ncclSend");
      if (mine > 0)
        check_nccl(ncclRecv(received + q * mine * element, static_cast<size_t>(mine), type, q, comm_, kStream),
                   "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  // Device memory reused across calls, grown to the largest call: steady-state steps allocate
  // nothing. Replacing it while queued work still reads the old one is safe: the caching allocator
  // hands that memory out again only to work queued after it on the same stream.
  char* scratch(int64_t bytes) {
    const int64_t words = (bytes + 7) / 8;  // 8-byte words keep f64 parts aligned
    if (!scratch_.defined() || scratch_.numel() < words) scratch_ = Tensor::empty({words}, DType::I64, device_);
    return static_cast<char*>(scratch_.raw_data());
  }

  ncclComm_t comm_;
  Device device_;
  int rank_ = 0, size_ = 1;
  Tensor scratch_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap) {
  const int rank = bootstrap.rank();
  const bool have_gpu = cuda_device_count() > 0;
  LT_CHECK(every_rank_agrees(bootstrap, have_gpu), "NCCL communicator: ", have_gpu ? "another rank has" : "this rank has",
           " no usable CUDA device (cudaGetDeviceCount failed or found none)");
  const Device device = nccl_device(rank);

  // Rank 0 draws the id that names the new group; every rank needs it to join.
  ncclUniqueId id{};
  std::string id_error;
  if (rank == 0) {
    const ncclResult_t status = ncclGetUniqueId(&id);
    if (status != ncclSuccess) id_error = nccl_message(status);
  }
  if (!every_rank_agrees(bootstrap, id_error.empty()))
    fail("NCCL ncclGetUniqueId failed on rank 0", id_error.empty() ? "" : ": " + id_error);
  // The bootstrap moves tensors, so the id's 128 bytes travel as 16 int64 words.
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  Tensor packed_id = Tensor::zeros({static_cast<int64_t>(sizeof(ncclUniqueId) / sizeof(int64_t))}, DType::I64);
  std::memcpy(packed_id.raw_data(), &id, sizeof id);
  bootstrap.broadcast(packed_id, 0);
  std::memcpy(&id, packed_id.raw_data(), sizeof id);

  // NCCL binds the new communicator to the current device.
  const cuda::DeviceGuard guard(device.index);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, bootstrap.size(), id, rank), "ncclCommInitRank");
  return std::make_unique<Nccl>(comm, device);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&) {
  fail("NCCL communicator: this lingtrain was built without NCCL (it needs nvcc, nccl.h and libnccl at build time)");
}

#endif  // LINGTRAIN_NCCL

}  // namespace lt
