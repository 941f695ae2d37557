// A CPU stand-in for the few CUDA features gdn_main.cu uses, so that its kernels run on a machine without a GPU
// (kernels/cuda_emu.py builds them with g++; tests/test_cuda_emu.py runs them against float64). One OS thread per
// CUDA thread; blocks run one after another (static "__shared__" arrays are then each block's own); a warp's
// shuffles and __syncwarp are barriers of its 32 threads. Numerics: fp32 as on the GPU except __expf / __logf,
// which are the accurate expf / logf here (the GPU's approximations differ by a few ulp), and FMA contraction, which
// g++ is told not to do (-ffp-contract=off) where nvcc may. What this cannot show: races between warps or blocks,
// PDL, memory ordering; what it shows: indexing, control flow, and arithmetic against a reference.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

struct emu_dim3 {
    unsigned x, y, z;
};
extern thread_local emu_dim3 threadIdx, blockIdx;

struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(static_cast<uint32_t>(h.bits) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {  // round to nearest even, NaN kept quiet
    uint32_t u = __float_as_uint(f);
    if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<uint16_t>(u >> 16)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }

struct __half {
    _Float16 h;
};
inline float __half2float(__half x) { return static_cast<float>(x.h); }
inline __half __float2half_rn(float f) { return {static_cast<_Float16>(f)}; }
inline unsigned short __half_as_ushort(__half x) {
    unsigned short u;
    std::memcpy(&u, &x.h, 2);
    return u;
}
inline __half __ushort_as_half(unsigned short u) {
    __half x;
    std::memcpy(&x.h, &u, 2);
    return x;
}

template <typename T>
inline T __ldg(const T* p) { return *p; }
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }  // (bulk copies only)
inline float __expf(float x) { return std::exp(x); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {  // byte i of the result: byte (s >> 4i) & 7 of y:x
    const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
inline float __logf(float x) { return std::log(x); }
#include <math.h>  // (sqrtf, expf, logf, fmaxf, fminf in the global namespace)

// the running block's warps and block barrier (set by the runner before its threads start)
struct EmuWarp {
    std::barrier<> bar{32};
    uint64_t v[32];
    uint32_t frag[32][6];  // (emu_mma: every lane's fragment words at once)
};
extern EmuWarp* emu_warps;
extern std::barrier<>* emu_block_bar;
extern unsigned char emu_smem[];

inline void __syncwarp(unsigned = 0xffffffffu) { emu_warps[threadIdx.x / 32].bar.arrive_and_wait(); }
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
template <typename T>
inline T emu_shfl(T x, int src) {  // every lane of the warp takes part (the kernels call shuffles converged)
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes here");
    EmuWarp& w = emu_warps[threadIdx.x / 32];
    uint64_t b = 0;
    std::memcpy(&b, &x, sizeof(T));
    w.v[threadIdx.x % 32] = b;
    w.bar.arrive_and_wait();
    const uint64_t r = w.v[src & 31];
    w.bar.arrive_and_wait();
    T y;
    std::memcpy(&y, &r, sizeof(T));
    return y;
}
// d += A B of an mma.sync with 4 A words and 2 B words a lane (m16n8k16 f16 / bf16, m16n8k8 tf32), from the whole
// warp's fragments in one exchange (two barriers, where a shuffle per word took 32): lane (gid, tig) adds, for each
// k-group st (the words of the lanes with tig = st) and its columns 2 tig + c, term(a_lo, a_hi, b0, b1) of its rows
// gid (h 0: a0, a2) and gid + 8 (h 1: a1, a3) with column 2 tig + c's B words (held by the lanes with gid = that
// column); term sums the products the words hold, in the order the kernels wrote them
template <typename T>
inline void emu_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, T term) {
    EmuWarp& w = emu_warps[threadIdx.x / 32];
    const int lane = static_cast<int>(threadIdx.x % 32), gid = lane >> 2, tig = lane & 3;
    uint32_t* mine = w.frag[lane];
    for (int r = 0; r < 4; ++r) mine[r] = a[r];
    mine[4] = b0, mine[5] = b1;
    w.bar.arrive_and_wait();
    for (int st = 0; st < 4; ++st) {
        const uint32_t* ra = w.frag[4 * gid + st];
        for (int c = 0; c < 2; ++c) {
            const uint32_t* rb = w.frag[4 * (2 * tig + c) + st] + 4;
            for (int h = 0; h < 2; ++h) d[2 * h + c] += term(ra[h], ra[2 + h], rb[0], rb[1]);
        }
    }
    w.bar.arrive_and_wait();
}
inline unsigned __ballot_sync(unsigned, int pred) {  // (every lane takes part, as the kernels call it)
    EmuWarp& w = emu_warps[threadIdx.x / 32];
    w.v[threadIdx.x % 32] = pred != 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= static_cast<unsigned>(w.v[i] != 0) << i;
    w.bar.arrive_and_wait();
    return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T x, int m) { return emu_shfl(x, static_cast<int>(threadIdx.x % 32) ^ m); }
template <typename T>
inline T __shfl_sync(unsigned, T x, int src) { return emu_shfl(x, src); }
template <typename T>
inline T __shfl_down_sync(unsigned, T x, unsigned d) {  // a lane past the warp's end keeps its own value
    const int l = static_cast<int>(threadIdx.x % 32), s = l + static_cast<int>(d);
    return emu_shfl(x, s < 32 ? s : l);
}

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
