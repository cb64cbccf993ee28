// Expert-usage recording.
#include "emoe/moe/usage.h"

#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/routed.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

std::vector<double> usage_to_vector(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU).to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

UsageRecorder::UsageRecorder(PretrainedModelImpl& model) {
  for (const auto& m : routed_modules(model)) {
    UsageSource s;
    s.name = m.name;
    s.kind = m.routed->usage_kind();
    s.experts = m.routed->num_experts();
    s.layer = m.layer;
    Routed* r = m.routed;
    s.take = [r](bool training) { return usage_to_vector(r->take_usage(training)); };
    sources_.push_back(std::move(s));
  }
}

void UsageRecorder::snapshot(int64_t step, const std::string& phase, bool training) {
  if (sources_.empty()) return;
  UsageSnapshot snap;
  snap.step = step;
  snap.phase = phase;
  for (auto& s : sources_) snap.counts.push_back(s.take(training));
  if (reduce_) {
    std::vector<double> flat;
    for (const auto& c : snap.counts) flat.insert(flat.end(), c.begin(), c.end());
    flat = reduce_(flat);
    size_t at = 0;
    for (auto& c : snap.counts)
      for (auto& x : c) x = flat.at(at++);
  }
  snapshots_.push_back(std::move(snap));
}

void UsageRecorder::discard(bool training) {
  for (auto& s : sources_)
    if (s.take) s.take(training);
}

nlohmann::json UsageRecorder::to_json() const {
  nlohmann::json src = nlohmann::json::array(), snaps = nlohmann::json::array();
  for (const auto& s : sources_)
    src.push_back({{"name", s.name}, {"kind", s.kind}, {"experts", s.experts}, {"layer", s.layer}});
  for (const auto& s : snapshots_)
    snaps.push_back({{"step", s.step}, {"phase", s.phase}, {"counts", s.counts}});
  return {{"format", "emoe-usage"}, {"version", 1}, {"sources", src}, {"snapshots", snaps}};
}

void UsageRecorder::restore(const nlohmann::json& j) {
  snapshots_.clear();
  if (j.is_null()) return;
  try {
    EMOE_CHECK(j.at("sources").size() == sources_.size(), InputError,
               "usage record: {} sources saved, the model has {}", j.at("sources").size(),
               sources_.size());
    for (const auto& s : j.at("snapshots")) {
      UsageSnapshot snap;
      snap.step = s.at("step").get<int64_t>();
      snap.phase = s.at("phase").get<std::string>();
      snap.counts = s.at("counts").get<std::vector<std::vector<double>>>();
      snapshots_.push_back(std::move(snap));
    }
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "usage record: malformed: {}", e.what());
  }
}

void UsageRecorder::save(const std::string& run_dir) const {
  if (sources_.empty()) return;
  write_text_atomic((fs::path(run_dir) / "usage.json").string(), to_json().dump() + "\n");
  std::ostringstream csv;
  csv << "step,phase,source,kind,expert,count\n";
  for (const auto& snap : snapshots_)
    for (size_t i = 0; i < sources_.size(); ++i)
      for (size_t e = 0; e < snap.counts[i].size(); ++e)
        csv << snap.step << ',' << snap.phase << ',' << '"' << sources_[i].name << '"' << ','
            << sources_[i].kind << ',' << e << ',' << snap.counts[i][e] << '\n';
  write_text_atomic((fs::path(run_dir) / "usage.csv").string(), csv.str());
}

UsageRecorder UsageRecorder::load(const std::string& path) {
  auto f = JsonFields::from_file(path);
  const auto& j = f.raw();
  EMOE_CHECK(j.value("format", "") == "emoe-usage", InputError,
             "{}: field 'format': expected \"emoe-usage\"", path);
  UsageRecorder u;
  try {
    for (const auto& s : j.at("sources")) {
      UsageSource src;
      src.name = s.at("name").get<std::string>();
      src.kind = s.at("kind").get<std::string>();
      src.experts = s.at("experts").get<int64_t>();
      src.layer = s.value("layer", -1);
      u.sources_.push_back(std::move(src));
    }
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: malformed sources: {}", path, e.what());
  }
  u.restore(j);
  for (const auto& snap : u.snapshots_) {
    EMOE_CHECK(snap.counts.size() == u.sources_.size(), InputError,
               "{}: a snapshot has {} sources, expected {}", path, snap.counts.size(),
               u.sources_.size());
    for (size_t i = 0; i < snap.counts.size(); ++i)
      EMOE_CHECK(static_cast<int64_t>(snap.counts[i].size()) == u.sources_[i].experts, InputError,
                 "{}: source {} has {} counts, expected {}", path, u.sources_[i].name,
                 snap.counts[i].size(), u.sources_[i].experts);
  }
  return u;
}

std::vector<std::vector<double>> usage_totals(const UsageRecorder& u, const std::string& phase) {
  std::vector<std::vector<double>> out;
  for (const auto& s : u.sources()) out.emplace_back(s.experts, 0.0);
  for (const auto& snap : u.snapshots())
    if (snap.phase == phase)
      for (size_t i = 0; i < out.size(); ++i)
        for (size_t e = 0; e < out[i].size(); ++e) out[i][e] += snap.counts[i][e];
  return out;
}

}  // namespace emoe
