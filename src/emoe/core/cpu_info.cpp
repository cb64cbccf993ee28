// /proc/cpuinfo read once into what the kernels and the benchmarks need to know.
#include "emoe/core/cpu_info.h"

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace emoe {

const std::vector<std::string> kIsaFlags = {"avx2",        "fma",      "avx512f", "avx512_bf16",
                                            "avx512_fp16", "amx_tile", "amx_bf16"};

bool CpuInfo::has(const std::string& flag) const {
  return std::find(isa.begin(), isa.end(), flag) != isa.end();
}

std::string CpuInfo::isa_text() const {
  if (isa.empty()) return "none of the vector extensions";
  return fmt::format("{}", fmt::join(isa, " "));
}

namespace {

// "key\t: value" -> value, when the line's key is `key`.
bool field(const std::string& line, const std::string& key, std::string& value) {
  if (line.compare(0, key.size(), key) != 0) return false;
  const auto colon = line.find(':', key.size());
  if (colon == std::string::npos) return false;
  // the key may be followed only by blanks before the colon ("model name\t: ...")
  if (line.find_first_not_of(" \t", key.size()) != colon) return false;
  value = line.substr(colon + 1);
  value.erase(0, value.find_first_not_of(" \t"));
  return true;
}

}  // namespace

CpuInfo parse_cpu_info(const std::string& text) {
  CpuInfo c;
  c.cores = 0;
  std::istringstream in(text);
  std::set<std::string> flags;
  bool first_flags = true, first_mhz = true;
  for (std::string line, v; std::getline(in, line);) {
    if (field(line, "processor", v)) ++c.cores;
    if (c.model.empty() && field(line, "model name", v)) c.model = v;
    if (first_flags && field(line, "flags", v)) {
      std::istringstream f(v);
      for (std::string w; f >> w;) flags.insert(w);
      first_flags = false;
    }
    if (first_mhz && field(line, "cpu MHz", v)) {
      try {
        c.mhz = std::stod(v);
        c.clock_source = "cpu MHz";
      } catch (const std::exception&) {
      }
      first_mhz = false;
    }
  }
  c.cores = std::max(c.cores, 1);
  for (const auto& f : kIsaFlags)
    if (flags.count(f)) c.isa.push_back(f);
  return c;
}

CpuInfo read_cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream ss;
  ss << in.rdbuf();
  CpuInfo c = parse_cpu_info(ss.str());
  // the highest clock the core may run at, where the kernel exposes it (VMs often do not)
  std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (f >> khz && khz > 0) {
    c.mhz = khz / 1000.0;
    c.clock_source = "cpuinfo_max_freq";
  }
  return c;
}

TheoreticalPeak theoretical_peak(const CpuInfo& cpu) {
  TheoreticalPeak p;
  double fp32 = 8;  // SSE: a 4-wide add and a 4-wide multiply per cycle
  p.fp32_basis = "SSE: 8 FLOP/cycle/core";
  if (cpu.has("avx512f")) {
    fp32 = 64, p.fp32_basis = "AVX-512 FMA: 64 FLOP/cycle/core (two FMA units)";
  } else if (cpu.has("avx2") && cpu.has("fma")) {
    fp32 = 32, p.fp32_basis = "AVX2 FMA: 32 FLOP/cycle/core (two FMA units)";
  }
  double bf16 = fp32;
  p.bf16_basis = "no bfloat16 instructions: the float32 rate";
  if (cpu.has("amx_bf16")) {
    bf16 = 1024, p.bf16_basis = "AMX BF16: 1024 FLOP/cycle/core";
  } else if (cpu.has("avx512_bf16")) {
    bf16 = 128, p.bf16_basis = "AVX-512 BF16 (vdpbf16ps): 128 FLOP/cycle/core (two units)";
  }
  const double ghz_cores = cpu.mhz / 1000.0 * cpu.cores;
  p.fp32_gflops = fp32 * ghz_cores;
  p.bf16_gflops = bf16 * ghz_cores;
  return p;
}

bool amx_available() {
  static const bool ok = [] {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")))
      return false;
    // CPUID leaf 7: EDX bit 22 amx_bf16, bit 24 amx_tile
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;
    // Linux hands the tile state (XTILEDATA, feature 18) to a process only on request
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

}  // namespace emoe
