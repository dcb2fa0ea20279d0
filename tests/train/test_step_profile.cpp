// The step profile: the row list (one list, shared with bench/torch_peer.py), regions on the
// CPU clock, the table and its floors, and profiled training runs on the CPU (and on a GPU,
// skipped without one): every family the model uses is there with times that add up to at most
// the step, and the losses are the unprofiled run's bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "attention/attention.h"
#include "core/device.h"
#include "core/error.h"
#include "models/step_profile.h"
#include "test_util.h"
#include "train/profile_report.h"
#include "train/trainer.h"

namespace ft::train {
namespace {

using models::OpFamily;
using models::ProfileRegion;
using models::StepProfile;

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (OpFamily f : models::op_families()) names.push_back(models::op_family_info(f).name);
  return names;
}

TEST(StepProfileRows, AreTheEnumInOrderWithUniqueNames) {
  const auto& families = models::op_families();
  for (size_t i = 0; i < families.size(); ++i) EXPECT_EQ(static_cast<size_t>(families[i]), i);
  const std::vector<std::string> names = family_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  EXPECT_EQ(names.front(), "data");
  EXPECT_EQ(names.back(), "optimizer");
  EXPECT_EQ(models::op_family_info(OpFamily::gemm_qkv).work, models::WorkKind::flop);
  EXPECT_EQ(models::op_family_info(OpFamily::norm).work, models::WorkKind::bytes);
  EXPECT_EQ(models::op_family_info(OpFamily::all_reduce).work, models::WorkKind::transfer);
}

// bench/torch_peer.py prints the same rows in the same order: its ROWS list must be this one.
TEST(StepProfileRows, MatchTheTorchPeersRows) {
  std::ifstream in(test::source_path("bench/torch_peer.py"));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const size_t begin = text.find("ROWS = [");
  ASSERT_NE(begin, std::string::npos) << "bench/torch_peer.py has no ROWS list";
  const std::string list = text.substr(begin, text.find(']', begin) - begin);
  std::vector<std::string> rows;
  const std::regex quoted("\"([^\"]+)\"");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), quoted);
       it != std::sregex_iterator(); ++it) {
    rows.push_back((*it)[1]);
  }
  EXPECT_EQ(rows, family_names());
}

void busy_ms(double ms) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(StepProfile, TimesRegionsOfTheRecordedStepOnly) {
  StepProfile profile(Device::cpu);
  profile.begin_step(1, false);
  {
    ProfileRegion r(&profile, OpFamily::norm, 100.0);
    busy_ms(1.0);
  }
  profile.end_step();
  EXPECT_THROW(profile.result(), Error);  // nothing recorded yet

  profile.begin_step(2, true);
  busy_ms(1.0);  // unattributed
  {
    ProfileRegion r(&profile, OpFamily::gemm_qkv, 1e6);
    busy_ms(2.0);
    r.enter(OpFamily::norm, 50.0);  // moves on: one region closes, the next opens
    busy_ms(1.0);
    r.leave();
    busy_ms(1.0);  // unattributed
    r.enter(OpFamily::norm, 25.0);
    busy_ms(1.0);
  }
  profile.add_work_later(OpFamily::gemm_qkv, [] { return 1e6; });
  profile.end_step();
  const StepProfile::Result result = profile.result();
  EXPECT_EQ(result.step, 2);
  ASSERT_EQ(result.rows.size(), 2u);
  EXPECT_EQ(result.rows[0].family, OpFamily::norm);  // table order, not call order
  EXPECT_EQ(result.rows[0].calls, 2);
  EXPECT_DOUBLE_EQ(result.rows[0].work, 75.0);
  EXPECT_GE(result.rows[0].ms, 2.0);
  EXPECT_EQ(result.rows[1].family, OpFamily::gemm_qkv);
  EXPECT_DOUBLE_EQ(result.rows[1].work, 2e6);
  EXPECT_GE(result.rows[1].ms, 2.0);
  EXPECT_GE(result.step_ms, 6.0);
  EXPECT_LE(result.rows[0].ms + result.rows[1].ms, result.step_ms - 2.0);
}

TEST(StepProfile, RefusesNestedRegions) {
  StepProfile profile(Device::cpu);
  profile.begin_step(1, true);
  ProfileRegion outer(&profile, OpFamily::embedding);
  EXPECT_THROW(ProfileRegion inner(&profile, OpFamily::norm), Error);
  outer.leave();
  profile.end_step();
}

TEST(StepProfile, ANullProfileRecordsNothing) {
  ProfileRegion r(nullptr, OpFamily::optimizer, 1.0);
  EXPECT_FALSE(r.recording());
  r.enter(OpFamily::norm);
  r.leave();
}

