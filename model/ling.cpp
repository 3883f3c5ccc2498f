#include "model/ling.h"

#include <algorithm>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace lt {

namespace {

// Parameter sharding (nn/module.h): `part`'s parameters gathered for `forward`, and its outputs made to
// gather them again before their backward; without it, forward alone.
void ask_before_backward(ParameterGathering& gathering, const std::string& part, Variable& output) {
  if (output.defined()) output = call_before_backward(output, [&gathering, part] { gathering.before_backward(part); });
}
void ask_before_backward(ParameterGathering& gathering, const std::string& part, ResidualStream& output) {
  ask_before_backward(gathering, part, output.stream);
  ask_before_backward(gathering, part, output.pending);
}
// A plain tensor has no backward to gather for.
void ask_before_backward(ParameterGathering&, const std::string&, Tensor&) {}
template <class Forward>
auto gathered(ParameterGathering* gathering, const std::string& part, Forward&& forward) -> decltype(forward()) {
  if (gathering == nullptr) return forward();
  gathering->before_forward(part);
  auto output = forward();
  ask_before_backward(*gathering, part, output);
  gathering->after_forward(part);
  return output;
}

}  // namespace

DecoderLayer::DecoderLayer(const LingConfig& c, int64_t index, const ExpertSlice& experts, Rng& rng)
    : input_layernorm_(add_module("input_layernorm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps))),
      attention_(add_module("attention", std::make_unique<Attention>(
                                             AttentionShape{c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                                            c.resolved_head_dim(), c.rope_theta},
                                             c.initializer_range, rng))),
      post_attention_layernorm_(
          add_module("post_attention_layernorm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps))) {
  if (c.is_moe_layer(index)) {
    MoESettings s;
    s.layer = index;
    s.hidden = c.hidden_size;
    s.intermediate = c.moe_intermediate_size;
    s.num_experts = c.num_experts;
    s.experts = experts;
    s.top_k = c.num_experts_per_tok;
    s.num_shared = c.num_shared_experts;
    s.norm_topk_prob = c.norm_topk_prob;
    s.aux_loss_coef = c.aux_loss_coef;
    s.z_loss_coef = c.z_loss_coef;
    moe_ = &add_module("mlp", std::make_unique<MoEBlock>(s, c.initializer_range, rng));
  } else {
    dense_mlp_ = &add_module("mlp", std::make_unique<SwiGLUMLP>(c.hidden_size, c.intermediate_size,
                                                                c.initializer_range, rng));
  }
}

ResidualStream DecoderLayer::forward(const ResidualStream& x, MoEContext& context, int64_t pos_offset,
                                    KVCache* cache, const Tensor& doc_start) {
  const AddRmsNorm in = input_layernorm_.forward(x.stream, x.pending);
  // The residual stream joins the attention's and the dense MLP's output projections as their GEMMs write
  // them (Linear::forward's addend), with the bits of x + attention(x): one pass over [B, T, H] fewer each.
  const Variable h = attention_.forward(in.normed, pos_offset, cache, doc_start, in.sum);
  const Variable normed = post_attention_layernorm_.forward(h);
  if (moe_) return {h, moe_->forward(normed, context)};
  return {dense_mlp_->forward(normed, h), Variable()};
}

LingBackbone::LingBackbone(const LingConfig& c, const ExpertSlice& experts, Rng& rng)
    : word_embeddings_(add_module("word_embeddings",
                                  std::make_unique<Embedding>(c.vocab_size, c.hidden_size, c.initializer_range, rng))) {
  // The Hugging Face _init_weights zeroes the padding_idx row of the embedding.
  {
    Tensor& table = word_embeddings_.weight().value();
    table.narrow(c.pad_token_id, 1).zero_();
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(&add_module("layers." + std::to_string(i), std::make_unique<DecoderLayer>(c, i, experts, rng)));
  norm_ = &add_module("norm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Variable LingBackbone::forward(const Tensor& ids, MoEContext& context, int64_t pos_offset,
                               std::vector<KVCache>* caches, const Tensor& doc_start) {
  ResidualStream h{gathered(gathering_, "model.word_embeddings", [&] { return word_embeddings_.forward(ids); }),
                   Variable()};
  for (size_t i = 0; i < layers_.size(); ++i)
    h = gathered(gathering_, "model.layers." + std::to_string(i), [&] {
      return layers_[i]->forward(h, context, pos_offset, caches ? &(*caches)[i] : nullptr, doc_start);
    });
  return gathered(gathering_, "model.norm", [&] { return norm_->forward(h.stream, h.pending).normed; });
}

LingForCausalLM::LingForCausalLM(const LingConfig& config, uint64_t seed, const ExpertSlice& experts)
    : config_(config), experts_(experts) {
  config_.validate(config.name);
  Rng rng(seed);
  model_ = &add_module("model", std::make_unique<LingBackbone>(config_, experts_, rng));
  lm_head_VH_ = &add_module("lm_head", std::make_unique<WeightModule>(
                                     init_normal({config_.vocab_size, config_.hidden_size}, config_.initializer_range, rng),
                                     true))
                     .weight;
}

Variable LingForCausalLM::logits(const Tensor& ids_BT, MoEContext& context, int64_t pos_offset,
                                 std::vector<KVCache>* caches, const Tensor& head_VH) {
  LT_CHECK(ids_BT.ndim() == 2, "model input ids must be [B, T], got ", ids_BT.str());
  const int64_t B = ids_BT.dim(0), T = ids_BT.dim(1), H = config_.hidden_size;
  const Variable h = model_->forward(here(ids_BT), context, pos_offset, caches);
  return reshape(apply_head(reshape(h, {B * T, H}), head_VH), {B, T, config_.vocab_size});
}

Variable LingForCausalLM::apply_head(const Variable& h_NH, const Tensor& head_VH) {
  if (head_VH.defined()) {
    LT_CHECK(head_VH.shape() == lm_head_VH_->value().shape(), "the head ", head_VH.str(), " does not fit the weights ",
             lm_head_VH_->value().str());
    return matmul(h_NH, Variable(head_VH), false, true);
  }
  return gathered(gathering_, "lm_head", [&] {
    const Variable head = config_.norm_head
                              ? column_normalize(*lm_head_VH_, config_.norm_head_grad == NormHeadGrad::Detached)
                              : *lm_head_VH_;
    return matmul(h_NH, head, false, true);
  });
}

Variable LingForCausalLM::next_token_logits(const Tensor& ids_BT, const std::vector<int64_t>& lengths_B,
                                            MoEContext& context, std::vector<KVCache>& caches, const Tensor& head_VH) {
  LT_CHECK(ids_BT.ndim() == 2, "model input ids must be [B, T], got ", ids_BT.str());
  const int64_t B = ids_BT.dim(0), T = ids_BT.dim(1), H = config_.hidden_size;
  LT_CHECK(static_cast<int64_t>(lengths_B.size()) == B, "next_token_logits: ", lengths_B.size(), " lengths for ", B,
           " rows");
  std::vector<int32_t> last_B(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    LT_CHECK(lengths_B[b] >= 1 && lengths_B[b] <= T, "next_token_logits: row ", b, " has length ", lengths_B[b],
             " of ", T);
    last_B[b] = static_cast<int32_t>(b * T + lengths_B[b] - 1);
  }
  const Variable h = reshape(model_->forward(here(ids_BT), context, 0, &caches), {B * T, H});
  const Variable h_last = T == 1 ? h : gather_rows(h, here(Tensor::from_vector<int32_t>({B}, last_B)));
  return apply_head(h_last, head_VH);
}

Tensor LingForCausalLM::decoding_head() {
  NoGradGuard no_grad;
  return gathered(gathering_, "lm_head", [&] {
    if (config_.norm_head) return column_normalize(*lm_head_VH_, true).value();
    return gathering_ ? lm_head_VH_->value().clone() : lm_head_VH_->value();
  });
}

Variable LingForCausalLM::final_hidden_states(const Tensor& ids_BT, MoEContext& context) {
  LT_CHECK(ids_BT.ndim() == 2, "model input ids must be [B, T], got ", ids_BT.str());
  return model_->forward(here(ids_BT), context, 0, nullptr);
}

Variable LingForCausalLM::hidden_states(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                                        const Tensor& doc_start_BT) {
  LT_CHECK(targets_BT.shape() == ids_BT.shape(), "targets ", targets_BT.str(), " do not match ids ", ids_BT.str());
  return reshape(model_->forward(here(ids_BT), context, 0, nullptr, here(doc_start_BT)),
                 {ids_BT.numel(), config_.hidden_size});
}

HeadNorm LingForCausalLM::head_norm() const {
  return !config_.norm_head                                  ? HeadNorm::None
         : config_.norm_head_grad == NormHeadGrad::Detached ? HeadNorm::Detached
                                                             : HeadNorm::Full;
}

LossBreakdown LingForCausalLM::loss(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                                   const Tensor& doc_start_BT) {
  const Variable h_NH = hidden_states(ids_BT, targets_BT, context, doc_start_BT);
  const Tensor targets_N = here(targets_BT).reshape({ids_BT.numel()});
  return add_auxiliary_losses(
      gathered(gathering_, "lm_head",
               [&] { return normhead_cross_entropy(h_NH, *lm_head_VH_, targets_N, -100, head_norm()); }),
      context);
}

Variable LingForCausalLM::target_logprobs(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                                          const Tensor& doc_start_BT) {
  const Variable h_NH = hidden_states(ids_BT, targets_BT, context, doc_start_BT);
  const Tensor targets_N = here(targets_BT).reshape({ids_BT.numel()});
  return gathered(gathering_, "lm_head",
                  [&] { return normhead_token_logprobs(h_NH, *lm_head_VH_, targets_N, -100, head_norm()); });
}

LossBreakdown LingForCausalLM::add_auxiliary_losses(const Variable& objective, const MoEContext& context) const {
  LossBreakdown out;
  out.lm = objective;
  out.total = objective;
  const Device device = objective.value().device();
  out.aux = Tensor::zeros({1}, DType::F64, device);
  out.balance = Tensor::zeros({1}, DType::F64, device);
  out.z = Tensor::zeros({1}, DType::F64, device);
  for (const Variable& aux : context.aux_losses) {
    out.total = add(out.total, aux);
    kernels::accumulate_f64(aux.value(), out.aux);
  }
  for (const ExpertStats& s : context.stats) {
    kernels::accumulate_f64(s.balance, out.balance);
    kernels::accumulate_f64(s.z, out.z);
  }
  return out;
}

std::vector<KVCache> LingForCausalLM::make_kv_caches(int64_t batch, int64_t capacity) const {
  std::vector<KVCache> caches(static_cast<size_t>(config_.num_hidden_layers));
  for (KVCache& c : caches) {
    const Shape shape{batch, capacity, config_.num_key_value_heads, config_.resolved_head_dim()};
    c.k_BTHD = Tensor::zeros(shape, lm_head_VH_->value().dtype(), device());
    c.v_BTHD = Tensor::zeros(shape, lm_head_VH_->value().dtype(), device());
    c.length_B.assign(static_cast<size_t>(batch), 0);
  }
  return caches;
}

void LingForCausalLM::set_rope_theta(double theta) {
  LT_CHECK(theta > 0, "rope_theta must be > 0, got ", theta);
  config_.rope_theta = theta;
  for (DecoderLayer* layer : model_->layers()) layer->attention().set_rope_theta(theta);
}

void LingForCausalLM::set_aux_loss_coefficients(double aux_loss_coef, double z_loss_coef) {
  LT_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0, "the aux and z loss coefficients must be >= 0, got ", aux_loss_coef,
           " and ", z_loss_coef);
  config_.aux_loss_coef = aux_loss_coef;
  config_.z_loss_coef = z_loss_coef;
  for (MoEBlock* block : moe_blocks()) block->set_loss_coefficients(aux_loss_coef, z_loss_coef);
}

void LingForCausalLM::fold_routing_warmup() {
  for (MoEBlock* block : moe_blocks()) block->fold_routing_warmup();
}

void LingForCausalLM::extend_context(int64_t positions) {
  config_.max_position_embeddings = std::max(config_.max_position_embeddings, positions);
}

void LingForCausalLM::set_parameter_gathering(ParameterGathering* gathering) {
  gathering_ = gathering;
  model_->set_parameter_gathering(gathering);
}

void LingForCausalLM::set_expert_group(ExpertGroup* group) {
  for (MoEBlock* block : moe_blocks()) block->set_expert_group(group);
}

std::vector<MoEBlock*> LingForCausalLM::moe_blocks() {
  std::vector<MoEBlock*> blocks;
  for (DecoderLayer* layer : model_->layers())
    if (layer->moe()) blocks.push_back(layer->moe());
  return blocks;
}

}  // namespace lt
