// Expert specialisation (`lingtrain inspect --by-domain`, the report's last routing section): does a
// MoE layer send the tokens of different kinds of text to different experts? Per layer, the domain x
// expert routing matrix, the mutual information between a token's domain and its chosen experts, and
// how often two experts are chosen for the same token (co-activation).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "inspect/routing.h"
#include "io/json.h"

namespace lt {

struct DomainText {
  std::string name;
  std::vector<uint32_t> tokens;
};

// The held-out documents of each domain of the embedded corpus (those is_heldout_document puts into the
// default corpus's val.bin, regenerated from its seed), tokenised as a shard holds them, until every
// domain has at least tokens_per_domain tokens; each domain is then cut to exactly that many.
std::vector<DomainText> embedded_heldout_domains(const Tokenizer& tokenizer, int64_t tokens_per_domain);

struct LayerSpecialisation {
  int64_t layer = 0, num_experts = 0, top_k = 0;
  std::vector<std::string> domains;
  std::vector<int64_t> domain_tokens;  // [D]
  // [D, E]: how many of domain d's (token, expert) assignments went to expert e (k per token).
  std::vector<int64_t> domain_expert;
  // I(domain; expert) over the assignments, in bits, and its largest possible value given the domains'
  // shares: min(H(domain), log2(E / k)), since a token's k experts are distinct, so a domain can at best
  // own k experts to itself.
  double mutual_information_bits = 0, max_mutual_information_bits = 0;
  // [E, E]: the fraction of tokens that chose both i and j (the diagonal: chose i; sums to k).
  std::vector<double> coactivation;
};

// Per MoE layer, the routing of every domain's text (trace_routing in windows of `window` tokens).
std::vector<LayerSpecialisation> expert_specialisation(LingForCausalLM& model, const std::vector<DomainText>& domains,
                                                       int64_t window);

// I(row; column) in bits of a [rows, columns] table of counts (0 for an empty table).
double mutual_information_bits(const std::vector<int64_t>& counts, int64_t rows, int64_t columns);

Json specialisation_json(const LayerSpecialisation& s);

}  // namespace lt
