// Building blocks of the Hopper (sm_90a) attention kernels, each a few lines of PTX with a name
// that says what it does: shared-memory addresses and fences, mbarriers, named barriers, register
// reallocation, the bulk tensor copy engine (TMA) in both directions, a pipeline stage's phase,
// and the warpgroup products (wgmma) with their shared-memory matrix descriptors.
//
// Our own PTX rather than CUTLASS/CuTe: the kernels already keep every tile in one layout (64-
// column panels with the 128-byte swizzle, which is exactly what TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B and what a wgmma descriptor with 128-byte swizzling reads), so each
// piece below is one instruction or two, and the kernels read as the algorithm. CuTe would bring
// its layout algebra (and some minutes of compile time per instantiation) to express the same
// few addresses.
//
// Everything here compiles for any target; the instructions are emitted only for sm_90a
// (FT_HOPPER_ENABLED), and the kernels that use them trap elsewhere (can_implement refuses
// other devices before any launch).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; tensor maps are encoded in tensor_map.cu)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FT_HOPPER_ENABLED 1
#endif

namespace ft::attention::cuda::hopper {

// ---- shared memory ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Tiles are stored as 64-column panels (128 bytes per row); inside a panel the 16-byte chunk c
// of row r sits at chunk c ^ (r % 8). Panels start at 1024-byte boundaries.
constexpr int kPanel = 64;
constexpr int kPanelRowBytes = 128;

// Element offset of (row, col) in a [ROWS][COLS] tile stored as swizzled panels.
template <int ROWS>
__device__ __forceinline__ int panel_offset(int row, int col) {
  return (col / kPanel) * ROWS * kPanel + row * kPanel + ((((col % kPanel) / 8) ^ (row % 8)) * 8) +
         col % 8;
}

// The dynamic shared memory rounded up to the 1024 bytes that swizzled panels need (kernels ask
// for 1024 bytes more than they use).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}

// Shared memory written by ordinary stores becomes visible to the async proxy (wgmma operand
// reads, TMA stores) only after this fence in the writing thread, and a barrier for the others.
__device__ __forceinline__ void fence_async_shared() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- mbarriers: a phase completes when `count` arrivals and the expected bytes are in ----

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
#endif
}
// Makes initialised barriers visible to the copy engine (then a __syncthreads for the threads).
__device__ __forceinline__ void mbar_fence_init() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr(bar))
      : "memory");
#endif
}
// One arrival that also announces `bytes` the copy engine will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
          smem_addr(bar)),
      "r"(bytes)
      : "memory");
#endif
}
// Announces `bytes` the copy engine will deliver to the current phase, without arriving (the
// thread arrives later, e.g. after its own stores into the same stage).
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 1;
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
      "p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t = 0;
#ifdef FT_HOPPER_ENABLED
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
#endif
  return t;
}
// Waits until the phase of parity `parity` has completed. Built with FT_HOPPER_WATCHDOG, a wait
// that lasts seconds (a broken pipeline: kernels run for milliseconds) traps instead of hanging;
// off by default, because a trap in the kernel caps the registers the consumers may use after
// setmaxnreg (ptxas then spills their accumulators).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef FT_HOPPER_WATCHDOG
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1; !mbar_try_wait(bar, parity); ++spins) {
    if (spins % 1024 == 0 && global_timer_ns() - start > 20000000000ull) __trap();
  }
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}

// ---- named barriers (id 0 is __syncthreads) ----

