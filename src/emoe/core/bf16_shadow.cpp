// bfloat16 copies of float32 parameters written by the optimiser (see the header).
#include "emoe/core/bf16_shadow.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace emoe {

namespace {

struct Entry {
  explicit Entry(c10::weak_intrusive_ptr<c10::StorageImpl> s) : storage(std::move(s)) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // the parameter's storage while it lives
  std::vector<int64_t> sizes, strides;                // the parameter's layout
  int64_t version = -1;                               // the copy's; -1: none written yet
  at::Tensor copy;                                    // bfloat16, the parameter's layout
};

std::mutex registry_mutex;
// keyed by the parameter's first element
std::unordered_map<const void*, Entry>& registry() {
  static std::unordered_map<const void*, Entry> entries;
  return entries;
}

std::atomic<int64_t> hits{0};

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("EMOE_BF16_SHADOW");
    const std::string s = v ? v : "";
    return !(s == "off" || s == "0" || s == "false");
  }()};
  return on;
}

bool same_storage(const Entry& e, const at::Tensor& t) {
  auto alive = e.storage.lock();
  return alive && alive.get() == t.storage().unsafeGetStorageImpl();
}

// Entries whose storage is gone (their parameter freed), dropped when the map grows
void prune_dead_locked() {
  auto& m = registry();
  for (auto it = m.begin(); it != m.end();)
    it = it->second.storage.expired() ? m.erase(it) : std::next(it);
}

}  // namespace

bool bf16_shadows_enabled() {
  return enabled_flag().load();
}

void set_bf16_shadows_enabled(bool on) {
  enabled_flag().store(on);
  if (!on) {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry().clear();
  }
}

at::Tensor bf16_cast(const at::Tensor& t) {
  if (!bf16_shadows_enabled() || t.scalar_type() != at::kFloat || !t.device().is_cpu() ||
      !t.has_storage())
    return t.to(at::kBFloat16);
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& m = registry();
    auto it = m.find(t.data_ptr());
    if (it != m.end() && same_storage(it->second, t)) {
      const auto& e = it->second;
      if (e.version >= 0 && e.version == static_cast<int64_t>(t._version())) {
        if (t.sizes().vec() == e.sizes && t.strides().vec() == e.strides) {
          hits.fetch_add(1);
          return e.copy;
        }
        if (t.dim() == 2 && e.sizes.size() == 2 && t.size(0) == e.sizes[1] &&
            t.size(1) == e.sizes[0] && t.stride(0) == e.strides[1] && t.stride(1) == e.strides[0]) {
          hits.fetch_add(1);
          return e.copy.t();
        }
      }
      return t.to(at::kBFloat16);  // marked already: the optimiser writes the next copy
    }
    // a parameter (a leaf that needs gradients, or a view of one): the optimiser's fused step
    // takes contiguous parameters, so mark the contiguous layout (a transposed view's base, as
    // [size(1), size(0)])
    const bool parameter =
        t.requires_grad() && (t.is_leaf() || (t.is_view() && t._base().is_leaf()));
    if (parameter && t.dim() >= 1) {
      Entry e(t.storage().getWeakStorageImpl());
      if (t.is_contiguous()) {
        e.sizes = t.sizes().vec();
        e.strides = t.strides().vec();
      } else if (t.dim() == 2 && t.stride(0) == 1 && t.stride(1) == t.size(0)) {
        e.sizes = {t.size(1), t.size(0)};
        e.strides = {t.size(0), 1};
      }
      if (!e.sizes.empty()) {
        if (m.size() >= 4096) prune_dead_locked();
        m.emplace(t.data_ptr(), std::move(e));
      }
    }
  }
  return t.to(at::kBFloat16);
}

uint16_t* bf16_shadow_target(const at::Tensor& p) {
  if (!bf16_shadows_enabled() || p.scalar_type() != at::kFloat || !p.device().is_cpu() ||
      !p.is_contiguous())
    return nullptr;
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& m = registry();
  auto it = m.find(p.data_ptr());
  if (it == m.end()) return nullptr;
  auto& e = it->second;
  if (!same_storage(e, p) || p.sizes().vec() != e.sizes || p.strides().vec() != e.strides) {
    m.erase(it);  // another tensor at that address now
    return nullptr;
  }
  e.version = -1;  // not current until written
  if (!e.copy.defined()) e.copy = at::empty(p.sizes(), p.options().dtype(at::kBFloat16));
  // written in place through a raw pointer: a graph that saved the old copy and is run backward
  // after this step fails as it would after any in-place change, rather than using new values
  e.copy.unsafeGetTensorImpl()->bump_version();
  return reinterpret_cast<uint16_t*>(e.copy.data_ptr<at::BFloat16>());
}

void bf16_shadow_written(const at::Tensor& p) {
  p.unsafeGetTensorImpl()->bump_version();
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& m = registry();
  auto it = m.find(p.data_ptr());
  if (it != m.end() && it->second.copy.defined())
    it->second.version = static_cast<int64_t>(p._version());
}

void drop_bf16_shadows(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& m = registry();
  for (const auto& p : params)
    if (p.defined() && p.has_storage()) {
      auto it = m.find(p.data_ptr());
      if (it != m.end() && same_storage(it->second, p)) m.erase(it);
    }
}

int64_t bf16_shadow_count() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  int64_t n = 0;
  for (const auto& kv : registry()) n += kv.second.copy.defined() ? 1 : 0;
  return n;
}

int64_t bf16_shadow_bytes() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  int64_t n = 0;
  for (const auto& kv : registry())
    if (kv.second.copy.defined()) n += static_cast<int64_t>(kv.second.copy.nbytes());
  return n;
}

int64_t bf16_shadow_hits() {
  return hits.load();
}

}  // namespace emoe
