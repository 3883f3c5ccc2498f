// The training report page (inspect/report.h) from made-up runs: every section is there, the heatmaps
// work for 2 experts and for 128, text from the run is escaped, and nothing outside the page is referenced.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "inspect/report.h"
#include "inspect/svg_chart.h"
#include "io/format_text.h"
#include "model/config.h"

namespace lt {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A run of `steps` steps of a model with `experts` experts in MoE layers 1 and 2, one held-out record every
// 10 steps, and a spike at step 7.
ReportData made_up_run(int64_t experts, int64_t steps) {
  LingConfig config = preset_config("tiny");
  config.num_experts = experts;
  config.num_experts_per_tok = std::min<int64_t>(2, experts);
  config.num_hidden_layers = 3;
  ReportData d;
  d.run_dir = "runs/<mine> & yours";
  d.config = config_to_json(config);
  d.trainer_state = {{"recipe", {{"stages", Json::array({{{"clip", 1.0}}})}}}};
  d.unigram_entropy = 3.5;
  for (int64_t step = 1; step <= steps; ++step) {
    Json layers = Json::array();
    for (int64_t layer : {1, 2}) {
      std::vector<int64_t> load(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) load[static_cast<size_t>(e)] = 100 + (e * 13 + step * layer) % 50;
      layers.push_back({{"layer", layer},
                        {"tokens_per_expert", load},
                        {"routing_entropy", 2.0 - 0.001 * step},
                        {"max_over_mean", 1.2}});
    }
    Json r = {{"step", step},
              {"loss", 5.0 / std::sqrt(step)},
              {"lm_loss", 5.0 / std::sqrt(step)},
              {"lr", 1e-3},
              {"grad_norm", 1.0 / step},
              {"balance_loss", 2.01},
              {"z_loss", 3.0},
              {"tokens_per_s", 20000.0},
              {"tokens", step * 1000},
              {"elapsed_s", 0.1 * step},
              {"moe_layers", layers}};
    if (step % 10 == 0) r["val_loss"] = 5.2 / std::sqrt(step);
    if (step == 7) r["spike"] = {{"kind", "loss"}, {"z", 9.5}, {"action", "retry"}};
    d.records.push_back(r);
  }
  for (int64_t layer : {1, 2}) {
    LayerSpecialisation s;
    s.layer = layer;
    s.num_experts = experts;
    s.top_k = config.num_experts_per_tok;
    s.domains = {"prose", "code"};
    s.domain_tokens = {10, 10};
    s.domain_expert.assign(static_cast<size_t>(2 * experts), 1);
    s.coactivation.assign(static_cast<size_t>(experts * experts), 0.01);
    s.mutual_information_bits = 0.25;
    s.max_mutual_information_bits = 1.0;
    d.specialisation.push_back(s);
  }
  d.specialisation_source = "two made-up domains";
  d.starting_specialisation = d.specialisation;
  for (LayerSpecialisation& s : d.starting_specialisation) s.mutual_information_bits = 0.125;
  d.starting_point = "at initialisation (seed 1)";
  return d;
}

void expect_a_whole_page(const std::string& html) {
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const std::string& id : report_section_ids()) EXPECT_EQ(count(html, "<section id=\"" + id + "\">"), 1u) << id;
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  EXPECT_EQ(count(html, "<section"), count(html, "</section>"));
  // Self-contained and static: no script, no reference to anything outside the file.
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_FALSE(std::regex_search(html, std::regex(R"((src|href)=\"(https?:)?//)")));
  // No number printed from a NaN or an infinity.
  EXPECT_FALSE(std::regex_search(html, std::regex(R"([^a-z](nan|inf)[^a-z])")));
  EXPECT_EQ(count(html, "no values logged"), 0u);
}

