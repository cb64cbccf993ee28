// BERT (Hugging Face BertModel / BertForSequenceClassification / BertForMaskedLM) and RoBERTa,
// the same encoder under "roberta." with position ids counted from padding_idx + 1, a
// dense-tanh-out_proj classification head on <s> and no pooler in its task models.
#pragma once
#include "emoe/io/hf_config.h"
#include "emoe/models/architecture.h"
#include "emoe/models/model.h"

namespace emoe {

struct BertConfig {
  bool roberta = false;
  int64_t vocab_size = 30522, hidden_size = 768, num_hidden_layers = 12, num_attention_heads = 12;
  int64_t intermediate_size = 3072, max_position_embeddings = 512, type_vocab_size = 2;
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.1, attention_probs_dropout_prob = 0.1;
  std::optional<double> classifier_dropout;
  double layer_norm_eps = 1e-12, initializer_range = 0.02;
  std::optional<int64_t> pad_token_id = 0;
  int64_t num_labels = 2;
  std::string problem_type;

  static BertConfig from_json(const JsonFields& j, bool roberta = false);
};

// Head::kBase, kSequenceClassification or kMaskedLM.
ModelPtr make_bert(const JsonFields& config, Head head);
// The head Hugging Face's `architectures[0]` names (BertForMaskedLM -> kMaskedLM, ...).
Head bert_head_from_config(const JsonFields& config);
ModelPtr make_roberta(const JsonFields& config, Head head);
Head roberta_head_from_config(const JsonFields& config);

// The families' traits (architecture.h), registered in architecture.cpp.
const Architecture& bert_architecture();
const Architecture& roberta_architecture();

}  // namespace emoe
