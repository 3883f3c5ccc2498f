#include "data/corpus_multiple_choice.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "data/corpus.h"
#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

constexpr size_t kCutFrom = 96, kCutSpread = 65;  // a cut's target: 96 to 160 bytes into a document
constexpr size_t kLongestWord = 40;                // no whitespace that soon after the target: not cut there
constexpr size_t kShortestDocument = kCutFrom + kCutSpread + kLongestWord + kCorpusChoiceBytes;
constexpr int kDistractors = 3;
constexpr size_t kFirstPool = 64;  // documents drawn from before the first item (each domain: kPerDomain)
constexpr size_t kPerDomain = 8;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t'; }

// Where a chunk of `text` begins: the first start of a run of whitespace at or after `target` (so the
// text before it ends with a word, and the chunk begins with whitespace), if one comes soon enough for
// kCorpusChoiceBytes to follow.
std::optional<size_t> cut_point(std::string_view text, size_t target) {
  for (size_t at = std::max<size_t>(target, 1); at < text.size() && at <= target + kLongestWord; ++at)
    if (is_space(text[at]) && !is_space(text[at - 1]))
      return at + kCorpusChoiceBytes <= text.size() ? std::optional<size_t>(at) : std::nullopt;
  return std::nullopt;
}

// kCorpusChoiceBytes of text from `begin`, a byte or two fewer where that would split a UTF-8 letter.
std::string chunk_at(std::string_view text, size_t begin) {
  size_t end = begin + kCorpusChoiceBytes;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(begin, end - begin));
}

// The held-out documents of the default corpus that are long enough, in index order, grown on demand.
class HeldoutPool {
 public:
  const CorpusDocument& at(size_t i) {
    while (documents_.size() <= i) add_next();
    return documents_[i];
  }
  size_t size() const { return documents_.size(); }
  // Grows until it holds `count` documents and kPerDomain of every domain.
  void reserve(size_t count) {
    while (documents_.size() < count ||
           std::any_of(by_domain_.begin(), by_domain_.end(), [](const auto& d) { return d.size() < kPerDomain; }))
      add_next();
  }
  const std::vector<size_t>& of_domain(CorpusDomain domain) const { return by_domain_[static_cast<size_t>(domain)]; }
  uint64_t corpus_index(size_t i) const { return corpus_indices_.at(i); }

 private:
  void add_next() {
    for (;; ++next_index_) {
      if (!is_heldout_document(kDefaultCorpusSeed, next_index_, kDefaultHeldoutFraction)) continue;
      CorpusDocument document = generate_corpus_document(kDefaultCorpusSeed, next_index_);
      if (document.text.size() < kShortestDocument) continue;
      corpus_indices_.push_back(next_index_++);
      by_domain_[static_cast<size_t>(document.domain)].push_back(documents_.size());
      documents_.push_back(std::move(document));
      return;
    }
  }
  uint64_t next_index_ = 0;
  std::vector<CorpusDocument> documents_;
  std::vector<uint64_t> corpus_indices_;
  std::array<std::vector<size_t>, kNumCorpusDomains> by_domain_;
};

}  // namespace

std::vector<MultipleChoiceItem> make_corpus_multiple_choice_items(uint64_t seed, int64_t n) {
  LT_CHECK(n >= 0, "corpus multiple choice: the number of items must be >= 0, got ", n);
  HeldoutPool pool;
  pool.reserve(kFirstPool);
  std::vector<MultipleChoiceItem> items;
  for (size_t document = 0; static_cast<int64_t>(items.size()) < n; ++document) {
    const std::string text = pool.at(document).text;
    const CorpusDomain domain = pool.at(document).domain;
    Rng rng(derive_seed(seed, document));
    const std::optional<size_t> cut = cut_point(text, kCutFrom + rng.below(kCutSpread));
    if (!cut) continue;
    MultipleChoiceItem item;
    item.context = text.substr(0, *cut);
    item.where = "corpus multiple choice, document " + std::to_string(pool.corpus_index(document));
    const std::string correct = chunk_at(text, *cut);
    // A distractor's domain is drawn first, then documents of that kind until one gives a new chunk.
    auto draw_chunk = [&](bool same_domain) -> std::optional<std::string> {
      const std::vector<size_t>& same = pool.of_domain(domain);
      const size_t other = same_domain ? same[rng.below(same.size())] : rng.below(pool.size());
      if (other == document || (pool.at(other).domain == domain) != same_domain) return std::nullopt;
      const std::string& other_text = pool.at(other).text;
      const std::optional<size_t> at = cut_point(other_text, kCutFrom + rng.below(kCutSpread));
      if (!at) return std::nullopt;
      return chunk_at(other_text, *at);
    };
    std::vector<std::string> distractors;
    while (distractors.size() < kDistractors) {
      const bool same_domain = rng.uniform() < 0.5;
      for (;;) {
        const std::optional<std::string> chunk = draw_chunk(same_domain);
        const bool seen = chunk && std::find(distractors.begin(), distractors.end(), *chunk) != distractors.end();
        if (!chunk || *chunk == correct || seen) continue;
        distractors.push_back(*chunk);
        break;
      }
    }
    item.label = static_cast<int64_t>(rng.below(kDistractors + 1));
    item.choices = distractors;
    item.choices.insert(item.choices.begin() + item.label, correct);
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace lt
