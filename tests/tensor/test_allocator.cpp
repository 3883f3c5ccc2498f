// The caching allocator: size classes, block reuse, alignment, and the promise that a repeated
// training-like step allocates nothing from the system once it has warmed up.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "tensor/allocator.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

TEST(CachingAllocator, SizeClasses) {
  // Small sizes: multiples of 64 bytes.
  EXPECT_EQ(CachingAllocator::size_class(0), 64u);
  EXPECT_EQ(CachingAllocator::size_class(1), 64u);
  EXPECT_EQ(CachingAllocator::size_class(64), 64u);
  EXPECT_EQ(CachingAllocator::size_class(65), 128u);
  EXPECT_EQ(CachingAllocator::size_class(4096), 4096u);
  // Larger: four classes per power of two.
  EXPECT_EQ(CachingAllocator::size_class(4097), 5120u);
  EXPECT_EQ(CachingAllocator::size_class(5120), 5120u);
  EXPECT_EQ(CachingAllocator::size_class(8192), 8192u);
  EXPECT_EQ(CachingAllocator::size_class(8193), 10240u);
  EXPECT_EQ(CachingAllocator::size_class(size_t{1} << 30), size_t{1} << 30);
  EXPECT_EQ(CachingAllocator::size_class((size_t{1} << 30) + 1), (size_t{1} << 30) + (size_t{1} << 28));

  // Every class fits the request, wastes at most 25% past 4 KiB, never shrinks as sizes grow, and is
  // a multiple of 64 (so every block keeps the host alignment).
  size_t previous = 0;
  std::set<size_t> classes;
  for (size_t bytes = 1; bytes < (size_t{1} << 22); bytes += 1 + bytes / 7) {
    const size_t cls = CachingAllocator::size_class(bytes);
    ASSERT_GE(cls, bytes);
    ASSERT_GE(cls, previous);
    ASSERT_EQ(cls % 64, 0u) << bytes;
    if (bytes > 4096) {
      ASSERT_LE(cls, bytes + bytes / 4) << bytes;
    }
    previous = cls;
    classes.insert(cls);
  }
  EXPECT_LT(classes.size(), 200u);  // few distinct classes: cached blocks are likely to be reused
}

// A private allocator over counting raw functions, so the test sees exactly what reaches the system.
int raw_allocs = 0, raw_frees = 0;
void* counting_alloc(size_t bytes) {
  ++raw_allocs;
  return std::aligned_alloc(64, bytes);
}
void counting_free(void* ptr) {
  ++raw_frees;
  std::free(ptr);
}

// A device that is full: every system allocation fails, even after the cache is given back.
void* refuse(size_t) { return nullptr; }
void full_device(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = size_t{3} << 29;   // 1.5 GiB
  *total_bytes = size_t{80} << 30;  // 80 GiB
}

