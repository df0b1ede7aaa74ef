// Block-scaled FP8 GEMM for SM90 (H100/H200) with TMA multicast across a 2-CTA cluster.
//
// torch.ops.rtp_fp8_C.fp8_gemm_sm90(a, sa, b, sb, out, group_m, clusters, multicast) computes, in place,
//   out[M, N] (bf16) = sum over K blocks kb of (a[:, kb] @ b[:, kb]^T) * sa[:, kb] * sb[n / 128, kb]
// with a [M, K] and b [N, K] float8_e4m3fn (K-major), sa [M, ceil(K/128)] float32 column-major with
// a 16-byte aligned column stride ("col_tma"), sb [ceil(N/128), ceil(K/128)] float32 (any strides).
//
// Why a CUDA kernel: at M = 4096 the Gluon kernel (rtp_fp8/gemm/triton/sm90_ws.py, 128x256 tiles)
// moves a fifth more bytes from device memory and a quarter more L2 sectors than DeepGEMM, whose
// 2-CTA clusters load each B tile once for two row tiles (docs/perf.md, seventh session). Triton
// 3.6's Gluon has no multicast copy; PTX does.
//
// Numerics are the Gluon wide tile's, step for step: per 128-column half and K block, a fresh
// m64n128k32 wgmma chain (4 x k32, the first not accumulating), then acc = fma(part, sa * sb, acc)
// in FP32, bf16 rounded to nearest even at the end. So the outputs are bit-identical to the Triton
// and Gluon kernels' (tests/gemm/test_cuda_sm90.py).
//
// Work split, per CTA (384 threads): warpgroup 2 is the producer (one thread issues TMA; warp 1 loads
// each tile's B-scale rows into one of two shared buffers, up to two tiles ahead), warpgroups 0 and 1
// are consumers, each owning 64 rows of the 128x256 tile. A cluster is two CTAs on row tiles
// 2p and 2p + 1 of the same 256 columns: each CTA loads its own A tile [128, 128] and A-row scales,
// and one 128-row half of the shared B tile [256, 128], multicast into both CTAs' shared memory at
// the same offset, signalling both CTAs' `full` barrier. A slot is free again when both CTAs'
// consumers released it (`empty` counts 16 arrivals: 8 consumer warps x 2 CTAs), since the peer's
// producer writes into it too. Clusters walk pair tiles cid, cid + nclusters, ... in grouped order
// (group_m pairs of row tiles per group). multicast=false (for measurement) has each CTA load its
// whole B tile and its ring released by its own consumers alone (the same bits). The epilogue goes
// through shared memory (128-byte swizzled boxes of 64x64, written by stmatrix) and TMA stores,
// overlapping the producer's loads for the next tile.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rtp_fp8 {
namespace gemm90 {

constexpr int kBM = 128, kBN = 256, kBK = 128, kHalfN = 128, kStages = 3;
constexpr int kThreads = 384;
constexpr int kABytes = kBM * kBK;           // 16 KB
constexpr int kBBytes = kBN * kBK;           // 32 KB
constexpr int kBHalfBytes = kHalfN * kBK;    // 16 KB
constexpr int kSABytes = kBM * 4;            // 512 B
constexpr int kDBytes = kBM * kBN * 2;       // 64 KB: two consumers' 64x256 bf16 tiles
constexpr int kDWgBytes = kDBytes / 2;
constexpr int kDBoxBytes = 64 * 128;         // a 64-row x 64-column bf16 box, 128-byte swizzled
constexpr int kSmemMax = 232448;             // SM90's opt-in dynamic shared memory per block

// Offsets in the 1024-aligned dynamic shared memory.
constexpr int kOffA = 0;
constexpr int kOffB = kOffA + kStages * kABytes;
constexpr int kOffD = kOffB + kStages * kBBytes;
constexpr int kOffSA = kOffD + kDBytes;
constexpr int kOffSB = kOffSA + kStages * kSABytes;  // then 2 buffers x 2 halves x kb floats, then barriers

static_assert(2 * kBHalfBytes == kBBytes && 4 * kDBoxBytes == kDWgBytes, "tile split");
static_assert(kOffB % 1024 == 0 && kOffD % 1024 == 0 && kABytes % 1024 == 0 && kDBoxBytes % 1024 == 0,
              "128-byte swizzled tiles must start 1024-byte aligned");

__host__ __device__ constexpr int sb_bytes(int kb) { return ((2 * 2 * kb * 4) + 15) / 16 * 16; }
// B-scale buffer `buf` (0 or 1) of the two: [2 halves][kb] floats, written by the loader warp.
__host__ __device__ constexpr uint32_t sb_buffer(uint32_t base, int kb, int buf) {
  return base + kOffSB + buf * 2 * kb * 4;
}
__host__ constexpr int smem_bytes(int kb) { return 1024 + kOffSB + sb_bytes(kb) + (2 * kStages + 4) * 8; }

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RTP_SM90A 1
#endif

#ifdef RTP_SM90A
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Wait for the phase with this parity to complete (CTA scope, as CUTLASS's cluster pipelines wait:
// the TMA's complete_tx makes its bytes visible, and a slot's reuse is ordered by the peer's arrival).
// The suspend-time hint (10 ms, CUTLASS's) lets the thread sleep until the phase completes instead of
// returning after the system's default limit and spinning.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "r"(10000000u)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// The address of this CTA's shared offset `addr` in cluster CTA `cta`'s shared memory.
__device__ __forceinline__ uint32_t cluster_addr(uint32_t addr, uint32_t cta) {
  uint32_t out;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(cta));
  return out;
}

// Arrive on a barrier by its cluster address (cluster_addr).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t remote) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void tma_load(const CUtensorMap* map, uint32_t dst, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same box into every CTA of the cluster in `mask`, at offset dst, completing bytes on each
// one's barrier at offset bar.
__device__ __forceinline__ void tma_load_multicast(const CUtensorMap* map, uint32_t dst, uint32_t bar, int c0, int c1,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}

// True in one lane of the warp (elect.sync; the warp must be converged). A producer branch taken by
// `tid == 0` left ptxas unsure that one thread ran it, so each TMA issue sat in an ELECT loop with its
// operands moved to uniform registers one by one; under elect_one the loop is gone (SASS, nvcc 13.0).
// The narrow kernel's producer uses it. The cluster kernel's keeps `tid == 0`: with elect_one there,
// one H100 run put its large dense shapes 2-4 % lower (DeepGEMM steady), not told apart from noise.
__device__ __forceinline__ bool elect_one() {
  uint32_t pred;
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 r;\nelect.sync r|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(pred));
  return pred != 0;
}

__device__ __forceinline__ void named_sync(uint32_t id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

__device__ __forceinline__ float lds_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void sts_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// Four 8x8 bf16 matrices to shared memory: lane l gives the address of row l % 8 of matrix l / 8,
// register q holds this lane's two columns of matrix q (the wgmma accumulator fragment's layout).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void prefetch_tensormaps(const CUtensorMap* a, const CUtensorMap* b, const CUtensorMap* sa) {
  for (const CUtensorMap* map : {a, b, sa})
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The producer's last step: every slot of its ring (the next to fill at s, phase) released once more,
// by both CTAs' consumers when multicasting, so that the peer's last arrivals on this CTA's barriers
// have landed before it exits.
__device__ __forceinline__ void drain_ring(uint32_t empty0, int stages, int s, uint32_t phase) {
  for (int i = 0; i < stages; ++i) {
    mbar_wait(empty0 + 8 * s, phase ^ 1);
    if (++s == stages) s = 0, phase ^= 1;
  }
}

// Programmatic dependent launch (cudaLaunchAttributeProgrammaticStreamSerialization): the grid may
// start while the stream's kernel before it still runs. griddepcontrol.wait returns once that kernel has
// completed and its writes are visible (at once in a plain launch); launch_dependents lets the stream's
// next programmatic dependent launch once every CTA of this grid has issued it or exited.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// A K-major operand tile of 128-byte rows, 128-byte swizzled by TMA: 8-row core groups 1024 bytes
// apart. Advancing the start address by 32 bytes selects the next k32 slice. The descriptor's low
// word holds addr / 16 (shared addresses stay below 2^18) and the leading offset; its high word is
// the same for every tile (1024-byte stride, 128-byte swizzle). So the low word plus bytes / 16 is the
// low word of addr + bytes, and only the low word is carried.
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t smem_desc_lo(uint32_t addr) { return ((addr >> 4) & 0x3FFF) | (1u << 16); }

template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]));
}

