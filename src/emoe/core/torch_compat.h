// The few places where libtorch's C++ API differs between the versions emoe builds against:
// Debian 12's 1.13 (CPU) and the 2.x of a CUDA machine's PyTorch (scripts/device_check.sh).
#pragma once
#include <torch/version.h>

// libtorch 2.3 made c10::Allocator::allocate non-const and added a pure virtual copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define EMOE_ALLOCATOR_ALLOCATE_CONST
#define EMOE_ALLOCATOR_HAS_COPY_DATA 1
#else
#define EMOE_ALLOCATOR_ALLOCATE_CONST const
#define EMOE_ALLOCATOR_HAS_COPY_DATA 0
#endif
