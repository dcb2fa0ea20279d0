#include "sweep/worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "attention/attention.h"
#include "core/device.h"
#include "sweep/check_data.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/check.h"
#include "core/cuda/event_timer.h"
#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#include "sweep/device_ops.h"
#endif

namespace ft::sweep {

using attention::KernelConfig;
using nlohmann::json;

json job_to_json(const WorkerJob& job) {
  const SweepShape& s = job.shape;
  return {{"shape",
           {{"batch", s.batch},
            {"seq_len", s.seq_len},
            {"q_heads", s.q_heads},
            {"kv_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"window", s.window},
            {"documents", s.documents}}},
          {"mask", job.mask_key},
          {"config", job.config.str()},
          {"reference", job.reference.str()},
          {"is_reference", job.is_reference},
          {"pair_with_reference", job.pair_with_reference},
          {"check_dir", job.check_dir},
          {"device", job.device},
          {"warmup", job.warmup},
          {"iters", job.iters},
          {"rounds", job.rounds},
          {"time_failing", job.time_failing},
          {"max_input_sets", job.max_input_sets},
          {"seed", job.seed},
          {"fault", job.fault}};
}

WorkerJob job_from_json(const json& j) {
  WorkerJob job;
  const json& s = j.at("shape");
  job.shape.batch = s.at("batch").get<int64_t>();
  job.shape.seq_len = s.at("seq_len").get<int64_t>();
  job.shape.q_heads = s.at("q_heads").get<int64_t>();
  job.shape.kv_heads = s.at("kv_heads").get<int64_t>();
  job.shape.head_dim = s.at("head_dim").get<int64_t>();
  job.shape.window = s.at("window").get<int64_t>();
  job.shape.documents = s.at("documents").get<int64_t>();
  job.mask_key = j.at("mask").get<std::string>();
  job.config = KernelConfig::parse(j.at("config").get<std::string>());
  job.reference = KernelConfig::parse(j.at("reference").get<std::string>());
  job.is_reference = j.at("is_reference").get<bool>();
  job.pair_with_reference = j.at("pair_with_reference").get<bool>();
  job.check_dir = j.at("check_dir").get<std::string>();
  job.device = j.at("device").get<int>();
  job.warmup = j.at("warmup").get<int>();
  job.iters = j.at("iters").get<int>();
  job.rounds = j.at("rounds").get<int>();
  job.time_failing = j.at("time_failing").get<bool>();
  job.max_input_sets = j.at("max_input_sets").get<int>();
  job.seed = j.at("seed").get<uint64_t>();
  job.fault = j.value("fault", std::string());
  return job;
}

namespace {

SweepMask find_mask(const SweepShape& shape, const std::string& key) {
  for (const SweepMask& m : sweep_masks(shape)) {
    if (m.key == key) return m;
  }
  throw Error(str("sweep worker: no mask '", key, "' for ", shape.describe()));
}

}  // namespace

#ifdef FLASHTRAIN_WITH_CUDA

namespace {

using attention::ForwardOutput;
using attention::Gradients;
using attention::Impl;
using attention::Problem;

// out, dq, dk, dv in checked_tensor_names() order.
std::vector<Tensor> outputs_of(const ForwardOutput& f, const Gradients& g) {
  return {f.o, g.dq, g.dk, g.dv};
}

std::vector<Tensor> run_once(Impl impl, const Problem& p, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& dout, const Tensor& seg,
                             const KernelConfig* config) {
  const ForwardOutput f = attention::forward(impl, p, q, k, v, seg, config);
  const Gradients g = attention::backward(impl, p, q, k, v, f, dout, seg, config);
  return outputs_of(f, g);
}

// Fills `bytes` of the stream-ordered pool with NaN and frees it: the next allocations get that
// memory, so an element the kernels forget to write reads as NaN and fails the check.
void poison_pool(int64_t bytes) {
  Tensor junk = Tensor::empty({bytes / 4 + 1}, DType::f32, Device::cuda);
  junk.fill(std::numeric_limits<double>::quiet_NaN());
}

std::vector<TensorCheck> check_config(const WorkerJob& job, const SweepMask& mask) {
  const CheckData d = load_check_data(job.check_dir, job.shape, mask);
  const Problem& p = d.problem;
  const Tensor q = d.q.to(Device::cuda), k = d.k.to(Device::cuda), v = d.v.to(Device::cuda);
  const Tensor dout = d.dout.to(Device::cuda);
  const Tensor seg = d.segment_ids.defined() ? d.segment_ids.to(Device::cuda) : Tensor();
  const std::vector<Tensor> ref = {d.out, d.dq, d.dk, d.dv};
  std::vector<double> naive_error;
  {
    const std::vector<Tensor> naive = run_once(Impl::naive, p, q, k, v, dout, seg, nullptr);
    for (size_t i = 0; i < naive.size(); ++i) {
      naive_error.push_back(relative_error_vs(naive[i].to(Device::cpu), ref[i]));
    }
  }
  poison_pool(48 * q.numel() + (int64_t{16} << 20));
  const std::vector<Tensor> got = run_once(Impl::flash, p, q, k, v, dout, seg, &job.config);
  cuda::synchronize();
  std::vector<TensorCheck> checks;
  for (size_t i = 0; i < got.size(); ++i) {
    checks.push_back(
        check_tensor(checked_tensor_names()[i], got[i].to(Device::cpu), ref[i], naive_error[i]));
  }
  return checks;
}

struct InputSet {
  Tensor q, k, v, dout;
};

// Enough sets that together they exceed 4x the L2 cache; one when a set alone does.
int input_set_count(const Problem& p, int max_sets) {
  int l2 = 0;
  FT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, cuda_current_device()));
  const int64_t q_bytes = p.batch * p.seq_len * p.q_heads * p.head_dim * 2;
  const int64_t set_bytes = 2 * q_bytes + 2 * q_bytes / p.group_size();
  const int64_t sets = (4 * int64_t{l2} + set_bytes - 1) / set_bytes;
  return static_cast<int>(std::clamp<int64_t>(sets, 1, std::max(1, max_sets)));
}

std::vector<InputSet> make_input_sets(const Problem& p, int count, uint64_t seed) {
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  const Shape kv_shape{p.batch, p.seq_len, p.kv_heads, p.head_dim};
  std::vector<InputSet> sets;
  for (int i = 0; i < count; ++i) {
    InputSet s{Tensor::empty(q_shape, DType::bf16, Device::cuda),
               Tensor::empty(kv_shape, DType::bf16, Device::cuda),
               Tensor::empty(kv_shape, DType::bf16, Device::cuda),
               Tensor::empty(q_shape, DType::bf16, Device::cuda)};
    const uint64_t base = seed + 4 * static_cast<uint64_t>(i + 1);
    gpu::fill_normal(s.q, base);
    gpu::fill_normal(s.k, base + 1);
    gpu::fill_normal(s.v, base + 2);
    gpu::fill_normal(s.dout, base + 3);
    sets.push_back(s);
  }
  return sets;
}

double host_ms_now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// call(0 .. warmup-1) untimed, then call(0 .. iters-1) each between two events. Before the timed
// calls a kernel keeps the GPU busy for longer than the host needs to queue them all, so the
// host's per-call work (checks, allocations) overlaps kernels instead of showing as idle time.
std::vector<double> time_calls(const std::function<void(int)>& call, int warmup, int iters) {
  double host_ms = 1.0;
  if (warmup > 0) {
    call(0);  // pays one-time costs: module load, shared-memory attributes
    cuda::synchronize();
    const double t0 = host_ms_now();
    for (int w = 1; w < warmup; ++w) call(w);
    if (warmup > 1) host_ms = (host_ms_now() - t0) / (warmup - 1);
    cuda::synchronize();
  }
  cuda::EventTimer timer(iters);
  gpu::busy_wait(std::min(1.25 * host_ms * iters + 0.2, 500.0));
  for (int i = 0; i < iters; ++i) {
    timer.start(i);
    call(i);
    timer.stop(i);
  }
  return timer.elapsed_ms();
}

struct Samples {  // [round][call]
  std::vector<std::vector<double>> fwd, bwd;
};

struct TimedProblem {
  Problem problem;
  Tensor seg;
  std::vector<InputSet> sets;
};

void time_config(const TimedProblem& t, const KernelConfig& config, const WorkerJob& job,
                 Samples& samples) {
  const Problem& p = t.problem;
  const int n = static_cast<int>(t.sets.size());
  samples.fwd.push_back(time_calls(
      [&](int i) {
        const InputSet& in = t.sets[i % n];
        (void)attention::forward(Impl::flash, p, in.q, in.k, in.v, t.seg, &config);
      },
      job.warmup, job.iters));
  std::vector<ForwardOutput> saved;
  for (const InputSet& in : t.sets) {
    saved.push_back(attention::forward(Impl::flash, p, in.q, in.k, in.v, t.seg, &config));
  }
  samples.bwd.push_back(time_calls(
      [&](int i) {
        const InputSet& in = t.sets[i % n];
        (void)attention::backward(Impl::flash, p, in.q, in.k, in.v, saved[i % n], in.dout, t.seg,
                                  &config);
      },
      job.warmup, job.iters));
}

double max_diff_vs_reference(const TimedProblem& t, const WorkerJob& job) {
  const InputSet& in = t.sets.front();
  const std::vector<Tensor> ref =
      run_once(Impl::flash, t.problem, in.q, in.k, in.v, in.dout, t.seg, &job.reference);
  const std::vector<Tensor> got =
      run_once(Impl::flash, t.problem, in.q, in.k, in.v, in.dout, t.seg, &job.config);
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, gpu::max_abs_diff(got[i], ref[i]));
  return worst;
}

