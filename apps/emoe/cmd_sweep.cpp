// `emoe sweep --config run.yaml --grid lr=... --seeds 0,1,2 [--methods ...]`: the papers'
// protocol — best epoch per run, the grid point chosen by the mean over seeds — and a
// mean ± std table per method.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "commands.h"
#include "emoe/analysis/plot.h"
#include "emoe/core/error.h"
#include "emoe/eval/metrics.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/loader.h"
#include "emoe/train/run_data.h"
#include "emoe/train/trainer.h"

namespace emoe::cli {
namespace {
namespace fs = std::filesystem;

struct SweepArgs {
  std::string config, output;
  std::vector<std::string> grid, sets, method_sets;
  std::vector<std::string> seeds = {"0"}, methods;
  RunConfigFlags run_flags;
};

// A list flag's values without empty entries (`--seeds 0,,1`).
std::vector<std::string> non_empty(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const auto& v : values)
    if (!v.empty()) out.push_back(v);
  return out;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

// A comma list of a flag with no value given twice (two runs would share one output folder).
void check_no_repeats(const std::vector<std::string>& values, const std::string& flag,
                      const std::string& what) {
  std::set<std::string> seen;
  for (const auto& v : values)
    EMOE_CHECK(seen.insert(v).second, UsageError, "{}: {} '{}' is listed twice", flag, what, v);
}

// A --grid option's key (the short names spelled out) and its values.
std::pair<std::string, std::vector<std::string>> grid_axis(const std::string& g) {
  auto eq = g.find('=');
  EMOE_CHECK(eq != std::string::npos && eq > 0, UsageError, "--grid {}: expected key=v1,v2,...", g);
  std::string key = g.substr(0, eq);
  if (key == "lr" || key == "epochs" || key == "batch_size" || key == "seed") key = "train." + key;
  return {key, split_commas(g.substr(eq + 1))};
}

// The grid: the cartesian product of key=v1,v2 options ("lr" is short for train.lr); the first
// option varies slowest.
std::vector<std::vector<std::string>> grid_points(const std::vector<std::string>& grid) {
  std::vector<std::vector<std::string>> points = {{}};
  std::set<std::string> keys;
  for (const auto& g : grid) {
    const auto [key, values] = grid_axis(g);
    EMOE_CHECK(keys.insert(key).second, UsageError, "--grid {}: key '{}' is given twice", g, key);
    EMOE_CHECK(!values.empty(), UsageError, "--grid {}: expected key=v1,v2,...", g);
    check_no_repeats(values, "--grid " + g, "value");
    std::vector<std::vector<std::string>> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        auto q = p;
        q.push_back(key + "=" + v);
        next.push_back(q);
      }
    points = next;
  }
  return points;
}

// A two-key grid (e.g. moe.experts x moe.topk, the papers' k/N grid): per evaluation set the mean
// over seeds at every point as a table (rows: the first key's values, columns: the second's) and
// as heatmap panels in METHOD/grid.png. Returns the markdown.
std::string write_grid_report(
    const std::string& root, const std::string& method, const std::vector<std::string>& grid,
    const std::vector<std::map<std::string, std::vector<double>>>& per_point,
    const std::vector<std::string>& set_names, const std::string& metric) {
  const auto [row_key, rows] = grid_axis(grid[0]);
  const auto [col_key, cols] = grid_axis(grid[1]);
  std::string md = fmt::format("\n{}: {} (rows) x {} (columns), {} mean over seeds\n", method,
                               row_key, col_key, metric);
  std::vector<HeatmapSpec> panels;
  for (const auto& set : set_names) {
    HeatmapSpec h;
    h.title = set;
    h.y_label = row_key;
    h.x_label = col_key;
    h.value_label = metric;
    h.row_labels = rows;
    h.column_labels = cols;
    h.annotate = true;
    md += fmt::format("\n| {} | {} |\n|---|{}\n", set, fmt::join(cols, " | "), [&] {
      std::string seps;
      for (size_t c = 0; c < cols.size(); ++c) seps += "---|";
      return seps;
    }());
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<double> line;
      std::vector<std::string> cells;
      for (size_t c = 0; c < cols.size(); ++c) {
        const auto it = per_point[r * cols.size() + c].find(set);
        const auto s = it == per_point[r * cols.size() + c].end() ? MeanStd{}
                                                                  : mean_population_std(it->second);
        line.push_back(s.n ? s.mean : std::nan(""));
        cells.push_back(s.n ? fmt::format("{:.2f} ± {:.2f}", s.mean, s.std) : "-");
      }
      h.values.push_back(line);
      md += fmt::format("| {} | {} |\n", rows[r], fmt::join(cells, " | "));
    }
    panels.push_back(h);
  }
  // one colour scale over the panels, from the values (not from 0: scores differ little)
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& p : panels)
    for (const auto& row : p.values)
      for (double v : row)
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (std::isfinite(lo) && !panels.empty()) {
    panels[0].vmin = lo;
    panels[0].vmax = hi > lo ? hi : lo + 1;
  }
  const auto dir = fs::path(root) / method;
  fs::create_directories(dir);
  write_heatmap_panels_png((dir / "grid.png").string(),
                           fmt::format("{}: {} over {} x {}", method, metric, row_key, col_key),
                           panels);
  return md;
}

