// Finding and naming the Linear modules PEFT adapts, and where an adapter would not be reached.
#include "emoe/peft/targets.h"

#include <torch/torch.h>

#include <set>

#include "emoe/core/error.h"
#include "emoe/models/architecture.h"
#include "emoe/models/ffn_slot.h"

namespace emoe {

namespace {

std::vector<std::string> peft_split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    auto dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

bool peft_all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<NamedLinear> named_linears(PretrainedModelImpl& model) {
  std::vector<NamedLinear> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* lin = item.value()->as<LinearImpl>()) out.push_back({item.key(), lin});
  }
  return out;
}

std::set<const c10::TensorImpl*> adapter_parameters(PretrainedModelImpl& model) {
  std::set<const c10::TensorImpl*> out;
  for (const auto& l : named_linears(model))
    if (l.linear->adapter())
      for (const auto& p : l.linear->adapter()->parameters(/*recurse=*/true))
        out.insert(p.unsafeGetTensorImpl());
  return out;
}

bool target_matches(const std::string& target, const std::string& module_name) {
  if (target.empty()) return false;
  auto t = peft_split_dots(target), m = peft_split_dots(module_name);
  if (t.size() > m.size()) return false;
  const size_t off = m.size() - t.size();
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != "*" && t[i] != m[off + i]) return false;
  return true;
}

std::string hf_module_path(const PretrainedModelImpl& model, const std::string& module_key) {
  // file_key maps parameter keys: go through the module's weight
  auto k = model.file_key(module_key + ".weight");
  return k.substr(0, k.size() - 7);
}

std::string module_key_of_hf_path(const PretrainedModelImpl& model, const std::string& hf_path) {
  auto k = model.module_key(hf_path + ".weight");
  if (k.size() < 7 || k.compare(k.size() - 7, 7, ".weight") != 0) return "";
  return k.substr(0, k.size() - 7);
}

std::string linear_names_summary(const std::vector<NamedLinear>& linears) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& l : linears) {
    auto parts = peft_split_dots(l.name);
    std::string folded;
    for (size_t i = 0; i < parts.size(); ++i)
      folded += (i ? "." : "") + (peft_all_digits(parts[i]) ? std::string("*") : parts[i]);
    if (seen.insert(folded).second) names.push_back(folded);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

std::vector<ScaledRange> scaled_output_ranges(const PretrainedModelImpl& model,
                                              const std::string& module_key,
                                              const LinearImpl& linear) {
  const auto& o = linear.options();
  for (const auto& fused : architecture_of(model.summary()).fused) {
    const auto parts = static_cast<int64_t>(fused.parts.size());
    if (!target_matches(fused.module, module_key) || o.out != parts * o.in) continue;
    std::vector<ScaledRange> keys_values;  // (IA)^3 and MoV scale keys and values, not queries
    for (int64_t i = 0; i < parts; ++i)
      if (fused.parts[i] == "k" || fused.parts[i] == "v")
        keys_values.push_back(ScaledRange{i * o.in, o.in, fused.parts[i]});
    return keys_values;
  }
  return {ScaledRange{0, o.out, ""}};
}

void check_adapter_reaches(PretrainedModelImpl& model, const std::string& module_key,
                           const LinearImpl& linear) {
  const void* w = linear.weight.data_ptr();
  auto same = [&](const torch::Tensor& t) { return t.defined() && t.data_ptr() == w; };
  for (FfnSlot* slot : model.ffn_slots()) {
    if (!slot->plug()) continue;
    auto v = slot->ffn_view();
    const bool input_side = same(v.w_in) || same(v.w_up);
    const bool output_side = same(v.w_out);
    if (!input_side && !output_side) continue;
    const std::string why = slot->plug()->bypasses_linear(input_side);
    EMOE_CHECK(why.empty(), UsageError,
               "peft target {}: the layer's MoE plug bypasses this Linear ({}), so an adapter "
               "there would be skipped; use --execution masked or adapt other modules",
               module_key, why);
  }
}

}  // namespace emoe
