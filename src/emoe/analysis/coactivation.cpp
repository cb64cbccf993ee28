// The activation-clustering picture: neuron firing correlation ordered by EMoE's experts.
#include "emoe/analysis/coactivation.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>

#include "emoe/analysis/plot.h"
#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/ffn_slot.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/split.h"

namespace emoe {
namespace fs = std::filesystem;

at::Tensor firing_correlation(const at::Tensor& active) {
  EMOE_CHECK(active.dim() == 2 && active.size(0) > 0, InputError,
             "firing correlation: expected [tokens, neurons] with tokens > 0, got [{}]",
             fmt::join(active.sizes(), ", "));
  auto x = active.ne(0).to(torch::kFloat64);
  auto centred = x - x.mean(0, /*keepdim=*/true);
  auto cov = centred.t().mm(centred) / static_cast<double>(x.size(0));
  auto sd = cov.diagonal().clamp_min(0).sqrt();
  auto denom = sd.unsqueeze(1) * sd.unsqueeze(0);
  auto corr = torch::where(denom > 1e-12, cov / denom.clamp_min(1e-12), torch::zeros_like(cov));
  return corr.to(torch::kFloat32);
}

BlockContrast block_contrast(const at::Tensor& correlation, const std::vector<int64_t>& assignment,
                             int64_t experts) {
  const int64_t n = correlation.size(0);
  EMOE_CHECK(static_cast<int64_t>(assignment.size()) == n && correlation.size(1) == n, InputError,
             "block contrast: {} neurons assigned, correlation is [{}]", assignment.size(),
             fmt::join(correlation.sizes(), ", "));
  for (auto e : assignment)
    EMOE_CHECK(e >= 0 && e < experts, InputError, "block contrast: expert {} outside [0, {})", e,
               experts);
  auto a = torch::tensor(assignment, torch::kLong);
  auto same = a.unsqueeze(0).eq(a.unsqueeze(1));
  auto off_diagonal = torch::eye(n, torch::kBool).logical_not();
  auto c = correlation.to(torch::kFloat64).cpu();
  auto in_block = same.logical_and(off_diagonal);
  auto across = same.logical_not();
  BlockContrast b;
  if (in_block.any().item<bool>()) b.within = c.masked_select(in_block).mean().item<double>();
  if (across.any().item<bool>()) b.between = c.masked_select(across).mean().item<double>();
  return b;
}

namespace {

// The correlation with rows and columns in split order, the diagonal cleared (a neuron with
// itself says nothing), averaged over square groups of neurons down to at most max_pixels cells.
HeatmapSpec ordered_panel(const at::Tensor& corr, const SplitResult& split, int64_t max_pixels,
                          const std::string& title) {
  const int64_t n = corr.size(0);
  auto perm = torch::tensor(split.permutation, torch::kLong);
  auto m = corr.index_select(0, perm).index_select(1, perm).clone();
  m.fill_diagonal_(0);
  int64_t group = 1;
  while (n / group > max_pixels) group *= 2;
  if (group > 1)
    m = torch::avg_pool2d(m.unsqueeze(0).unsqueeze(0), {group, group}).squeeze(0).squeeze(0);
  m = m.to(torch::kFloat64).contiguous();
  HeatmapSpec h;
  h.title = title;
  h.x_label = fmt::format("neuron (by expert, {} per cell)", group);
  h.y_label = "expert";
  h.value_label = "firing correlation";
  h.diverging = true;
  const int64_t cells = m.size(0);
  const int64_t per_expert = n / split.experts;
  const double* p = m.data_ptr<double>();
  for (int64_t r = 0; r < cells; ++r) {
    h.values.emplace_back(p + r * cells, p + (r + 1) * cells);
    // an expert's first cell carries its index; plot_panel shows every (cells / 16)-th label
    const int64_t neuron = r * group;
    h.row_labels.push_back(neuron % per_expert == 0 ? std::to_string(neuron / per_expert) : "");
    h.column_labels.push_back("");
  }
  return h;
}

}  // namespace

CoactivationOutput write_coactivation(PretrainedModelImpl& model,
                                      const std::vector<ModelInputs>& sample,
                                      const CoactivationOptions& o, const std::string& out_dir) {
  const auto slots = model.ffn_slots();
  EMOE_CHECK(o.layer >= 0 && o.layer < static_cast<int64_t>(slots.size()), InputError,
             "--layer {}: the model has FFN layers 0..{}", o.layer,
             static_cast<int64_t>(slots.size()) - 1);
  auto keys =
      slots[static_cast<size_t>(o.layer)]->ffn_view().w_in.detach().to(torch::kFloat32).cpu();
  check_expert_count(keys.size(0), o.experts, "--experts");
  EMOE_CHECK(!sample.empty(), InputError, "co-activation: no sample text");
  auto acts = collect_ffn_activations(model, {o.layer}, sample, o.max_tokens);
  auto active = acts.hidden.at(o.layer).gt(0).cpu();
  CoactivationOutput out;
  out.tokens = active.size(0);
  out.firing_rate = active.to(torch::kFloat64).mean().item<double>();
  const auto corr = firing_correlation(active);
  KMeansOptions km;
  km.seed = o.seed;
  const SplitResult emoe_split = balanced_kmeans(keys, o.experts, km);
  const SplitResult random = random_split(keys, o.experts, o.seed);
  out.emoe = block_contrast(corr, emoe_split.assignment, o.experts);
  out.random = block_contrast(corr, random.assignment, o.experts);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", out_dir, ec.message());
  const std::string stem = fmt::format("coactivation_layer{}", o.layer);
  out.figure = (fs::path(out_dir) / (stem + ".png")).string();
  const auto panel_title = [](const char* what, const BlockContrast& b) {
    return fmt::format("{}: within {:.3f}, between {:.3f}", what, b.within, b.between);
  };
  write_heatmap_panels_png(
      out.figure,
      fmt::format("layer {}: neurons firing together on {} tokens, ordered by expert ({} experts)",
                  o.layer, out.tokens, o.experts),
      {ordered_panel(corr, emoe_split, o.max_pixels, panel_title("EMoE split", out.emoe)),
       ordered_panel(corr, random, o.max_pixels, panel_title("random split", out.random))});

  out.markdown = (fs::path(out_dir) / (stem + ".md")).string();
  const std::string md = fmt::format(
      "# Co-activation of layer {}'s FFN neurons, ordered by expert\n\n"
      "{} tokens of sample text; a neuron fires when its activation is above 0 ({:.1f} % of the "
      "neurons fire per token on average). Each cell of `{}.png` is the Pearson correlation of "
      "two neurons' firing over those tokens (averaged over groups of neurons, the diagonal "
      "cleared), rows and columns ordered by expert: left the EMoE split (balanced k-means on "
      "the L2-normalised keys, {} experts of {}, seed {}), right a random split of the same "
      "sizes. Blocks on the diagonal are neurons of one expert that fire together.\n\n"
      "| split | mean correlation within an expert | between experts | within / between |\n"
      "|---|---|---|---|\n"
      "| EMoE (balanced k-means) | {:.4f} | {:.4f} | {:.2f} |\n"
      "| random | {:.4f} | {:.4f} | {:.2f} |\n\n![co-activation]({}.png)\n",
      o.layer, out.tokens, 100.0 * out.firing_rate, stem, o.experts, keys.size(0) / o.experts,
      o.seed, out.emoe.within, out.emoe.between,
      out.emoe.between != 0 ? out.emoe.within / out.emoe.between : 0.0, out.random.within,
      out.random.between, out.random.between != 0 ? out.random.within / out.random.between : 0.0,
      stem);
  write_text_atomic(out.markdown, md);
  return out;
}

}  // namespace emoe
