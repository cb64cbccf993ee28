// PNG figures drawn with cairo: heatmaps with a colour bar, and grouped bar charts.
#pragma once
#include <string>
#include <vector>

namespace emoe {

struct HeatmapSpec {
  std::string title, x_label, y_label, value_label;
  std::vector<std::vector<double>> values;             // [row][column]; rows drawn top to bottom
  std::vector<std::string> row_labels, column_labels;  // may be shorter: every k-th is shown
  double vmin = 0, vmax = -1;                          // vmax < vmin: from the data
  // Signed values (differences): blue below 0, white at 0, red above, on a range symmetric
  // about 0 (from the data: +-max |value|). Panels share the first panel's choice.
  bool diverging = false;
  // Optional numeric x axis (e.g. training steps): column c spans (column_ends[c-1],
  // column_ends[c]] from 0, drawn to scale, with evenly spaced round ticks (axis_ticks) instead of
  // column_labels. One per column, increasing.
  std::vector<double> column_ends;
  // Each cell's value written in it (small grids, e.g. a k/N sweep).
  bool annotate = false;
};

// Round tick values 0, s, 2s, ... <= hi, with s = 1, 2 or 5 x 10^k (about 4 intervals).
std::vector<double> axis_ticks(double hi);

struct BarSeries {
  std::string name;
  std::vector<double> values;  // one per category
};
struct BarChartSpec {
  std::string title, y_label;
  std::vector<std::string> categories;
  std::vector<BarSeries> series;
};

// Writes the figure atomically; RuntimeError when cairo cannot.
void write_heatmap_png(const std::string& path, const HeatmapSpec& spec);
void write_bar_chart_png(const std::string& path, const BarChartSpec& spec);

// Several heatmaps side by side in one figure (shared colour scale), e.g. train / dev / OOD.
void write_heatmap_panels_png(const std::string& path, const std::string& title,
                              const std::vector<HeatmapSpec>& panels);

}  // namespace emoe
