// PEFT methods on a model: defaults, attaching adapters, trainable selection, aux loss, merging.
#include "emoe/peft/peft.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <optional>
#include <set>

#include "emoe/core/error.h"
#include "emoe/models/architecture.h"
#include "emoe/models/routed.h"
#include "emoe/peft/ia3.h"
#include "emoe/peft/lora.h"
#include "emoe/peft/molora.h"
#include "emoe/peft/targets.h"

namespace emoe {

std::string to_string(PeftMethod m) {
  switch (m) {
    case PeftMethod::kNone:
      return "none";
    case PeftMethod::kLora:
      return "lora";
    case PeftMethod::kIa3:
      return "ia3";
    case PeftMethod::kMov:
      return "mov";
    case PeftMethod::kMolora:
      return "molora";
  }
  return "?";
}

PeftMethod parse_peft_method(const std::string& s) {
  for (auto m : {PeftMethod::kNone, PeftMethod::kLora, PeftMethod::kIa3, PeftMethod::kMov,
                 PeftMethod::kMolora})
    if (s == to_string(m)) return m;
  EMOE_THROW(UsageError, "--peft: expected none, lora, ia3, mov or molora, got '{}'", s);
}

namespace {

bool peft_scales(PeftMethod m) {
  return m == PeftMethod::kIa3 || m == PeftMethod::kMov;
}

// The defaults of SPEC §3.3 (the architecture's traits), or nullopt for an unknown model type.
std::optional<std::vector<std::string>> peft_defaults(PeftMethod m, const std::string& type,
                                                      bool feedforward) {
  if (m == PeftMethod::kNone) return std::vector<std::string>{};
  const bool scaling = peft_scales(m);
  if (feedforward && !scaling) return std::vector<std::string>{};
  const Architecture* arch = find_architecture(type);
  if (!arch) return std::nullopt;
  if (feedforward) return arch->peft.feedforward;
  if (m == PeftMethod::kMolora && !arch->peft.molora.empty()) return arch->peft.molora;
  return scaling ? arch->peft.scaling : arch->peft.lora;
}

std::vector<std::string> peft_defaults_or_throw(PeftMethod m, const std::string& type,
                                                bool feedforward) {
  auto d = peft_defaults(m, type, feedforward);
  EMOE_CHECK(d.has_value(), UsageError,
             "peft.targets: no default {} targets for model type '{}' (known: {}); give the "
             "targets explicitly",
             to_string(m), type, known_model_types());
  return *d;
}

void peft_validate(const PeftConfig& c) {
  EMOE_CHECK(c.r >= 1, UsageError, "peft.r: expected a rank >= 1, got {}", c.r);
  EMOE_CHECK(c.alpha > 0, UsageError, "peft.alpha: expected > 0, got {}", c.alpha);
  EMOE_CHECK(c.dropout >= 0 && c.dropout < 1, UsageError, "peft.dropout: expected [0, 1), got {}",
             c.dropout);
  EMOE_CHECK(c.experts >= 1, UsageError, "peft.experts: expected >= 1, got {}", c.experts);
  EMOE_CHECK(c.topk >= 0 && (c.method != PeftMethod::kMolora || c.topk <= c.experts), UsageError,
             "peft.topk: expected 0 (soft merging) to experts = {}, got {}", c.experts, c.topk);
  EMOE_CHECK(c.balance_weight >= 0, UsageError, "peft.balance_weight: expected >= 0, got {}",
             c.balance_weight);
}

std::string peft_adapter_kind(const LinearAdapter* a) {
  return a->kind();
}

bool peft_any_match(const std::vector<std::string>& targets, const std::string& name) {
  return std::any_of(targets.begin(), targets.end(),
                     [&](const std::string& t) { return target_matches(t, name); });
}

}  // namespace

std::vector<std::string> default_targets(PeftMethod m, const std::string& model_type) {
  return peft_defaults_or_throw(m, model_type, /*feedforward=*/false);
}

std::vector<std::string> default_feedforward_targets(PeftMethod m, const std::string& model_type) {
  return peft_defaults_or_throw(m, model_type, /*feedforward=*/true);
}

PeftConfig PeftConfig::for_method(PeftMethod m, const std::string& model_type) {
  PeftConfig c;
  c.method = m;
  if (m == PeftMethod::kMolora) c.r = 4;
  // Without a model type the targets stay empty and apply_peft resolves them for the model.
  if (!model_type.empty()) {
    c.targets = default_targets(m, model_type);
    c.feedforward_targets = default_feedforward_targets(m, model_type);
  }
  return c;
}

std::vector<std::string> apply_peft(PretrainedModelImpl& model, const PeftConfig& cfg) {
  if (cfg.method == PeftMethod::kNone) return {};
  peft_validate(cfg);
  const std::string& type = model.summary().model_type;
  const auto targets = cfg.targets.empty() ? default_targets(cfg.method, type) : cfg.targets;
  std::vector<std::string> ff;
  if (peft_scales(cfg.method))
    ff = cfg.feedforward_targets.empty()
             ? peft_defaults(cfg.method, type, true).value_or(std::vector<std::string>{})
             : cfg.feedforward_targets;

  auto linears = named_linears(model);
  std::vector<std::string> unmatched;
  for (const auto& t : targets) {
    bool hit = std::any_of(linears.begin(), linears.end(),
                           [&](const NamedLinear& l) { return target_matches(t, l.name); });
    if (!hit) unmatched.push_back("'" + t + "'");
  }
  EMOE_CHECK(
      unmatched.empty(), UsageError,
      "peft.targets: {} match{} no Linear module of this {} model; its Linear modules are: {}",
      fmt::join(unmatched, ", "), unmatched.size() == 1 ? "es" : "", type,
      linear_names_summary(linears));

  std::vector<NamedLinear> plan;
  for (const auto& l : linears) {
    if (!peft_any_match(targets, l.name)) continue;
    EMOE_CHECK(!l.linear->adapter(), UsageError,
               "peft: {} already carries a {} adapter (apply_peft once, or remove_peft first)",
               l.name, peft_adapter_kind(l.linear->adapter().get()));
    check_adapter_reaches(model, l.name, *l.linear);
    plan.push_back(l);
  }
  if (!cfg.feedforward_targets.empty() && peft_scales(cfg.method)) {
    for (const auto& t : cfg.feedforward_targets) {
      bool hit = std::any_of(plan.begin(), plan.end(),
                             [&](const NamedLinear& l) { return target_matches(t, l.name); });
      EMOE_CHECK(hit, UsageError,
                 "peft.feedforward_targets: '{}' matches none of the adapted modules (a "
                 "feed-forward target must also be a target); adapted: {}",
                 t, linear_names_summary(plan));
    }
  }

  at::Generator gen = at::detail::createCPUGenerator(cfg.seed);
  std::vector<std::string> names;
  for (const auto& l : plan) {
    const bool feedforward = peft_any_match(ff, l.name);
    std::shared_ptr<LinearAdapter> adapter;
    switch (cfg.method) {
      case PeftMethod::kLora:
        adapter = std::make_shared<LoraAdapter>(*l.linear,
                                                LoraOptions{cfg.r, cfg.alpha, cfg.dropout}, gen);
        break;
      case PeftMethod::kIa3: {
        // Contiguous ranges (c_attn's k|v) form one vector: (IA)^3 is elementwise.
        auto ranges = scaled_output_ranges(model, l.name, *l.linear);
        ScaledRange all{ranges.front().offset,
                        ranges.back().offset + ranges.back().length - ranges.front().offset, ""};
        adapter = std::make_shared<Ia3Adapter>(*l.linear, feedforward, all);
        break;
      }
      case PeftMethod::kMov: {
        // keys and values (the family's output-scaled defaults) are routed per head (SPEC §3.3,
        // the reference's MoVAttention); any other output a user targets is one activation
        auto ranges = scaled_output_ranges(model, l.name, *l.linear);
        const auto& sm = model.summary();
        const auto& traits = architecture_of(sm).peft;
        const bool attention_kv = !feedforward && peft_any_match(traits.scaling, l.name) &&
                                  !peft_any_match(traits.feedforward, l.name);
        const int64_t head_dim = sm.attention_head_dim();
        for (auto& r : ranges)
          if (attention_kv && head_dim > 0 && r.length % head_dim == 0) r.head_dim = head_dim;
        adapter = std::make_shared<MovAdapter>(*l.linear, feedforward, ranges, cfg.experts, gen);
        break;
      }
      case PeftMethod::kMolora:
        adapter = std::make_shared<MoloraAdapter>(
            *l.linear,
            MoloraOptions{cfg.r, cfg.alpha, cfg.dropout, cfg.experts, cfg.topk, cfg.balance_weight},
            gen);
        break;
      case PeftMethod::kNone:
        break;
    }
    l.linear->set_adapter(adapter);
    names.push_back(l.name);
  }
  return names;
}

void select_trainable(PretrainedModelImpl& model, const PeftConfig& cfg,
                      const std::vector<std::string>& also_train) {
  if (cfg.method == PeftMethod::kNone) return;
  const Architecture& arch = architecture_of(model.summary());
  const auto adapter_params = adapter_parameters(model);
  EMOE_CHECK(!adapter_params.empty(), UsageError,
             "select_trainable: the model carries no {} adapters (call apply_peft first)",
             to_string(cfg.method));
  for (auto& p : model.named_parameters(/*recurse=*/true)) {
    const std::string& k = p.key();
    // As PEFT's SEQ_CLS modules_to_save: the classifier / score train; the pretrained LM head,
    // the MLM head and BERT's pooler stay frozen (also_train can add them), so that a PEFT
    // adapter file holds everything the run changed.
    const bool task_head = model.is_head_key(k) && !arch.is_pretrained_head(k);
    bool train = adapter_params.count(p.value().unsafeGetTensorImpl()) > 0 || task_head;
    for (const auto& name : also_train)
      if (!name.empty() && ("." + k + ".").find("." + name + ".") != std::string::npos)
        train = true;
    p.value().set_requires_grad(train);
  }
}

at::Tensor collect_peft_aux_loss(PretrainedModelImpl& model) {
  torch::Tensor total;
  for (const auto& l : named_linears(model)) {
    Routed* r = l.linear->adapter() ? l.linear->adapter()->routed() : nullptr;
    const auto aux = r ? r->aux_loss() : torch::Tensor();
    if (aux.defined()) total = total.defined() ? total + aux : aux;
  }
  return total;
}

void merge_lora(PretrainedModelImpl& model) {
  std::vector<std::pair<LinearImpl*, LoraAdapter*>> todo;
  for (const auto& l : named_linears(model)) {
    if (!l.linear->adapter()) continue;
    auto* lora = dynamic_cast<LoraAdapter*>(l.linear->adapter().get());
    EMOE_CHECK(lora, UsageError,
               "merge_lora: {} carries a {} adapter; only LoRA folds into the weights", l.name,
               peft_adapter_kind(l.linear->adapter().get()));
    todo.emplace_back(l.linear, lora);
  }
  EMOE_CHECK(!todo.empty(), UsageError, "merge_lora: the model carries no LoRA adapters");
  torch::NoGradGuard no_grad;
  for (auto& [linear, lora] : todo) {
    auto delta = lora->delta_weight();                    // [out, in]
    if (linear->options().transposed) delta = delta.t();  // Conv1D stores [in, out]
    linear->weight.add_(delta.to(linear->weight.scalar_type()));
    linear->set_adapter(nullptr);
  }
}

int64_t remove_peft(PretrainedModelImpl& model) {
  int64_t n = 0;
  for (const auto& l : named_linears(model)) {
    if (!l.linear->adapter()) continue;
    l.linear->set_adapter(nullptr);
    ++n;
  }
  return n;
}

std::vector<std::string> adapted_modules(PretrainedModelImpl& model) {
  std::vector<std::string> out;
  for (const auto& l : named_linears(model))
    if (l.linear->adapter()) out.push_back(l.name);
  return out;
}

}  // namespace emoe
