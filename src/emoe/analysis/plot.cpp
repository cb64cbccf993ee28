// Figures with cairo (image surface -> PNG).
#include "emoe/analysis/plot.h"

#include <cairo/cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "emoe/core/error.h"

namespace emoe {

namespace {

// Viridis, sampled at 9 points and interpolated.
void plot_viridis(double t, double& r, double& g, double& b) {
  static const double k[9][3] = {
      {0.267, 0.005, 0.329}, {0.283, 0.141, 0.458}, {0.254, 0.265, 0.530},
      {0.207, 0.372, 0.553}, {0.164, 0.471, 0.558}, {0.128, 0.567, 0.551},
      {0.135, 0.659, 0.518}, {0.267, 0.749, 0.441}, {0.993, 0.906, 0.144}};
  t = std::clamp(t, 0.0, 1.0) * 8.0;
  int i = std::min(7, static_cast<int>(t));
  double f = t - i;
  r = k[i][0] + f * (k[i + 1][0] - k[i][0]);
  g = k[i][1] + f * (k[i + 1][1] - k[i][1]);
  b = k[i][2] + f * (k[i + 1][2] - k[i][2]);
}

// Blue (t = 0) - white (0.5) - red (1), for signed values centred on 0.
void plot_diverging(double t, double& r, double& g, double& b) {
  static const double lo[3] = {0.23, 0.30, 0.75}, hi[3] = {0.71, 0.02, 0.15};
  t = std::clamp(t, 0.0, 1.0);
  const double* end = t < 0.5 ? lo : hi;
  const double f = std::fabs(t - 0.5) * 2.0;  // 0 at white, 1 at the end colour
  r = 1.0 + f * (end[0] - 1.0);
  g = 1.0 + f * (end[1] - 1.0);
  b = 1.0 + f * (end[2] - 1.0);
}

void plot_colour(bool diverging, double t, double& r, double& g, double& b) {
  if (diverging)
    plot_diverging(t, r, g, b);
  else
    plot_viridis(t, r, g, b);
}

void plot_text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = 0,
               bool bold = false, bool vertical = false, double shade = 0.1) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  if (vertical) cairo_rotate(cr, -M_PI / 2);
  cairo_move_to(cr, -align * ext.width, ext.height / 2);
  cairo_set_source_rgb(cr, shade, shade, shade);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

std::string plot_number(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1e6 || std::fabs(v) < 0.01) return fmt::format("{:.1e}", v);
  if (std::fabs(v) >= 10) return fmt::format("{:.0f}", v);
  return fmt::format("{:.2f}", v);
}

