// The demo: data, pretraining, three fine-tuning runs, analysis and a report.
#include "emoe/train/demo.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>

#include "emoe/analysis/report.h"
#include "emoe/core/error.h"
#include "emoe/data/synthetic.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/loader.h"
#include "emoe/train/pretrain.h"
#include "emoe/train/run_config.h"
#include "emoe/train/trainer.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDemoMarker = ".emoe-demo";

// The output folder is the demo's own: a previous demo's results are replaced, anything else is
// refused rather than deleted.
void demo_prepare_output(const std::string& out) {
  if (fs::exists(out)) {
    EMOE_CHECK(fs::is_directory(out), InputError,
               "{}: exists and is not a folder; choose another --output", out);
    const bool empty = fs::directory_iterator(out) == fs::directory_iterator();
    EMOE_CHECK(empty || fs::exists(fs::path(out) / kDemoMarker), InputError,
               "{}: exists and is not a demo output folder; choose another --output", out);
    for (const char* sub : {"runs", "figures", "data", "pretrained"})
      fs::remove_all(fs::path(out) / sub);
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", out, ec.message());
  write_text_atomic((fs::path(out) / kDemoMarker).string(), "written by emoe demo\n");
}

// N experts dividing d_ff (16 preferred), k = N/4 (N/2 for small N).
std::pair<int64_t, int64_t> demo_experts(int64_t d_ff) {
  for (int64_t n : {16, 8, 4, 2})
    if (d_ff % n == 0) return {n, n >= 8 ? n / 4 : std::max<int64_t>(1, n / 2)};
  EMOE_THROW(InputError, "intermediate size {} is not divisible by 2, 4, 8 or 16 experts", d_ff);
}

double demo_main_metric(const nlohmann::json& set, const std::string& metric) {
  if (!set.is_object() || !set.contains("metrics") || !set["metrics"].contains(metric)) return 0;
  return set["metrics"][metric].get<double>();
}

std::string demo_params(int64_t n) {
  if (n >= 1000000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}

}  // namespace

DemoResult run_demo(const DemoOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool builtin = o.model.empty();
  EMOE_CHECK(builtin || !o.task.empty(), UsageError,
             "demo: --model needs --task (a GLUE task, e.g. sst2)");
  EMOE_CHECK(!builtin || o.task.empty(), UsageError,
             "demo: --task needs --model (the built-in demo makes its own task)");
  EMOE_CHECK(!o.methods.empty(), UsageError, "demo: --methods: expected at least one method");
  const fs::path out(o.output);
  demo_prepare_output(o.output);
  const int64_t stages = (builtin ? 2 : 0) + static_cast<int64_t>(o.methods.size()) + 1;
  int64_t stage = 0;
  auto announce = [&](const std::string& what) {
    spdlog::info("demo [{}/{}] {}", ++stage, stages, what);
  };

  std::ostringstream about;  // the report's account of the data and the model
  std::string model_dir = o.model;
  nlohmann::json base = nlohmann::json::object();
  int64_t experts = 16, topk = 4;
  if (builtin) {
    announce("making a two-domain review data set (films in domain, restaurants out of domain)");
    SyntheticOptions so;
    so.seed = o.seed;
    if (o.quick) so.corpus_sentences = 2000, so.train = 400, so.dev = 200, so.ood = 200;
    const auto data = make_synthetic_reviews(so);
    const std::string data_dir = (out / "data").string();
    write_synthetic_reviews(data, data_dir);

    PretrainConfig pc;
    pc.arch = "bert";
    pc.corpus = data_dir + "/corpus.txt";
    pc.output = (out / "pretrained").string();
    pc.seed = o.seed;
    pc.max_positions = 64;
    pc.max_length = 48;
    pc.steps = o.pretrain_steps > 0 ? o.pretrain_steps : (o.quick ? 30 : 600);
    pc.log_every = std::max<int64_t>(1, pc.steps / 10);
    if (o.quick)
      pc.hidden = 64, pc.layers = 2, pc.heads = 2, pc.intermediate = 256, pc.batch_size = 32;
    pc.device = o.device, pc.dtype = o.dtype, pc.threads = o.threads;
    announce(
        fmt::format("pretraining a BERT (hidden {}, {} layers, FFN {}) with masked LM, {} steps",
                    pc.hidden, pc.layers, pc.intermediate, pc.steps));
    const auto pr = run_pretraining(pc);
    model_dir = pr.dir;
    about << "**Data** (made by the demo, seed " << o.seed
          << "): synthetic reviews in two domains that share "
          << "the sentiment words but not the topic words. In domain: film reviews ("
          << data.train.size() << " training, " << data.dev.size()
          << " dev); out of domain: restaurant reviews (" << data.ood.size()
          << "). Labels follow the clauses' polarity with negation (\"not\") and contrast "
             "(\"but\"), with "
          << so.label_noise * 100
          << " % of the labels flipped. Unlabelled pretraining corpus: " << data.corpus.size()
          << " sentences of both domains. Files: `data/`.\n\n"
          << "**Model**: a fresh BERT (hidden " << pc.hidden << ", " << pc.layers << " layers, "
          << pc.heads << " heads, FFN " << pc.intermediate << ", " << demo_params(pr.parameters)
          << " parameters, WordPiece "
          << "vocabulary of " << pr.vocab_size
          << " trained on the corpus) pretrained by masked LM for " << pr.steps << " steps (batch "
          << pc.batch_size << "): loss " << fmt::format("{:.3f}", pr.first_loss) << " (first "
          << pc.log_every << " steps) -> " << fmt::format("{:.3f}", pr.final_loss) << " (last "
          << pc.log_every << "), " << fmt::format("{:.0f}", pr.seconds)
          << " s. Folder: `pretrained/`.\n\n";
    if (o.quick) experts = 8, topk = 2;
    base["task"] = "reviews";
    base["dataset"] = {{"train", data_dir + "/train.tsv"},
                       {"dev", data_dir + "/dev.tsv"},
                       {"ood", {{"restaurants", data_dir + "/ood.tsv"}}},
                       {"text_cols", {"sentence"}},
                       {"label_col", "label"},
                       {"labels", {"negative", "positive"}},
                       {"metrics", {"accuracy"}}};
    base["train"] = {{"epochs", o.quick ? 1 : 3},
                     {"batch_size", 32},
                     {"max_length", 48},
                     {"warmup_ratio", 0.06}};
  } else {
    const auto probe = load_model(o.model);
    std::tie(experts, topk) = demo_experts(probe->summary().intermediate_size);
    about << "**Model**: `" << o.model << "` (" << probe->summary().model_type << ", "
          << probe->summary().num_layers << " layers, hidden " << probe->summary().hidden_size
          << ", FFN " << probe->summary().intermediate_size << "). **Task**: " << o.task
          << " from `" << o.data_dir << "`, at most " << o.max_train_examples
          << " training examples, its out-of-domain sets.\n\n";
    base["task"] = o.task;
    base["data_dir"] = o.data_dir;
    base["ood"] = "all";
    base["train"] = {{"epochs", o.quick ? 1 : 3},
                     {"batch_size", 32},
                     {"max_length", 64},
                     {"warmup_ratio", 0.06},
                     {"max_train_examples", o.quick ? std::min<int64_t>(200, o.max_train_examples)
                                                    : o.max_train_examples},
                     {"max_eval_examples", o.quick ? 100 : 500}};
  }
  base["model"] = model_dir;
  base["moe"] = {{"experts", experts}, {"topk", topk}};
  base["train"]["seed"] = o.seed;
  base["device"] = o.device;
  base["dtype"] = o.dtype;
  base["threads"] = o.threads;

  DemoResult result;
  std::vector<std::string> ood_sets;
  std::string metric;
  std::map<std::string, std::map<std::string, double>> per_set;  // method -> set -> metric
  std::string usage_run;
  for (const auto& method : o.methods) {
    nlohmann::json j = base;
    j["method"] = method;
    j["output"] = (out / "runs" / method).string();
    auto cfg = RunConfig::from_json(j, "demo");
    // methods that train only adapters (and the head) get a larger learning rate
    const bool adapter = cfg.peft_method() != PeftMethod::kNone;
    cfg.train.lr = builtin ? (adapter ? 3e-3 : 3e-4) : (adapter ? 1e-3 : 1e-4);
    cfg.validate();
    announce(fmt::format("fine-tuning {} (lr {:g})", method, cfg.train.lr));
    const auto r = run_training(cfg, false);
    const auto& res = r.results;
    DemoRow row;
    row.method = method;
    row.metric = metric = res["main_metric"].get<std::string>();
    row.trainable = res["parameters"]["trainable"].get<int64_t>();
    row.total = res["parameters"]["total"].get<int64_t>();
    row.best_epoch = res["best_epoch"].get<int64_t>();
    row.train_seconds = res["train_seconds"].get<double>();
    row.in_domain = demo_main_metric(res["best"]["dev"], metric);
    int64_t n = 0;
    for (auto& [set, v] : res["best"].items()) {
      per_set[method][set] = demo_main_metric(v, metric);
      if (set == "dev") continue;
      if (method == o.methods.front()) ood_sets.push_back(set);
      row.out_of_domain += per_set[method][set];
      ++n;
    }
    if (n > 0) row.out_of_domain /= static_cast<double>(n);
    if (usage_run.empty() && fs::exists(fs::path(r.run_dir) / "usage.json")) usage_run = r.run_dir;
    result.rows.push_back(row);
  }

  announce(usage_run.empty() ? "writing the report (no routed method: no usage figures)"
                             : "drawing the expert-usage figures and writing the report");
  std::string summary;
  if (!usage_run.empty()) {
    auto a = analyze_run(usage_run, (out / "figures").string());
    result.figures = a.figures;
    summary = a.summary;
  }

  // the comparison table
  std::ostringstream t;
  t << "| method | trainable / total parameters | in domain (dev " << metric << ") |";
  for (const auto& s : ood_sets) t << " out of domain: " << s << " |";
  if (ood_sets.size() > 1) t << " out of domain, mean |";
  t << " best epoch | training time |\n|---|---|---|";
  for (size_t i = 0; i < ood_sets.size() + (ood_sets.size() > 1 ? 1 : 0); ++i) t << "---|";
  t << "---|---|\n";
  for (const auto& r : result.rows) {
    t << "| " << r.method << " | " << demo_params(r.trainable) << " / " << demo_params(r.total)
      << " | " << fmt::format("{:.1f}", r.in_domain) << " |";
    for (const auto& s : ood_sets) t << fmt::format(" {:.1f} |", per_set[r.method][s]);
    if (ood_sets.size() > 1) t << fmt::format(" {:.1f} |", r.out_of_domain);
    t << " " << r.best_epoch << " | " << fmt::format("{:.0f} s", r.train_seconds) << " |\n";
  }
  result.table = t.str();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // the report
  std::ostringstream md;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  md << "# emoe demo\n\nWritten by `emoe demo` on " << date << " in "
     << fmt::format("{:.0f}", result.seconds) << " s, seed " << o.seed
     << (o.quick ? " (quick configuration)" : "") << ".\n\n"
     << about.str()
     << "**Fine-tuning**: each method starts from the same model and trains on the in-domain "
     << "training split; the table shows the epoch with the best dev " << metric
     << ". EMoE splits every "
     << "other FFN layer into " << experts
     << " experts by balanced k-means on the FFN keys and routes each "
     << "token to its top " << topk << " by the avg-k gate (no new parameters); its exported model "
     << "(`runs/emoe/model/`) is recomposed into the dense architecture. Runs: `runs/<method>/` "
     << "(config.json, metrics.jsonl, results.json).\n\n"
     << result.table << "\n";
  if (!result.figures.empty()) {
    md << "## Expert usage\n\nHow often each expert was selected over training and evaluation (`"
       << usage_run << "`); the balance summary is `" << fs::relative(summary, out).string()
       << "`.\n\n";
    for (const auto& f : result.figures) md << "![](" << fs::relative(f, out).string() << ")\n\n";
  }
  md << "Reproduce: `emoe demo --seed " << o.seed << (o.quick ? " --quick" : "");
  if (!builtin) md << " --model " << o.model << " --task " << o.task << " --data " << o.data_dir;
  md << "`\n";
  result.report = (out / "report.md").string();
  write_text_atomic(result.report, md.str());
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : result.rows)
    rows.push_back({{"method", r.method},
                    {"trainable", r.trainable},
                    {"total", r.total},
                    {"in_domain", r.in_domain},
                    {"out_of_domain", r.out_of_domain},
                    {"sets", per_set[r.method]},
                    {"metric", r.metric},
                    {"best_epoch", r.best_epoch},
                    {"train_seconds", r.train_seconds}});
  write_text_atomic((out / "demo.json").string(), nlohmann::json({{"seed", o.seed},
                                                                  {"quick", o.quick},
                                                                  {"seconds", result.seconds},
                                                                  {"rows", rows},
                                                                  {"figures", result.figures}})
                                                          .dump(2) +
                                                      "\n");
  return result;
}

}  // namespace emoe
