// The Tensor type: shapes and views, copies, dtype conversions (bf16 rounding checked bit by bit), and
// the random generator's determinism.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace lt {
namespace {

float f32_from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
bool bf16_is_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }

// ---- shapes and views -------------------------------------------------------------------------------

TEST(Tensor, ShapeNumelAndDims) {
  const Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.dim(-3), 2);
  EXPECT_THROW(t.dim(3), Error);
  EXPECT_THROW(t.dim(-4), Error);
  EXPECT_EQ(t.nbytes(), 24u * 4u);
  EXPECT_EQ(t.str(), "f32[2, 3, 4] cpu");
  EXPECT_EQ(shape_numel({}), 1);  // a scalar shape holds one element
  EXPECT_EQ(Tensor::empty({3, 0}).numel(), 0);
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().raw_data(), Error);
}

TEST(Tensor, ReshapeInfersOneDimensionAndSharesStorage) {
  const Tensor t = Tensor::from_vector<float>({2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_TRUE(r.shares_storage(t));
  EXPECT_EQ(r.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(t.reshape({2, -1, 3}).shape(), (Shape{2, 2, 3}));
  r.data<float>()[5] = 50.f;  // a write through the view is a write to the tensor
  EXPECT_EQ(t.data<float>()[5], 50.f);
}

TEST(Tensor, ReshapeErrors) {
  const Tensor t = Tensor::zeros({2, 6});
  EXPECT_THROW(t.reshape({5, -1}), Error);   // 12 is not a multiple of 5
  EXPECT_THROW(t.reshape({-1, -1}), Error);  // two unknowns
  EXPECT_THROW(t.reshape({5, 3}), Error);    // wrong element count
  EXPECT_THROW(t.reshape({0, -1}), Error);   // nothing to infer from
}

TEST(Tensor, NarrowIsAViewOfLeadingRows) {
  const Tensor t = Tensor::from_vector<double>({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Tensor middle = t.narrow(1, 2);
  EXPECT_EQ(middle.shape(), (Shape{2, 3}));
  EXPECT_TRUE(middle.shares_storage(t));
  EXPECT_EQ(middle.to_vector<double>(), (std::vector<double>{3, 4, 5, 6, 7, 8}));
  // Views of views accumulate their offsets.
  const Tensor last = middle.narrow(1, 1);
  EXPECT_EQ(last.to_vector<double>(), (std::vector<double>{6, 7, 8}));
  EXPECT_EQ(last.reshape({3}).to_vector<double>(), (std::vector<double>{6, 7, 8}));
  Tensor writable = t.narrow(3, 1);
  writable.fill_(-1.0);
  EXPECT_EQ(t.to_vector<double>()[9], -1.0);
  EXPECT_EQ(t.to_vector<double>()[8], 8.0);  // the row before is untouched
  EXPECT_EQ(t.narrow(4, 0).numel(), 0);
  EXPECT_THROW(t.narrow(3, 2), Error);
  EXPECT_THROW(t.narrow(-1, 1), Error);
}

TEST(Tensor, CloneIsIndependent) {
  const Tensor t = Tensor::from_vector<float>({3}, {1, 2, 3});
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage(t));
  c.data<float>()[0] = 100.f;
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  // A clone of a narrowed view copies only the view.
  const Tensor view_clone = Tensor::from_vector<int32_t>({3, 2}, {1, 2, 3, 4, 5, 6}).narrow(1, 1).clone();
  EXPECT_EQ(view_clone.to_vector<int32_t>(), (std::vector<int32_t>{3, 4}));
}

TEST(Tensor, FillAndItem) {
  Tensor t = Tensor::full({2, 2}, 2.5, DType::F64);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(4, 2.5));
  t.zero_();
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(Tensor::full({1}, -3.0, DType::I64).item(), -3.0);
  EXPECT_THROW(t.item(), Error);
}

TEST(Tensor, FromVectorToVectorRoundTrips) {
  const std::vector<float> f = {1.5f, -0.0f, std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(Tensor::from_vector<float>({2, 2}, f).to_vector<float>(), f);
  const std::vector<double> d = {1e-300, -2.0, 3.141592653589793};
  EXPECT_EQ(Tensor::from_vector<double>({3}, d).to_vector<double>(), d);
  const std::vector<int32_t> i = {std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max()};
  EXPECT_EQ(Tensor::from_vector<int32_t>({3}, i).to_vector<int32_t>(), i);
  const std::vector<int64_t> l = {std::numeric_limits<int64_t>::min(), -1, std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(Tensor::from_vector<int64_t>({3, 1}, l).to_vector<int64_t>(), l);
  EXPECT_EQ(Tensor::from_vector<float>({0}, {}).numel(), 0);
  EXPECT_THROW(Tensor::from_vector<float>({2, 2}, {1, 2, 3}), Error);
  // Typed access checks the dtype.
  EXPECT_THROW(Tensor::from_vector<float>({1}, {1}).to_vector<double>(), Error);
  EXPECT_THROW(Tensor::from_vector<float>({1}, {1}).bf16_data(), Error);
}

// ---- dtype conversions -------------------------------------------------------------------------------

TEST(DTypeConversion, FloatAndIntegerRoundTrips) {
  const Tensor f32 = Tensor::from_vector<float>({5}, {1.5f, -2.75f, 0.1f, 1e20f, -7.0f});
  const Tensor f64 = f32.to(DType::F64);
  EXPECT_EQ(f64.dtype(), DType::F64);
  // f32 -> f64 is exact, and back again gives the same floats.
  const std::vector<double> widened = f64.to_vector<double>();
  for (size_t i = 0; i < widened.size(); ++i) EXPECT_EQ(widened[i], static_cast<double>(f32.to_vector<float>()[i]));
  EXPECT_EQ(f64.to(DType::F32).to_vector<float>(), f32.to_vector<float>());
  // f64 -> f32 rounds to nearest.
  EXPECT_EQ(Tensor::from_vector<double>({1}, {0.1}).to(DType::F32).to_vector<float>()[0], 0.1f);

  // Floating to integer truncates toward zero, as a C++ cast does.
  const Tensor to_int = Tensor::from_vector<double>({4}, {2.7, -2.7, 0.0, 100.0});
  EXPECT_EQ(to_int.to(DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 100}));
  EXPECT_EQ(to_int.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 100}));
  const Tensor ids = Tensor::from_vector<int32_t>({3}, {-5, 0, 1 << 24});
  EXPECT_EQ(ids.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{-5, 0, 1 << 24}));
  EXPECT_EQ(ids.to(DType::I64).to(DType::I32).to_vector<int32_t>(), ids.to_vector<int32_t>());
  EXPECT_EQ(ids.to(DType::F32).to_vector<float>(), (std::vector<float>{-5.f, 0.f, 16777216.f}));

  // Converting to the same dtype is the same tensor (no copy).
  EXPECT_TRUE(f32.to(DType::F32).shares_storage(f32));
}

TEST(DTypeConversion, Bf16IsTheTopHalfOfF32) {
  // Every bf16 that is not NaN converts to f32 and back unchanged; NaNs stay NaN.
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = bf16_to_f32(bits);
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (bf16_is_nan(bits)) ASSERT_TRUE(bf16_is_nan(f32_to_bf16(f))) << std::hex << b;
    else ASSERT_EQ(f32_to_bf16(f), bits) << std::hex << b;
  }
}

