// What the CPU is (model, logical cores, clock, the instruction sets that matter for our kernels)
// and the peak its instruction sets allow: the header of every benchmark and `emoe info --system`.
#pragma once
#include <string>
#include <vector>

namespace emoe {

struct CpuInfo {
  std::string model;             // "AMD EPYC 9R14", "Intel(R) Xeon(R) ..."; "" when unknown
  int cores = 1;                 // logical CPUs of this process's machine
  double mhz = 0;                // the clock the peak is computed from; 0 when unknown
  std::string clock_source;      // "cpuinfo_max_freq", "cpu MHz" or ""
  std::vector<std::string> isa;  // of kIsaFlags, those the CPU has, in that order
  bool has(const std::string& flag) const;
  std::string isa_text() const;  // "avx2 fma avx512f ..." or "none of the vector extensions"
};

// The flags (as /proc/cpuinfo names them) that decide which kernels run.
extern const std::vector<std::string> kIsaFlags;

// From /proc/cpuinfo's text (the first processor's model name, flags and "cpu MHz"; the count of
// "processor" lines): testable without the machine.
CpuInfo parse_cpu_info(const std::string& proc_cpuinfo);
// This machine: /proc/cpuinfo, with the clock from cpufreq's cpuinfo_max_freq when present.
CpuInfo read_cpu_info();

// FLOPs per cycle per core by instruction set, times cores and clock. An estimate that assumes
// two vector FMA units per core (one on some Xeon Silver/Bronze parts: half this); the basis says
// which path it counts. 0 when the clock is unknown.
struct TheoreticalPeak {
  double fp32_gflops = 0, bf16_gflops = 0;
  std::string fp32_basis, bf16_basis;  // "AVX-512 FMA: 64 FLOP/cycle/core"
};
TheoreticalPeak theoretical_peak(const CpuInfo& cpu);

// True only where the CPU has AMX (amx_tile, amx_bf16, with AVX-512 BF16) and Linux granted this
// process the tile state (asked once): the AMX kernels' condition (core/amx_tiles.h).
bool amx_available();

}  // namespace emoe
