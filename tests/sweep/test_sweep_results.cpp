// The sweep's verdicts and outputs on synthetic data: allclose and the 2x-naive bound (NaN
// never passes), timing summaries, JSON and CSV writers, the table, --emit-defaults' choice
// of the fastest correct row and --emit-kernel-config's file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>

#include "attention/kernel_config_file.h"
#include "core/rng.h"
#include "sweep/check.h"
#include "sweep/results.h"
#include "sweep/shapes.h"
#include "test_util.h"

namespace ft::sweep {
namespace {

using attention::KernelConfig;

Tensor random_f64(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::f64);
  Rng rng(seed);
  fill_normal(t, rng);
  return t;
}

// ref + eps * N(0, 1), rounded to bf16.
Tensor perturbed(const Tensor& ref, double eps, uint64_t seed) {
  Tensor noise = random_f64(ref.numel(), seed);
  Tensor out = Tensor::empty(ref.shape(), DType::f64);
  for (int64_t i = 0; i < ref.numel(); ++i) {
    out.data<double>()[i] = ref.data<double>()[i] + eps * noise.data<double>()[i];
  }
  return out.to(DType::bf16);
}

TEST(SweepCheck, CloseResultPassesBothVerdicts) {
  const Tensor ref = random_f64(4096, 1);
  const Tensor got = perturbed(ref, 1e-3, 2);
  const double naive = relative_error_vs(perturbed(ref, 1e-3, 3), ref);
  const TensorCheck c = check_tensor("out", got, ref, naive);
  EXPECT_TRUE(c.allclose_ok);
  EXPECT_TRUE(c.naive_ok) << c.relative_error << " vs naive " << naive;
  EXPECT_TRUE(c.passed());
  EXPECT_EQ(c.non_finite, 0);
  EXPECT_EQ(verdict_text({c}), "ok");
}

TEST(SweepCheck, AllcloseIsElementwise) {
  const Tensor ref = random_f64(4096, 4);
  Tensor got = ref.clone();
  // One element off by atol + rtol * |ref| and a bit: the norm barely moves, allclose fails.
  const double r = ref.data<double>()[100];
  got.data<double>()[100] = r + 7e-2 + 7e-2 * std::abs(r) + 1e-3;
  const TensorCheck c = check_tensor("dq", got, ref, 1.0);
  EXPECT_FALSE(c.allclose_ok);
  EXPECT_EQ(c.allclose_violations, 1);
  EXPECT_TRUE(c.naive_ok);
  EXPECT_FALSE(c.passed());
  // Just inside the bound passes.
  got.data<double>()[100] = r + 7e-2 + 7e-2 * std::abs(r) - 1e-6;
  EXPECT_TRUE(check_tensor("dq", got, ref, 1.0).allclose_ok);
}

TEST(SweepCheck, MoreThanTwiceTheNaiveErrorFails) {
  const Tensor ref = random_f64(4096, 5);
  const Tensor got = perturbed(ref, 1e-2, 6);  // well inside allclose
  const double err = relative_error_vs(got, ref);
  const TensorCheck strict = check_tensor("dk", got, ref, err / 3.0);
  EXPECT_TRUE(strict.allclose_ok);
  EXPECT_FALSE(strict.naive_ok);
  EXPECT_FALSE(strict.passed());
  EXPECT_TRUE(check_tensor("dk", got, ref, err / 1.9).passed());
  // A broken yardstick certifies nothing.
  EXPECT_FALSE(check_tensor("dk", got, ref, std::numeric_limits<double>::quiet_NaN()).naive_ok);
}

TEST(SweepCheck, NanOrInfNeverPasses) {
  const Tensor ref = random_f64(1024, 7);
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Tensor got = ref.to(DType::f32);
    got.data<float>()[17] = static_cast<float>(bad);
    const TensorCheck c = check_tensor("dv", got, ref, 1.0);
    EXPECT_EQ(c.non_finite, 1);
    EXPECT_FALSE(c.allclose_ok);
    EXPECT_FALSE(c.naive_ok);
    EXPECT_FALSE(c.passed());
    EXPECT_TRUE(std::isinf(c.max_abs_diff));
    EXPECT_TRUE(std::isinf(relative_error_vs(got, ref)));
  }
}

