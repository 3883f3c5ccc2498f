// Module: a named tree of parameters, buffers and submodules, as in PyTorch. Parameter names are the
// dotted paths of the tree, so a model built with the Hugging Face attribute names gets the Hugging
// Face tensor names for free ("model.layers.0.attention.query_key_value.weight").
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "tensor/random.h"

namespace lt {

struct Parameter {
  std::string name;   // full dotted name
  Variable* value;    // the leaf variable (owned by its module)
  bool weight_decay;  // AdamW decays matrices, never norm weights
};

// A buffer is state a module updates itself, outside the optimiser, and a checkpoint saves
// (PyTorch's register_buffer): the routing-warmup statistics of a MoE block.
struct Buffer {
  std::string name;  // full dotted name
  Tensor* value;     // owned by its module
};

// Parameter sharding (dist/parameter_shards.h) keeps each part of a model whole only around its uses. The
// model names a part as FlatParameters::layer_of names its parameters' layer ("model.layers.3", "lm_head"),
// says when the part begins and ends its forward, and makes the part's outputs call before_backward as their
// backward begins (call_before_backward), so that the part is whole again for its own backward.
class ParameterGathering {
 public:
  virtual ~ParameterGathering() = default;
  virtual void before_forward(const std::string& part) = 0;
  virtual void after_forward(const std::string& part) = 0;
  virtual void before_backward(const std::string& part) = 0;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter below this module, depth first in registration order, names prefixed.
  std::vector<Parameter> parameters(const std::string& prefix = "");
  int64_t parameter_count();
  // Every buffer below this module, in the same order and with the same naming as parameters().
  std::vector<Buffer> buffers(const std::string& prefix = "");
  // Moves every parameter and buffer below this module to `device` (PyTorch's module.to). Before a
  // Trainer lays the parameters out flat: their gradient buffers are not moved.
  void to(Device device);

 protected:
  Variable& add_parameter(const std::string& name, Tensor value, bool weight_decay);
  Tensor& add_buffer(const std::string& name, Tensor value);
  template <class M>
  M& add_module(const std::string& name, std::unique_ptr<M> module) {
    M& ref = *module;
    children_.emplace_back(name, std::move(module));
    return ref;
  }

 private:
  struct OwnedParameter {
    std::string name;
    std::unique_ptr<Variable> value;  // stable address for Parameter::value
    bool weight_decay;
  };
  std::vector<OwnedParameter> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;  // stable addresses for Buffer::value
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// A module that is just one parameter named "weight", for attributes the Hugging Face code declares
// as a bare nn.Parameter or a bias-free head ("mlp.gate.weight", "lm_head.weight").
class WeightModule : public Module {
 public:
  WeightModule(Tensor value, bool weight_decay) : weight(add_parameter("weight", std::move(value), weight_decay)) {}
  Variable& weight;
};

// Normal(0, std) initialisation, the Hugging Face _init_weights for Linear and Embedding.
Tensor init_normal(const Shape& shape, double std, Rng& rng);

}  // namespace lt
