// DPO as a Trainer objective: sigmoid DPO with Ling's NLL term on the chosen response (nn/dpo_loss.h)
// over batches of packed pairs (data/packing.h), plus what it needs around it: the reference model's
// log-probs, computed once per example and cached on disk, and TRL's metrics by TRL's names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/packing.h"
#include "io/json.h"
#include "trainer/trainer.h"

namespace lt {

// The micro-batch's DPO loss plus the MoE auxiliary losses; LossBreakdown::stats carries the DpoStat sums.
Objective dpo_objective(double beta, double rpo_alpha);

// The reference log-probs of a data file, from the cache file when it was written for the same key,
// else computed by `compute` and written there (atomically). The key fingerprints everything they
// depend on: the reference checkpoint's weights, the data file, the tokenizer.
std::string reference_cache_key(const std::string& reference_checkpoint, const std::string& data_path,
                                const std::string& tokenizer_json);
std::vector<double> cached_reference_logprobs(const std::string& cache_path, const std::string& key, size_t count,
                                              const std::function<std::vector<double>()>& compute, bool* reused);

// TRL's metrics from summed DpoStat values (one step's, or a held-out pass's): rewards/chosen,
// rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, nll_loss, and
// dpo_loss (the sigmoid part alone), each name after `prefix` ("" or "eval_").
Json dpo_metrics(const std::vector<double>& sums, const std::string& prefix);

// The held-out DPO figures of `model` over rows of packed pairs: dpo_metrics with prefix "eval_" and
// val_loss (the mean DPO loss plus rpo_alpha times the NLL). Rows go `batch` at a time; at most `limit`
// rows (0: all).
Json evaluate_preferences(LingForCausalLM& model, const std::vector<PackedRow>& rows,
                          const std::vector<double>& reference_logp, int64_t batch, int64_t limit, double beta,
                          double rpo_alpha);

}  // namespace lt
