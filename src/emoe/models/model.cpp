// Shared model helpers: head names, losses and the config written back with a checkpoint.
#include "emoe/models/model.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/linear.h"
#include "emoe/models/lm_loss.h"
#include "emoe/models/recompute.h"
#include "emoe/models/row_kernels.h"
#include "emoe/models/small_gemm.h"

namespace emoe {

std::string head_name(Head h) {
  switch (h) {
    case Head::kBase:
      return "base";
    case Head::kSequenceClassification:
      return "seqcls";
    case Head::kMaskedLM:
      return "mlm";
    case Head::kCausalLM:
      return "lm";
    case Head::kSeq2SeqLM:
      return "seq2seq-lm";
  }
  return "?";
}

Head parse_head(const std::string& name) {
  if (name == "base" || name == "none") return Head::kBase;
  if (name == "seqcls" || name == "sequence-classification" || name == "cls")
    return Head::kSequenceClassification;
  if (name == "mlm" || name == "masked-lm") return Head::kMaskedLM;
  if (name == "lm" || name == "causal-lm") return Head::kCausalLM;
  if (name == "seq2seq-lm" || name == "s2s" || name == "seq2seq") return Head::kSeq2SeqLM;
  EMOE_THROW(UsageError, "--head: expected base, seqcls, mlm, lm or seq2seq-lm, got '{}'", name);
}

std::string head_class(const std::string& model, Head head,
                       std::initializer_list<HeadClass> classes) {
  std::string heads;
  size_t i = 0;
  for (const HeadClass& c : classes) {
    if (c.head == head) return c.class_name;
    heads += (i == 0 ? "" : i + 1 == classes.size() ? " and " : ", ") + head_name(c.head);
    ++i;
  }
  EMOE_THROW(UsageError, "{} supports the heads {}, not {}", model, heads, head_name(head));
}

nlohmann::json config_with_architecture(const JsonFields& config, const std::string& class_name) {
  auto j = config.raw();
  j["architectures"] = {class_name};
  return j;
}

std::shared_ptr<torch::nn::Module> container() {
  return std::make_shared<torch::nn::Module>();
}

torch::Tensor PretrainedModelImpl::run_block(
    size_t i, torch::nn::Module& block, const std::vector<torch::Tensor>& inputs,
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& forward, bool plain) {
  return emoe::run_block(block_hooks_, i, block, checkpointing_ && is_training() && !plain, inputs,
                         forward);
}

nlohmann::json PretrainedModelImpl::config_json() const {
  return config_json_;
}

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  auto t = logits.size(1);
  // without gradients (evaluation, inference): the row kernels' float32 log-sum-exp over each
  // row as it is (float32 or bfloat16), where cross_entropy would first copy every shifted logit
  // to float32 and take a log-softmax of the copy
  if (t > 1 && logits.dim() == 3 && logits.device().is_cpu() &&
      !(torch::GradMode::is_enabled() && logits.requires_grad())) {
    RECORD_FUNCTION("emoe::causal_lm_loss_rows", std::vector<c10::IValue>());
    const auto target = labels.narrow(1, 1, t - 1).to(logits.device()).contiguous();
    const auto valid = target != -100;
    const auto safe = target.clamp_min(0).contiguous();
    auto row_loss = torch::empty(target.sizes(), logits.options().dtype(torch::kFloat));
    bool applied = true;
    for (int64_t b = 0; applied && b < logits.size(0); ++b)
      applied =
          softmax_xent_rows(logits[b].narrow(0, 0, t - 1), safe[b], torch::Tensor(), row_loss[b]);
    // the mean over kept positions (none kept: NaN, as cross_entropy's)
    if (applied) return (row_loss * valid).sum() / valid.sum().to(torch::kFloat);
  }
  auto shifted = logits.narrow(1, 0, t - 1).reshape({-1, logits.size(-1)});
  auto target = labels.narrow(1, 1, t - 1).reshape({-1}).to(logits.device());
  return torch::nn::functional::cross_entropy(
      shifted.to(torch::kFloat), target,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

void causal_lm_head(const torch::Tensor& h, LinearImpl* lm_head, const torch::Tensor& tied_weight,
                    const ModelInputs& in, ModelOutputs& out) {
  if (!in.output_logits && in.labels.defined() &&
      (!lm_head || (!lm_head->adapter() && !lm_head->bias.defined()))) {
    const auto w = lm_head ? lm_head->weight_out_in() : tied_weight;
    if (chunked_lm_loss_supported(h, w)) {
      out.loss = chunked_causal_lm_loss(h, w, in.labels);
      return;
    }
  }
  const auto hl = in.last_logits_only && !in.labels.defined() && h.dim() == 3 && h.size(1) > 1
                      ? h.narrow(1, h.size(1) - 1, 1)
                      : h;
  if (lm_head)
    out.logits = lm_head->forward(hl);
  else if (small_gemm_applies(hl, tied_weight, {}, /*weight_kn=*/false))  // decoding
    out.logits = small_gemm_linear(hl, tied_weight, {}, /*weight_kn=*/false);
  else
    out.logits = torch::linear(hl, tied_weight);
  if (in.labels.defined()) out.loss = causal_lm_loss(out.logits, in.labels);
}

torch::Tensor token_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
      labels.reshape({-1}).to(logits.device()),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

void decoder_only_outputs(const torch::Tensor& h, const DecoderHeads& heads, const ModelInputs& in,
                          ModelOutputs& out) {
  if (in.output_hidden_states) out.hidden_states.push_back(h);
  out.last_hidden_state = h;
  if (heads.head == Head::kCausalLM) {
    causal_lm_head(h, heads.lm_head, heads.embedding, in, out);
  } else if (heads.head == Head::kSequenceClassification) {
    const auto dev = h.device();
    auto all = heads.score->forward(h);
    auto idx = in.attention_mask.defined()
                   ? last_real_token_index(in.attention_mask.to(dev))
                   : last_token_index(in.input_ids.to(dev), heads.pad_token_id);
    out.logits = all.index({torch::arange(in.input_ids.size(0), idx.options()), idx});
    if (in.labels.defined())
      out.loss =
          sequence_classification_loss(out.logits, in.labels, heads.num_labels, heads.problem_type);
  }
}

torch::Tensor sequence_classification_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                           int64_t num_labels, const std::string& problem_type) {
  auto y = labels.to(logits.device());
  std::string kind = problem_type;
  if (kind.empty()) {
    if (num_labels == 1)
      kind = "regression";
    else if (y.scalar_type() == torch::kLong || y.scalar_type() == torch::kInt)
      kind = "single_label_classification";
    else
      kind = "multi_label_classification";
  }
  auto lf = logits.to(torch::kFloat);
  if (kind == "regression")
    return torch::mse_loss(lf.squeeze(-1), y.to(torch::kFloat).view(lf.squeeze(-1).sizes()));
  if (kind == "single_label_classification")
    return torch::nn::functional::cross_entropy(lf.view({-1, num_labels}),
                                                y.view({-1}).to(torch::kLong));
  if (kind == "multi_label_classification")
    return torch::binary_cross_entropy_with_logits(lf, y.to(torch::kFloat));
  EMOE_THROW(InputError,
             "problem_type: expected regression, single_label_classification or "
             "multi_label_classification, got '{}'",
             problem_type);
}

torch::Tensor last_token_index(const torch::Tensor& input_ids, std::optional<int64_t> pad_id) {
  const auto t = input_ids.size(1);
  if (!pad_id)
    return torch::full({input_ids.size(0)}, t - 1, input_ids.options().dtype(torch::kLong));
  auto idx = (input_ids == *pad_id).to(torch::kLong).argmax(-1) - 1;
  return torch::remainder(idx, t);  // -1 -> last position, as Python indexing does
}

torch::Tensor last_real_token_index(const torch::Tensor& attention_mask) {
  const auto t = attention_mask.size(1);
  auto pos = torch::arange(t, attention_mask.options().dtype(torch::kLong)).unsqueeze(0);
  auto masked = torch::where(attention_mask != 0, pos, torch::full_like(pos, -1));
  auto idx = std::get<0>(masked.max(1));
  return idx.clamp_min(0);
}

}  // namespace emoe
