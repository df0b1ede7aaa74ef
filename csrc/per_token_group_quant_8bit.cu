// Per-token-group 8-bit quantization (fp8 e4m3fn or int8) with FP32 or packed UE8M0 scales.
//
// torch.ops.rtp_fp8_C.per_token_group_quant(x, q, scales, group_size, scale_layout, pow2, eps)
// writes q and scales in place; same schema and numerics as the Triton op
// (rtp_fp8/quant/token_group.py) and the oracle (rtp_fp8/quant/reference.py):
//   amax   = max |x| over the group's finite values (NaN, +-Inf ignored)
//   scale  = max(amax, eps) / qmax            (IEEE division), or rounded up to 2^k (pow2)
//   q      = clamp(x / scale, -qmax, qmax)    (IEEE division, RNE cast; NaN -> 0x7F / int8 0)
// Scale layouts: "row" [M, G], "col" strides (1, M), "col_tma" strides (1, align(M, 4)),
// "ue8m0" int32 [M, ceil(G/4)] strides (1, align(M, 4)), four exponent bytes per word.
//
// Work item = one (row, group) pair; a group is handled by TPG threads holding it in
// registers (16-byte loads, VPT vectors per thread), its amax reduced with warp shuffles.
// Items are padded per row to a multiple of 4 for "ue8m0", so the four bytes of a word
// are produced in one block and assembled through shared memory (no second pass).

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace rtp_fp8 {
// A named namespace, not an anonymous one: cudafe++ mangles anonymous-namespace (and
// static) entities with a per-compilation random id, which would make builds differ.
namespace ptgq {

// Launch shape: 128 threads, one group in flight per thread (bench/quant_sweep.py on the H200,
// bf16 group 128: beat 256/512 threads and two groups per thread at M = 128, 4096 and 32768).
constexpr int kBlockThreads = 128;
constexpr int kItemsPerThread = 1;

enum class Layout { kRow, kCol, kColTma, kUe8m0 };

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// x / scale as IEEE division gives it, without a divide: q0 = x * inv, e = fma(q0, scale, -x)
// (exact: the negated remainder), q0 - e * inv rounded once, with inv = 1 / scale rounded once
// per group. Equal to __fdiv_rn unless x, the remainder or the quotient is subnormal (then
// |x / scale| < 2^-100 and both are fp8/int8 zeros of x's sign) or something overflows: groups
// holding +-Inf or a scale below 2^-60 divide instead. The Triton op uses the same formula;
// tests/quant/test_fast_division.py checks it against div.rn for every bf16 and fp16 pair.
__device__ __forceinline__ float div_fast(float x, float scale, float inv) {
  const float q0 = __fmul_rn(x, inv);
  return __fmaf_rn(-__fmaf_rn(q0, scale, -x), inv, q0);
}

template <bool kPow2>
__device__ __forceinline__ float quotient(float x, float scale, float inv, bool divide) {
  if (kPow2) return __fmul_rn(x, inv);  // exact reciprocal: the same rounding as the division
  return divide ? __fdiv_rn(x, scale) : div_fast(x, scale, inv);
}

// Four quotients -> one word of four fp8 e4m3fn bytes (low byte first). The conversion saturates
// (+-Inf and |y| > 448 -> +-448); NaN becomes the canonical 0x7F whatever its sign.
__device__ __forceinline__ uint32_t pack_fp8x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  const uint32_t w = lo | (hi << 16);
  const uint32_t nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;  // bytes 0x7F / 0xFF
  return w & ~nan;
}

// int8: clamp to +-127, round half to even, NaN -> 0.
__device__ __forceinline__ uint32_t pack_int8x4(float a, float b, float c, float d, float qmax) {
  const float v[4] = {a, b, c, d};
  uint32_t w = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = isnan(v[j]) ? 0 : __float2int_rn(fminf(fmaxf(v[j], -qmax), qmax));
    w |= (static_cast<uint32_t>(i) & 0xFFu) << (8 * j);
  }
  return w;
}

