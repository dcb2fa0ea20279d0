// Kernel-config files without a GPU: a valid file reads back its rows, every kind of bad file
// is refused naming the file, the row and the field, and the lookup puts the file's rows
// before the built-in table (architecture family, tightest head-dim bound, mask class), with
// default_config()'s deterministic rule on top and can_implement() checked.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "attention/kernel_config_file.h"
#include "core/error.h"
#include "test_util.h"

namespace ft::attention {
namespace {

Problem bf16_problem(int64_t head_dim, bool local = false) {
  Problem p;
  p.batch = 2;
  p.seq_len = 513;
  p.q_heads = 8;
  p.kv_heads = 2;
  p.head_dim = head_dim;
  p.dtype = DType::bf16;
  p.mask.causal = true;
  p.mask.window = local ? 64 : 0;
  return p;
}

// A file around the given rows (JSON text of the array's elements).
std::string file_with_rows(const std::string& rows) {
  return R"({"format": "flashtrain-kernel-config", "version": 1, "rows": [)" + rows + "]}";
}

std::string row(const std::string& arch, int max_head_dim, const std::string& mask,
                const std::string& config) {
  return str(R"({"arch": ")", arch, R"(", "max_head_dim": )", max_head_dim, R"(, "mask": ")", mask,
             R"(", "config": ")", config, R"("})");
}

std::string refusal(const std::string& text) {
  try {
    parse_kernel_config_file(text, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KernelConfigFile, ReadsRowsAndProvenance) {
  const std::string text =
      R"({"format": "flashtrain-kernel-config", "version": 1, "note": "hand edited",
          "source": {"tool": "flashtrain sweep", "gpu": "NVIDIA H200"},
          "rows": [{"arch": "sm90", "max_head_dim": 128, "mask": "local",
                    "config": "fwd=64x64/128/wgmma bwd=64x128/384/tma", "note": "window 512",
                    "measured": {"total_ms": 6.997}},
                   {"arch": "sm86", "max_head_dim": 256, "mask": "dense",
                    "config": "fwd=64x64/128 bwd=64x64/128/single"}]})";
  const KernelConfigFile f = parse_kernel_config_file(text, "t.json");
  EXPECT_EQ(f.path, "t.json");
  ASSERT_EQ(f.rows.size(), 2u);
  EXPECT_EQ(f.rows[0].arch, "sm90");
  EXPECT_EQ(f.rows[0].max_head_dim, 128);
  EXPECT_EQ(f.rows[0].mask_class, MaskClass::local);
  EXPECT_EQ(f.rows[0].config.str(), "fwd=64x64/128/wgmma bwd=64x128/384/tma");
  EXPECT_EQ(f.rows[1].mask_class, MaskClass::dense);
  EXPECT_EQ(f.row_name(f.rows[1]),
            "kernel config file t.json, rows[1] (sm86, head dims <= 256, "
            "dense)");
  // No rows is a valid file: the built-in table decides everything.
  EXPECT_TRUE(parse_kernel_config_file(file_with_rows(""), "t.json").rows.empty());
}

