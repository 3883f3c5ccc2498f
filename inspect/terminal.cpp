#include "inspect/terminal.h"

#include <algorithm>
#include <cmath>

#include "io/format_text.h"

namespace lt {

namespace {

// Sixteen well-separated colours of the 256-colour palette, one per expert (modulo 16).
std::string expert_colour(int32_t expert) {
  static const int palette[16] = {33, 208, 34, 170, 220, 45, 196, 99, 46, 201, 130, 27, 160, 118, 93, 214};
  return "\x1b[38;5;" + std::to_string(palette[expert % 16]) + "m";
}
const char* kReset = "\x1b[0m";
const char* kBold = "\x1b[1m";
const char* kDim = "\x1b[2m";

// The number of terminal columns a UTF-8 string takes (one per code point; enough for the tables).
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
std::string pad(const std::string& s, size_t width, bool right = false) {
  const size_t w = display_width(s);
  if (w >= width) return s;
  return right ? std::string(width - w, ' ') + s : s + std::string(width - w, ' ');
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > s.size()) return false;
    for (size_t j = 1; j < length; ++j)
      if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
    i += length;
  }
  return true;
}

std::string layer_title(int64_t layer) { return "layer " + std::to_string(layer); }

}  // namespace

std::string readable_token(const Tokenizer& tokenizer, uint32_t id) {
  const uint32_t ids[1] = {id};
  const std::string text = tokenizer.decode(ids);
  if (!valid_utf8(text)) {
    std::string out;
    for (unsigned char c : text) out += "<0x" + std::string(format_text("%02X", c)) + ">";
    return out;
  }
  std::string out;
  for (char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == ' ')
      out += "\u2423";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
      out += "<0x" + std::string(format_text("%02X", static_cast<unsigned char>(c))) + ">";
    else
      out += c;
  }
  return out;
}

std::string routing_table(const RoutingTrace& trace, const Tokenizer& tokenizer, bool colour, int width) {
  if (trace.layers.empty()) return "this model has no MoE layer\n";
  const int64_t N = static_cast<int64_t>(trace.tokens.size());
  const int64_t k = trace.layers.front().top_k, E = trace.layers.front().num_experts;
  const size_t id_width = std::to_string(E - 1).size();
  std::vector<std::string> texts;
  size_t text_width = 5;
  for (uint32_t t : trace.tokens) {
    texts.push_back(readable_token(tokenizer, t));
    text_width = std::min<size_t>(std::max(text_width, display_width(texts.back())), 16);
  }
  const size_t position_width = std::max<size_t>(3, std::to_string(N - 1).size());
  const size_t prefix = position_width + 2 + text_width;
  // A layer's group: k "expert:gate" pairs, then entropy and z.
  const size_t pair_width = id_width + 5, group_width = 3 + static_cast<size_t>(k) * (pair_width + 1) + 12;
  const size_t per_table =
      width <= 0 ? trace.layers.size() : std::max<size_t>(1, (static_cast<size_t>(width) - prefix) / group_width);
  const double max_entropy = std::log(static_cast<double>(E));
  std::string out = "experts chosen per token (expert:gate weight, best first), router entropy H in nats (max ln " +
                    std::to_string(E) + " = " + format_text("%.2f", max_entropy) +
                    ") and z = logsumexp(router logits)\n";
  for (size_t first = 0; first < trace.layers.size(); first += per_table) {
    const size_t last = std::min(trace.layers.size(), first + per_table);
    std::string header = pad("pos", position_width, true) + "  " + pad("token", text_width);
    std::string sub = std::string(prefix, ' ');
    for (size_t l = first; l < last; ++l) {
      header += " \u2502 " + pad(layer_title(trace.layers[l].layer), group_width - 3);
      sub += " \u2502 " + pad("experts", static_cast<size_t>(k) * (pair_width + 1)) + pad("H", 5, true) +
             pad("z", 7, true);
    }
    out += (colour ? kBold : "") + header + (colour ? kReset : "") + "\n" + (colour ? kDim : "") + sub +
           (colour ? kReset : "") + "\n";
    for (int64_t n = 0; n < N; ++n) {
      std::string row =
          pad(std::to_string(n), position_width, true) + "  " +
          pad(display_width(texts[static_cast<size_t>(n)]) > 16 ? texts[static_cast<size_t>(n)].substr(0, 15) + "\u2026"
                                                                : texts[static_cast<size_t>(n)],
              text_width);
      for (size_t l = first; l < last; ++l) {
        const LayerTrace& t = trace.layers[l];
        row += " \u2502 ";
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = t.experts[static_cast<size_t>(n * k + j)];
          const std::string pair = pad(std::to_string(e), id_width, true) + ":" +
                                   format_text("%.2f", t.weights[static_cast<size_t>(n * k + j)]);
          row += colour ? expert_colour(e) + (j == 0 ? kBold : "") + pair + kReset + " " : pair + " ";
        }
        row += pad(format_text("%.2f", t.entropy[static_cast<size_t>(n)]), 5, true) +
               pad(format_text("%.2f", t.z[static_cast<size_t>(n)]), 7, true);
      }
      out += row + "\n";
    }
    if (last < trace.layers.size()) out += "\n";
  }
  return out;
}