// max |v| over a group held by TPG lanes (kElems values each), reduced with shuffles; every
// lane of the warp must call it. kFiniteOnly skips +-Inf; NaN is dropped either way (fmaxf).
template <int TPG, int kElems, bool kFiniteOnly>
__device__ __forceinline__ float group_amax(const float (&v)[kElems]) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kElems; ++j) {
    const float a = fabsf(v[j]);
    amax = (!kFiniteOnly || a < INFINITY) ? fmaxf(amax, a) : amax;
  }
#pragma unroll
  for (int off = TPG / 2; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off, TPG));
  }
  return amax;
}

// One 16-byte load of the input. kLoad 0: plain (the shipped kernel); the others exist for
// bench/quant_sweep.py only: 1 streaming (ld.global.cs), 2 L1 evict-first with an L2
// evict-first policy, 3 L1 no-allocate, 4 read-only path with a 256-byte L2 prefetch.
template <int kLoad>
__device__ __forceinline__ uint4 load16(const uint4* p, uint64_t policy) {
  uint4 r;
  if constexpr (kLoad == 0) {
    r = *p;
  } else if constexpr (kLoad == 1) {
    r = __ldcs(p);
  } else if constexpr (kLoad == 2) {
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(policy));
  } else if constexpr (kLoad == 3) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  }
  return r;
}

// Item l of the block -> (row, group). Row order (1-D grid): items run along the rows
// (item = r * gp + g). Column order (column-major FP32 scales): block (x, y) holds rows
// [y * R, + R) of group x, so its R scales are consecutive in memory and leave in one coalesced
// store (one 4-byte store per group costs a write transaction each: measured 10% at M = 32768).
// The 2-D grid spares each block a division by gp before its loads (launch_typed splits M past
// gridDim.y's 65535 row tiles).
__device__ __forceinline__ void item_coords(bool col_order, uint32_t l, uint32_t R, uint32_t gp, uint32_t& row,
                                            uint32_t& g) {
  if (col_order) {
    row = blockIdx.y * R + l;
    g = blockIdx.x;
  } else {
    const uint32_t item = blockIdx.x * R + l;
    row = item / gp;
    g = item % gp;
  }
}

// T: input element; VPT: 16-byte vectors per thread; TPG: threads per group.
// Scales are gathered in shared memory and written by the block's first threads: FP32 ones
// at their (row, group) address, packed UE8M0 words from four consecutive groups of a row.
template <typename T, int VPT, int TPG, bool kInt8, bool kPacked, bool kPow2, int kThreads = kBlockThreads,
          int kItems = kItemsPerThread, int kLoad = 0>
__global__ void __launch_bounds__(kThreads) per_token_group_quant_kernel(
    const T* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales, uint32_t m, int64_t k,
    uint32_t num_groups, uint32_t groups_padded, int64_t stride_sm, int64_t stride_sg, float eps, float qmax,
    bool col_order) {
  constexpr int kVec = 16 / sizeof(T);            // elements per 16-byte load
  constexpr int kElems = VPT * kVec;              // elements per thread per group
  constexpr int kGroupsPerPass = kThreads / TPG;
  constexpr int kItemsPerBlock = kGroupsPerPass * kItems;
  static_assert(kItemsPerBlock % 4 == 0, "a UE8M0 word must not straddle blocks");

  __shared__ uint8_t exps[kPacked ? kItemsPerBlock : 1];
  __shared__ float sscale[kPacked ? 1 : kItemsPerBlock];

  const int lane_in_group = threadIdx.x % TPG;
  const int sub = threadIdx.x / TPG;
  // 32-bit index math: 64-bit division costs ~100 instructions (a launch holds <= 2^30 items).
  const uint32_t items = m * groups_padded;
  // The block's first item in row order (the linear loads, the UE8M0 words).
  const uint32_t block_base = blockIdx.x * kItemsPerBlock;

  float vals[kItems][kElems];
  bool valid[kItems];
  int64_t base[kItems];  // element offset of the item's group in x and q
  // Row order with no padded groups (every case but column-major FP32 scales and UE8M0 with
  // G % 4 != 0): item i's group starts at element i * group, so the loads wait for no division
  // (H200, M = 4096 row scales: 23.6 -> 22.4 us; docs/bench_quant_2026-12-03i.json).
  const bool linear = !col_order && groups_padded == num_groups;

  uint64_t policy = 0;
  if constexpr (kLoad == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  // Issue every load first: kItems independent 16-byte loads per vector slot.
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const uint32_t l = it * kGroupsPerPass + sub;
    if (linear) {
      valid[it] = block_base + l < items;
      base[it] = (int64_t)(block_base + l) * (TPG * kElems);
    } else {
      uint32_t row, g;
      item_coords(col_order, l, kItemsPerBlock, groups_padded, row, g);
      valid[it] = row < m && g < num_groups;
      base[it] = (int64_t)row * k + (int64_t)g * (TPG * kElems);
    }
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      if (valid[it]) {
        const int64_t col = base[it] + (int64_t)(v * TPG + lane_in_group) * kVec;
        const uint4* src = reinterpret_cast<const uint4*>(x + col);
        const uint4 raw = load16<kLoad>(src, policy);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < kVec; ++j) vals[it][v * kVec + j] = to_float<T>(e[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) vals[it][v * kVec + j] = 0.f;
      }
    }
  }

