// Finding the routed modules of a model through the FFN slots and the Linear adapters.
#include "emoe/models/routed.h"

#include <torch/torch.h>

#include "emoe/models/linear.h"
#include "emoe/models/model.h"

namespace emoe {

std::vector<NamedRouted> routed_ffn_plugs(PretrainedModelImpl& model) {
  std::vector<NamedRouted> out;
  for (FfnSlot* slot : model.ffn_slots()) {
    Routed* r = slot->plug() ? slot->plug()->routed() : nullptr;
    if (r)
      out.push_back({fmt::format("layer {}", slot->layer_index()), slot->layer_index(), true, r});
  }
  return out;
}

std::vector<NamedRouted> routed_modules(PretrainedModelImpl& model) {
  auto out = routed_ffn_plugs(model);
  const auto slots = model.ffn_slots();
  auto layer_of = [&](const std::string& name) -> int64_t {
    for (FfnSlot* slot : slots)
      if (name.rfind(slot->layer_prefix() + ".", 0) == 0) return slot->layer_index();
    return -1;
  };
  for (const auto& m : model.named_modules()) {
    auto* linear = dynamic_cast<LinearImpl*>(m.value().get());
    Routed* r = linear && linear->adapter() ? linear->adapter()->routed() : nullptr;
    if (r) out.push_back({m.key(), layer_of(m.key()), false, r});
  }
  return out;
}

at::Tensor routed_aux_loss(PretrainedModelImpl& model) {
  torch::Tensor total;
  for (const auto& m : routed_modules(model)) {
    auto a = m.routed->aux_loss();
    if (a.defined()) total = total.defined() ? total + a : a;
  }
  return total;
}

int64_t set_routed_dense_override(PretrainedModelImpl& model, bool on) {
  int64_t n = 0;
  for (const auto& m : routed_modules(model)) {
    if (!m.routed->supports_dense_override()) continue;
    m.routed->set_dense_override(on);
    ++n;
  }
  return n;
}

}  // namespace emoe