// A colour-bar label: plot_number, with enough decimals that ticks `span` apart differ.
std::string plot_tick_number(double v, double span) {
  const double a = std::fabs(v);
  if (v == 0 || a >= 1e6 || a < 0.01) return plot_number(v);
  const double step = span / 4.0;
  if (step >= 1) return fmt::format("{:.0f}", v);
  if (step >= 0.1) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

// A "nice" axis maximum and step (1, 2 or 5 x 10^k) covering hi with about 4 ticks.
void plot_nice_axis(double hi, double& top, double& step) {
  double raw = hi / 4.0;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  top = std::ceil(hi / step) * step;
}

// x position of the value v on a numeric column axis ending at hi.
double plot_axis_x(double x, double w, double v, double hi) {
  return x + w * v / hi;
}

void plot_save(cairo_surface_t* surface, const std::string& path) {
  auto tmp = path + ".tmp.png";
  auto st = cairo_surface_write_to_png(surface, tmp.c_str());
  cairo_surface_destroy(surface);
  EMOE_CHECK(st == CAIRO_STATUS_SUCCESS, RuntimeError, "{}: cannot write PNG: {}", path,
             cairo_status_to_string(st));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: rename failed: {}", path, ec.message());
}

void plot_range(const std::vector<HeatmapSpec>& specs, double& lo, double& hi) {
  lo = specs[0].vmin;
  hi = specs[0].vmax;
  if (hi >= lo) return;
  lo = std::numeric_limits<double>::infinity();
  hi = -lo;
  for (const auto& s : specs)
    for (const auto& row : s.values)
      for (double v : row) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (specs[0].diverging) {  // symmetric: white is 0
    hi = std::max(std::fabs(lo), std::fabs(hi));
    if (hi <= 0) hi = 1;
    lo = -hi;
    return;
  }
  lo = std::min(lo, 0.0);
  if (hi <= lo) hi = lo + 1;
}

// Draws one heatmap panel inside the box (x, y, w, h) of the plotting area.
void plot_panel(cairo_t* cr, const HeatmapSpec& s, double x, double y, double w, double h,
                double lo, double hi) {
  const size_t rows = s.values.size(), cols = rows ? s.values[0].size() : 0;
  const bool numeric = cols > 0 && s.column_ends.size() == cols && s.column_ends[0] > 0 &&
                       std::adjacent_find(s.column_ends.begin(), s.column_ends.end(),
                                          std::greater_equal<double>()) == s.column_ends.end();
  if (rows && cols) {
    const double cw = w / static_cast<double>(cols), ch = h / static_cast<double>(rows);
    const double end = numeric ? s.column_ends.back() : 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        double R, G, B;
        plot_colour(s.diverging, (s.values[r][c] - lo) / (hi - lo), R, G, B);
        cairo_set_source_rgb(cr, R, G, B);
        double x0 = x + c * cw, x1 = x0 + cw;
        if (numeric) {
          x0 = plot_axis_x(x, w, c ? s.column_ends[c - 1] : 0.0, end);
          x1 = plot_axis_x(x, w, s.column_ends[c], end);
        }
        cairo_rectangle(cr, x0, y + r * ch, x1 - x0 + 0.5, ch + 0.5);
        cairo_fill(cr);
        if (s.annotate && std::isfinite(s.values[r][c])) {
          const double luminance = 0.299 * R + 0.587 * G + 0.114 * B;  // light text on dark
          plot_text(cr, (x0 + x1) / 2, y + (r + 0.5) * ch, fmt::format("{:.2f}", s.values[r][c]),
                    11, 0.5, false, false, luminance < 0.5 ? 0.95 : 0.1);
        }
      }
    auto ticks = [](size_t n) { return std::max<size_t>(1, (n + 15) / 16); };
    for (size_t r = 0; r < rows && r < s.row_labels.size(); r += ticks(rows))
      plot_text(cr, x - 6, y + (r + 0.5) * ch, s.row_labels[r], 11, 1.0);
    if (numeric) {
      cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
      cairo_set_line_width(cr, 1);
      for (double t : axis_ticks(end)) {
        const double tx = plot_axis_x(x, w, t, end);
        cairo_move_to(cr, tx, y + h);
        cairo_line_to(cr, tx, y + h + 4);
        cairo_stroke(cr);
        plot_text(cr, tx, y + h + 12, fmt::format("{:g}", t), 11, 0.5);
      }
    }
    size_t longest = 0;
    for (const auto& l : s.column_labels) longest = std::max(longest, l.size());
    const bool vertical = longest * 7.0 > cw;  // labels wider than their cells stand upright
    for (size_t c = 0; !numeric && c < cols && c < s.column_labels.size(); c += ticks(cols)) {
      if (vertical)
        plot_text(cr, x + (c + 0.5) * cw, y + h + 6, s.column_labels[c], 10, 1.0, false, true);
      else
        plot_text(cr, x + (c + 0.5) * cw, y + h + 12, s.column_labels[c], 11, 0.5);
    }
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x, y, w, h);
  cairo_stroke(cr);
  plot_text(cr, x + w / 2, y - 14, s.title, 13, 0.5, true);
  size_t longest_label = 0;
  for (const auto& l : s.column_labels)
    if (!numeric) longest_label = std::max(longest_label, l.size());
  const bool upright = cols > 0 && longest_label * 7.0 > w / static_cast<double>(cols);
  plot_text(cr, x + w / 2, y + h + (upright ? 20 + 6.5 * longest_label : 32), s.x_label, 12, 0.5);
  plot_text(cr, x - 44, y + h / 2, s.y_label, 12, 0.5, false, true);
}

void plot_colorbar(cairo_t* cr, double x, double y, double h, double lo, double hi,
                   const std::string& label, bool diverging) {
  const int steps = 100;
  for (int i = 0; i < steps; ++i) {
    double R, G, B;
    plot_colour(diverging, 1.0 - static_cast<double>(i) / steps, R, G, B);
    cairo_set_source_rgb(cr, R, G, B);
    cairo_rectangle(cr, x, y + h * i / steps, 16, h / steps + 0.5);
    cairo_fill(cr);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_rectangle(cr, x, y, 16, h);
  cairo_stroke(cr);
  for (int t = 0; t <= 4; ++t) {
    double v = lo + (hi - lo) * t / 4.0;
    plot_text(cr, x + 22, y + h - h * t / 4.0, plot_tick_number(v, hi - lo), 11, 0.0);
  }
  plot_text(cr, x + 70, y + h / 2, label, 12, 0.5, false, true);
}

}  // namespace

std::vector<double> axis_ticks(double hi) {
  if (!(hi > 0) || !std::isfinite(hi)) return {0.0};
  double top, step;
  plot_nice_axis(hi, top, step);
  std::vector<double> out;
  // an index times the step, not a running sum: no drift, so the ticks stay evenly spaced
  for (int64_t i = 0; static_cast<double>(i) * step <= hi * (1 + 1e-12); ++i)
    out.push_back(static_cast<double>(i) * step);
  return out;
}