// Hand-computed: bf16 keeps the top 16 bits of an f32; the low 16 bits decide the rounding (above
// 0x8000 up, below down, exactly 0x8000 to the even neighbour).
TEST(DTypeConversion, Bf16RoundsToNearestEven) {
  struct Case {
    uint32_t f32_bits;
    uint16_t bf16_bits;
    const char* why;
  };
  const Case cases[] = {
      {0x3F800000u, 0x3F80u, "1.0 exact"},
      {0x3F807FFFu, 0x3F80u, "just below half: down"},
      {0x3F808001u, 0x3F81u, "just above half: up"},
      {0x3F808000u, 0x3F80u, "tie, 0x3F80 is even: down"},
      {0x3F818000u, 0x3F82u, "tie, 0x3F81 is odd: up"},
      {0x3F80FFFFu, 0x3F81u, "near the next value: up"},
      {0x3FFF8000u, 0x4000u, "tie rounding up across the exponent boundary to 2.0"},
      {0x3FFFFFFFu, 0x4000u, "just below 2.0 rounds to 2.0"},
      {0x3F7F8000u, 0x3F80u, "tie below 1.0, odd: up to 1.0"},
      {0xBF800000u, 0xBF80u, "-1.0 exact"},
      {0xBF808000u, 0xBF80u, "negative tie, even: toward zero"},
      {0xBF818000u, 0xBF82u, "negative tie, odd: away from zero"},
      {0xBF808001u, 0xBF81u, "negative above half: away from zero"},
      {0x7F7F0000u, 0x7F7Fu, "largest finite bf16 exact"},
      {0x7F7F7FFFu, 0x7F7Fu, "below half under the top: stays finite"},
      {0x7F7F8000u, 0x7F80u, "tie at the top, odd: overflows to +inf"},
      {0x7F7FFFFFu, 0x7F80u, "max finite f32 overflows to +inf"},
      {0xFF7FFFFFu, 0xFF80u, "-max finite f32 overflows to -inf"},
      {0x7F800000u, 0x7F80u, "+inf"},
      {0xFF800000u, 0xFF80u, "-inf"},
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0"},
      {0x00000001u, 0x0000u, "smallest f32 denormal rounds to +0"},
      {0x80000001u, 0x8000u, "smallest negative denormal rounds to -0"},
      {0x00008000u, 0x0000u, "denormal tie, even: down to 0"},
      {0x00018000u, 0x0002u, "denormal tie, odd: up"},
      {0x00008001u, 0x0001u, "rounds up to the smallest bf16 denormal"},
      {0x007F8000u, 0x0080u, "largest denormal tie rounds up to the smallest normal"},
      {0x00800000u, 0x0080u, "smallest normal exact"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_bf16(f32_from_bits(c.f32_bits)), c.bf16_bits) << c.why << std::hex << " (0x" << c.f32_bits << ")";
  }
}

