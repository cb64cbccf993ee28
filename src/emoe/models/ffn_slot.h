// The FFN slot: how every architecture exposes its feed-forward layers to MoE and PEFT methods.
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>

#include "emoe/models/activation.h"

namespace emoe {

class Routed;

// Neuron-major views of an FFN's current parameters (views: gradients flow through them and
// in-place writes reach the parameters). Neuron i owns row i of w_in/b_in/w_up and column i
// of w_out. Plain FFN: y = w_out act(w_in x + b_in) + b_out. Gated (Llama):
// y = w_out (act(w_in x) * (w_up x)), with w_in the gate projection.
struct FfnView {
  torch::Tensor
      w_in;  // [d_ff, d]  the keys (BERT intermediate.dense, GPT-2 c_fc^T, Llama gate_proj)
  torch::Tensor b_in;   // [d_ff] or undefined
  torch::Tensor w_up;   // [d_ff, d] (gated FFNs only) or undefined
  torch::Tensor w_out;  // [d, d_ff]
  torch::Tensor b_out;  // [d] or undefined
  Activation act = Activation::kGeluErf;
  bool gated() const { return w_up.defined(); }
  int64_t d_ff() const { return w_in.size(0); }
  int64_t d_model() const { return w_in.size(1); }
};

// What replaces the dense FFN computation in a slot (EMoE, GMoE, MoEfication, ...).
class FfnSlot;
class FfnPlug : public torch::nn::Module {
 public:
  // x: [B, T, d]; token_mask: [B, T] (1 = real token) or undefined. Returns [B, T, d].
  virtual torch::Tensor run(const torch::Tensor& x, const torch::Tensor& token_mask,
                            FfnSlot& slot) = 0;
  // Why an adapter on the layer's own Linear modules would be skipped while this plug runs, or
  // "" when the plug computes through them; input_side: the key (and up) projections, else the
  // output projection.
  virtual std::string bypasses_linear(bool input_side) const {
    (void)input_side;
    return "its MoE plug does not run the FFN through the layer's Linear modules";
  }
  // The plug's routing (experts, usage, losses), or nullptr when it routes nothing.
  virtual Routed* routed() { return nullptr; }
};

// Implemented by each architecture's transformer layer.
class FfnSlot {
 public:
  virtual ~FfnSlot() = default;
  // Hidden activations after the nonlinearity (and gate product): [.., d_ff]. Runs through the
  // layer's Linear modules, so PEFT adapters on them apply.
  virtual torch::Tensor ffn_hidden(const torch::Tensor& x) = 0;
  // The input projections before the nonlinearity, also through the layer's Linear modules:
  // {w_in x + b_in, w_up x} (the second undefined unless gated). Plugs that change what happens
  // between them and the activation (pre-activation dropout) start here.
  virtual std::pair<torch::Tensor, torch::Tensor> ffn_preactivation(const torch::Tensor& x) = 0;
  // w_out h + b_out through the output Linear module.
  virtual torch::Tensor ffn_output(const torch::Tensor& h) = 0;
  virtual FfnView ffn_view() = 0;
  // The module under which a plug's parameters are registered (as child "moe"), and its
  // checkpoint prefix, e.g. "model.layers.3.mlp".
  virtual torch::nn::Module& ffn_owner() = 0;
  virtual std::string ffn_prefix() const = 0;
  // The transformer layer's own prefix ("model.layers.3"): the modules under it belong to it.
  virtual std::string layer_prefix() const = 0;
  virtual int64_t layer_index() const = 0;

  // The FFN as the layer computes it: the plug when one is attached, else dense.
  torch::Tensor run_ffn(const torch::Tensor& x, const torch::Tensor& token_mask);
  torch::Tensor dense_ffn(const torch::Tensor& x) { return ffn_output(ffn_hidden(x)); }

  // Attaches (nullptr: removes) a plug, registered as child "moe" of ffn_owner().
  void set_plug(std::shared_ptr<FfnPlug> plug);
  const std::shared_ptr<FfnPlug>& plug() const { return plug_; }

 private:
  std::shared_ptr<FfnPlug> plug_;
};

}  // namespace emoe
