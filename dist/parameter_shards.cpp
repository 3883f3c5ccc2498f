#include "dist/parameter_shards.h"

#include <algorithm>

#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace lt {

ParameterShards::ParameterShards(Communicator& comm, FlatParameters& params, Communicator* expert_copies,
                                 int expert_group_size)
    : comm_(comm), expert_copies_(expert_copies), expert_group_size_(expert_group_size), params_(params) {
  LT_CHECK(params.sharded_by_layer(), "parameter sharding: the flat buffers are not laid out in parts");
  int64_t largest = 0;
  for (size_t u = 0; u < params.units().size(); ++u) {
    const FlatParameters::Unit& unit = params.units()[u];
    const Communicator& over = comm_of(u);
    LT_CHECK(unit.parts == over.size() && unit.part == over.rank(), "parameter sharding: ", unit.range.name,
             " is laid out as part ", unit.part, " of ", unit.parts, ", this is rank ", over.rank(), " of ",
             over.size());
    units_of_layer_[unit.range.name].push_back(u);
    largest = std::max(largest, unit.held.size());
  }
  head_unit_ = params.units().size() - 1;
  gathered_.assign(params.units().size(), false);
  in_backward_.assign(params.units().size(), false);
  values_bf16_.resize(params.units().size());
  shadows_.resize(params.units().size());
  const Tensor& values = params.values();
  reduced_ = Tensor::empty({largest}, values.dtype(), values.device());
}

Communicator& ParameterShards::comm_of(size_t unit) const {
  if (!params_.units()[unit].experts) return comm_;
  LT_CHECK(expert_copies_ != nullptr, "parameter sharding: experts' units without their copies' communicator");
  return *expert_copies_;
}

void ParameterShards::gather(size_t u) {
  Tensor& whole = params_.unit_values(u);
  whole.storage().restore();
  const FlatParameters::Range& held = params_.units()[u].held;
  comm_of(u).all_gather(params_.values().narrow(held.begin, held.size()), whole);
  gathered_[u] = true;
  // Mixed precision on a GPU: the matmuls read the unit's bf16 rounding, made once per gather, as a step
  // without sharding rounds all the values once (tensor/bf16_shadow.h).
  if (kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs && !whole.is_cpu()) {
    shadows_[u].reset();
    values_bf16_[u] = Tensor::empty(whole.shape(), DType::BF16, whole.device());
    kernels::convert(whole, values_bf16_[u]);
    shadows_[u] = std::make_unique<Bf16Shadow>(whole, values_bf16_[u]);
  }
}

void ParameterShards::release(size_t u) {
  shadows_[u].reset();
  values_bf16_[u] = Tensor();
  params_.unit_values(u).storage().release();
  gathered_[u] = false;
}

void ParameterShards::before_forward(const std::string& layer) {
  const auto found = units_of_layer_.find(layer);
  if (found == units_of_layer_.end()) return;
  // Gathered afresh even when still whole (a head whose backward never came): the update may have moved it.
  for (const size_t u : found->second) gather(u);
}

void ParameterShards::after_forward(const std::string& layer) {
  const auto found = units_of_layer_.find(layer);
  if (found == units_of_layer_.end()) return;
  for (const size_t u : found->second)
    if (!(grad_enabled() && u == head_unit_)) release(u);
}

void ParameterShards::before_backward(const std::string& layer) {
  const auto found = units_of_layer_.find(layer);
  if (found == units_of_layer_.end() || in_backward_[found->second.front()]) return;
  for (size_t u = in_backward_.size(); u-- > 0;)
    if (in_backward_[u]) reduce(u);
  for (const size_t u : found->second) {
    if (!gathered_[u]) gather(u);
    Tensor& grads = params_.unit_grads(u);
    grads.storage().restore();
    grads.zero_();
    in_backward_[u] = true;
  }
}

void ParameterShards::reduce(size_t u) {
  const FlatParameters::Unit& unit = params_.units()[u];
  Tensor reduced = reduced_.narrow(0, unit.held.size());
  Tensor& grads = params_.unit_grads(u);
  comm_of(u).reduce_scatter(grads, reduced, ReduceOp::Mean);
  // The group's size is a power of two in every layout worth running, where this division is exact.
  if (unit.experts) kernels::scale(reduced, 1.0 / expert_group_size_, reduced);
  Tensor held = params_.grads().narrow(unit.held.begin, unit.held.size());
  kernels::axpy(1.0, reduced, held);
  grads.storage().release();
  release(u);
  in_backward_[u] = false;
}

void ParameterShards::finish_backward() {
  for (size_t u = gathered_.size(); u-- > 0;) {
    if (in_backward_[u]) reduce(u);
    if (gathered_[u]) release(u);
  }
}

double ParameterShards::grad_sum_squares(double own) {
  Tensor total = Tensor::full({1}, own, DType::F64);
  comm_.all_reduce(total, ReduceOp::Sum);
  return total.item();
}

Tensor ParameterShards::whole(const Tensor& held) {
  const bool gathers = comm_.rank() == 0 || (expert_copies_ != nullptr && expert_copies_->rank() == 0);
  const Tensor held_host = held.to(Device::cpu());
  Tensor out = gathers ? Tensor::zeros({params_.layout_numel()}, held.dtype()) : Tensor();
  for (size_t u = 0; u < params_.units().size(); ++u) {
    const FlatParameters::Unit& unit = params_.units()[u];
    Communicator& over = comm_of(u);
    Tensor into = over.rank() == 0 ? out.narrow(unit.range.begin, unit.range.size()) : Tensor();
    over.gather(held_host.narrow(unit.held.begin, unit.held.size()), into, 0);
  }
  return out;
}

void ParameterShards::keep_held_parts() {
  for (size_t u = 0; u < params_.units().size(); ++u) {
    const FlatParameters::Unit& unit = params_.units()[u];
    params_.values()
        .narrow(unit.held.begin, unit.held.size())
        .copy_from(params_.unit_values(u).narrow(unit.part * unit.held.size(), unit.held.size()));
    release(u);
  }
}

}  // namespace lt