TEST(KernelConfigFile, BadFilesNameTheFileTheRowAndTheField) {
  const std::string ok = row("sm90", 128, "local", "fwd=64x64/128/wgmma bwd=64x128/384/tma");
  const struct {
    std::string text;
    std::string says;
  } cases[] = {
      {"{\"format\": ", "not valid JSON: parse error at line 1"},
      {"", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {R"({"format": "x", "version": 1, "rows": []})",
       R"("format": expected "flashtrain-kernel-config", got "x")"},
      {R"({"version": 1, "rows": []})", R"("format" is missing)"},
      {R"({"format": "flashtrain-kernel-config", "version": 2, "rows": []})",
       R"("version": 2 is newer than this flashtrain reads (1))"},
      {R"({"format": "flashtrain-kernel-config", "version": "1", "rows": []})",
       R"("version": expected 1, got "1")"},
      {R"({"format": "flashtrain-kernel-config", "version": 0, "rows": []})",
       R"("version": expected 1, got 0)"},
      {R"({"format": "flashtrain-kernel-config", "version": 1.0, "rows": []})",
       R"("version": expected 1, got 1.0)"},
      {R"({"format": "flashtrain-kernel-config", "version": 1})", R"("rows" is missing)"},
      {R"({"format": "flashtrain-kernel-config", "version": 1, "rows": [], "row": []})",
       R"(unknown key "row" (allowed: format, note, rows, source, version))"},
      {R"({"format": "flashtrain-kernel-config", "version": 1, "rows": {}})",
       R"("rows": expected an array, got object)"},
      {R"({"format": "flashtrain-kernel-config", "version": 1, "source": 3, "rows": []})",
       R"("source": expected an object, got number)"},
      {R"({"format": "flashtrain-kernel-config", "version": 1, "note": 3, "rows": []})",
       R"("note": expected a string, got number 3)"},
      {file_with_rows("3"), "rows[0]: expected an object, got number 3"},
      {file_with_rows(ok + ", 7"), "rows[1]: expected an object"},
      {file_with_rows(R"({"arch": "sm90", "head_dim": 128, "mask": "local", "config": "x"})"),
       R"(rows[0]: unknown key "head_dim")"},
      {file_with_rows(R"({"arch": "sm90", "max_head_dim": 128, "mask": "local"})"),
       R"(rows[0]: "config" is missing)"},
      {file_with_rows(row("sm89", 128, "local", "fwd=64x64/128 bwd=64x64/128/single")),
       R"(rows[0]: "arch": 'sm89' is not an architecture family of the table (families: sm80, )"
       R"(sm86, sm90, sm100, sm120; sm89 GPUs use the sm86 rows))"},
      {file_with_rows(row("sm42", 128, "local", "fwd=64x64/128 bwd=64x64/128/single")),
       "'sm42' is not an architecture family"},
      {file_with_rows(R"({"arch": 90, "max_head_dim": 128, "mask": "local", "config": "x"})"),
       R"(rows[0]: "arch": expected a string, got number 90)"},
      {file_with_rows(row("sm90", 0, "local", "fwd=64x64/128 bwd=64x64/128/double")),
       R"(rows[0]: "max_head_dim": expected an integer in [1, 256], got 0)"},
      {file_with_rows(row("sm90", 300, "local", "fwd=64x64/128 bwd=64x64/128/double")),
       R"("max_head_dim": expected an integer in [1, 256], got 300)"},
      {file_with_rows(row("sm90", -8, "local", "fwd=64x64/128 bwd=64x64/128/double")),
       R"("max_head_dim": expected an integer in [1, 256], got -8)"},
      {file_with_rows(
           R"({"arch": "sm90", "max_head_dim": 64.5, "mask": "local", "config": "fwd=64x64/128"})"),
       R"("max_head_dim": expected an integer in [1, 256], got 64.5)"},
      {file_with_rows(
           R"({"arch": "sm90", "max_head_dim": 1e30, "mask": "local", "config": "fwd=64x64/128"})"),
       R"("max_head_dim": expected an integer in [1, 256])"},
      {file_with_rows(row("sm90", 128, "sparse", "fwd=64x64/128 bwd=64x64/128/double")),
       R"(rows[0]: "mask": expected "dense" (none, causal) or "local" (a window or segment ids), )"
       R"(got "sparse")"},
      {file_with_rows(row("sm90", 128, "local", "fwd=64x64")),
       R"(rows[0]: "config": kernel config: cannot read 'fwd=64x64')"},
      {file_with_rows(row("sm90", 128, "local", "fwd=64x64/128")),
       R"(rows[0]: "config": 'fwd=64x64/128' has no bwd= part)"},
      {file_with_rows(row("sm90", 128, "local", "bwd=64x64/128/double")),
       R"('bwd=64x64/128/double' has no fwd= part)"},
      {file_with_rows(row("sm90", 128, "local", std::string(300, 'x'))),
       R"("config": a configuration of 300 characters (at most 256))"},
      {file_with_rows(
           R"({"arch": "sm90", "max_head_dim": 128, "mask": "local", "config": "fwd=64x64/128 )"
           R"(bwd=64x64/128/double", "measured": []})"),
       R"(rows[0]: "measured": expected an object, got array)"},
      {file_with_rows(ok + ", " + row("sm90", 64, "local", "fwd=64x64/128 bwd=64x64/128/double") +
                      ", " + row("sm90", 128, "local", "fwd=64x64/128 bwd=64x64/128/double")),
       "rows[2]: a second row for sm90, head dims <= 128, local (rows[0] is the first); keep one"},
  };
  for (const auto& c : cases) {
    const std::string why = refusal(c.text);
    EXPECT_EQ(why.rfind("kernel config file t.json: ", 0), 0u) << c.text << "\n" << why;
    EXPECT_NE(why.find(c.says), std::string::npos) << c.text << "\n" << why;
  }
  // The same key for another mask class, bound or family is another row.
  EXPECT_EQ(refusal(file_with_rows(
                ok + ", " + row("sm90", 128, "dense", "fwd=64x64/128 bwd=64x64/128/double") + ", " +
                row("sm90", 64, "local", "fwd=64x64/128 bwd=64x64/128/double") + ", " +
                row("sm80", 128, "local", "fwd=64x64/128 bwd=64x64/128/double"))),
            "");
}

