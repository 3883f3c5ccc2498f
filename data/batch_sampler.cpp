#include "data/batch_sampler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

// The sampler's epochs draw from streams of this one, apart from the corpus generator's streams of
// the same seed; a mixture's source i > 0 from stream kSourceStream + i of the seed.
constexpr uint64_t kSamplerStream = 0x53414D504C4552ull;
constexpr uint64_t kSourceStream = 0x534F55524345ull;

TokenBatch empty_batch(int64_t rows, int64_t seq_len) {
  return {Tensor::empty({rows, seq_len}, DType::I32), Tensor::empty({rows, seq_len}, DType::I32)};
}

// Row `row` of the batch from the T + 1 tokens of a window.
void fill_row(const std::vector<int32_t>& window, TokenBatch& batch, int64_t row) {
  const auto T = static_cast<int64_t>(window.size()) - 1;
  std::memcpy(batch.inputs.data<int32_t>() + row * T, window.data(), T * sizeof(int32_t));
  std::memcpy(batch.targets.data<int32_t>() + row * T, window.data() + 1, T * sizeof(int32_t));
}

// Fisher-Yates with our own Rng: std::shuffle's algorithm differs between standard libraries.
template <class T>
void shuffle(std::vector<T>& values, Rng& rng) {
  for (int64_t i = static_cast<int64_t>(values.size()) - 1; i > 0; --i)
    std::swap(values[i], values[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
}

}  // namespace

bool at_start(const DataCursor& cursor) {
  return std::all_of(cursor.begin(), cursor.end(), [](const SamplerCursor& c) { return c == SamplerCursor{}; });
}

// One source's windows, epoch after epoch (the order the header describes).
class BatchSampler::SourceWindows {
 public:
  SourceWindows(SamplerSource source, int64_t seq_len, uint64_t seed)
      : source_(std::move(source)), seq_len_(seq_len), seed_(seed) {
    enter_epoch(0);
    LT_CHECK(epoch_windows_ > 0, source_.tokens.spec(), ": ", source_.tokens.num_tokens(),
             " tokens are too few for sequence length ", seq_len, " (a window needs ", seq_len + 1,
             " tokens of one shard)");
  }

  const SamplerSource& source() const { return source_; }
  const SamplerCursor& cursor() const { return cursor_; }
  int64_t epoch_windows() const { return epoch_windows_; }

  // The next window: its shard and first token.
  std::pair<size_t, int64_t> next() {
    if (cursor_.position == static_cast<uint64_t>(epoch_windows_)) enter_epoch(cursor_.epoch + 1);
    while (cursor_.position - shard_begin_ == static_cast<uint64_t>(windows_[shard_order_[visit_]])) next_shard();
    const size_t shard = shard_order_[visit_];
    const int64_t k = order_[cursor_.position - shard_begin_];
    ++cursor_.position;
    ++cursor_.given;
    return {shard, offsets_[shard] + k * seq_len_};
  }

  void restore(const SamplerCursor& cursor) {
    enter_epoch(cursor.epoch);
    LT_CHECK(cursor.position <= static_cast<uint64_t>(epoch_windows_), "batch sampler: cursor position ",
             cursor.position, " is beyond the ", epoch_windows_, " windows of epoch ", cursor.epoch, " of ",
             source_.tokens.spec(), " (was it saved with other data, seed or sequence length?)");
    // The shards before the cursor's draw their orders as they did, so the generator is where it was.
    while (cursor.position - shard_begin_ > static_cast<uint64_t>(windows_[shard_order_[visit_]])) next_shard();
    cursor_ = cursor;
  }

 private:
  void enter_epoch(uint64_t epoch) {
    rng_ = Rng(derive_seed(derive_seed(seed_, kSamplerStream), epoch));
    const size_t shards = source_.tokens.num_shards();
    shard_order_.resize(shards);
    std::iota(shard_order_.begin(), shard_order_.end(), size_t{0});
    shuffle(shard_order_, rng_);
    offsets_.assign(shards, 0);
    windows_.assign(shards, 0);
    epoch_windows_ = 0;
    for (size_t s = 0; s < shards; ++s) {
      const int64_t n = source_.tokens.shard_tokens(s);
      if (n < seq_len_ + 1) continue;  // no whole window: the shard sits this epoch out
      // The offset keeps at least one whole window in the shard: offset + T + 1 <= n.
      const int64_t max_offset = std::min(seq_len_ - 1, n - 1 - seq_len_);
      offsets_[s] = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(max_offset) + 1));
      windows_[s] = (n - 1 - offsets_[s]) / seq_len_;
      epoch_windows_ += windows_[s];
    }
    cursor_.epoch = epoch;
    cursor_.position = 0;
    visit_ = 0;
    shard_begin_ = 0;
    order_shard();
  }

  void next_shard() {
    shard_begin_ += static_cast<uint64_t>(windows_[shard_order_[visit_]]);
    ++visit_;
    order_shard();
  }

  // The window order of the shard being visited (none for a shard without windows, or past the last).
  void order_shard() {
    order_.clear();
    if (visit_ >= shard_order_.size()) return;
    order_.resize(static_cast<size_t>(windows_[shard_order_[visit_]]));
    std::iota(order_.begin(), order_.end(), uint32_t{0});
    shuffle(order_, rng_);
  }

  SamplerSource source_;
  int64_t seq_len_;
  uint64_t seed_;
  SamplerCursor cursor_;
  Rng rng_{0};
  std::vector<size_t> shard_order_;
  std::vector<int64_t> offsets_, windows_;  // by shard index
  int64_t epoch_windows_ = 0;
  size_t visit_ = 0;            // the shard being visited: shard_order_[visit_]
  uint64_t shard_begin_ = 0;    // the epoch position of its first window
  std::vector<uint32_t> order_;  // its windows in visiting order (window k starts at offset + k T)
};

