#include "inspect/specialisation.h"

#include <algorithm>
#include <cmath>

#include "data/corpus.h"

namespace lt {

std::vector<DomainText> embedded_heldout_domains(const Tokenizer& tokenizer, int64_t tokens_per_domain) {
  LT_CHECK(tokens_per_domain > 0, "tokens per domain must be > 0, got ", tokens_per_domain);
  std::vector<DomainText> domains(kNumCorpusDomains);
  for (int d = 0; d < kNumCorpusDomains; ++d)
    domains[static_cast<size_t>(d)].name = corpus_domain_name(static_cast<CorpusDomain>(d));
  auto full = [&](const DomainText& d) { return static_cast<int64_t>(d.tokens.size()) >= tokens_per_domain; };
  for (uint64_t index = 0; !std::all_of(domains.begin(), domains.end(), full); ++index) {
    if (!is_heldout_document(kDefaultCorpusSeed, index, kDefaultHeldoutFraction)) continue;
    const CorpusDocument document = generate_corpus_document(kDefaultCorpusSeed, index);
    DomainText& domain = domains[static_cast<size_t>(document.domain)];
    if (!full(domain)) append_document_tokens(domain.tokens, document.text, tokenizer);
  }
  for (DomainText& d : domains) d.tokens.resize(static_cast<size_t>(tokens_per_domain));
  return domains;
}

double mutual_information_bits(const std::vector<int64_t>& counts, int64_t rows, int64_t columns) {
  LT_CHECK(static_cast<int64_t>(counts.size()) == rows * columns, "mutual information: ", counts.size(),
           " counts for a ", rows, " x ", columns, " table");
  std::vector<double> row_sum(static_cast<size_t>(rows), 0.0), column_sum(static_cast<size_t>(columns), 0.0);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) {
      const double n = static_cast<double>(counts[static_cast<size_t>(r * columns + c)]);
      row_sum[static_cast<size_t>(r)] += n;
      column_sum[static_cast<size_t>(c)] += n;
      total += n;
    }
  if (total == 0) return 0;
  // sum p(r, c) log2(p(r, c) / (p(r) p(c))) with p(r, c) = n / total: the ratio is n total / (row col).
  double bits = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) {
      const double n = static_cast<double>(counts[static_cast<size_t>(r * columns + c)]);
      if (n > 0)
        bits +=
            n / total * std::log2(n * total / (row_sum[static_cast<size_t>(r)] * column_sum[static_cast<size_t>(c)]));
    }
  return std::max(bits, 0.0);  // rounding can leave -1e-17 for independent tables
}

std::vector<LayerSpecialisation> expert_specialisation(LingForCausalLM& model, const std::vector<DomainText>& domains,
                                                       int64_t window) {
  LT_CHECK(!domains.empty(), "expert specialisation needs at least one domain");
  const LingConfig& config = model.config();
  const int64_t D = static_cast<int64_t>(domains.size()), E = config.num_experts, k = config.num_experts_per_tok;
  std::vector<LayerSpecialisation> layers;
  for (int64_t layer : config.moe_layer_indices()) {
    LayerSpecialisation s;
    s.layer = layer;
    s.num_experts = E;
    s.top_k = k;
    s.domain_expert.assign(static_cast<size_t>(D * E), 0);
    s.coactivation.assign(static_cast<size_t>(E * E), 0.0);
    for (const DomainText& d : domains) {
      s.domains.push_back(d.name);
      s.domain_tokens.push_back(static_cast<int64_t>(d.tokens.size()));
    }
    layers.push_back(std::move(s));
  }
  int64_t total_tokens = 0;
  for (int64_t d = 0; d < D; ++d) {
    const DomainText& domain = domains[static_cast<size_t>(d)];
    LT_CHECK(!domain.tokens.empty(), "domain '", domain.name, "' has no tokens");
    const RoutingTrace trace = trace_routing(model, domain.tokens, window);
    total_tokens += static_cast<int64_t>(domain.tokens.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerTrace& t = trace.layers[l];
      LayerSpecialisation& s = layers[l];
      for (int64_t n = 0; n < t.tokens(); ++n) {
        const int32_t* chosen = &t.experts[static_cast<size_t>(n * k)];
        for (int64_t i = 0; i < k; ++i) {
          ++s.domain_expert[static_cast<size_t>(d * E + chosen[i])];
          for (int64_t j = 0; j < k; ++j) s.coactivation[static_cast<size_t>(chosen[i] * E + chosen[j])] += 1;
        }
      }
    }
  }
  for (LayerSpecialisation& s : layers) {
    for (double& c : s.coactivation) c /= static_cast<double>(total_tokens);
    s.mutual_information_bits = mutual_information_bits(s.domain_expert, D, E);
    double domain_entropy = 0;
    for (int64_t n : s.domain_tokens) {
      const double p = static_cast<double>(n) / static_cast<double>(total_tokens);
      if (p > 0) domain_entropy -= p * std::log2(p);
    }
    s.max_mutual_information_bits =
        std::min(domain_entropy, std::log2(static_cast<double>(E) / static_cast<double>(k)));
  }
  return layers;
}

Json specialisation_json(const LayerSpecialisation& s) {
  const int64_t E = s.num_experts;
  Json matrix = Json::array(), coactivation = Json::array();
  for (size_t d = 0; d < s.domains.size(); ++d)
    matrix.push_back(std::vector<int64_t>(s.domain_expert.begin() + static_cast<int64_t>(d) * E,
                                          s.domain_expert.begin() + static_cast<int64_t>(d + 1) * E));
  for (int64_t i = 0; i < E; ++i)
    coactivation.push_back(std::vector<double>(s.coactivation.begin() + i * E, s.coactivation.begin() + (i + 1) * E));
  return {{"layer", s.layer},
          {"domains", s.domains},
          {"domain_tokens", s.domain_tokens},
          {"domain_expert", matrix},
          {"mutual_information_bits", s.mutual_information_bits},
          {"max_mutual_information_bits", s.max_mutual_information_bits},
          {"coactivation", coactivation}};
}

}  // namespace lt