// Waits until `threads` threads (this one included) have synced or arrived at barrier `id`.
__device__ __forceinline__ void named_sync(int id, int threads) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
// The same, for a barrier whose participants wait at different instructions (`bar.sync` is
// `.aligned`: every thread of the block that uses the barrier must execute the same instruction).
__device__ __forceinline__ void named_sync_unaligned(int id, int threads) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
// Counts this thread towards barrier `id` without waiting.
__device__ __forceinline__ void named_arrive(int id, int threads) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Whether `pred` holds in any of the `threads` threads that meet at barrier `id` (every one of
// them passes its own and waits; each gets the OR): bar.red.or, aligned like bar.sync.
__device__ __forceinline__ bool named_any(int id, int threads, bool pred) {
  uint32_t any = 0;
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
#endif
  return any != 0;
}

// ---- registers: warpgroups hand registers to each other (every warp of the group runs it) ----

template <int REGS>
__device__ __forceinline__ void release_registers() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes 24..256, by 8");
#ifdef FT_HOPPER_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void claim_registers() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes 24..256, by 8");
#ifdef FT_HOPPER_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// ---- the bulk tensor copy engine (TMA), 4-d maps over [B, S, H, D] tensors ----
// Coordinates innermost first: (column, head, row, batch row). Rows past the sequence end are
// zero-filled on loads and dropped on stores.

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col,
                                         int head, int row, int batch) {
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(batch),
      "r"(smem_addr(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int col,
                                          int head, int row, int batch) {
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], "
      "[%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(col), "r"(head), "r"(row), "r"(batch)
      : "memory");
#endif
}
// Adds a shared-memory tile into the global tensor at these coordinates (fp32 add per element
// by the copy engine; rows past the end are dropped). Completes like a store (bulk group).
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap* map, const void* src, int col,
                                               int head, int row, int batch) {
#ifdef FT_HOPPER_ENABLED
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, "
      "%5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(col), "r"(head), "r"(row), "r"(batch)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_store_commit() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until the committed stores have read their shared memory (it may be rewritten).
__device__ __forceinline__ void tma_store_wait_read() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// Waits until the committed stores are complete.
__device__ __forceinline__ void tma_store_wait_all() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// Orders this thread's generic-proxy global accesses against its copy-engine ones (a flag
// written after a bulk reduction, a bulk reduction issued after a flag was read).
__device__ __forceinline__ void fence_async_global() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// ---- a pipeline stage: which slot of a ring, and the parity of its current phase ----

template <int STAGES>
struct RingPosition {
  int slot = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void advance() {
    if (++slot == STAGES) {
      slot = 0;
      parity ^= 1;
    }
  }
};
// The ring position after `n` advances from the start.
template <int STAGES>
__device__ __forceinline__ RingPosition<STAGES> ring_at(uint32_t n) {
  return {static_cast<int>(n % STAGES), (n / STAGES) & 1u};
}
// A producer's positions in two rings that advance together (K's of K_STAGES slots and V's of
// V_STAGES): one position where the rings are as deep, else a count of advances from which each
// ring's slot and parity follow (two positions kept side by side cost a 24-register producer a
// spill).
template <int K_STAGES, int V_STAGES>
struct PairedRings {
  uint32_t advances = 0;
  __device__ __forceinline__ RingPosition<K_STAGES> k() const {
    return ring_at<K_STAGES>(advances);
  }
  __device__ __forceinline__ RingPosition<V_STAGES> v() const {
    return ring_at<V_STAGES>(advances);
  }
  __device__ __forceinline__ void advance() { ++advances; }
};
template <int STAGES>
struct PairedRings<STAGES, STAGES> {
  RingPosition<STAGES> position;
  __device__ __forceinline__ RingPosition<STAGES> k() const { return position; }
  __device__ __forceinline__ RingPosition<STAGES> v() const { return position; }
  __device__ __forceinline__ void advance() { position.advance(); }
};

// Stores four 8x8 bf16 matrices from registers in one instruction: register i of lane t holds
// row t / 4, columns 2 (t % 4) + {0, 1} of matrix i (the mma fragment layout), and lane t gives
// the shared address of row t % 8 of matrix t / 8 (16 contiguous bytes, 16-byte aligned).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#ifdef FT_HOPPER_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

// ---- warpgroup products ----

// Matrix descriptor of a swizzled-panel operand at shared address `addr`: 1024 bytes between
// 8-row groups; `panel_bytes` between 64-column panels (read by MN-major operands wider than
// one panel).
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t panel_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(panel_bytes >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t{1} << 62);
}
// The same operand `bytes` further on (shared addresses stay below 256 KB: the 14-bit address
// field never carries).
__device__ __forceinline__ uint64_t advance(uint64_t d, uint32_t bytes) {
  return d + (bytes >> 4);
}