#define RTP_F8(i)                                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])

// d (+)= A[64, 32] . B[R * 2, 32]^T: m64n(2R)k32, R FP32 accumulators per thread; accumulate 0
// overwrites d. The descriptors come as their low words (smem_desc_lo).
__device__ __forceinline__ void wgmma_k32(float (&d)[64], uint32_t da, uint32_t db, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %66, 0;\n"
      "mov.b64 da, {%64, %67};\nmov.b64 db, {%65, %67};\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "da, db, p, 1, 1;\n}\n"
      : RTP_F8(0), RTP_F8(8), RTP_F8(16), RTP_F8(24), RTP_F8(32), RTP_F8(40), RTP_F8(48), RTP_F8(56)
      : "r"(da), "r"(db), "r"(accumulate), "r"(kDescHi));
}

__device__ __forceinline__ void wgmma_k32(float (&d)[56], uint32_t da, uint32_t db, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %58, 0;\n"
      "mov.b64 da, {%56, %59};\nmov.b64 db, {%57, %59};\n"
      "wgmma.mma_async.sync.aligned.m64n112k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55}, "
      "da, db, p, 1, 1;\n}\n"
      : RTP_F8(0), RTP_F8(8), RTP_F8(16), RTP_F8(24), RTP_F8(32), RTP_F8(40), RTP_F8(48)
      : "r"(da), "r"(db), "r"(accumulate), "r"(kDescHi));
}

__device__ __forceinline__ void wgmma_k32(float (&d)[28], uint32_t da, uint32_t db, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %30, 0;\n"
      "mov.b64 da, {%28, %31};\nmov.b64 db, {%29, %31};\n"
      "wgmma.mma_async.sync.aligned.m64n56k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27}, "
      "da, db, p, 1, 1;\n}\n"
      : RTP_F8(0), RTP_F8(8), RTP_F8(16), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
      : "r"(da), "r"(db), "r"(accumulate), "r"(kDescHi));
}

__device__ __forceinline__ void wgmma_k32(float (&d)[32], uint32_t da, uint32_t db, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %34, 0;\n"
      "mov.b64 da, {%32, %35};\nmov.b64 db, {%33, %35};\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "da, db, p, 1, 1;\n}\n"
      : RTP_F8(0), RTP_F8(8), RTP_F8(16), RTP_F8(24)
      : "r"(da), "r"(db), "r"(accumulate), "r"(kDescHi));
}

__device__ __forceinline__ void wgmma_k32(float (&d)[16], uint32_t da, uint32_t db, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %18, 0;\n"
      "mov.b64 da, {%16, %19};\nmov.b64 db, {%17, %19};\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "da, db, p, 1, 1;\n}\n"
      : RTP_F8(0), RTP_F8(8)
      : "r"(da), "r"(db), "r"(accumulate), "r"(kDescHi));
}
#undef RTP_F8

// One K block's fresh m64n(2R) product of 64 A rows (descriptor da) with 2R B rows (db) over the
// block's 128 K, issued (mma_wait waits for it). The cluster kernel runs it per 128-column half (R 64).
template <int R>
__device__ __forceinline__ void mma_issue(float (&part)[R], uint32_t da, uint32_t db) {
  __syncwarp();
  fence_regs(part);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int k = 0; k < kBK / 32; ++k) wgmma_k32(part, da + 2 * k, db + 2 * k, k);
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int R>
__device__ __forceinline__ void mma_wait(float (&part)[R]) {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  fence_regs(part);
}

// Waits for all but the newest issued product: part (the one before it) is then complete.
template <int R>
__device__ __forceinline__ void mma_wait_prev(float (&part)[R]) {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
  fence_regs(part);
}

// acc += part * scale, row r0's accumulators (j = 0, 1) with s0, row r0 + 8's (j = 2, 3) with s1.
template <int R>
__device__ __forceinline__ void promote(float* acc, const float (&part)[R], float s0, float s1) {
#pragma unroll
  for (int i = 0; i < R; i += 4) {
    acc[i + 0] = __fmaf_rn(part[i + 0], s0, acc[i + 0]);
    acc[i + 1] = __fmaf_rn(part[i + 1], s0, acc[i + 1]);
    acc[i + 2] = __fmaf_rn(part[i + 2], s1, acc[i + 2]);
    acc[i + 3] = __fmaf_rn(part[i + 3], s1, acc[i + 3]);
  }
}

// promote() for a tile that straddles two 128-column B-scale blocks: column groups (8 columns, i / 4) from
// `split` on take the second block's scales (t0, t1). The boundary is a multiple of 8 columns (tiles
// start at multiples of 56 or 112), so no group straddles it.
template <int R>
__device__ __forceinline__ void promote_split(float* acc, const float (&part)[R], float s0, float s1, float t0,
                                              float t1, int split) {
#pragma unroll
  for (int i = 0; i < R; i += 4) {
    const bool hi = i / 4 >= split;
    const float u0 = hi ? t0 : s0, u1 = hi ? t1 : s1;
    acc[i + 0] = __fmaf_rn(part[i + 0], u0, acc[i + 0]);
    acc[i + 1] = __fmaf_rn(part[i + 1], u0, acc[i + 1]);
    acc[i + 2] = __fmaf_rn(part[i + 2], u1, acc[i + 2]);
    acc[i + 3] = __fmaf_rn(part[i + 3], u1, acc[i + 3]);
  }
}

// Pair tile t of a cluster -> (row tile of pair, column tile), grouped group_m pairs at a time.
__device__ __forceinline__ void pair_coords(int t, int pairs_m, int tiles_n, int group_m, int& pm, int& tn) {
  const int width = group_m * tiles_n;
  const int first = (t / width) * group_m;
  const int size = min(pairs_m - first, group_m);
  const int r = t % width;
  pm = first + r % size;
  tn = r / size;
}
#endif  // RTP_SM90A

struct Params {
  const float* sb;
  int64_t sb_stride_e, sb_stride_n, sb_stride_k;
  int m, n, kb, tiles_m, tiles_n, pairs_m, group_m, sb_rows;
  const int* ids;  // grouped: the row ids (-1 padding), experts of them valid
  int* counters;   // grouped: [-1 rows, rows of another or an invalid id], added to
  int experts;
  int multicast;  // 0: each CTA loads its whole B tile and its ring is its own (for measurement)
};

#ifdef RTP_SM90A
// Grouped: the expert of row tile tm (its first row's id), -1 where it has none (padding, an
// invalid id, or a tile past M). Dense: 0.
template <bool kGrouped>
__device__ __forceinline__ int tile_expert(const Params& p, int tm) {
  if constexpr (!kGrouped) return 0;
  if (tm >= p.tiles_m) return -1;
  const int e = p.ids[static_cast<int64_t>(tm) * kBM];
  return e >= 0 && e < p.experts ? e : -1;
}
#endif

