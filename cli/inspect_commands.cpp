// inspect and report: the routing of a checkpoint, token by token or domain by domain, and a run's
// training report as one HTML page.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "inspect/report.h"
#include "inspect/routing.h"
#include "inspect/specialisation.h"
#include "inspect/terminal.h"
#include "io/atomic_file.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "io/console.h"
#include "model/ling.h"
#include "tensor/error.h"
#include "trainer/checkpoint.h"

namespace lt::cli {
namespace {

// --domain NAME=FILE: a text file (tokenised by the checkpoint's tokenizer) or an llm.c token shard (.bin).
std::vector<DomainText> domains_from_flags(const std::vector<std::string>& specs, const Tokenizer& tokenizer,
                                           int64_t vocab_size, int64_t tokens_per_domain) {
  std::vector<DomainText> domains;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("flag --domain needs NAME=FILE, got '", spec, "'");
    DomainText d;
    d.name = spec.substr(0, eq);
    const std::string path = spec.substr(eq + 1);
    for (const DomainText& other : domains)
      if (other.name == d.name) fail("flag --domain: domain '", d.name, "' is given twice");
    if (path.size() > 4 && path.substr(path.size() - 4) == ".bin") {
      d.tokens = read_token_shard(path, vocab_size);
    } else {
      d.tokens = tokenizer.encode(read_file(path));
    }
    if (d.tokens.empty()) fail(path, ": no tokens for domain '", d.name, "'");
    if (static_cast<int64_t>(d.tokens.size()) > tokens_per_domain) d.tokens.resize(static_cast<size_t>(tokens_per_domain));
    domains.push_back(std::move(d));
  }
  return domains;
}

}  // namespace

