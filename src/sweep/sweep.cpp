#include "sweep/sweep.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/device.h"
#include "sweep/check_data.h"
#include "sweep/child_process.h"
#include "sweep/worker.h"

namespace ft::sweep {

using attention::BackwardPath;
using attention::DeviceLimits;
using attention::KernelConfig;

void SweepOptions::validate() const {
  shape.validate();
  (void)parse_axis(axis);
  if (!backward_path.empty()) {
    (void)attention::parse_backward_path(backward_path);
    FT_CHECK(!all_paths, "--backward-path ", backward_path,
             " and --all-paths: give one (--all-paths sweeps every path)");
  }
  FT_CHECK(warmup >= 0, "--warmup ", warmup, ": must be 0 or more");
  FT_CHECK(iters >= 1, "--iters ", iters, ": must be at least 1");
  FT_CHECK(rounds >= 1, "--rounds ", rounds, ": must be at least 1");
  FT_CHECK(num_shards >= 1, "--num-shards ", num_shards, ": must be at least 1");
  FT_CHECK(shard >= 0 && shard < num_shards, "--shard ", shard, ": must be in [0, ", num_shards,
           ") for --num-shards ", num_shards);
  FT_CHECK(gpus.empty() || gpus == "all", "--gpus '", gpus, "': allowed: all");
  FT_CHECK(gpus.empty() || device < 0, "--gpus all and --device ", device,
           ": give one (--gpus all uses every visible GPU)");
  FT_CHECK(device >= -1, "--device ", device, ": must be 0 or more");
  FT_CHECK(arch.empty() || dry_run, "--arch ", arch,
           " names the architecture of a --dry-run; a run uses its GPU's");
  if (!arch.empty()) (void)DeviceLimits::for_arch(arch);
  FT_CHECK(worker_timeout_s > 0, "--worker-timeout ", worker_timeout_s, ": must be positive");
  FT_CHECK(max_input_sets >= 1, "--max-input-sets ", max_input_sets, ": must be at least 1");
  FT_CHECK(kernel_config_path.empty() || !dry_run, "--emit-kernel-config ", kernel_config_path,
           ": a --dry-run times nothing, so there is no fastest correct configuration to write");
}

std::vector<GpuFacts> sweep_gpus(const SweepOptions& opt) {
  if (!opt.arch.empty()) {
    const DeviceLimits d = DeviceLimits::for_arch(opt.arch);
    GpuFacts g;
    g.name = "(dry run)";
    g.arch = d.arch;
    g.compute_capability = d.compute_capability;
    g.smem_per_block = d.max_smem_per_block;
    return {g};
  }
  const int count = cuda_device_count();
  if (count == 0) {
    std::string known;
    for (const std::string& a : DeviceLimits::known_archs())
      known += (known.empty() ? "" : ", ") + a;
    throw Error(str("no CUDA GPU (", cuda_unavailable_reason(), "); ",
                    opt.dry_run ? "--dry-run without a GPU needs --arch (" + known + ")"
                                : "--dry-run --arch sm90 lists the candidates without one"));
  }
  std::vector<int> devices;
  if (opt.gpus == "all") {
    for (int d = 0; d < count; ++d) devices.push_back(d);
  } else {
    const int d = std::max(opt.device, 0);
    FT_CHECK(d < count, "--device ", d, ": this machine has ", count, " GPU(s)");
    devices.push_back(d);
  }
  std::vector<GpuFacts> out;
  for (int d : devices) {
    GpuFacts g;
    g.device = d;
    g.name = cuda_device_name(d);
    g.compute_capability = cuda_compute_capability(d);
    g.arch = str("sm", g.compute_capability);
    g.smem_per_block = cuda_max_shared_memory_per_block(d);
    g.sms = cuda_sm_count(d);
    out.push_back(g);
  }
  return out;
}

SweepPlan plan_sweep(const SweepOptions& opt, const std::vector<GpuFacts>& gpus) {
  opt.validate();
  FT_CHECK(!gpus.empty(), "sweep: no GPU to plan for");
  SweepPlan plan;
  DeviceLimits limits;
  limits.arch = gpus.front().arch;
  limits.compute_capability = gpus.front().compute_capability;
  limits.max_smem_per_block = gpus.front().smem_per_block;
  plan.masks = sweep_masks(opt.shape);
  const attention::Problem problem = timed_problem(opt.shape, plan.masks.front());
  const KernelConfig base =
      attention::default_config(limits, opt.shape.head_dim, attention::MaskClass::dense,
                                opt.shape.seq_len, opt.shape.q_heads / opt.shape.kv_heads);
  std::vector<BackwardPath> paths = {base.backward_path};
  if (opt.all_paths) paths = attention::all_backward_paths();
  if (!opt.backward_path.empty()) paths = {attention::parse_backward_path(opt.backward_path)};
  plan.reference = reference_candidate(base, problem, limits);
  plan.candidates =
      select_shard(make_candidates(parse_axis(opt.axis), paths, base, problem, limits), opt.shard,
                   opt.num_shards);

  SweepHeader& h = plan.header;
  h.gpus = gpus;
  h.shape = opt.shape;
  h.base = base;
  h.reference = plan.reference.config;
  h.axis = opt.axis;
  for (BackwardPath p : paths) h.paths.push_back(attention::backward_path_name(p));
  h.sweep_kernels_compiled = attention::compiled_kernels().sweep_set;
  h.warmup = opt.warmup;
  h.iters = opt.iters;
  h.rounds = opt.rounds;
  h.dry_run = opt.dry_run;
  return plan;
}

namespace {

SweepRow planned_row(const Candidate& c, const std::string& mask, int gpu) {
  SweepRow r;
  r.mask = mask;
  r.gpu = gpu;
  r.index = c.index;
  r.role = c.role;
  r.config = c.config;
  r.status = c.refused.empty() ? RowStatus::planned : RowStatus::refused;
  r.reason = c.refused;
  return r;
}

}  // namespace

SweepRow row_from_worker_output(const std::string& result_json, const ChildOutcome& outcome,
                                double timeout_s) {
  SweepRow row;
  bool parsed = false;
  if (!result_json.empty()) {
    try {
      row = row_from_json(nlohmann::json::parse(result_json));
      parsed = true;
    } catch (const std::exception& e) {
      row.reason = str("unreadable worker result: ", e.what());
    }
  }
  if (parsed && (outcome.exited_cleanly() || row.status == RowStatus::error)) return row;
  // A crash or a timeout leaves no result line (or one without the error): say what ended it.
  std::string what = str("worker ", outcome.describe(timeout_s));
  if (!parsed && !outcome.last_line.empty()) what += ": " + outcome.last_line;
  if (!parsed && !row.reason.empty()) what += " (" + row.reason + ")";
  row.status = RowStatus::error;
  row.reason = what;
  return row;
}

std::vector<SweepRow> dry_run_rows(const SweepPlan& plan) {
  std::vector<SweepRow> rows = {planned_row(plan.reference, "all", plan.header.gpus[0].device)};
  for (const Candidate& c : plan.candidates) {
    rows.push_back(planned_row(c, "all", plan.header.gpus[0].device));
  }
  return rows;
}

namespace {

// A fresh directory for the check data, removed afterwards.
class WorkDir {
 public:
  WorkDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / str("flashtrain_sweep_", getpid(), "_", rd());
    std::filesystem::create_directories(path_);
  }
  ~WorkDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

struct Job {
  Candidate candidate;
  int gpu = 0;
  WorkerJob work;
};

class Runner {
 public:
  Runner(const SweepOptions& opt, const std::string& self, std::ostream& err)
      : opt_(opt), self_(self), err_(err) {}

