// Activation checkpointing: a block's forward without its activations, run again in backward.
#include "emoe/models/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/block_hooks.h"
#include "emoe/models/ffn_slot.h"
#include "emoe/models/linear.h"
#include "emoe/models/routed.h"

namespace emoe {

namespace {

thread_local int recompute_depth = 0;
std::atomic<int64_t> checkpointed_runs{0}, recomputed_runs{0};

// The random generators a block may draw from: the CPU's (dropout seeds, and everything on a
// CPU model) and, for a model on a GPU, that device's (noisy gates' randn_like).
struct RngSnapshot {
  at::Tensor cpu, device_state;
  c10::optional<c10::Device> device;
};

RngSnapshot take_rng(const std::vector<at::Tensor>& inputs) {
  RngSnapshot s;
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    s.cpu = cpu.get_state();
  }
  for (const auto& t : inputs)
    if (t.defined() && !t.is_cpu()) {
      s.device = t.device();
      auto gen = at::globalContext().defaultGenerator(t.device());
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.device_state = gen.get_state();
      break;
    }
  return s;
}

void put_rng(const RngSnapshot& s) {
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(s.cpu);
  }
  if (s.device) {
    auto gen = at::globalContext().defaultGenerator(*s.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.device_state);
  }
}

struct AutocastSetting {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
};

AutocastSetting take_autocast() {
  return {emoe::autocast_enabled(at::kCPU), emoe::autocast_enabled(at::kCUDA),
          emoe::autocast_dtype(at::kCPU), emoe::autocast_dtype(at::kCUDA)};
}

void put_autocast(const AutocastSetting& a) {
  emoe::set_autocast_enabled(at::kCPU, a.cpu);
  emoe::set_autocast_enabled(at::kCUDA, a.cuda);
  emoe::set_autocast_dtype(at::kCPU, a.cpu_dtype);
  emoe::set_autocast_dtype(at::kCUDA, a.cuda_dtype);
}

// The routed modules inside a block (FFN plugs, adapters on its Linear layers), whose balance
// losses the block's forward sets.
std::vector<Routed*> routed_inside(torch::nn::Module& block) {
  std::vector<Routed*> out;
  for (const auto& m : block.modules(/*include_self=*/false)) {
    Routed* r = nullptr;
    if (auto* plug = dynamic_cast<FfnPlug*>(m.get()))
      r = plug->routed();
    else if (auto* linear = dynamic_cast<LinearImpl*>(m.get()))
      r = linear->adapter() ? linear->adapter()->routed() : nullptr;
    if (r) out.push_back(r);
  }
  return out;
}

// What the backward pass needs besides the saved inputs.
struct CheckpointPlan : torch::CustomClassHolder {
  BlockForward forward;
  std::vector<int64_t> defined;  // the positions of run_block's inputs given to the function
  size_t inputs = 0;             // run_block's inputs, defined or not
  bool dummy = false;            // the last function input only makes the block differentiable
  std::vector<Routed*> routed;
  std::vector<char> aux_defined;  // per routed module: whether its balance loss is an output
  RngSnapshot rng;
  AutocastSetting autocast;

  std::vector<at::Tensor> block_inputs(const std::vector<at::Tensor>& given) const {
    std::vector<at::Tensor> all(inputs);
    for (size_t j = 0; j < defined.size(); ++j) all[defined[j]] = given[j];
    return all;
  }
};