BatchSampler::BatchSampler(std::vector<SamplerSource> sources, int64_t batch_size, int64_t seq_len, uint64_t seed,
                           int rank, int world_size)
    : batch_size_(batch_size), seq_len_(seq_len), rank_(rank), world_size_(world_size) {
  LT_CHECK(batch_size >= 1 && seq_len >= 1, "batch sampler: batch size ", batch_size, " and sequence length ", seq_len,
           " must be positive");
  LT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "batch sampler: rank ", rank, " is outside world size ",
           world_size);
  LT_CHECK(!sources.empty(), "batch sampler: no source of tokens");
  double total = 0;
  for (const SamplerSource& s : sources) {
    LT_CHECK(s.weight > 0, "batch sampler: source '", s.name, "' has weight ", s.weight, ", not > 0");
    total += s.weight;
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    shares_.push_back(sources[i].weight / total);
    const uint64_t source_seed = i == 0 ? seed : derive_seed(seed, kSourceStream + i);
    sources_.push_back(std::make_unique<SourceWindows>(std::move(sources[i]), seq_len, source_seed));
  }
}

BatchSampler::BatchSampler(Tensor tokens, int64_t batch_size, int64_t seq_len, uint64_t seed, int rank, int world_size)
    : BatchSampler(std::vector<SamplerSource>{{"tokens", TokenShards::in_memory(std::move(tokens)), 1.0}}, batch_size,
                   seq_len, seed, rank, world_size) {}

BatchSampler::~BatchSampler() = default;
BatchSampler::BatchSampler(BatchSampler&&) noexcept = default;

const SamplerSource& BatchSampler::source(size_t i) const { return sources_.at(i)->source(); }
int64_t BatchSampler::windows_in_epoch(size_t source) const { return sources_.at(source)->epoch_windows(); }

size_t BatchSampler::pick_source(const std::vector<uint64_t>& given) const {
  if (given.size() == 1) return 0;
  const double after = static_cast<double>(std::accumulate(given.begin(), given.end(), uint64_t{0}) + 1);
  size_t best = 0;
  double best_deficit = 0;
  for (size_t i = 0; i < given.size(); ++i) {
    const double deficit = shares_[i] * after - static_cast<double>(given[i]);
    if (i == 0 || deficit > best_deficit) best = i, best_deficit = deficit;
  }
  return best;
}

TokenBatch BatchSampler::next() {
  TokenBatch batch = empty_batch(batch_size_, seq_len_);
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  std::vector<uint64_t> given;
  for (const auto& s : sources_) given.push_back(s->cursor().given);
  for (int64_t global_row = 0; global_row < world_size_ * batch_size_; ++global_row) {
    const size_t source = pick_source(given);
    ++given[source];
    const auto [shard, start] = sources_[source]->next();
    if (global_row / batch_size_ != rank_) continue;
    sources_[source]->source().tokens.read(shard, start, seq_len_ + 1, window.data());
    fill_row(window, batch, global_row % batch_size_);
  }
  return batch;
}

DataCursor BatchSampler::cursor() const {
  DataCursor cursor;
  for (const auto& s : sources_) cursor.push_back(s->cursor());
  return cursor;
}

void BatchSampler::restore(const DataCursor& cursor) {
  LT_CHECK(cursor.size() == sources_.size(), "batch sampler: the cursor has ", cursor.size(),
           " sources, the data ", sources_.size(), " (was it saved with other data?)");
  for (size_t i = 0; i < sources_.size(); ++i) sources_[i]->restore(cursor[i]);
}

BatchSampler::Exhaustion BatchSampler::first_exhaustion() const {
  std::vector<uint64_t> given, left;
  for (const auto& s : sources_) {
    given.push_back(s->cursor().given);
    left.push_back(static_cast<uint64_t>(s->epoch_windows()) - s->cursor().position);
  }
  for (int64_t n = 0;; ++n) {
    const size_t source = pick_source(given);
    if (left[source] == 0) return {n, sources_[source]->source().name};
    ++given[source];
    --left[source];
  }
}

HeldoutBatches::HeldoutBatches(TokenShards tokens, int64_t batch_size, int64_t seq_len, int64_t limit_tokens)
    : tokens_(std::move(tokens)), batch_size_(batch_size), seq_len_(seq_len) {
  LT_CHECK(batch_size >= 1 && seq_len >= 1, "held-out batches: batch size ", batch_size, " and sequence length ",
           seq_len, " must be positive");
  const int64_t n = limit_tokens > 0 ? std::min(limit_tokens, tokens_.num_tokens()) : tokens_.num_tokens();
  LT_CHECK(n >= seq_len + 1, "held-out batches: ", n, " tokens are too few for sequence length ", seq_len,
           " (one window needs ", seq_len + 1, ")");
  num_windows_ = (n - 1) / seq_len_;
}

std::optional<TokenBatch> HeldoutBatches::next() {
  if (next_window_ == num_windows_) return std::nullopt;
  const int64_t rows = std::min(batch_size_, num_windows_ - next_window_);
  TokenBatch batch = empty_batch(rows, seq_len_);
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  for (int64_t row = 0; row < rows; ++row) {
    tokens_.read((next_window_ + row) * seq_len_, seq_len_ + 1, window.data());
    fill_row(window, batch, row);
  }
  next_window_ += rows;
  return batch;
}

}  // namespace lt
