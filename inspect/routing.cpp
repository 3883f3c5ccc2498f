#include "inspect/routing.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/variable.h"
#include "trainer/checkpoint.h"

namespace lt {

namespace {

// Appends one forward's routing (rows of `real_tokens` tokens each in a [B, T] batch whose last rows
// may be padding) to the traces.
void append_trace(const std::vector<RoutingSnapshot>& traced, const std::vector<int64_t>& real_tokens, int64_t T,
                  std::vector<LayerTrace>& layers) {
  for (size_t l = 0; l < traced.size(); ++l) {
    const RoutingSnapshot& t = traced[l];
    LayerTrace& out = layers[l];
    const int64_t k = out.top_k, E = out.num_experts;
    const std::vector<int32_t> ids = t.expert_ids_NK.to_vector<int32_t>();
    const std::vector<double> weights = t.weights_NK.to(DType::F64).to_vector<double>();
    const std::vector<double> probs = t.probs_NE.to(DType::F64).to_vector<double>();
    const std::vector<double> lse = t.lse_N.to(DType::F64).to_vector<double>();
    for (size_t row = 0; row < real_tokens.size(); ++row)
      for (int64_t i = 0; i < real_tokens[row]; ++i) {
        const int64_t n = static_cast<int64_t>(row) * T + i;
        for (int64_t j = 0; j < k; ++j) {
          out.experts.push_back(ids[static_cast<size_t>(n * k + j)]);
          out.weights.push_back(static_cast<float>(weights[static_cast<size_t>(n * k + j)]));
        }
        double entropy = 0;
        for (int64_t e = 0; e < E; ++e) {
          const double p = probs[static_cast<size_t>(n * E + e)];
          if (p > 0) entropy -= p * std::log(p);
        }
        out.entropy.push_back(entropy);
        out.z.push_back(lse[static_cast<size_t>(n)]);
      }
  }
}

}  // namespace

RoutingTrace trace_routing(LingForCausalLM& model, std::span<const uint32_t> tokens, int64_t window, int64_t batch) {
  const LingConfig& config = model.config();
  LT_CHECK(window > 0 && window <= config.max_position_embeddings, "inspect: window ", window,
           " must be in [1, max_position_embeddings = ", config.max_position_embeddings, "]");
  LT_CHECK(!tokens.empty(), "inspect: no tokens to route");
  for (uint32_t t : tokens)
    LT_CHECK(t < static_cast<uint64_t>(config.vocab_size), "inspect: token id ", t, " >= vocab_size ",
             config.vocab_size);
  RoutingTrace out;
  out.tokens.assign(tokens.begin(), tokens.end());
  for (int64_t layer : config.moe_layer_indices()) {
    LayerTrace t;
    t.layer = layer;
    t.num_experts = config.num_experts;
    t.top_k = config.num_experts_per_tok;
    out.layers.push_back(std::move(t));
  }
  if (out.layers.empty()) return out;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t T = std::min(window, n);
  NoGradGuard no_grad;
  for (int64_t start = 0; start < n; start += batch * T) {
    // Rows of T tokens; the last real row may be short and is padded with eos (its padding is dropped).
    std::vector<int64_t> real_tokens;
    std::vector<int32_t> ids;
    for (int64_t row = 0; row < batch && start + row * T < n; ++row) {
      const int64_t begin = start + row * T, length = std::min(T, n - begin);
      real_tokens.push_back(length);
      for (int64_t i = 0; i < T; ++i)
        ids.push_back(static_cast<int32_t>(i < length ? tokens[static_cast<size_t>(begin + i)] : config.eos_token_id));
    }
    const int64_t B = static_cast<int64_t>(real_tokens.size());
    std::vector<RoutingSnapshot> traced;
    MoEContext context;
    context.routing_trace = &traced;
    model.final_hidden_states(Tensor::from_vector<int32_t>({B, T}, ids), context);
    append_trace(traced, real_tokens, T, out.layers);
  }
  return out;
}

int64_t trained_window(const std::string& checkpoint, const LingConfig& config) {
  const std::string state = checkpoint_folder(checkpoint) + "/trainer_state.json";
  if (!std::filesystem::exists(state)) return config.max_position_embeddings;
  return std::min(load_trainer_state(checkpoint).value("seq_len", config.max_position_embeddings),
                  config.max_position_embeddings);
}

LayerTotals layer_totals(const LayerTrace& trace) {
  LayerTotals totals;
  totals.layer = trace.layer;
  totals.load.assign(static_cast<size_t>(trace.num_experts), 0);
  for (int32_t e : trace.experts) ++totals.load[static_cast<size_t>(e)];
  totals.summary = summarize_load(totals.load);
  const double n = static_cast<double>(std::max<int64_t>(trace.tokens(), 1));
  for (int64_t i = 0; i < trace.tokens(); ++i) {
    totals.mean_entropy += trace.entropy[static_cast<size_t>(i)] / n;
    totals.mean_z += trace.z[static_cast<size_t>(i)] / n;
  }
  return totals;
}

double top1_changed_fraction(const LayerTrace& a, const LayerTrace& b) {
  LT_CHECK(a.tokens() == b.tokens() && a.top_k == b.top_k, "top-1 comparison of traces of different tokens");
  int64_t changed = 0;
  for (int64_t i = 0; i < a.tokens(); ++i) changed += a.top1(i) != b.top1(i);
  return a.tokens() > 0 ? static_cast<double>(changed) / static_cast<double>(a.tokens()) : 0.0;
}

}  // namespace lt