// kGrouped: m-grouped contiguous (b [E, N, K] as [E * N, K], 128-row tiles of one expert each):
// a pair of row tiles neither of which has an expert runs no K block and stores zeros; a tile without
// an expert beside one with runs on expert 0's weights and stores zeros; rows whose id is not the
// tile's expert are stored as zeros and counted, at the first column tile (as the Triton kernels
// do). B is multicast only where both row tiles of the pair have the same expert; else each CTA
// loads both halves of its own.
template <bool kGrouped>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_sa, const __grid_constant__ CUtensorMap map_d,
                         const Params p) {
#ifdef RTP_SM90A
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t full0 = base + kOffSB + sb_bytes(p.kb);
  const uint32_t empty0 = full0 + kStages * 8;
  const uint32_t sb_full0 = empty0 + kStages * 8, sb_empty0 = sb_full0 + 2 * 8;

  uint32_t rank, cid, ncl;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  asm("mov.u32 %0, %%nclusterid.x;" : "=r"(ncl));

  // The warpgroup index from lane 0, so that the compiler knows it is warp-uniform (descriptors
  // derived from it then stay in uniform registers).
  const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, p.multicast ? 16 : 8);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(sb_full0 + 8 * b, 32);  // the loader warp's lanes
      mbar_init(sb_empty0 + 8 * b, 8);  // the consumer warps
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();  // both CTAs' barriers exist before either multicasts into them

  const int pairs = p.pairs_m * p.tiles_n;
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      prefetch_tensormaps(&map_a, &map_b, &map_sa);
      int s = 0;
      uint32_t phase = 0;
      for (int t = cid; t < pairs; t += ncl) {
        int pm, tn;
        pair_coords(t, p.pairs_m, p.tiles_n, p.group_m, pm, tn);
        const int row0 = (2 * pm + rank) * kBM, col0 = tn * kBN;
        const int te0 = tile_expert<kGrouped>(p, 2 * pm), te1 = tile_expert<kGrouped>(p, 2 * pm + 1);
        if (te0 < 0 && te1 < 0) continue;  // an idle pair: no K block loaded (its consumers skip it alike)
        const int e0 = max(te0, 0), e1 = max(te1, 0);
        const bool multicast = p.multicast && e0 == e1;
        const int brow = (rank ? e1 : e0) * p.n + col0;  // B's first row in [E * N, K]
        for (int kb = 0; kb < p.kb; ++kb) {
          const uint32_t full = full0 + 8 * s;
          mbar_wait(empty0 + 8 * s, phase ^ 1);
          mbar_expect_tx(full, kABytes + kBBytes + kSABytes);
          tma_load(&map_a, base + kOffA + s * kABytes, full, kb * kBK, row0);
          tma_load(&map_sa, base + kOffSA + s * kSABytes, full, row0, kb);
          const uint32_t b_dst = base + kOffB + s * kBBytes;
          if (multicast) {
            tma_load_multicast(&map_b, b_dst + rank * kBHalfBytes, full, kb * kBK, brow + rank * kHalfN, 0x3);
          } else {
            tma_load(&map_b, b_dst, full, kb * kBK, brow);
            tma_load(&map_b, b_dst + kBHalfBytes, full, kb * kBK, brow + kHalfN);
          }
          if (++s == kStages) s = 0, phase ^= 1;
        }
      }
      drain_ring(empty0, kStages, s, phase);
    } else if (tid / 32 == 1) {
      // The B-scale loader: tile j's two B-scale rows (a half past N gets zero scales; its columns are
      // not stored) into buffer j % 2, up to two tiles ahead of the consumers, so that no consumer
      // waits on device memory between tiles.
      const int lane = tid % 32;
      int j = 0;
      for (int t = cid; t < pairs; t += ncl, ++j) {
        int pm, tn;
        pair_coords(t, p.pairs_m, p.tiles_n, p.group_m, pm, tn);
        const int expert = tile_expert<kGrouped>(p, 2 * pm + rank);
        const float* sbe = p.sb + static_cast<int64_t>(max(expert, 0)) * p.sb_stride_e;
        const int buf = j & 1;
        mbar_wait(sb_empty0 + 8 * buf, ((j >> 1) & 1) ^ 1);
        const uint32_t dst = sb_buffer(base, p.kb, buf);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 2 * tn + h;
          for (int kb = lane; kb < p.kb; kb += 32)
            sts_f32(dst + 4 * (h * p.kb + kb), row < p.sb_rows ? sbe[row * p.sb_stride_n + kb * p.sb_stride_k] : 0.0f);
        }
        mbar_arrive(sb_full0 + 8 * buf);  // releases this lane's stores
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int warp = tid / 32, lane = tid % 32;
    const int r0 = warp * 16 + lane / 4;
    const uint32_t dw = base + kOffD + wg * kDWgBytes;
    const uint32_t desc_a = smem_desc_lo(base + kOffA + wg * 64 * kBK), desc_b = smem_desc_lo(base + kOffB);

    // Who releases a slot: lanes 0 and 1 of each warp on both CTAs' `empty` barriers when
    // multicasting, else lane 0 on its own CTA's; by cluster address, without a branch.
    const bool releases = p.multicast ? lane < 2 : lane == 0;
    const uint32_t empty_c0 = cluster_addr(empty0, p.multicast ? lane % 2 : rank);

    float acc[128];
    float part[64];
    int s = 0, j = 0;
    uint32_t phase = 0;
    for (int t = cid; t < pairs; t += ncl, ++j) {
      int pm, tn;
      pair_coords(t, p.pairs_m, p.tiles_n, p.group_m, pm, tn);
      const int tm = 2 * pm + rank;
      const int expert = tile_expert<kGrouped>(p, tm);
      // Idle: neither row tile of the pair has an expert (grouped padding, as at the end of an MoE
      // executor's workspace). Its producer loads nothing and no K block runs: the tile stores zeros.
      const bool idle = expert < 0 && tile_expert<kGrouped>(p, 2 * pm + 1 - rank) < 0;
      const uint32_t sbt = sb_buffer(base, p.kb, j & 1);
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
      mbar_wait(sb_full0 + 8 * (j & 1), (j >> 1) & 1);
      // K block kb's scales are read one block ahead (while the previous block's second chain runs):
      // read in the block's own iteration, ptxas put their products among its first chain's wgmmas,
      // which then waited on shared memory (SASS, 2026-12-05).
      const uint32_t sa_lane = base + kOffSA + wg * 256 + 4 * r0;
      float sb0 = lds_f32(sbt), sb1 = lds_f32(sbt + 4 * p.kb);
      float sa0 = 0.0f, sa1 = 0.0f;
      if (!idle) {
        mbar_wait(full0 + 8 * s, phase);
        sa0 = lds_f32(sa_lane + s * kSABytes), sa1 = lds_f32(sa_lane + s * kSABytes + 32);
      }
      // The K loop unrolled by the ring's slots: in step(C<S>) the slot, the next slot and its phase
      // flip, the descriptors' slot offsets and the A-scale and barrier addresses are constants, and
      // the B-scale address is one running pointer (210 instructions per K block and consumer warp
      // with the slot a variable, 193-194 so; docs/perf.md, thirty-third session). A tile enters the
      // ring at the slot its first K block is in (the ring runs on across tiles). Per K block: the
      // first half's chain, waited for and promoted, then the second half's; while the second runs,
      // the next K block's scales and its slot, so that the next first chain issues right after this
      // block's promotion (as DeepGEMM's unrolled loop does).
      const int nkb = idle ? 0 : p.kb;
      int kb = 0;
      uint32_t sbp = sbt;  // K block kb's B-scale, first half; the second half's lies p.kb floats on
      const uint32_t sb_half = 4 * p.kb;
      auto step = [&](auto slot) {
        constexpr int S = decltype(slot)::value, S1 = S + 1 == kStages ? 0 : S + 1;
        const uint32_t da = desc_a + S * (kABytes >> 4), db = desc_b + S * (kBBytes >> 4);
        const float s00 = sa0 * sb0, s10 = sa1 * sb0, s01 = sa0 * sb1, s11 = sa1 * sb1;
        mma_issue(part, da, db);
        mma_wait(part);
        promote(acc, part, s00, s10);
        mma_issue(part, da, db + (kBHalfBytes >> 4));
        sbp += 4;
        if (++kb < nkb) {
          sb0 = lds_f32(sbp);
          sb1 = lds_f32(sbp + sb_half);
          mbar_wait(full0 + 8 * S1, S1 == 0 ? phase ^ 1 : phase);
          sa0 = lds_f32(sa_lane + S1 * kSABytes), sa1 = lds_f32(sa_lane + S1 * kSABytes + 32);
        }
        mma_wait(part);
        if (releases) mbar_arrive_cluster(empty_c0 + 8 * S);
        promote(acc + 64, part, s01, s11);
        if (S1 == 0) phase ^= 1;
      };
      static_assert(kStages == 3, "the unrolled K loop has one step per ring slot");
      if (nkb > 0) {
        if (s == 1) goto slot1;
        if (s == 2) goto slot2;
        for (;;) {
          step(std::integral_constant<int, 0>{});
          if (kb == nkb) { s = 1; break; }
        slot1:
          step(std::integral_constant<int, 1>{});
          if (kb == nkb) { s = 2; break; }
        slot2:
          step(std::integral_constant<int, 2>{});
          if (kb == nkb) { s = 0; break; }
        }
      }
      __syncwarp();  // the warp's reads of the B-scale buffer are done
      if (lane == 0) mbar_arrive(sb_empty0 + 8 * (j & 1));
      if (tm >= p.tiles_m) continue;  // the peer's row tile past M: nothing to store
      if constexpr (kGrouped) {  // rows not of the tile's expert: zeros, counted at the first column tile
        bool pad[2], other[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int64_t row = static_cast<int64_t>(tm) * kBM + wg * 64 + r0 + 8 * jj;
          const int id = row < p.m ? p.ids[row] : -1;
          const bool ok = row < p.m && expert >= 0 && id == expert;
          pad[jj] = row < p.m && id == -1;
          other[jj] = row < p.m && id != -1 && !ok;
          if (!ok) {
#pragma unroll
            for (int i = 0; i < 128; i += 4) acc[i + 2 * jj] = acc[i + 2 * jj + 1] = 0.0f;
          }
        }
        if (tn == 0) {  // lanes 0, 4, ... hold the warp's 16 rows
          const bool lead = lane % 4 == 0;
          const int n_pad = __popc(__ballot_sync(0xffffffff, lead && pad[0])) +
                            __popc(__ballot_sync(0xffffffff, lead && pad[1]));
          const int n_other = __popc(__ballot_sync(0xffffffff, lead && other[0])) +
                              __popc(__ballot_sync(0xffffffff, lead && other[1]));
          if (lane == 0 && n_pad) atomicAdd(p.counters, n_pad);
          if (lane == 0 && n_other) atomicAdd(p.counters + 1, n_other);
        }
      }
      // Epilogue: the consumer's 64x256 bf16 tile as four 64x64 boxes, 128-byte swizzled (16-byte
      // chunk c of row r at c ^ (r % 8)), written by stmatrix, then TMA stores. Per stmatrix, the
      // 8-column groups g and g + 1 of the warp's rows r and r + 8; lane l addresses row l % 8 of
      // matrix l / 8. The previous tile's stores must have read the buffer first.
      if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      named_sync(1 + wg);
      {
        const int q = lane / 8, rr = lane % 8;
        const uint32_t row_addr = dw + (warp * 16 + 8 * (q % 2) + rr) * 128;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int g = 0; g < 16; g += 2) {
            const int gq = g + q / 2;  // this lane's 8-column group of the half
            const uint32_t addr = row_addr + (2 * h + gq / 8) * kDBoxBytes + (((gq % 8) ^ rr) * 16);
            const float* v = acc + h * 64 + g * 4;
            stmatrix_x4(addr, bf16x2(v[0], v[1]), bf16x2(v[2], v[3]), bf16x2(v[4], v[5]), bf16x2(v[6], v[7]));
          }
        }
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      named_sync(1 + wg);
      if (tid == 0) {
        const int row = tm * kBM + wg * 64;
#pragma unroll
        for (int box = 0; box < 4; ++box) {
          const int col = tn * kBN + box * 64;
          if (col < p.n) tma_store(&map_d, dw + box * kDBoxBytes, col, row);
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
    }
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  cluster_sync();
#else
  __trap();  // built without sm_90a code (the host refuses other GPUs): never return an unwritten out
#endif  // RTP_SM90A
}

// ---- 64-row tiles for decode batches (fp8_gemm_sm90_narrow) ----
//
// A dense call of few rows (M <= 128 or so) has few tiles: its time is its weights' bytes from device
// memory and every tile's re-read of A from the L2, and what matters is how many bytes each SM keeps
// in flight and how little each K block costs beyond its MMA. Each CTA (256 threads) runs 64 x BN
// tiles (BN 32, 56, 64, 112 or 128) persistently: one thread of warpgroup 1 issues the TMA loads of A [64, 128],
// B [BN, 128] and the A-row scales into a ring of `stages` slots; warpgroup 0 is the one consumer: per
// K block one fresh m64nBNk32 chain (4 x k32), promoted as the wide kernel does (acc = fma(part,
// sa * sb, acc)), so the outputs are the Triton kernel's bits. Before a tile, the consumer copies its
// B-scale row (one float per K block) into shared memory: a tile of 32, 64 or 128 columns lies in one
// 128-column scale block; one of 56 or 112 may straddle two, and then stages both rows and promotes its
// column groups past the boundary with the second (promote_split), the products unchanged.
// Two chains are in flight: once the next slot is full, the consumer issues the next K block's chain
// into a second set of registers, reads its scales, and only then waits for this block's chain and
// promotes it, so the tensor cores do not idle through a wait and a promotion. The epilogue
// stores bf16 pairs from the registers straight to `out` (rows below M and columns below N only).
// multicast: 2-CTA clusters on column tiles 2q and 2q + 1 of one row tile; each CTA loads one half of
// the A tile's rows and multicasts it into both, so A is read from the L2 once per two tiles. A slot
// is then free once both CTAs' consumers released it. Without: one CTA per tile unit, its ring its own.
// pdl 1 or 2: launched as a programmatic dependent of the stream's kernel before, whose tail then
// overlaps this grid's launch and set-up (barriers, tensor-map prefetch); every thread waits for that
// kernel (griddepcontrol.wait) before it touches global memory: no load, prefetch or store ahead of it.
// pdl 2 also lets the stream's next programmatic dependent launch once the producer issued its last load.
constexpr int kNarrowBM = 64, kNarrowThreads = 256;
constexpr int kNarrowABytes = kNarrowBM * kBK;  // 8 KB
constexpr int kNarrowSABytes = kNarrowBM * 4;   // 256 B
constexpr int kNarrowSBBytes = 4096;            // the tile's B-scale row: K up to 1024 blocks
// B-scale rows a BN-wide tile stages: two where BN does not divide 128 (the tile may straddle two blocks).
__host__ __device__ constexpr int narrow_sb_rows(int bn) { return 128 % bn ? 2 : 1; }

// Offsets: the A ring, the B ring, the A-scale ring, the B-scale row, then full and empty barriers.
__host__ __device__ constexpr int narrow_off_b(int stages) { return stages * kNarrowABytes; }
__host__ __device__ constexpr int narrow_off_sa(int bn, int stages) { return narrow_off_b(stages) + stages * bn * kBK; }
__host__ __device__ constexpr int narrow_off_sb(int bn, int stages) {
  return narrow_off_sa(bn, stages) + stages * kNarrowSABytes;
}
__host__ __device__ constexpr int narrow_off_bar(int bn, int stages) {
  return narrow_off_sb(bn, stages) + narrow_sb_rows(bn) * kNarrowSBBytes;
}
__host__ constexpr int narrow_smem_bytes(int bn, int stages) { return 1024 + narrow_off_bar(bn, stages) + 2 * stages * 8; }

struct NarrowParams {
  const float* sb;
  int64_t sb_stride_n, sb_stride_k;
  __nv_bfloat16* out;
  int64_t out_stride;
  int m, n, kb, tiles_m, tiles_n, units, stages;
  int a_box_rows;  // rows of A loaded per tile (M's where M < 64; multicast: rounded up to 16), both halves
  int sa_box;      // A-row scales loaded per tile: a_box_rows rounded up to 4 (whole 16-byte units)
  int multicast;   // 1: 2-CTA clusters sharing A (units are pairs of column tiles), 0: one CTA per tile
  int pdl;         // 0: a plain launch; 1: a programmatic dependent; 2: one that lets its dependents launch early
};

// Unit u (a tile, or a pair of column tiles when multicasting) -> this CTA's row and column tile.
__device__ __forceinline__ void narrow_coords(const NarrowParams& p, int u, uint32_t rank, int& tm, int& tn) {
  tm = u % p.tiles_m;
  tn = (u / p.tiles_m) * (1 + p.multicast) + rank;
}

template <int BN>
__global__ void __launch_bounds__(kNarrowThreads, 1)
    fp8_gemm_sm90_narrow_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                const __grid_constant__ CUtensorMap map_sa, const NarrowParams p) {
#ifdef RTP_SM90A
  constexpr int R = BN / 2;  // accumulators per thread
  constexpr bool kTwoSb = narrow_sb_rows(BN) == 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const int stages = p.stages;
  const uint32_t off_b = base + narrow_off_b(stages), off_sa = base + narrow_off_sa(BN, stages);
  const uint32_t sbuf = base + narrow_off_sb(BN, stages);
  const uint32_t full0 = base + narrow_off_bar(BN, stages), empty0 = full0 + 8 * stages;
  uint32_t rank, cid, ncl;  // a launch without clusters: rank 0, one cluster per CTA
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  asm("mov.u32 %0, %%nclusterid.x;" : "=r"(ncl));
  const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, p.multicast ? 8 : 4);  // the consumer's warps (of both CTAs)
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (threadIdx.x == 128) prefetch_tensormaps(&map_a, &map_b, &map_sa);  // the producer's thread (kernel parameters)
  cluster_sync();  // both CTAs' barriers exist before either multicasts into them
  if (p.pdl) grid_dependency_wait();  // before any thread reads an operand or writes out

  if (wg == 1) {
    if (__shfl_sync(0xffffffff, tid / 32, 0) == 0 && elect_one()) {
      const uint32_t bytes = p.a_box_rows * kBK + BN * kBK + p.sa_box * 4;
      const int half = p.a_box_rows / 2;
      int s = 0;
      uint32_t phase = 0;
      for (int u = cid; u < p.units; u += ncl) {
        int tm, tn;
        narrow_coords(p, u, rank, tm, tn);
        const int row0 = tm * kNarrowBM, col0 = min(tn, p.tiles_n - 1) * BN;  // a pair's tile past N: any B
        for (int kb = 0; kb < p.kb; ++kb) {
          const uint32_t full = full0 + 8 * s;
          mbar_wait(empty0 + 8 * s, phase ^ 1);
          mbar_expect_tx(full, bytes);
          tma_load(&map_b, off_b + s * (BN * kBK), full, kb * kBK, col0);
          if (p.multicast) {
            tma_load_multicast(&map_a, base + s * kNarrowABytes + rank * half * kBK, full, kb * kBK,
                               row0 + rank * half, 0x3);
          } else {
            tma_load(&map_a, base + s * kNarrowABytes, full, kb * kBK, row0);
          }
          tma_load(&map_sa, off_sa + s * kNarrowSABytes, full, row0, kb);
          if (++s == stages) s = 0, phase ^= 1;
        }
      }
      if (p.pdl == 2) launch_dependents();
      drain_ring(empty0, stages, s, phase);
    }
  } else {
    const int warp = tid / 32, lane = tid % 32;
    const int r0 = warp * 16 + lane / 4;
    const uint32_t desc_a = smem_desc_lo(base), desc_b = smem_desc_lo(off_b);
    // Who releases a slot: lanes 0 and 1 of each warp on both CTAs' `empty` barriers when
    // multicasting, else lane 0 on its own; by cluster address, without a branch.
    const bool releases = p.multicast ? lane < 2 : lane == 0;
    const uint32_t empty_c0 = cluster_addr(empty0, p.multicast ? lane % 2 : rank);
    float acc[R];
    float part0[R], part1[R];
    int s = 0;
    uint32_t phase = 0;
    // K block kb's scales (sb, and sb2 of the second scale block where the tile straddles two; a0, a1),
    // read when its slot is full. Column groups from `split` on lie in the second block.
    float sb, sb2 = 0.0f, a0, a1;
    int split = R / 4;
    const auto read_scales = [&](int kb, int slot) {
      const uint32_t sa = off_sa + slot * kNarrowSABytes + 4 * r0;
      sb = lds_f32(sbuf + 4 * kb), a0 = lds_f32(sa), a1 = lds_f32(sa + 32);
      if constexpr (kTwoSb) sb2 = lds_f32(sbuf + kNarrowSBBytes + 4 * kb);
    };
    const auto issue = [&](float(&d)[R], int slot) {
      mma_issue(d, desc_a + slot * (kNarrowABytes >> 4), desc_b + slot * ((BN * kBK) >> 4));
    };
    // One K block, kb, whose product runs into cur (issued). Unless it is the tile's last block, the
    // next block's product is issued into next before cur is waited for, so the tensor cores have it
    // queued while cur is promoted. The promotion order is unchanged (acc = fma(part_kb, scale_kb,
    // acc), kb ascending): the same bits. On every path exactly one product is in flight between
    // steps, which ptxas needs to see to keep the wgmmas asynchronous.
    const auto step = [&](float(&cur)[R], float(&next)[R], int kb, bool last) {
      const int s1 = s + 1 == stages ? 0 : s + 1;
      const uint32_t ph1 = s1 == 0 ? phase ^ 1 : phase;
      const float s0 = a0 * sb, s1v = a1 * sb;
      const float t0 = kTwoSb ? a0 * sb2 : 0.0f, t1 = kTwoSb ? a1 * sb2 : 0.0f;
      if (!last) {
        mbar_wait(full0 + 8 * s1, ph1);
        issue(next, s1);
        read_scales(kb + 1, s1);
        mma_wait_prev(cur);
      } else {
        mma_wait(cur);
      }
      __syncwarp();
      if (releases) mbar_arrive_cluster(empty_c0 + 8 * s);
      if constexpr (kTwoSb) {
        promote_split(acc, cur, s0, s1v, t0, t1, split);
      } else {
        promote(acc, cur, s0, s1v);
      }
      s = s1, phase = ph1;
    };
    for (int u = cid; u < p.units; u += ncl) {
      int tm, tn;
      narrow_coords(p, u, rank, tm, tn);
      const int col0 = tn * BN;
      const int tcol = min(tn, p.tiles_n - 1) * BN, block = tcol / 128;  // a pair's tile past N: any scales
      const float* sbrow = p.sb + static_cast<int64_t>(block) * p.sb_stride_n;
      // The second block's row (clamped to the last: then no column group reads it) and the first group in it.
      const float* sbrow2 = p.sb + static_cast<int64_t>(min(block + 1, (p.n - 1) / 128)) * p.sb_stride_n;
      if constexpr (kTwoSb) split = min(R / 4, ((block + 1) * 128 - tcol) / 8);
#pragma unroll
      for (int i = 0; i < R; ++i) acc[i] = 0.0f;
      // The tile's B-scale row into shared memory (as DeepGEMM stages it), so that no K block waits on
      // a load from device memory; the previous tile's reads are done first.
      named_sync(1);
      for (int i = tid; i < p.kb; i += 128) {
        sts_f32(sbuf + 4 * i, __ldg(sbrow + i * p.sb_stride_k));
        if constexpr (kTwoSb) sts_f32(sbuf + kNarrowSBBytes + 4 * i, __ldg(sbrow2 + i * p.sb_stride_k));
      }
      named_sync(1);
      mbar_wait(full0 + 8 * s, phase);
      issue(part0, s);
      // A block's scales are read while the block before it runs: read in the block's own iteration,
      // ptxas put their products among its wgmmas, which then waited on shared memory (ncu, 2026-12-05).
      read_scales(0, s);
      // Unrolled by two, so that each product's registers are fixed at compile time.
      int kb = 0;
      for (; kb + 2 < p.kb; kb += 2) {
        step(part0, part1, kb, false);
        step(part1, part0, kb + 1, false);
      }
      if (kb + 1 < p.kb) {
        step(part0, part1, kb, false);
        step(part1, part0, kb + 1, true);
      } else {
        step(part0, part1, kb, true);
      }
      // Epilogue: this thread's rows r0 and r0 + 8, columns 8g + 2 (lane % 4) + {0, 1}.
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int row = tm * kNarrowBM + r0 + 8 * jj;
        if (row >= p.m) continue;
        __nv_bfloat16* dst = p.out + static_cast<int64_t>(row) * p.out_stride;
#pragma unroll
        for (int g = 0; g < R / 4; ++g) {
          const int col = col0 + 8 * g + 2 * (lane % 4);
          const float v0 = acc[4 * g + 2 * jj], v1 = acc[4 * g + 2 * jj + 1];
          if (col + 1 < p.n) {
            *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(v0, v1);
          } else if (col < p.n) {
            dst[col] = __float2bfloat16_rn(v0);
          }
        }
      }
    }
  }
  cluster_sync();