// Sets the thread's recomputation state for the backward pass, and back.
class RecomputeScope {
 public:
  RecomputeScope(const CheckpointPlan& plan, const std::vector<at::Tensor>& inputs)
      : rng_(take_rng(inputs)), autocast_(take_autocast()) {
    put_rng(plan.rng);
    put_autocast(plan.autocast);
    at::autocast::increment_nesting();
    ++recompute_depth;
  }
  ~RecomputeScope() {
    --recompute_depth;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    put_autocast(autocast_);
    put_rng(rng_);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  RngSnapshot rng_;
  AutocastSetting autocast_;
};

struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                const c10::intrusive_ptr<CheckpointPlan>& plan) {
    // (autograd runs a Function's forward in no-grad mode: nothing inside is kept)
    std::vector<at::Tensor> given(inputs.begin(), inputs.end());
    if (plan->dummy) given.pop_back();
    plan->rng = take_rng(given);
    plan->autocast = take_autocast();
    torch::autograd::variable_list out{plan->forward(plan->block_inputs(given))};
    for (Routed* r : plan->routed) {
      auto aux = r->aux_loss();
      plan->aux_defined.push_back(aux.defined());
      if (aux.defined()) out.push_back(aux);
    }
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    checkpointed_runs.fetch_add(1, std::memory_order_relaxed);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto plan =
        c10::static_intrusive_pointer_cast<CheckpointPlan>(ctx->saved_data.at("plan").toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> leaves;
    for (const auto& s : saved) {
      auto d = s.detach();
      if (s.requires_grad()) d.requires_grad_(true);
      leaves.push_back(d);
    }
    std::vector<at::Tensor> given(leaves.begin(), leaves.end() - (plan->dummy ? 1 : 0));
    // the balance losses the first run handed out (this function's outputs), set back below
    std::vector<at::Tensor> handed_out;
    for (Routed* r : plan->routed) handed_out.push_back(r->aux_loss());
    {
      RecomputeScope scope(*plan, given);
      at::AutoGradMode grad_mode(true);
      auto y = plan->forward(plan->block_inputs(given));
      recomputed_runs.fetch_add(1, std::memory_order_relaxed);
      torch::autograd::variable_list outs, gs;
      if (grads[0].defined() && y.requires_grad()) outs.push_back(y), gs.push_back(grads[0]);
      size_t k = 1;
      for (size_t j = 0; j < plan->routed.size(); ++j) {
        if (!plan->aux_defined[j]) continue;
        auto aux = plan->routed[j]->aux_loss();
        if (grads[k].defined() && aux.defined() && aux.requires_grad())
          outs.push_back(aux), gs.push_back(grads[k]);
        ++k;
      }
      if (!outs.empty()) torch::autograd::backward(outs, gs);
    }
    for (size_t j = 0; j < plan->routed.size(); ++j)
      plan->routed[j]->replace_aux_loss(handed_out[j]);
    torch::autograd::variable_list out;
    for (const auto& l : leaves) out.push_back(l.requires_grad() ? l.grad() : at::Tensor());
    out.emplace_back();  // (the plan)
    return out;
  }
};

bool needs_gradient(const std::vector<at::Tensor>& inputs, torch::nn::Module& block) {
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  for (const auto& p : block.parameters())
    if (p.requires_grad()) return true;
  return false;
}

at::Tensor checkpointed(torch::nn::Module& block, const std::vector<at::Tensor>& inputs,
                        const BlockForward& forward) {
  auto plan = c10::make_intrusive<CheckpointPlan>();
  plan->forward = forward;
  plan->inputs = inputs.size();
  plan->routed = routed_inside(block);
  std::vector<at::Tensor> given;
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      plan->defined.push_back(static_cast<int64_t>(i));
      given.push_back(inputs[i]);
      any = any || inputs[i].requires_grad();
    }
  // no input needs a gradient but the block's weights do (LoRA over frozen embeddings): the
  // function still needs one differentiable input for autograd to call its backward
  if (!any) {
    plan->dummy = true;
    given.push_back(at::empty({0}).requires_grad_(true));
  }
  auto out = CheckpointFn::apply(at::TensorList(given), plan);
  // the balance losses as outputs of the function, so that their gradients reach it (autograd
  // wraps a fresh output in place, so this is mostly the tensor the module holds already)
  size_t k = 1;
  for (size_t j = 0; j < plan->routed.size(); ++j)
    if (plan->aux_defined[j]) plan->routed[j]->replace_aux_loss(out[k++]);
  return out[0];
}

}  // namespace

at::Tensor run_block(BlockHooks* hooks, size_t index, torch::nn::Module& block, bool checkpoint,
                     const std::vector<at::Tensor>& inputs, const BlockForward& forward) {
  if (hooks) hooks->before_forward(index);
  at::Tensor out;
  if (checkpoint && at::GradMode::is_enabled() && needs_gradient(inputs, block))
    out = checkpointed(block, inputs, forward);
  else
    out = forward(inputs);
  if (hooks) hooks->after_forward(index, out);
  return out;
}

bool recomputing() {
  return recompute_depth > 0;
}

int64_t checkpointed_block_runs() {
  return checkpointed_runs.load();
}

int64_t recomputed_block_runs() {
  return recomputed_runs.load();
}

}  // namespace emoe
