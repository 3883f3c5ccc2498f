#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <deque>
#include <queue>
#include <utility>

#include "data/regex.h"
#include "tensor/error.h"

namespace lt {

namespace {

// The pattern of GPT-2's ByteLevel pre-tokenizer (use_regex true), and Llama-3's with the length of a
// digit run as a parameter (Ling's tokenizer takes digits one by one).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
std::string llama3_pattern(const std::string& digits) {
  return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)" + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> table;
    uint32_t next_shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      table[b] = utf8(printable ? b : next_shifted++);
    }
    return table;
  }();
  return chars;
}

// The bytes a byte-level spelling stands for; nullopt when a character is not one of the 256.
std::optional<std::string> byte_level_to_bytes(std::string_view spelling) {
  static const std::unordered_map<std::string, uint8_t> to_byte = [] {
    std::unordered_map<std::string, uint8_t> map;
    for (int b = 0; b < 256; ++b) map[byte_level_chars()[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    return map;
  }();
  std::string bytes;
  size_t i = 0;
  while (i < spelling.size()) {
    const auto lead = static_cast<unsigned char>(spelling[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    const auto found = to_byte.find(std::string(spelling.substr(i, length)));
    if (found == to_byte.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(found->second));
    i += length;
  }
  return bytes;
}

std::string regex_escape(std::string_view literal) {
  std::string escaped;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) escaped.push_back('\\');
    escaped.push_back(c);
  }
  return escaped;
}

using Behavior = PreTokenizer::Behavior;
using Step = PreTokenizer::Step;

Behavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail(where, ": split behavior '", name, "' is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, ",
       "Contiguous");
}

// Appends the steps of one pre-tokenizer (recursing into a Sequence). Returns whether a ByteLevel step
// was among them.
bool parse_pre_tokenizer(const Json& json, const std::string& source, std::vector<Step>& steps) {
  const JsonObject o(json, source, "pre_tokenizer");
  const std::string type = o.get<std::string>("type");
  if (type == "Sequence") {
    LT_CHECK(json.contains("pretokenizers") && json.at("pretokenizers").is_array(), source,
             ": pre_tokenizer Sequence without a 'pretokenizers' list");
    bool byte_level = false;
    for (const Json& inner : json.at("pretokenizers")) {
      LT_CHECK(!byte_level, source, ": pre_tokenizer has a step after ByteLevel, which is not supported");
      byte_level = parse_pre_tokenizer(inner, source, steps);
    }
    return byte_level;
  }
  if (type == "Split") {
    const JsonObject pattern = o.object("pattern");
    std::string regex;
    if (pattern.has("Regex")) regex = pattern.get<std::string>("Regex");
    else if (pattern.has("String")) regex = regex_escape(pattern.get<std::string>("String"));
    else fail(source, ": pre_tokenizer Split pattern has neither 'Regex' nor 'String'");
    std::shared_ptr<const Regex> compiled;
    try {
      compiled = std::make_shared<Regex>(regex);
    } catch (const Error& e) {
      fail(source, ": pre_tokenizer Split: ", e.what());
    }
    steps.push_back({std::move(compiled),
                     parse_behavior(o.get<std::string>("behavior"), source + ": pre_tokenizer Split"),
                     o.get<bool>("invert", false), false});
    return false;
  }
  if (type == "Digits") {
    // Hugging Face: each digit alone, or runs of digits (char::is_numeric, the Unicode N categories).
    steps.push_back({std::make_shared<Regex>(o.get<bool>("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)"),
                     Behavior::kIsolated, false, false});
    return false;
  }
  if (type == "ByteLevel") {
    const bool use_regex = o.get<bool>("use_regex", true);
    steps.push_back({use_regex ? std::make_shared<Regex>(kGpt2Pattern) : nullptr, Behavior::kIsolated, false,
                     o.get<bool>("add_prefix_space", true)});
    return true;
  }
  fail(source, ": pre_tokenizer type '", type, "' is not supported (byte-level BPE: Sequence, Split, Digits, ByteLevel)");
}

// One step on one piece: the pieces it splits into, by Hugging Face's rules for each behaviour. Pieces
// are views of the text; a piece given a prefix space lives in `owned` (a deque: views stay valid).
void split_piece(const Step& step, std::string_view piece, std::vector<std::string_view>& out,
                 std::deque<std::string>& owned) {
  if (step.add_prefix_space && !piece.starts_with(' ')) {
    std::string& prefixed = owned.emplace_back(1, ' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (!step.regex) {
    out.push_back(piece);
    return;
  }
  // The piece as alternating stretches: (begin, end, is_match), covering it whole.
  struct Stretch {
    size_t begin, end;
    bool match;
  };
  std::vector<Stretch> stretches;
  size_t covered = 0;
  step.regex->for_each_match(piece, [&](size_t begin, size_t end) {
    if (begin > covered) stretches.push_back({covered, begin, step.invert});
    stretches.push_back({begin, end, !step.invert});
    covered = end;
  });
  if (covered < piece.size()) stretches.push_back({covered, piece.size(), step.invert});

  std::vector<std::pair<size_t, size_t>> kept;
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const Stretch& s : stretches) kept.push_back({s.begin, s.end});
      break;
    case Behavior::kRemoved:
      for (const Stretch& s : stretches)
        if (!s.match) kept.push_back({s.begin, s.end});
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Stretch& s : stretches) {
        if (s.match && !previous_match && !kept.empty()) kept.back().second = s.end;
        else kept.push_back({s.begin, s.end});
        previous_match = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool next_match = false;
      for (auto s = stretches.rbegin(); s != stretches.rend(); ++s) {
        if (s->match && !next_match && !kept.empty()) kept.back().first = s->begin;
        else kept.push_back({s->begin, s->end});
        next_match = s->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Stretch& s : stretches) {
        if (s.match && previous_match) kept.back().second = s.end;
        else kept.push_back({s.begin, s.end});
        previous_match = s.match;
      }
      break;
    }
  }
  for (const auto& [begin, end] : kept)
    if (end > begin) out.push_back(piece.substr(begin, end - begin));
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

const std::string& byte_level_char(uint8_t b) { return byte_level_chars()[b]; }

PreTokenizer PreTokenizer::from_json(const Json& pre_tokenizer, const std::string& source) {
  PreTokenizer p;
  LT_CHECK(parse_pre_tokenizer(pre_tokenizer, source, p.steps_), source,
           ": the pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");
  return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces,
                         std::deque<std::string>& owned) const {
  std::vector<std::string_view> current{text}, next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : current) split_piece(step, piece, next, owned);
    std::swap(current, next);
  }
  pieces.insert(pieces.end(), current.begin(), current.end());
}

