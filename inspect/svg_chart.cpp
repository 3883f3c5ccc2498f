#include "inspect/svg_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "io/format_text.h"

namespace lt {

namespace {

std::string num(double value) { return format_text("%.1f", value); }  // a coordinate

struct Rgb {
  double r, g, b;
};
std::string hex(const Rgb& c) {
  return format_text("#%02x%02x%02x", static_cast<int>(std::lround(c.r)), static_cast<int>(std::lround(c.g)),
                     static_cast<int>(std::lround(c.b)));
}
// Linear interpolation through evenly spaced colour stops, t in [0, 1].
Rgb ramp(const std::vector<Rgb>& stops, double t) {
  t = std::clamp(t, 0.0, 1.0) * static_cast<double>(stops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), stops.size() - 2);
  const double f = t - static_cast<double>(i);
  const Rgb& a = stops[i];
  const Rgb& b = stops[i + 1];
  return {a.r + f * (b.r - a.r), a.g + f * (b.g - a.g), a.b + f * (b.b - a.b)};
}
double luminance(const Rgb& c) { return (0.299 * c.r + 0.587 * c.g + 0.114 * c.b) / 255.0; }

const std::vector<Rgb> kViridis = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
// ColorBrewer RdBu, blue (below the ideal) to red (above).
const std::vector<Rgb> kDiverging = {{33, 102, 172}, {146, 197, 222}, {247, 247, 247}, {244, 165, 130}, {178, 24, 43}};
const std::vector<Rgb> kBlues = {{247, 251, 255}, {198, 219, 239}, {107, 174, 214}, {33, 113, 181}, {8, 48, 107}};

// Ticks at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi].
std::vector<double> linear_ticks(double lo, double hi, int target = 5) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / target, power = std::pow(10.0, std::floor(std::log10(raw)));
  const double unit = raw / power;
  const double step = power * (unit < 1.5 ? 1 : unit < 3.5 ? 2 : unit < 7.5 ? 5 : 10);
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

// Powers of ten over [lo, hi] (lo > 0), with 2 and 5 times them when the range spans few decades.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  const int first = static_cast<int>(std::floor(std::log10(lo))), last = static_cast<int>(std::ceil(std::log10(hi)));
  const bool fine = last - first <= 2;
  for (int p = first; p <= last; ++p)
    for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double t = m * std::pow(10.0, p);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
    }
  return ticks;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e4 && a < 1e7 && std::fmod(a, 1000) == 0) return format_text("%.0fk", v / 1000);
  if (a >= 1 && a < 1e4 && std::fmod(a, 1) == 0) return format_text("%.0f", v);  // steps: 1000, not 1e+03
  return format_text("%.3g", v);
}

// At most `limit` points: consecutive points averaged in equal buckets, so a long run's line keeps its shape.
void thin_out(std::vector<double>& x, std::vector<double>& y, size_t limit) {
  if (x.size() <= limit) return;
  std::vector<double> bx, by;
  const size_t per = (x.size() + limit - 1) / limit;
  for (size_t i = 0; i < x.size(); i += per) {
    const size_t end = std::min(x.size(), i + per);
    double sx = 0, sy = 0;
    for (size_t j = i; j < end; ++j) {
      sx += x[j];
      sy += y[j];
    }
    bx.push_back(sx / static_cast<double>(end - i));
    by.push_back(sy / static_cast<double>(end - i));
  }
  x = std::move(bx);
  y = std::move(by);
}

std::string text(double x, double y, const std::string& content, const std::string& attributes = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" " + attributes + ">" + html_escape(content) + "</text>";
}

std::string svg_open(int width, int height, const std::string& title) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 " + std::to_string(width) + " " +
         std::to_string(height) + "\" width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) +
         "\" role=\"img\" aria-label=\"" + html_escape(title) + "\">";
}

}  // namespace