#else
  __trap();  // built without sm_90a code (the host refuses other GPUs): never return an unwritten out
#endif  // RTP_SM90A
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  });
  TORCH_CHECK(fn != nullptr, "fp8_gemm_sm90: the driver has no cuTensorMapEncodeTiled");
  return fn;
}

// A 2-D tensor map over `ptr`: inner dimension d0 (contiguous), outer d1 with a row pitch of
// `pitch` bytes, boxes [b1, b0].
CUtensorMap tensor_map(const void* ptr, CUtensorMapDataType type, uint64_t d0, uint64_t d1, uint64_t pitch,
                       uint32_t b0, uint32_t b1, CUtensorMapSwizzle swizzle, const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {d0, d1};
  const cuuint64_t strides[1] = {pitch};
  const cuuint32_t box[2] = {b0, b1};
  const cuuint32_t step[2] = {1, 1};
  const CUresult r = encode_fn()(&map, type, 2, const_cast<void*>(ptr), dims, strides, box, step,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "fp8_gemm_sm90: cuTensorMapEncodeTiled failed for ", what, " (CUresult ", int(r),
              ")");
  return map;
}

void check_aligned(const at::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "fp8_gemm_sm90: ", name,
              " must start 16-byte aligned");
}

// A launch of `units` 2-CTA clusters (pairs) or of `units` single CTAs, of `threads` threads each.
cudaLaunchConfig_t launch_config(int units, int smem, cudaLaunchAttribute* attr, int threads = kThreads,
                                 bool pairs = true) {
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(pairs ? 2 * units : units);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = pairs ? 1 : 0;
  return cfg;
}

