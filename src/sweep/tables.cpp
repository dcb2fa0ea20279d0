// The text table of a sweep, its summary, --emit-defaults and --emit-kernel-config's rows
// (declared in results.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "attention/kernel_config_file.h"
#include "sweep/candidates.h"
#include "sweep/results.h"

namespace ft::sweep {

std::string fixed(double x, int digits) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string sci(double x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  if (x == 0.0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

namespace {

std::string percent(double fraction) {
  return fixed(100.0 * fraction, 1) + "%";
}

// Columns padded to their widest cell; the last column is left ragged.
std::string aligned(const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> width;
  for (const auto& row : cells) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream os;
  for (const auto& row : cells) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    os << line << "\n";
  }
  return os.str();
}

std::vector<const SweepRow*> rows_of(const std::vector<SweepRow>& rows, const std::string& mask) {
  std::vector<const SweepRow*> out;
  for (const SweepRow& r : rows) {
    if (r.mask == mask) out.push_back(&r);
  }
  // The reference rows first (one per GPU), then the candidates in list order.
  std::stable_sort(out.begin(), out.end(), [](const SweepRow* a, const SweepRow* b) {
    if (a->index != b->index) return a->index < b->index;
    return a->gpu < b->gpu;
  });
  return out;
}

std::vector<std::string> table_cells(const SweepRow& r, bool with_gpu, bool dry_run,
                                     int64_t head_dim) {
  std::vector<std::string> cells;
  if (with_gpu) cells.push_back(std::to_string(r.gpu));
  cells.push_back(r.index < 0 ? "-" : std::to_string(r.index));
  cells.push_back(r.role);
  cells.push_back(r.config.forward_str().substr(4));
  cells.push_back(str(r.config.backward.block_m, "x", r.config.backward.block_n));
  cells.push_back(std::to_string(r.config.backward.threads));
  // The path, with the tma backward's ring depth where the configuration names one.
  const bool stages =
      r.config.backward_path == attention::BackwardPath::tma && r.config.backward_stages != 0;
  cells.push_back(str(attention::backward_path_name(r.config.backward_path),
                      stages ? str("/s", r.config.backward_stages) : std::string()));
  if (dry_run) {
    cells.push_back(std::to_string(attention::forward_smem_bytes(r.config, head_dim)));
    cells.push_back(std::to_string(attention::backward_smem_bytes(r.config, head_dim)));
  } else if (r.timed) {
    // A timed row that failed its check (--time-failing) is marked with '!'.
    const std::string mark = r.passed() ? "" : "!";
    cells.push_back(fixed(r.timing.fwd.median_ms, 3) + mark);
    cells.push_back(fixed(r.timing.bwd.median_ms, 3) + mark);
    cells.push_back(fixed(r.total_ms(), 3) + mark);
    cells.push_back(percent(r.timing.spread()));
    cells.push_back(r.ref_timing.total_ms() > 0 ? fixed(r.vs_ref(), 2) : "-");
    cells.push_back(fixed(r.tflops(), 1));
  } else {
    for (int i = 0; i < 6; ++i) cells.push_back("-");
  }
  if (!dry_run) cells.push_back(std::isnan(r.max_abs_diff) ? "-" : sci(r.max_abs_diff));
  cells.push_back(r.verdict());
  return cells;
}

bool several_gpus(const std::vector<const SweepRow*>& rows) {
  std::set<int> gpus;
  for (const SweepRow* r : rows) gpus.insert(r->gpu);
  return gpus.size() > 1;
}

std::string row_name(const SweepRow& r) {
  const std::string name = r.index < 0 ? std::string("ref") : str("#", r.index);
  return str(name, " ", r.config.str(), " (gpu ", r.gpu, ")");
}

// Whether the default is the fastest correct configuration, and by how much it is not.
std::string summary(const SweepHeader& h, const std::vector<SweepRow>& all, const MaskFacts& mask,
                    const std::vector<const SweepRow*>& rows) {
  std::ostringstream os;
  if (h.dry_run) {
    int runnable = 0;
    for (const SweepRow* r : rows) runnable += r->status == RowStatus::planned ? 1 : 0;
    os << rows.size() << " rows: " << runnable << " can run, " << rows.size() - runnable
       << " refused\n";
    return os.str();
  }
  int passed = 0, failed = 0, errors = 0, refused = 0;
  for (const SweepRow* r : rows) {
    if (r->status == RowStatus::refused) ++refused;
    if (r->status == RowStatus::error) ++errors;
    if (r->status == RowStatus::checked) (r->passed() ? passed : failed)++;
  }
  os << "correctness: " << passed << " ok, " << failed << " FAIL, " << errors << " ERROR, "
     << refused << " refused\n";
  for (const SweepRow* r : rows) {
    if (r->index >= 0 || !r->timed || r->timing.fwd.round_ms.size() < 2) continue;
    os << "reference per round (gpu " << r->gpu << "), total ms:";
    const DirectionTiming& f = r->timing.fwd;
    const DirectionTiming& b = r->timing.bwd;
    for (size_t i = 0; i < f.round_ms.size() && i < b.round_ms.size(); ++i) {
      os << " " << fixed(f.round_ms[i] + b.round_ms[i], 3);
    }
    os << "\n";
  }
  const SweepRow* best = fastest_correct(all, mask.key);
  if (best == nullptr) {
    os << "fastest correct: none (no row passed the check and was timed)\n";
    return os.str();
  }
  os << "fastest correct: " << row_name(*best) << ": " << fixed(best->total_ms(), 3) << " ms, "
     << fixed(best->vs_ref(), 2) << "x the reference\n";
  // The default of this mask (the table has a row per mask class).
  const attention::KernelConfig mask_default = mask.default_config.value_or(h.base);
  const SweepRow* base = nullptr;
  for (const SweepRow* r : rows) {
    if (r->config == mask_default && (base == nullptr || r->index >= 0)) base = r;
  }
  if (base == nullptr) {
    os << "default " << mask_default.str() << ": not in this shard\n";
  } else if (!base->passed() || !base->timed) {
    os << "default " << mask_default.str() << ": " << base->verdict() << "\n";
  } else if (base == best || base->config == best->config) {
    os << "default " << mask_default.str() << ": the fastest correct configuration\n";
  } else {
    const double gain = base->total_ms() / best->total_ms() - 1.0;
    const double noise = std::max(base->timing.spread(), best->timing.spread());
    os << "default " << mask_default.str() << ": " << fixed(base->total_ms(), 3)
       << " ms; the fastest is " << percent(gain) << " faster"
       << (gain <= noise ? str(", within the spread (", percent(noise), "): not a difference")
                         : str(" (spread ", percent(noise), ")"))
       << "\n";
  }
  return os.str();
}

}  // namespace

std::string format_header(const SweepHeader& h) {
  std::ostringstream os;
  os << "flashtrain sweep: correctness first; read the verdict column before any timing column\n";
  for (const GpuFacts& g : h.gpus) {
    if (h.dry_run) {
      os << "dry run for " << g.arch << " (" << g.smem_per_block
         << " B shared memory per block): can_implement's verdicts only, nothing launched\n";
    } else {
      os << "GPU " << g.device << ": " << g.name << ", " << g.arch << ", " << g.sms << " SMs, "
         << g.smem_per_block << " B shared memory per block\n";
    }
  }
  const SweepShape& s = h.shape;
  os << "shape: " << s.describe() << ", sliding window " << s.window << ", " << s.documents
     << " documents per row\n";
  os << "base config (the default): " << h.base.str() << "\nreference row: " << h.reference.str()
     << "\n";
  std::string paths;
  for (const std::string& p : h.paths) paths += (paths.empty() ? "" : ",") + p;
  os << "sweep: " << h.axis << ", backward path " << paths << "; compiled kernels: "
     << (h.sweep_kernels_compiled ? "the sweep set"
                                  : "the defaults only (configure with "
                                    "-DFLASHTRAIN_SWEEP_KERNELS=ON to compile every candidate)")
     << "\n";
  if (!h.dry_run) {
    os << "check: B=" << kCheckBatch << " S=" << kCheckSeqLen
       << ", out/dq/dk/dv against the fp64 reference: allclose atol=rtol=7e-2 and error <= 2x "
          "naive bf16\n";
    os << "timing: CUDA events, warm-up " << h.warmup << ", " << h.iters << " timed calls, "
       << h.rounds
       << " round(s) alternating reference and candidate; median; spread = IQR / "
          "median; vs ref = reference total / total\n";
  }
  return os.str();
}

std::string format_mask_table(const SweepHeader& h, const MaskFacts& mask,
                              const std::vector<SweepRow>& all) {
  const std::vector<const SweepRow*> rows = rows_of(all, mask.key);
  const bool with_gpu = several_gpus(rows);
  std::ostringstream os;
  if (h.dry_run) {
    os << "\nmasks: " << mask.description << "\n";
  } else {
    os << "\nmask " << mask.key << ": " << mask.description << ", " << mask.attended_pairs
       << " attended pairs; check window " << mask.check_window << "\n";
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> head;
  if (with_gpu) head.push_back("gpu");
  for (const char* name : {"#", "role", "fwd_tile", "bwd_tile", "threads", "path"}) {
    head.push_back(name);
  }
  const std::vector<std::string> timing_head = {"fwd ms", "bwd ms",  "total ms", "spread",
                                                "vs ref", "TFLOP/s", "max|d|"};
  const std::vector<std::string> smem_head = {"fwd smem B", "bwd smem B"};
  for (const std::string& name : h.dry_run ? smem_head : timing_head) head.push_back(name);
  head.push_back("verdict");
  cells.push_back(head);
  bool marked = false;
  for (const SweepRow* r : rows) {
    cells.push_back(table_cells(*r, with_gpu, h.dry_run, h.shape.head_dim));
    marked = marked || (r->timed && !r->passed());
  }
  os << aligned(cells);
  if (marked) os << "! timed although it failed the check (--time-failing)\n";
  os << summary(h, all, mask, rows);
  return os.str();
}

const SweepRow* fastest_correct(const std::vector<SweepRow>& rows, const std::string& mask) {
  std::vector<const SweepRow*> ok;
  std::set<int> gpus;
  for (const SweepRow& r : rows) {
    if (r.mask != mask || !r.passed() || !r.timed || r.total_ms() <= 0) continue;
    ok.push_back(&r);
    gpus.insert(r.gpu);
  }
  if (ok.empty()) return nullptr;
  const bool by_ratio = gpus.size() > 1;
  return *std::min_element(ok.begin(), ok.end(), [&](const SweepRow* a, const SweepRow* b) {
    return by_ratio ? a->vs_ref() > b->vs_ref() : a->total_ms() < b->total_ms();
  });
}

namespace {

// The sweep's pure causal mask is dense; its window / segments mask is local (sweep_masks()
// gives at most one of each).
attention::MaskClass mask_class_of_key(const std::string& key) {
  return key == "causal" ? attention::MaskClass::dense : attention::MaskClass::local;
}

}  // namespace

std::string emit_defaults(const SweepHeader& h, const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  const GpuFacts gpu = h.gpus.empty() ? GpuFacts{} : h.gpus.front();
  const std::string family = attention::arch_family(gpu.compute_capability);
  os << "// kDefaults rows (src/attention/kernel_config.cpp) from this sweep; the head-dim bound "
        "is the table's (the sweep measured D="
     << h.shape.head_dim << ")\n";
  for (const MaskFacts& mask : h.masks) {
    const SweepRow* best = fastest_correct(rows, mask.key);
    os << "// " << family << " (" << gpu.name << "), " << h.shape.describe() << ", "
       << mask.description << ": ";
    if (best == nullptr) {
      os << "no configuration passed the check and was timed\n";
      continue;
    }
    os << fixed(best->total_ms(), 3) << " ms, " << fixed(best->vs_ref(), 2) << "x the reference"
       << (best->config == mask.default_config.value_or(h.base) ? "; the default already" : "")
       << "\n";
    os << "{\"" << family
       << "\", 256, MaskClass::" << attention::mask_class_name(mask_class_of_key(mask.key))
       << ", 0, 0, \"" << best->config.str() << "\"},\n";  // any sequence length
  }
  return os.str();
}

nlohmann::json kernel_config_file_json(const SweepHeader& h, const std::vector<SweepRow>& rows,
                                       const std::string& date) {
  using nlohmann::json;
  const GpuFacts gpu = h.gpus.empty() ? GpuFacts{} : h.gpus.front();
  const std::string family = attention::arch_family(gpu.compute_capability);
  json out_rows = json::array();
  for (const MaskFacts& mask : h.masks) {
    const SweepRow* best = fastest_correct(rows, mask.key);
    if (best == nullptr) continue;
    const attention::KernelConfig mask_default = mask.default_config.value_or(h.base);
    out_rows.push_back({{"arch", family},
                        {"max_head_dim", h.shape.head_dim},
                        {"mask", attention::mask_class_name(mask_class_of_key(mask.key))},
                        {"config", best->config.str()},
                        {"measured",
                         {{"mask", mask.description},
                          {"fwd_ms", best->timing.fwd.median_ms},
                          {"bwd_ms", best->timing.bwd.median_ms},
                          {"total_ms", best->total_ms()},
                          {"spread", best->timing.spread()},
                          {"vs_ref", best->vs_ref()},
                          {"default_config", mask_default.str()},
                          {"is_default", best->config == mask_default}}}});
  }
  return {{"format", attention::kKernelConfigFormat},
          {"version", attention::kKernelConfigVersion},
          {"note", str("the fastest correct configuration per mask of `flashtrain sweep`; each "
                       "row covers head dims up to the one measured (D=",
                       h.shape.head_dim, ")")},
          {"source",
           {{"tool", "flashtrain sweep"},
            {"date", date},
            {"gpu", gpu.name},
            {"arch", gpu.arch},
            {"gpus", h.gpus.size()},
            {"shape", h.shape.describe()},
            {"axis", h.axis},
            {"paths", h.paths},
            {"rounds", h.rounds},
            {"sweep_kernels_compiled", h.sweep_kernels_compiled}}},
          {"rows", out_rows}};
}

}  // namespace ft::sweep