std::string totals_table(const std::vector<LayerTotals>& totals, const std::vector<double>& top1_changed, bool colour) {
  if (totals.empty()) return "";
  const size_t E = totals.front().load.size();
  std::string out = std::string(colour ? kBold : "") + "per MoE layer" + (colour ? kReset : "") +
                    ": load = share of the token assignments per expert (ideal " +
                    format_text("%.1f%%", 100.0 / static_cast<double>(E)) + " each)\n";
  std::string header = pad("layer", 6) + pad("max/mean", 10, true) + pad("CV", 7, true) + pad("dead", 6, true) +
                       pad("mean H", 8, true) + pad("mean z", 8, true);
  if (!top1_changed.empty()) header += pad("top-1 changed", 15, true);
  header += "  load per expert";
  out += std::string(colour ? kBold : "") + header + (colour ? kReset : "") + "\n";
  for (size_t i = 0; i < totals.size(); ++i) {
    const LayerTotals& t = totals[i];
    double total = 0;
    for (int64_t c : t.load) total += static_cast<double>(c);
    std::string row = pad(std::to_string(t.layer), 6) + pad(format_text("%.3f", t.summary.max_over_mean), 10, true) +
                      pad(format_text("%.3f", t.summary.load_cv), 7, true) +
                      pad(std::to_string(t.summary.dead_experts), 6, true) +
                      pad(format_text("%.3f", t.mean_entropy), 8, true) + pad(format_text("%.3f", t.mean_z), 8, true);
    if (!top1_changed.empty()) row += pad(format_text("%.1f%%", 100 * top1_changed[i]), 15, true);
    row += "  ";
    if (E <= 16) {
      for (size_t e = 0; e < E; ++e) {
        const std::string share = format_text("%.1f%%", total > 0 ? 100 * static_cast<double>(t.load[e]) / total : 0.0);
        row += (colour ? expert_colour(static_cast<int32_t>(e)) : "") + std::to_string(e) + ":" + share +
               (colour ? kReset : "") + " ";
      }
    } else {  // too many experts for one line: the extremes (--json has every count)
      const auto [lo, hi] = std::minmax_element(t.load.begin(), t.load.end());
      row += "min " + format_text("%.2f%%", total > 0 ? 100 * static_cast<double>(*lo) / total : 0.0) + " (expert " +
             std::to_string(lo - t.load.begin()) + "), max " +
             format_text("%.2f%%", total > 0 ? 100 * static_cast<double>(*hi) / total : 0.0) + " (expert " +
             std::to_string(hi - t.load.begin()) + ")";
    }
    out += row + "\n";
  }
  return out;
}

