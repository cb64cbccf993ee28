// objective instruction: Alpaca data on a causal LM, the loss on the response tokens only; the
// dev loss picks the best epoch, and MMLU (when given) is scored at every evaluation.
#include <torch/torch.h>

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/train/objective.h"

namespace emoe {

namespace {

// An example whose response max_length cut away entirely teaches nothing: dropped.
std::vector<EncodedExample> with_response_tokens(std::vector<EncodedExample> v, const char* what,
                                                 int64_t max_length) {
  const size_t before = v.size();
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const EncodedExample& e) {
                           return std::all_of(e.lm_labels.begin() + (e.lm_labels.empty() ? 0 : 1),
                                              e.lm_labels.end(),
                                              [](int64_t l) { return l == -100; });
                         }),
          v.end());
  if (v.size() < before)
    spdlog::info("{}: dropped {} of {} examples whose response does not fit in max_length {}", what,
                 before - v.size(), before, max_length);
  return v;
}

class InstructionObjective : public Objective {
 public:
  using Objective::Objective;

  void load_data(const Tokenizer& tok) override {
    const int64_t max_len = cfg_.train.max_length;
    auto all = load_alpaca(cfg_.instruct_data);
    keep_fixed_subset(all, cfg_.train.max_train_examples);
    const auto n_dev = static_cast<size_t>(
        std::max<double>(1.0, cfg_.instruct_dev_fraction * static_cast<double>(all.size())));
    EMOE_CHECK(all.size() > n_dev, InputError, "{}: too few examples ({}) for a dev split",
               cfg_.instruct_data, all.size());
    std::vector<InstructionExample> dev(all.end() - n_dev, all.end());
    all.resize(all.size() - n_dev);
    train_ = with_response_tokens(encode_instructions(all, tok, max_len), "train", max_len);
    dev_ = with_response_tokens(encode_instructions(dev, tok, max_len), "dev", max_len);
    if (!cfg_.mmlu_dir.empty()) {
      namespace fs = std::filesystem;
      mmlu_ = load_mmlu_split((fs::path(cfg_.mmlu_dir) / "val").string());
      keep_fixed_subset(mmlu_, cfg_.mmlu_max_questions);
      if (cfg_.mmlu_shots > 0)
        mmlu_dev_ = load_mmlu_split((fs::path(cfg_.mmlu_dir) / "dev").string());
    }
    spdlog::info("instruction tuning: {} training examples, {} dev, {} MMLU questions ({}-shot)",
                 train_.size(), dev.size(), mmlu_.size(), cfg_.mmlu_shots);
  }

  void set_head(LoadOptions& options) const override { options.head = Head::kCausalLM; }

  Batch collate(const std::vector<const EncodedExample*>& examples, int64_t pad_id) const override {
    return emoe::collate(examples, pad_id, false, true);
  }

  // the loss is a mean over the predicted (shifted) response tokens
  double loss_count(const ModelInputs& in, size_t /*examples*/) const override {
    return (in.labels.narrow(1, 1, in.labels.size(1) - 1) != -100).sum().item<double>();
  }

  nlohmann::json evaluate(EvalContext& e) const override {
    nlohmann::json sets = nlohmann::json::object();
    sets["dev"] = e.measure("dev", [&] {
      return eval_record(
          evaluate_lm_loss(e.model, dev_, cfg_.train.eval_batch_size, e.pad_id, e.shard));
    });
    if (!mmlu_.empty()) {
      sets["mmlu"] = e.measure("mmlu", [&] {
        auto r = evaluate_mmlu(
            e.model, e.tok, mmlu_, mmlu_dev_, cfg_.mmlu_shots,
            std::min<int64_t>(cfg_.train.max_length, e.model.summary().max_positions));
        return nlohmann::json{{"metrics", {{"accuracy", r.accuracy}}},
                              {"examples", r.questions},
                              {"per_subject", r.per_subject}};
      });
    }
    return sets;
  }

  double main_score(const nlohmann::json& sets) const override {
    return -sets["dev"]["loss"].get<double>();
  }
  std::string main_metric() const override { return "dev_loss"; }

 private:
  std::vector<EncodedExample> dev_;
  std::vector<MultipleChoiceExample> mmlu_, mmlu_dev_;
};

}  // namespace

std::unique_ptr<Objective> make_instruction_objective(const RunConfig& cfg) {
  return std::make_unique<InstructionObjective>(cfg);
}

}  // namespace emoe
