// FFN slot dispatch between the dense computation and an attached MoE plug.
#include "emoe/models/ffn_slot.h"

namespace emoe {

torch::Tensor FfnSlot::run_ffn(const torch::Tensor& x, const torch::Tensor& token_mask) {
  if (plug_) return plug_->run(x, token_mask, *this);
  return dense_ffn(x);
}

void FfnSlot::set_plug(std::shared_ptr<FfnPlug> plug) {
  if (plug_) ffn_owner().unregister_module("moe");
  plug_ = std::move(plug);
  if (plug_) ffn_owner().register_module("moe", plug_);
}

}  // namespace emoe
