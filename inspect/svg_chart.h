// The charts of the training report as inline SVG: line charts over training steps and heatmaps
// (expert load over training, domain x expert routing). Plain SVG with no script and no external
// font, so the page is one self-contained file; every chart has titled axes with units and a legend.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lt {

std::string html_escape(const std::string& text);
// A categorical colour for series i of n: the Okabe-Ito palette (distinguishable with colour-vision
// deficiencies) up to 7 series, a viridis ramp beyond.
std::string series_colour(size_t i, size_t n);

struct ChartSeries {
  std::string name;  // in the legend
  std::string colour;
  std::vector<double> x, y;
  enum class Style {
    Line,
    Faint,
    Points
  } style = Style::Line;  // Faint: thin and light, raw values behind a smoothed line; Points: dots, joined dashed
};

// A level or a moment drawn across the chart: a horizontal reference value, or a vertical event.
struct ChartMark {
  double value = 0;
  std::string label;
  std::string colour = "#777";
};

struct LineChart {
  std::string title, x_label, y_label;  // axis labels name their units
  std::vector<ChartSeries> series;
  bool log_y = false;
  std::vector<ChartMark> levels;  // horizontal, dashed
  std::vector<ChartMark> events;  // vertical, at x values
  int width = 560, height = 300;
};
std::string svg_line_chart(const LineChart& chart);

struct Heatmap {
  std::string title, x_label, y_label;
  int64_t rows = 0, columns = 0;
  std::vector<double> values;                          // [rows, columns]; NaN: no value (drawn grey)
  std::vector<std::string> row_labels, column_labels;  // thinned out when they do not fit
  // Ratio: a value relative to an ideal of 1 (blue below, white at 1, red above, log2 scale clipped at
  // 1/4 and 4). Fraction: 0 (white) to `max_value` (dark blue).
  enum class Scale { Ratio, Fraction } scale = Scale::Fraction;
  double max_value = 1;
  std::string legend;     // what a colour means, with units
  bool annotate = false;  // write each value in its cell when the cells are large enough
  int width = 560;
};
std::string svg_heatmap(const Heatmap& heatmap);

// Horizontal bars, one row per label, each row's series stacked left to right (an op family's forward and
// backward time).
struct BarSeries {
  std::string name, colour;
  std::vector<double> values;  // one per row
};
struct BarChart {
  std::string title, x_label;
  std::vector<std::string> rows;
  std::vector<BarSeries> series;
  int width = 560;
};
std::string svg_bar_chart(const BarChart& chart);

// Lanes of segments over a time axis (a step's phases and collectives, one lane per rank). A segment drawn
// `thin` sits in the lower part of its lane, over the wide ones (a collective during the backward).
struct TimelineSegment {
  size_t lane = 0;
  double start = 0, end = 0;
  std::string colour;
  bool thin = false;
};
struct Timeline {
  std::string title, x_label;
  std::vector<std::string> lanes;
  std::vector<TimelineSegment> segments;
  std::vector<std::pair<std::string, std::string>> legend;  // name, colour
  int width = 560;
};
std::string svg_timeline(const Timeline& timeline);

}  // namespace lt