Json named_pre_tokenizer(const std::string& name) {
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  auto split_then_bytes = [&](const std::string& pattern) {
    return Json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                  byte_level}}};
  };
  if (name == "gpt2") return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  if (name == "llama3") return split_then_bytes(llama3_pattern(R"(\p{N}{1,3})"));
  if (name == "ling") return split_then_bytes(llama3_pattern(R"(\p{N})"));
  fail("pre-tokenizer pattern '", name, "' is not one of gpt2, llama3, ling");
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::from_file(const std::string& path) { return from_json(read_json_file(path), path); }

BpeTokenizer BpeTokenizer::from_json(const Json& json, const std::string& source) {
  const JsonObject top(json, source);
  BpeTokenizer t;
  const JsonObject model = top.object("model");
  const std::string type = model.get<std::string>("type", "BPE");
  LT_CHECK(type == "BPE", source, ": model type '", type, "' is not supported (byte-level BPE only)");
  LT_CHECK(!top.has("normalizer"), source, ": a normalizer (", json.at("normalizer").dump(),
           ") is not supported (byte-level BPE tokenizers have none)");
  LT_CHECK(!model.get<bool>("byte_fallback", false), source, ": byte_fallback BPE (SentencePiece style) is not supported");
  LT_CHECK(model.get<std::string>("continuing_subword_prefix", "").empty() &&
               model.get<std::string>("end_of_word_suffix", "").empty(),
           source, ": subword prefixes and word suffixes are not supported (byte-level BPE has none)");
  LT_CHECK(model.get<double>("dropout", 0.0) == 0.0, source, ": BPE dropout is not supported");
  t.ignore_merges_ = model.get<bool>("ignore_merges", false);
  LT_CHECK(top.has("pre_tokenizer"), source, ": no pre_tokenizer: not a byte-level BPE tokenizer");
  t.pre_tokenizer_ = PreTokenizer::from_json(json.at("pre_tokenizer"), source);
  if (top.has("decoder")) {
    const std::string decoder = top.object("decoder").get<std::string>("type");
    LT_CHECK(decoder == "ByteLevel", source, ": decoder '", decoder, "' is not supported (ByteLevel only)");
  }

  // The vocabulary: every spelling must be made of byte-level characters.
  const JsonObject vocab = model.object("vocab");
  uint32_t max_id = 0;
  std::vector<std::pair<uint32_t, std::string>> entries;
  for (const auto& [spelling, id_json] : vocab.json().items()) {
    LT_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < (int64_t{1} << 31),
             source,
             ": vocab entry '", spelling, "' has id ", id_json.dump(), ", not an integer in [0, 2^31)");
    const auto id = id_json.get<uint32_t>();
    LT_CHECK(byte_level_to_bytes(spelling).has_value(), source, ": vocab entry '", spelling, "' (id ", id,
             ") is not made of byte-level characters: not a byte-level BPE tokenizer");
    t.vocab_[spelling] = id;
    entries.push_back({id, spelling});
    max_id = std::max(max_id, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto found = t.vocab_.find(byte_level_char(static_cast<uint8_t>(b)));
    LT_CHECK(found != t.vocab_.end(), source, ": the vocabulary lacks the byte-level symbol of byte ", b,
             ": not a byte-level BPE tokenizer");
    t.byte_id_[b] = found->second;
  }

  // Merges: "left right" strings (the older format) or [left, right] pairs.
  LT_CHECK(model.json().contains("merges") && model.json().at("merges").is_array(), source, ": model has no merges list");
  uint32_t rank = 0;
  for (const Json& merge : model.json().at("merges")) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      LT_CHECK(space != std::string::npos && space > 0 && space + 1 < text.size(), source, ": merge ", rank, " '",
               text, "' is not 'left right'");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      LT_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), source,
               ": merge ", rank, " is neither 'left right' nor a pair of strings: ", merge.dump());
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const auto l = t.vocab_.find(left), r = t.vocab_.find(right), m = t.vocab_.find(left + right);
    LT_CHECK(l != t.vocab_.end() && r != t.vocab_.end() && m != t.vocab_.end(), source, ": merge ", rank, " ('", left,
             "', '", right, "') names a token that is not in the vocabulary");
    // A pair listed twice keeps its first (lowest) rank, as Hugging Face's loader does.
    t.merges_.emplace(uint64_t{l->second} << 32 | r->second, uint64_t{rank} << 32 | m->second);
    ++rank;
  }

  // Added tokens: cut out before pre-tokenisation; their ids may also be in the vocabulary.
  if (top.has("added_tokens")) {
    LT_CHECK(json.at("added_tokens").is_array(), source, ": added_tokens is not a list");
    for (const Json& entry : json.at("added_tokens")) {
      const JsonObject a(entry, source, "added_tokens");
      AddedToken token{a.get<std::string>("content"), static_cast<uint32_t>(a.get<int>("id")), a.get<bool>("special", false),
                       a.get<bool>("lstrip", false), a.get<bool>("rstrip", false)};
      LT_CHECK(!token.content.empty(), source, ": an added token with empty content");
      LT_CHECK(!a.get<bool>("single_word", false), source, ": added token '", token.content,
               "': single_word is not supported");
      max_id = std::max(max_id, token.id);
      t.added_.push_back(std::move(token));
    }
  }
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  // Tables are indexed by id, so ids must be (nearly) dense: a stray id of 2^31 would ask for gigabytes.
  const size_t tokens = entries.size() + t.added_.size();
  LT_CHECK(max_id < 2 * tokens + 1024, source, ": token ids are not dense (the largest is ", max_id, " for ", tokens,
           " tokens)");
  t.vocab_size_ = int64_t{max_id} + 1;
  t.id_bytes_.assign(static_cast<size_t>(t.vocab_size_), "");
  t.id_defined_.assign(static_cast<size_t>(t.vocab_size_), false);
  for (const auto& [id, spelling] : entries) {
    t.id_bytes_[id] = *byte_level_to_bytes(spelling);
    t.id_defined_[id] = true;
  }
  for (const AddedToken& token : t.added_) {
    t.id_bytes_[token.id] = token.content;
    t.id_defined_[token.id] = true;
    t.starts_added_[static_cast<uint8_t>(token.content[0])] = true;
  }
  const std::optional<uint32_t> eos = t.special_token_id("<|endoftext|>");
  const std::optional<uint32_t> end_of_text = t.special_token_id("<|end_of_text|>");
  LT_CHECK(eos || end_of_text, source, ": no end-of-text token (<|endoftext|> or <|end_of_text|>) among the added tokens");
  t.eos_id_ = eos ? *eos : *end_of_text;
  return t;
}