// How many CTAs (pairs: 2-CTA clusters) of `kernel`, `threads` threads and `smem` bytes of shared
// memory each, fit on the current GPU at once: a persistent grid larger than that would run its last
// ones after the others finished. Asked once per kernel, device, size and mode (a model's layers
// alternate K, and so the size), which also sets the kernel's shared memory limit there (so not
// inside a CUDA graph capture after a size's first call).
int fit_at_once(const void* kernel, int threads, int smem, bool pairs, const char* op) {
  static std::map<std::tuple<const void*, int, int, bool>, int> cache;  // (kernel, device, smem, pairs)
  static std::mutex mu;
  int device;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const auto hit = cache.find({kernel, device, smem, pairs});
  if (hit != cache.end()) return hit->second;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemMax));
  int n = 0;
  if (pairs) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = launch_config(1024, smem, attr, threads);
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  } else {
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    n = per_sm * sms;
  }
  TORCH_CHECK(n > 0, op, ": no ", pairs ? "2-CTA cluster" : "CTA", " of ", smem,
              " bytes of shared memory fits this GPU");
  cache[{kernel, device, smem, pairs}] = n;
  return n;
}

template <bool kGrouped>
int max_clusters(int smem) {
  return fit_at_once(reinterpret_cast<const void*>(fp8_gemm_sm90_kernel<kGrouped>), kThreads, smem, true,
                     "fp8_gemm_sm90");
}