TEST(Report, HasEverySectionForTwoExperts) {
  const ReportData d = made_up_run(2, 45);
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  // The run's name is text, never markup.
  EXPECT_EQ(count(html, "<mine>"), 0u);
  EXPECT_GE(count(html, "runs/&lt;mine&gt; &amp; yours"), 2u);
  EXPECT_EQ(count(html, "Expert load over training, layer 1"), 2u);  // the figure's caption and the SVG's label
  EXPECT_EQ(count(html, "Expert load over training, layer 2"), 2u);
  // The spike: a row of the table and a mark on the loss chart.
  EXPECT_NE(html.find("<td>7</td><td>loss</td><td>9.5</td><td>retry</td>"), std::string::npos);
  EXPECT_NE(html.find("step 7: loss spike, retry"), std::string::npos);
  EXPECT_NE(html.find("unigram entropy"), std::string::npos);
  // Each layer's mutual information beside its value at the start.
  EXPECT_NE(html.find("<th>at initialisation (seed 1)</th>"), std::string::npos);
  EXPECT_EQ(count(html, "<td>0.250 bits</td><td>1.000 bits</td><td>25%</td><td>0.125 bits</td>"), 2u);
}

TEST(Report, ScalesTo128Experts) {
  const ReportData d = made_up_run(128, 300);
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  // 128 experts x 120 step columns per load heatmap, 2 x 128 domain cells and 128 x 128 co-activation cells.
  EXPECT_GE(count(html, "<rect"), 2u * (128 * 120 + 2 * 128 + 128 * 128));
  // Labels thinned out so they do not overlap: far fewer than one per expert.
  EXPECT_LT(html.size(), 12u << 20);
}

TEST(Report, NoCoactivationWithOneExpertPerToken) {
  ReportData d = made_up_run(2, 20);
  d.config["num_experts_per_tok"] = 1;
  for (LayerSpecialisation& s : d.specialisation) s.top_k = 1;
  const std::string html = training_report_html(d);
  EXPECT_EQ(count(html, "Expert co-activation"), 0u);
  EXPECT_EQ(count(html, "Domain \u00d7 expert, layer"), 4u);  // two layers' caption and SVG label
}

TEST(Report, SaysSoWhenNothingHappened) {
  ReportData d = made_up_run(8, 20);
  for (Json& r : d.records) r.erase("spike");
  const std::string html = training_report_html(d);
  EXPECT_NE(html.find("the spike guard never acted"), std::string::npos);
}

// Two ranks, steps 10 and 20 profiled, rank 1 named slow from step 12 on: the profile's op bars (mean over
// the profiled steps and ranks), a timeline lane per rank with its collectives, and the slow rank.
TEST(Report, DrawsTheProfileAndTheSlowRank) {
  ReportData d = made_up_run(8, 24);
  for (Json& r : d.records) {
    const int64_t step = r.value("step", int64_t{0});
    r["rank_step_s"] = Json::array({0.010, step >= 9 ? 0.030 : 0.011});
    if (step >= 12) r["slow_ranks"] = Json::array({{{"rank", 1}, {"times_median", 3.0}, {"part", "forward"}}});
    if (step % 10 != 0 || step == 0) continue;
    Json ranks = Json::array();
    for (int rank : {0, 1})
      ranks.push_back({{"rank", rank},
                       {"step_ms", 5.0},
                       {"pool_wait_ms", 0.25},
                       {"ops", Json::array({{{"op", "matmul"}, {"phase", "forward"}, {"ms", 1.0 + rank}, {"calls", 3}},
                                            {{"op", "matmul"}, {"phase", "backward"}, {"ms", 2.0}, {"calls", 6}},
                                            {{"op", "adamw"}, {"phase", "optimizer"}, {"ms", 0.5}, {"calls", 1}}})},
                       {"collectives",
                        Json::array({{{"op", "all_reduce"}, {"calls", 2}, {"bytes", 3000000}, {"ms", 1.5}}})},
                       {"timeline", Json::array({{{"part", "forward"}, {"start_ms", 0.0}, {"end_ms", 1.0}},
                                                 {{"part", "backward"}, {"start_ms", 1.0}, {"end_ms", 4.0}},
                                                 {{"part", "all_reduce"}, {"collective", true}, {"start_ms", 2.0},
                                                  {"end_ms", 3.5}}})}});
    r["profile"] = ranks;
  }
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  EXPECT_NE(html.find("matmul, forward: 1.5 milliseconds per profiled step"), std::string::npos);
  EXPECT_NE(html.find("matmul, backward: 2 milliseconds per profiled step"), std::string::npos);
  EXPECT_NE(html.find("Timeline of step 20"), std::string::npos);
  EXPECT_NE(html.find("rank 1: 2 to 3.5 milliseconds"), std::string::npos);  // its all-reduce
  EXPECT_EQ(count(html, "<tr><td>0</td><td>5.00</td><td>0.25</td><td>1.50</td><td>3.00</td></tr>"), 1u);
  EXPECT_NE(html.find("<tr><td>12</td><td>1</td><td>3.00</td><td>forward</td></tr>"), std::string::npos);
}