std::string html_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string series_colour(size_t i, size_t n) {
  static const std::array<const char*, 7> okabe_ito = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                       "#E69F00", "#56B4E9", "#000000"};
  if (n <= okabe_ito.size()) return okabe_ito[i % okabe_ito.size()];
  // The yellow end of viridis is unreadable on white: stop at 85%.
  return hex(ramp(kViridis, 0.85 * static_cast<double>(i) / static_cast<double>(n - 1)));
}

std::string svg_line_chart(const LineChart& chart) {
  const int W = chart.width, H = chart.height;
  // The legend: swatches in rows across the top.
  std::string legend;
  double lx = 70, ly = 14;
  for (const ChartSeries& s : chart.series) {
    if (s.style == ChartSeries::Style::Faint) continue;
    const double item = 26 + 6.6 * static_cast<double>(s.name.size());
    if (lx + item > W - 10 && lx > 70) {
      lx = 70;
      ly += 16;
    }
    legend +=
        s.style == ChartSeries::Style::Points
            ? "<circle cx=\"" + num(lx + 7) + "\" cy=\"" + num(ly - 4) + "\" r=\"3.5\" fill=\"" + s.colour + "\"/>"
            : "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(lx + 14) + "\" y2=\"" +
                  num(ly - 4) + "\" stroke=\"" + s.colour + "\" stroke-width=\"2.5\"/>";
    legend += text(lx + 19, ly, s.name, "class=\"legend\"");
    lx += item;
  }
  for (const ChartMark& m : chart.levels) {
    const double item = 26 + 6.6 * static_cast<double>(m.label.size());
    if (lx + item > W - 10 && lx > 70) {
      lx = 70;
      ly += 16;
    }
    legend += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(lx + 14) + "\" y2=\"" +
              num(ly - 4) + "\" stroke=\"" + m.colour + "\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>" +
              text(lx + 19, ly, m.label, "class=\"legend\"");
    lx += item;
  }
  const double left = 70, right = W - 16, top = ly + 12, bottom = H - 44;

  // Ranges over every drawn value (and the reference levels, which are what the values are read against).
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  auto usable = [&](double y) { return std::isfinite(y) && (!chart.log_y || y > 0); };
  for (const ChartSeries& s : chart.series)
    for (size_t i = 0; i < s.x.size(); ++i)
      if (usable(s.y[i]) && std::isfinite(s.x[i])) {
        x_lo = std::min(x_lo, s.x[i]);
        x_hi = std::max(x_hi, s.x[i]);
        y_lo = std::min(y_lo, s.y[i]);
        y_hi = std::max(y_hi, s.y[i]);
      }
  std::string svg = svg_open(W, H, chart.title);
  if (!std::isfinite(x_lo)) {
    svg += text(W / 2.0, H / 2.0, "no values logged", "text-anchor=\"middle\" class=\"note\"") + "</svg>";
    return svg;
  }
  for (const ChartMark& m : chart.levels)
    if (usable(m.value)) {
      y_lo = std::min(y_lo, m.value);
      y_hi = std::max(y_hi, m.value);
    }
  if (x_hi == x_lo) x_hi = x_lo + 1;
  std::vector<double> y_ticks;
  if (chart.log_y) {
    if (y_hi / y_lo < 10) {  // at least one decade, centred on the values
      const double pad = std::sqrt(10 / (y_hi / y_lo));
      y_lo /= pad;
      y_hi *= pad;
    }
    y_ticks = log_ticks(y_lo, y_hi);
  } else {
    if (y_hi == y_lo) {
      y_lo -= std::max(std::abs(y_lo) * 0.1, 1e-12);
      y_hi += std::max(std::abs(y_hi) * 0.1, 1e-12);
    }
    const double pad = 0.05 * (y_hi - y_lo);
    y_lo -= pad;
    y_hi += pad;
    y_ticks = linear_ticks(y_lo, y_hi);
  }
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * (right - left); };
  auto py = [&](double y) {
    const double t =
        chart.log_y ? (std::log(y) - std::log(y_lo)) / (std::log(y_hi) - std::log(y_lo)) : (y - y_lo) / (y_hi - y_lo);
    return bottom - t * (bottom - top);
  };

  svg += legend;
  // Grid, ticks and axis titles.
  for (double t : y_ticks) {
    svg += "<line class=\"grid\" x1=\"" + num(left) + "\" y1=\"" + num(py(t)) + "\" x2=\"" + num(right) + "\" y2=\"" +
           num(py(t)) + "\"/>";
    svg += text(left - 6, py(t) + 4, tick_label(t), "text-anchor=\"end\" class=\"tick\"");
  }
  for (double t : linear_ticks(x_lo, x_hi, std::max(2, static_cast<int>((right - left) / 90)))) {
    if (t < x_lo || t > x_hi) continue;
    svg += "<line class=\"axis\" x1=\"" + num(px(t)) + "\" y1=\"" + num(bottom) + "\" x2=\"" + num(px(t)) + "\" y2=\"" +
           num(bottom + 4) + "\"/>";
    svg += text(px(t), bottom + 17, tick_label(t), "text-anchor=\"middle\" class=\"tick\"");
  }
  svg += "<rect class=\"frame\" x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(right - left) +
         "\" height=\"" + num(bottom - top) + "\"/>";
  svg += text((left + right) / 2, H - 8, chart.x_label, "text-anchor=\"middle\" class=\"axis-title\"");
  svg += text(0, 0, chart.y_label,
              "text-anchor=\"middle\" class=\"axis-title\" transform=\"translate(16 " + num((top + bottom) / 2) +
                  ") rotate(-90)\"");
  for (const ChartMark& m : chart.levels)
    if (usable(m.value))
      svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(py(m.value)) + "\" x2=\"" + num(right) + "\" y2=\"" +
             num(py(m.value)) + "\" stroke=\"" + m.colour + "\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"><title>" +
             html_escape(m.label + ": " + tick_label(m.value)) + "</title></line>";
  for (const ChartMark& m : chart.events)
    if (m.value >= x_lo && m.value <= x_hi)
      svg += "<line x1=\"" + num(px(m.value)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(px(m.value)) + "\" y2=\"" +
             num(bottom) + "\" stroke=\"" + m.colour + "\" stroke-width=\"1.2\" stroke-dasharray=\"2 2\"><title>" +
             html_escape(m.label) + "</title></line>";

  // The series: faint ones first, so the smoothed and held-out lines stay on top.
  for (int pass = 0; pass < 2; ++pass)
    for (const ChartSeries& s : chart.series) {
      if ((s.style == ChartSeries::Style::Faint) != (pass == 0)) continue;
      std::vector<double> xs, ys;
      for (size_t i = 0; i < s.x.size(); ++i)
        if (usable(s.y[i])) {
          xs.push_back(s.x[i]);
          ys.push_back(s.y[i]);
        }
      if (s.style == ChartSeries::Style::Points) {
        thin_out(xs, ys, 400);
        for (size_t i = 0; i < xs.size(); ++i)
          svg += "<circle cx=\"" + num(px(xs[i])) + "\" cy=\"" + num(py(ys[i])) + "\" r=\"3\" fill=\"" + s.colour +
                 "\"><title>" +
                 html_escape(s.name + " at step " + tick_label(xs[i]) + ": " + format_text("%.4g", ys[i])) +
                 "</title></circle>";
        if (xs.size() < 2) continue;
      }
      thin_out(xs, ys, 1000);
      if (xs.empty()) continue;
      std::string path;
      for (size_t i = 0; i < xs.size(); ++i) path += (i == 0 ? "M" : " L") + num(px(xs[i])) + "," + num(py(ys[i]));
      const bool faint = s.style == ChartSeries::Style::Faint;
      // Points joined by a dashed line: measured only where the points are, and told apart from a line
      // of every step in the same colour.
      const bool dashed = s.style == ChartSeries::Style::Points;
      svg += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + s.colour + "\" stroke-width=\"" +
             (faint ? "1" : dashed ? "1.5" : "2") + "\"" + (faint ? " stroke-opacity=\"0.3\"" : "") +
             (dashed ? " stroke-dasharray=\"5 3\"" : "") + " stroke-linejoin=\"round\"><title>" +
             html_escape(s.name) + "</title></path>";
    }
  return svg + "</svg>";
}