// Checks shared by both ops; b is [N, K] (dense) or [E, N, K] (grouped), sb likewise.
void check_common(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                  const at::Tensor& out, int64_t group_m, int64_t clusters, int bdim) {
  TORCH_CHECK(a.is_cuda() && sa.is_cuda() && b.is_cuda() && sb.is_cuda() && out.is_cuda(),
              "fp8_gemm_sm90: a, sa, b, sb and out must be CUDA tensors");
  TORCH_CHECK(a.device() == b.device() && a.device() == sa.device() && a.device() == sb.device() &&
                  a.device() == out.device(),
              "fp8_gemm_sm90: a, sa, b, sb and out must be on one device");
  TORCH_CHECK(a.dim() == 2 && sa.dim() == 2 && out.dim() == 2, "fp8_gemm_sm90: a, sa and out must be 2-D");
  TORCH_CHECK(b.dim() == bdim && sb.dim() == bdim, "fp8_gemm_sm90: b and sb must be ", bdim, "-D");
  TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
              "fp8_gemm_sm90: a and b must be float8_e4m3fn");
  TORCH_CHECK(sa.scalar_type() == at::kFloat && sb.scalar_type() == at::kFloat,
              "fp8_gemm_sm90: sa and sb must be float32");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16, "fp8_gemm_sm90: out must be bfloat16");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(-2), kb = (k + kBK - 1) / kBK;
  TORCH_CHECK(b.size(-1) == k, "fp8_gemm_sm90: b must be [", bdim == 3 ? "E, " : "", "N, K] with a's K = ", k,
              ", got ", b.sizes());
  TORCH_CHECK(out.size(0) == m && out.size(1) == n, "fp8_gemm_sm90: out must be [M, N] = [", m, ", ", n, "], got ",
              out.sizes());
  TORCH_CHECK(sa.size(0) == m && sa.size(1) == kb, "fp8_gemm_sm90: sa must be [M, ceil(K/128)] = [", m, ", ", kb,
              "], got ", sa.sizes());
  TORCH_CHECK(sb.size(-2) == (n + 127) / 128 && sb.size(-1) == kb && (bdim == 2 || sb.size(0) == b.size(0)),
              "fp8_gemm_sm90: sb must be [", bdim == 3 ? "E, " : "", "ceil(N/128), ceil(K/128)] = [",
              bdim == 3 ? std::to_string(b.size(0)) + ", " : std::string(), (n + 127) / 128, ", ", kb, "], got ",
              sb.sizes());
  TORCH_CHECK(m > 0 && n > 0 && k > 0, "fp8_gemm_sm90: M, N and K must be positive");
  TORCH_CHECK(a.stride(1) == 1 && b.stride(-1) == 1 && out.stride(1) == 1,
              "fp8_gemm_sm90: a, b and out must have unit stride along their last dimension");
  TORCH_CHECK(a.stride(0) % 16 == 0 && b.stride(-2) % 16 == 0 && (out.stride(0) * 2) % 16 == 0,
              "fp8_gemm_sm90: the row strides of a, b (bytes) and out must be multiples of 16 bytes");
  TORCH_CHECK(bdim == 2 || b.stride(0) == n * b.stride(1),
              "fp8_gemm_sm90: b's experts must follow one another (viewable as [E * N, K])");
  TORCH_CHECK(sa.stride(0) == 1 && sa.stride(1) % 4 == 0 && sa.stride(1) >= m,
              "fp8_gemm_sm90: sa must be column-major with a column stride that is a multiple of 4 (col_tma)");
  TORCH_CHECK(group_m >= 1, "fp8_gemm_sm90: group_m must be positive, got ", group_m);
  TORCH_CHECK(clusters >= 0, "fp8_gemm_sm90: clusters must be >= 0 (0: as many as fit), got ", clusters);
  check_aligned(a, "a");
  check_aligned(b, "b");
  check_aligned(sa, "sa");
  check_aligned(out, "out");
  TORCH_CHECK(m < (1LL << 31) && b.size(0) * n < (1LL << 31) && k < (1LL << 31),
              "fp8_gemm_sm90: M, N (times E) and K must fit int32");
}