// sweep.md (printed too) and sweep.json in the sweep's root folder.
void write_sweep_report(const SweepArgs& a, const RunConfig& base, const std::string& root,
                        const std::vector<std::string>& set_names,
                        const std::vector<std::string>& table, const std::string& grids,
                        const nlohmann::json& all) {
  std::string seps;
  for (size_t i = 0; i < set_names.size(); ++i) seps += "---|";
  std::string header =
      fmt::format("| method | chosen | {} |\n|---|---|{}\n", fmt::join(set_names, " | "), seps);
  const bool classification = base.objective == ObjectiveKind::kClassification;
  std::string metric = "dev loss";
  if (classification) {
    const TaskSpec task = run_task(base);
    metric = task.main_metric == kMeanMetric
                 ? fmt::format("mean of {} (percent)", fmt::join(task.metrics, " and "))
                 : task.main_metric + " (percent)";
  }
  std::string md = fmt::format(
      "{} on {} ({}), mean ± population std (divided by n, as the papers) over seeds {} at each "
      "run's best epoch: {}\n\n{}{}\n{}",
      base.model, classification ? base.task : "instructions",
      a.methods.empty() ? base.method : fmt::format("{}", fmt::join(a.methods, ",")),
      fmt::join(a.seeds, ","), metric, header, fmt::join(table, "\n"), grids);
  std::cout << md;
  fs::create_directories(root);
  write_text_atomic((fs::path(root) / "sweep.md").string(), md);
  write_text_atomic((fs::path(root) / "sweep.json").string(), all.dump(1) + "\n");
}

// One run of the sweep: a method at a grid point with a seed, its config resolved.
struct SweepRun {
  std::string method, seed, out;
  size_t point = 0;
  RunConfig cfg;
};

std::string point_tag(const std::vector<std::string>& point) {
  std::string tag;
  for (const auto& kv : point)
    tag += (tag.empty() ? "" : "_") +
           kv.substr(kv.find('.') == std::string::npos ? 0 : kv.find('.') + 1);
  return tag.empty() ? "default" : tag;
}

// What training checks against the model before it writes anything (the MoE layers, N and k
// against the model's layers and d_ff), asked of every run up front. Models are built once per
// folder, without weights (their sizes are checked before anything is allocated).
void check_run_fits_model(const RunConfig& cfg, std::map<std::string, ModelSummary>& models) {
  auto it = models.find(cfg.model);
  if (it == models.end()) {
    auto model = create_model(read_model_config(cfg.model), Head::kBase);
    it = models.emplace(cfg.model, model->summary()).first;
  }
  const ModelSummary& s = it->second;
  if (!cfg.uses_moe()) return;
  MoeConfig moe = cfg.moe;
  resolve_moe_layers(moe, s.num_layers, s.num_decoder_layers);
  moe.validate(s.ffn_layers(), s.intermediate_size);
}