std::string svg_heatmap(const Heatmap& h) {
  const int64_t R = h.rows, C = h.columns;
  size_t label_chars = 0;
  for (const std::string& l : h.row_labels) label_chars = std::max(label_chars, l.size());
  const double left = 34 + 7.0 * static_cast<double>(label_chars), legend_width = 92;
  const double right = h.width - legend_width, top = 8;
  const double cell_w = (right - left) / static_cast<double>(std::max<int64_t>(C, 1));
  const double cell_h = std::clamp(260.0 / static_cast<double>(std::max<int64_t>(R, 1)), 2.0, 30.0);
  const double bottom = top + cell_h * static_cast<double>(R);
  // The colour bar is as tall as the map, but tall enough for its rotated title.
  const double bar_top = top,
               bar_h = std::max({80.0, std::min(bottom - top, 200.0), 6.2 * static_cast<double>(h.legend.size())});
  const int height = static_cast<int>(std::ceil(std::max(bottom + 46, bar_top + bar_h + 8)));
  std::string svg = svg_open(h.width, height, h.title);

  auto colour_of = [&](double v) -> Rgb {
    if (!std::isfinite(v)) return {200, 200, 200};
    if (h.scale == Heatmap::Scale::Ratio) return ramp(kDiverging, (std::log2(std::max(v, 1e-9)) + 2) / 4);
    return ramp(kBlues, h.max_value > 0 ? v / h.max_value : 0);
  };
  auto value_text = [&](double v) {
    return h.scale == Heatmap::Scale::Ratio ? format_text("%.2f\u00d7", v) : format_text("%.0f%%", 100 * v);
  };
  const bool annotate = h.annotate && cell_w >= 34 && cell_h >= 16;
  const bool tooltips = R * C <= 6000;  // a title per cell would make a huge heatmap's page heavy
  svg += "<g shape-rendering=\"crispEdges\">";
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const double v = h.values[static_cast<size_t>(r * C + c)];
      const Rgb colour = colour_of(v);
      const double x = left + cell_w * static_cast<double>(c), y = top + cell_h * static_cast<double>(r);
      svg += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(cell_w + 0.05) + "\" height=\"" +
             num(cell_h + 0.05) + "\" fill=\"" + hex(colour) + "\">";
      if (tooltips) {
        const std::string row =
            r < static_cast<int64_t>(h.row_labels.size()) ? h.row_labels[static_cast<size_t>(r)] : std::to_string(r);
        const std::string column = c < static_cast<int64_t>(h.column_labels.size())
                                       ? h.column_labels[static_cast<size_t>(c)]
                                       : std::to_string(c);
        svg += "<title>" +
               html_escape(h.y_label + " " + row + ", " + h.x_label + " " + column + ": " +
                           (std::isfinite(v) ? value_text(v) : "no value")) +
               "</title>";
      }
      svg += "</rect>";
      if (annotate && std::isfinite(v))
        svg += text(x + cell_w / 2, y + cell_h / 2 + 4, value_text(v),
                    std::string("text-anchor=\"middle\" class=\"cell\" fill=\"") +
                        (luminance(colour) < 0.55 ? "#fff" : "#222") + "\"");
    }
  svg += "</g><rect class=\"frame\" x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(right - left) +
         "\" height=\"" + num(bottom - top) + "\"/>";
  // Labels, thinned to one per ~11 px of rows and per label width of columns.
  const int64_t row_every = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(11.0 / cell_h)));
  for (int64_t r = 0; r < R && r < static_cast<int64_t>(h.row_labels.size()); r += row_every)
    svg += text(left - 5, top + cell_h * (static_cast<double>(r) + 0.5) + 4, h.row_labels[static_cast<size_t>(r)],
                "text-anchor=\"end\" class=\"tick\"");
  size_t column_chars = 1;
  for (const std::string& l : h.column_labels) column_chars = std::max(column_chars, l.size());
  const double column_label_width = 7.0 * static_cast<double>(column_chars) + 10;
  const int64_t column_every = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(column_label_width / cell_w)));
  for (int64_t c = 0; c < C && c < static_cast<int64_t>(h.column_labels.size()); c += column_every)
    svg += text(left + cell_w * (static_cast<double>(c) + 0.5), bottom + 15, h.column_labels[static_cast<size_t>(c)],
                "text-anchor=\"middle\" class=\"tick\"");
  svg += text((left + right) / 2, bottom + 38, h.x_label, "text-anchor=\"middle\" class=\"axis-title\"");
  svg += text(0, 0, h.y_label,
              "text-anchor=\"middle\" class=\"axis-title\" transform=\"translate(14 " + num((top + bottom) / 2) +
                  ") rotate(-90)\"");

  // The colour legend: a vertical bar with its scale.
  const double bar_x = right + 14, bar_w = 14;
  const int steps = 40;
  for (int i = 0; i < steps; ++i) {
    const double t = 1 - (i + 0.5) / steps;  // top of the bar = high values
    const Rgb c = h.scale == Heatmap::Scale::Ratio ? ramp(kDiverging, t) : ramp(kBlues, t);
    svg += "<rect x=\"" + num(bar_x) + "\" y=\"" + num(bar_top + bar_h * i / steps) + "\" width=\"" + num(bar_w) +
           "\" height=\"" + num(bar_h / steps + 0.5) + "\" fill=\"" + hex(c) + "\"/>";
  }
  svg += "<rect class=\"frame\" x=\"" + num(bar_x) + "\" y=\"" + num(bar_top) + "\" width=\"" + num(bar_w) +
         "\" height=\"" + num(bar_h) + "\"/>";
  std::vector<std::pair<double, std::string>> marks;
  if (h.scale == Heatmap::Scale::Ratio)
    marks = {{1.0, "4\u00d7"},
             {0.75, "2\u00d7"},
             {0.5, "1\u00d7 ideal"},
             {0.25, "\u00bd\u00d7"},
             {0.0, "\u00bc\u00d7 or 0"}};
  else
    marks = {
        {1.0, format_text("%.0f%%", 100 * h.max_value)}, {0.5, format_text("%.0f%%", 50 * h.max_value)}, {0.0, "0%"}};
  for (const auto& [t, label] : marks)
    svg += text(bar_x + bar_w + 4, bar_top + bar_h * (1 - t) + 4, label, "class=\"tick\"");
  svg += text(0, 0, h.legend,
              "text-anchor=\"middle\" class=\"tick\" transform=\"translate(" + num(h.width - 4.0) + " " +
                  num(bar_top + bar_h / 2) + ") rotate(-90)\"");
  return svg + "</svg>";
}

