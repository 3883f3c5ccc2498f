#include "trainer/stage_batches.h"

#include <filesystem>

#include "data/chat_dataset.h"
#include "data/packing.h"
#include "io/format_text.h"
#include "trainer/checkpoint.h"
#include "trainer/dpo.h"
#include "trainer/evaluate.h"

namespace lt {

void StageBatches::add_step_metrics(const StepStats&, Json&) const {}
Objective StageBatches::objective() const { return language_model_objective; }

namespace {

class WindowBatches : public StageBatches {
 public:
  WindowBatches(std::vector<SamplerSource> sources, std::optional<TokenShards> val, int64_t B, int64_t T, uint64_t seed,
                int rank, int world_size)
      : sampler_(std::move(sources), B, T, seed, rank, world_size), val_(std::move(val)), B_(B), T_(T) {
    if (sampler_.num_sources() == 1) {
      description_ = sampler_.source(0).tokens.describe();
      return;
    }
    for (size_t i = 0; i < sampler_.num_sources(); ++i) {
      const SamplerSource& source = sampler_.source(i);
      description_ += format_text("%s%s %.3g: %s", i ? "; " : "", source.name.c_str(), source.weight,
                                  source.tokens.describe().c_str());
    }
  }
  TokenBatch next() override { return sampler_.next(); }
  DataCursor cursor() const override { return sampler_.cursor(); }
  void restore(const DataCursor& cursor) override { sampler_.restore(cursor); }
  Json evaluate(LingForCausalLM& model, int64_t limit_tokens) override {
    if (!val_) return Json::object();
    return {{"val_loss", lt::evaluate(model, *val_, T_, B_, limit_tokens).mean()}};
  }
  // A mixture's tokens and epochs per source, over the stage so far.
  void add_step_metrics(const StepStats&, Json& record) const override {
    if (sampler_.num_sources() == 1) return;
    const DataCursor cursor = sampler_.cursor();
    Json sources = Json::object();
    for (size_t i = 0; i < cursor.size(); ++i)
      sources[sampler_.source(i).name] = {{"tokens", static_cast<int64_t>(cursor[i].given) * T_},
                                          {"epoch", cursor[i].epoch}};
    record["sources"] = sources;
  }

