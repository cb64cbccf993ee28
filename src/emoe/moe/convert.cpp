// Dense -> MoE conversion, moe.json, loading converted folders, and recomposition to dense.
#include "emoe/moe/convert.h"

#include <torch/torch.h>

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/moe/moefication.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

// Records the FFN inputs/hidden activations of real tokens and computes the dense FFN.
class ActivationRecorderImpl : public FfnPlug {
 public:
  ActivationRecorderImpl(int64_t max_tokens, bool keep_hidden)
      : max_tokens_(max_tokens), keep_hidden_(keep_hidden) {}
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& token_mask,
                    FfnSlot& slot) override {
    auto flat = x.reshape({-1, x.size(-1)});
    auto h = slot.ffn_hidden(flat);
    if (count_ < max_tokens_) {
      auto keep = flat, keep_h = h;
      if (token_mask.defined()) {
        auto idx = (token_mask.reshape({-1}).to(flat.device()) != 0).nonzero().squeeze(1);
        keep = flat.index_select(0, idx);
        keep_h = h.index_select(0, idx);
      }
      int64_t take = std::min<int64_t>(keep.size(0), max_tokens_ - count_);
      inputs.push_back(keep.narrow(0, 0, take).detach().to(torch::kCPU).to(torch::kFloat));
      if (keep_hidden_)
        hidden.push_back(keep_h.narrow(0, 0, take).detach().to(torch::kCPU).to(torch::kFloat));
      count_ += take;
    }
    return slot.ffn_output(h).view(x.sizes());
  }
  std::vector<torch::Tensor> inputs, hidden;

 private:
  int64_t max_tokens_, count_ = 0;
  bool keep_hidden_;
};

FfnSlot& slot_at(PretrainedModelImpl& model, int64_t layer) {
  auto slots = model.ffn_slots();
  EMOE_CHECK(layer >= 0 && layer < static_cast<int64_t>(slots.size()), UsageError,
             "layer {} does not exist (the model has layers 0..{})", layer,
             static_cast<int64_t>(slots.size()) - 1);
  return *slots[layer];
}

std::shared_ptr<RoutedFfnImpl> make_plug(const MoeConfig& cfg, FfnSlot& slot) {
  std::shared_ptr<RoutedFfnImpl> plug;
  if (cfg.method == MoeMethod::kGmoe)
    plug = std::make_shared<UpcycledFfnImpl>(cfg, slot);
  else
    plug = std::make_shared<ExpertFfnImpl>(cfg, slot);
  auto v = slot.ffn_view();
  plug->to(v.w_in.device(), v.w_in.scalar_type());
  return plug;
}

}  // namespace

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv.at(perm[i]) = static_cast<int64_t>(i);
  return inv;
}

void permute_ffn(FfnSlot& slot, const std::vector<int64_t>& perm) {
  auto v = slot.ffn_view();
  EMOE_CHECK(static_cast<int64_t>(perm.size()) == v.d_ff(), InputError,
             "permutation has {} entries for an FFN of {} neurons", perm.size(), v.d_ff());
  torch::NoGradGuard g;
  auto p = torch::tensor(perm, torch::kLong).to(v.w_in.device());
  auto apply = [&](const torch::Tensor& t, int64_t dim) {
    if (t.defined()) const_cast<torch::Tensor&>(t).copy_(t.index_select(dim, p));
  };
  apply(v.w_in, 0);
  apply(v.b_in, 0);
  apply(v.w_up, 0);
  apply(v.w_out, 1);
}

FfnActivations collect_ffn_activations(PretrainedModelImpl& model,
                                       const std::vector<int64_t>& layers,
                                       const std::vector<ModelInputs>& batches, int64_t max_tokens,
                                       bool keep_hidden) {
  std::map<int64_t, std::shared_ptr<ActivationRecorderImpl>> rec;
  std::map<int64_t, std::shared_ptr<FfnPlug>> previous;
  for (auto l : layers) {
    auto& slot = slot_at(model, l);
    previous[l] = slot.plug();
    rec[l] = std::make_shared<ActivationRecorderImpl>(max_tokens, keep_hidden);
    slot.set_plug(rec[l]);
  }
  {
    torch::NoGradGuard g;
    const bool was_training = model.is_training();
    model.eval();
    try {
      for (const auto& b : batches) model.forward(b);
    } catch (...) {
      for (auto l : layers) slot_at(model, l).set_plug(previous[l]);
      throw;
    }
    model.train(was_training);
  }
  FfnActivations out;
  for (auto l : layers) {
    slot_at(model, l).set_plug(previous[l]);
    EMOE_CHECK(!rec[l]->inputs.empty(), InputError, "no sample tokens reached layer {}", l);
    out.inputs[l] = torch::cat(rec[l]->inputs, 0);
    if (keep_hidden) out.hidden[l] = torch::cat(rec[l]->hidden, 0);
  }
  return out;
}

