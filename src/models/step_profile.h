// The step profile: where the time of one training step goes, by op family. The transformer
// (forward, backward) and the trainer (data, optimizer, communication) mark their calls with
// ProfileRegion; a StepProfile attached to them times the regions of the step it records and
// emits NVTX ranges of the same names on every step, for Nsight. The family list lives here,
// in the lowest layer that records regions, so that the model, the trainer, the printed table
// (train/profile_report.h) and bench/torch_peer.py's rows share one list and one order.
//
// Cost: a model or trainer without a StepProfile (the default) does one null check per region.
// While a step is recorded, a region costs two marks (CUDA events on the current stream, or
// steady_clock readings on the CPU) and nothing waits for the device until result().
//
// Regions do not nest: one is open at a time, so their times add up to at most the step's.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/mark_timer.h"

namespace ft::models {

// The rows of the table, in its order.
enum class OpFamily : int {
  data,                // the batch read, its document ids, and their copy to the device
  zero_grad,           // gradients set to zero before the first micro-batch
  embedding,           // token (+ position) embedding, forward and backward
  norm,                // LayerNorm / RMSNorm (fused with the residual add), forward and backward
  gemm_qkv,            // the fused q, k, v projection
  qkv_copy,            // q, k, v split out of the projection, and dq, dk, dv merged back
  rope,                // rotary embedding of q and k, forward and backward
  attention_forward,   // naive or flash
  attention_backward,  //
  gemm_attn_out,       // the attention's output projection
  gemm_mlp_up,         // GPT-2's fc (with its GELU epilogue on the GPU); LLaMA's up and gate
  activation,          // GELU backward (and forward when not fused), SwiGLU
  gemm_mlp_down,       // the MLP's output projection
  gemm_classifier,     // logits = norm_f(x) @ head^T, and its backward
  classifier_loss,     // softmax + cross-entropy (+ dlogits), the loss read back to the host
  recompute,           // forward ops re-run in backward (Transformer::set_recompute), all kinds
  all_reduce,          // gradient communication (ZeRO-1: reduce-scatter, weights' all-gather)
  optimizer,           // gradient norm, clipping and AdamW
};
inline constexpr int kOpFamilyCount = static_cast<int>(OpFamily::optimizer) + 1;

// What a region's work counts, and so which floor its time is held against.
enum class WorkKind {
  flop,      // floating-point operations: the matrix rate
  bytes,     // bytes moved in device memory: the memory bandwidth
  transfer,  // bytes sent between host and device or between ranks: no floor
};

struct OpFamilyInfo {
  const char* name;  // the row's name, as printed (and as bench/torch_peer.py prints it)
  WorkKind work;
};
const OpFamilyInfo& op_family_info(OpFamily family);
// Every family, in table order.
const std::array<OpFamily, kOpFamilyCount>& op_families();

class StepProfile {
 public:
  explicit StepProfile(Device device);

  // Bound a training step (an NVTX range "step N"); with record, its regions are timed from
  // here to end_step(), whose marks also bound the step's time.
  void begin_step(int64_t step, bool record);
  void end_step();
  bool recording() const { return recording_; }

  // Used through ProfileRegion: opens a region of `family` (closing `owner`'s open one first),
  // work in the family's unit (FLOP or bytes); closes the open region.
  void enter(OpFamily family, double work, const void* owner);
  void leave() noexcept;
  // Work that is costly to count (attention's attended pairs with document masks) is counted
  // after the step, outside its time: `count` runs in result().
  void add_work_later(OpFamily family, std::function<double()> count);
  // While set, regions entered and work added go to `family` instead of their own (nullopt:
  // off). Work of another kind than the target's is dropped, since a row has one unit: for the
  // recompute row (FLOPs) the byte counts of its norms and copies, so that its floor is the
  // products' alone, still a lower bound. Used through ProfileRedirect.
  void redirect(std::optional<OpFamily> family) { redirect_ = family; }
  std::optional<OpFamily> redirected() const { return redirect_; }

  struct Row {
    OpFamily family;
    int64_t calls = 0;
    double ms = 0.0;
    double work = 0.0;  // FLOP or bytes (WorkKind of the family)
  };
  struct Result {
    int64_t step = 0;
    double step_ms = 0.0;   // between begin_step() and end_step()
    std::vector<Row> rows;  // the families that ran, in table order
  };
  // The recorded step (waits for the device). Throws if no step was recorded.
  Result result();

 private:
  std::pair<OpFamily, double> target(OpFamily family, double work) const;

  struct Region {
    OpFamily family;
    size_t begin, end;  // marks
  };

  MarkTimer timer_;
  bool in_step_ = false, recording_ = false, recorded_ = false;
  bool failed_ = false;  // a mark failed in leave(), which cannot throw
  int64_t step_ = 0;
  size_t step_end_ = 0;  // the step's first mark is mark 0
  std::vector<Region> regions_;
  const void* owner_ = nullptr;  // the ProfileRegion whose region is open
  bool open_ = false;            // a region is open (its NVTX range too)
  OpFamily open_family_ = OpFamily::data;
  std::optional<OpFamily> redirect_;
  std::array<double, kOpFamilyCount> work_{};
  std::vector<std::pair<OpFamily, std::function<double()>>> later_;
};

// A region on a StepProfile (nullptr: nothing at all). enter() moves on to the next region, so
// consecutive ops read as one line each:
//
//   ProfileRegion region(profile_, OpFamily::gemm_qkv, flops);
//   nn::linear_forward(...);
//   region.enter(OpFamily::qkv_copy, bytes);
//   nn::split_qkv(...);
//
// The open region closes at leave() or when the object goes out of scope.
class ProfileRegion {
 public:
  explicit ProfileRegion(StepProfile* profile) : profile_(profile) {}
  ProfileRegion(StepProfile* profile, OpFamily family, double work = 0.0) : profile_(profile) {
    enter(family, work);
  }
  ~ProfileRegion() { leave(); }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

  void enter(OpFamily family, double work = 0.0) {
    if (profile_ == nullptr) return;
    profile_->enter(family, work, this);
    open_ = true;
  }
  void leave() noexcept {
    if (!open_) return;
    profile_->leave();
    open_ = false;
  }
  // Whether the step's work is being recorded (to skip counting work that nobody reads).
  bool recording() const { return profile_ != nullptr && profile_->recording(); }

 private:
  StepProfile* profile_;
  bool open_ = false;
};

// Every region on `profile` (nullptr: nothing) counts as `family` while this object lives;
// the previous redirection comes back after.
class ProfileRedirect {
 public:
  ProfileRedirect(StepProfile* profile, OpFamily family) : profile_(profile) {
    if (profile_ == nullptr) return;
    previous_ = profile_->redirected();
    profile_->redirect(family);
  }
  ~ProfileRedirect() {
    if (profile_ != nullptr) profile_->redirect(previous_);
  }
  ProfileRedirect(const ProfileRedirect&) = delete;
  ProfileRedirect& operator=(const ProfileRedirect&) = delete;

 private:
  StepProfile* profile_;
  std::optional<OpFamily> previous_;
};

}  // namespace ft::models
