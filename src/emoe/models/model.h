// The interface every architecture implements: inputs, outputs, heads, checkpoint keys, FFN slots.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "emoe/core/block_hooks.h"
#include "emoe/models/attention.h"
#include "emoe/models/ffn_slot.h"

namespace emoe {

class JsonFields;
class LinearImpl;

// kSeq2SeqLM: an encoder-decoder language model (T5ForConditionalGeneration).
enum class Head { kBase, kSequenceClassification, kMaskedLM, kCausalLM, kSeq2SeqLM };
std::string head_name(Head h);
// "base", "seqcls"/"sequence-classification", "mlm", "lm"/"causal-lm", "seq2seq-lm"/"s2s".
Head parse_head(const std::string& name);

struct ModelSummary {
  std::string model_type;  // config.json's model_type (architecture.h: its traits)
  Head head = Head::kBase;
  bool causal = false;     // decoder-only (GPT-2, Llama)
  bool gated_ffn = false;  // FFN = w_out (act(w_in x) * (w_up x)) (Llama, T5 v1.1)
  // a table of max_positions learned position embeddings (BERT, RoBERTa, GPT-2): no position
  // beyond it exists (rotary and relative positions have no such bound)
  bool learned_positions = false;
  // Encoder-decoder models (T5): num_layers counts the encoder's blocks and num_decoder_layers
  // the decoder's; ffn_slots() lists the encoder's FFNs first, then the decoder's. 0 otherwise.
  int64_t num_layers = 0, num_decoder_layers = 0, hidden_size = 0, num_heads = 0, num_kv_heads = 0;
  int64_t intermediate_size = 0, vocab_size = 0, max_positions = 0, num_labels = 0;
  int64_t head_dim = 0;  // per attention head; 0: hidden_size / num_heads (T5 sets d_kv)
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  std::optional<int64_t> decoder_start_token_id;  // encoder-decoder models
  std::string activation;
  bool encoder_decoder() const { return num_decoder_layers > 0; }
  // The width of one attention head: head_dim, or hidden_size / num_heads when it is 0.
  int64_t attention_head_dim() const {
    return head_dim > 0 ? head_dim : (num_heads > 0 ? hidden_size / num_heads : 0);
  }
  // The number of FFN slots (what MoE layer indices count): encoder + decoder layers.
  int64_t ffn_layers() const { return num_layers + num_decoder_layers; }
};

struct ModelInputs {
  torch::Tensor input_ids;       // [B, T] int64
  torch::Tensor attention_mask;  // [B, S] 1 = real token (S = past + T), optional
  torch::Tensor token_type_ids;  // [B, T] (BERT), optional
  torch::Tensor position_ids;    // [B, T], optional (default past..past+T-1)
  torch::Tensor labels;          // optional: a loss is computed when defined
  // Encoder-decoder models (T5): input_ids/attention_mask feed the encoder.
  torch::Tensor decoder_input_ids;       // [B, T'] (default: labels shifted right)
  torch::Tensor decoder_attention_mask;  // [B, past + T'] optional (default: causal only)
  // [B, S, H] a previous run's encoder output (incremental decoding): the encoder is skipped
  torch::Tensor encoder_last_hidden_state;
  bool output_hidden_states = false;
  bool output_attentions = false;
  // false: when labels are given only the loss is wanted (training), and causal LMs compute it
  // in chunks without the [B, T, vocab] logits (lm_loss.h); logits stay undefined then
  bool output_logits = true;
  // causal LMs without labels: the logits of the last position only ([B, 1, vocab]), all that
  // generation needs from a prompt (the LM head over every prompt position is prompt x hidden x
  // vocab multiply-adds for nothing)
  bool last_logits_only = false;
  KvCache* cache = nullptr;  // decoder self-attention (and cross-attention) keys and values:
                             // read and extended in place
};

struct ModelOutputs {
  torch::Tensor logits;                      // head output (undefined for the base model)
  torch::Tensor last_hidden_state;           // [B, T, H]
  torch::Tensor pooler_output;               // BERT base model
  torch::Tensor loss;                        // when labels were given
  std::vector<torch::Tensor> hidden_states;  // layers + 1 entries, when asked
  std::vector<torch::Tensor> attentions;     // per layer [B, heads, T, S], when asked
  // Encoder-decoder models: hidden_states/attentions above are the decoder's (as Hugging Face's
  // decoder_hidden_states/decoder_attentions), these the encoder's and the cross-attention's.
  torch::Tensor encoder_last_hidden_state;           // [B, S, H]
  std::vector<torch::Tensor> encoder_hidden_states;  // encoder layers + 1, when asked
  std::vector<torch::Tensor> encoder_attentions;     // per layer [B, heads, S, S], when asked
  std::vector<torch::Tensor> cross_attentions;       // per layer [B, heads, T, S], when asked
};

class PretrainedModelImpl : public torch::nn::Module {
 public:
  virtual ModelOutputs forward(const ModelInputs& in) = 0;
  virtual const ModelSummary& summary() const = 0;
  virtual std::vector<FfnSlot*> ffn_slots() = 0;

