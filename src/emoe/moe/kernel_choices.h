// The kernels this process chose by timing (which library, which of oneDNN's implementations,
// the small products' and the dispatched experts' paths), as one JSON record: a training
// checkpoint keeps it, and a resumed run pins it before its first step. Two processes that time
// the same product may choose differently on a close call, and implementations sum in different
// orders: without the record, a resumed run's weights could differ in their last bits from an
// uninterrupted run's.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace emoe {

// {"cpu": {"model", "isa"}, "float32_library": {...}, "onednn_implementations": {...},
//  "small_products": {...}, "expert_paths": {...}} (each map as matmul.h, small_gemm.h and
// expert_ffn.h describe it).
nlohmann::json kernel_choices_json();

// Pins a record made by kernel_choices_json. Returns whether it did and, for the log, how many
// choices or why none (a record from another CPU: its choices may not suit this one, and its
// numbers could not be reproduced anyway). Throws InputError naming `where`
// and the field for a malformed record; nothing of it is pinned then (and this process's own
// choices are forgotten: timed afresh).
struct KernelPin {
  bool pinned = false;
  std::string message;
};
KernelPin pin_kernel_choices(const nlohmann::json& record, const std::string& where);

// pin_kernel_choices for the JSON file at `path` (a checkpoint's kernels.json, or a finished
// run's), logged: info where pinned, a warning where not. InputError naming the file where it
// cannot be read or is not valid JSON.
KernelPin pin_kernel_choices_file(const std::string& path);

// EMOE_KERNELS=FILE (set: the emoe command pins that record before anything runs, so that a run
// repeated with its first run's kernels.json computes on the same kernels, bit for bit):
// pin_kernel_choices_file(FILE); nothing where the variable is unset or empty.
void pin_kernel_choices_from_env();

// Forgets every timed choice (tests stand in for a new process).
void forget_kernel_choices();

}  // namespace emoe
