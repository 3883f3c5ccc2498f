// scale_by and axpy_by equal scale and axpy at the factor alpha * s[0], bit for bit (the backward of a
// fused loss uses them to scale by its upstream gradient without reading it on the host), and refuse a
// factor tensor of more than one element.
#include <gtest/gtest.h>

#include "tensor/kernels.h"
#include "tensor/random.h"

namespace lt {
namespace {

TEST(ScaleBy, EqualsScaleAndAxpyAtTheTensorsFactor) {
  for (DType dtype : {DType::F32, DType::F64}) {
    Rng rng(3);
    const Tensor x = Tensor::randn({37, 5}, rng, 1.0, dtype);
    const Tensor s = Tensor::full({1}, -0.37, dtype);
    const double factor = 2.5 * s.item();
    Tensor expected = Tensor::empty_like(x), got = Tensor::empty_like(x);
    kernels::scale(x, factor, expected);
    kernels::scale_by(x, s, 2.5, got);
    EXPECT_EQ(got.to(DType::F64).to_vector<double>(), expected.to(DType::F64).to_vector<double>());
    Tensor y1 = Tensor::randn({37, 5}, rng, 1.0, dtype);
    Tensor y2 = y1.clone();
    kernels::axpy(factor, x, y1);
    kernels::axpy_by(s, 2.5, x, y2);
    EXPECT_EQ(y2.to(DType::F64).to_vector<double>(), y1.to(DType::F64).to_vector<double>());
    EXPECT_THROW(kernels::scale_by(x, Tensor::zeros({2}, dtype), 1.0, got), Error);
  }
}

}  // namespace
}  // namespace lt