 private:
  BatchSampler sampler_;
  std::optional<TokenShards> val_;
  int64_t B_, T_;
};

// The cursor of data with one source (post-training's files).
SamplerCursor one_cursor(const DataCursor& cursor) {
  LT_CHECK(cursor.size() == 1, "the data cursor has ", cursor.size(), " sources, the stage's data one");
  return cursor[0];
}

// How many of the held-out rows an evaluation uses: about limit_tokens / T of them (all when 0).
size_t rows_within(const std::vector<PackedRow>& rows, int64_t limit_tokens) {
  if (limit_tokens <= 0 || rows.empty()) return rows.size();
  const auto T = static_cast<int64_t>(rows[0].inputs.size());
  return std::min(rows.size(), static_cast<size_t>(std::max<int64_t>(1, limit_tokens / T)));
}

// The packed rows of a JSONL file and what packing it skipped.
struct PackedData {
  std::vector<PackedRow> rows;
  ChatDataset data;  // the sequences themselves are dropped once packed
};

// The file's use: the data a stage trains on, or its held-out data.
enum class FileRole { Train, HeldOut };

PackedData pack_file(StageKind kind, FileRole role, const std::string& path, const Tokenizer& tokenizer, int64_t T) {
  PackedData packed;
  const bool sft = kind == StageKind::Sft;
  packed.data = sft ? load_conversations(path, tokenizer, T + 1) : load_preference_pairs(path, tokenizer, T + 1);
  LT_CHECK(packed.data.examples() > 0, path, ": no ", sft ? "conversation" : "pair",
           role == FileRole::Train ? " to train on (" : " to evaluate on (",
           packed.data.records, " records, ", packed.data.too_long, " longer than --seq ", T, " + 1, ",
           packed.data.identical, " with identical chosen and rejected)");
  packed.rows = pack_sequences(packed.data.sequences, T, tokenizer.eos_id(), sft ? 1 : 2);
  packed.data.sequences.clear();
  packed.data.sequences.shrink_to_fit();
  return packed;
}

std::string describe(StageKind kind, const std::string& path, const PackedData& packed, int64_t T) {
  std::string text = path + " (" + std::to_string(packed.data.examples()) +
                     (kind == StageKind::Sft ? " conversations" : " pairs") +
                     " in " + std::to_string(packed.rows.size()) + " rows of " + std::to_string(T);
  if (packed.data.too_long > 0) text += "; " + std::to_string(packed.data.too_long) + " longer than seq + 1 skipped";
  if (packed.data.identical > 0)
    text += "; " + std::to_string(packed.data.identical) + " with identical chosen and rejected skipped";
  if (packed.data.format_only > 0) text += "; " + std::to_string(packed.data.format_only) + " format-only";
  return text + ")";
}

class ConversationBatches : public StageBatches {
 public:
  ConversationBatches(PackedData train, std::vector<PackedRow> val, int64_t B, uint64_t seed, int rank, int world_size)
      : rows_(std::move(train.rows)), val_(std::move(val)), sampler_(static_cast<int64_t>(rows_.size()), B, seed, rank, world_size), B_(B) {}
  TokenBatch next() override { return stack_rows(rows_, sampler_.next()); }
  DataCursor cursor() const override { return {sampler_.cursor()}; }
  void restore(const DataCursor& cursor) override { sampler_.restore(one_cursor(cursor)); }
  Json evaluate(LingForCausalLM& model, int64_t limit_tokens) override {
    if (val_.empty()) return Json::object();
    NoGradGuard no_grad;
    const size_t n = rows_within(val_, limit_tokens);
    double sum = 0;
    int64_t labelled = 0, conversations = 0;
    for (size_t row = 0; row < n; ++row) conversations += val_[row].sequences;
    for (size_t first = 0; first < n; first += static_cast<size_t>(B_)) {
      const TokenBatch b = stack_rows(val_, row_range(first, std::min(n - first, static_cast<size_t>(B_))));
      MoEContext context;
      // The loss is the mean over the batch's labelled targets: times their count, it is their sum.
      sum += model.loss(b.inputs, b.targets, context, b.doc_start).lm.value().item() * static_cast<double>(b.loss_units);
      labelled += b.loss_units;
    }
    return {{"val_loss", labelled > 0 ? sum / static_cast<double>(labelled) : 0.0}, {"val_conversations", conversations}};
  }
  void set_description(std::string text) { description_ = std::move(text); }

 private:
  std::vector<PackedRow> rows_, val_;
  RowSampler sampler_;
  int64_t B_;
};

class PreferenceBatches : public StageBatches {
 public:
  PreferenceBatches(std::vector<PackedRow> rows, std::vector<double> reference, std::vector<PackedRow> val,
                    std::vector<double> val_reference, const StageSettings& stage, uint64_t seed, int rank, int world_size)
      : rows_(std::move(rows)), reference_(std::move(reference)), val_(std::move(val)), val_reference_(std::move(val_reference)),
        sampler_(static_cast<int64_t>(rows_.size()), stage.batch, seed, rank, world_size), B_(stage.batch),
        beta_(stage.beta), rpo_alpha_(stage.rpo_alpha) {}
  TokenBatch next() override { return stack_preference_rows(rows_, sampler_.next(), reference_); }
  DataCursor cursor() const override { return {sampler_.cursor()}; }
  void restore(const DataCursor& cursor) override { sampler_.restore(one_cursor(cursor)); }
  Json evaluate(LingForCausalLM& model, int64_t limit_tokens) override {
    if (val_.empty()) return Json::object();
    return evaluate_preferences(model, val_, val_reference_, B_, static_cast<int64_t>(rows_within(val_, limit_tokens)),
                                beta_, rpo_alpha_);
  }
  void add_step_metrics(const StepStats& stats, Json& record) const override {
    const Json metrics = dpo_metrics(stats.objective_stats, "");
    for (const auto& [name, value] : metrics.items()) record[name] = value;
  }
  Objective objective() const override { return dpo_objective(beta_, rpo_alpha_); }
  void set_description(std::string text) { description_ = std::move(text); }