#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    float amax = group_amax<TPG, kElems, false>(vals[it]);
    // Rare: a group holding +-Inf (its amax is the finite one) or a scale below 2^-60. The
    // branch is warp-uniform (the shuffles need every lane): such a warp redoes the amax
    // without infinities and divides.
    const bool special = amax == INFINITY || fmaxf(amax, eps) < qmax * 0x1p-60f;
    const bool divide = __any_sync(0xffffffffu, special);
    if (divide) amax = group_amax<TPG, kElems, true>(vals[it]);
    float scale = __fdiv_rn(fmaxf(amax, eps), qmax);
    if (kPow2) {
      const uint32_t bits = __float_as_uint(scale);
      const uint32_t e = ((bits >> 23) & 0xFFu) + ((bits & 0x7FFFFFu) != 0u);
      scale = __uint_as_float(e << 23);
    }
    const float inv = __frcp_rn(scale);
    if (valid[it]) {
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        uint32_t words[kVec / 4];
#pragma unroll
        for (int w = 0; w < kVec / 4; ++w) {
          float y[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) y[j] = quotient<kPow2>(vals[it][v * kVec + 4 * w + j], scale, inv, divide);
          words[w] = kInt8 ? pack_int8x4(y[0], y[1], y[2], y[3], qmax) : pack_fp8x4(y[0], y[1], y[2], y[3]);
        }
        uint8_t* dst = q + base[it] + (int64_t)(v * TPG + lane_in_group) * kVec;
        if constexpr (kVec == 8) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
        } else {
          *reinterpret_cast<uint32_t*>(dst) = words[0];
        }
      }
    }
    if (kPacked) {
      if (lane_in_group == 0) {
        exps[it * kGroupsPerPass + sub] = valid[it] ? static_cast<uint8_t>(__float_as_uint(scale) >> 23) : 0;
      }
    } else if (lane_in_group == 0) {
      sscale[it * kGroupsPerPass + sub] = scale;
    }
  }

  if (!kPacked) {
    __syncthreads();
    for (uint32_t l = threadIdx.x; l < kItemsPerBlock; l += kThreads) {
      uint32_t row, g;
      item_coords(col_order, l, kItemsPerBlock, groups_padded, row, g);
      if (row < m && g < num_groups) {
        reinterpret_cast<float*>(scales)[(int64_t)row * stride_sm + (int64_t)g * stride_sg] = sscale[l];
      }
    }
  }

  if (kPacked) {
    __syncthreads();
    for (int w = threadIdx.x; w < kItemsPerBlock / 4; w += kThreads) {
      const uint32_t first = block_base + 4 * w;  // items of one word are consecutive and share a row
      if (first >= items) continue;
      const uint32_t word = (uint32_t)exps[4 * w] | ((uint32_t)exps[4 * w + 1] << 8) |
                            ((uint32_t)exps[4 * w + 2] << 16) | ((uint32_t)exps[4 * w + 3] << 24);
      const int64_t row = first / groups_padded, widx = (first % groups_padded) / 4;  // 32-bit div
      reinterpret_cast<int32_t*>(scales)[row * stride_sm + widx * stride_sg] = static_cast<int32_t>(word);
    }
  }
}

int64_t align4(int64_t v) { return (v + 3) / 4 * 4; }