TEST(ProfileFloors, KnowTheH200AndLeaveTheRestBlank) {
  const ProfileFloors bf16 = profile_floors(Device::cuda, "NVIDIA H200", DType::bf16, false);
  EXPECT_DOUBLE_EQ(*bf16.matrix_flop_per_s, 780e12);
  EXPECT_DOUBLE_EQ(*bf16.memory_bytes_per_s, 4270e9);
  EXPECT_NE(bf16.source.find("gpu_ceilings.py"), std::string::npos);
  EXPECT_DOUBLE_EQ(
      *profile_floors(Device::cuda, "NVIDIA H200", DType::f32, false).matrix_flop_per_s, 67e12);
  const ProfileFloors tf32 = profile_floors(Device::cuda, "NVIDIA H200", DType::f32, true);
  EXPECT_FALSE(tf32.matrix_flop_per_s.has_value());  // not measured
  EXPECT_TRUE(tf32.memory_bytes_per_s.has_value());
  for (const ProfileFloors& none :
       {profile_floors(Device::cpu, "", DType::f32, false),
        profile_floors(Device::cuda, "NVIDIA A10", DType::bf16, false)}) {
    EXPECT_TRUE(none.source.empty());
    EXPECT_FALSE(none.matrix_flop_per_s || none.memory_bytes_per_s);
  }
}

TEST(ProfileReport, RowsRatesFloorsAndTheUnattributedRest) {
  StepProfile::Result result;
  result.step = 3;
  result.step_ms = 10.0;
  result.rows = {{OpFamily::norm, 4, 2.0, 8e9},             // 8 GB in 2 ms: 4000 GB/s
                 {OpFamily::gemm_mlp_up, 2, 5.0, 1.56e12},  // 312 TFLOP/s
                 {OpFamily::all_reduce, 1, 1.0, 1e8}};
  const ProfileFloors floors = profile_floors(Device::cuda, "NVIDIA H200", DType::bf16, false);
  const ProfileReport report = make_profile_report(result, "gpt2 on cuda (NVIDIA H200)", floors);
  ASSERT_EQ(report.rows.size(), 5u);
  EXPECT_EQ(report.rows[0].region, "norm");
  EXPECT_DOUBLE_EQ(*report.rows[0].achieved_per_s, 4e12);
  EXPECT_NEAR(*report.rows[0].floor_ms, 8e9 / 4270e9 * 1000.0, 1e-12);
  EXPECT_DOUBLE_EQ(report.rows[1].percent, 50.0);
  EXPECT_DOUBLE_EQ(*report.rows[1].achieved_per_s, 312e12);
  EXPECT_DOUBLE_EQ(*report.rows[1].floor_ms, 2.0);
  EXPECT_FALSE(report.rows[2].floor_per_s.has_value());  // a transfer: no floor
  EXPECT_EQ(report.rows[3].region, "other (unattributed)");
  EXPECT_DOUBLE_EQ(report.rows[3].ms, 2.0);
  EXPECT_EQ(report.rows[4].region, "step");
  EXPECT_DOUBLE_EQ(report.rows[4].percent, 100.0);

  const std::string table = format_profile_table(report);
  std::istringstream lines(table);
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  ASSERT_EQ(all.size(), 7u) << table;
  EXPECT_NE(all[0].find("step profile: step 3, gpt2 on cuda (NVIDIA H200); floors: H200"),
            std::string::npos);
  // bench/torch_peer.py's format_table prints these same lines for the same rows.
  EXPECT_EQ(all[1],
            "region                 calls         ms  % step           work        achieved"
            "         floor  floor ms");
  EXPECT_EQ(all[2],
            "norm                       4      2.000   20.0%        8.00 GB       4.00 TB/s"
            "     4.27 TB/s      1.87");
  EXPECT_EQ(all[3],
            "gemm mlp-up                2      5.000   50.0%     1.56 TFLOP     312 TFLOP/s"
            "   780 TFLOP/s      2.00");
  EXPECT_EQ(all[4],
            "all-reduce                 1      1.000   10.0%         100 MB        100 GB/s"
            "             -         -");
  EXPECT_EQ(all[5], "other (unattributed)       -      2.000   20.0%");
  EXPECT_EQ(all[6], "step                       -     10.000  100.0%");

  const nlohmann::json j = to_json(report);
  EXPECT_EQ(j["event"], "profile");
  EXPECT_EQ(j["rows"][1]["unit"], "flop");
  EXPECT_DOUBLE_EQ(j["rows"][1]["floor_per_s"].get<double>(), 780e12);
  EXPECT_TRUE(j["rows"][2]["floor_per_s"].is_null());
  EXPECT_FALSE(j["rows"][3].contains("unit"));
}

TrainConfig tiny_run(const std::string& model) {
  TrainConfig c;
  c.model = model;
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data.clear();
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.batch_size = 2;
  c.seq_len = 16;
  c.total_batch_size = 2 * c.batch_size * c.seq_len;  // two micro-batches
  c.steps = 3;
  c.lr = 3e-3;
  c.sample_tokens = 0;
  c.quiet = true;
  return c;
}

nlohmann::json profile_event(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == "profile") return j;
  }
  return {};
}