void time_job(const WorkerJob& job, const SweepMask& mask, SweepRow& row) {
  TimedProblem t;
  t.problem = timed_problem(job.shape, mask);
  if (mask.documents > 0) {
    t.seg = document_ids(job.shape.batch, job.shape.seq_len, mask.documents).to(Device::cuda);
  }
  t.sets = make_input_sets(t.problem, input_set_count(t.problem, job.max_input_sets), job.seed);
  const bool paired = job.pair_with_reference && !job.is_reference;
  if (job.is_reference) row.max_abs_diff = 0.0;
  if (paired) row.max_abs_diff = max_diff_vs_reference(t, job);
  Samples mine, ref;
  for (int r = 0; r < job.rounds; ++r) {
    // Alternate the order, so that a drift (clocks, temperature) favours neither side.
    const bool ref_first = r % 2 == 0;
    if (paired && ref_first) time_config(t, job.reference, job, ref);
    time_config(t, job.config, job, mine);
    if (paired && !ref_first) time_config(t, job.reference, job, ref);
  }
  row.timing = {summarize_timing(mine.fwd), summarize_timing(mine.bwd)};
  if (job.is_reference) row.ref_timing = row.timing;
  if (paired) row.ref_timing = {summarize_timing(ref.fwd), summarize_timing(ref.bwd)};
  row.timed = true;
}

