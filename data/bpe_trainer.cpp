#include "data/bpe_trainer.h"

#include <algorithm>
#include <deque>
#include <queue>
#include <unordered_map>
#include <utility>

#include "data/bpe_tokenizer.h"
#include "tensor/error.h"

namespace lt {

namespace {

uint64_t pair_key(uint32_t left, uint32_t right) { return uint64_t{left} << 32 | right; }

// The corpus as distinct pieces with their counts, each piece a list of symbol ids, and the index of
// which pieces hold which pair, so that a merge touches only the pieces it changes.
struct Corpus {
  std::vector<std::vector<uint32_t>> words;
  std::vector<int64_t> counts;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;  // may list a word twice or stale ones

  void count_pairs(uint32_t w, int64_t sign, std::vector<uint64_t>* grown) {
    const std::vector<uint32_t>& word = words[w];
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key = pair_key(word[i], word[i + 1]);
      pair_counts[key] += sign * counts[w];
      if (sign > 0) {
        pair_words[key].push_back(w);
        if (grown) grown->push_back(key);
      }
    }
  }
};

// Highest count first; among equal counts the smaller pair key.
struct Candidate {
  int64_t count;
  uint64_t key;
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : key > o.key; }
};

}  // namespace

Json train_bpe(const std::vector<std::string_view>& texts, const BpeTrainSettings& settings) {
  const auto specials = static_cast<int64_t>(settings.special_tokens.size());
  LT_CHECK(settings.vocab_size >= 256 + specials, "tokenizer train: --vocab ", settings.vocab_size,
           " is below the 256 bytes and ", specials, " special tokens");
  const Json pre_tokenizer_json = named_pre_tokenizer(settings.pattern);
  const PreTokenizer pre_tokenizer = PreTokenizer::from_json(pre_tokenizer_json, "pattern " + settings.pattern);

  // Distinct pieces and their counts.
  std::unordered_map<std::string, int64_t> piece_counts;
  std::vector<std::string_view> pieces;
  std::deque<std::string> owned;
  for (std::string_view text : texts) {
    pieces.clear();
    owned.clear();
    pre_tokenizer.split(text, pieces, owned);
    for (std::string_view piece : pieces) ++piece_counts[std::string(piece)];
  }
  // In sorted order, so the word numbering (and with it nothing else, but the work) is reproducible.
  std::vector<std::pair<std::string, int64_t>> sorted(piece_counts.begin(), piece_counts.end());
  std::sort(sorted.begin(), sorted.end());
  Corpus corpus;
  for (const auto& [piece, count] : sorted) {
    corpus.words.emplace_back(piece.begin(), piece.end());
    for (uint32_t& symbol : corpus.words.back()) symbol &= 0xFF;  // char -> byte id
    corpus.counts.push_back(count);
  }
  for (uint32_t w = 0; w < corpus.words.size(); ++w) corpus.count_pairs(w, +1, nullptr);

  std::vector<std::string> spelling(256);
  for (int b = 0; b < 256; ++b) spelling[static_cast<size_t>(b)] = byte_level_char(static_cast<uint8_t>(b));
  Json merges = Json::array();

  std::priority_queue<Candidate> queue;
  for (const auto& [key, count] : corpus.pair_counts) queue.push({count, key});
  const int64_t merges_wanted = settings.vocab_size - 256 - specials;
  std::vector<uint64_t> grown;
  std::vector<uint32_t> last_seen(corpus.words.size(), UINT32_MAX);
  while (static_cast<int64_t>(merges.size()) < merges_wanted && !queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int64_t current = corpus.pair_counts[top.key];
    if (current != top.count) {  // stale: its count fell since it was queued
      if (current > 0) queue.push({current, top.key});
      continue;
    }
    if (current < 2) break;
    const auto left = static_cast<uint32_t>(top.key >> 32), right = static_cast<uint32_t>(top.key);
    const auto merged = static_cast<uint32_t>(spelling.size());
    spelling.push_back(spelling[left] + spelling[right]);
    merges.push_back(spelling[left] + " " + spelling[right]);

    // Rewrite each word holding the pair: its old pairs out, the merge, its new pairs in.
    grown.clear();
    const std::vector<uint32_t> holders = std::move(corpus.pair_words[top.key]);
    corpus.pair_words.erase(top.key);
    for (uint32_t w : holders) {
      if (last_seen[w] == merged) continue;
      last_seen[w] = merged;
      std::vector<uint32_t>& word = corpus.words[w];
      bool holds = false;
      for (size_t i = 0; i + 1 < word.size() && !holds; ++i) holds = word[i] == left && word[i + 1] == right;
      if (!holds) continue;
      corpus.count_pairs(w, -1, nullptr);
      size_t out = 0;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          word[out++] = merged;
          ++i;
        } else {
          word[out++] = word[i];
        }
      }
      word.resize(out);
      corpus.count_pairs(w, +1, &grown);
    }
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t key : grown) queue.push({corpus.pair_counts[key], key});
  }

  Json vocab = Json::object();
  for (size_t id = 0; id < spelling.size(); ++id) vocab[spelling[id]] = id;
  Json added = Json::array();
  for (const std::string& special : settings.special_tokens) {
    const size_t id = spelling.size() + added.size();
    added.push_back({{"id", id},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return Json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer_json},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}}}};
}

}  // namespace lt
