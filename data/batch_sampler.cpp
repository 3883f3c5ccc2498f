#include "data/batch_sampler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

// The sampler's epochs draw from streams of this one, apart from the corpus generator's streams of
// the same seed.
constexpr uint64_t kSamplerStream = 0x53414D504C4552ull;

void check_token_array(const char* who, const Tensor& tokens, int64_t batch_size, int64_t seq_len) {
  LT_CHECK(tokens.defined() && tokens.ndim() == 1 && tokens.dtype() == DType::I32 && tokens.is_cpu(), who,
           ": tokens must be a 1-D i32 tensor on the CPU, got ", tokens.defined() ? tokens.str() : "an undefined tensor");
  LT_CHECK(batch_size >= 1 && seq_len >= 1, who, ": batch size ", batch_size, " and sequence length ", seq_len,
           " must be positive");
  LT_CHECK(tokens.numel() >= seq_len + 1, who, ": ", tokens.numel(), " tokens are too few for sequence length ",
           seq_len, " (one window needs ", seq_len + 1, ")");
}

TokenBatch empty_batch(int64_t rows, int64_t seq_len) {
  return {Tensor::empty({rows, seq_len}, DType::I32), Tensor::empty({rows, seq_len}, DType::I32)};
}

void copy_window(const Tensor& tokens, int64_t start, int64_t seq_len, TokenBatch& batch, int64_t row) {
  const int32_t* source = tokens.data<int32_t>() + start;
  std::memcpy(batch.inputs.data<int32_t>() + row * seq_len, source, seq_len * sizeof(int32_t));
  std::memcpy(batch.targets.data<int32_t>() + row * seq_len, source + 1, seq_len * sizeof(int32_t));
}

}  // namespace

BatchSampler::BatchSampler(Tensor tokens, int64_t batch_size, int64_t seq_len, uint64_t seed, int rank, int world_size)
    : tokens_(std::move(tokens)), batch_size_(batch_size), seq_len_(seq_len), seed_(seed), rank_(rank),
      world_size_(world_size) {
  check_token_array("batch sampler", tokens_, batch_size, seq_len);
  LT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "batch sampler: rank ", rank, " is outside world size ",
           world_size);
  enter_epoch(0);
}

void BatchSampler::enter_epoch(uint64_t epoch) {
  Rng rng(derive_seed(derive_seed(seed_, kSamplerStream), epoch));
  const int64_t num_tokens = tokens_.numel();
  // The offset keeps at least one whole window in the array: start + T + 1 <= num_tokens.
  const int64_t max_offset = std::min(seq_len_ - 1, num_tokens - 1 - seq_len_);
  const auto offset = static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_offset) + 1));
  const int64_t windows = (num_tokens - 1 - offset) / seq_len_;
  window_starts_.resize(windows);
  for (int64_t k = 0; k < windows; ++k) window_starts_[k] = offset + k * seq_len_;
  // Fisher-Yates with our own Rng: std::shuffle's algorithm differs between standard libraries.
  for (int64_t i = windows - 1; i > 0; --i)
    std::swap(window_starts_[i], window_starts_[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  cursor_ = {epoch, 0};
}

TokenBatch BatchSampler::next() {
  TokenBatch batch = empty_batch(batch_size_, seq_len_);
  for (int64_t global_row = 0; global_row < world_size_ * batch_size_; ++global_row) {
    if (cursor_.position == window_starts_.size()) enter_epoch(cursor_.epoch + 1);
    const int64_t start = window_starts_[cursor_.position++];
    if (global_row / batch_size_ == rank_) copy_window(tokens_, start, seq_len_, batch, global_row % batch_size_);
  }
  return batch;
}

void BatchSampler::restore(const SamplerCursor& cursor) {
  enter_epoch(cursor.epoch);
  LT_CHECK(cursor.position <= window_starts_.size(), "batch sampler: cursor position ", cursor.position,
           " is beyond the ", window_starts_.size(), " windows of epoch ", cursor.epoch,
           " (was it saved with other data, seed or sequence length?)");
  cursor_ = cursor;
}

HeldoutBatches::HeldoutBatches(Tensor tokens, int64_t batch_size, int64_t seq_len)
    : tokens_(std::move(tokens)), batch_size_(batch_size), seq_len_(seq_len) {
  check_token_array("held-out batches", tokens_, batch_size, seq_len);
  num_windows_ = (tokens_.numel() - 1) / seq_len_;
}

std::optional<TokenBatch> HeldoutBatches::next() {
  if (next_window_ == num_windows_) return std::nullopt;
  const int64_t rows = std::min(batch_size_, num_windows_ - next_window_);
  TokenBatch batch = empty_batch(rows, seq_len_);
  for (int64_t row = 0; row < rows; ++row) copy_window(tokens_, (next_window_ + row) * seq_len_, seq_len_, batch, row);
  next_window_ += rows;
  return batch;
}

}  // namespace lt
