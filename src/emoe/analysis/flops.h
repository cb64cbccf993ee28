// Analytic FLOP (multiply-accumulate) counts per token for a model and a fine-tuning method:
// forward, and a training step (forward + backward), module by module.
#pragma once
#include <map>
#include <string>

#include "emoe/models/model.h"
#include "emoe/moe/moe_config.h"
#include "emoe/peft/peft.h"

namespace emoe {

// What runs on top of the dense model.
struct MethodCost {
  std::string name = "dense";
  bool moe = false;
  MoeConfig moe_config;            // when moe
  int64_t moe_layers = 0;          // converted layers
  int64_t moe_decoder_layers = 0;  // encoder-decoder models: how many of them are the decoder's
  PeftConfig peft;                 // kNone for full / MoE-only
  bool trainable_body = true;      // full fine-tuning (false: only adapters and head train)
};

struct FlopCount {
  // MACs per token, by part: "attention_proj", "attention_scores", "ffn", "gate", "adapters",
  // "head". A FLOP is two MACs; GMACs below are 1e9 MACs.
  std::map<std::string, double> forward;
  double forward_total = 0;
  double train_total =
      0;  // forward + backward (input grads everywhere, weight grads where trained)
};

// Counts for sequences of `seq_len` tokens (attention scores cost seq_len · d per token,
// counted over the full length as the non-causal bound). Dispatched EMoE runs k/N of the FFN;
// masked EMoE costs the dense FFN (plus its gate). PEFT adapters are counted on their default
// targets (T5's MoLoRA: every linear of the blocks).
// Encoder-decoder models (T5): an example of `seq_len` source and `target_len` target tokens
// (0: seq_len); the counts are per token of the two together. The encoder runs on the source;
// each decoder block runs self-attention and its FFN on the target, cross-attention's q and o
// on the target and its k and v on the source; the LM head on the target.
FlopCount count_flops(const ModelSummary& model, const MethodCost& method, int64_t seq_len,
                      int64_t target_len = 0);

}  // namespace emoe
