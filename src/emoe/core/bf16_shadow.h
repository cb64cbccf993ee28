// bfloat16 copies of float32 parameters that the optimiser writes as it updates them.
//
// Why: under CPU bf16 autocast every training forward rounded each float32 weight to bfloat16
// afresh (a read of 4 bytes and a write of 2 per parameter: ~45 ms of a 1.5 s BERT-base step on
// the AMX Xeon, and the dispatched experts' weights as much again), although the weights change
// only in the optimiser step, which reads and writes every parameter anyway. There the rounded
// copy costs one more 2-byte write per parameter.
//
// How: a forward that rounds a float32 tensor needing gradients calls bf16_cast(t). The first
// time it rounds it as before and marks t's parameter (its storage, offset and layout) as wanting
// a copy; the optimiser's fused step then writes the copy beside each update (bf16_shadow_target,
// bf16_shadow_written). A later bf16_cast returns it while it is current: same storage, offset,
// sizes and strides (or their transpose: GPT-2's Conv1D weights are used as transposed views),
// and the parameter's version unchanged since the optimiser wrote it — any other in-place change
// (an ATen op, a load, a pruning) moves the version on and the next forward rounds afresh.
// The copy is bitwise the rounding t.to(bfloat16) makes (to nearest even).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace emoe {

// t rounded to bfloat16 (t float32): the parameter's current copy where there is one, else
// t.to(bfloat16) (marking t's parameter for a copy when t requires grad and copies are on).
at::Tensor bf16_cast(const at::Tensor& t);

// For the optimiser, per parameter p (float32, contiguous): where to write p's rounded copy in
// this step, or nullptr when no forward asked for one; after writing (and updating p), mark it
// current at p's version, which this bumps (the fused step writes through raw pointers).
uint16_t* bf16_shadow_target(const at::Tensor& p);
void bf16_shadow_written(const at::Tensor& p);
// Forgets the copies of these parameters (the optimiser that wrote them is going away).
void drop_bf16_shadows(const std::vector<at::Tensor>& params);

// On by default; EMOE_BF16_SHADOW=off turns copies off (every forward rounds afresh). Turning
// them off drops every copy held.
bool bf16_shadows_enabled();
void set_bf16_shadows_enabled(bool on);
// Copies held now (for tests and memory reports): count and bytes; and how many casts copies
// have served since the process started.
int64_t bf16_shadow_count();
int64_t bf16_shadow_bytes();
int64_t bf16_shadow_hits();

}  // namespace emoe