// Every run of the sweep, each config resolved and checked before the first one trains: a bad
// grid point is refused before any run is written.
std::vector<SweepRun> plan_sweep(const SweepArgs& a, const std::string& root,
                                 const std::vector<std::string>& methods,
                                 const std::vector<std::string>& seeds,
                                 const std::vector<std::vector<std::string>>& points) {
  for (const auto& ms : a.method_sets) {
    auto colon = ms.find(':');
    EMOE_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < ms.size(), UsageError,
               "--method-set {}: expected METHOD:key=value", ms);
    const std::string m = ms.substr(0, colon);
    EMOE_CHECK(std::find(methods.begin(), methods.end(), m) != methods.end(), UsageError,
               "--method-set {}: method '{}' is not one of the sweep's methods ({})", ms, m,
               fmt::join(methods, ", "));
  }
  std::vector<SweepRun> runs;
  std::map<std::string, ModelSummary> models;
  for (const auto& method : methods)
    for (size_t pi = 0; pi < points.size(); ++pi)
      for (const auto& seed : seeds) {
        auto sets = a.sets;
        sets.push_back("method=" + method);
        for (const auto& ms : a.method_sets)
          if (ms.substr(0, ms.find(':')) == method) sets.push_back(ms.substr(ms.find(':') + 1));
        sets.push_back("train.seed=" + seed);
        for (const auto& kv : points[pi]) sets.push_back(kv);
        SweepRun r;
        r.method = method, r.seed = seed, r.point = pi;
        r.out = (fs::path(root) / method / point_tag(points[pi]) / ("seed-" + seed)).string();
        sets.push_back("output=" + r.out);
        try {
          r.cfg = load_run_config(a.config, sets);
          check_run_fits_model(r.cfg, models);
        } catch (const InputError& e) {
          EMOE_THROW(InputError, "sweep run {} {} seed {}: {}", method, point_tag(points[pi]), seed,
                     e.what());
        }
        runs.push_back(std::move(r));
      }
  return runs;
}