 private:
  std::vector<PackedRow> rows_;
  std::vector<double> reference_;
  std::vector<PackedRow> val_;
  std::vector<double> val_reference_;
  RowSampler sampler_;
  int64_t B_;
  double beta_, rpo_alpha_;
};

// The reference log-probs of a packed file: cached under cache_dir, keyed by the reference checkpoint,
// the file and the tokenizer; else computed with the reference model, loaded for this alone and freed
// before training (no second model stays in memory).
std::vector<double> reference_logprobs(const StageSettings& stage, const std::string& path, const PackedData& packed,
                                       const PostTrainingInputs& inputs) {
  const std::string key = reference_cache_key(stage.reference, path, inputs.tokenizer_json);
  const std::string cache = inputs.cache_dir + "/" + std::filesystem::path(path).filename().string() + ".logps.json";
  const size_t sequences = static_cast<size_t>(2 * (packed.data.examples()));
  bool reused = false;
  std::vector<double> logps = cached_reference_logprobs(cache, key, sequences, [&]() {
    LingForCausalLM reference(load_checkpoint_config(stage.reference), 0);
    load_checkpoint_weights(stage.reference, reference);
    reference.to(inputs.device);
    reference.extend_context(stage.seq);
    return packed_sequence_logprobs(reference, packed.rows, static_cast<int64_t>(sequences), stage.batch);
  }, &reused);
  std::fprintf(inputs.progress, "reference log-probs of %s: %s %s\n", path.c_str(),
               reused ? "reused from" : "computed with the reference checkpoint into", cache.c_str());
  return logps;
}

}  // namespace

std::unique_ptr<StageBatches> window_batches(std::vector<SamplerSource> sources, std::optional<TokenShards> val,
                                             int64_t B, int64_t T, uint64_t seed, int rank, int world_size) {
  return std::make_unique<WindowBatches>(std::move(sources), std::move(val), B, T, seed, rank, world_size);
}

std::unique_ptr<StageBatches> post_training_batches(const StageSettings& stage, const PostTrainingInputs& inputs) {
  LT_CHECK(stage.kind != StageKind::Pretrain, "stage '", stage.name, "' is not a post-training stage");
  const Tokenizer& tokenizer = *inputs.tokenizer;
  PackedData train = pack_file(stage.kind, FileRole::Train, stage.data.path(), tokenizer, stage.seq);
  PackedData val;
  if (!stage.val.empty()) val = pack_file(stage.kind, FileRole::HeldOut, stage.val, tokenizer, stage.seq);
  std::string text = describe(stage.kind, stage.data.path(), train, stage.seq);
  if (!stage.val.empty()) text += ", held-out " + describe(stage.kind, stage.val, val, stage.seq);
  if (stage.kind == StageKind::Sft) {
    auto batches = std::make_unique<ConversationBatches>(std::move(train), std::move(val.rows), stage.batch, inputs.seed,
                                                         inputs.rank, inputs.world_size);
    batches->set_description(text);
    return batches;
  }
  std::vector<double> reference = reference_logprobs(stage, stage.data.path(), train, inputs);
  std::vector<double> val_reference;
  if (!stage.val.empty()) val_reference = reference_logprobs(stage, stage.val, val, inputs);
  auto batches = std::make_unique<PreferenceBatches>(std::move(train.rows), std::move(reference), std::move(val.rows),
                                                     std::move(val_reference), stage, inputs.seed, inputs.rank,
                                                     inputs.world_size);
  batches->set_description(text);
  return batches;
}

int64_t packed_train_rows(const StageSettings& stage, const Tokenizer& tokenizer) {
  if (!stage.val.empty()) pack_file(stage.kind, FileRole::HeldOut, stage.val, tokenizer, stage.seq);
  const PackedData train = pack_file(stage.kind, FileRole::Train, stage.data.path(), tokenizer, stage.seq);
  return static_cast<int64_t>(train.rows.size());
}

}  // namespace lt
