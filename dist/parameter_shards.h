// Parameter sharding (--shard-params; ZeRO-3, FSDP style): every rank of a data-parallel group holds 1/N of
// each layer's values, gradients and AdamW state (FlatParameters under LayerShards, in units of a layer's
// parameters), and a layer is whole only around its uses.
//
//   forward    before a layer's forward its units are all-gathered into their whole buffers, released
//              after it; the head, whose backward follows its forward at once in training, stays whole
//   backward   the layer's outputs call before_backward as their backward begins: the layer is gathered
//              again and its whole gradient buffers zeroed; the layers whose backward is done (the ones
//              above it: the layers are a chain, each one's backward done before the one below begins) are
//              reduced: their gradients reduce-scattered (the mean over the ranks), each rank's part added
//              to the gradients it holds, and both whole buffers released
//   finish     after each micro-batch's backward, the layers still whole are reduced
//
// Each micro-batch's gradients are reduced as its backward goes, so the whole gradients of one layer at a
// time exist, and the held ones sum the micro-batches' means: the mean over every rank's micro-batches,
// what data parallel's average gives. Under expert parallelism a layer's routed experts are units of their
// own, split over the ranks holding the same experts (the copies); their gradients, which already sum every
// token of the expert-parallel group routed to them, are divided by the group's size before their mean over
// the copies (as DataParallel::set_expert_parallel does). The ranks run the same layers in the same order,
// forward and backward, so their collectives pair up.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "optim/flat_parameters.h"
#include "tensor/bf16_shadow.h"

namespace lt {

class ParameterShards : public ParameterGathering {
 public:
  // params: laid out with LayerShards{comm.rank(), comm.size()} (and under expert parallelism its experts'
  // units over expert_copies, within expert-parallel groups of expert_group_size ranks).
  ParameterShards(Communicator& comm, FlatParameters& params, Communicator* expert_copies = nullptr,
                  int expert_group_size = 1);

  void before_forward(const std::string& layer) override;
  void after_forward(const std::string& layer) override;
  void before_backward(const std::string& layer) override;
  // After each micro-batch's backward: every unit still whole reduced and released.
  void finish_backward();

  // The squared gradient norm of the whole model from this rank's part of it: every element of the model
  // is held by one rank, so the ranks' parts summed.
  double grad_sum_squares(double own);
  // A buffer of the held layout (the values, an AdamW moment) whole in the layout of FlatParameters::view,
  // in host memory, on the ranks that gather a unit (rank 0 every unit; under expert parallelism the first
  // rank of each expert shard's copies, that shard's experts); zeros where a rank gathers nothing, and
  // undefined on the ranks that gather no unit. Collective.
  Tensor whole(const Tensor& held);
  // Runs `use` with every unit whole (a checkpoint's weights read into the parameters), then keeps this
  // rank's part of each and releases the rest. Not collective: every rank reads the model it holds.
  template <class Use>
  void with_whole_model(Use&& use) {
    for (size_t u = 0; u < params_.units().size(); ++u) {
      Tensor& whole = params_.unit_values(u);
      whole.storage().restore();
      whole.zero_();  // the padding between parameters stays zero
    }
    use();
    keep_held_parts();
  }

 private:
  Communicator& comm_of(size_t unit) const;
  void gather(size_t unit);
  void reduce(size_t unit);
  void release(size_t unit);
  void keep_held_parts();

  Communicator& comm_;
  Communicator* expert_copies_;
  int expert_group_size_;
  FlatParameters& params_;
  std::map<std::string, std::vector<size_t>> units_of_layer_;
  size_t head_unit_;               // the last unit (the head's)
  std::vector<bool> gathered_;     // per unit: its values are whole
  std::vector<bool> in_backward_;  // per unit: its whole gradient buffer takes this backward's gradients
  // Per unit, while it is gathered under bf16 matmuls on a GPU: its values' bf16 rounding, registered.
  std::vector<Tensor> values_bf16_;
  std::vector<std::unique_ptr<Bf16Shadow>> shadows_;
  Tensor reduced_;                 // a reduce-scatter's result, [the largest held part]
};

}  // namespace lt
