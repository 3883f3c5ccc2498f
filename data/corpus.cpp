#include "data/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "data/corpus_domains.h"
#include "data/shard.h"
#include "io/json.h"
#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

// Document generators use streams 0, 1, 2, ... of the seed; the held-out coin uses streams derived
// from this one, so the split and the text never share random words.
constexpr uint64_t kHeldoutStream = 0x48454C444F5554ull;

// Bumped whenever the generated text changes, so a manifest says which corpus its shards hold.
constexpr const char* kGeneratorVersion = "lingtrain-corpus-v1";

constexpr std::array<const char*, kNumCorpusDomains> kDomainNames = {"prose", "arithmetic", "code", "records",
                                                                      "conlang"};

Json describe_split(const TokenizedDocuments& split, const std::string& file, int64_t vocab_size) {
  std::array<int64_t, kNumCorpusDomains> documents{}, tokens{};
  Json spans = Json::array();
  for (const DocumentSpan& span : split.documents) {
    const int domain = static_cast<int>(span.domain);
    ++documents[domain];
    tokens[domain] += span.end - span.begin;
    spans.push_back({span.begin, span.end, domain});
  }
  Json domain_documents, domain_tokens;
  for (int d = 0; d < kNumCorpusDomains; ++d) {
    domain_documents[kDomainNames[d]] = documents[d];
    domain_tokens[kDomainNames[d]] = tokens[d];
  }
  return {{"file", file},
          {"tokens", split.tokens.size()},
          {"documents", split.documents.size()},
          {"unigram_entropy_nats", unigram_entropy_nats(split.tokens, vocab_size)},
          {"domain_documents", domain_documents},
          {"domain_tokens", domain_tokens},
          {"spans", spans}};
}

}  // namespace

const char* corpus_domain_name(CorpusDomain domain) { return kDomainNames.at(static_cast<size_t>(domain)); }

CorpusDocument generate_corpus_document(uint64_t seed, uint64_t index) {
  Rng rng(derive_seed(seed, index));
  CorpusDocument document;
  document.domain = static_cast<CorpusDomain>(rng.below(kNumCorpusDomains));
  switch (document.domain) {
    case CorpusDomain::Prose: document.text = corpus_domains::prose_document(rng); break;
    case CorpusDomain::Arithmetic: document.text = corpus_domains::arithmetic_document(rng); break;
    case CorpusDomain::Code: document.text = corpus_domains::code_document(rng); break;
    case CorpusDomain::Records: document.text = corpus_domains::records_document(rng); break;
    case CorpusDomain::Conlang: document.text = corpus_domains::conlang_document(rng); break;
  }
  return document;
}

std::vector<CorpusDocument> generate_corpus(uint64_t seed, size_t n_bytes) {
  std::vector<CorpusDocument> documents;
  size_t total_bytes = 0;
  for (uint64_t index = 0; total_bytes < n_bytes; ++index) {
    documents.push_back(generate_corpus_document(seed, index));
    total_bytes += documents.back().text.size();
  }
  return documents;
}

bool is_heldout_document(uint64_t seed, uint64_t index, double heldout_fraction) {
  Rng coin(derive_seed(derive_seed(seed, kHeldoutStream), index));
  return coin.uniform() < heldout_fraction;
}

CorpusSplit split_corpus(const std::vector<CorpusDocument>& documents, const Tokenizer& tokenizer, uint64_t seed,
                         double heldout_fraction) {
  LT_CHECK(heldout_fraction >= 0.0 && heldout_fraction < 1.0, "corpus: held-out fraction ", heldout_fraction,
           " must be in [0, 1)");
  CorpusSplit split;
  for (size_t index = 0; index < documents.size(); ++index) {
    TokenizedDocuments& part = is_heldout_document(seed, index, heldout_fraction) ? split.heldout : split.train;
    const auto begin = static_cast<int64_t>(part.tokens.size());
    append_document_tokens(part.tokens, documents[index].text, tokenizer);
    part.documents.push_back({begin, static_cast<int64_t>(part.tokens.size()), documents[index].domain});
  }
  return split;
}