void write_heatmap_panels_png(const std::string& path, const std::string& title,
                              const std::vector<HeatmapSpec>& panels) {
  EMOE_CHECK(!panels.empty(), InputError, "{}: nothing to draw", path);
  double lo, hi;
  plot_range(panels, lo, hi);
  const double pw = panels.size() == 1 ? 560 : 380, ph = 380, left = 80,
               top = panels.size() == 1 ? 50 : 70, gap = 90;
  const int width = static_cast<int>(left + panels.size() * pw + (panels.size() - 1) * gap + 130);
  size_t longest = 0;
  for (const auto& p : panels)
    for (const auto& l : p.column_labels)
      if (p.column_ends.empty()) longest = std::max(longest, l.size());
  const int height = static_cast<int>(top + ph + 70 + 6.5 * longest);
  auto* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  auto* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  if (panels.size() > 1) plot_text(cr, width / 2.0, 22, title, 15, 0.5, true);
  for (size_t i = 0; i < panels.size(); ++i)
    plot_panel(cr, panels[i], left + i * (pw + gap), top, pw, ph, lo, hi);
  plot_colorbar(cr, width - 110, top, ph, lo, hi, panels[0].value_label, panels[0].diverging);
  cairo_destroy(cr);
  plot_save(surface, path);
}

void write_heatmap_png(const std::string& path, const HeatmapSpec& spec) {
  write_heatmap_panels_png(path, spec.title, {spec});
}

void write_bar_chart_png(const std::string& path, const BarChartSpec& spec) {
  // wide enough for the legend's row of series names too
  const double left = 80, top = 60,
               pw = std::max({420.0, 70.0 * static_cast<double>(spec.categories.size()),
                              150.0 * static_cast<double>(spec.series.size()) - 10}),
               ph = 320;
  const int width = static_cast<int>(left + pw + 40), height = static_cast<int>(top + ph + 90);
  auto* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  auto* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  plot_text(cr, width / 2.0, 22, spec.title, 15, 0.5, true);
  double hi = 0, step = 0;
  for (const auto& s : spec.series)
    for (double v : s.values) hi = std::max(hi, v);
  if (hi <= 0) hi = 1;
  plot_nice_axis(hi * 1.02, hi, step);
  cairo_set_line_width(cr, 1);
  // eight series before a colour repeats (the out-of-domain sets of SST-2 are eight)
  static const double colors[8][3] = {{0.18, 0.45, 0.70}, {0.90, 0.49, 0.13}, {0.30, 0.65, 0.30},
                                      {0.75, 0.25, 0.30}, {0.55, 0.40, 0.70}, {0.50, 0.50, 0.50},
                                      {0.85, 0.70, 0.10}, {0.20, 0.70, 0.75}};
  for (double v = 0; v <= hi + step * 1e-6; v += step) {
    plot_text(cr, left - 6, top + ph - ph * v / hi, plot_number(v), 11, 1.0);
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_move_to(cr, left + 1, top + ph - ph * v / hi);
    cairo_line_to(cr, left + pw, top + ph - ph * v / hi);
    cairo_stroke(cr);
  }
  const size_t nc = spec.categories.size(), ns = std::max<size_t>(1, spec.series.size());
  const double group = pw / std::max<size_t>(1, nc), bar = group * 0.8 / ns;
  for (size_t c = 0; c < nc; ++c) {
    for (size_t s = 0; s < spec.series.size(); ++s) {
      double v = c < spec.series[s].values.size() ? spec.series[s].values[c] : 0;
      double bh = ph * v / hi;
      cairo_set_source_rgb(cr, colors[s % 8][0], colors[s % 8][1], colors[s % 8][2]);
      cairo_rectangle(cr, left + c * group + group * 0.1 + s * bar, top + ph - bh, bar * 0.95, bh);
      cairo_fill(cr);
    }
    plot_text(cr, left + (c + 0.5) * group, top + ph + 14, spec.categories[c], 11, 0.5);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_move_to(cr, left, top);
  cairo_line_to(cr, left, top + ph);
  cairo_line_to(cr, left + pw, top + ph);
  cairo_stroke(cr);
  plot_text(cr, 20, top + ph / 2, spec.y_label, 12, 0.5, false, true);
  for (size_t s = 0; s < spec.series.size(); ++s) {
    double lx = left + 10 + s * 150, ly = top + ph + 45;
    cairo_set_source_rgb(cr, colors[s % 8][0], colors[s % 8][1], colors[s % 8][2]);
    cairo_rectangle(cr, lx, ly - 6, 12, 12);
    cairo_fill(cr);
    plot_text(cr, lx + 18, ly, spec.series[s].name, 12, 0.0);
  }
  cairo_destroy(cr);
  plot_save(surface, path);
}

}  // namespace emoe
