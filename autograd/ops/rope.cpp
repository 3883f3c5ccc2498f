// rope: rotary position embedding of x [B, T, H, D], forward and backward.
//
// The forward turns each pair (x[i], x[i + D/2]) of a head vector by an angle that depends only on the
// position, so it is a linear map y = R x with R orthogonal; the backward is dx = R^T dy, the same
// rotation by the negated angle (kernels::rope with inverse = true). Nothing needs to be saved.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct RopeNode : Node {
  double theta = 0;
  int64_t pos_offset = 0;
  const char* name() const override { return "rope"; }

  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::empty_like(g);
    kernels::rope(g, theta, pos_offset, /*inverse=*/true, dx);
    return {dx};
  }
};

}  // namespace

Variable rope(const Variable& x, double theta, int64_t pos_offset) {
  LT_PROFILE_SCOPE("rope");
  const Tensor& xv = x.value();
  Tensor y = Tensor::empty_like(xv);
  kernels::rope(xv, theta, pos_offset, /*inverse=*/false, y);
  auto node = std::make_shared<RopeNode>();
  node->theta = theta;
  node->pos_offset = pos_offset;
  return make_result(y, node, {x});
}

}  // namespace lt