namespace {

// The frame of the two horizontal charts: a row label column on the left, an x axis with ticks over
// [0, x_max] along the bottom, a legend along the top. Returns the SVG up to its rows; x_of maps a value.
struct HorizontalFrame {
  int left = 150, right = 16, top = 28, row_height = 18, bottom = 40;
  double x_max = 1;  // > 0
  int width = 560;
  double x_of(double v) const { return left + (width - left - right) * v / x_max; }
  int height(size_t rows) const { return top + static_cast<int>(rows) * row_height + bottom; }
};

std::string horizontal_frame(const HorizontalFrame& f, size_t rows, const std::string& title,
                             const std::string& x_label, const std::vector<std::pair<std::string, std::string>>& legend,
                             const std::vector<std::string>& row_labels) {
  std::string svg = svg_open(f.width, f.height(rows), title);
  double x = f.left;
  for (const auto& [name, colour] : legend) {
    svg += "<rect x=\"" + num(x) + "\" y=\"8\" width=\"10\" height=\"10\" fill=\"" + colour + "\"/>";
    svg += text(x + 14, 17, name, "class=\"legend\"");
    x += 24 + 6.5 * static_cast<double>(name.size());
  }
  const double axis_y = f.top + static_cast<double>(rows) * f.row_height;
  for (size_t r = 0; r < rows; ++r)
    svg += text(f.left - 6, f.top + (static_cast<double>(r) + 0.7) * f.row_height, row_labels[r],
                "text-anchor=\"end\" class=\"tick\"");
  for (double t : linear_ticks(0, f.x_max)) {
    svg += "<line x1=\"" + num(f.x_of(t)) + "\" y1=\"" + num(f.top) + "\" x2=\"" + num(f.x_of(t)) + "\" y2=\"" +
           num(axis_y) + "\" class=\"grid\"/>";
    svg += text(f.x_of(t), axis_y + 14, tick_label(t), "text-anchor=\"middle\" class=\"tick\"");
  }
  svg += "<line x1=\"" + num(f.left) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(f.width - f.right) + "\" y2=\"" +
         num(axis_y) + "\" class=\"axis\"/>";
  svg += text((f.left + f.width - f.right) / 2.0, axis_y + 32, x_label, "text-anchor=\"middle\" class=\"axis-title\"");
  return svg;
}

std::string rect(double x0, double x1, double y, double height, const std::string& colour, const std::string& tip) {
  return "<rect x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(x1 - x0, 0.5)) + "\" height=\"" +
         num(height) + "\" fill=\"" + colour + "\"><title>" + html_escape(tip) + "</title></rect>";
}

}  // namespace