__device__ __forceinline__ void wg_fence() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed product groups of this warp are still running.
template <int N>
__device__ __forceinline__ void wg_wait() {
#ifdef FT_HOPPER_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator / operand registers across an
// issue or a wait (the products run asynchronously).
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int K, int N>
__device__ __forceinline__ void pin(uint32_t (&r)[K][N]) {
#pragma unroll
  for (int k = 0; k < K; ++k) pin(r[k]);
}

// clang-format off
#define FT_WG_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
  "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FT_WG_ACC16(d) FT_WG_ACC8(d, 0), FT_WG_ACC8(d, 8)
#define FT_WG_ACC32(d) FT_WG_ACC8(d, 0), FT_WG_ACC8(d, 8), FT_WG_ACC8(d, 16), FT_WG_ACC8(d, 24)
#define FT_WG_ACC40(d) FT_WG_ACC32(d), FT_WG_ACC8(d, 32)
#define FT_WG_ACC64(d) FT_WG_ACC32(d), FT_WG_ACC8(d, 32), FT_WG_ACC8(d, 40), FT_WG_ACC8(d, 48), \
  FT_WG_ACC8(d, 56)
#define FT_WG_ACC128(d) FT_WG_ACC64(d), FT_WG_ACC8(d, 64), FT_WG_ACC8(d, 72), FT_WG_ACC8(d, 80), \
  FT_WG_ACC8(d, 88), FT_WG_ACC8(d, 96), FT_WG_ACC8(d, 104), FT_WG_ACC8(d, 112), FT_WG_ACC8(d, 120)
#define FT_WG_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FT_WG_REGS32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FT_WG_REGS40 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39}"
#define FT_WG_REGS64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, " \
  "%54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FT_WG_REGS128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, " \
  "%54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, " \
  "%71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
// clang-format on

// d (64 x N, fp32; N / 2 registers a thread) = a b (+ d when accumulate): a 64x16 and b 16xN
// from shared memory. TA / TB: 0 when the operand is K-major (its 16 reduction columns are
// contiguous in a row), 1 when MN-major (its rows are the reduction).
template <int N, int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(N == 32 || N == 64 || N == 80 || N == 128 || N == 256,
                "N is 32, 64, 80, 128 or 256");
#ifdef FT_HOPPER_ENABLED
  if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " FT_WG_REGS16
        ", %16, %17, p, 1, 1, %19, %20;\n}\n"
        : FT_WG_ACC16(d)
        : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FT_WG_REGS32
        ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : FT_WG_ACC32(d)
        : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
  } else if constexpr (N == 80) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " FT_WG_REGS40
        ", %40, %41, p, 1, 1, %43, %44;\n}\n"
        : FT_WG_ACC40(d)
        : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FT_WG_REGS64
        ", %64, %65, p, 1, 1, %67, %68;\n}\n"
        : FT_WG_ACC64(d)
        : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FT_WG_REGS128
        ", %128, %129, p, 1, 1, %131, %132;\n}\n"
        : FT_WG_ACC128(d)
        : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
  }
#endif
}

// d (64 x N) = a b (+ d when accumulate): a 64x16 from registers (the mma.sync A fragment
// layout per warp), b from shared memory (TB as in mma_ss).
template <int N, int TB>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b,
                                       bool accumulate = true) {
  static_assert(N == 64 || N == 128 || N == 256, "N is 64, 128 or 256");
#ifdef FT_HOPPER_ENABLED
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FT_WG_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : FT_WG_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int{accumulate}), "n"(TB));
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FT_WG_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : FT_WG_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int{accumulate}), "n"(TB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FT_WG_REGS128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        : FT_WG_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int{accumulate}), "n"(TB));
  }
#endif
}

#undef FT_WG_ACC8
#undef FT_WG_ACC16
#undef FT_WG_ACC32
#undef FT_WG_ACC40
#undef FT_WG_ACC64
#undef FT_WG_ACC128
#undef FT_WG_REGS16
#undef FT_WG_REGS32
#undef FT_WG_REGS40
#undef FT_WG_REGS64
#undef FT_WG_REGS128

// Two floats as bf16x2, the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Columns 16k..16k+15 of an accumulator (its n8 tiles 2k and 2k + 1) as a register A operand.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[N], int k) {
  a[0] = pack_bf16(acc[8 * k + 0], acc[8 * k + 1]);
  a[1] = pack_bf16(acc[8 * k + 2], acc[8 * k + 3]);
  a[2] = pack_bf16(acc[8 * k + 4], acc[8 * k + 5]);
  a[3] = pack_bf16(acc[8 * k + 6], acc[8 * k + 7]);
}

}  // namespace ft::attention::cuda::hopper