TEST(Report, SaysSoWithoutAProfileOrRanks) {
  const std::string html = training_report_html(made_up_run(8, 20));
  EXPECT_NE(html.find("This run was not profiled"), std::string::npos);
  EXPECT_NE(html.find("One process: no ranks to compare."), std::string::npos);
}

// The summary table's row `name`, as its HTML.
std::string summary_row(const std::string& html, const std::string& name) {
  const size_t at = html.find("<tr><th>" + name + "</th><td>");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</tr>", at) + 5 - at);
}

// `run` turned into a post-training run of `kind` ("sft" or "dpo"), as its checkpoint records it.
void make_post_training(ReportData& run, const std::string& kind) {
  Json stage = {{"name", kind}, {"kind", kind}, {"clip", 1.0}, {"epochs", 1}};
  if (kind == "dpo") {
    stage["beta"] = 0.5;
    stage["rpo_alpha"] = 10.0;
  }
  run.trainer_state = {{"recipe", {{"model", "tiny"}, {"seed", 1}, {"routing_warmup", 0}, {"init", "sft/checkpoint"},
                                   {"stages", Json::array({stage})}}}};
  run.unigram_entropy = NAN;  // no embedded corpus in a post-training run
}

TEST(Report, NamesThePreTrainingLossAndItsRoutingWarmup) {
  ReportData d = made_up_run(8, 40);
  d.trainer_state["recipe"]["routing_warmup"] = 50;
  const std::string html = training_report_html(d);
  EXPECT_NE(html.find("The loss is the mean next-token cross-entropy, in nats per token"), std::string::npos);
  EXPECT_NE(html.find("For the first 50 steps, stochastic routing warmup keeps the load even"), std::string::npos);
}

TEST(Report, SftRunNamesItsLossAndNoRoutingWarmup) {
  ReportData d = made_up_run(8, 40);
  make_post_training(d, "sft");
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  EXPECT_NE(html.find("The loss is the mean cross-entropy of the assistant's tokens"), std::string::npos)
      << html.substr(html.find("<section id=\"summary\">"), 400);
  EXPECT_EQ(count(html, "next-token"), 0u);
  EXPECT_EQ(count(html, "routing warmup keeps"), 0u);
  EXPECT_NE(html.find("(this run had no routing warmup)"), std::string::npos);
  EXPECT_EQ(count(html, "Reward accuracy"), 0u);  // no DPO figures
  // Its starting weights are a trained checkpoint, not a random router.
  EXPECT_NE(html.find("The run started from trained weights"), std::string::npos);
  EXPECT_EQ(count(html, "A random router"), 0u);
}

