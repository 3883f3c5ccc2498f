#include "trainer/dpo.h"

#include <cinttypes>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "nn/dpo_loss.h"
#include "tensor/kernels.h"
#include "trainer/checkpoint.h"

namespace lt {

Objective dpo_objective(double beta, double rpo_alpha) {
  return [beta, rpo_alpha](LingForCausalLM& model, const TokenBatch& batch, MoEContext& context) {
    LT_CHECK(batch.response.defined() && batch.reference_logp.defined(),
             "a DPO step needs batches of preference pairs (stack_preference_rows)");
    const Variable token_logp = model.target_logprobs(batch.inputs, batch.targets, context, batch.doc_start);
    const DpoLoss dpo = dpo_loss(token_logp, batch.response.reshape({batch.response.numel()}),
                                 batch.counted.reshape({batch.counted.numel()}), batch.reference_logp, beta, rpo_alpha);
    LossBreakdown out = model.add_auxiliary_losses(dpo.loss, context);
    out.stats = dpo.stats;
    return out;
  };
}

namespace {

// FNV-1a, 64 bits: a fingerprint that is the same on every machine and standard library.
uint64_t fnv1a(std::string_view bytes, uint64_t hash = 0xcbf29ce484222325ull) {
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace

std::string reference_cache_key(const std::string& reference_checkpoint, const std::string& data_path,
                                const std::string& tokenizer_json) {
  const std::string folder = checkpoint_folder(reference_checkpoint);
  uint64_t hash = fnv1a(read_file(folder + "/config.json"));
  hash = fnv1a(read_file(folder + "/model.safetensors"), hash);
  hash = fnv1a(read_file(data_path), hash);
  hash = fnv1a(tokenizer_json, hash);
  char text[20];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

std::vector<double> cached_reference_logprobs(const std::string& cache_path, const std::string& key, size_t count,
                                              const std::function<std::vector<double>()>& compute, bool* reused) {
  if (std::filesystem::exists(cache_path)) {
    const Json cached = parse_json(read_file(cache_path), cache_path);
    if (cached.is_object() && cached.value("key", std::string()) == key && cached.contains("logps") &&
        cached.at("logps").is_array() && cached.at("logps").size() == count) {
      if (reused) *reused = true;
      return cached.at("logps").get<std::vector<double>>();
    }
  }
  if (reused) *reused = false;
  const std::vector<double> logps = compute();
  std::filesystem::create_directories(std::filesystem::path(cache_path).parent_path());
  // 17 significant digits: the values read back are the values computed, bit for bit.
  std::string text = "{\"key\": \"" + key + "\", \"logps\": [";
  char number[32];
  for (size_t i = 0; i < logps.size(); ++i) {
    std::snprintf(number, sizeof number, "%s%.17g", i ? ", " : "", logps[i]);
    text += number;
  }
  text += "]}\n";
  write_file_atomic(cache_path, text);
  return logps;
}

Json dpo_metrics(const std::vector<double>& sums, const std::string& prefix) {
  using namespace kernels;
  Json out = Json::object();
  if (sums.size() != kDpoStats || sums[kDpoPairs] <= 0) return out;
  const double pairs = sums[kDpoPairs];
  out[prefix + "rewards/chosen"] = sums[kDpoRewardChosen] / pairs;
  out[prefix + "rewards/rejected"] = sums[kDpoRewardRejected] / pairs;
  out[prefix + "rewards/accuracies"] = sums[kDpoCorrect] / pairs;
  out[prefix + "rewards/margins"] = sums[kDpoMargin] / pairs;
  out[prefix + "logps/chosen"] = sums[kDpoLogpChosen] / pairs;
  out[prefix + "logps/rejected"] = sums[kDpoLogpRejected] / pairs;
  out[prefix + "dpo_loss"] = sums[kDpoLoss] / pairs;
  if (sums[kDpoNllTokens] > 0) out[prefix + "nll_loss"] = sums[kDpoNllSum] / sums[kDpoNllTokens];
  return out;
}

Json evaluate_preferences(LingForCausalLM& model, const std::vector<PackedRow>& rows,
                          const std::vector<double>& reference_logp, int64_t batch, int64_t limit, double beta,
                          double rpo_alpha) {
  NoGradGuard no_grad;
  const size_t n = limit > 0 ? std::min(rows.size(), static_cast<size_t>(limit)) : rows.size();
  std::vector<double> sums(kernels::kDpoStats, 0.0);
  for (size_t first = 0; first < n; first += static_cast<size_t>(batch)) {
    const TokenBatch b = stack_preference_rows(rows, row_range(first, std::min(n - first, static_cast<size_t>(batch))),
                                               reference_logp);
    MoEContext context;
    const Variable token_logp = model.target_logprobs(b.inputs, b.targets, context, b.doc_start);
    const DpoLoss dpo = dpo_loss(token_logp, b.response.reshape({b.response.numel()}),
                                 b.counted.reshape({b.counted.numel()}), b.reference_logp, beta, rpo_alpha);
    const std::vector<double> s = dpo.stats.to_vector<double>();
    for (size_t k = 0; k < sums.size(); ++k) sums[k] += s[k];
  }
  Json out = dpo_metrics(sums, "eval_");
  if (sums[kernels::kDpoPairs] > 0) {
    const double nll = sums[kernels::kDpoNllTokens] > 0 ? sums[kernels::kDpoNllSum] / sums[kernels::kDpoNllTokens] : 0.0;
    out["val_loss"] = sums[kernels::kDpoLoss] / sums[kernels::kDpoPairs] + rpo_alpha * nll;
  }
  return out;
}

}  // namespace lt