TEST(DTypeConversion, Bf16KeepsNanNan) {
  // Payloads only in the low 16 bits would truncate (or round) into infinity without the quiet bit.
  for (uint32_t bits : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u}) {
    const uint16_t b = f32_to_bf16(f32_from_bits(bits));
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_EQ(b & 0x8000u, (bits >> 16) & 0x8000u) << "sign kept for " << std::hex << bits;
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeConversion, TensorsToAndFromBf16) {
  const std::vector<uint32_t> bits = {0x3F808000u, 0x3F818000u, 0x3FFF8000u, 0x7F7FFFFFu, 0x00018000u, 0xBF818000u,
                                      0x7FC00000u};
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(f32_from_bits(b));
  const Tensor bf16 = Tensor::from_vector<float>({7}, values).to(DType::BF16);
  EXPECT_EQ(bf16.dtype(), DType::BF16);
  EXPECT_EQ(bf16.nbytes(), 14u);
  for (size_t i = 0; i < bits.size(); ++i) EXPECT_EQ(bf16.bf16_data()[i], f32_to_bf16(values[i])) << i;

  // bf16 -> f32 and -> f64 are exact widenings.
  const std::vector<float> back = bf16.to(DType::F32).to_vector<float>();
  const std::vector<double> back64 = bf16.to(DType::F64).to_vector<double>();
  for (size_t i = 0; i < bits.size(); ++i) {
    const float want = bf16_to_f32(bf16.bf16_data()[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(back[i]) && std::isnan(back64[i])) << i;
    } else {
      EXPECT_EQ(back[i], want) << i;
      EXPECT_EQ(back64[i], static_cast<double>(want)) << i;
    }
  }

  // f64 values that f32 holds exactly convert like their f32, and integers round like floats do:
  // 257 is a tie between 256 and 258 (even: 256), 259 a tie between 258 and 260 (even: 260).
  const Tensor from64 = Tensor::from_vector<double>({3}, {1.0 + 0x1.0p-8, 1.0 + 3 * 0x1.0p-8, -0.5}).to(DType::BF16);
  EXPECT_EQ(from64.bf16_data()[0], 0x3F80u);
  EXPECT_EQ(from64.bf16_data()[1], 0x3F82u);
  EXPECT_EQ(from64.bf16_data()[2], 0xBF00u);
  const Tensor from_ints = Tensor::from_vector<int32_t>({2}, {257, 259}).to(DType::BF16);
  EXPECT_EQ(bf16_to_f32(from_ints.bf16_data()[0]), 256.f);
  EXPECT_EQ(bf16_to_f32(from_ints.bf16_data()[1]), 260.f);
  EXPECT_EQ(from_ints.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{256, 260}));
}

