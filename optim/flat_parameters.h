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
// its gradient straight into its slice of the gradient buffer (Variable::set_grad_buffer). Under parameter
// sharding (LayerShards) the buffers hold one process's part of every layer, and the parameters view
// whole-layer buffers of their own that hold memory only while the layer is gathered.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace lt {

// Parameter sharding (ZeRO-3, dist/parameter_shards.h): every unit of a FlatParameters layout (a layer's
// parameters) splits into `ranks` equal, aligned parts, and this process holds part `rank` of each. ranks 0:
// no sharding (ranks 1 shards over one process: the whole model held as one part, gathered around its uses
// all the same). Under expert parallelism a layer's routed experts are a unit of their own (each run of
// consecutive parameters `is_experts` names), split into expert_ranks parts over the ranks that hold the same
// experts, this process holding part expert_rank.
struct LayerShards {
  int rank = 0, ranks = 0;
  std::function<bool(const std::string& parameter_name)> is_experts{};
  int expert_rank = 0, expert_ranks = 1;
};

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
    size_t unit = 0;  // under layer sharding: its index in units()
  };
  // Under layer sharding: a stretch of the layout that is gathered and reduced as one, and its parts.
  struct Unit {
    Range range;       // in the whole layout (its name: its layer's)
    size_t layer = 0;  // its index in layers()
    bool experts = false;
    int part = 0, parts = 1;  // this process holds part `part` of `parts`
    Range held;               // where, in the buffers it holds
  };

  // The parameters must share one dtype and device; their values are moved into the flat buffer. With
  // shards > 1 the buffers are padded at the end so that they split into `shards` equal, aligned
  // shards (ZeRO-style sharding of the gradients and optimiser state: dist/edit.h). With layer_shards
  // (ranks >= 1; shards stays 1) the buffers hold this process's part of every unit, end to end, and each
  // unit's parameters view a whole-unit buffer of their own whose memory is released but while the unit
  // is gathered (unit_values, unit_grads).
  explicit FlatParameters(std::vector<Parameter> params, int shards = 1, LayerShards layer_shards = {});
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  // The whole layout of parameters of these names and sizes (in order) as the constructor lays them out:
  // what a checkpoint rank's flat buffers were, read back without a model laid out that way.
  struct Layout {
    std::vector<Range> parameters, layers;
    std::vector<Unit> units;      // under layer sharding
    std::vector<size_t> unit_of;  // per parameter
    int64_t numel = 0;            // of the whole layout
    int64_t held_numel = 0;       // of what one process holds of it
  };
  static Layout layout_of(const std::vector<std::string>& names, const std::vector<int64_t>& sizes, int shards,
                          const LayerShards& layer_shards);

  // The layer a parameter belongs to, from its dotted name: the path up to and including the last
  // numbered component ("model.layers.3.attention.dense.weight" -> "model.layers.3"), or, for names
  // without one, the module that owns it ("model.norm.weight" -> "model.norm", "lm_head.weight" ->
  // "lm_head").
  static std::string layer_of(const std::string& parameter_name);

  // The parameters' ranges are in the whole layout, whether or not this process holds all of it.
  const std::vector<ParameterRange>& parameters() const { return params_; }
  // Consecutive parameters of one layer form its range (padding included, so ranges tile the layout).
  const std::vector<Range>& layers() const { return layers_; }
  // The elements of the buffers this process holds (values(), grads()), and of the whole layout: the same
  // but under layer sharding.
  int64_t numel() const { return values_.numel(); }
  int64_t layout_numel() const { return layout_numel_; }
  // Shard `index` of `count` equal stretches of the buffers; count must divide the shards the buffers
  // were laid out for.
  Range shard(int index, int count) const;

  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  // A parameter's slice of a buffer of the whole layout (values, grads, or an optimiser moment), in its shape.
  Tensor view(const Tensor& flat, size_t param) const;

  // Layer sharding (no units without it).
  bool sharded_by_layer() const { return !units_.empty(); }
  const std::vector<Unit>& units() const { return units_; }
  // Unit u's values and gradients whole, [units()[u].range.size()]: its parameters view them; their memory
  // is released (Storage::release) but while the unit is gathered.
  Tensor& unit_values(size_t u) { return unit_values_[u]; }
  Tensor& unit_grads(size_t u) { return unit_grads_[u]; }
  // This process's parts of a buffer of the whole layout, into a buffer of the held layout.
  void hold(const Tensor& whole, Tensor& held) const;
  // How many elements of a range of the whole layout this process holds.
  int64_t held_elements(const Range& range) const;

  // Stretches of consecutive parameters that all hold a gradient, padding included, in the buffers this
  // process holds. With split_by_decay, a stretch also never mixes weight-decayed and undecayed parameters.
  struct Run {
    int64_t begin = 0, end = 0;
    bool weight_decay = false;
  };
  std::vector<Run> runs_with_grad(bool split_by_decay) const;

  // The parameters' gradients undefined again; under layer sharding the held gradients zeroed too (each
  // micro-batch's reduced part is added to them).
  void zero_grad();

 private:
  std::vector<Run> layout_runs_with_grad(bool split_by_decay) const;

  std::vector<ParameterRange> params_;
  std::vector<Range> layers_;
  std::vector<Unit> units_;  // layer sharding only
  int64_t layout_numel_ = 0;
  Tensor values_, grads_;
  std::vector<Tensor> unit_values_, unit_grads_;  // layer sharding only
};

}  // namespace lt