TEST(SweepCheck, VerdictNamesTheFailedTensors) {
  const Tensor ref = random_f64(256, 8);
  Tensor nan = ref.clone();
  nan.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
  const std::vector<TensorCheck> checks = {
      check_tensor("out", nan, ref, 1.0), check_tensor("dq", nan, ref, 1.0),
      check_tensor("dk", ref, ref, 1.0), check_tensor("dv", ref, ref, 1.0)};
  EXPECT_EQ(verdict_text(checks), "FAIL:out,dq");
  EXPECT_EQ(failed_names(checks), (std::vector<std::string>{"out", "dq"}));
}

TEST(SweepCheck, ZeroReferenceUsesTheRmsError) {
  const Tensor zero = Tensor::zeros({4}, DType::f64);
  Tensor got = Tensor::zeros({4}, DType::f64);
  got.data<double>()[0] = 2.0;
  EXPECT_DOUBLE_EQ(relative_error_vs(got, zero), 1.0);  // sqrt(4 / 4)
}

TEST(SweepTiming, MedianSpreadAndRounds) {
  const DirectionTiming t = summarize_timing({{1, 2, 3, 4, 5}, {}, {10, 10, 10}});
  EXPECT_EQ(t.round_ms, (std::vector<double>{3, 10}));
  EXPECT_DOUBLE_EQ(t.median_ms, 4.5);                 // pooled 1 2 3 4 5 10 10 10
  EXPECT_NEAR(t.spread, (10.0 - 2.75) / 4.5, 1e-12);  // linear-interpolated quartiles
  EXPECT_EQ(summarize_timing({}).median_ms, 0.0);
}

ConfigTiming timing(double fwd, double bwd) {
  ConfigTiming t;
  t.fwd.median_ms = fwd;
  t.bwd.median_ms = bwd;
  t.fwd.spread = t.bwd.spread = 0.01;
  t.fwd.round_ms = {fwd};
  t.bwd.round_ms = {bwd};
  return t;
}

std::vector<TensorCheck> passing_checks() {
  std::vector<TensorCheck> out;
  for (const std::string& name : checked_tensor_names()) {
    TensorCheck c;
    c.name = name;
    c.allclose_ok = c.naive_ok = true;
    c.relative_error = 3e-3;
    c.naive_relative_error = 2.5e-3;
    out.push_back(c);
  }
  return out;
}

SweepRow timed_row(const std::string& mask, int index, const std::string& config, double fwd,
                   double bwd, bool pass, int gpu = 0) {
  SweepRow r;
  r.mask = mask;
  r.gpu = gpu;
  r.index = index;
  r.role = index < 0 ? "ref" : (index == 0 ? "base" : "forward");
  r.config = KernelConfig::parse(config);
  r.status = RowStatus::checked;
  r.checks = passing_checks();
  if (!pass) r.checks[1].allclose_ok = false;
  r.timed = true;
  r.timing = timing(fwd, bwd);
  r.ref_timing = timing(2.0, 8.0);
  r.max_abs_diff = index < 0 ? 0.0 : 1.5e-2;
  r.flop = 4e12;
  return r;
}

// Synthetic rows of one mask: reference 10 ms, base 9 ms, a faster row (8 ms), a faster row
// that failed and was timed anyway (5 ms), a refused row and a crashed one.
struct Synthetic {
  SweepHeader header;
  std::vector<SweepRow> rows;
};