MoeState convert_to_moe(PretrainedModelImpl& model, MoeConfig cfg,
                        const std::vector<ModelInputs>& sample) {
  const auto& s = model.summary();
  resolve_moe_layers(cfg, s.num_layers, s.num_decoder_layers);
  cfg.validate(s.ffn_layers(), s.intermediate_size);
  for (auto l : cfg.layers)
    EMOE_CHECK(!slot_at(model, l).plug(), UsageError, "layer {} is already converted", l);
  const bool coactivation = cfg.method != MoeMethod::kGmoe && cfg.split == "coactivation";
  const bool need_acts = cfg.method == MoeMethod::kMoefication || coactivation;
  FfnActivations acts;
  if (need_acts) {
    EMOE_CHECK(!sample.empty(), UsageError,
               "{} needs sample text to gather activations (--sample FILE)",
               cfg.method == MoeMethod::kMoefication ? "MoEfication" : "the coactivation split");
    acts = collect_ffn_activations(model, cfg.layers, sample, cfg.sample_tokens, coactivation);
  }
  MoeState state;
  state.config = cfg;
  for (auto l : cfg.layers) {
    auto& slot = slot_at(model, l);
    if (cfg.method != MoeMethod::kGmoe) {
      auto keys = slot.ffn_view().w_in.detach();
      SplitResult r;
      if (cfg.split == "balanced-kmeans") {
        auto o = cfg.kmeans;
        o.seed = cfg.seed + static_cast<uint64_t>(l);
        r = balanced_kmeans(keys, cfg.experts, o);
      } else if (cfg.split == "random") {
        r = random_split(keys, cfg.experts, cfg.seed + static_cast<uint64_t>(l));
      } else if (cfg.split == "contiguous") {
        r = contiguous_split(keys, cfg.experts);
      } else {
        r = coactivation_split(acts.hidden[l] > 0, keys, cfg.experts, cfg.seed + l);
      }
      r.random_inertia =
          cfg.split == "random"
              ? r.inertia
              : random_split(keys, cfg.experts, cfg.seed + static_cast<uint64_t>(l)).inertia;
      permute_ffn(slot, r.permutation);
      spdlog::info("layer {}: {} split into {} experts of {} in {:.2f} s, inertia {:.4f}", l,
                   r.method, cfg.experts, s.intermediate_size / cfg.experts, r.seconds, r.inertia);
      state.splits[l] = std::move(r);
    } else {
      SplitResult r;  // GMoE keeps the original order; record the identity
      r.method = "upcycle";
      r.experts = cfg.experts;
      for (int64_t i = 0; i < s.intermediate_size; ++i) r.permutation.push_back(i);
      state.splits[l] = std::move(r);
    }
    auto plug = make_plug(cfg, slot);
    if (cfg.method == MoeMethod::kMoefication) {
      RouterTrainOptions ro;
      ro.seed = cfg.seed + static_cast<uint64_t>(l);
      auto tr =
          train_moefication_router(static_cast<ExpertFfnImpl&>(*plug), slot, acts.inputs[l], ro);
      spdlog::info(
          "layer {}: MoEfication router trained on {} tokens ({} held out), kept epoch {} of {}: "
          "its top {} experts cover {:.1f} % of the held-out activation, BCE {:.4f}",
          l, acts.inputs[l].size(0) - tr.held_out, tr.held_out, tr.best_epoch, ro.epochs,
          std::max<int64_t>(1, cfg.experts / 5), 100.0 * tr.coverage, tr.loss);
    }
    slot.set_plug(plug);
  }
  return state;
}

void attach_moe(PretrainedModelImpl& model, const MoeState& state) {
  const auto& s = model.summary();
  state.config.validate(s.ffn_layers(), s.intermediate_size);
  for (const auto& [l, split] : state.splits) {
    auto& slot = slot_at(model, l);
    EMOE_CHECK(static_cast<int64_t>(split.permutation.size()) == s.intermediate_size, InputError,
               "moe.json: layer {}: permutation has {} entries, the FFN has {} neurons", l,
               split.permutation.size(), s.intermediate_size);
    auto plug = make_plug(state.config, slot);
    if (!split.allowed.empty()) {
      auto mask = torch::zeros({state.config.experts}, torch::kBool);
      for (auto e : split.allowed) mask[e] = true;
      plug->set_allowed_experts(mask);
    }
    slot.set_plug(plug);
  }
}

