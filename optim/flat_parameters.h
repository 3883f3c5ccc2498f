// The flat parameter and gradient buffers: every parameter of a model laid out in one contiguous value
// buffer and one gradient buffer, in module order (the order Module::parameters() lists them), with a
// named range per parameter and per layer.
//
// Why flat: the optimiser updates long contiguous stretches with one kernel call instead of a few
// calls per parameter, the gradient norm is one reduction, and the later stages work on the same
// slices: a data-parallel all-reduce sends the gradient buffer in buckets, and EDiT synchronises the
// value buffer one layer range at a time. Module order (rather than grouping by weight decay) keeps a
// layer's parameters next to each other, so a layer is one contiguous range.
//
// Each parameter's Variable becomes a view of its slice of the value buffer, and the backward writes
// its gradient straight into its slice of the gradient buffer (Variable::set_grad_buffer).
#pragma once
#include <string>
#include <vector>

#include "nn/module.h"

namespace lt {

class FlatParameters {
 public:
  // A stretch [begin, end) of the buffers, in elements.
  struct Range {
    std::string name;
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
  };
  struct ParameterRange {
    Parameter parameter;
    Range range;  // the parameter's own elements, without the alignment padding after them
  };

  // The parameters must share one dtype and device; their values are moved into the flat buffer. With
  // shards > 1 the buffers are padded at the end so that they split into `shards` equal, aligned
  // shards (ZeRO-style sharding of the gradients and optimiser state: dist/edit.h).
  explicit FlatParameters(std::vector<Parameter> params, int shards = 1);
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  // Where parameters of these sizes (in order) start in a flat layout, and its end before the shards'
  // padding: each starts aligned (16 elements), as a tensor of its own would.
  static std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes, int64_t* end = nullptr);

  // The layer a parameter belongs to, from its dotted name: the path up to and including the last
  // numbered component ("model.layers.3.attention.dense.weight" -> "model.layers.3"), or, for names
  // without one, the module that owns it ("model.norm.weight" -> "model.norm", "lm_head.weight" ->
  // "lm_head").
  static std::string layer_of(const std::string& parameter_name);

  const std::vector<ParameterRange>& parameters() const { return params_; }
  // Consecutive parameters of one layer form its range (padding included, so ranges tile the buffer).
  const std::vector<Range>& layers() const { return layers_; }
  int64_t numel() const { return values_.numel(); }
  // Shard `index` of `count` equal stretches of the buffers; count must divide the shards the buffers
  // were laid out for.
  Range shard(int index, int count) const;

  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  // A parameter's slice of a buffer of this layout (values, grads, or an optimiser moment), in its shape.
  Tensor view(const Tensor& flat, size_t param) const;

  // Stretches of consecutive parameters that all hold a gradient, padding included. With
  // split_by_decay, a stretch also never mixes weight-decayed and undecayed parameters.
  struct Run {
    int64_t begin = 0, end = 0;
    bool weight_decay = false;
  };
  std::vector<Run> runs_with_grad(bool split_by_decay) const;

  void zero_grad();

 private:
  std::vector<ParameterRange> params_;
  std::vector<Range> layers_;
  Tensor values_, grads_;
};

}  // namespace lt