Layout parse_layout(const std::string& s) {
  if (s == "row") return Layout::kRow;
  if (s == "col") return Layout::kCol;
  if (s == "col_tma") return Layout::kColTma;
  if (s == "ue8m0") return Layout::kUe8m0;
  TORCH_CHECK(false, "scale_layout must be one of row, col, col_tma, ue8m0; got '", s, "'");
  return Layout::kRow;  // unreachable
}

template <typename T, int VPT, int TPG, bool kInt8, bool kPacked, bool kPow2, int kThreads = kBlockThreads,
          int kItems = kItemsPerThread, int kLoad = 0>
void launch_typed(const at::Tensor& x, at::Tensor& q, at::Tensor& s, int64_t m, int64_t k, int64_t g, float eps,
                  float qmax, cudaStream_t stream) {
  const int64_t gp = kPacked ? align4(g) : g;
  constexpr int kItemsPerBlock = (kThreads / TPG) * kItems;
  // Column-major FP32 scales (col, col_tma; also row with one group, where both orders agree) go
  // in column order on a (group, row tile) grid, the rest in row order on a 1-D grid. One launch
  // per chunk of whole rows: 65535 row tiles (gridDim.y's limit) in column order, at most 2^30
  // items in row order (the kernel's 32-bit item index). A chunk starts x, q and the scales at
  // its first row (scales of both dtypes are 4-byte words).
  const bool col_order = !kPacked && m > 1 && s.stride(0) == 1;
  const int64_t chunk = col_order ? 65535 * (int64_t)kItemsPerBlock : std::max<int64_t>(1, (int64_t{1} << 30) / gp);
  const auto* xp = reinterpret_cast<const T*>(x.data_ptr());
  auto* qp = reinterpret_cast<uint8_t*>(q.data_ptr());
  auto* sp = reinterpret_cast<int32_t*>(s.data_ptr());
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = std::min(chunk, m - r0);
    const dim3 grid = col_order ? dim3((unsigned)gp, (unsigned)((rows + kItemsPerBlock - 1) / kItemsPerBlock))
                                : dim3((unsigned)((rows * gp + kItemsPerBlock - 1) / kItemsPerBlock));
    per_token_group_quant_kernel<T, VPT, TPG, kInt8, kPacked, kPow2, kThreads, kItems, kLoad>
        <<<grid, kThreads, 0, stream>>>(xp + r0 * k, qp + r0 * k, sp + r0 * s.stride(0), (uint32_t)rows, k,
                                        (uint32_t)g, (uint32_t)gp, s.stride(0), s.stride(1), eps, qmax, col_order);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename T, bool kInt8, bool kPacked, bool kPow2>
void dispatch_group(const at::Tensor& x, at::Tensor& q, at::Tensor& s, int64_t group, int64_t m, int64_t k,
                    int64_t g, float eps, float qmax, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vectors = group / kVec;  // 16-byte vectors per group
  // TPG = min(32, vectors) threads per group, VPT = vectors / TPG vectors per thread; except 16
  // vectors (group 128 of bf16/fp16): 8 threads x 2 vectors, one shuffle step fewer per group
  // (M=32768 on the H200: 3463 -> 3843 GB/s FP32, 3697 -> 4012 GB/s UE8M0).
#define RTP_CASE(V, TPG, VPT) \
  if (vectors == V) return launch_typed<T, VPT, TPG, kInt8, kPacked, kPow2>(x, q, s, m, k, g, eps, qmax, stream);
  RTP_CASE(4, 4, 1)
  RTP_CASE(8, 8, 1)
  RTP_CASE(16, 8, 2)
  RTP_CASE(32, 32, 1)
  RTP_CASE(64, 32, 2)
  RTP_CASE(128, 32, 4)
  RTP_CASE(256, 32, 8)
#undef RTP_CASE
  TORCH_CHECK(false, "group_size=", group, " is not supported for ", x.scalar_type(),
              " input (16-byte vectors per group must be a power of two in [4, 256])");
}

template <typename T>
void dispatch_flags(const at::Tensor& x, at::Tensor& q, at::Tensor& s, int64_t group, bool int8, bool packed,
                    bool pow2, int64_t m, int64_t k, int64_t g, float eps, float qmax, cudaStream_t stream) {
  if (int8) {
    if (pow2) return dispatch_group<T, true, false, true>(x, q, s, group, m, k, g, eps, qmax, stream);
    return dispatch_group<T, true, false, false>(x, q, s, group, m, k, g, eps, qmax, stream);
  }
  if (packed) return dispatch_group<T, false, true, true>(x, q, s, group, m, k, g, eps, qmax, stream);
  if (pow2) return dispatch_group<T, false, false, true>(x, q, s, group, m, k, g, eps, qmax, stream);
  return dispatch_group<T, false, false, false>(x, q, s, group, m, k, g, eps, qmax, stream);
}

void per_token_group_quant(const at::Tensor& x, at::Tensor& q, at::Tensor& scales, int64_t group_size,
                           const std::string& scale_layout, bool pow2, double eps) {
  const Layout layout = parse_layout(scale_layout);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor, got device ", x.device());
  TORCH_CHECK(q.device() == x.device(), "q must be on x's device ", x.device(), ", got ", q.device());
  TORCH_CHECK(scales.device() == x.device(), "scales must be on x's device ", x.device(), ", got ",
              scales.device());
  TORCH_CHECK(x.dim() == 2, "x must be 2-D [M, K], got ", x.dim(), "-D");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf || x.scalar_type() == at::kFloat,
              "x must be bfloat16, float16 or float32, got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous, got strides ", x.strides());
  TORCH_CHECK(q.scalar_type() == at::kFloat8_e4m3fn || q.scalar_type() == at::kChar,
              "q must be float8_e4m3fn or int8, got ", q.scalar_type());
  TORCH_CHECK(q.sizes() == x.sizes() && q.is_contiguous(), "q must be contiguous with x's shape ", x.sizes(),
              ", got shape ", q.sizes(), " strides ", q.strides());
  TORCH_CHECK(group_size > 0 && (group_size & (group_size - 1)) == 0,
              "group_size must be a positive power of two, got ", group_size);
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % group_size == 0, "x's last dimension K=", k, " is not divisible by group_size=", group_size);
  const int64_t vec = 16 / x.element_size();
  TORCH_CHECK(group_size % vec == 0 && group_size / vec >= 4,
              "group_size must be a multiple of 4 x the 16-byte vector width (", 4 * vec, " for ",
              x.scalar_type(), "), got ", group_size);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0, "x must be 16-byte aligned");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0, "q must be 16-byte aligned");
  TORCH_CHECK(eps > 0, "eps must be positive, got ", eps);
  const bool packed = layout == Layout::kUe8m0;
  const bool int8 = q.scalar_type() == at::kChar;
  TORCH_CHECK(!(packed && int8), "scale_layout='ue8m0' needs q of float8_e4m3fn, got int8");
  const int64_t g = k / group_size;
  const int64_t cols = packed ? (g + 3) / 4 : g;
  TORCH_CHECK(scales.scalar_type() == (packed ? at::kInt : at::kFloat), "scales must be ",
              packed ? "int32" : "float32", " for scale layout '", scale_layout, "', got ", scales.scalar_type());
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == m && scales.size(1) == cols, "scales must have shape [", m,
              ", ", cols, "] for scale layout '", scale_layout, "', got ", scales.sizes());
  int64_t want0, want1;
  switch (layout) {
    case Layout::kRow: want0 = cols; want1 = 1; break;
    case Layout::kCol: want0 = 1; want1 = m; break;
    default: want0 = 1; want1 = align4(m); break;
  }
  TORCH_CHECK((m <= 1 || scales.stride(0) == want0) && (cols <= 1 || scales.stride(1) == want1),
              "scales must have strides (", want0, ", ", want1, ") for scale layout '", scale_layout, "', got ",
              scales.strides());
  if (m == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const float qmax = int8 ? 127.f : 448.f;
  const bool round_pow2 = pow2 || packed;
  switch (x.scalar_type()) {
    case at::kBFloat16:
      return dispatch_flags<__nv_bfloat16>(x, q, scales, group_size, int8, packed, round_pow2, m, k, g, (float)eps,
                                           qmax, stream);
    case at::kHalf:
      return dispatch_flags<__half>(x, q, scales, group_size, int8, packed, round_pow2, m, k, g, (float)eps, qmax,
                                    stream);
    default:
      return dispatch_flags<float>(x, q, scales, group_size, int8, packed, round_pow2, m, k, g, (float)eps, qmax,
                                   stream);
  }
}

