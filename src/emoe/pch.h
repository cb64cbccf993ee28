// Precompiled header: the heavy, stable third-party headers every translation unit needs.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