int cmd_inspect(const Args& args) {
  const Flags flags(
      "lingtrain inspect --ckpt DIR (--text TEXT | --data SHARD.bin) [flags]: per token and MoE layer the chosen\n"
      "experts, gate weights, router entropy and z; per layer load, imbalance, top-1 changes vs --vs\n"
      "lingtrain inspect --ckpt DIR --by-domain [flags]: domain x expert routing, mutual information, co-activation",
      {{"ckpt", "", "the checkpoint (required)"},
       {"text", "", "the text to route"},
       {"data", "", "... or an llm.c token shard"},
       {"tokens", "64", "with --data: tokens to route"},
       {"offset", "0", "with --data: the first token"},
       {"vs", "", "a second checkpoint of the same MoE shape: which tokens' top-1 expert changed"},
       {"json", "0", "JSON lines instead of tables", FlagSpec::Switch},
       {"by-domain", "0", "routing by domain (default: the embedded corpus's held-out text)", FlagSpec::Switch},
       {"domain", "", "NAME=FILE: a domain's text file or token shard (implies --by-domain)", FlagSpec::Repeatable},
       {"domain-tokens", "8192", "tokens per domain at most"},
       {"seq", "0", "the window (0: the checkpoint's training seq)"},
       threads_flag()},
      args);
  apply_threads(flags);
  const std::string ckpt = flags.str("ckpt");
  if (ckpt.empty()) fail("inspect needs --ckpt DIR");
  const bool by_domain = flags.integer("by-domain") != 0 || !flags.list("domain").empty();
  const bool json = flags.integer("json") != 0;
  if (!by_domain && flags.str("text").empty() == flags.str("data").empty())
    fail("inspect needs one of --text TEXT, --data SHARD.bin or --by-domain");
  if (by_domain && (!flags.str("text").empty() || !flags.str("data").empty() || !flags.str("vs").empty()))
    fail("inspect --by-domain takes no --text, --data or --vs");
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer("", ckpt, model.config().vocab_size);
  const int64_t window = flags.integer("seq") > 0 ? flags.positive("seq") : trained_window(ckpt, model.config());
  LT_CHECK(window <= model.config().max_position_embeddings, "flag --seq ", window, " exceeds max_position_embeddings ",
           model.config().max_position_embeddings, " of ", ckpt);
  LT_CHECK(!model.config().moe_layer_indices().empty(), ckpt, ": the model has no MoE layer, there is no routing to inspect");
  const bool colour = !json && is_terminal(stdout);

  if (by_domain) {
    const int64_t per_domain = flags.positive("domain-tokens");
    const std::vector<DomainText> domains =
        flags.list("domain").empty()
            ? embedded_heldout_domains(*tokenizer, per_domain)
            : domains_from_flags(flags.list("domain"), *tokenizer, model.config().vocab_size, per_domain);
    const std::vector<LayerSpecialisation> layers = expert_specialisation(model, domains, window);
    if (!json)
      std::printf("routing of %s (%s), %lld tokens at most each, by MoE layer\n\n",
                  count_of(static_cast<long long>(domains.size()), "domain").c_str(),
                  flags.list("domain").empty() ? "held-out text of the embedded corpus" : "--domain files",
                  static_cast<long long>(per_domain));
    for (const LayerSpecialisation& s : layers) {
      if (json) std::printf("%s\n", specialisation_json(s).dump().c_str());
      else std::printf("%s\n", specialisation_table(s, colour).c_str());
    }
    return 0;
  }

  std::vector<uint32_t> tokens;
  if (!flags.str("text").empty()) {
    tokens = tokenizer->encode(flags.str("text"));
  } else {
    const std::vector<uint32_t> shard = read_token_shard(flags.str("data"), model.config().vocab_size);
    const int64_t offset = flags.integer("offset"), count = flags.positive("tokens");
    if (offset < 0 || offset >= static_cast<int64_t>(shard.size()))
      fail("flag --offset ", offset, " is outside the ", shard.size(), " tokens of ", flags.str("data"));
    tokens.assign(shard.begin() + offset, shard.begin() + std::min<int64_t>(offset + count, static_cast<int64_t>(shard.size())));
  }
  if (tokens.empty()) fail("inspect: the text has no tokens");
  const RoutingTrace trace = trace_routing(model, tokens, window);
  std::vector<double> top1_changed;
  if (!flags.str("vs").empty()) {
    const std::string other_dir = flags.str("vs");
    const LingConfig other_config = load_checkpoint_config(other_dir);
    LT_CHECK(other_config.num_experts == model.config().num_experts &&
                 other_config.moe_layer_indices() == model.config().moe_layer_indices() &&
                 other_config.num_experts_per_tok == model.config().num_experts_per_tok,
             "flag --vs ", other_dir, ": its MoE layers (experts, top-k, which layers) differ from ", ckpt, "'s");
    LT_CHECK(load_checkpoint_tokenizer_json(other_dir) == load_checkpoint_tokenizer_json(ckpt), "flag --vs ",
             other_dir, ": its tokenizer differs from ", ckpt, "'s, so the same text is other tokens");
    LingForCausalLM other(other_config, 0);
    load_checkpoint_weights(other_dir, other);
    // A checkpoint of a shorter context (the one a post-training run extended) is routed in the same
    // windows, as that run's first step saw it.
    if (window > other.config().max_position_embeddings) other.extend_context(window);
    const RoutingTrace other_trace = trace_routing(other, tokens, window);
    for (size_t l = 0; l < trace.layers.size(); ++l)
      top1_changed.push_back(top1_changed_fraction(trace.layers[l], other_trace.layers[l]));
  }
  if (json) {
    for (const Json& line : routing_json_lines(trace, *tokenizer, top1_changed)) std::printf("%s\n", line.dump().c_str());
    return 0;
  }
  std::vector<LayerTotals> totals;
  for (const LayerTrace& layer : trace.layers) totals.push_back(layer_totals(layer));
  std::printf("%s\n%s", routing_table(trace, *tokenizer, colour, terminal_columns(stdout)).c_str(),
              totals_table(totals, top1_changed, colour).c_str());
  if (!top1_changed.empty()) std::printf("top-1 changed: tokens whose first expert differs in %s\n", flags.str("vs").c_str());
  return 0;
}

int cmd_report(const Args& args) {
  const Flags flags("lingtrain report --run DIR [flags]: the training report, one self-contained HTML page",
                    {{"run", "", "a run's output folder: metrics.jsonl and checkpoint/ (required)"},
                     {"out", "", "the page to write (default: DIR/report.html)"},
                     {"domain", "", "NAME=FILE: a domain for the routing section", FlagSpec::Repeatable},
                     {"domain-tokens", "8192", "tokens per domain at most"},
                     threads_flag()},
                    args);
  apply_threads(flags);
  const std::string run = flags.str("run");
  if (run.empty()) fail("report needs --run DIR (a run's output folder: metrics.jsonl and checkpoint/)");
  const std::string out = flags.str("out").empty() ? run + "/report.html" : flags.str("out");
  const int64_t per_domain = flags.positive("domain-tokens");
  std::vector<DomainText> domains;
  if (!flags.list("domain").empty()) {
    const LingConfig config = load_checkpoint_config(run + "/checkpoint");
    const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer("", run + "/checkpoint", config.vocab_size);
    domains = domains_from_flags(flags.list("domain"), *tokenizer, config.vocab_size, per_domain);
  }
  const std::string html = training_report_html(load_report_data(run, domains, per_domain));
  write_file_atomic(out, html);
  std::printf("training report written to %s\n", out.c_str());
  return 0;
}

}  // namespace lt::cli
