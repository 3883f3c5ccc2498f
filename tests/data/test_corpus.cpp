#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <set>
#include <span>
#include <sstream>

#include "data/corpus.h"
#include "data/shard.h"
#include "io/json.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

size_t total_bytes(const std::vector<CorpusDocument>& documents) {
  size_t total = 0;
  for (const CorpusDocument& document : documents) total += document.text.size();
  return total;
}

double fraction_of(const std::string& text, bool (*predicate)(unsigned char)) {
  size_t matching = 0;
  for (unsigned char c : text) matching += predicate(c) ? 1 : 0;
  return text.empty() ? 0.0 : static_cast<double>(matching) / static_cast<double>(text.size());
}

TEST(Corpus, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<CorpusDocument> a = generate_corpus(42, 200'000), b = generate_corpus(42, 200'000);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].domain, b[i].domain);
    EXPECT_EQ(a[i].text, b[i].text);
  }
  const std::vector<CorpusDocument> c = generate_corpus(43, 200'000);
  EXPECT_NE(a[0].text + a[1].text, c[0].text + c[1].text);
}

TEST(Corpus, DocumentsAreFunctionsOfSeedAndIndex) {
  const std::vector<CorpusDocument> corpus = generate_corpus(5, 100'000);
  for (uint64_t index : {uint64_t{0}, uint64_t{7}, uint64_t{corpus.size() - 1}})
    EXPECT_EQ(generate_corpus_document(5, index).text, corpus[index].text);
}

TEST(Corpus, SizeIsReachedWithoutOvershootingMuch) {
  const std::vector<CorpusDocument> corpus = generate_corpus(1, 1'000'000);
  const size_t total = total_bytes(corpus);
  EXPECT_GE(total, 1'000'000u);
  EXPECT_LT(total - corpus.back().text.size(), 1'000'000u);
}

TEST(Corpus, AllDomainsArePresentAndLookDifferent) {
  const std::vector<CorpusDocument> corpus = generate_corpus(11, 2'000'000);
  std::array<std::string, kNumCorpusDomains> text_of;
  std::array<size_t, kNumCorpusDomains> documents{};
  for (const CorpusDocument& document : corpus) {
    text_of[static_cast<int>(document.domain)] += document.text + "\n";
    ++documents[static_cast<int>(document.domain)];
  }
  for (int d = 0; d < kNumCorpusDomains; ++d) {
    SCOPED_TRACE(corpus_domain_name(static_cast<CorpusDomain>(d)));
    EXPECT_GT(documents[d], corpus.size() / 10) << "each domain holds a fair share of the documents";
    EXPECT_GT(text_of[d].size(), total_bytes(corpus) / 10) << "and of the bytes";
  }
  const std::string& prose = text_of[0];
  const std::string& arithmetic = text_of[1];
  const std::string& code = text_of[2];
  const std::string& records = text_of[3];
  const std::string& conlang = text_of[4];
  const auto is_digit = [](unsigned char c) { return c >= '0' && c <= '9'; };
  const auto is_non_ascii = [](unsigned char c) { return c >= 0x80; };
  const auto is_brace = [](unsigned char c) { return c == '{' || c == '}' || c == ';'; };
  EXPECT_GT(fraction_of(arithmetic, is_digit), 0.4);
  EXPECT_EQ(fraction_of(prose, is_digit), 0.0);
  EXPECT_EQ(fraction_of(prose, is_non_ascii), 0.0);
  EXPECT_GT(fraction_of(conlang, is_non_ascii), 0.03) << "ä and ö are two UTF-8 bytes";
  EXPECT_GT(fraction_of(code, is_brace), 0.02);
  EXPECT_EQ(fraction_of(prose, is_brace), 0.0);
  EXPECT_NE(code.find("return "), std::string::npos);
  EXPECT_NE(records.find("\"id\": "), std::string::npos);
  EXPECT_NE(records.find("sensor,time,temp_c,humidity,ok"), std::string::npos);
  EXPECT_NE(arithmetic.find(" = "), std::string::npos);
  EXPECT_NE(conlang.find("ssä"), std::string::npos) << "front-vowel harmony";
  EXPECT_NE(conlang.find("ssa"), std::string::npos) << "back-vowel harmony";
}

TEST(Corpus, ArithmeticIsCorrect) {
  int checked = 0;
  for (uint64_t index = 0; index < 300; ++index) {
    const CorpusDocument document = generate_corpus_document(3, index);
    if (document.domain != CorpusDomain::Arithmetic) continue;
    std::istringstream lines(document.text);
    for (std::string line; std::getline(lines, line);) {
      long long a, b, c;
      char op;
      if (std::sscanf(line.c_str(), "%lld %c %lld = %lld", &a, &op, &b, &c) != 4 || line.find("rem") != std::string::npos)
        continue;
      const long long expected = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : c;
      EXPECT_EQ(c, expected) << line;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Corpus, DocumentsRarelyRepeat) {
  const std::vector<CorpusDocument> corpus = generate_corpus(9, 2'000'000);
  std::set<std::string> distinct;
  for (const CorpusDocument& document : corpus) distinct.insert(document.text);
  EXPECT_GT(distinct.size(), corpus.size() * 99 / 100);
}

TEST(Corpus, SplitIsDeterministicAndTilesTheStream) {
  const ByteTokenizer tokenizer;
  const std::vector<CorpusDocument> corpus = generate_corpus(4, 1'000'000);
  const CorpusSplit split = split_corpus(corpus, tokenizer, 4);
  const CorpusSplit again = split_corpus(corpus, tokenizer, 4);
  EXPECT_EQ(split.train.tokens, again.train.tokens);
  EXPECT_EQ(split.heldout.tokens, again.heldout.tokens);

  const double heldout_share =
      static_cast<double>(split.heldout.documents.size()) / static_cast<double>(corpus.size());
  EXPECT_NEAR(heldout_share, 0.05, 0.02);
  EXPECT_EQ(split.train.documents.size() + split.heldout.documents.size(), corpus.size());

  for (const TokenizedDocuments* part : {&split.train, &split.heldout}) {
    int64_t expected_begin = 0;
    for (const DocumentSpan& span : part->documents) {
      EXPECT_EQ(span.begin, expected_begin);
      EXPECT_EQ(part->tokens[span.begin], tokenizer.eos_id()) << "every document starts with eos";
      expected_begin = span.end;
    }
    EXPECT_EQ(expected_begin, static_cast<int64_t>(part->tokens.size()));
  }
  // Document 0 lands in one split with its domain and its text.
  const bool first_heldout = is_heldout_document(4, 0, kDefaultHeldoutFraction);
  const TokenizedDocuments& part = first_heldout ? split.heldout : split.train;
  EXPECT_EQ(part.documents[0].domain, corpus[0].domain);
  EXPECT_EQ(tokenizer.decode(std::span(part.tokens).subspan(1, part.documents[0].end - 1)), corpus[0].text);
}

TEST(Corpus, WritesShardsAndManifest) {
  test::TempDir dir;
  const ByteTokenizer tokenizer;
  const std::string out = dir.path("corpus");
  const CorpusShards shards = write_corpus_shards(out, 8, 300'000, tokenizer);
  const CorpusSplit split = split_corpus(generate_corpus(8, 300'000), tokenizer, 8);
  EXPECT_EQ(read_token_shard(shards.train_path, tokenizer.vocab_size()), split.train.tokens);
  EXPECT_EQ(read_token_shard(shards.heldout_path, tokenizer.vocab_size()), split.heldout.tokens);
  EXPECT_EQ(shards.train_tokens, static_cast<int64_t>(split.train.tokens.size()));
  EXPECT_GT(shards.train_unigram_entropy, 2.0);
  EXPECT_LT(shards.train_unigram_entropy, std::log(259.0));

  const Json manifest = read_json_file(shards.manifest_path);
  EXPECT_EQ(manifest["seed"], 8);
  EXPECT_EQ(manifest["vocab_size"], 259);
  EXPECT_EQ(manifest["domains"].size(), static_cast<size_t>(kNumCorpusDomains));
  EXPECT_EQ(manifest["train"]["tokens"], split.train.tokens.size());
  EXPECT_EQ(manifest["heldout"]["spans"].size(), split.heldout.documents.size());
  EXPECT_EQ(manifest["heldout"]["spans"][0][1], split.heldout.documents[0].end);
  EXPECT_DOUBLE_EQ(manifest["train"]["unigram_entropy_nats"].get<double>(), shards.train_unigram_entropy);
}

TEST(Corpus, UnigramEntropy) {
  EXPECT_DOUBLE_EQ(unigram_entropy_nats(std::vector<uint32_t>{0, 1, 2, 3, 3, 2, 1, 0}, 4), std::log(4.0));
  EXPECT_DOUBLE_EQ(unigram_entropy_nats(std::vector<uint32_t>{7, 7, 7}, 10), 0.0);
  EXPECT_DOUBLE_EQ(unigram_entropy_nats(std::vector<uint32_t>{}, 10), 0.0);
  test::expect_error([] { unigram_entropy_nats(std::vector<uint32_t>{1, 10}, 10); },
                     {"token 10 at position 1 is >= vocab_size 10"});
}

}  // namespace
}  // namespace lt