std::string specialisation_table(const LayerSpecialisation& s, bool colour) {
  const int64_t D = static_cast<int64_t>(s.domains.size()), E = s.num_experts;
  std::string out = std::string(colour ? kBold : "") + layer_title(s.layer) + (colour ? kReset : "") +
                    ": I(domain; expert) = " + format_text("%.3f bits", s.mutual_information_bits) + " of at most " +
                    format_text("%.3f", s.max_mutual_information_bits) + " (" +
                    format_text("%.0f%%", s.max_mutual_information_bits > 0
                                              ? 100 * s.mutual_information_bits / s.max_mutual_information_bits
                                              : 0.0) +
                    ")\n";
  size_t name_width = 8;
  for (const std::string& d : s.domains) name_width = std::max(name_width, display_width(d) + 2);
  out += "  " + pad("% of the domain's assignments per expert", name_width) + "\n  " + pad("domain", name_width);
  for (int64_t e = 0; e < E; ++e) out += pad(std::to_string(e), 6, true);
  out += "\n";
  const double uniform = 1.0 / static_cast<double>(E);
  for (int64_t d = 0; d < D; ++d) {
    double row_total = 0;
    for (int64_t e = 0; e < E; ++e) row_total += static_cast<double>(s.domain_expert[static_cast<size_t>(d * E + e)]);
    out += "  " + pad(s.domains[static_cast<size_t>(d)], name_width);
    for (int64_t e = 0; e < E; ++e) {
      const double share =
          row_total > 0 ? static_cast<double>(s.domain_expert[static_cast<size_t>(d * E + e)]) / row_total : 0;
      // Twice the uniform share stands out: the experts a domain prefers.
      const bool strong = share >= 2 * uniform;
      out += (colour && strong ? std::string(kBold) + expert_colour(static_cast<int32_t>(e)) : "") +
             pad(format_text("%.1f", 100 * share), 6, true) + (colour && strong ? kReset : "");
    }
    out += "\n";
  }
  if (s.top_k < 2) return out;  // one expert per token: no two are ever chosen together
  out += "  co-activation: % of tokens choosing both experts\n  " + pad("", name_width);
  for (int64_t e = 0; e < E; ++e) out += pad(std::to_string(e), 6, true);
  out += "\n";
  for (int64_t i = 0; i < E; ++i) {
    out += "  " + pad(std::to_string(i), name_width);
    for (int64_t j = 0; j < E; ++j)
      out += i == j ? pad("-", 6, true)
                    : pad(format_text("%.1f", 100 * s.coactivation[static_cast<size_t>(i * E + j)]), 6, true);
    out += "\n";
  }
  return out;
}

std::vector<Json> routing_json_lines(const RoutingTrace& trace, const Tokenizer& tokenizer,
                                     const std::vector<double>& top1_changed) {
  std::vector<Json> lines;
  for (size_t n = 0; n < trace.tokens.size(); ++n) {
    const uint32_t ids[1] = {trace.tokens[n]};
    Json layers = Json::array();
    for (const LayerTrace& t : trace.layers) {
      const size_t k = static_cast<size_t>(t.top_k);
      layers.push_back({{"layer", t.layer},
                        {"experts", std::vector<int32_t>(t.experts.begin() + static_cast<int64_t>(n * k),
                                                         t.experts.begin() + static_cast<int64_t>((n + 1) * k))},
                        {"weights", std::vector<float>(t.weights.begin() + static_cast<int64_t>(n * k),
                                                       t.weights.begin() + static_cast<int64_t>((n + 1) * k))},
                        {"entropy", t.entropy[n]},
                        {"z", t.z[n]}});
    }
    // The token's text as the tokenizer spells it; a partial UTF-8 byte cannot be JSON text, so it is escaped.
    const std::string decoded = tokenizer.decode(ids);
    lines.push_back({{"type", "token"},
                     {"position", n},
                     {"id", trace.tokens[n]},
                     {"text", valid_utf8(decoded) ? decoded : readable_token(tokenizer, trace.tokens[n])},
                     {"layers", layers}});
  }
  for (size_t l = 0; l < trace.layers.size(); ++l) {
    const LayerTotals t = layer_totals(trace.layers[l]);
    Json line = {{"type", "layer"},
                 {"layer", t.layer},
                 {"tokens", trace.tokens.size()},
                 {"load", t.load},
                 {"max_over_mean", t.summary.max_over_mean},
                 {"load_cv", t.summary.load_cv},
                 {"dead_experts", t.summary.dead_experts},
                 {"mean_entropy", t.mean_entropy},
                 {"mean_z", t.mean_z}};
    if (!top1_changed.empty()) line["top1_changed"] = top1_changed[l];
    lines.push_back(line);
  }
  return lines;
}

}  // namespace lt