// A DPO run of 20 steps with held-out figures before training (step 0), at step 10 and, as the trainer
// writes at the end of a run, over all the held-out data at step 20.
ReportData made_up_dpo_run(bool with_end_record) {
  ReportData d = made_up_run(8, 20);
  make_post_training(d, "dpo");
  auto heldout = [](int64_t step, double loss, double accuracy, double margin) {
    return Json{{"step", step},           {"val_loss", loss},
                {"eval_rewards/chosen", margin / 2}, {"eval_rewards/rejected", -margin / 2},
                {"eval_rewards/accuracies", accuracy}, {"eval_rewards/margins", margin},
                {"eval_dpo_loss", loss / 2}};
  };
  for (Json& r : d.records) {
    r.erase("val_loss");
    const double step = r["step"].get<double>();
    r["rewards/chosen"] = 0.01 * step;
    r["rewards/rejected"] = -0.02 * step;
    r["rewards/margins"] = 0.03 * step;
    r["rewards/accuracies"] = std::min(1.0, 0.05 * step);
  }
  Json before = heldout(0, 7.5, 0.0, 0.0);
  before["stage"] = "dpo";
  d.records.insert(d.records.begin(), before);
  d.records.insert(d.records.begin() + 11, heldout(10, 6.0, 0.625, 0.75));  // after step 10's record
  if (with_end_record) {
    Json end = heldout(20, 5.25, 0.875, 1.5);
    end["heldout"] = "end";
    d.records.push_back(end);
  }
  return d;
}

TEST(Report, DpoRunNamesItsLossAndShowsHeldOutRewardsFromTheEnd) {
  const ReportData d = made_up_dpo_run(true);
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  EXPECT_EQ(count(html, "next-token"), 0u);
  EXPECT_NE(html.find("The loss is the DPO loss: sigmoid DPO"), std::string::npos);
  EXPECT_NE(html.find("\u03b2 = 0.5"), std::string::npos);
  EXPECT_NE(html.find("rpo_alpha = 10 times the mean negative log-likelihood of the chosen responses"),
            std::string::npos);
  EXPECT_NE(html.find(">loss (nats)<"), std::string::npos);  // the loss chart's axis: not per token
  // The summary takes the end record (over all the held-out data), with the figures before training.
  EXPECT_EQ(summary_row(html, "last held-out loss"),
            "<tr><th>last held-out loss</th><td>5.2500 nats at step 20, over all the held-out data (7.5000 nats "
            "before training)</td></tr>");
  EXPECT_EQ(summary_row(html, "held-out reward accuracy"),
            "<tr><th>held-out reward accuracy</th><td>87.5% of pairs at step 20, over all the held-out data (0.0% of "
            "pairs before training)</td></tr>");
  EXPECT_NE(summary_row(html, "held-out reward margin (chosen \u2212 rejected)").find("1.5000 nats at step 20"),
            std::string::npos);
  // The end record is its own series on the loss chart; the rewards and their accuracy are drawn, the
  // held-out ones as points.
  EXPECT_NE(html.find(">held-out loss at the end, all the held-out data<"), std::string::npos);
  EXPECT_NE(html.find("held-out loss at step 10: 6<"), std::string::npos);
  EXPECT_NE(html.find("held-out margin at step 20: 1.5<"), std::string::npos);
  EXPECT_NE(html.find("held-out at step 20: 0.875<"), std::string::npos);
  EXPECT_NE(html.find("held-out chosen at step 10: 0.375<"), std::string::npos);
  EXPECT_EQ(count(html, "Reward accuracy"), 2u);  // the caption and the SVG's label
}

TEST(Report, TakesTheLastHeldOutFigureWithoutAnEndRecord) {
  const ReportData d = made_up_dpo_run(false);
  const std::string html = training_report_html(d);
  expect_a_whole_page(html);
  EXPECT_EQ(summary_row(html, "last held-out loss"),
            "<tr><th>last held-out loss</th><td>6.0000 nats at step 10 (7.5000 nats before training)</td></tr>");
  EXPECT_EQ(count(html, "all the held-out data"), 0u);

  // A run shorter than its evaluation period: only the figures before training, said as such.
  ReportData short_run = made_up_dpo_run(false);
  short_run.records.erase(short_run.records.begin() + 11);
  const std::string page = training_report_html(short_run);
  EXPECT_EQ(summary_row(page, "held-out reward accuracy"),
            "<tr><th>held-out reward accuracy</th><td>0.0% of pairs before training (step 0), none logged after "
            "it</td></tr>");
}