  // Load quirks: maps a checkpoint key to our module key ("" = a known key to ignore, such as
  // GPT-2's attn.bias buffers or a tied lm_head copy).
  virtual std::string module_key(const std::string& file_key) const = 0;
  // Maps a module key to the key Hugging Face writes for this model class.
  virtual std::string file_key(const std::string& module_key) const = 0;
  // True for parameters of the task head (a new head may be initialised when they are missing).
  virtual bool is_head_key(const std::string& module_key) const = 0;
  // Re-initialises the task head as Hugging Face does (normal(0, initializer_range), zero bias).
  virtual void init_head() = 0;
  // The embedding matrix (for resizing, tying, and pretraining).
  virtual torch::Tensor input_embeddings() = 0;
  // Each transformer block, in the order forward runs them (encoder-decoder: the encoder's, then
  // the decoder's); forward calls the block hooks around each (train.sharding full).
  virtual std::vector<torch::nn::Module*> blocks() = 0;
  // Whether a block's parameter (its key inside the block) is read outside that block's forward
  // (T5's relative position bias, which the stack computes before its first block): such a
  // parameter cannot be gathered around the block alone.
  virtual bool read_outside_block(const std::string& /*key_in_block*/) const { return false; }
  // Hooks called around each block's forward (null: none). Not owned.
  void set_block_hooks(BlockHooks* hooks) { block_hooks_ = hooks; }
  BlockHooks* block_hooks() const { return block_hooks_; }
  // Activation checkpointing of every block in training forwards (train.gradient_checkpointing;
  // recompute.h): no block keeps its activations for the backward pass, which runs each block
  // again. Forwards with a KV cache or asked for attention probabilities run plainly.
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  bool gradient_checkpointing() const { return checkpointing_; }

  // config.json to write back: the original fields with architectures/num_labels updated.
  nlohmann::json config_json() const;
  void set_config_json(nlohmann::json j) { config_json_ = std::move(j); }

 protected:
  // Runs block i (`block`) on `inputs` between the block hooks, checkpointed when
  // gradient_checkpointing() is on, the model is training and `plain` is false (a cache or
  // attention probabilities asked for). `forward` is kept until the backward pass: it must
  // capture by value, and take every tensor that may need a gradient through `inputs`.
  torch::Tensor run_block(
      size_t i, torch::nn::Module& block, const std::vector<torch::Tensor>& inputs,
      const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& forward,
      bool plain = false);

  nlohmann::json config_json_;
  BlockHooks* block_hooks_ = nullptr;
  bool checkpointing_ = false;
};
using ModelPtr = std::shared_ptr<PretrainedModelImpl>;

// An architecture's Hugging Face class for a head it supports (config.json's "architectures").
struct HeadClass {
  Head head;
  const char* class_name;
};
// The class of `head` among the architecture's `classes`; UsageError "<model> supports the heads
// base, seqcls and lm, not mlm" (the heads in the order given) when it is not among them.
std::string head_class(const std::string& model, Head head,
                       std::initializer_list<HeadClass> classes);
// The config.json a model writes back: `config` with "architectures" = [class_name].
nlohmann::json config_with_architecture(const JsonFields& config, const std::string& class_name);

// An empty module that only names a level of the tree, so that named_parameters() spells
// Hugging Face's keys (e.g. "attention" in bert.encoder.layer.0.attention.self.query).
std::shared_ptr<torch::nn::Module> container();

// Hugging Face losses: shifted causal-LM cross-entropy (ignore -100), masked-LM cross-entropy,
// and sequence classification by problem type (regression when num_labels == 1).
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);
// The causal-LM head: logits = lm_head(h), or h E^T with the tied embedding E when there is no
// lm_head, and the loss when labels are given; without in.output_logits, an lm_head with no
// adapter and no bias, and float32 without autocast, only the loss, in chunks (lm_loss.h).
void causal_lm_head(const torch::Tensor& h, LinearImpl* lm_head, const torch::Tensor& tied_weight,
                    const ModelInputs& in, ModelOutputs& out);
torch::Tensor token_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels);

// The heads of a decoder-only model (GPT-2, Llama) and what they need.
struct DecoderHeads {
  Head head = Head::kBase;
  LinearImpl* lm_head = nullptr;  // causal LM; null: tied to `embedding`
  torch::Tensor embedding;        // the input embedding matrix [vocab, H]
  LinearImpl* score = nullptr;    // sequence classification
  std::optional<int64_t> pad_token_id;
  int64_t num_labels = 0;
  std::string problem_type;
};
// The end of a decoder-only model's forward: `h` [B, T, H], the final norm's output, becomes the
// last hidden state (and the last of hidden_states when asked); then the causal-LM head
// (causal_lm_head), or the classifier scores each row's last real token (last_real_token_index
// with an attention mask, else last_token_index), with the loss when labels are given.
void decoder_only_outputs(const torch::Tensor& h, const DecoderHeads& heads, const ModelInputs& in,
                          ModelOutputs& out);
torch::Tensor sequence_classification_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                           int64_t num_labels, const std::string& problem_type);

// Hugging Face's pooled index for decoder classifiers: (first pad in the row) - 1, i.e. the
// last position when a row has no pad or starts with one.
torch::Tensor last_token_index(const torch::Tensor& input_ids, std::optional<int64_t> pad_id);
// With an attention mask: the last position whose mask is 1 (the same index wherever Hugging
// Face's rule is well defined, and right also when the pad id occurs inside the text or the
// config has no pad id).
torch::Tensor last_real_token_index(const torch::Tensor& attention_mask);

}  // namespace emoe
