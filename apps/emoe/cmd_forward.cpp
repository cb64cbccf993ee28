// `emoe forward MODEL_DIR --input IN.safetensors -o OUT.safetensors`: the numerics parity tool.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/moe/convert.h"

namespace emoe::cli {
namespace {

struct ForwardArgs {
  std::string model_dir, input, output, head;
  bool no_hidden_states = false, attentions = false;
  RunFlags run;
};

// Labels as the head's loss reads them, checked before the model sees them (out of range, libtorch
// stops with "Target 5 is out of bounds" or an index error). Language-model heads: a token id or
// -100 (ignored) per position; sequence classification with integer labels: a class id per row
// (or a 0/1 row of num_labels for multi-label); float labels: regression / multi-label targets.
void check_labels(const std::string& file, const ModelInputs& in, const ModelSummary& s) {
  const auto& y = in.labels;
  if (!y.defined() || s.head == Head::kBase) return;
  const bool integer = !at::isFloatingType(y.scalar_type()) && y.scalar_type() != torch::kBool;
  const int64_t b = in.input_ids.size(0);
  const std::string shape = fmt::format("[{}]", fmt::join(y.sizes(), ", "));
  if (s.head == Head::kSequenceClassification) {
    const bool per_row = y.numel() == b;
    const bool per_label = y.dim() == 2 && y.size(0) == b && y.size(1) == s.num_labels;
    EMOE_CHECK(per_row || per_label, InputError,
               "{}: tensor 'labels': expected [{}] (one per row) or [{}, {}] (num_labels), got {}",
               file, b, b, s.num_labels, shape);
    if (!integer || s.num_labels < 2 || y.numel() == 0) return;
    const auto lo = y.min().item<int64_t>(), hi = y.max().item<int64_t>();
    EMOE_CHECK(lo >= 0 && hi < s.num_labels, InputError,
               "{}: tensor 'labels': class ids must lie in [0, {}) (num_labels), found {}..{}",
               file, s.num_labels, lo, hi);
    return;
  }
  // masked, causal and seq2seq language models
  EMOE_CHECK(integer, InputError,
             "{}: tensor 'labels': expected token ids (an integer dtype), got {}", file,
             c10::toString(y.scalar_type()));
  if (s.head == Head::kSeq2SeqLM)
    EMOE_CHECK(y.dim() == 2 && y.size(0) == b && y.size(1) > 0, InputError,
               "{}: tensor 'labels': expected a non-empty [{}, seq], got {}", file, b, shape);
  else
    EMOE_CHECK(y.sizes() == in.input_ids.sizes(), InputError,
               "{}: tensor 'labels': shape {} differs from input_ids [{}]", file, shape,
               fmt::join(in.input_ids.sizes(), ", "));
  const auto kept = y.to(torch::kLong).masked_fill(y.to(torch::kLong) == -100, 0);
  const auto lo = kept.min().item<int64_t>(), hi = kept.max().item<int64_t>();
  EMOE_CHECK(lo >= 0 && hi < s.vocab_size, InputError,
             "{}: tensor 'labels': ids must lie in [0, {}) or be -100 (ignored), found {}..{}",
             file, s.vocab_size, lo, hi);
}

void run_forward(const ForwardArgs& a) {
  auto rs = apply_run_flags(a.run);
  SafetensorsFile in_file(a.input);
  EMOE_CHECK(in_file.contains("input_ids"), InputError, "{}: missing tensor 'input_ids'", a.input);
  auto load_ids = [&](const std::string& name) -> torch::Tensor {
    if (!in_file.contains(name)) return {};
    auto t = in_file.load(name);
    EMOE_CHECK(!at::isFloatingType(t.scalar_type()) && t.scalar_type() != torch::kBool, InputError,
               "{}: tensor '{}': expected an integer dtype, got {}", a.input, name,
               in_file.entry(name).dtype);
    EMOE_CHECK(t.dim() == 2, InputError,
               "{}: tensor '{}': expected shape [batch, seq], got {} dims", a.input, name, t.dim());
    return t.to(torch::kLong);
  };
  ModelInputs in;
  in.input_ids = load_ids("input_ids");
  in.attention_mask = load_ids("attention_mask");
  in.token_type_ids = load_ids("token_type_ids");
  in.position_ids = load_ids("position_ids");
  in.labels = in_file.contains("labels") ? in_file.load("labels") : torch::Tensor();
  // encoder-decoder models (T5): the decoder's tokens (default: labels shifted right)
  in.decoder_input_ids = load_ids("decoder_input_ids");
  in.decoder_attention_mask = load_ids("decoder_attention_mask");
  for (const auto& [name, t] :
       {std::pair<const char*, torch::Tensor>{"attention_mask", in.attention_mask},
        {"token_type_ids", in.token_type_ids},
        {"position_ids", in.position_ids}}) {
    if (t.defined())
      EMOE_CHECK(t.sizes() == in.input_ids.sizes(), InputError,
                 "{}: tensor '{}': shape [{}] differs from input_ids [{}]", a.input, name,
                 fmt::join(t.sizes(), ", "), fmt::join(in.input_ids.sizes(), ", "));
  }
  if (in.decoder_attention_mask.defined())
    EMOE_CHECK(in.decoder_input_ids.defined() &&
                   in.decoder_attention_mask.sizes() == in.decoder_input_ids.sizes(),
               InputError,
               "{}: tensor 'decoder_attention_mask' needs 'decoder_input_ids' of the same shape",
               a.input);
  EMOE_CHECK(in.input_ids.numel() > 0, InputError, "{}: tensor 'input_ids' is empty", a.input);
  in.output_hidden_states = !a.no_hidden_states;
  in.output_attentions = a.attentions;

  LoadOptions lo;
  lo.device = rs.device;
  lo.dtype = rs.dtype;
  if (!a.head.empty()) lo.head = parse_head(a.head);
  auto model = load_any_model(a.model_dir, lo);
  const auto& s = model->summary();
  auto lo_id = in.input_ids.min().item<int64_t>(), hi_id = in.input_ids.max().item<int64_t>();
  EMOE_CHECK(lo_id >= 0 && hi_id < s.vocab_size, InputError,
             "{}: tensor 'input_ids': ids must lie in [0, {}), found {}..{}", a.input, s.vocab_size,
             lo_id, hi_id);
  const bool seq2seq = s.encoder_decoder();
  EMOE_CHECK(seq2seq || !in.decoder_input_ids.defined(), InputError,
             "{}: tensor 'decoder_input_ids' is for encoder-decoder models; this is a {} model",
             a.input, s.model_type);
  if (seq2seq) {
    EMOE_CHECK(
        in.decoder_input_ids.defined() || (in.labels.defined() && s.head == Head::kSeq2SeqLM),
        InputError, "{}: a {} {} model needs tensor 'decoder_input_ids'{}", a.input, s.model_type,
        head_name(s.head),
        s.head == Head::kSeq2SeqLM ? " (or 'labels', shifted right to make them)" : "");
    if (in.decoder_input_ids.defined()) {
      EMOE_CHECK(
          in.decoder_input_ids.size(0) == in.input_ids.size(0) && in.decoder_input_ids.numel() > 0,
          InputError, "{}: tensor 'decoder_input_ids': expected a non-empty [{}, seq], got [{}]",
          a.input, in.input_ids.size(0), fmt::join(in.decoder_input_ids.sizes(), ", "));
      auto dlo = in.decoder_input_ids.min().item<int64_t>(),
           dhi = in.decoder_input_ids.max().item<int64_t>();
      EMOE_CHECK(dlo >= 0 && dhi < s.vocab_size, InputError,
                 "{}: tensor 'decoder_input_ids': ids must lie in [0, {}), found {}..{}", a.input,
                 s.vocab_size, dlo, dhi);
    }
  }
  check_labels(a.input, in, s);
  if (in.position_ids.defined()) {
    auto pmax = in.position_ids.max().item<int64_t>();
    EMOE_CHECK(in.position_ids.min().item<int64_t>() >= 0 && pmax < s.max_positions, InputError,
               "{}: tensor 'position_ids': positions must lie in [0, {}), found max {}", a.input,
               s.max_positions, pmax);
  }
  torch::NoGradGuard no_grad;
  ModelOutputs out;
  try {  // what only the model knows (BERT's token types): named with the input file
    out = model->forward(in);
  } catch (const InputError& e) {
    EMOE_THROW(InputError, "{}: {}", a.input, e.what());
  }
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  auto f32 = [](const torch::Tensor& t) { return t.to(torch::kCPU).to(torch::kFloat); };
  if (out.logits.defined()) tensors.emplace_back("logits", f32(out.logits));
  tensors.emplace_back("last_hidden_state", f32(out.last_hidden_state));
  if (out.encoder_last_hidden_state.defined())
    tensors.emplace_back("encoder_last_hidden_state", f32(out.encoder_last_hidden_state));
  if (out.pooler_output.defined()) tensors.emplace_back("pooler_output", f32(out.pooler_output));
  if (out.loss.defined()) tensors.emplace_back("loss", f32(out.loss));
  // encoder-decoder models: Hugging Face's names, decoder_* and encoder_*
  const std::string prefix = seq2seq ? "decoder_" : "";
  if (!out.hidden_states.empty())
    tensors.emplace_back(prefix + "hidden_states", f32(torch::stack(out.hidden_states)));
  if (!out.attentions.empty())
    tensors.emplace_back(prefix + "attentions", f32(torch::stack(out.attentions)));
  if (!out.encoder_hidden_states.empty())
    tensors.emplace_back("encoder_hidden_states", f32(torch::stack(out.encoder_hidden_states)));
  if (!out.encoder_attentions.empty())
    tensors.emplace_back("encoder_attentions", f32(torch::stack(out.encoder_attentions)));
  if (!out.cross_attentions.empty())
    tensors.emplace_back("cross_attentions", f32(torch::stack(out.cross_attentions)));
  save_safetensors(a.output, tensors, {{"format", "pt"}, {"producer", "emoe forward"}});
  spdlog::info("wrote {} ({} tensors)", a.output, tensors.size());
}

}  // namespace

void register_forward(CLI::App& app) {
  auto a = std::make_shared<ForwardArgs>();
  auto* cmd = app.add_subcommand(
      "forward", "Run a model on tensors from a safetensors file and write its outputs");
  cmd->add_option("MODEL_DIR", a->model_dir, "Model folder")->required();
  cmd->add_option(
         "--input,-i", a->input,
         "safetensors with input_ids [and attention_mask, token_type_ids, position_ids, labels; "
         "T5: decoder_input_ids, decoder_attention_mask]")
      ->required();
  cmd->add_option("--output,-o", a->output, "Where to write logits / hidden states")->required();
  cmd->add_option("--head", a->head, "Override the head: base, seqcls, mlm, lm, seq2seq-lm");
  cmd->add_flag("--no-hidden-states", a->no_hidden_states, "Do not write hidden_states");
  cmd->add_flag("--attentions", a->attentions, "Also write attention probabilities");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_forward(*a); });
}

}  // namespace emoe::cli
