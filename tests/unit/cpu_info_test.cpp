// /proc/cpuinfo parsing and the instruction-set peak (the benchmarks' header, `info --system`).
#include "emoe/core/cpu_info.h"

#include "support/test_support.h"

namespace {

std::string cpuinfo_text(const std::string& model, const std::string& flags, int processors) {
  std::string out;
  for (int i = 0; i < processors; ++i)
    out += "processor\t: " + std::to_string(i) + "\nvendor_id\t: x\nmodel name\t: " + model +
           "\ncpu MHz\t\t: 2400.000\nflags\t\t: " + flags + "\n\n";
  return out;
}

}  // namespace

TEST(CpuInfo, ParsesModelCoresClockAndTheFlagsThatMatter) {
  auto c =
      emoe::parse_cpu_info(cpuinfo_text("AMD EPYC 7R13", "fpu sse2 avx2 fma bmi2 avx512fake", 2));
  EXPECT_EQ(c.model, "AMD EPYC 7R13");
  EXPECT_EQ(c.cores, 2);
  EXPECT_DOUBLE_EQ(c.mhz, 2400.0);
  EXPECT_EQ(c.clock_source, "cpu MHz");
  EXPECT_EQ(c.isa, (std::vector<std::string>{"avx2", "fma"}));  // "avx512fake" is no flag of ours
  EXPECT_EQ(c.isa_text(), "avx2 fma");
  // AVX2 FMA: 32 FLOP/cycle/core; no bfloat16 instructions: the float32 rate
  auto p = emoe::theoretical_peak(c);
  EXPECT_DOUBLE_EQ(p.fp32_gflops, 32 * 2.4 * 2);
  EXPECT_DOUBLE_EQ(p.bf16_gflops, p.fp32_gflops);

  auto amx = emoe::parse_cpu_info(cpuinfo_text(
      "Intel(R) Xeon(R) Platinum 8488C", "avx2 fma avx512f avx512_bf16 amx_tile amx_bf16", 4));
  EXPECT_EQ(amx.cores, 4);
  EXPECT_TRUE(amx.has("amx_bf16"));
  auto q = emoe::theoretical_peak(amx);
  EXPECT_DOUBLE_EQ(q.fp32_gflops, 64 * 2.4 * 4);
  EXPECT_DOUBLE_EQ(q.bf16_gflops, 1024 * 2.4 * 4);

  auto bf16 = emoe::parse_cpu_info(cpuinfo_text("Xeon", "avx2 fma avx512f avx512_bf16", 1));
  EXPECT_DOUBLE_EQ(emoe::theoretical_peak(bf16).bf16_gflops, 128 * 2.4);
  // no clock, no estimate; an empty file still describes one core
  auto none = emoe::parse_cpu_info("");
  EXPECT_EQ(none.cores, 1);
  EXPECT_EQ(emoe::theoretical_peak(none).fp32_gflops, 0);
  EXPECT_EQ(none.isa_text(), "none of the vector extensions");
}

TEST(CpuInfo, ThisMachineHasAModelAndCores) {
  auto c = emoe::read_cpu_info();
  EXPECT_GE(c.cores, 1);
  EXPECT_FALSE(c.model.empty()) << "/proc/cpuinfo names no model";
}