std::string svg_bar_chart(const BarChart& chart) {
  HorizontalFrame f;
  f.width = chart.width;
  f.x_max = 0;
  for (size_t r = 0; r < chart.rows.size(); ++r) {
    double total = 0;
    for (const BarSeries& s : chart.series) total += s.values[r];
    f.x_max = std::max(f.x_max, total);
  }
  if (!(f.x_max > 0)) f.x_max = 1;
  std::vector<std::pair<std::string, std::string>> legend;
  for (const BarSeries& s : chart.series) legend.emplace_back(s.name, s.colour);
  std::string svg = horizontal_frame(f, chart.rows.size(), chart.title, chart.x_label, legend, chart.rows);
  for (size_t r = 0; r < chart.rows.size(); ++r) {
    double at = 0;
    const double y = f.top + static_cast<double>(r) * f.row_height + 3;
    for (const BarSeries& s : chart.series) {
      const double v = s.values[r];
      if (v > 0)
        svg += rect(f.x_of(at), f.x_of(at + v), y, f.row_height - 6, s.colour,
                    chart.rows[r] + ", " + s.name + ": " + tick_label(v) + " " + chart.x_label);
      at += v;
    }
  }
  return svg + "</svg>";
}

std::string svg_timeline(const Timeline& timeline) {
  HorizontalFrame f;
  f.width = timeline.width;
  f.row_height = 26;
  f.left = 70;
  f.x_max = 0;
  for (const TimelineSegment& s : timeline.segments) f.x_max = std::max(f.x_max, s.end);
  if (!(f.x_max > 0)) f.x_max = 1;
  std::string svg =
      horizontal_frame(f, timeline.lanes.size(), timeline.title, timeline.x_label, timeline.legend, timeline.lanes);
  for (bool thin : {false, true})
    for (const TimelineSegment& s : timeline.segments) {
      if (s.thin != thin) continue;
      const double lane_top = f.top + static_cast<double>(s.lane) * f.row_height;
      const double y = thin ? lane_top + f.row_height * 0.55 : lane_top + 3;
      const double height = thin ? f.row_height * 0.35 : f.row_height - 6;
      svg += rect(f.x_of(s.start), f.x_of(s.end), y, height, s.colour,
                  timeline.lanes[s.lane] + ": " + tick_label(s.start) + " to " + tick_label(s.end) + " " +
                      timeline.x_label);
    }
  return svg + "</svg>";
}

}  // namespace lt
