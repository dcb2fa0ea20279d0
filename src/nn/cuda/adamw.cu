// AdamW and the global gradient norm on the GPU.
//
// adamw_update: one thread per 16-byte pack of fp32 master/grad/m/v, the CPU's operations in the
// CPU's order (PyTorch's order, see src/nn/adamw.cpp) with the scalars the CPU forms. The
// _rn intrinsics keep nvcc from contracting a multiply and an add into an FMA, so each step
// rounds as the CPU's does. Traffic: 4 fp32 reads and 3 fp32 writes per parameter.
// adamw_update_all, multi-tensor: one launch for every parameter tensor. The host uploads one
// table (per tensor: pointers, size, its decay factor, whether 16-byte packs apply, the compute
// copy) followed by a list of chunks (tensor, first element) of kAdamChunk elements; block b
// updates chunk b with the same per-element operations (adamw_step) and writes the compute copy
// (bf16: the high half of the new weight split in two, ties away from zero, core/f32_halves.h;
// or fp32) of each new weight as it goes. Traffic per parameter: 4 fp32 reads, 3 fp32 writes and
// one compute-dtype write (2 bytes for bf16), against the per-tensor path's same update plus a
// separate conversion kernel (another 4-byte read and 2-byte write) and two launches per tensor
// (~150 tensors in GPT-2 124M: ~300 launches become 1). Bit-identical to adamw_update +
// nn::write_compute_copy for every finite value (a NaN weight stays NaN, possibly with another
// payload).
// A split master (a bf16 model's: the bf16 compute copy is its high half, an int16 its low half)
// is joined, updated and split again in registers: 2 + 2 bytes read and written where a whole
// one takes 4 + 4 and the copy's 2, so 32 bytes a parameter with the gradient (read twice, the
// norm's read included), m and v, against 34. The same bits as the whole master's path.
// global_grad_norm, deterministic two-stage reduction in fp64: stage 1 gives every chunk of
// kNormChunk elements of every tensor a block (16-byte packs when the tensor's pointer and size
// allow), which writes one partial sum of squares; stage 2 is one block adding all partials in
// a fixed order and tree, and takes the square root, so the norm stays on the device (AdamW's
// kernel can form the clipping scale from it: no host wait mid-step). The partition depends only
// on the tensors' sizes, so the result never depends on timing. Traffic: each gradient read once.
// (Before: 64 blocks per tensor with 4-byte loads, so the largest tensors, the embeddings, had a
// few SMs to themselves.)
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cuda/graph.h"
#include "core/f32_halves.h"
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kAdamThreads = 256;
constexpr int kNormThreads = 256;
constexpr int64_t kNormChunk = 65536;  // elements per block of the sum of squares
constexpr int kFinishThreads = 1024;

