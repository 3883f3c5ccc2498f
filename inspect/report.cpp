#include "inspect/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "inspect/svg_chart.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "model/config.h"
#include "trainer/checkpoint.h"

namespace lt {

namespace {

bool has_number(const Json& record, const char* key) { return record.contains(key) && record[key].is_number(); }

// (step, value) of every record that logged `key` as a number.
ChartSeries series_of(const std::vector<Json>& records, const char* key, const std::string& name,
                      const std::string& colour, ChartSeries::Style style = ChartSeries::Style::Line) {
  ChartSeries s;
  s.name = name;
  s.colour = colour;
  s.style = style;
  for (const Json& r : records)
    if (has_number(r, key) && has_number(r, "step")) {
      s.x.push_back(r["step"].get<double>());
      s.y.push_back(r[key].get<double>());
    }
  return s;
}

// The loss curve's smoothing: a centred moving average over 2 half + 1 steps, about 2% of the run's
// steps (at least 5): the trend of a noisy training loss, without the lag a trailing average has where
// the loss falls fast.
int64_t smoothing_half_window(int64_t steps) { return std::max<int64_t>(2, steps / 100); }

ChartSeries smoothed(const ChartSeries& raw) {
  ChartSeries s = raw;
  const int64_t n = static_cast<int64_t>(raw.y.size());
  const int64_t half = smoothing_half_window(n);
  // The widest window a point of this run gets (a short run's is narrower than the nominal one).
  const int64_t widest = 2 * std::min(half, (n - 1) / 2) + 1;
  s.name = format_text("train loss (moving average of %lld steps)", static_cast<long long>(widest));
  s.style = ChartSeries::Style::Line;
  for (int64_t i = 0; i < n; ++i) {
    // The window narrows at the ends so that it stays centred (the first step is its own average).
    const int64_t h = std::min({half, i, n - 1 - i});
    double sum = 0;
    int64_t count = 0;
    for (int64_t j = i - h; j <= i + h; ++j)
      if (std::isfinite(raw.y[static_cast<size_t>(j)])) {
        sum += raw.y[static_cast<size_t>(j)];
        ++count;
      }
    s.y[static_cast<size_t>(i)] = count > 0 ? sum / static_cast<double>(count) : NAN;
  }
  return s;
}

// The train loss where the run ended: the mean of its last steps over the smoothing's window (there the
// centred average has narrowed to the last step alone).
struct FinalLoss {
  double value = NAN;
  int64_t steps = 0;  // finite values averaged
};
FinalLoss final_train_loss(const ChartSeries& raw) {
  const int64_t n = static_cast<int64_t>(raw.y.size());
  const int64_t window = std::min(n, 2 * smoothing_half_window(n) + 1);
  FinalLoss last;
  double sum = 0;
  for (int64_t i = n - window; i < n; ++i)
    if (std::isfinite(raw.y[static_cast<size_t>(i)])) {
      sum += raw.y[static_cast<size_t>(i)];
      ++last.steps;
    }
  if (last.steps > 0) last.value = sum / static_cast<double>(last.steps);
  return last;
}

// The run's recipe as its checkpoint records it (trainer_state.json), or an empty object.
Json recipe_of(const ReportData& d) {
  if (d.trainer_state.is_object() && d.trainer_state.contains("recipe") && d.trainer_state["recipe"].is_object())
    return d.trainer_state["recipe"];
  return Json::object();
}

// What a run's training and held-out losses are.
struct LossMeaning {
  std::string name;        // a few words
  std::string definition;  // what is averaged over what
  std::string unit;
};
LossMeaning stage_loss(const Json& stage) {
  const std::string kind =
      stage.is_object() && stage.contains("kind") && stage["kind"].is_string() ? stage["kind"].get<std::string>() : "";
  if (kind == "sft")
    return {"the assistant tokens' cross-entropy",
            "the mean cross-entropy of the assistant's tokens (each reply and its end token; the prompt, system and "
            "tool turns are context, not targets)",
            "nats per token"};
  if (kind == "dpo")
    return {"the DPO loss with its NLL term",
            format_text("the DPO loss: sigmoid DPO, \u2212log \u03c3(\u03b2 \u00d7 (the chosen response's log-ratio to "
                        "the reference model \u2212 the rejected one's)) with \u03b2 = %g, averaged over pairs, plus "
                        "rpo_alpha = %g times the mean negative log-likelihood of the chosen responses' tokens (RPO)",
                        stage.value("beta", 0.1), stage.value("rpo_alpha", 0.0)),
            "nats"};
  return {"next-token cross-entropy", "the mean next-token cross-entropy", "nats per token"};
}
// The loss of each kind of stage in the recipe (no recipe, or stages without a kind: pre-training).
LossMeaning run_loss(const ReportData& d) {
  const Json stages = recipe_of(d).value("stages", Json::array());
  std::vector<std::pair<std::string, LossMeaning>> distinct;  // the first stage of each definition, by name
  for (const Json& stage : stages) {
    const LossMeaning m = stage_loss(stage);
    if (std::none_of(distinct.begin(), distinct.end(),
                     [&](const auto& seen) { return seen.second.definition == m.definition; }))
      distinct.emplace_back(stage.is_object() ? stage.value("name", std::string("?")) : "?", m);
  }
  if (distinct.empty()) return stage_loss(Json());
  if (distinct.size() == 1) return distinct[0].second;
  LossMeaning mixed{"each stage's own loss", "", distinct[0].second.unit};
  for (const auto& [name, m] : distinct) {
    mixed.definition += (mixed.definition.empty() ? "" : "; ") + ("in stage '" + name + "' " + m.definition);
    if (m.unit != mixed.unit) mixed.unit = "nats";
  }
  return mixed;
}

// Whether a record carries held-out figures: a held-out loss or any held-out metric (eval_...). The
// periodic ones cover the first --eval-tokens of the held-out data; the run's end writes one more record,
// marked "heldout": "end", over all of it.
bool has_heldout(const Json& r) {
  if (has_number(r, "val_loss")) return true;
  for (const auto& [key, value] : r.items())
    if (key.rfind("eval_", 0) == 0 && value.is_number()) return true;
  return false;
}
bool covers_all_heldout(const Json& r) {
  return r.contains("heldout") && r["heldout"].is_string() && r["heldout"].get<std::string>() == "end";
}

// The last held-out value of `key` and where it was measured, with its value before training when the
// run measured one at step 0 (a post-training stage's "before"); empty when no record has it. A run
// shorter than its evaluation period measured nothing after step 0, which the text says.
std::string heldout_figure(const std::vector<Json>& records, const char* key,
                           const std::function<std::string(double)>& show) {
  const Json *before = nullptr, *last = nullptr;
  for (const Json& r : records)
    if (has_number(r, key)) {
      if (before == nullptr && r.value("step", -1.0) == 0) before = &r;
      last = &r;
    }
  if (last == nullptr) return "";
  std::string text = show((*last)[key].get<double>());
  if (last == before) return text + " before training (step 0), none logged after it";
  text += format_text(" at step %.0f", last->value("step", 0.0));
  if (covers_all_heldout(*last)) text += ", over all the held-out data";
  if (before != nullptr) text += " (" + show((*before)[key].get<double>()) + " before training)";
  return text;
}

// The spike guard's actions and the stage changes, as marks across the charts.
std::vector<ChartMark> spike_events(const std::vector<Json>& records) {
  std::vector<ChartMark> events;
  for (const Json& r : records)
    if (r.contains("spike") && r["spike"].is_object())
      events.push_back({r.value("step", 0.0),
                        "step " + std::to_string(r.value("step", 0)) + ": " +
                            r["spike"].value("kind", std::string("?")) + " spike, " +
                            r["spike"].value("action", std::string("?")),
                        "#b2182b"});
  return events;
}
std::vector<ChartMark> stage_events(const std::vector<Json>& records) {
  std::vector<ChartMark> events;
  std::string current;
  for (const Json& r : records) {
    if (!r.contains("stage") || !r["stage"].is_string()) continue;
    const std::string stage = r["stage"].get<std::string>();
    if (stage != current && !current.empty())
      events.push_back({r.value("step", 0.0) - 0.5, "stage '" + stage + "' starts", "#555"});
    current = stage;
  }
  return events;
}

// A chart over the run's training steps. A series the run never logged is left out of its legend.
LineChart step_chart(const std::string& title, const std::string& y_label, std::vector<ChartSeries> series,
                     bool log_y = false) {
  LineChart chart;
  chart.title = title;
  chart.x_label = "training step";
  chart.y_label = y_label;
  for (ChartSeries& s : series)
    if (!s.x.empty()) chart.series.push_back(std::move(s));
  chart.log_y = log_y;
  return chart;
}

std::string figure(const std::string& title, const std::string& svg, const std::string& caption) {
  return "<figure><figcaption><b>" + html_escape(title) + "</b> " + caption + "</figcaption>" + svg + "</figure>";
}

std::string section(const std::string& id, const std::string& title, const std::string& intro,
                    const std::string& body) {
  return "<section id=\"" + id + "\"><h2>" + html_escape(title) + "</h2><p class=\"intro\">" + intro + "</p>" + body +
         "</section>\n";
}

// One MoE layer's logged figures over training: "moe_layers" entries of the records, by decoder layer.
struct LayerHistory {
  std::vector<double> steps;
  std::vector<std::vector<int64_t>> loads;
  std::vector<double> entropy, max_over_mean;
};
std::map<int64_t, LayerHistory> layer_histories(const std::vector<Json>& records) {
  std::map<int64_t, LayerHistory> layers;
  for (const Json& r : records) {
    if (!r.contains("moe_layers") || !r["moe_layers"].is_array() || !has_number(r, "step")) continue;
    for (const Json& l : r["moe_layers"]) {
      if (!l.is_object() || !l.contains("tokens_per_expert")) continue;
      LayerHistory& h = layers[l.value("layer", int64_t{0})];
      h.steps.push_back(r["step"].get<double>());
      h.loads.push_back(l["tokens_per_expert"].get<std::vector<int64_t>>());
      h.entropy.push_back(l.value("routing_entropy", std::nan("")));
      h.max_over_mean.push_back(l.value("max_over_mean", std::nan("")));
    }
  }
  return layers;
}

std::string layer_name(int64_t layer) { return "layer " + std::to_string(layer); }

// The expert-load heatmap of one layer: experts down, training steps across (at most 120 columns, each
// the summed load of its steps), the colour each expert's share relative to the ideal 1/E.
std::string load_heatmap(int64_t layer, const LayerHistory& h) {
  const int64_t E = static_cast<int64_t>(h.loads.front().size());
  const int64_t n = static_cast<int64_t>(h.loads.size());
  const int64_t columns = std::min<int64_t>(n, 120);
  Heatmap map;
  map.title = "Expert load over training, " + layer_name(layer);
  map.x_label = "training step";
  map.y_label = "expert";
  map.rows = E;
  map.columns = columns;
  map.scale = Heatmap::Scale::Ratio;
  map.legend = "load / ideal (1/E)";
  map.values.assign(static_cast<size_t>(E * columns), NAN);
  for (int64_t c = 0; c < columns; ++c) {
    const int64_t begin = c * n / columns, end = (c + 1) * n / columns;
    std::vector<double> load(static_cast<size_t>(E), 0.0);
    double total = 0;
    for (int64_t i = begin; i < end; ++i)
      for (int64_t e = 0; e < E && e < static_cast<int64_t>(h.loads[static_cast<size_t>(i)].size()); ++e) {
        load[static_cast<size_t>(e)] += static_cast<double>(h.loads[static_cast<size_t>(i)][static_cast<size_t>(e)]);
        total += static_cast<double>(h.loads[static_cast<size_t>(i)][static_cast<size_t>(e)]);
      }
    for (int64_t e = 0; e < E && total > 0; ++e)
      map.values[static_cast<size_t>(e * columns + c)] = load[static_cast<size_t>(e)] * static_cast<double>(E) / total;
    map.column_labels.push_back(format_text("%.0f", h.steps[static_cast<size_t>(begin)]));
  }
  for (int64_t e = 0; e < E; ++e) map.row_labels.push_back(std::to_string(e));
  return figure(map.title, svg_heatmap(map),
                "Each row is an expert, each column a stretch of training. White: the expert gets its fair share "
                "1/E of the token assignments; red: more (overloaded); blue: less (dark blue: starved).");
}

std::string summary_table(const ReportData& d, const LossMeaning& objective) {
  std::vector<std::pair<std::string, std::string>> rows;
  auto add = [&](const std::string& name, const std::string& value) { rows.emplace_back(name, value); };
  const LingConfig config = config_from_json(d.config, d.run_dir + "/checkpoint/config.json");
  const ParameterCount count = count_parameters(config);
  add("model", d.config.value("lingtrain_preset", std::string("custom config")));
  add("parameters",
      format_text("%.2fM total, ", count.total / 1e6) + format_text("%.2fM active per token", count.active / 1e6));
  add("MoE layers", std::to_string(config.moe_layer_indices().size()) + " of " +
                        std::to_string(config.num_hidden_layers) + ", " + std::to_string(config.num_experts) +
                        " routed experts, top-" + std::to_string(config.num_experts_per_tok) + ", " +
                        std::to_string(config.num_shared_experts) + " shared");
  double steps = NAN, tokens = NAN, elapsed = NAN;
  for (const Json& r : d.records) {
    if (has_number(r, "step")) steps = r["step"].get<double>();
    if (has_number(r, "tokens")) tokens = r["tokens"].get<double>();
    if (has_number(r, "elapsed_s")) elapsed = r["elapsed_s"].get<double>();
  }
  const std::string& unit = objective.unit;
  const FinalLoss loss = final_train_loss(series_of(d.records, "lm_loss", "", ""));
  if (std::isfinite(steps)) add("steps", format_text("%.0f", steps));
  if (std::isfinite(tokens)) add("tokens seen", format_text("%.3gM", tokens / 1e6));
  if (std::isfinite(elapsed)) add("training time", format_text("%.0f s", elapsed));
  if (loss.steps > 0)
    add(loss.steps == 1 ? "final train loss (last step)"
                        : "final train loss (mean of the last " + std::to_string(loss.steps) + " steps)",
        format_text("%.4f ", loss.value) + unit);
  const std::vector<std::pair<std::string, std::string>> heldout = {
      {"last held-out loss",
       heldout_figure(d.records, "val_loss", [&](double v) { return format_text("%.4f ", v) + unit; })},
      {"held-out reward accuracy", heldout_figure(d.records, "eval_rewards/accuracies",
                                                  [](double v) { return format_text("%.1f%% of pairs", 100 * v); })},
      {"held-out reward margin (chosen \u2212 rejected)",
       heldout_figure(d.records, "eval_rewards/margins", [](double v) { return format_text("%.4f nats", v); })}};
  for (const auto& [name, value] : heldout)
    if (!value.empty()) add(name, value);
  for (auto r = d.records.rbegin(); r != d.records.rend(); ++r)
    if (has_number(*r, "mc_acc") && has_number(*r, "mc_acc_norm") && has_number(*r, "mc_chance")) {
      add("last multiple-choice accuracy",
          format_text("acc %.3f, acc_norm %.3f (chance %.3f)", (*r)["mc_acc"].get<double>(),
                      (*r)["mc_acc_norm"].get<double>(), (*r)["mc_chance"].get<double>()));
      break;
    }
  if (std::isfinite(d.unigram_entropy))
    add("unigram entropy of the held-out data", format_text("%.4f nats per token", d.unigram_entropy));
  std::string html = "<table class=\"summary\">";
  for (const auto& [name, value] : rows)
    html += "<tr><th>" + html_escape(name) + "</th><td>" + html_escape(value) + "</td></tr>";
  return html + "</table>";
}

// A matrix with one column per expert and the given rows, its cells labelled with their values.
Heatmap expert_columns(const std::string& title, const std::string& row_name, const std::vector<std::string>& rows,
                       int64_t num_experts, const std::string& legend) {
  Heatmap map;
  map.title = title;
  map.x_label = "expert";
  map.y_label = row_name;
  map.rows = static_cast<int64_t>(rows.size());
  map.columns = num_experts;
  map.row_labels = rows;
  for (int64_t e = 0; e < num_experts; ++e) map.column_labels.push_back(std::to_string(e));
  map.legend = legend;
  map.annotate = true;
  return map;
}

std::string specialisation_section(const ReportData& d) {
  if (d.specialisation.empty())
    return "<p class=\"note\">This model has no MoE layer: nothing routes, so there is nothing to specialise.</p>";
  const bool baseline = d.starting_specialisation.size() == d.specialisation.size();
  std::string html =
      "<table class=\"data\"><tr><th>MoE layer</th><th>I(domain; expert)</th><th>largest possible</th>"
      "<th>share of the largest</th>" +
      (baseline ? "<th>" + html_escape(d.starting_point) + "</th>" : std::string()) + "</tr>";
  for (size_t i = 0; i < d.specialisation.size(); ++i) {
    const LayerSpecialisation& s = d.specialisation[i];
    html +=
        "<tr><td>" + layer_name(s.layer) + "</td><td>" + format_text("%.3f bits", s.mutual_information_bits) +
        "</td><td>" + format_text("%.3f bits", s.max_mutual_information_bits) + "</td><td>" +
        format_text("%.0f%%", s.max_mutual_information_bits > 0
                                  ? 100 * s.mutual_information_bits / s.max_mutual_information_bits
                                  : 0.0) +
        "</td>" +
        (baseline ? "<td>" + format_text("%.3f bits", d.starting_specialisation[i].mutual_information_bits) + "</td>"
                  : std::string()) +
        "</tr>";
  }
  html += "</table>";
  if (baseline)
    html += recipe_of(d).contains("init")
                ? "<p class=\"note\">The run started from trained weights: compare each layer with its value " +
                      html_escape(d.starting_point) + " to see what this run changed.</p>"
                : "<p class=\"note\">A random router already separates domains somewhat (their characters differ): "
                  "compare each layer with its value " +
                      html_escape(d.starting_point) + " to see what training added.</p>";
  html += "<div class=\"grid\">";
  for (const LayerSpecialisation& s : d.specialisation) {
    const int64_t D = static_cast<int64_t>(s.domains.size()), E = s.num_experts;
    Heatmap matrix = expert_columns("Domain \u00d7 expert, " + layer_name(s.layer), "domain", s.domains, E,
                                    "share of the domain's assignments");
    double largest = 0;
    for (int64_t dd = 0; dd < D; ++dd) {
      double row = 0;
      for (int64_t e = 0; e < E; ++e) row += static_cast<double>(s.domain_expert[static_cast<size_t>(dd * E + e)]);
      for (int64_t e = 0; e < E; ++e) {
        const double share =
            row > 0 ? static_cast<double>(s.domain_expert[static_cast<size_t>(dd * E + e)]) / row : NAN;
        matrix.values.push_back(share);
        if (std::isfinite(share)) largest = std::max(largest, share);
      }
    }
    matrix.max_value = std::max(largest, 1.0 / static_cast<double>(E));
    html += figure(matrix.title, svg_heatmap(matrix),
                   format_text("I = %.3f bits", s.mutual_information_bits) +
                       format_text(" of at most %.3f.", s.max_mutual_information_bits) +
                       " Each row: where one domain's tokens go (a row sums to 100%). Without specialisation "
                       "every row would look the same.");
    if (s.top_k < 2) continue;  // one expert per token: no two are ever chosen together
    std::vector<std::string> experts;
    for (int64_t e = 0; e < E; ++e) experts.push_back(std::to_string(e));
    Heatmap co =
        expert_columns("Expert co-activation, " + layer_name(s.layer), "expert", experts, E, "tokens choosing both");
    double off_diagonal = 0;
    for (int64_t i = 0; i < E; ++i)
      for (int64_t j = 0; j < E; ++j) {
        // The diagonal (how often an expert is chosen at all) would drown the pairs: it is left grey.
        const double v = i == j ? NAN : s.coactivation[static_cast<size_t>(i * E + j)];
        co.values.push_back(v);
        if (i != j) off_diagonal = std::max(off_diagonal, v);
      }
    co.max_value = off_diagonal > 0 ? off_diagonal : 1;
    html += figure(co.title, svg_heatmap(co),
                   "The share of all tokens that chose both experts i and j (k = " + std::to_string(s.top_k) +
                       " experts per token). Bright pairs work together; the grey diagonal is left out.");
  }
  return html + "</div>";
}

std::string spikes_section(const std::vector<Json>& records) {
  std::string rows;
  for (const Json& r : records) {
    const bool spike = r.contains("spike") && r["spike"].is_object();
    const std::string update = r.contains("update") && r["update"].is_string() ? r["update"].get<std::string>() : "";
    if (!spike && update.empty()) continue;
    rows += "<tr><td>" + std::to_string(r.value("step", 0)) + "</td><td>" +
            html_escape(spike ? r["spike"].value("kind", std::string("")) : "") + "</td><td>" +
            (spike && r["spike"].contains("z") && r["spike"]["z"].is_number()
                 ? format_text("%.1f", r["spike"]["z"].get<double>())
                 : "") +
            "</td><td>" + html_escape(spike ? r["spike"].value("action", std::string("")) : "") + "</td><td>" +
            html_escape(update.empty() ? "applied" : update) + "</td><td>" +
            (has_number(r, "loss") ? format_text("%.4f", r["loss"].get<double>()) : "") + "</td></tr>";
  }
  if (rows.empty())
    return "<p class=\"note\">No loss spike and no non-finite step: the spike guard never acted in this run.</p>";
  return "<table class=\"data\"><tr><th>step</th><th>kind</th><th>z-score</th><th>guard's action</th>"
         "<th>update</th><th>loss</th></tr>" +
         rows + "</table>";
}

// The profiled steps (--profile-every): the op families' time, mean over the profiled steps and ranks, and
// the last profiled step's timeline, one lane per rank, with a table of each rank's totals.
std::string profile_section(const std::vector<Json>& records) {
  std::map<std::string, std::array<double, 3>> op_ms;  // per op family: forward, backward, optimizer
  const Json* last = nullptr;
  double profiles = 0;
  for (const Json& r : records) {
    if (!r.contains("profile") || !r["profile"].is_array()) continue;
    last = &r;
    for (const Json& rank : r["profile"]) {
      if (!rank.is_object() || !rank.contains("ops")) continue;
      ++profiles;
      for (const Json& op : rank["ops"]) {
        const std::string phase = op.value("phase", std::string());
        const size_t slot = phase == "forward" ? 0 : phase == "backward" ? 1 : 2;
        op_ms[op.value("op", std::string("?"))][slot] += op.value("ms", 0.0);
      }
    }
  }
  if (last == nullptr)
    return "<p class=\"note\">This run was not profiled: <code>--profile-every N</code> times one step in N op by op, "
           "with its collectives, on every rank.</p>";
  std::vector<std::pair<std::string, std::array<double, 3>>> ops(op_ms.begin(), op_ms.end());
  auto total = [](const std::array<double, 3>& t) { return t[0] + t[1] + t[2]; };
  std::stable_sort(ops.begin(), ops.end(),
                   [&](const auto& a, const auto& b) { return total(a.second) > total(b.second); });
  constexpr size_t kShownOps = 16;
  if (ops.size() > kShownOps) ops.resize(kShownOps);
  BarChart bars;
  bars.title = "Time per op family";
  bars.x_label = "milliseconds per profiled step (self time)";
  const char* const phases[3] = {"forward", "backward", "optimizer"};
  const char* const colours[3] = {"#0072B2", "#E69F00", "#009E73"};
  for (size_t p = 0; p < 3; ++p) bars.series.push_back({phases[p], colours[p], {}});
  for (const auto& [name, t] : ops) {
    bars.rows.push_back(name);
    for (size_t p = 0; p < 3; ++p) bars.series[p].values.push_back(t[p] / profiles);
  }
  Timeline lanes;
  lanes.title = "Timeline of step " + std::to_string(last->value("step", 0));
  lanes.x_label = "milliseconds from the step's start";
  lanes.legend = {{"forward", colours[0]}, {"backward", colours[1]}, {"optimizer", colours[2]},
                  {"collective", "#CC79A7"}};
  std::string rows;
  for (const Json& rank : (*last)["profile"]) {
    if (!rank.is_object()) continue;
    const size_t lane = lanes.lanes.size();
    lanes.lanes.push_back("rank " + std::to_string(rank.value("rank", 0)));
    for (const Json& s : rank.value("timeline", Json::array())) {
      const std::string part = s.value("part", std::string());
      const bool collective = s.value("collective", false);
      const std::string colour = collective           ? "#CC79A7"
                                 : part == "forward"  ? colours[0]
                                 : part == "backward" ? colours[1]
                                                      : colours[2];
      lanes.segments.push_back({lane, s.value("start_ms", 0.0), s.value("end_ms", 0.0), colour, collective});
    }
    double collective_ms = 0;
    int64_t bytes = 0;
    for (const Json& c : rank.value("collectives", Json::array())) {
      collective_ms += c.value("ms", 0.0);
      bytes += c.value("bytes", int64_t{0});
    }
    rows += "<tr><td>" + std::to_string(rank.value("rank", 0)) + "</td><td>" +
            format_text("%.2f", rank.value("step_ms", 0.0)) + "</td><td>" +
            format_text("%.2f", rank.value("pool_wait_ms", 0.0)) + "</td><td>" + format_text("%.2f", collective_ms) +
            "</td><td>" + format_text("%.2f", static_cast<double>(bytes) / 1e6) + "</td></tr>";
  }
  return "<div class=\"grid\">" +
         figure(bars.title, svg_bar_chart(bars),
                "Each op family's own time (not its callees'), mean over the profiled steps and the ranks, for the " +
                    std::to_string(ops.size()) + " largest.") +
         figure(lanes.title, svg_timeline(lanes),
                "The step's phases on each rank, and under them its collectives (a rank waiting in one for a slower "
                "rank shows a long bar).") +
         "</div><table class=\"data\"><tr><th>rank</th><th>step ms</th><th>thread pool waits ms</th>"
         "<th>collectives ms</th><th>MB sent through collectives</th></tr>" +
         rows + "</table>";
}

// Each rank's time per step over training (multi-rank runs), with the ranks named as slow.
std::string ranks_section(const std::vector<Json>& records) {
  std::vector<ChartSeries> per_rank;
  std::vector<ChartMark> turned_slow;
  std::string rows;
  std::set<int64_t> slow_before;
  for (const Json& r : records) {
    if (!r.contains("rank_step_s") || !r["rank_step_s"].is_array()) continue;
    const double step = r.value("step", 0.0);
    const Json& times = r["rank_step_s"];
    for (size_t k = 0; k < times.size(); ++k) {
      if (per_rank.size() <= k) per_rank.push_back({"rank " + std::to_string(k), "", {}, {}});
      per_rank[k].x.push_back(step);
      per_rank[k].y.push_back(times[k].get<double>() * 1e3);
    }
    std::set<int64_t> slow_now;
    for (const Json& s : r.value("slow_ranks", Json::array())) {
      const int64_t rank = s.value("rank", int64_t{0});
      slow_now.insert(rank);
      if (slow_before.count(rank)) continue;
      turned_slow.push_back({step, "rank " + std::to_string(rank) + " slow", "#D55E00"});
      rows += "<tr><td>" + std::to_string(static_cast<int64_t>(step)) + "</td><td>" + std::to_string(rank) +
              "</td><td>" +
              format_text("%.2f", s.value("times_median", 0.0)) + "</td><td>" +
              html_escape(s.value("part", std::string())) + "</td></tr>";
    }
    slow_before = slow_now;
  }
  if (per_rank.empty()) return "<p class=\"note\">One process: no ranks to compare.</p>";
  for (size_t k = 0; k < per_rank.size(); ++k) per_rank[k].colour = series_colour(k, per_rank.size());
  LineChart chart = step_chart("Time per step of each rank", "busy milliseconds per step", per_rank);
  chart.events = turned_slow;
  std::string html = figure(chart.title, svg_line_chart(chart),
                            "Each rank's time per step less its waits in collectives (what it computed); a marked "
                            "step is where a rank was named slow.");
  if (rows.empty()) return html + "<p class=\"note\">No rank was slow (--slow-rank-factor).</p>";
  return html + "<table class=\"data\"><tr><th>named at step</th><th>rank</th><th>x the median rank</th>"
                "<th>slowest part</th></tr>" +
         rows + "</table>";
}

const char* kStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 16px 24px 48px; color: #222; background: #fff; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 4px; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
p.intro { color: #444; max-width: 900px; }
p.note { color: #555; font-style: italic; }
.grid { display: flex; flex-wrap: wrap; gap: 12px 28px; }
figure { margin: 8px 0; }
figcaption { font-size: 0.9em; color: #333; max-width: 560px; margin-bottom: 4px; }
svg.chart { display: block; font-size: 11px; }
svg .tick { fill: #444; font-size: 10.5px; }
svg .legend { fill: #222; font-size: 11px; }
svg .axis-title { fill: #222; font-size: 11.5px; font-weight: 600; }
svg .note { fill: #777; font-style: italic; }
svg .cell { font-size: 10px; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .axis { stroke: #888; }
svg .frame { fill: none; stroke: #999; stroke-width: 1; }
table { border-collapse: collapse; font-size: 0.92em; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 10px; text-align: left; }
table.summary th { background: #f5f5f5; font-weight: 600; }
table.data th { background: #f5f5f5; }
pre { background: #f7f7f7; border: 1px solid #e3e3e3; padding: 10px; overflow: auto; font-size: 0.85em; max-height: 480px;
      min-width: 340px; }
nav a { margin-right: 12px; }
)";

}  // namespace

const std::vector<std::string>& report_section_ids() {
  static const std::vector<std::string> ids = {
      "summary",     "loss",  "learning-rate", "gradient-norm",   "auxiliary-losses", "throughput", "profile",
      "ranks",       "expert-load", "routing-entropy", "specialisation", "spikes", "configuration"};
  return ids;
}

std::string training_report_html(const ReportData& d) {
  const std::vector<Json>& records = d.records;
  const std::vector<ChartMark> spikes = spike_events(records);
  std::vector<ChartMark> events = stage_events(records);
  events.insert(events.end(), spikes.begin(), spikes.end());
  const std::map<int64_t, LayerHistory> layers = layer_histories(records);
  const LingConfig config = config_from_json(d.config, d.run_dir + "/checkpoint/config.json");
  const int64_t num_experts = config.num_experts, top_k = config.num_experts_per_tok;

  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>Training report: " +
      html_escape(d.run_dir) + "</title><style>" + kStyle +
      "</style></head><body>\n<h1>Training report: " + html_escape(d.run_dir) + "</h1>\n<nav>";
  const std::vector<std::string> titles = {"Summary",
                                           "Loss",
                                           "Learning rate",
                                           "Gradient norm",
                                           "Auxiliary losses",
                                           "Throughput",
                                           "Where a step's time goes",
                                           "Ranks",
                                           "Expert load over training",
                                           "Routing entropy",
                                           "Expert specialisation",
                                           "Spikes and recoveries",
                                           "Configuration"};
  for (size_t i = 0; i < titles.size(); ++i)
    html += "<a href=\"#" + report_section_ids()[i] + "\">" + html_escape(titles[i]) + "</a>";
  html += "</nav>\n";

  const LossMeaning objective = run_loss(d);
  html += section("summary", titles[0],
                  "What was trained and where it ended. The loss is " + html_escape(objective.definition) + ", in " +
                      objective.unit + " (lower is better).",
                  summary_table(d, objective));

  // The held-out records split by what they cover: the periodic ones a part of the held-out data, the
  // run's end record all of it.
  std::vector<Json> periodic, at_end;
  for (const Json& r : records)
    if (has_heldout(r)) (covers_all_heldout(r) ? at_end : periodic).push_back(r);
  ChartSeries raw = series_of(records, "lm_loss", "train loss (per step)", "#0072B2", ChartSeries::Style::Faint);
  // Up to two steps every point's centred window is the point itself: nothing to smooth.
  const bool smooth = raw.y.size() >= 3;
  if (!smooth) raw.style = ChartSeries::Style::Line;
  std::vector<ChartSeries> loss_series = {raw};
  if (smooth) loss_series.push_back(smoothed(raw));
  loss_series.push_back(series_of(periodic, "val_loss", "held-out loss", "#D55E00", ChartSeries::Style::Points));
  if (!at_end.empty())
    loss_series.push_back(series_of(at_end, "val_loss", "held-out loss at the end, all the held-out data", "#CC79A7",
                                    ChartSeries::Style::Points));
  LineChart loss = step_chart("Loss", "loss (" + objective.unit + ")", loss_series);
  if (std::isfinite(d.unigram_entropy))
    loss.levels.push_back({d.unigram_entropy, "unigram entropy (a model blind to context)", "#009E73"});
  loss.events = events;
  loss.width = 1120;
  loss.height = 340;
  std::string loss_body = figure("Train and held-out loss", svg_line_chart(loss),
                                 std::string(smooth ? "The faint line is each step's batch, the solid one its moving "
                                                      "average. "
                                                    : "The line is each step's batch. ") +
                                     "Held-out loss is measured on data the model never trains on: when it stops "
                                     "following the train loss down, the model is memorising. Red dotted lines mark "
                                     "spikes, grey ones stage changes.");
  if (std::any_of(records.begin(), records.end(), [](const Json& r) { return has_number(r, "mc_acc"); })) {
    LineChart accuracy = step_chart("Multiple-choice accuracy", "share of items answered right",
                                    {series_of(records, "mc_acc", "acc (summed log-probability)", "#0072B2"),
                                     series_of(records, "mc_acc_norm", "acc_norm (per character)", "#D55E00")});
    for (ChartSeries& s : accuracy.series)
      s.style = s.x.size() > 1 ? ChartSeries::Style::Line : ChartSeries::Style::Points;
    const ChartSeries chance = series_of(records, "mc_chance", "", "");
    if (!chance.y.empty()) accuracy.levels.push_back({chance.y.back(), "chance (guessing)", "#009E73"});
    accuracy.events = events;
    loss_body += figure("Multiple-choice accuracy", svg_line_chart(accuracy),
                        "Items scored as the run trained (--eval-mc): the choice with the largest summed "
                        "log-probability given the context (acc), or per character of the choice (acc_norm), "
                        "against the labelled one. The dashed line is what guessing scores.");
  }
  if (std::any_of(records.begin(), records.end(), [](const Json& r) {
        return has_number(r, "rewards/accuracies") || has_number(r, "eval_rewards/accuracies");
      })) {
    const LineChart rewards =
        step_chart("DPO rewards", "reward (\u03b2 \u00d7 log-ratio, nats)",
                   {series_of(records, "rewards/chosen", "chosen", "#009E73"),
                    series_of(records, "rewards/rejected", "rejected", "#D55E00"),
                    series_of(records, "rewards/margins", "margin", "#0072B2"),
                    series_of(records, "eval_rewards/chosen", "held-out chosen", "#009E73", ChartSeries::Style::Points),
                    series_of(records, "eval_rewards/rejected", "held-out rejected", "#D55E00",
                              ChartSeries::Style::Points),
                    series_of(records, "eval_rewards/margins", "held-out margin", "#0072B2",
                              ChartSeries::Style::Points)});
    LineChart accuracy = step_chart("Reward accuracy", "share of pairs, chosen above rejected",
                                    {series_of(records, "rewards/accuracies", "train batch", "#0072B2"),
                                     series_of(records, "eval_rewards/accuracies", "held-out", "#D55E00",
                                               ChartSeries::Style::Points)});
    accuracy.levels.push_back({1.0, "every pair ranked right", "#009E73"});
    loss_body += "<div class=\"grid\">" +
                 figure("DPO rewards", svg_line_chart(rewards),
                        "The implicit rewards of the chosen and rejected responses against the reference model "
                        "(lines: each step's batch; points: the held-out pairs). At the start the policy is the "
                        "reference and every reward is 0.") +
                 figure("Reward accuracy", svg_line_chart(accuracy),
                        "How often the chosen response's reward is above the rejected one's (a tie, as at the "
                        "start, counts as wrong).") +
                 "</div>";
  }
  html += section("loss", titles[1],
                  "The objective the run minimised, " + objective.name + ", and how well it generalises.", loss_body);

  LineChart lr =
      step_chart("Learning rate", "learning rate", {series_of(records, "lr", "AdamW learning rate", "#0072B2")});
  lr.events = stage_events(records);
  html +=
      section("learning-rate", titles[2], "The schedule: warmup, then decay (cosine, WSD or inverse square root).",
              figure("Learning rate", svg_line_chart(lr), "As applied at each step, after the spike guard's cuts."));

  LineChart gn = step_chart("Gradient norm", "global L2 norm (log scale)",
                            {series_of(records, "grad_norm", "gradient norm before clipping", "#0072B2")}, true);
  const Json stages = recipe_of(d).value("stages", Json::array());
  if (!stages.empty() && stages[0].is_object() && stages[0].value("clip", 0.0) > 0)
    gn.levels.push_back({stages[0].value("clip", 0.0), "clipping threshold", "#D55E00"});
  gn.events = spikes;
  html += section("gradient-norm", titles[3],
                  "Large early, then settling. Above the threshold, the update is scaled down to it (clipping).",
                  figure("Gradient norm", svg_line_chart(gn), "Before clipping, on a log scale."));

  const double moe_layers = static_cast<double>(layers.size());
  LineChart balance =
      step_chart("Load-balance loss", "sum over MoE layers (unscaled)",
                 {series_of(records, "balance_loss", "E \u03a3 f\u2091 P\u2091, summed over layers", "#0072B2")});
  if (moe_layers > 0) balance.levels.push_back({moe_layers, "perfect balance (1 per layer)", "#009E73"});
  const LineChart z =
      step_chart("Router z-loss", "sum over MoE layers (unscaled, log scale)",
                 {series_of(records, "z_loss", "mean logsumexp(router logits)\u00b2, summed", "#D55E00")}, true);
  html +=
      section("auxiliary-losses", titles[4],
              "The two MoE losses added to the training loss (weights aux_loss_coef and z_loss_coef in "
              "config.json): load balance pushes each expert towards a fair share of the tokens, the z-loss "
              "keeps the router's logits small so its softmax stays numerically tame.",
              "<div class=\"grid\">" +
                  figure("Load-balance loss", svg_line_chart(balance),
                         "1 per layer when every expert gets 1/E of the tokens; up to E when one takes all.") +
                  figure("Router z-loss", svg_line_chart(z), "Falls as the router learns smaller logits.") + "</div>");

  const LineChart speed = step_chart("Throughput", "tokens per second",
                                     {series_of(records, "tokens_per_s", "training tokens per second", "#0072B2")});
  html += section("throughput", titles[5], "Training speed of each step (forward, backward and update).",
                  figure("Throughput", svg_line_chart(speed), "Dips are evaluations, checkpoints or a busy machine."));
  html += section("profile", titles[6],
                  "The profiled steps (--profile-every): each op family's time, the thread pool's waits, and the "
                  "collectives of every rank.",
                  profile_section(records));
  html += section("ranks", titles[7], "Under several ranks, how fast each one is: the run names a rank slower than "
                                      "the median one by --slow-rank-factor at 3 log points in a row.",
                  ranks_section(records));

  std::string load_body;
  if (layers.empty()) {
    load_body = "<p class=\"note\">No expert load was logged (a dense model, or a run logged without it).</p>";
  } else {
    load_body = "<div class=\"grid\">";
    for (const auto& [layer, h] : layers) load_body += load_heatmap(layer, h);
    LineChart worst = step_chart("Load imbalance", "busiest expert's load / mean load", {});
    size_t i = 0;
    for (const auto& [layer, h] : layers) {
      ChartSeries s{layer_name(layer), series_colour(i++, layers.size()), h.steps, h.max_over_mean};
      worst.series.push_back(s);
    }
    worst.levels.push_back({1.0, "perfect balance", "#009E73"});
    load_body += figure("Load imbalance (max / mean)", svg_line_chart(worst),
                        "1 is perfect balance; the dropless router never drops a token, so an overloaded expert "
                        "costs time, not quality.") +
                 "</div>";
  }
  // The routing warmup is the recipe's (a post-training recipe has none): unknown without one.
  const Json recipe = recipe_of(d);
  const bool warmup_known = recipe.contains("routing_warmup") && recipe["routing_warmup"].is_number_integer();
  const int64_t routing_warmup = warmup_known ? recipe["routing_warmup"].get<int64_t>() : 0;
  std::string load_intro = "How the token assignments of each MoE layer spread over its experts as training goes on. ";
  if (routing_warmup > 0)
    load_intro += "For the first " + std::to_string(routing_warmup) +
                  " steps, stochastic routing warmup keeps the load even; the balance loss keeps it from collapsing "
                  "onto a few experts later.";
  else
    load_intro += std::string("The balance loss keeps it from collapsing onto a few experts") +
                  (warmup_known ? " (this run had no routing warmup)." : ".");
  html += section("expert-load", titles[8], load_intro, load_body);

  LineChart entropy = step_chart("Routing entropy", "mean router entropy (nats)", {});
  size_t i = 0;
  for (const auto& [layer, h] : layers)
    entropy.series.push_back({layer_name(layer), series_colour(i++, layers.size()), h.steps, h.entropy});
  if (num_experts > 0)
    entropy.levels.push_back({std::log(static_cast<double>(num_experts)), "uniform over all E experts (ln E)", "#777"});
  if (top_k > 1)
    entropy.levels.push_back({std::log(static_cast<double>(top_k)), "k experts, equal weight (ln k)", "#009E73"});
  html += section("routing-entropy", titles[9],
                  "How sure each router is: the entropy of its softmax over all experts, averaged over tokens. At "
                  "ln E it cannot tell experts apart; falling towards ln k it puts its weight on a few.",
                  figure("Routing entropy", svg_line_chart(entropy), "Per MoE layer, over the tokens of each step."));

  html +=
      section("specialisation", titles[10],
              "Do the experts divide the work by kind of text? Measured on the final checkpoint with " +
                  html_escape(d.specialisation_source) +
                  ". The mutual information between a token's domain and its chosen experts is 0 bits when "
                  "routing ignores the domain and reaches its largest value when each domain has experts of its own.",
              specialisation_section(d));

  html += section("spikes", titles[11],
                  "Steps the spike guard judged abnormal (a loss or gradient-norm z-score over its threshold, or a "
                  "non-finite loss) and what it did: skip the update, retry on other data, cut the learning rate, "
                  "or reload the last checkpoint.",
                  spikes_section(records));

  std::string config_body =
      "<div class=\"grid\"><div><h3>config.json</h3><pre>" + html_escape(d.config.dump(2)) + "</pre></div>";
  if (d.trainer_state.is_object() && d.trainer_state.contains("recipe"))
    config_body += "<div><h3>recipe</h3><pre>" + html_escape(d.trainer_state["recipe"].dump(2)) + "</pre></div>";
  if (d.trainer_state.is_object() && d.trainer_state.contains("dist"))
    config_body += "<div><h3>distribution</h3><pre>" + html_escape(d.trainer_state["dist"].dump(2)) + "</pre></div>";
  config_body += "</div>";
  html +=
      section("configuration", titles[12], "The model and the run as the final checkpoint records them.", config_body);
  return html + "</body></html>\n";
}

ReportData load_report_data(const std::string& run_dir, const std::vector<DomainText>& domains,
                            int64_t tokens_per_domain) {
  ReportData d;
  d.run_dir = run_dir;
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  LT_CHECK(std::filesystem::is_directory(run_dir), run_dir, ": no such run folder");
  const std::string text = read_file(metrics_path);
  size_t line_number = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    const bool torn = end == std::string::npos;  // a run still writing its last line
    if (torn) end = text.size();
    ++line_number;
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (torn) {
      try {
        d.records.push_back(parse_json(line, metrics_path));
      } catch (const std::exception&) {
      }
      continue;
    }
    Json record = parse_json(line, metrics_path + ":" + std::to_string(line_number));
    LT_CHECK(record.is_object(), metrics_path, ":", line_number, ": not a JSON object");
    d.records.push_back(std::move(record));
  }
  LT_CHECK(!d.records.empty(), metrics_path, ": no records (has the run taken a step?)");

  const std::string checkpoint = run_dir + "/checkpoint";
  d.config = parse_json(read_file(checkpoint_folder(checkpoint) + "/config.json"), checkpoint + "/config.json");
  d.trainer_state = load_trainer_state(checkpoint);
  const std::string corpus = run_dir + "/data/corpus.json";
  if (std::filesystem::exists(corpus)) {
    const Json manifest = parse_json(read_file(corpus), corpus);
    if (manifest.contains("heldout") && manifest["heldout"].contains("unigram_entropy_nats"))
      d.unigram_entropy = manifest["heldout"]["unigram_entropy_nats"].get<double>();
  }

  LingForCausalLM model(load_checkpoint_config(checkpoint), 0);
  load_checkpoint_weights(checkpoint, model);
  std::vector<DomainText> texts = domains;
  if (texts.empty()) {
    const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer("", checkpoint, model.config().vocab_size);
    texts = embedded_heldout_domains(*tokenizer, tokens_per_domain);
    d.specialisation_source =
        "the held-out text of the five embedded corpus domains (" + std::to_string(tokens_per_domain) + " tokens each)";
  } else {
    d.specialisation_source = std::to_string(texts.size()) + " domains given with --domain";
  }
  const int64_t window = trained_window(checkpoint, model.config());
  d.specialisation = expert_specialisation(model, texts, window);
  // The starting weights: the checkpoint the run continued (post-training), else the initialisation of
  // the run's seed (LingForCausalLM initialises from the seed alone).
  const Json recipe = d.trainer_state.value("recipe", Json::object());
  const std::string init = recipe.value("init", std::string());
  if (!init.empty() && std::filesystem::exists(init)) {
    LingForCausalLM start(load_checkpoint_config(init), 0);
    load_checkpoint_weights(init, start);
    // A run with rows longer than its starting model's context extended it before its first step (RoPE has
    // no table of positions); the starting weights route in the same windows as the final ones.
    start.extend_context(window);
    d.starting_specialisation = expert_specialisation(start, texts, window);
    d.starting_point = "before the run (" + init + ")";
  } else if (init.empty() && recipe.contains("seed")) {
    LingForCausalLM start(model.config(), recipe["seed"].get<uint64_t>());
    d.starting_specialisation = expert_specialisation(start, texts, window);
    d.starting_point = "at initialisation (seed " + std::to_string(recipe["seed"].get<uint64_t>()) + ")";
  }
  return d;
}

}  // namespace lt