void inject_fault(const std::string& fault) {
  if (fault.empty()) return;
  if (fault == "abort") std::abort();
  if (fault == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (fault == "illegal-address") {
    gpu::illegal_address();
    cuda::synchronize();
  }
  throw Error(
      str("sweep worker: unknown fault '", fault, "' (allowed: abort, illegal-address, hang)"));
}

}  // namespace

void run_job(const WorkerJob& job, SweepRow& row,
             const std::function<void(const std::string&)>& progress) {
  cuda::init_device(job.device);
  cuda::allow_tf32(false);
  const SweepMask mask = find_mask(job.shape, job.mask_key);
  row.mask = mask.key;
  row.config = job.config;
  progress("checking");
  inject_fault(job.fault);
  row.checks = check_config(job, mask);
  row.status = RowStatus::checked;
  if (!row.passed() && !job.time_failing) return;
  progress(row.passed() ? "timing" : "timing (failed the check: --time-failing)");
  time_job(job, mask, row);
}

#else

void run_job(const WorkerJob& job, SweepRow& row, const std::function<void(const std::string&)>&) {
  row.mask = find_mask(job.shape, job.mask_key).key;
  row.config = job.config;
  throw Error("sweep worker: this flashtrain was built without CUDA");
}

#endif

int worker_main(const std::string& job_json) {
  SweepRow row;
  int code = 0;
  const auto progress = [](const std::string& what) {
    std::printf("%s%s\n", kProgressPrefix, what.c_str());
    std::fflush(stdout);
  };
  try {
    const WorkerJob job = job_from_json(json::parse(job_json));
    row.config = job.config;
    run_job(job, row, progress);
#ifdef FLASHTRAIN_WITH_CUDA
    cuda::synchronize();  // an asynchronous fault surfaces here, inside the try
#endif
  } catch (const std::exception& e) {
    row.status = RowStatus::error;
    row.reason = e.what();
    code = 3;
  }
  std::printf("%s%s\n", kResultPrefix, row_to_json(row).dump().c_str());
  std::fflush(stdout);
  return code;
}

}  // namespace ft::sweep