Synthetic synthetic() {
  Synthetic s;
  GpuFacts g;
  g.name = "NVIDIA H200";
  g.arch = "sm90";
  g.compute_capability = 90;
  g.smem_per_block = 232448;
  g.sms = 132;
  s.header.gpus = {g};
  s.header.base = KernelConfig::parse("fwd=128x64/128 bwd=64x128/256/double");
  s.header.reference = KernelConfig::parse("fwd=64x64/128 bwd=64x64/128/double");
  s.header.axis = "both";
  s.header.paths = {"double"};
  MaskFacts m;
  m.key = "window";
  m.description = "causal+window=512+segments (5 documents per row)";
  m.attended_pairs = 1000;
  m.check_window = 51;
  s.header.masks = {m};
  s.rows.push_back(timed_row("window", -1, "fwd=64x64/128 bwd=64x64/128/double", 2, 8, true));
  s.rows.push_back(timed_row("window", 0, "fwd=128x64/128 bwd=64x128/256/double", 2, 7, true));
  s.rows.push_back(timed_row("window", 1, "fwd=64x64/128 bwd=64x128/256/double", 1.5, 6.5, true));
  s.rows.push_back(timed_row("window", 2, "fwd=128x32/128 bwd=64x128/256/double", 1, 4, false));
  SweepRow refused;
  refused.mask = "window";
  refused.index = 3;
  refused.role = "backward";
  refused.config = KernelConfig::parse("fwd=128x64/128 bwd=64x64/256/double");
  refused.status = RowStatus::refused;
  refused.reason = "backward tile 64x64/256: 8 warps must split the 64 key rows";
  s.rows.push_back(refused);
  SweepRow crashed;
  crashed.mask = "window";
  crashed.index = 4;
  crashed.role = "backward";
  crashed.config = KernelConfig::parse("fwd=128x64/128 bwd=128x64/128/double");
  crashed.status = RowStatus::error;
  crashed.reason = "worker killed by signal 11 (Segmentation fault)";
  s.rows.push_back(crashed);
  return s;
}

TEST(SweepResults, RowVerdictsAndRatios) {
  const Synthetic s = synthetic();
  EXPECT_EQ(s.rows[0].verdict(), "ok");
  EXPECT_DOUBLE_EQ(s.rows[1].total_ms(), 9.0);
  EXPECT_NEAR(s.rows[1].vs_ref(), 10.0 / 9.0, 1e-12);
  EXPECT_NEAR(s.rows[1].tflops(), 4e12 / 9e9, 1e-9);
  EXPECT_EQ(s.rows[3].verdict(), "FAIL:dq");
  EXPECT_EQ(s.rows[4].verdict().rfind("refused: backward tile 64x64/256", 0), 0u);
  EXPECT_EQ(s.rows[5].verdict(), "ERROR: worker killed by signal 11 (Segmentation fault)");
}

TEST(SweepResults, FastestCorrectSkipsFailedRows) {
  const Synthetic s = synthetic();
  const SweepRow* best = fastest_correct(s.rows, "window");
  ASSERT_NE(best, nullptr);
  EXPECT_EQ(best->index, 1);  // 8 ms; the 5 ms row failed its check
  EXPECT_EQ(fastest_correct(s.rows, "causal"), nullptr);
  // Rows from several GPUs are ranked by their paired ratio to the reference.
  std::vector<SweepRow> two = s.rows;
  two.push_back(timed_row("window", 5, "fwd=256x64/256 bwd=64x128/256/double", 2, 6.9, true, 1));
  two.back().ref_timing = timing(3.0, 12.0);  // a slower card: 15 / 8.9
  EXPECT_EQ(fastest_correct(two, "window")->index, 5);
}