TEST(KernelConfigFile, ReadingChecksThePath) {
  test::TempDir dir;
  auto refused = [](const std::string& path) {
    try {
      read_kernel_config_file(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refused(dir.file("missing.json")),
            "kernel config file " + dir.file("missing.json") + ": no such file");
  EXPECT_NE(refused(dir.path().string()).find("not a regular file"), std::string::npos);
  {
    std::ofstream big(dir.file("big.json"));
    big << std::string((1 << 20) + 1, ' ');
  }
  EXPECT_NE(refused(dir.file("big.json")).find("1048577 bytes; a kernel config file is a few KB"),
            std::string::npos);
  {
    std::ofstream good(dir.file("good.json"));
    good << file_with_rows(row("sm90", 128, "dense", "fwd=64x64/128 bwd=64x64/128/double"));
  }
  const KernelConfigFile f = read_kernel_config_file(dir.file("good.json"));
  EXPECT_EQ(f.path, dir.file("good.json"));
  ASSERT_EQ(f.rows.size(), 1u);
}

TEST(KernelConfigFile, FileRowsComeBeforeTheBuiltInTable) {
  const KernelConfigFile f = parse_kernel_config_file(
      file_with_rows(row("sm90", 256, "dense", "fwd=128x64/128 bwd=64x128/256/double") + ", " +
                     row("sm90", 64, "dense", "fwd=64x64/128 bwd=64x64/128/double") + ", " +
                     row("sm90", 128, "local", "fwd=64x64/128/wgmma bwd=64x64/128/wgmma") + ", " +
                     row("sm86", 256, "dense", "fwd=64x128/128 bwd=64x64/128/single")),
      "tuned.json");
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  auto chosen = [&](const DeviceLimits& d, int64_t head_dim, bool local) {
    return choose_kernel_config(&f, d, bf16_problem(head_dim, local));
  };
  // The tightest bound that covers the head dim, whatever the order of the rows.
  EXPECT_EQ(chosen(sm90, 64, false).config.str(), "fwd=64x64/128 bwd=64x64/128/double");
  EXPECT_EQ(chosen(sm90, 64, false).row, &f.rows[1]);
  EXPECT_EQ(chosen(sm90, 32, false).row, &f.rows[1]);
  EXPECT_EQ(chosen(sm90, 128, false).row, &f.rows[0]);
  EXPECT_EQ(chosen(sm90, 128, false).config.str(), "fwd=128x64/128 bwd=64x128/256/double");
  // The mask class picks the row: a window makes the problem local.
  EXPECT_EQ(chosen(sm90, 128, true).row, &f.rows[2]);
  EXPECT_EQ(chosen(sm90, 64, true).row, &f.rows[2]);
  Problem segments = bf16_problem(128);
  segments.mask.has_segments = true;
  EXPECT_EQ(choose_kernel_config(&f, sm90, segments).row, &f.rows[2]);
  // Past every bound of the class: the built-in table.
  const KernelConfigChoice d256 = chosen(sm90, 256, true);
  EXPECT_EQ(d256.row, nullptr);
  EXPECT_EQ(d256.config, default_config(sm90, bf16_problem(256, true)));
  EXPECT_EQ(d256.origin(), "the built-in sm90 table");
  // Rows belong to a family: sm89 reads sm86's, sm80 has none here.
  const DeviceLimits sm89 = DeviceLimits::for_arch("sm89");
  EXPECT_EQ(chosen(sm89, 64, false).row, &f.rows[3]);
  EXPECT_EQ(chosen(sm89, 64, true).row, nullptr);
  const DeviceLimits sm80 = DeviceLimits::for_arch("sm80");
  EXPECT_EQ(chosen(sm80, 64, false).config, default_config(sm80, bf16_problem(64)));
  // Without a file: exactly default_config().
  for (bool local : {false, true}) {
    for (int64_t dim : {32, 64, 128, 256}) {
      const Problem p = bf16_problem(dim, local);
      EXPECT_EQ(choose_kernel_config(nullptr, sm90, p).config, default_config(sm90, p));
    }
  }
  EXPECT_EQ(chosen(sm90, 64, false).origin(),
            "kernel config file tuned.json, rows[1] (sm90, head dims <= 64, dense)");
}

// default_config()'s rule holds for a file's rows too: deterministic mode on sm90 runs the tma
// backward, whatever backward the row names.
TEST(KernelConfigFile, DeterministicModeKeepsTheTmaBackward) {
  const KernelConfigFile f = parse_kernel_config_file(
      file_with_rows(row("sm90", 128, "local", "fwd=64x64/128/wgmma bwd=64x64/128/wgmma") + ", " +
                     row("sm90", 128, "dense", "fwd=128x128/384/tma/s2/pp bwd=64x128/384/tma")),
      "tuned.json");
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  Problem p = bf16_problem(128, true);
  p.deterministic = true;
  const KernelConfigChoice c = checked_kernel_config(&f, sm90, p);
  EXPECT_EQ(c.config.str(), "fwd=64x64/128/wgmma bwd=64x128/384/tma");
  EXPECT_TRUE(c.deterministic_backward);
  EXPECT_EQ(c.origin(),
            "kernel config file tuned.json, rows[0] (sm90, head dims <= 128, local), with the tma "
            "backward for deterministic mode");
  EXPECT_EQ(c.config, with_deterministic_backward(f.rows[0].config, sm90, p));
  // A row that already names the tma backward keeps it.
  Problem dense = bf16_problem(128);
  dense.deterministic = true;
  const KernelConfigChoice kept = choose_kernel_config(&f, sm90, dense);
  EXPECT_EQ(kept.config, f.rows[1].config);
  EXPECT_FALSE(kept.deterministic_backward);
}

// A row that cannot run the problem is an error naming the row and can_implement's reason, not
// a silent fall back to the built-in table.
TEST(KernelConfigFile, ARowThatCannotRunIsRefusedNamingIt) {
  const KernelConfigFile f = parse_kernel_config_file(
      file_with_rows(row("sm90", 128, "dense", "fwd=128x128/384/tma/s2/pp bwd=64x128/384/tma")),
      "tuned.json");
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  EXPECT_EQ(checked_kernel_config(&f, sm90, bf16_problem(128)).row, &f.rows[0]);
  try {
    checked_kernel_config(&f, sm90, bf16_problem(32));  // the bound covers 32; the plans do not
    FAIL() << "head dim 32 has no tma plan";
  } catch (const Error& e) {
    const std::string why = e.what();
    EXPECT_EQ(why.rfind("kernel config file tuned.json, rows[0] (sm90, head dims <= 128, dense): "
                        "fwd=128x128/384/tma/s2/pp bwd=64x128/384/tma cannot run B=2 S=513",
                        0),
              0u)
        << why;
    EXPECT_NE(why.find("head dim 32: the tma forward kernels support"), std::string::npos) << why;
  }
  // A forward-only caller is not refused for the backward.
  const KernelConfigFile fwd_only = parse_kernel_config_file(
      file_with_rows(row("sm90", 256, "dense", "fwd=128x64/384/tma/s2/pp bwd=64x128/384/tma")),
      "tuned.json");
  EXPECT_NO_THROW(
      checked_kernel_config(&fwd_only, sm90, bf16_problem(256), KernelDirection::forward));
  EXPECT_THROW(checked_kernel_config(&fwd_only, sm90, bf16_problem(256)), Error);
  // fp32 has fixed kernels: any row runs it.
  Problem fp32 = bf16_problem(32);
  fp32.dtype = DType::f32;
  EXPECT_NO_THROW(checked_kernel_config(&f, sm90, fp32));
}

}  // namespace
}  // namespace ft::attention