// One element of AdamW, PyTorch's order; every operation rounds (no FMA contraction).
__device__ __forceinline__ void adamw_step(float& p, float grad, float& m, float& v,
                                           const AdamWScalars& s, float decay_mul) {
  const float g = __fmul_rn(grad, s.grad_scale);
  m = __fadd_rn(m, __fmul_rn(s.one_minus_b1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(v, s.b2), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fmul_rn(p, decay_mul);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
}

template <int W>
__global__ void adamw_kernel(float* p, const float* grad, float* m, float* v, int64_t n_packs,
                             AdamWScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_packs;
       i += stride) {
    const Pack<float, W> gp = load_pack<float, W>(grad + i * W);
    Pack<float, W> pp = load_pack<float, W>(p + i * W);
    Pack<float, W> mp = load_pack<float, W>(m + i * W);
    Pack<float, W> vp = load_pack<float, W>(v + i * W);
#pragma unroll
    for (int k = 0; k < W; ++k) adamw_step(pp.v[k], gp.v[k], mp.v[k], vp.v[k], s, s.decay_mul);
    store_pack<float, W>(p + i * W, pp);
    store_pack<float, W>(m + i * W, mp);
    store_pack<float, W>(v + i * W, vp);
  }
}

constexpr int64_t kAdamChunk = 32768;  // elements per block; a multiple of every pack width

// kSplit: p is null, the master is compute (bf16 bits, its high half) and lo (its low half).
enum ComputeCopy : int32_t { kNoCopy = 0, kCopyF32 = 1, kCopyBf16 = 2, kSplit = 3 };

struct AdamSlot {
  float* p;
  const float* g;
  float* m;
  float* v;
  void* compute;
  int16_t* lo;
  int64_t n;
  int32_t decay;   // weight decay applies (the step's factor is read at run time)
  int32_t copy;    // ComputeCopy
  int32_t packed;  // every pointer 16-byte aligned and n a multiple of 4
  int32_t unused;
};

// Block b of a multi-tensor launch works on chunk b: elements [begin, begin + chunk size) of
// tensor `slot` (AdamW's and the gradient norm's).
struct AdamChunk {
  int64_t slot, begin;
};

// A per-tensor table and its chunk list on the device, uploaded in one copy (slots first).
template <class Slot>
struct DeviceTable {
  Tensor buf;  // raw bytes, counted in int32s
  const Slot* slots;
  const AdamChunk* chunks;
};

// The chunks of `chunk` elements of every slot (a slot has its element count in `n`), checked to
// fit one launch, and the slots and the chunk list uploaded together; n_chunks: how many.
template <class Slot>
DeviceTable<Slot> upload_table(const std::vector<Slot>& slots, int64_t chunk, const char* fn,
                               int64_t& n_chunks) {
  std::vector<AdamChunk> chunks;
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int64_t begin = 0; begin < slots[i].n; begin += chunk) {
      chunks.push_back({static_cast<int64_t>(i), begin});
    }
  }
  FT_CHECK(chunks.size() < (size_t{1} << 31), fn, ": ", chunks.size(), " chunks exceed one launch");
  static_assert(sizeof(Slot) % 8 == 0 && sizeof(AdamChunk) % 8 == 0);  // both 8-byte aligned
  const size_t slot_bytes = slots.size() * sizeof(Slot);
  const size_t chunk_bytes = chunks.size() * sizeof(AdamChunk);
  std::vector<char> table(slot_bytes + chunk_bytes);
  std::memcpy(table.data(), slots.data(), slot_bytes);
  std::memcpy(table.data() + slot_bytes, chunks.data(), chunk_bytes);
  DeviceTable<Slot> t;
  t.buf = Tensor::empty({static_cast<int64_t>(table.size() / 4)}, DType::i32, Device::cuda);
  // A constant of the launch (pointers and sizes): a captured step keeps it (core/cuda/graph.h).
  ft::cuda::upload_constant(t.buf.raw(), table.data(), table.size());
  t.slots = static_cast<const Slot*>(t.buf.raw());
  t.chunks = reinterpret_cast<const AdamChunk*>(static_cast<const char*>(t.buf.raw()) + slot_bytes);
  n_chunks = static_cast<int64_t>(chunks.size());
  return t;
}

template <int W>
__device__ __forceinline__ void adamw_span(const AdamSlot& t, int64_t i, const AdamWScalars& s,
                                           float decay_mul) {
  uint16_t* hi = static_cast<uint16_t*>(t.compute);
  Pack<float, W> pp;
  if (t.copy == kSplit) {
    const Pack<uint16_t, W> hp = load_pack<uint16_t, W>(hi + i);
    const Pack<int16_t, W> lp = load_pack<int16_t, W>(t.lo + i);
#pragma unroll
    for (int k = 0; k < W; ++k) pp.v[k] = __uint_as_float(join_f32_bits(hp.v[k], lp.v[k]));
  } else {
    pp = load_pack<float, W>(t.p + i);
  }
  Pack<float, W> mp = load_pack<float, W>(t.m + i);
  Pack<float, W> vp = load_pack<float, W>(t.v + i);
  const Pack<float, W> gp = load_pack<float, W>(t.g + i);
#pragma unroll
  for (int k = 0; k < W; ++k) adamw_step(pp.v[k], gp.v[k], mp.v[k], vp.v[k], s, decay_mul);
  if (t.copy != kSplit) store_pack<float, W>(t.p + i, pp);
  store_pack<float, W>(t.m + i, mp);
  store_pack<float, W>(t.v + i, vp);
  if (t.copy == kSplit || t.copy == kCopyBf16) {
    Pack<uint16_t, W> hp;
    Pack<int16_t, W> lp;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const F32Halves h = split_f32_bits(__float_as_uint(pp.v[k]));
      hp.v[k] = h.hi;
      lp.v[k] = h.lo;
    }
    store_pack<uint16_t, W>(hi + i, hp);
    if (t.copy == kSplit) store_pack<int16_t, W>(t.lo + i, lp);
  } else if (t.copy == kCopyF32) {
    store_pack<float, W>(static_cast<float*>(t.compute) + i, pp);
  }
}