  // Runs the jobs: one thread per GPU, each running its jobs one after another.
  std::vector<SweepRow> run(const std::vector<Job>& jobs, const MaskFacts& mask) {
    std::map<int, std::vector<const Job*>> per_gpu;
    for (const Job& j : jobs) per_gpu[j.gpu].push_back(&j);
    total_ = static_cast<int>(jobs.size());
    done_ = 0;
    std::vector<SweepRow> rows;
    std::vector<std::thread> threads;
    for (auto& [gpu, list] : per_gpu) {
      threads.emplace_back([&, list = list] {
        for (const Job* j : list) {
          SweepRow row = run_one(*j, mask);
          std::lock_guard<std::mutex> lock(mutex_);
          rows.push_back(row);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return rows;
  }

 private:
  void say(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    err_ << line << std::endl;
  }

  SweepRow run_one(const Job& job, const MaskFacts& mask) {
    int position = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      position = ++done_;
    }
    const std::string tag =
        str("[", position, "/", total_, "] ", mask.key, " gpu", job.gpu, " ",
            job.candidate.index < 0 ? std::string("ref") : str("#", job.candidate.index), " ",
            job.candidate.config.str(), ": ");
    say(tag + "starting");
    std::string result;
    const ChildOutcome outcome =
        run_child({self_, "sweep", "--worker", job_to_json(job.work).dump()}, opt_.worker_timeout_s,
                  [&](const std::string& line) {
                    if (line.rfind(kResultPrefix, 0) == 0) {
                      result = line.substr(std::string(kResultPrefix).size());
                    } else if (line.rfind(kProgressPrefix, 0) == 0) {
                      say(tag + line.substr(std::string(kProgressPrefix).size()));
                    }
                  });
    SweepRow row = row_from_worker_output(result, outcome, opt_.worker_timeout_s);
    row.mask = mask.key;
    row.gpu = job.gpu;
    row.index = job.candidate.index;
    row.role = job.candidate.role;
    row.config = job.candidate.config;
    row.flop = mask.fwd_flop + mask.bwd_flop;
    std::string done = row.verdict();
    if (row.timed) done += str(", ", fixed(row.total_ms(), 3), " ms");
    say(tag + done);
    return row;
  }

  const SweepOptions& opt_;
  std::string self_;
  std::ostream& err_;
  std::mutex mutex_;
  int total_ = 0, done_ = 0;
};

MaskFacts mask_facts(const SweepShape& shape, const SweepMask& mask) {
  MaskFacts m;
  m.key = mask.key;
  m.description = mask.describe();
  const attention::Problem p = timed_problem(shape, mask);
  const Tensor ids =
      mask.documents > 0 ? document_ids(shape.batch, shape.seq_len, mask.documents) : Tensor();
  m.attended_pairs = p.attended_pairs(ids);
  m.check_window = check_problem(shape, mask).mask.window;
  m.fwd_flop = 4.0 * static_cast<double>(m.attended_pairs) * static_cast<double>(shape.head_dim);
  m.bwd_flop = 2.5 * m.fwd_flop;
  return m;
}

std::vector<Job> jobs_for(const SweepPlan& plan, const SweepOptions& opt, const SweepMask& mask,
                          const std::string& check_dir, std::vector<SweepRow>& refused) {
  const bool ref_runs = plan.reference.refused.empty();
  WorkerJob base_job;
  base_job.shape = opt.shape;
  base_job.mask_key = mask.key;
  base_job.reference = plan.reference.config;
  base_job.pair_with_reference = ref_runs;
  base_job.check_dir = check_dir;
  base_job.warmup = opt.warmup;
  base_job.iters = opt.iters;
  base_job.rounds = opt.rounds;
  base_job.time_failing = opt.time_failing;
  base_job.max_input_sets = opt.max_input_sets;
  base_job.seed = opt.seed;
  // FT_SWEEP_INJECT_FAULT="<kind>@<index>": that candidate's worker fails on purpose (tests).
  std::string fault_kind;
  int fault_index = -2;
  if (const char* env = std::getenv("FT_SWEEP_INJECT_FAULT"); env != nullptr && *env != 0) {
    const std::string text = env;
    const size_t at = text.find('@');
    FT_CHECK(at != std::string::npos, "FT_SWEEP_INJECT_FAULT '", text,
             "': expected <kind>@<candidate index>, e.g. illegal-address@1");
    fault_kind = text.substr(0, at);
    fault_index = std::stoi(text.substr(at + 1));
  }
  std::vector<Job> jobs;
  auto add = [&](const Candidate& c, int gpu) {
    if (!c.refused.empty()) {
      refused.push_back(planned_row(c, mask.key, gpu));
      return;
    }
    Job j{c, gpu, base_job};
    j.work.config = c.config;
    j.work.is_reference = c.index < 0;
    j.work.device = gpu;
    if (c.index == fault_index) j.work.fault = fault_kind;
    jobs.push_back(j);
  };
  // The reference on every GPU first, then the candidates dealt out to the GPUs in turn.
  for (const GpuFacts& g : plan.header.gpus) add(plan.reference, g.device);
  const auto& gpus = plan.header.gpus;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    add(plan.candidates[i], gpus[i % gpus.size()].device);
  }
  return jobs;
}

void write_outputs(const SweepOptions& opt, const SweepHeader& h,
                   const std::vector<SweepRow>& rows) {
  if (!opt.json_path.empty()) write_json(opt.json_path, h, rows);
  if (!opt.csv_path.empty()) write_csv(opt.csv_path, h, rows);
}

int dry_run(const SweepOptions& opt, SweepPlan& plan, std::ostream& out) {
  MaskFacts all;
  all.key = "all";
  for (const SweepMask& m : plan.masks) {
    all.description += (all.description.empty() ? "" : ", then ") + m.describe();
  }
  all.description += " (can_implement does not depend on the mask)";
  plan.header.masks = {all};
  const std::vector<SweepRow> rows = dry_run_rows(plan);
  out << format_header(plan.header) << format_mask_table(plan.header, all, rows);
  write_outputs(opt, plan.header, rows);
  if (opt.emit_defaults) out << "\n" << emit_defaults(plan.header, rows);
  return 0;
}

}  // namespace

int run_sweep(const SweepOptions& opt, const std::string& self, std::ostream& out,
              std::ostream& err) {
  opt.validate();
  SweepPlan plan = plan_sweep(opt, sweep_gpus(opt));
  if (opt.dry_run) return dry_run(opt, plan, out);
  SweepHeader& h = plan.header;
  DeviceLimits limits;
  limits.arch = h.gpus.front().arch;
  limits.compute_capability = h.gpus.front().compute_capability;
  limits.max_smem_per_block = h.gpus.front().smem_per_block;
  for (const SweepMask& m : plan.masks) {
    h.masks.push_back(mask_facts(opt.shape, m));
    h.masks.back().default_config = attention::default_config(limits, timed_problem(opt.shape, m));
  }
  out << format_header(h) << std::flush;
  WorkDir dir;
  Runner runner(opt, self, err);
  std::vector<SweepRow> rows;
  for (size_t m = 0; m < plan.masks.size(); ++m) {
    const SweepMask& mask = plan.masks[m];
    err << "mask " << mask.key << ": the fp64 reference of the check problem (B=" << kCheckBatch
        << " S=" << kCheckSeqLen << ") on the CPU" << std::endl;
    save_check_data(dir.path(), mask, make_check_data(opt.shape, mask, opt.seed + 101 * m));
    std::vector<SweepRow> mask_rows;
    const std::vector<Job> jobs = jobs_for(plan, opt, mask, dir.path(), mask_rows);
    for (const SweepRow& r : runner.run(jobs, h.masks[m])) mask_rows.push_back(r);
    std::sort(mask_rows.begin(), mask_rows.end(), [](const SweepRow& a, const SweepRow& b) {
      return a.index != b.index ? a.index < b.index : a.gpu < b.gpu;
    });
    rows.insert(rows.end(), mask_rows.begin(), mask_rows.end());
    out << format_mask_table(h, h.masks[m], rows) << std::flush;
    write_outputs(opt, h, rows);
  }
  if (opt.emit_defaults) out << "\n" << emit_defaults(h, rows);
  if (!opt.kernel_config_path.empty()) {
    const size_t written = write_kernel_config_file(opt.kernel_config_path, h, rows);
    out << "\nkernel config file " << opt.kernel_config_path << ": " << written << " row"
        << (written == 1 ? "" : "s")
        << (written == 0 ? " (no configuration passed the check and was timed)" : "")
        << "; train with it: flashtrain train --kernel-config " << opt.kernel_config_path << "\n";
  }
  return 0;
}

}  // namespace ft::sweep