void per_token_group_quant_meta(const at::Tensor&, at::Tensor&, at::Tensor&, int64_t, const std::string&, bool,
                                double) {}

#ifdef RTP_FP8_TUNING
// bench/quant_sweep.py only (-DRTP_FP8_TUNING, a library of its own): group 128 of bf16 -> fp8 with
// the block size, groups per thread, threads per group (8: two vectors each, 16: one) and load
// kind (load16) given; the sweep validates its tensors through the real op first. (Scales stored
// by each group's first lane, without shared memory or a barrier, were slower: 23.6 -> 24.8 us
// row, 22.6 -> 22.8 us ue8m0 at M = 4096; docs/bench_quant_sweep_direct_2026-12-03i.json.)
void per_token_group_quant_cfg(const at::Tensor& x, at::Tensor& q, at::Tensor& s, const std::string& scale_layout,
                               int64_t threads, int64_t items, int64_t tpg, int64_t load) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.size(1) % 128 == 0, "tuning op: bf16, group 128");
  const bool packed = parse_layout(scale_layout) == Layout::kUe8m0;
  const int64_t m = x.size(0), k = x.size(1), g = k / 128;
  cudaStream_t st = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
#define RTP_CFG(TH, IT, TPG, LD)                                                                                   \
  if (threads == TH && items == IT && tpg == TPG && load == LD) {                                                  \
    if (packed)                                                                                                    \
      return launch_typed<__nv_bfloat16, 16 / TPG, TPG, false, true, true, TH, IT, LD>(x, q, s, m, k, g, 1e-10f,    \
                                                                                      448.f, st);                 \
    return launch_typed<__nv_bfloat16, 16 / TPG, TPG, false, false, false, TH, IT, LD>(x, q, s, m, k, g, 1e-10f,    \
                                                                                      448.f, st);                 \
  }