// The kernels' sm_90a code runs on SM90 alone (a build without it traps).
void check_sm90(const at::Tensor& a) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.get_device()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, a.get_device()));
  TORCH_CHECK(major == 9 && minor == 0, "fp8_gemm_sm90: needs an SM90 GPU, this is sm_", major, minor);
}

// The cluster kernel's B-scale rows share its shared memory with the ring.
void check_cluster_smem(int64_t k) {
  const int kb = static_cast<int>((k + kBK - 1) / kBK);
  TORCH_CHECK(smem_bytes(kb) <= kSmemMax, "fp8_gemm_sm90: K = ", k, " needs ", smem_bytes(kb),
              " bytes of shared memory, over ", kSmemMax);
}

template <bool kGrouped>
void launch(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb, at::Tensor& out,
            int64_t group_m, int64_t clusters_cap, bool multicast, const int* ids, int* counters) {
  const c10::cuda::CUDAGuard guard(a.device());
  check_sm90(a);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(-2), kb = (k + kBK - 1) / kBK;
  const int64_t b_rows = kGrouped ? b.size(0) * n : n;
  const CUtensorMap map_a = tensor_map(a.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, m, a.stride(0), kBK, kBM,
                                       CU_TENSOR_MAP_SWIZZLE_128B, "a");
  const CUtensorMap map_b = tensor_map(b.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, b_rows, b.stride(-2), kBK,
                                       kHalfN, CU_TENSOR_MAP_SWIZZLE_128B, "b");
  const CUtensorMap map_sa = tensor_map(sa.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, m, kb, sa.stride(1) * 4,
                                        kBM, 1, CU_TENSOR_MAP_SWIZZLE_NONE, "sa");
  const CUtensorMap map_d = tensor_map(out.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, n, m, out.stride(0) * 2,
                                       64, 64, CU_TENSOR_MAP_SWIZZLE_128B, "out");
  Params p;
  p.sb = sb.data_ptr<float>();
  p.sb_stride_e = kGrouped ? sb.stride(0) : 0;
  p.sb_stride_n = sb.stride(-2);
  p.sb_stride_k = sb.stride(-1);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.kb = static_cast<int>(kb);
  p.tiles_m = static_cast<int>((m + kBM - 1) / kBM);
  p.tiles_n = static_cast<int>((n + kBN - 1) / kBN);
  p.pairs_m = (p.tiles_m + 1) / 2;
  p.group_m = static_cast<int>(group_m);
  p.sb_rows = static_cast<int>(sb.size(-2));
  p.ids = ids;
  p.counters = counters;
  p.experts = kGrouped ? static_cast<int>(b.size(0)) : 1;
  p.multicast = multicast ? 1 : 0;

  const int smem = smem_bytes(p.kb);
  const int64_t pairs = static_cast<int64_t>(p.pairs_m) * p.tiles_n;
  const int fit = max_clusters<kGrouped>(smem);
  const int clusters = static_cast<int>(std::min<int64_t>(pairs, clusters_cap > 0 ? clusters_cap : fit));
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = launch_config(clusters, smem, attr);
  cfg.stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fp8_gemm_sm90_kernel<kGrouped>, map_a, map_b, map_sa, map_d, p));
}

void fp8_gemm_sm90(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                   at::Tensor& out, int64_t group_m, int64_t clusters, bool multicast) {
  check_common(a, sa, b, sb, out, group_m, clusters, 2);
  check_cluster_smem(a.size(1));
  launch<false>(a, sa, b, sb, out, group_m, clusters, multicast, nullptr, nullptr);
}

// How many 2-CTA clusters of the dense kernel fit on the current GPU at once for this K.
int64_t fp8_gemm_sm90_clusters(int64_t k) {
  TORCH_CHECK(k > 0 && k < (1LL << 31), "fp8_gemm_sm90_clusters: K must be positive and fit int32, got ", k);
  const int smem = smem_bytes(static_cast<int>((k + kBK - 1) / kBK));
  TORCH_CHECK(smem <= kSmemMax, "fp8_gemm_sm90_clusters: K = ", k, " needs ", smem, " bytes of shared memory, over ",
              kSmemMax);
  return max_clusters<false>(smem);
}

void fp8_gemm_sm90_contiguous(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                              const at::Tensor& ids, at::Tensor& out, at::Tensor& counters, int64_t group_m,
                              int64_t clusters, bool multicast) {
  check_common(a, sa, b, sb, out, group_m, clusters, 3);
  check_cluster_smem(a.size(1));
  TORCH_CHECK(ids.is_cuda() && counters.is_cuda() && ids.device() == a.device() && counters.device() == a.device(),
              "fp8_gemm_sm90: ids and counters must be CUDA tensors on a's device");
  TORCH_CHECK(ids.scalar_type() == at::kInt && ids.dim() == 1 && ids.size(0) == a.size(0) && ids.is_contiguous(),
              "fp8_gemm_sm90: ids must be contiguous int32 [M] = [", a.size(0), "]");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() == 2 && counters.is_contiguous(),
              "fp8_gemm_sm90: counters must be contiguous int32 [2]");
  launch<true>(a, sa, b, sb, out, group_m, clusters, multicast, ids.data_ptr<int>(), counters.data_ptr<int>());
}

// ---- fp8_gemm_sm90_narrow's host side ----
constexpr int kNarrowMaxStages = 16;

