#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "tensor/kernels.h"

namespace lt {

namespace {
// The runs of `params` clipped to `owned`, empty ones dropped.
std::vector<FlatParameters::Run> owned_runs(const FlatParameters& params, const FlatParameters::Range& owned,
                                            bool split_by_decay) {
  std::vector<FlatParameters::Run> out;
  for (FlatParameters::Run run : params.runs_with_grad(split_by_decay)) {
    run.begin = std::max(run.begin, owned.begin);
    run.end = std::min(run.end, owned.end);
    if (run.begin < run.end) out.push_back(run);
  }
  return out;
}
}  // namespace

AdamW::AdamW(FlatParameters& params, AdamWSettings settings, int shard, int shards)
    : params_(params), owned_(params.shard(shard, shards)), settings_(settings) {
  const Tensor& values = params_.values();
  exp_avg_ = Tensor::zeros({owned_.size()}, values.dtype(), values.device());
  exp_avg_sq_ = Tensor::zeros({owned_.size()}, values.dtype(), values.device());
}

Tensor AdamW::grad_sum_squares_parts() const {
  const Tensor& grads = params_.grads();
  const std::vector<FlatParameters::Run> runs = owned_runs(params_, owned_, /*split_by_decay=*/false);
  Tensor parts = Tensor::empty({static_cast<int64_t>(runs.size())}, grads.dtype(), grads.device());
  for (size_t i = 0; i < runs.size(); ++i) {
    Tensor part = parts.narrow(static_cast<int64_t>(i), 1);
    kernels::sum_squares(grads.narrow(runs[i].begin, runs[i].end - runs[i].begin), part);
  }
  return parts;
}

double AdamW::sum_of_parts(const Tensor& host_parts) {
  double total = 0;
  for (const double part : host_parts.to(DType::F64).to_vector<double>()) total += part;
  return total;
}

void AdamW::clip_to(double norm, double max_norm) {
  // PyTorch's clip_grad_norm_ adds 1e-6 too.
  grad_scale_ = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

// Every run of the owned range with a gradient in one kernel call (one launch on a GPU), each with its
// decay group's weight decay.
void AdamW::step(double lr, const Tensor& values_bf16) {
  ++t_;
  std::vector<kernels::AdamWRun> runs;
  for (const FlatParameters::Run& run : owned_runs(params_, owned_, /*split_by_decay=*/true))
    runs.push_back({run.begin - owned_.begin, run.end - owned_.begin, run.weight_decay});
  if (!runs.empty()) {
    Tensor p = params_.values().narrow(owned_.begin, owned_.size());
    const Tensor g = params_.grads().narrow(owned_.begin, owned_.size());
    const kernels::AdamWStep s{lr, settings_.beta1, settings_.beta2, settings_.eps, settings_.weight_decay, t_,
                               grad_scale_};
    const Tensor p_bf16 = values_bf16.defined() ? values_bf16.narrow(owned_.begin, owned_.size()) : Tensor();
    kernels::adamw_step(p, g, exp_avg_, exp_avg_sq_, s, runs, p_bf16);
  }
  grad_scale_ = 1.0;
}

std::string AdamW::moment_parameter(const std::string& moment_name) {
  const size_t dot = moment_name.rfind('.');
  return dot == std::string::npos ? moment_name : moment_name.substr(0, dot);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  LT_CHECK(owned_.size() == params_.numel(), "AdamW::state: a sharded optimiser saves shard_state() per rank");
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.parameters().size(); ++i) {
    const std::string& name = params_.parameters()[i].parameter.name;
    out.emplace_back(name + ".exp_avg", params_.view(exp_avg_, i));
    out.emplace_back(name + ".exp_avg_sq", params_.view(exp_avg_sq_, i));
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                       const std::string& origin) {
  LT_CHECK(owned_.size() == params_.numel(), "AdamW::load_state: a sharded optimiser loads load_shard_state()");
  copy_named_moments(params_, std::map<std::string, Tensor>(state.begin(), state.end()), exp_avg_, exp_avg_sq_,
                     origin);
  t_ = steps_taken;
}

std::vector<std::pair<std::string, Tensor>> AdamW::shard_state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

void AdamW::load_shard_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                             const std::string& origin) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  for (auto [name, slot] : {std::pair{"exp_avg", &exp_avg_}, std::pair{"exp_avg_sq", &exp_avg_sq_}}) {
    auto it = by_name.find(name);
    LT_CHECK(it != by_name.end(), origin, ": optimiser shard state has no tensor '", name, "'");
    LT_CHECK(it->second.shape() == slot->shape(), origin, ": optimiser tensor '", name, "' has shape ",
             shape_str(it->second.shape()), ", this rank's shard needs ", shape_str(slot->shape()));
    slot->copy_from(it->second.to(slot->dtype()).to(slot->device()));
  }
  t_ = steps_taken;
}

void copy_named_moments(const FlatParameters& params, const std::map<std::string, Tensor>& named, Tensor& exp_avg,
                        Tensor& exp_avg_sq, const std::string& origin) {
  for (size_t i = 0; i < params.parameters().size(); ++i) {
    const std::string& param = params.parameters()[i].parameter.name;
    for (auto [suffix, flat] : {std::pair{".exp_avg", &exp_avg}, std::pair{".exp_avg_sq", &exp_avg_sq}}) {
      const std::string name = param + suffix;
      auto it = named.find(name);
      LT_CHECK(it != named.end(), origin, ": optimiser state has no tensor '", name, "'");
      Tensor slot = params.view(*flat, i);
      LT_CHECK(it->second.shape() == slot.shape(), origin, ": optimiser tensor '", name, "' has shape ",
               shape_str(it->second.shape()), ", the model needs ", shape_str(slot.shape()));
      slot.copy_from(it->second.to(slot.dtype()).to(slot.device()));
    }
  }
}

}  // namespace lt