#define RTP_CFG_LOADS(TH, IT, TPG)                                        \
  RTP_CFG(TH, IT, TPG, 0) RTP_CFG(TH, IT, TPG, 1) RTP_CFG(TH, IT, TPG, 2) \
  RTP_CFG(TH, IT, TPG, 3) RTP_CFG(TH, IT, TPG, 4)
  RTP_CFG_LOADS(64, 1, 8) RTP_CFG_LOADS(128, 1, 8) RTP_CFG_LOADS(128, 2, 8) RTP_CFG_LOADS(256, 1, 8)
  RTP_CFG_LOADS(128, 1, 16) RTP_CFG_LOADS(128, 2, 16) RTP_CFG_LOADS(256, 2, 16)
#undef RTP_CFG_LOADS
#undef RTP_CFG
  TORCH_CHECK(false, "tuning op: no instance for threads=", threads, " items=", items, " tpg=", tpg, " load=", load);
}
#endif

}  // namespace ptgq
}  // namespace rtp_fp8

#ifdef RTP_FP8_TUNING
TORCH_LIBRARY(rtp_fp8_C_tuning, m) {
  m.def("cfg(Tensor x, Tensor(a!) q, Tensor(b!) scales, str scale_layout, int threads, int items, int tpg, "
        "int load) -> ()");
}
TORCH_LIBRARY_IMPL(rtp_fp8_C_tuning, CUDA, m) { m.impl("cfg", &rtp_fp8::ptgq::per_token_group_quant_cfg); }
#else
TORCH_LIBRARY(rtp_fp8_C, m) {
  m.def(
      "per_token_group_quant(Tensor x, Tensor(a!) q, Tensor(b!) scales, int group_size, str scale_layout, "
      "bool pow2, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(rtp_fp8_C, CUDA, m) { m.impl("per_token_group_quant", &rtp_fp8::ptgq::per_token_group_quant); }

TORCH_LIBRARY_IMPL(rtp_fp8_C, Meta, m) { m.impl("per_token_group_quant", &rtp_fp8::ptgq::per_token_group_quant_meta); }
#endif