// The narrow kernel's tile widths: each one a build of the kernel, the only block_n admitted.
using NarrowWidths = std::integer_sequence<int, 32, 56, 64, 112, 128>;

template <int... W>
bool is_narrow_width(int64_t block_n, std::integer_sequence<int, W...>) {
  return ((block_n == W) || ...);
}

template <int... W>
std::string narrow_width_list(std::integer_sequence<int, W...>) {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + std::to_string(W)), ...);
  return s;
}

// Checks the narrow kernel's tile width.
void check_block_n(int64_t block_n, const char* op) {
  TORCH_CHECK(is_narrow_width(block_n, NarrowWidths{}), op, ": block_n must be one of ",
              narrow_width_list(NarrowWidths{}), ", got ", block_n);
}

// The most ring slots of BN-wide tiles that fit (at most kNarrowMaxStages).
int narrow_max_stages(int bn) {
  int s = kNarrowMaxStages;
  while (s > 2 && narrow_smem_bytes(bn, s) > kSmemMax) --s;
  return s;
}

template <int BN>
void launch_narrow(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                   at::Tensor& out, int stages, bool multicast, int pdl) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0), kb = (k + kBK - 1) / kBK;
  NarrowParams p;
  p.sb = sb.data_ptr<float>();
  p.sb_stride_n = sb.stride(0);
  p.sb_stride_k = sb.stride(1);
  p.out = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
  p.out_stride = out.stride(0);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.kb = static_cast<int>(kb);
  p.tiles_m = static_cast<int>((m + kNarrowBM - 1) / kNarrowBM);
  p.tiles_n = static_cast<int>((n + BN - 1) / BN);
  const int64_t units = static_cast<int64_t>(p.tiles_m) * (multicast ? (p.tiles_n + 1) / 2 : p.tiles_n);
  TORCH_CHECK(units < (1LL << 30), "fp8_gemm_sm90_narrow: ", units, " tiles do not fit int32");
  p.units = static_cast<int>(units);
  p.stages = stages;
  p.multicast = multicast ? 1 : 0;
  p.pdl = pdl;
  // A's rows per tile: M's where M < 64, so that TMA fills no out-of-bounds row (those cost time); with
  // multicast rounded up to 16, so that each half starts on a 1024-byte swizzle period. The A-row scales'
  // box likewise, rounded up to 4 floats (a box's inner extent is whole 16-byte units). The tile's other
  // rows and scales keep what their slot held and are never stored.
  p.a_box_rows = static_cast<int>(std::min<int64_t>(kNarrowBM, multicast ? (m + 15) / 16 * 16 : m));
  p.sa_box = (p.a_box_rows + 3) / 4 * 4;
  const CUtensorMap map_a = tensor_map(a.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, m, a.stride(0), kBK,
                                       multicast ? p.a_box_rows / 2 : p.a_box_rows, CU_TENSOR_MAP_SWIZZLE_128B, "a");
  const CUtensorMap map_b = tensor_map(b.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, n, b.stride(0), kBK, BN,
                                       CU_TENSOR_MAP_SWIZZLE_128B, "b");
  const CUtensorMap map_sa = tensor_map(sa.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, m, kb, sa.stride(1) * 4,
                                        p.sa_box, 1, CU_TENSOR_MAP_SWIZZLE_NONE, "sa");
  const int smem = narrow_smem_bytes(BN, stages);
  const void* kernel = reinterpret_cast<const void*>(fp8_gemm_sm90_narrow_kernel<BN>);
  const int fit = fit_at_once(kernel, kNarrowThreads, smem, multicast, "fp8_gemm_sm90_narrow");
  const int grid = static_cast<int>(std::min<int64_t>(units, fit));
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = launch_config(grid, smem, attr, kNarrowThreads, multicast);
  if (pdl) {  // a programmatic dependent of the stream's kernel before (captured into graphs as such)
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  cfg.stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fp8_gemm_sm90_narrow_kernel<BN>, map_a, map_b, map_sa, p));
}

// launch_narrow for the build of width block_n; false (nothing launched) where block_n is none of W.
template <int... W>
bool launch_narrow_width(int64_t block_n, const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b,
                         const at::Tensor& sb, at::Tensor& out, int stages, bool multicast, int pdl,
                         std::integer_sequence<int, W...>) {
  return ((block_n == W && (launch_narrow<W>(a, sa, b, sb, out, stages, multicast, pdl), true)) || ...);
}

void fp8_gemm_sm90_narrow(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                          at::Tensor& out, int64_t block_n, int64_t stages, bool multicast, int64_t pdl) {
  check_common(a, sa, b, sb, out, 1, 0, 2);
  check_block_n(block_n, "fp8_gemm_sm90_narrow");
  TORCH_CHECK(pdl >= 0 && pdl <= 2, "fp8_gemm_sm90_narrow: pdl must be 0 (a plain launch), 1 (a programmatic "
              "dependent) or 2 (one that lets its dependents launch early), got ", pdl);
  TORCH_CHECK((a.size(1) + kBK - 1) / kBK * 4 <= kNarrowSBBytes, "fp8_gemm_sm90_narrow: K = ", a.size(1),
              " is over ", kNarrowSBBytes / 4 * kBK, " (the tile's B-scale row is staged in shared memory)");
  const int most = narrow_max_stages(static_cast<int>(block_n));
  TORCH_CHECK(stages == 0 || (stages >= 2 && stages <= most),
              "fp8_gemm_sm90_narrow: stages must be 0 (as many as fit) or 2..", most, " for block_n ", block_n,
              ", got ", stages);
  const c10::cuda::CUDAGuard guard(a.device());
  check_sm90(a);
  const int st = stages ? static_cast<int>(stages) : most, mode = static_cast<int>(pdl);
  TORCH_CHECK(launch_narrow_width(block_n, a, sa, b, sb, out, st, multicast, mode, NarrowWidths{}),
              "fp8_gemm_sm90_narrow: no build of block_n ", block_n);
}

// The ring slots fp8_gemm_sm90_narrow takes with stages = 0 for this block_n.
int64_t fp8_gemm_sm90_narrow_stages(int64_t block_n) {
  check_block_n(block_n, "fp8_gemm_sm90_narrow_stages");
  return narrow_max_stages(static_cast<int>(block_n));
}

}  // namespace gemm90
}  // namespace rtp_fp8

TORCH_LIBRARY_FRAGMENT(rtp_fp8_C, m) {
  m.def("fp8_gemm_sm90(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, int group_m, int clusters, bool multicast) -> ()");
  m.def(
      "fp8_gemm_sm90_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor ids, Tensor(a!) out, "
      "Tensor(b!) counters, int group_m, int clusters, bool multicast) -> ()");
  m.def("fp8_gemm_sm90_clusters(int k) -> int", &rtp_fp8::gemm90::fp8_gemm_sm90_clusters);
  m.def("fp8_gemm_sm90_narrow(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, int block_n, int stages, bool multicast, int pdl=0) -> ()");
  m.def("fp8_gemm_sm90_narrow_stages(int block_n) -> int", &rtp_fp8::gemm90::fp8_gemm_sm90_narrow_stages);
}
TORCH_LIBRARY_IMPL(rtp_fp8_C, CUDA, m) {
  m.impl("fp8_gemm_sm90", &rtp_fp8::gemm90::fp8_gemm_sm90);
  m.impl("fp8_gemm_sm90_contiguous", &rtp_fp8::gemm90::fp8_gemm_sm90_contiguous);
  m.impl("fp8_gemm_sm90_narrow", &rtp_fp8::gemm90::fp8_gemm_sm90_narrow);
}