// The families a step of c runs: GPT-2 has no RoPE; one process, no all-reduce; recompute only
// with --recompute.
std::vector<std::string> expected_rows(const TrainConfig& c) {
  std::vector<std::string> rows;
  for (const std::string& name : family_names()) {
    // GPT-2 has no RoPE, and its GELU rides in the MLP GEMMs' epilogues (forward and backward).
    const bool gpt2 = c.model == "gpt2-tiny";
    if (name == "all-reduce" || ((name == "rope" || name == "activation") && gpt2)) continue;
    if (name == "recompute" && c.recompute == models::Recompute::none) continue;
    // The model hands attention the fused QKV buffer where it reads it in place.
    const bool packed = attention::reads_packed_in_place(c.attention.impl, c.device);
    if (name == "qkv split/merge" && packed) continue;
    rows.push_back(name);
  }
  rows.push_back("other (unattributed)");
  rows.push_back("step");
  return rows;
}

// Trains c without and with --profile: the same losses bit for bit, and every family the model
// runs in the table and the log, with times that add up to at most the step. floors: whether
// the device has them (the H200), so that its flop and bytes rows name one.
void check_profiled_run(TrainConfig c, bool floors) {
  test::TempDir dir;
  std::ostringstream plain_out;
  const TrainSummary plain = train(c, plain_out);
  c.profile_step = 0;  // the default: step 3
  c.log_path = dir.file("run.jsonl");
  std::ostringstream out;
  const TrainSummary profiled = train(c, out);
  EXPECT_EQ(profiled.losses, plain.losses);  // bit for bit
  EXPECT_EQ(plain_out.str().find("step profile"), std::string::npos);
  EXPECT_NE(out.str().find(str("step profile: step 3, ", c.model, " on ", device_name(c.device))),
            std::string::npos)
      << out.str();

  const nlohmann::json j = profile_event(c.log_path);
  ASSERT_FALSE(j.is_null()) << "no profile event in the log";
  EXPECT_EQ(j["step"], 3);
  std::vector<std::string> rows;
  double sum = 0.0, step_ms = 0.0;
  for (const nlohmann::json& row : j["rows"]) {
    const std::string name = row["region"];
    rows.push_back(name);
    const double ms = row["ms"];
    EXPECT_GE(ms, 0.0) << name;
    EXPECT_NE(out.str().find("\n" + name + " "), std::string::npos) << name;
    if (name == "step") {
      step_ms = ms;
    } else if (name != "other (unattributed)") {
      sum += ms;
      // Two micro-batches: every family ran in both, and the work was counted.
      if (name != "zero grad" && name != "optimizer") {
        EXPECT_GE(row["calls"], 2) << name;
      }
      EXPECT_GT(row["work"].get<double>(), 0.0) << name;
      const bool transfer = name == "data" || name == "all-reduce";
      EXPECT_EQ(row["floor_per_s"].is_null(), !floors || transfer) << name;
    }
  }
  EXPECT_EQ(rows, expected_rows(c));
  EXPECT_GT(step_ms, 0.0);
  EXPECT_LE(sum, step_ms);
}

TEST(ProfiledTraining, ShowsEveryFamilyAndKeepsTheLossesBitForBit) {
  // LLaMA with document masks: its attention FLOPs are counted from the segment ids.
  for (const auto& [model, doc_mask] : {std::pair{"gpt2-tiny", false}, {"llama3-tiny", true}}) {
    SCOPED_TRACE(std::string(model) + (doc_mask ? " with --doc-mask" : ""));
    TrainConfig c = tiny_run(model);
    c.doc_mask = doc_mask;
    check_profiled_run(c, false);
  }
  // --recompute: the re-run forward is a row of its own, and the losses stay.
  SCOPED_TRACE("gpt2-tiny with --recompute block");
  TrainConfig c = tiny_run("gpt2-tiny");
  c.recompute = models::Recompute::block;
  check_profiled_run(c, false);
}

// The same on the GPU (CUDA events), fp32 (deterministic there too), naive and flash.
TEST(ProfiledTraining, OnTheGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  const bool h200 = cuda_device_name(cuda_current_device()).find("H200") != std::string::npos;
  for (const std::string impl : {"naive", "flash"}) {
    for (const std::string model : {"gpt2-tiny", "llama3-tiny"}) {
      SCOPED_TRACE(model + " " + impl);
      TrainConfig c = tiny_run(model);
      c.device = Device::cuda;
      c.attention.impl = attention::parse_impl(impl);
      c.doc_mask = model == "llama3-tiny";
      check_profiled_run(c, h200);
    }
  }
}

TEST(ProfiledTraining, ChecksTheStep) {
  TrainConfig c = tiny_run("gpt2-tiny");
  c.profile_step = 4;  // the run has 3
  std::ostringstream out;
  EXPECT_THROW(train(c, out), Error);
  c.profile_step = 1;
  c.steps = 1;
  train(c, out);
  EXPECT_NE(out.str().find("step profile: step 1"), std::string::npos);
}

}  // namespace
}  // namespace ft::train
