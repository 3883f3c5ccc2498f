// The training report (`lingtrain report --run DIR`; `make train` writes out/tiny/report.html): one
// self-contained HTML page (inline SVG and CSS, no script, nothing fetched) showing how a run trained
// and what its MoE layers learned: losses, learning rate, gradient norm, the auxiliary losses,
// throughput, each MoE layer's expert load and routing entropy over training, the final checkpoint's
// expert specialisation by domain, the spike guard's events and the run's configuration.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "inspect/specialisation.h"
#include "io/json.h"

namespace lt {

// What the page shows, read from a run folder by load_report_data or made up by a test.
struct ReportData {
  std::string run_dir;
  std::vector<Json> records;     // metrics.jsonl, in order
  Json config;                   // the final checkpoint's config.json
  Json trainer_state;            // its trainer_state.json (the recipe), or null
  double unigram_entropy = NAN;  // nats per token of the held-out data, when the run used the embedded corpus
  std::vector<LayerSpecialisation> specialisation;  // of the final checkpoint
  std::string specialisation_source;                // the text it was measured on, in words
  // The same measured on the weights the run started from (the initialisation its seed gives, or the
  // checkpoint it continued): how much of the specialisation training made. Empty when unknown.
  std::vector<LayerSpecialisation> starting_specialisation;
  std::string starting_point;  // those weights, in words
};

// The section ids of the page, in order (the browser test checks each is there and drawn).
const std::vector<std::string>& report_section_ids();

// Reads <run_dir>/metrics.jsonl (a torn last line, from a run still writing, is left out), the checkpoint
// in <run_dir>/checkpoint and <run_dir>/data/corpus.json when present, and measures the checkpoint's
// specialisation on `domains` (empty: the embedded corpus's held-out text, tokens_per_domain each).
ReportData load_report_data(const std::string& run_dir, const std::vector<DomainText>& domains,
                            int64_t tokens_per_domain);

std::string training_report_html(const ReportData& data);

}  // namespace lt
