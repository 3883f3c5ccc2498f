// The terminal and JSON-lines views of `lingtrain inspect`: a table of each token's routing in every
// MoE layer, the per-layer totals, and the domain x expert tables of --by-domain. With colour (on a
// terminal) each expert keeps one colour everywhere, so a run of tokens going to the same expert is
// visible at a glance.
#pragma once
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "inspect/routing.h"
#include "inspect/specialisation.h"
#include "io/json.h"

namespace lt {

// A token as readable text: whitespace and control characters escaped (\n, \t, ␣ for a space), and a
// byte that is not valid UTF-8 on its own (part of a multi-byte letter) as <0xC3>.
std::string readable_token(const Tokenizer& tokenizer, uint32_t id);

// One row per token; the MoE layers side by side, as many per table as fit in `width` columns (0: all).
std::string routing_table(const RoutingTrace& trace, const Tokenizer& tokenizer, bool colour, int width);
// Per layer: load per expert, max/mean, coefficient of variation, mean entropy and z, and with
// `top1_changed` (one per layer) the fraction of tokens whose top-1 expert differs in the other checkpoint.
std::string totals_table(const std::vector<LayerTotals>& totals, const std::vector<double>& top1_changed, bool colour);
std::string specialisation_table(const LayerSpecialisation& s, bool colour);

// JSON lines: one {"type": "token", ...} per token, then one {"type": "layer", ...} per MoE layer.
std::vector<Json> routing_json_lines(const RoutingTrace& trace, const Tokenizer& tokenizer,
                                     const std::vector<double>& top1_changed);

}  // namespace lt
