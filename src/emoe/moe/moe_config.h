// MoE settings: method, experts, gate, execution path, parity switches; read/written as moe.json.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/io/hf_config.h"
#include "emoe/moe/split.h"

namespace emoe {

enum class MoeMethod { kEmoe, kEmoeLearn, kGmoe, kMoefication };
// The rebuttal's variant of EMoE-learn, a method name of its own (MoeConfig::for_method_name).
inline constexpr const char* kEmoeLearnInit = "emoe-learn-init";
enum class GateKind { kAvgK, kLinear, kCosine, kMlp };
enum class Execution { kMasked, kDispatched };
enum class BalanceLoss { kNone, kImportanceLoad, kSwitch, kZLoss };

std::string to_string(MoeMethod m);
std::string to_string(GateKind g);
std::string to_string(Execution e);
std::string to_string(BalanceLoss b);
MoeMethod parse_moe_method(const std::string& s);
GateKind parse_gate_kind(const std::string& s);
Execution parse_execution(const std::string& s);
BalanceLoss parse_balance_loss(const std::string& s);

struct MoeConfig {
  MoeMethod method = MoeMethod::kEmoe;
  int64_t experts = 64;
  int64_t topk = 16;
  // FFN layers to convert, counted over ModelSummary::ffn_slots(): for an encoder-decoder model
  // (T5) the encoder's blocks 0..L-1 first, then the decoder's as L..L+D-1. Empty: the ones
  // encoder_layers/decoder_layers name, else default_moe_layers() (resolve_moe_layers).
  std::vector<int64_t> layers;
  // An encoder-decoder model's layers named per stack, each counted from 0 in its own stack
  // (run config: moe.layers: [encoder.5, decoder.5] reads into these).
  std::vector<int64_t> encoder_layers, decoder_layers;
  std::string split = "balanced-kmeans";  // balanced-kmeans | random | contiguous | coactivation
  uint64_t seed = 0;
  KMeansOptions kmeans;
  GateKind gate = GateKind::kAvgK;
  std::string gate_init = "avgk";  // the learned linear gate's start: avgk | random
  Execution execution = Execution::kMasked;
  // Combine weights: false -> every selected expert counts 1 (EMoE's pure mask);
  // true -> renormalised top-k probabilities (learned gates, GMoE).
  bool weighted = false;
  // Parity with the authors' tutel-based BERT/GPT-2 code (all off by default; `tutel` sets them).
  bool tutel = false;
  double gate_noise = 0.0;           // logits += gate_noise * N(0,1) / E in training
  bool softmax_before_topk = false;  // rank softmax(logits) (same order; matters for the losses)
  double capacity_factor = 0.0;      // 0 = no capacity limit; tutel 1.5
  bool batch_prioritized = true;     // capacity favours the most confident tokens
  BalanceLoss balance = BalanceLoss::kNone;
  double balance_weight = 0.01;
  double preact_dropout = 0.0;   // dropout on the FFN pre-activation in training
  int64_t cosine_dim = 256;      // GMoE cosine router projection
  int64_t sample_tokens = 4096;  // tokens gathered for coactivation / MoEfication

  // Defaults by method (gate, weighting, balance loss), then the tutel switch when set.
  static MoeConfig for_method(MoeMethod m);
  // The same by a method's name, which also takes "emoe-learn-init": emoe-learn with the linear
  // gate initialised to avg-k (its moe.json says method emoe-learn, gate linear, gate_init avgk).
  static MoeConfig for_method_name(const std::string& name);
  void enable_tutel_parity();
  // Invariants against the model: 1 <= k <= N, layers in range, d_ff divisible (split methods).
  // Errors name the setting as the user wrote it: `origin` + key ("run.yaml.moe.topk",
  // ".../moe.json: config.topk"); without an origin, the command-line flag ("--topk").
  void validate(int64_t num_layers, int64_t d_ff) const;
  std::string origin;  // not serialised

  nlohmann::json to_json() const;
  static MoeConfig from_json(const JsonFields& j);
};

// "Every other layer among the last four": {L-4, L-2} (e.g. {28, 30} of 32, {8, 10} of 12).
std::vector<int64_t> default_moe_layers(int64_t num_layers);
// The same in each stack of an encoder-decoder model (num_decoder_layers > 0): the encoder's
// {L-4, L-2} and the decoder's, counted as cfg.layers counts them (decoder block j is L + j).
std::vector<int64_t> default_moe_layers(int64_t num_layers, int64_t num_decoder_layers);
// Fills cfg.layers when empty: from encoder_layers/decoder_layers when given (checked against
// the stacks), else the default. num_layers: the encoder's (or the only stack's) blocks.
void resolve_moe_layers(MoeConfig& cfg, int64_t num_layers, int64_t num_decoder_layers);
// "8,10" or "8-11" or "all" -> layer indices of the num_layers FFN layers (both stacks of an
// encoder-decoder model, num_decoder_layers of them the decoder's, which then also takes
// "encoder.5,decoder.5"; "" or "default": the default layers).
std::vector<int64_t> parse_layer_list(const std::string& text, int64_t num_layers,
                                      int64_t num_decoder_layers = 0);

}  // namespace emoe
