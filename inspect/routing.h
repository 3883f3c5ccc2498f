// What the router of each MoE layer does with each token (`lingtrain inspect`): the chosen experts
// and their gating weights, how sure the router is (entropy) and how large its logits are (z), and
// the per-layer totals a training run logs (load per expert, imbalance), for any text and checkpoint.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/ling.h"
#include "moe/stats.h"

namespace lt {

// One MoE layer's routing of N tokens.
struct LayerTrace {
  int64_t layer = 0;  // the decoder layer (model.layers.<layer>.mlp)
  int64_t num_experts = 0, top_k = 0;
  std::vector<int32_t> experts;  // [N k]: token n's experts at [n k, n k + k), best first
  std::vector<float> weights;    // [N k]: their gating weights
  std::vector<double> entropy;   // [N]: -sum_e p log p over all E experts, nats (max ln E)
  std::vector<double> z;         // [N]: logsumexp of the router logits (the z-loss averages its square)

  int64_t tokens() const { return static_cast<int64_t>(entropy.size()); }
  int32_t top1(int64_t token) const { return experts[static_cast<size_t>(token * top_k)]; }
};

// The routing of every MoE layer (in layer order) for a token sequence.
struct RoutingTrace {
  std::vector<uint32_t> tokens;
  std::vector<LayerTrace> layers;
};

// Routes `tokens` through `model` (evaluation: no warmup noise) in consecutive windows of at most `window`
// tokens, each window a fresh context as in a training row, `batch` windows per forward.
RoutingTrace trace_routing(LingForCausalLM& model, std::span<const uint32_t> tokens, int64_t window, int64_t batch = 8);

// The window inspection routes in by default: the sequence length the checkpoint last trained at (its
// trainer_state.json), else the model's max_position_embeddings (a Hugging Face folder). Routing depends
// on the context a token has, so inspecting in the training's window shows what training saw.
int64_t trained_window(const std::string& checkpoint, const LingConfig& config);

struct LayerTotals {
  int64_t layer = 0;
  std::vector<int64_t> load;  // assignments per expert (sum = N k)
  LoadSummary summary;        // max/mean, min, dead experts, coefficient of variation
  double mean_entropy = 0, mean_z = 0;
};
LayerTotals layer_totals(const LayerTrace& trace);

// The fraction of tokens whose top-1 expert differs between two traces of the same tokens (the same
// layer of two checkpoints).
double top1_changed_fraction(const LayerTrace& a, const LayerTrace& b);

}  // namespace lt