TEST(DTypeConversion, Names) {
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64})
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_THROW(dtype_from_name("f16"), Error);
}

// ---- random numbers ----------------------------------------------------------------------------------

TEST(Rng, SameSeedSameStream) {
  Rng a(42), b(42), c(43);
  bool differs_from_other_seed = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t va = a.next_u64();
    EXPECT_EQ(va, b.next_u64());
    differs_from_other_seed = differs_from_other_seed || va != c.next_u64();
  }
  EXPECT_TRUE(differs_from_other_seed);
  a.reseed(7);
  b.reseed(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.normal(), b.normal());
}

// fill_normal gives what as many normal() calls give, in order: the spare carried in (an odd count
// before it) and out (an odd count), blocks of pairs longer than one transform block, nothing for n = 0.
TEST(Rng, FillNormalGivesTheValuesOfNormalCalls) {
  Rng one_by_one(5), filled(5);
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{3} << 20, int64_t{4}, int64_t{1}}) {
    std::vector<double> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    for (double& v : want) v = one_by_one.normal();
    filled.fill_normal(got.data(), n);
    ASSERT_EQ(got, want) << "n = " << n;
    ASSERT_EQ(one_by_one.normal(), filled.normal()) << "after n = " << n;
  }
  Rng r1(9), r2(9);
  const Tensor t = Tensor::randn({3, 5}, r1, 0.5, DType::F64);
  for (const double v : t.to_vector<double>()) EXPECT_EQ(v, 0.5 * r2.normal());
}

TEST(Rng, RangesAndRandomTensors) {
  Rng rng(3);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.uniform();
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
    ASSERT_LT(rng.below(7), 7u);
  }
  Rng r1(11), r2(11);
  const Tensor a = Tensor::randn({4, 5}, r1, 0.5, DType::F64);
  const Tensor b = Tensor::randn({4, 5}, r2, 0.5, DType::F64);
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
  // Drawing in element order means an f32 tensor holds the rounded f64 draws of the same stream.
  Rng r3(11);
  const std::vector<float> f = Tensor::randn({4, 5}, r3, 0.5, DType::F32).to_vector<float>();
  const std::vector<double> d = a.to_vector<double>();
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(d[i]));
  Rng r4(12);
  for (double v : Tensor::uniform({100}, r4, -2.0, 3.0, DType::F64).to_vector<double>()) EXPECT_TRUE(v >= -2.0 && v < 3.0);
  EXPECT_THROW(Tensor::randn({2}, r4, 1.0, DType::I32), Error);
}

}  // namespace
}  // namespace lt
