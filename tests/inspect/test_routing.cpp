// Inspection of the routing (inspect/routing.h, inspect/specialisation.h): the trace agrees with what the
// MoE layers compute in a forward, windows are independent contexts, and the specialisation figures
// (mutual information, co-activation) have the values their definitions give.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "data/tokenizer.h"
#include "inspect/routing.h"
#include "inspect/specialisation.h"
#include "model/config.h"
#include "model/ling.h"

namespace lt {
namespace {

std::vector<uint32_t> some_tokens(size_t n, uint64_t seed) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>((i * 37 + seed * 11 + i * i) % 256);
  return tokens;
}

TEST(RoutingTrace, AgreesWithTheForwardsOwnStatistics) {
  LingForCausalLM model(preset_config("tiny"), 3);
  const std::vector<uint32_t> tokens = some_tokens(96, 1);
  const RoutingTrace trace = trace_routing(model, tokens, 96);
  ASSERT_EQ(trace.layers.size(), model.config().moe_layer_indices().size());

  // The same tokens as one [1, 96] forward: each layer's assignment counts are the trace's load.
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  MoEContext context;
  model.final_hidden_states(Tensor::from_vector<int32_t>({1, 96}, ids), context);
  const double max_entropy = std::log(static_cast<double>(model.config().num_experts));
  for (size_t l = 0; l < trace.layers.size(); ++l) {
    const LayerTrace& t = trace.layers[l];
    EXPECT_EQ(t.layer, model.config().moe_layer_indices()[l]);
    ASSERT_EQ(t.tokens(), 96);
    const LayerTotals totals = layer_totals(t);
    EXPECT_EQ(totals.load, context.stats[l].tokens_per_expert.to(DType::I64).to_vector<int64_t>());
    double mean_entropy = 0;
    for (int64_t n = 0; n < t.tokens(); ++n) {
      // k distinct experts whose renormalised gates sum to 1, best first.
      std::set<int32_t> chosen;
      double sum = 0;
      for (int64_t j = 0; j < t.top_k; ++j) {
        chosen.insert(t.experts[static_cast<size_t>(n * t.top_k + j)]);
        sum += t.weights[static_cast<size_t>(n * t.top_k + j)];
        if (j > 0) {
          EXPECT_LE(t.weights[static_cast<size_t>(n * t.top_k + j)],
                    t.weights[static_cast<size_t>(n * t.top_k + j - 1)]);
        }
      }
      EXPECT_EQ(static_cast<int64_t>(chosen.size()), t.top_k);
      EXPECT_NEAR(sum, 1.0, 1e-5);
      EXPECT_GE(t.entropy[static_cast<size_t>(n)], 0.0);
      EXPECT_LE(t.entropy[static_cast<size_t>(n)], max_entropy + 1e-9);
      mean_entropy += t.entropy[static_cast<size_t>(n)] / 96;
    }
    // The logged mean entropy (moe/stats.h) is the mean of the per-token ones.
    EXPECT_NEAR(mean_entropy, context.stats[l].routing_entropy.item(), 1e-5);
  }
}

TEST(RoutingTrace, EachWindowIsItsOwnContext) {
  LingForCausalLM model(preset_config("tiny"), 5);
  const std::vector<uint32_t> tokens = some_tokens(100, 2);
  const RoutingTrace whole = trace_routing(model, tokens, 40, 2);  // windows 0-39, 40-79, 80-99 (short)
  const std::vector<uint32_t> third(tokens.begin() + 80, tokens.end());
  const RoutingTrace alone = trace_routing(model, third, 40);
  for (size_t l = 0; l < whole.layers.size(); ++l) {
    ASSERT_EQ(whole.layers[l].tokens(), 100);
    for (int64_t n = 0; n < 20; ++n) {
      EXPECT_EQ(whole.layers[l].top1(80 + n), alone.layers[l].top1(n));
      EXPECT_NEAR(whole.layers[l].z[static_cast<size_t>(80 + n)], alone.layers[l].z[static_cast<size_t>(n)], 1e-5);
    }
  }
  EXPECT_EQ(top1_changed_fraction(whole.layers[0], whole.layers[0]), 0.0);
  LingForCausalLM other(preset_config("tiny"), 6);
  const RoutingTrace theirs = trace_routing(other, tokens, 40);
  EXPECT_GT(top1_changed_fraction(whole.layers[0], theirs.layers[0]), 0.3);  // another init routes otherwise
}

TEST(RoutingTrace, RejectsTokensOutsideTheVocabulary) {
  LingForCausalLM model(preset_config("tiny"), 3);
  const std::vector<uint32_t> tokens = {1, 2, static_cast<uint32_t>(model.config().vocab_size)};
  EXPECT_THROW(trace_routing(model, tokens, 8), Error);
}

TEST(Specialisation, MutualInformationOfKnownTables) {
  // Independent rows (every row the same distribution): 0 bits.
  EXPECT_NEAR(mutual_information_bits({10, 30, 20, 60}, 2, 2), 0.0, 1e-12);
  // Each of 4 equally likely rows owns one column: log2 4 = 2 bits.
  EXPECT_NEAR(mutual_information_bits({5, 0, 0, 0, 0, 5, 0, 0, 0, 0, 5, 0, 0, 0, 0, 5}, 4, 4), 2.0, 1e-12);
  // Two rows, half of each one's mass shared: I = H(column) - H(column | row) = 1.5 - 1 = 0.5 bits.
  EXPECT_NEAR(mutual_information_bits({1, 1, 0, 0, 1, 1}, 2, 3), 0.5, 1e-12);
  EXPECT_EQ(mutual_information_bits({0, 0, 0, 0}, 2, 2), 0.0);
}

TEST(Specialisation, FiguresOfTheEmbeddedDomains) {
  LingForCausalLM model(preset_config("tiny"), 7);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer("");
  const std::vector<DomainText> domains = embedded_heldout_domains(*tokenizer, 300);
  ASSERT_EQ(domains.size(), 5u);
  std::set<std::string> names;
  for (const DomainText& d : domains) {
    EXPECT_EQ(d.tokens.size(), 300u);
    EXPECT_EQ(d.tokens.front(), tokenizer->eos_id());  // a document as a shard holds it: eos first
    names.insert(d.name);
  }
  EXPECT_EQ(names, (std::set<std::string>{"prose", "arithmetic", "code", "records", "conlang"}));

  const std::vector<LayerSpecialisation> layers = expert_specialisation(model, domains, 128);
  ASSERT_EQ(layers.size(), 3u);
  const int64_t E = model.config().num_experts, k = model.config().num_experts_per_tok;
  for (const LayerSpecialisation& s : layers) {
    // Every token's k assignments are counted once.
    EXPECT_EQ(std::accumulate(s.domain_expert.begin(), s.domain_expert.end(), int64_t{0}), 5 * 300 * k);
    // min(log2 5 domains, log2(E / k)) = log2 4.
    EXPECT_NEAR(s.max_mutual_information_bits, 2.0, 1e-12);
    EXPECT_GE(s.mutual_information_bits, 0.0);
    EXPECT_LE(s.mutual_information_bits, s.max_mutual_information_bits);
    // Co-activation is symmetric, and its diagonal (the share of tokens choosing each expert) sums to k.
    double diagonal = 0;
    for (int64_t i = 0; i < E; ++i) {
      diagonal += s.coactivation[static_cast<size_t>(i * E + i)];
      for (int64_t j = 0; j < E; ++j)
        EXPECT_DOUBLE_EQ(s.coactivation[static_cast<size_t>(i * E + j)],
                         s.coactivation[static_cast<size_t>(j * E + i)]);
    }
    EXPECT_NEAR(diagonal, static_cast<double>(k), 1e-12);
  }
}

}  // namespace
}  // namespace lt