std::optional<uint32_t> BpeTokenizer::special_token_id(std::string_view spelling) const {
  for (const AddedToken& token : added_)
    if (token.content == spelling) return token.id;
  return std::nullopt;
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const { return encode_impl(text, false); }

std::vector<uint32_t> BpeTokenizer::encode_with_special_tokens(std::string_view text) const {
  return encode_impl(text, true);
}

// What one encode call keeps between its pieces: the pre-tokenizer's output, and where the ids of each
// distinct piece already encoded are, since words repeat (the cache makes long texts several times faster).
struct BpeTokenizer::EncodeScratch {
  std::vector<std::string_view> pieces;
  std::deque<std::string> owned;
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> encoded;  // piece -> (first id, count)
};

std::vector<uint32_t> BpeTokenizer::encode_impl(std::string_view text, bool with_special) const {
  EncodeScratch scratch;
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t segment_begin = 0, pos = 0;
  while (pos < text.size()) {
    const AddedToken* matched = nullptr;
    if (starts_added_[static_cast<uint8_t>(text[pos])])
      for (const AddedToken& token : added_)  // longest first
        if ((with_special || !token.special) && text.compare(pos, token.content.size(), token.content) == 0) {
          matched = &token;
          break;
        }
    if (!matched) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + matched->content.size();
    if (matched->lstrip)
      while (begin > segment_begin && is_ascii_space(text[begin - 1])) --begin;
    if (matched->rstrip)
      while (end < text.size() && is_ascii_space(text[end])) ++end;
    encode_text(text.substr(segment_begin, begin - segment_begin), ids, scratch);
    ids.push_back(matched->id);
    segment_begin = pos = end;
  }
  encode_text(text.substr(segment_begin), ids, scratch);
  return ids;
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<uint32_t>& ids, EncodeScratch& scratch) const {
  if (text.empty()) return;
  scratch.pieces.clear();
  pre_tokenizer_.split(text, scratch.pieces, scratch.owned);
  for (std::string_view piece : scratch.pieces) {
    const auto [entry, is_new] = scratch.encoded.try_emplace(piece, ids.size(), 0);
    if (is_new) {
      encode_piece(piece, ids);
      entry->second.second = ids.size() - entry->second.first;
    } else {
      const auto [first, count] = entry->second;
      for (size_t k = 0; k < count; ++k) ids.push_back(ids[first + k]);
    }
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& ids) const {
  if (ignore_merges_) {
    std::string spelling;
    for (char c : piece) spelling += byte_level_char(static_cast<uint8_t>(c));
    const auto whole = vocab_.find(spelling);
    if (whole != vocab_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // Symbols as a linked list; candidate merges in a queue ordered by (rank, position). A candidate is
  // stale when its left symbol was merged away or its right neighbour changed since it was queued.
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool alive;
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[static_cast<size_t>(i)] = {byte_id_[static_cast<uint8_t>(piece[static_cast<size_t>(i)])], i - 1,
                                       i + 1 < n ? i + 1 : -1, true};
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    uint32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0 || symbols[static_cast<size_t>(left)].next < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const auto found = merges_.find(uint64_t{l.id} << 32 | symbols[static_cast<size_t>(l.next)].id);
    if (found != merges_.end())
      queue.push({static_cast<uint32_t>(found->second >> 32), left, static_cast<uint32_t>(found->second)});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    const auto found = merges_.find(uint64_t{left.id} << 32 | right.id);
    if (found == merges_.end() || static_cast<uint32_t>(found->second) != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<size_t>(i)].next) ids.push_back(symbols[static_cast<size_t>(i)].id);
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  for (uint32_t id : ids) {
    LT_CHECK(id < id_defined_.size() && id_defined_[id], "tokenizer: token id ", id, " is not in the vocabulary of ",
             vocab_size_);
    text += id_bytes_[id];
  }
  return text;
}

}  // namespace lt