TEST(CachingAllocator, OutOfMemoryIsOneLineWithTheSizeAskedAndTheDevicesFreeMemory) {
  CachingAllocator allocator(refuse, counting_free, Device::cuda(1), full_device);
  try {
    allocator.allocate(size_t{5} << 30);
    ADD_FAILURE() << "a refused allocation returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "out of memory on cuda:1: asked for 5.00 GiB (5368709120 bytes) while lingtrain holds 0.00 GiB there; "
              "the device has 1.50 GiB free of 80.00 GiB (a smaller --batch or --seq needs less)");
  }
  CachingAllocator host(refuse, counting_free);  // no memory query: the line leaves the device's figures out
  try {
    host.allocate(100);
    ADD_FAILURE() << "a refused allocation returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "out of memory on cpu: asked for 0.00 GiB (128 bytes) while lingtrain holds "
                                     "0.00 GiB there (a smaller --batch or --seq needs less)");
  }
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameClass) {
  raw_allocs = raw_frees = 0;
  {
    CachingAllocator alloc(counting_alloc, counting_free);
    void* a = alloc.allocate(1000);  // class 1024
    EXPECT_EQ(alloc.stats().bytes_in_use, 1024u);
    alloc.release(a, 1000);
    EXPECT_EQ(alloc.stats().bytes_in_use, 0u);
    EXPECT_EQ(alloc.stats().bytes_reserved, 1024u);
    void* b = alloc.allocate(990);  // same class: the cached block comes back
    EXPECT_EQ(b, a);
    EXPECT_EQ(raw_allocs, 1);
    void* c = alloc.allocate(2000);  // another class: a new system block
    EXPECT_NE(c, b);
    EXPECT_EQ(raw_allocs, 2);
    EXPECT_EQ(alloc.stats().system_allocs, 2u);
    EXPECT_EQ(alloc.stats().allocations, 3u) << "two from the system, one from the cache";
    EXPECT_EQ(alloc.stats().peak_bytes_in_use, 1024u + 2048u);
    alloc.release(b, 990);
    alloc.release(c, 2000);
    alloc.empty_cache();
    EXPECT_EQ(raw_frees, 2);
    EXPECT_EQ(alloc.stats().bytes_reserved, 0u);
    void* d = alloc.allocate(1000);  // the cache is empty: back to the system
    EXPECT_EQ(raw_allocs, 3);
    alloc.release(d, 1000);
  }
  EXPECT_EQ(raw_frees, 3);  // the destructor gives the cache back
}

// One "training step": tensors of several shapes, a few kernels, everything freed at the end.
double training_like_step() {
  Rng rng(1);
  const Tensor x = Tensor::randn({33, 64}, rng);
  const Tensor w = Tensor::randn({64, 129}, rng);
  const Tensor bias = Tensor::randn({129}, rng);
  Tensor h = Tensor::empty({33, 129});
  kernels::matmul(x, false, w, false, h);
  Tensor h_biased = Tensor::empty_like(h);
  kernels::add(h, bias, h_biased);
  Tensor dw = Tensor::zeros_like(w);
  kernels::matmul(x, true, h_biased, false, dw);
  const Tensor ids = Tensor::from_vector<int32_t>({5}, {0, 3, 3, 1, 32});
  Tensor rows = Tensor::empty({5, 129});
  kernels::gather_rows(h_biased, ids, rows);
  Tensor total = Tensor::empty({1});
  kernels::sum(rows, total);
  const Tensor narrowed = dw.narrow(3, 10).clone();
  return total.item() + narrowed.to(DType::F64).to_vector<double>()[0];
}

TEST(CachingAllocator, RepeatedStepMakesNoSystemAllocations) {
  CachingAllocator& host = allocator_for(Device::cpu());
  const AllocatorStats before = host.stats();
  const double first = training_like_step();
  const AllocatorStats warmed = host.stats();
  EXPECT_EQ(warmed.bytes_in_use, before.bytes_in_use);  // everything the step allocated came back
  for (int repeat = 0; repeat < 3; ++repeat) {
    EXPECT_EQ(training_like_step(), first);
    const AllocatorStats after = host.stats();
    EXPECT_EQ(after.system_allocs, warmed.system_allocs) << "repeat " << repeat;
    EXPECT_EQ(after.bytes_reserved, warmed.bytes_reserved) << "repeat " << repeat;
    EXPECT_EQ(after.bytes_in_use, before.bytes_in_use) << "repeat " << repeat;
  }
}

TEST(CachingAllocator, HostBlocksAre64ByteAligned) {
  std::vector<Tensor> keep;  // held together so that each allocation is a distinct block
  for (int64_t n : {1, 3, 17, 129, 1000, 4097, 100000})
    for (DType d : {DType::F32, DType::F64, DType::BF16, DType::I32}) {
      keep.push_back(Tensor::empty({n}, d));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(keep.back().raw_data()) % 64, 0u) << n << " " << dtype_name(d);
    }
}

TEST(CachingAllocator, NoCudaInACpuBuild) {
  if (cuda_compiled()) GTEST_SKIP() << "CUDA backend compiled in";
  EXPECT_THROW(allocator_for(Device::cuda(0)), Error);
}

}  // namespace
}  // namespace lt