TEST(Report, CallsNoSinglePointSmoothed) {
  ReportData one = made_up_run(8, 1);
  const std::string html = training_report_html(one);
  expect_a_whole_page(html);
  EXPECT_EQ(count(html, "smoothed"), 0u);
  EXPECT_EQ(count(html, "moving average"), 0u);
  EXPECT_EQ(summary_row(html, "final train loss (last step)"),
            "<tr><th>final train loss (last step)</th><td>5.0000 nats per token</td></tr>");

  // 20 steps: a 5-step window; the final figure is the mean of the last 5 steps, not the last step alone
  // (where the centred average has narrowed to one point).
  const ReportData twenty = made_up_run(8, 20);
  const std::string page = training_report_html(twenty);
  EXPECT_EQ(count(page, "smoothed"), 0u);
  EXPECT_NE(page.find(">train loss (moving average of 5 steps)<"), std::string::npos);
  // 4 steps: no point has more than 3 in its centred window.
  EXPECT_NE(training_report_html(made_up_run(8, 4)).find(">train loss (moving average of 3 steps)<"),
            std::string::npos);
  double mean = 0;
  for (int step = 16; step <= 20; ++step) mean += 5.0 / std::sqrt(step) / 5;
  EXPECT_EQ(summary_row(page, "final train loss (mean of the last 5 steps)"),
            "<tr><th>final train loss (mean of the last 5 steps)</th><td>" + format_text("%.4f", mean) +
                " nats per token</td></tr>");
}

TEST(SvgChart, LineChartDrawsSeriesLevelsAndLogScale) {
  LineChart chart;
  chart.title = "t";
  chart.x_label = "training step";
  chart.y_label = "loss";
  chart.series = {{"a", "#000", {1, 2, 3}, {3, 2, 1}}, {"b", "#111", {1, 3}, {2.5, 1.5}, ChartSeries::Style::Points}};
  chart.levels = {{1.7, "level", "#777"}};
  const std::string svg = svg_line_chart(chart);
  EXPECT_EQ(count(svg, "<path"), 2u);         // a's line and b's, joining its points
  EXPECT_EQ(count(svg, "stroke-dasharray=\"5 3\""), 1u);  // b's: it was measured only at its points
  EXPECT_EQ(count(svg, "<circle"), 2u + 1u);  // b's points and its legend swatch
  EXPECT_NE(svg.find(">training step<"), std::string::npos);
  EXPECT_NE(svg.find(">level<"), std::string::npos);
  chart.log_y = true;
  chart.series[0].y = {100, 0, 0.01};  // 0 cannot be drawn on a log axis: dropped, not a NaN coordinate
  const std::string log_svg = svg_line_chart(chart);
  EXPECT_EQ(count(log_svg, "nan"), 0u);
  EXPECT_NE(log_svg.find(">100<"), std::string::npos);
  EXPECT_NE(log_svg.find(">0.01<"), std::string::npos);
  LineChart empty;
  EXPECT_NE(svg_line_chart(empty).find("no values logged"), std::string::npos);
}

TEST(SvgChart, HeatmapColoursAndLegends) {
  Heatmap h;
  h.rows = 1;
  h.columns = 3;
  h.values = {0.25, 1.0, 4.0};
  h.scale = Heatmap::Scale::Ratio;
  h.legend = "load / ideal";
  const std::string svg = svg_heatmap(h);
  // Ratio scale: a quarter of the ideal is the bluest, the ideal white-grey, four times red.
  EXPECT_NE(svg.find("fill=\"#2166ac\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#f7f7f7\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#b2182b\""), std::string::npos);
  EXPECT_NE(svg.find("1\u00d7 ideal"), std::string::npos);
  EXPECT_EQ(html_escape("<a href=\"x\">&</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
}

}  // namespace
}  // namespace lt