void recompose_dense(PretrainedModelImpl& model, MoeState& state) {
  EMOE_CHECK(state.config.method != MoeMethod::kGmoe, InputError,
             "GMoE's {} expert copies cannot be recomposed into one dense FFN (export supports "
             "emoe, emoe-learn and moefication)",
             state.config.experts);
  for (const auto& [l, split] : state.splits) {
    auto& slot = slot_at(model, l);
    slot.set_plug(nullptr);
    permute_ffn(slot, inverse_permutation(split.permutation));
  }
  state.splits.clear();
}

std::vector<RoutedFfnImpl*> moe_plugs(PretrainedModelImpl& model) {
  std::vector<RoutedFfnImpl*> out;
  for (auto* slot : model.ffn_slots())
    if (auto* p = dynamic_cast<RoutedFfnImpl*>(slot->plug().get())) out.push_back(p);
  return out;
}

torch::Tensor collect_aux_loss(PretrainedModelImpl& model) {
  torch::Tensor total;
  for (auto* p : moe_plugs(model)) {
    const auto& a = p->last_aux_loss();
    if (a.defined()) total = total.defined() ? total + a : a;
  }
  return total;
}

nlohmann::json moe_state_to_json(const MoeState& state) {
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [l, r] : state.splits)
    layers[std::to_string(l)] = {{"split", r.method},
                                 {"permutation", r.permutation},
                                 {"cluster_sizes", r.cluster_sizes},
                                 {"inertia", r.inertia},
                                 {"random_inertia", r.random_inertia},
                                 {"split_seconds", r.seconds},
                                 {"iterations", r.iterations},
                                 {"restarts", r.restarts},
                                 {"allowed", r.allowed}};
  return {{"format", "emoe-moe"},
          {"version", 1},
          {"emoe_version", EMOE_VERSION},
          {"source", state.source},
          {"config", state.config.to_json()},
          {"layers", layers}};
}

MoeState moe_state_from_json(const JsonFields& j) {
  EMOE_CHECK(j.get_string("format", "") == "emoe-moe", InputError,
             "{}: field 'format': expected \"emoe-moe\"", j.file());
  EMOE_CHECK(j.get_int("version", 0) == 1, InputError, "{}: field 'version': expected 1, got {}",
             j.file(), j.get_int("version", 0));
  MoeState st;
  EMOE_CHECK(j.has("config") && j.raw()["config"].is_object(), InputError,
             "{}: field 'config': expected an object", j.file());
  st.config = MoeConfig::from_json(JsonFields(j.raw()["config"], j.file()));
  st.config.origin = j.file() + ": config.";
  st.source = j.get_string("source", "");
  EMOE_CHECK(j.has("layers") && j.raw()["layers"].is_object(), InputError,
             "{}: field 'layers': expected an object", j.file());
  for (auto it = j.raw()["layers"].begin(); it != j.raw()["layers"].end(); ++it) {
    int64_t l = -1;
    try {
      l = std::stoll(it.key());
    } catch (const std::exception&) {
      EMOE_THROW(InputError, "{}: layers: key '{}' is not a layer index", j.file(), it.key());
    }
    JsonFields lj(it.value(), j.file() + " layers." + it.key());
    SplitResult r;
    r.method = lj.get_string("split", "");
    r.experts = st.config.experts;
    r.permutation = lj.get_int_list("permutation");
    r.cluster_sizes = lj.get_int_list("cluster_sizes");
    r.inertia = lj.get_double("inertia", 0.0);
    r.random_inertia = lj.get_double("random_inertia", 0.0);
    r.seconds = lj.get_double("split_seconds", 0.0);
    r.iterations = lj.get_int("iterations", 0);
    r.restarts = lj.get_int("restarts", 0);
    r.allowed = lj.get_int_list("allowed");
    for (auto e : r.allowed)
      EMOE_CHECK(e >= 0 && e < st.config.experts, InputError,
                 "{}: layers.{}.allowed: expert {} out of range", j.file(), it.key(), e);
    std::vector<bool> seen(r.permutation.size(), false);
    for (auto p : r.permutation) {
      EMOE_CHECK(p >= 0 && p < static_cast<int64_t>(seen.size()) && !seen[p], InputError,
                 "{}: layers.{}.permutation is not a permutation of 0..{}", j.file(), l,
                 seen.size() - 1);
      seen[p] = true;
    }
    st.splits[l] = std::move(r);
  }
  std::vector<int64_t> keys;
  for (const auto& [l, r] : st.splits) keys.push_back(l);
  EMOE_CHECK(keys == st.config.layers, InputError,
             "{}: layers [{}] do not match config.layers [{}]", j.file(), fmt::join(keys, ","),
             fmt::join(st.config.layers, ","));
  return st;
}

}  // namespace emoe