// The gradient scale of clipping formed from a norm on the device, with the host's operations
// (nn::clip_scale, then the fp64 -> fp32 rounding of the host's scalars); norm null: the host's.
__device__ __forceinline__ float device_clip_scale(const double* norm, double max_norm,
                                                   float host_scale) {
  if (norm == nullptr) return host_scale;
  const double n = *norm;
  return max_norm > 0.0 && n > max_norm ? __double2float_rn(__ddiv_rn(max_norm, n)) : 1.0f;
}

// The step's values from the device copy of nn::write_adamw_step_values' tensor (lr, step,
// decay factor, step size, bias correction), rounded to fp32 as the host rounds them; null: the
// host's, in s.
__device__ __forceinline__ void read_step_values(AdamWScalars& s, const double* values) {
  if (values == nullptr) return;
  s.decay_mul = __double2float_rn(values[2]);
  s.neg_step_size = __double2float_rn(values[3]);
  s.bc2_sqrt = __double2float_rn(values[4]);
}

// Block b: chunk b of the list; threads stride the chunk in packs (or elements).
__global__ void adamw_all_kernel(const AdamSlot* slots, const AdamChunk* chunks, AdamWScalars s,
                                 float no_decay_mul, const double* norm, double max_norm,
                                 const double* step_values) {
  s.grad_scale = device_clip_scale(norm, max_norm, s.grad_scale);
  read_step_values(s, step_values);
  const AdamChunk c = chunks[blockIdx.x];
  const AdamSlot t = slots[c.slot];
  const float decay_mul = t.decay ? s.decay_mul : no_decay_mul;
  const int64_t end = c.begin + kAdamChunk < t.n ? c.begin + kAdamChunk : t.n;
  constexpr int W = kPackWidth<float>;
  if (t.packed) {
    for (int64_t i = c.begin + static_cast<int64_t>(threadIdx.x) * W; i < end;
         i += static_cast<int64_t>(blockDim.x) * W) {
      adamw_span<W>(t, i, s, decay_mul);
    }
  } else {
    for (int64_t i = c.begin + threadIdx.x; i < end; i += blockDim.x) {
      adamw_span<1>(t, i, s, decay_mul);
    }
  }
}

struct GradSlot {
  const void* data;
  int64_t n;
  int32_t is_bf16;
  int32_t packed;  // 16-byte aligned and n a whole number of packs
};

template <class T>
__device__ __forceinline__ double squares(const T* x, int64_t begin, int64_t end, bool packed) {
  double s = 0.0;
  constexpr int W = kPackWidth<T>;
  if (packed) {
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * W; i < end;
         i += static_cast<int64_t>(blockDim.x) * W) {
      const Pack<T, W> p = load_pack<T, W>(x + i);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const double g = to_f32(p.v[k]);
        s += g * g;
      }
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double g = to_f32(x[i]);
      s += g * g;
    }
  }
  return s;
}

// Block b: partial[b] = sum of squares of chunk b of the list.
__global__ void sum_squares_kernel(double* partial, const GradSlot* slots,
                                   const AdamChunk* chunks) {
  const AdamChunk c = chunks[blockIdx.x];
  const GradSlot slot = slots[c.slot];
  const int64_t end = c.begin + kNormChunk < slot.n ? c.begin + kNormChunk : slot.n;
  double s = slot.is_bf16
                 ? squares(static_cast<const bf16_t*>(slot.data), c.begin, end, slot.packed != 0)
                 : squares(static_cast<const float*>(slot.data), c.begin, end, slot.packed != 0);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *norm = the square root of the sum of the partials (fp64, correctly rounded).
__global__ void sum_partials_kernel(double* norm, const double* partial, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *norm = __dsqrt_rn(s);
}

}  // namespace

void adamw_update(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, const AdamWScalars& s) {
  const int64_t n = master.numel();
  if (n == 0) return;
  FT_CHECK(master.dtype() == DType::f32, "adamw_update: master is ", dtype_name(master.dtype()),
           ", expected fp32 on CUDA (fp64 is for CPU tests)");
  float *p = ptr<float>(master), *mp = ptr<float>(m), *vp = ptr<float>(v);
  const float* g = ptr<float>(grad);
  if (can_use_packs<float>(n, {p, g, mp, vp})) {
    constexpr int W = kPackWidth<float>;
    adamw_kernel<W>
        <<<grid_for(n / W, kAdamThreads), kAdamThreads, 0, stream()>>>(p, g, mp, vp, n / W, s);
  } else {
    adamw_kernel<1><<<grid_for(n, kAdamThreads), kAdamThreads, 0, stream()>>>(p, g, mp, vp, n, s);
  }
  FT_CUDA_CHECK_LAUNCH();
}