CorpusShards write_corpus_shards(const std::string& out_dir, uint64_t seed, size_t n_bytes, const Tokenizer& tokenizer,
                                 double heldout_fraction) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) fail(out_dir, ": cannot create the corpus directory: ", error.message());

  const CorpusSplit split = split_corpus(generate_corpus(seed, n_bytes), tokenizer, seed, heldout_fraction);
  CorpusShards shards;
  shards.train_path = (std::filesystem::path(out_dir) / "train.bin").string();
  shards.heldout_path = (std::filesystem::path(out_dir) / "val.bin").string();
  shards.manifest_path = (std::filesystem::path(out_dir) / "corpus.json").string();
  write_token_shard(shards.train_path, split.train.tokens, tokenizer.vocab_size());
  write_token_shard(shards.heldout_path, split.heldout.tokens, tokenizer.vocab_size());

  Json domains = Json::array();
  for (const char* name : kDomainNames) domains.push_back(name);
  const Json manifest = {{"generator", kGeneratorVersion},
                         {"seed", seed},
                         {"bytes", n_bytes},
                         {"heldout_fraction", heldout_fraction},
                         {"vocab_size", tokenizer.vocab_size()},
                         {"domains", domains},
                         {"train", describe_split(split.train, "train.bin", tokenizer.vocab_size())},
                         {"heldout", describe_split(split.heldout, "val.bin", tokenizer.vocab_size())}};
  // Compact: the span lists hold three numbers per document, which indentation would spread over
  // tens of thousands of lines.
  write_json_file(shards.manifest_path, manifest, -1);

  shards.train_tokens = static_cast<int64_t>(split.train.tokens.size());
  shards.heldout_tokens = static_cast<int64_t>(split.heldout.tokens.size());
  shards.train_unigram_entropy = manifest["train"]["unigram_entropy_nats"].get<double>();
  return shards;
}

namespace {

// -sum p log p of the counts, summed in id order with a fixed formula, so the figure is reproducible to
// the last digit.
double entropy_of_counts(const std::vector<uint64_t>& counts, uint64_t total) {
  double entropy = 0.0;
  for (uint64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(total);
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace

double unigram_entropy_nats(std::span<const uint32_t> tokens, int64_t vocab_size) {
  LT_CHECK(vocab_size >= 1, "unigram entropy: vocab_size ", vocab_size, " must be positive");
  std::vector<uint64_t> counts(vocab_size, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint64_t>(vocab_size))
      fail("unigram entropy: token ", tokens[i], " at position ", i, " is >= vocab_size ", vocab_size);
    ++counts[tokens[i]];
  }
  return entropy_of_counts(counts, tokens.size());
}

double unigram_entropy_nats(const TokenShards& tokens, int64_t vocab_size) {
  LT_CHECK(vocab_size >= 1, "unigram entropy: vocab_size ", vocab_size, " must be positive");
  std::vector<uint64_t> counts(vocab_size, 0);
  constexpr int64_t kChunk = 1 << 20;
  std::vector<int32_t> chunk;
  for (int64_t first = 0; first < tokens.num_tokens(); first += kChunk) {
    chunk.resize(static_cast<size_t>(std::min(kChunk, tokens.num_tokens() - first)));
    tokens.read(first, static_cast<int64_t>(chunk.size()), chunk.data());  // checks each token below the vocabulary
    for (int32_t token : chunk) {
      LT_CHECK(token < vocab_size, tokens.spec(), ": token ", token, " is >= vocab_size ", vocab_size);
      ++counts[static_cast<size_t>(token)];
    }
  }
  return entropy_of_counts(counts, static_cast<uint64_t>(tokens.num_tokens()));
}

}  // namespace lt