void run_sweep(const SweepArgs& a) {
  RunConfig base = load_run_config(a.config, a.sets);
  std::string root = a.output.empty() ? base.output : a.output;
  EMOE_CHECK(!fs::exists(root) || fs::is_directory(root), UsageError,
             "{} {}: exists and is not a folder", a.output.empty() ? "output" : "-o", root);
  std::vector<std::string> methods =
      a.methods.empty() ? std::vector<std::string>{base.method} : non_empty(a.methods);
  EMOE_CHECK(!methods.empty(), UsageError, "--methods: expected a list like full,lora,emoe");
  check_no_repeats(methods, fmt::format("--methods {}", fmt::join(a.methods, ",")), "method");
  std::vector<std::string> seeds = non_empty(a.seeds);
  EMOE_CHECK(!seeds.empty(), UsageError, "--seeds: expected a list like 0,1,2");
  check_no_repeats(seeds, fmt::format("--seeds {}", fmt::join(a.seeds, ",")), "seed");
  const std::vector<std::vector<std::string>> points = grid_points(a.grid);
  const std::vector<SweepRun> runs = plan_sweep(a, root, methods, seeds, points);
  spdlog::info("sweep: {} runs ({} methods x {} grid points x {} seeds), every config checked",
               runs.size(), methods.size(), points.size(), seeds.size());
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::string> table;
  std::vector<std::string> set_names;
  std::string grids;  // two-key grids: a table and heatmaps per method
  for (const auto& method : methods) {
    // per grid point: the best-epoch dev score of each seed, and the sets' main metrics
    std::vector<std::map<std::string, std::vector<double>>> per_point(points.size());
    std::string main_metric;
    for (const auto& run : runs) {
      if (run.method != method) continue;
      const size_t pi = run.point;
      const std::string& out = run.out;
      nlohmann::json res;
      auto res_path = fs::path(out) / "results.json";
      if (fs::exists(res_path)) {
        // a finished run is reused only if it is this run (not, e.g., the same task on
        // another model written to the same -o)
        const auto saved = fs::path(out) / "config.json";
        EMOE_CHECK(fs::exists(saved), UsageError,
                   "{}: holds results.json but no config.json; delete it or choose another -o",
                   out);
        auto differ = run_config_differences(JsonFields::from_file(saved.string()).raw(), run.cfg);
        EMOE_CHECK(differ.empty(), UsageError,
                   "{}: finished with another config ({}); delete it or choose another -o", out,
                   fmt::join(differ, ", "));
        res = JsonFields::from_file(res_path.string()).raw();
        spdlog::info("sweep: {} done before; reusing its results", out);
      } else {
        spdlog::info("sweep: {} {} seed {}", method, point_tag(points[pi]), run.seed);
        res = run_training(run.cfg, /*resume=*/true).results;
      }
      main_metric = res["main_metric"].get<std::string>();
      auto& best = res["best"];
      for (auto& [set, v] : best.items()) {
        double x = set == "dev" && main_metric == "dev_loss" ? v["loss"].get<double>()
                   : v["metrics"].contains(main_metric)
                       ? v["metrics"][main_metric].get<double>()
                       : v["metrics"].begin().value().get<double>();
        per_point[pi][set].push_back(x);
        if (std::find(set_names.begin(), set_names.end(), set) == set_names.end())
          set_names.push_back(set);
      }
      all.push_back({{"method", method},
                     {"point", points[pi]},
                     {"seed", run.seed},
                     {"results", res["best"]},
                     {"best_epoch", res["best_epoch"]},
                     {"run", out}});
    }
    // the grid point with the best mean dev score (lowest mean loss for instruction tuning)
    size_t best_pi = 0;
    double best_mean = -std::numeric_limits<double>::infinity();
    for (size_t pi = 0; pi < points.size(); ++pi) {
      double m =
          mean_population_std(per_point[pi]["dev"]).mean * (main_metric == "dev_loss" ? -1 : 1);
      if (m > best_mean) best_mean = m, best_pi = pi;
    }
    std::vector<std::string> cells;
    for (const auto& set : set_names) {
      auto s = mean_population_std(per_point[best_pi][set]);
      cells.push_back(s.n ? fmt::format("{:.2f} ± {:.2f}", s.mean, s.std) : "-");
    }
    table.push_back(fmt::format(
        "| {} | {} | {} |", method,
        points[best_pi].empty() ? "default" : fmt::format("{}", fmt::join(points[best_pi], " ")),
        fmt::join(cells, " | ")));
    if (a.grid.size() == 2)
      grids += write_grid_report(root, method, a.grid, per_point, set_names,
                                 main_metric == "dev_loss" ? "dev loss" : main_metric);
  }
  write_sweep_report(a, base, root, set_names, table, grids, all);
}

}  // namespace

void register_sweep(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  auto* cmd =
      app.add_subcommand("sweep", "Grid x seeds x methods, best epoch per run, mean ± std table");
  cmd->add_option("--config,-c", a->config, "YAML run config")->required();
  cmd->add_option("--grid", a->grid, "key=v1,v2 (repeatable; lr is train.lr)");
  add_list_option(cmd, "--seeds", a->seeds, "Seeds, e.g. 0,1,2")->capture_default_str();
  add_list_option(cmd, "--methods", a->methods,
                  "Methods, e.g. full,lora,emoe (default: the config's)");
  cmd->add_option("--set", a->sets, "Override a config key for every run (repeatable)");
  cmd->add_option("--method-set", a->method_sets,
                  "Override a key for one method, e.g. lora:train.lr=1e-3 (repeatable)");
  cmd->add_option("-o,--output", a->output,
                  "Root folder of the sweep (default: the config's output)");
  a->run_flags.add_to(cmd);
  cmd->callback([a] {
    a->run_flags.append_sets(a->sets);  // every run of the sweep
    run_sweep(*a);
  });
}

}  // namespace emoe::cli