void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul) {
  adamw_update_all(tensors, s, no_decay_mul, nullptr, 0.0, nullptr);
}

void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul, const double* norm, double max_norm) {
  adamw_update_all(tensors, s, no_decay_mul, norm, max_norm, nullptr);
}

void adamw_update_all(const std::vector<AdamWTensor>& tensors, const AdamWScalars& s,
                      float no_decay_mul, const double* norm, double max_norm,
                      const double* step_values) {
  std::vector<AdamSlot> slots;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    const bool split = t.master_lo.defined();  // halves checked by nn::adamw_update_all
    FT_CHECK(split || t.master.dtype() == DType::f32, "adamw_update_all: master of tensor ", i,
             " is ", dtype_name(t.master.dtype()),
             ", expected fp32 on CUDA (fp64 is for CPU tests)");
    const int64_t n = t.grad.numel();
    if (n == 0) continue;
    AdamSlot slot{};
    slot.p = split ? nullptr : static_cast<float*>(t.master.raw());
    slot.g = static_cast<const float*>(t.grad.raw());
    slot.m = static_cast<float*>(t.m.raw());
    slot.v = static_cast<float*>(t.v.raw());
    slot.n = n;
    slot.decay = t.decay ? 1 : 0;
    if (split) {
      slot.compute = t.compute.raw();
      slot.lo = static_cast<int16_t*>(t.master_lo.raw());
      slot.copy = kSplit;
    } else if (t.compute.defined() && t.compute.raw() != t.master.raw()) {
      FT_CHECK(t.compute.dtype() == DType::bf16 || t.compute.dtype() == DType::f32,
               "adamw_update_all: compute copy of tensor ", i, " is ",
               dtype_name(t.compute.dtype()), ", expected bf16 or fp32 on CUDA");
      slot.compute = t.compute.raw();
      slot.copy = t.compute.dtype() == DType::bf16 ? kCopyBf16 : kCopyF32;
    }
    // A pack of 4 fp32 is one of 4 bf16 (or int16) halves: 8 bytes, 16-byte aligned pointers
    // keep it aligned too.
    slot.packed = can_use_packs<float>(n, {slot.p, slot.g, slot.m, slot.v, slot.compute, slot.lo});
    slots.push_back(slot);
  }
  if (slots.empty()) return;
  int64_t n_chunks = 0;
  const DeviceTable<AdamSlot> t = upload_table(slots, kAdamChunk, "adamw_update_all", n_chunks);
  adamw_all_kernel<<<static_cast<unsigned>(n_chunks), kAdamThreads, 0, stream()>>>(
      t.slots, t.chunks, s, no_decay_mul, norm, max_norm, step_values);
  FT_CUDA_CHECK_LAUNCH();
}

Tensor global_grad_norm_tensor(const std::vector<Tensor>& grads) {
  std::vector<GradSlot> slots;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    FT_CHECK(g.dtype() == DType::f32 || g.dtype() == DType::bf16, "global_grad_norm: gradient ", i,
             " is ", dtype_name(g.dtype()), ", expected fp32 or bf16 on CUDA");
    if (g.numel() == 0) continue;
    const bool bf16 = g.dtype() == DType::bf16;
    const bool packed = bf16 ? can_use_packs<bf16_t>(g.numel(), {g.raw()})
                             : can_use_packs<float>(g.numel(), {g.raw()});
    slots.push_back({g.raw(), g.numel(), bf16 ? 1 : 0, packed ? 1 : 0});
  }
  if (slots.empty()) return Tensor::zeros({1}, DType::f64, Device::cuda);
  int64_t n_chunks = 0;
  const DeviceTable<GradSlot> t = upload_table(slots, kNormChunk, "global_grad_norm", n_chunks);
  Tensor partial = Tensor::empty({n_chunks}, DType::f64, Device::cuda);
  Tensor norm = Tensor::empty({1}, DType::f64, Device::cuda);
  sum_squares_kernel<<<static_cast<unsigned>(n_chunks), kNormThreads, 0, stream()>>>(
      ptr<double>(partial), t.slots, t.chunks);
  FT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kFinishThreads, 0, stream()>>>(ptr<double>(norm), ptr<double>(partial),
                                                          n_chunks);
  FT_CUDA_CHECK_LAUNCH();
  return norm;
}

}  // namespace ft::nn::cuda