TEST(SweepResults, EmitDefaultsWritesAKDefaultsRow) {
  const Synthetic s = synthetic();
  const std::string text = emit_defaults(s.header, s.rows);
  const std::regex row(R"re(\{"sm90", 256, MaskClass::local, 0, 0, "(fwd=\S+ bwd=\S+)"\},)re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, row)) << text;
  EXPECT_EQ(m[1].str(), "fwd=64x64/128 bwd=64x128/256/double");
  EXPECT_EQ(KernelConfig::parse(m[1].str()).str(), m[1].str());
  EXPECT_NE(text.find("NVIDIA H200"), std::string::npos);
  // No qualifying row: a comment says so and no table row is emitted.
  Synthetic none = synthetic();
  none.rows.erase(none.rows.begin(), none.rows.begin() + 3);
  const std::string empty = emit_defaults(none.header, none.rows);
  EXPECT_FALSE(std::regex_search(empty, m, row)) << empty;
  EXPECT_NE(empty.find("no configuration passed"), std::string::npos);
}

// --emit-kernel-config's file reads back as a kernel-config file: per mask the winner, for the
// GPU's family, bounded by the measured head dim; the lookup then gives it for the sweep's own
// masks, and training takes it from there.
TEST(SweepResults, EmitKernelConfigRoundTrips) {
  Synthetic s = synthetic();
  MaskFacts causal;
  causal.key = "causal";
  causal.description = "causal";
  causal.default_config = KernelConfig::parse("fwd=128x64/128 bwd=64x128/256/double");
  s.header.masks.push_back(causal);
  s.rows.push_back(timed_row("causal", -1, "fwd=64x64/128 bwd=64x64/128/double", 4, 16, true));
  s.rows.push_back(timed_row("causal", 0, "fwd=128x64/128 bwd=64x128/256/double", 3, 12, true));
  const nlohmann::json j = kernel_config_file_json(s.header, s.rows, "2026-12-02T10:00:00Z");
  EXPECT_EQ(j["source"]["gpu"], "NVIDIA H200");
  EXPECT_EQ(j["source"]["date"], "2026-12-02T10:00:00Z");
  EXPECT_EQ(j["source"]["shape"], s.header.shape.describe());
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["rows"][0]["measured"]["total_ms"].get<double>(), 8.0);
  EXPECT_EQ(j["rows"][0]["measured"]["is_default"], false);
  EXPECT_EQ(j["rows"][1]["measured"]["is_default"], true);

  const attention::KernelConfigFile f = attention::parse_kernel_config_file(j.dump(2), "k.json");
  ASSERT_EQ(f.rows.size(), 2u);
  EXPECT_EQ(f.rows[0].arch, "sm90");
  EXPECT_EQ(f.rows[0].max_head_dim, s.header.shape.head_dim);
  EXPECT_EQ(f.rows[0].mask_class, attention::MaskClass::local);
  EXPECT_EQ(f.rows[0].config.str(), "fwd=64x64/128 bwd=64x128/256/double");
  EXPECT_EQ(f.rows[1].mask_class, attention::MaskClass::dense);
  EXPECT_EQ(f.rows[1].config.str(), "fwd=128x64/128 bwd=64x128/256/double");
  const attention::DeviceLimits sm90 = attention::DeviceLimits::for_arch("sm90");
  const std::vector<SweepMask> masks = sweep_masks(s.header.shape);
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_EQ(masks[0].key, "window");
  for (size_t m = 0; m < masks.size(); ++m) {
    const attention::KernelConfigChoice c =
        attention::choose_kernel_config(&f, sm90, timed_problem(s.header.shape, masks[m]));
    EXPECT_EQ(c.row, &f.rows[m]) << masks[m].key;
  }

  // Written atomically (and dated) by the sweep; read back the same.
  test::TempDir dir;
  EXPECT_EQ(write_kernel_config_file(dir.file("k.json"), s.header, s.rows), 2u);
  const attention::KernelConfigFile read = attention::read_kernel_config_file(dir.file("k.json"));
  ASSERT_EQ(read.rows.size(), 2u);
  EXPECT_EQ(read.rows[0].config, f.rows[0].config);
  EXPECT_EQ(read.rows[1].config, f.rows[1].config);
  std::ifstream in(dir.file("k.json"));
  const nlohmann::json written = nlohmann::json::parse(in);
  EXPECT_TRUE(std::regex_match(written["source"]["date"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << written["source"]["date"];

  // No qualifying row: a valid file without rows (the built-in table then decides).
  Synthetic none = synthetic();
  none.rows.erase(none.rows.begin(), none.rows.begin() + 3);
  const nlohmann::json empty = kernel_config_file_json(none.header, none.rows, "d");
  EXPECT_TRUE(attention::parse_kernel_config_file(empty.dump(), "e.json").rows.empty());
}

TEST(SweepResults, TableReadsVerdictFirstAndMarksTimedFailures) {
  const Synthetic s = synthetic();
  const std::string table = format_mask_table(s.header, s.header.masks[0], s.rows);
  for (const char* col : {"fwd_tile", "bwd_tile", "threads", "path", "fwd ms", "bwd ms", "total ms",
                          "vs ref", "TFLOP/s", "max|d|", "verdict"}) {
    EXPECT_NE(table.find(col), std::string::npos) << col;
  }
  EXPECT_NE(table.find("FAIL:dq"), std::string::npos);
  EXPECT_NE(table.find("5.000!"), std::string::npos) << table;
  EXPECT_NE(table.find("refused: backward tile 64x64/256"), std::string::npos);
  EXPECT_NE(table.find("ERROR: worker killed by signal 11"), std::string::npos);
  EXPECT_NE(table.find("fastest correct: #1"), std::string::npos) << table;
  EXPECT_NE(table.find("3 ok, 1 FAIL, 1 ERROR, 1 refused"), std::string::npos) << table;
  const std::string header = format_header(s.header);
  EXPECT_NE(header.find("NVIDIA H200"), std::string::npos);
  EXPECT_NE(header.find("232448"), std::string::npos);
  EXPECT_NE(header.find("fwd=128x64/128 bwd=64x128/256/double"), std::string::npos);
}

TEST(SweepResults, JsonRoundTripsTheRows) {
  const Synthetic s = synthetic();
  test::TempDir dir;
  write_json(dir.file("sweep.json"), s.header, s.rows);
  std::ifstream in(dir.file("sweep.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["header"]["gpus"][0]["name"], "NVIDIA H200");
  EXPECT_EQ(j["header"]["base_config"], "fwd=128x64/128 bwd=64x128/256/double");
  EXPECT_EQ(j["header"]["shape"]["seq_len"], 4096);
  ASSERT_EQ(j["rows"].size(), s.rows.size());
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const SweepRow back = row_from_json(j["rows"][i]);
    EXPECT_EQ(back.config, s.rows[i].config);
    EXPECT_EQ(back.verdict(), s.rows[i].verdict());
    EXPECT_EQ(back.passed(), s.rows[i].passed());
    EXPECT_EQ(back.timed, s.rows[i].timed);
    EXPECT_DOUBLE_EQ(back.total_ms(), s.rows[i].total_ms());
    EXPECT_DOUBLE_EQ(back.vs_ref(), s.rows[i].vs_ref());
  }
  EXPECT_EQ(j["rows"][3]["verdict"], "FAIL:dq");
  EXPECT_DOUBLE_EQ(j["rows"][2]["total_ms"].get<double>(), 8.0);
  // Inf and NaN travel as strings.
  SweepRow inf = s.rows[1];
  inf.max_abs_diff = std::numeric_limits<double>::infinity();
  inf.checks[0].relative_error = std::numeric_limits<double>::infinity();
  const SweepRow back = row_from_json(nlohmann::json::parse(row_to_json(inf).dump()));
  EXPECT_TRUE(std::isinf(back.max_abs_diff));
  EXPECT_TRUE(std::isinf(back.checks[0].relative_error));
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"') {
      if (quoted && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else {
        quoted = !quoted;
      }
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

TEST(SweepResults, CsvHasHeaderFactsAndOneLinePerRow) {
  const Synthetic s = synthetic();
  test::TempDir dir;
  write_csv(dir.file("sweep.csv"), s.header, s.rows);
  std::ifstream in(dir.file("sweep.csv"));
  std::vector<std::string> facts, lines;
  for (std::string line; std::getline(in, line);)
    (line.rfind("#", 0) == 0 ? facts : lines).push_back(line);
  EXPECT_FALSE(facts.empty());
  bool has_gpu = false;
  for (const std::string& f : facts)
    has_gpu = has_gpu || f.find("NVIDIA H200") != std::string::npos;
  EXPECT_TRUE(has_gpu);
  ASSERT_EQ(lines.size(), s.rows.size() + 1);
  const std::vector<std::string> columns = split_csv_line(lines[0]);
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(split_csv_line(lines[i]).size(), columns.size()) << lines[i];
  }
  const auto col = [&](const std::string& name) {
    return static_cast<size_t>(std::find(columns.begin(), columns.end(), name) - columns.begin());
  };
  const std::vector<std::string> failed = split_csv_line(lines[4]);
  EXPECT_EQ(failed[col("verdict")], "FAIL:dq");
  EXPECT_EQ(failed[col("passed")], "0");
  EXPECT_EQ(failed[col("timed")], "1");
  const std::vector<std::string> best = split_csv_line(lines[3]);
  EXPECT_EQ(best[col("total_ms")], "8.0000");
  EXPECT_EQ(best[col("fwd_tile")], "64x64/128");
  EXPECT_EQ(best[col("bwd_tile")], "64x128");
  EXPECT_EQ(best[col("threads")], "256");
  EXPECT_EQ(best[col("path")], "double");
  const std::vector<std::string> refused = split_csv_line(lines[5]);
  EXPECT_EQ(refused[col("total_ms")], "");
  EXPECT_EQ(refused[col("status")], "refused");
}

}  // namespace
}  // namespace ft::sweep
