#include "nn/module.h"

namespace lt {

Variable& Module::add_parameter(const std::string& name, Tensor value, bool weight_decay) {
  params_.push_back({name, std::make_unique<Variable>(std::move(value), true), weight_decay});
  return *params_.back().value;
}

std::vector<Parameter> Module::parameters(const std::string& prefix) {
  std::vector<Parameter> out;
  const std::string dot = prefix.empty() ? "" : prefix + ".";
  for (auto& p : params_) out.push_back({dot + p.name, p.value.get(), p.weight_decay});
  for (auto& [name, child] : children_) {
    std::vector<Parameter> below = child->parameters(dot + name);
    out.insert(out.end(), below.begin(), below.end());
  }
  return out;
}

Tensor& Module::add_buffer(const std::string& name, Tensor value) {
  buffers_.emplace_back(name, std::make_unique<Tensor>(std::move(value)));
  return *buffers_.back().second;
}

std::vector<Buffer> Module::buffers(const std::string& prefix) {
  std::vector<Buffer> out;
  const std::string dot = prefix.empty() ? "" : prefix + ".";
  for (auto& [name, value] : buffers_) out.push_back({dot + name, value.get()});
  for (auto& [name, child] : children_) {
    std::vector<Buffer> below = child->buffers(dot + name);
    out.insert(out.end(), below.begin(), below.end());
  }
  return out;
}

void Module::to(Device device) {
  for (const Parameter& p : parameters()) p.value->value() = p.value->value().to(device);
  for (const Buffer& b : buffers()) *b.value = b.value->to(device);
}

int64_t Module::parameter_count() {
  int64_t n = 0;
  for (const Parameter& p : parameters()) n += p.value->value().numel();
  return n;
}

Tensor init_normal(const Shape& shape, double std, Rng& rng) { return Tensor::randn(shape, rng, std); }

}  // namespace lt
