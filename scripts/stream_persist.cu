// Study kernels for scripts/stream_floor_study.py (arms "cupersist_*" and "cutile_*"): the plain decode step's memory
// pattern in CUDA for sm_90, (a) one block per item with the loads straight into registers (as gdn_main.cu's XL launch
// reads a tile), and (b) a persistent, warp-specialized, software-pipelined walk: one producer warp per block copies
// each item's operands into a ring of S shared-memory stages with bulk asynchronous copies (cp.async.bulk, completion
// counted on an mbarrier), and NC consumer warps compute from the stages, so the next items' slot, h, tile and records
// are in flight while this one computes. Not a decode kernel: it computes the study's item maths (the module docstring
// of stream_floor_study.py), which the study checks against float64 before it times anything:
//   for item w = (n, hv, iv) (iv fastest, then hv: rows outermost), BV rows of the V-tile iv:
//     slot = slot_idx[n] (-1: a padded row, output 0); rrow = ring_idx[n]; h = ring_h[rrow]
//     C = state[slot, hv, iv BV .. iv BV + BV, :]  (fp8 e4m3 codes, TILE_FP8, or bf16)
//     P = C q + U^T cq,  Q = C k + U^T ck,  out = P + (v - Q) / 2
//   with q, k the raw bf16 rows of x for the key head hv / (HV / H), cq, ck = coef[n, hv, 0 / 1, :], U = the h records
//   ring_u[rrow, hv, :h, iv BV ..] (fp32), v = x[n, 2 H K + hv V + iv BV ..] (bf16); out fp32 [B, HV, V].
// Two more forms (session 54), for the question the decode step's pre launch leaves: can the coefficients cq, ck be
// made inside a persistent main launch, beside its tile copies, instead of in a launch of their own before it?
//   (c) stream_pre + the per-item form (arms cutile_*_pre[_pdl]): a pre launch of one warp per (row, key head) makes
//       the coefficients of the key head's R_ = HV / H value heads from q, k and the h key records (below), then the
//       per-item form reads them (with PDL: its tile loads are issued before it waits for the pre launch);
//   (d) stream_group (arms cugroup_*): a persistent, warp-specialized walk over (row, key head) groups, each the R_
//       value heads' whole [V, K] tiles; the producer copies a group's tiles, records, key records, q, k, v and
//       decays into a stage, a coefficient warp makes the group's coefficients from the stage (COEF_WARP; without
//       it the producer copies the given ones), NCG consumer warps compute as above. No pre launch.
//   The coefficients (a stand-in for the real pre launch's, with its reads: the h key records of the key head, q, k
//   and the decays): for value head hv of key head i_h, j < h,
//       cq_j = e^{gt[n, hv] - G[rrow, hv, j]} <kr[rrow, i_h, j], q>,  ck_j = e^{gt[n, hv] - G[rrow, hv, j]} <kr[...], k>
//   with kr the bf16 key records, G their cumulative log decays (fp32) and gt the row's (fp32); 0 for j >= h.
// Layout of a consumer warp (every form): 16 consecutive rows of the tile, 4 at a time; lane l takes row (l / 8) of
// the four and columns [16 (l % 8), + 16); record positions 2 (l % 8) and + 1. The 8 lanes of a row reduce-scatter
// the 8 partial sums of their 4 rows (P and Q each), the even lane of each pair then finishes a row.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#ifndef TILE_FP8
#define TILE_FP8 1
#endif
#ifndef BV
#define BV 64
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef PERSIST
#define PERSIST 1  // 0: one block per item (cutile), no producer, loads straight from global memory
#endif
#ifndef GROUP
#define GROUP 0  // 1: this build holds stream_group (form d); 0: stream_persist and stream_pre (forms a-c)
#endif
#ifndef COEF_WARP
#define COEF_WARP 1  // (GROUP) 1: a coefficient warp makes the coefficients; 0: the producer copies the given ones
#endif
#ifndef NCG
#define NCG 8  // (GROUP) consumer warps; each takes 16-row blocks of the group's R_ x V rows in turn
#endif
#ifndef PDL
#define PDL 0  // (forms a, c) 1: stream_pre lets the per-item form start early, which waits before the coefficients
#endif
#define H_ 16
#define HV_ 32
#define K_ 128
#define V_ 128
#define CAP 16
#define NV (V_ / BV)
#define NC (BV / 16)  // consumer warps: 16 rows each
#define ESZ (TILE_FP8 ? 1 : 2)
#define TILE_BYTES (BV * K_ * ESZ)
// one stage: the tile, the records [CAP, BV] fp32, q and k (bf16), cq and ck, v (bf16), then (pad, h)
#define OFF_U TILE_BYTES
#define OFF_QK (OFF_U + CAP * BV * 4)
#define OFF_C (OFF_QK + 2 * K_ * 2)
#define OFF_V (OFF_C + 2 * CAP * 4)
#define OFF_META (OFF_V + ((BV * 2 + 15) / 16) * 16)
#define STAGE_BYTES (OFF_META + 16)
// form (d)'s stage: the R_ value heads' tiles, records [R_, CAP, V] fp32, the key records [CAP, K] bf16, q and k,
// v of the R_ heads (bf16), the decays G [R_, CAP], the coefficients [R_, 2, CAP], then (pad, h)
#define R_ (HV_ / H_)
#define GT_BYTES (R_ * V_ * K_ * ESZ)
#define G_OFF_U GT_BYTES
#define G_OFF_KEYS (G_OFF_U + R_ * CAP * V_ * 4)
#define G_OFF_QK (G_OFF_KEYS + CAP * K_ * 2)
#define G_OFF_V (G_OFF_QK + 2 * K_ * 2)
#define G_OFF_G (G_OFF_V + R_ * V_ * 2)
#define G_OFF_C (G_OFF_G + R_ * CAP * 4)
#define G_OFF_META (G_OFF_C + R_ * 2 * CAP * 4)
#define GSTAGE_BYTES (G_OFF_META + 16)
static_assert(GSTAGE_BYTES % 16 == 0 && (R_ * V_ * 2) % 16 == 0 && (R_ * CAP * 4) % 16 == 0, "16-byte copies");
static_assert(BV % 16 == 0 && BV <= V_, "BV: a multiple of 16 rows");
static_assert((BV * 4) % 16 == 0 && (BV * 2) % 16 == 0, "bulk copies move multiples of 16 bytes");

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this block's shared memory, counted on bar
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

// the lane's share of one tile row as loaded (columns COL0 / COL1 below): fp8 codes in one 16-byte word, bf16 in two.
// Loaded for all of a warp's rows before anything else (with PDL the per-item form then waits for the pre launch),
// decoded to fp32 where the dots need them.
// Under PDL the words are loaded with a plain ld.global: ptxas hoists griddepcontrol.wait above read-only (.nc)
// loads, which a __restrict__ const pointer gets, so the tile would only be loaded after the wait (ld16).
struct TileRaw {
    uint4 w[TILE_FP8 ? 1 : 2];
};
__device__ __forceinline__ uint4 ld16(const void* p) {
#if PDL
    uint4 r;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ TileRaw load_raw(const unsigned char* row, int s) {
    TileRaw t;
#if TILE_FP8
    t.w[0] = ld16(row + 16 * s);
#else
    const __nv_bfloat16* r = reinterpret_cast<const __nv_bfloat16*>(row);
    t.w[0] = ld16(r + 8 * s);
    t.w[1] = ld16(r + 64 + 8 * s);
#endif
    return t;
}
__device__ __forceinline__ void decode16(const TileRaw& t, float* f) {
#if TILE_FP8
    const uint32_t w[4] = {t.w[0].x, t.w[0].y, t.w[0].z, t.w[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
            const __nv_fp8x2_storage_t two = static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * hlf)) & 0xffffu);
            const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
            const float2 ff = __half22float2(*reinterpret_cast<const __half2*>(&hr));
            f[4 * i + 2 * hlf] = ff.x;
            f[4 * i + 2 * hlf + 1] = ff.y;
        }
    }
#else
    const uint32_t w[8] = {t.w[0].x, t.w[0].y, t.w[0].z, t.w[0].w, t.w[1].x, t.w[1].y, t.w[1].z, t.w[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
#endif
}
// 16 bf16 values as fp32: 8 at p0, 8 at p1 (16 bytes each)
__device__ __forceinline__ void load16_bf16(const __nv_bfloat16* p0, const __nv_bfloat16* p1, float* f) {
    const uint4 r0 = *reinterpret_cast<const uint4*>(p0), r1 = *reinterpret_cast<const uint4*>(p1);
    const uint32_t w[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
// 8 bf16 values at p (one 16-byte load) as fp32
__device__ __forceinline__ void load8_bf16(const __nv_bfloat16* p, float* f) {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
// the lane's 16 columns: fp8 tiles 16 s .. 16 s + 15 (one 16-byte access); bf16 tiles 8 s .. 8 s + 7 and
// 64 + 8 s .. 64 + 8 s + 7 (two 16-byte accesses, the 8 lanes of a row on 128 consecutive bytes each time)
#define COL0(s) (TILE_FP8 ? 16 * (s) : 8 * (s))
#define COL1(s) (TILE_FP8 ? 16 * (s) + 8 : 64 + 8 * (s))

// one consumer warp's share of an item: rows r0 .. r0 + 15 of the tile. The sources are generic pointers (shared
// memory for the persistent form, global for the per-item one): tile rows K_ * ESZ bytes apart, records u_stride
// floats apart, q and k, cq and ck (2 x CAP), v (BV bf16); h records valid. Writes out[0 .. BV) rows r0 ..
__device__ __forceinline__ void consume(const unsigned char* tile, const float* U, long long u_stride,
                                        const __nv_bfloat16* q, const __nv_bfloat16* k, const float* coef,
                                        const __nv_bfloat16* v, int h, float* out, int r0, int lane) {
    const int s = lane & 7, g = lane >> 3;
    TileRaw raw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = load_raw(tile + static_cast<long long>(r0 + 4 * i + g) * K_ * ESZ, s);
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the pre launch's coefficients are visible from here on
#endif
    float fq[16], fk[16];
    load16_bf16(q + COL0(s), q + COL1(s), fq);
    load16_bf16(k + COL0(s), k + COL1(s), fk);
    const int j0 = 2 * s;
    const float cq0 = j0 < h ? coef[j0] : 0.0f, cq1 = j0 + 1 < h ? coef[j0 + 1] : 0.0f;
    const float ck0 = j0 < h ? coef[CAP + j0] : 0.0f, ck1 = j0 + 1 < h ? coef[CAP + j0 + 1] : 0.0f;
    float val[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = r0 + 4 * i + g;
        float f[16];
        decode16(raw[i], f);
        float aq = 0.0f, ak = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            aq = fmaf(f[e], fq[e], aq);
            ak = fmaf(f[e], fk[e], ak);
        }
        const float u0 = j0 < h ? U[j0 * u_stride + row] : 0.0f;
        const float u1 = j0 + 1 < h ? U[(j0 + 1) * u_stride + row] : 0.0f;
        val[2 * i] = aq + u0 * cq0 + u1 * cq1;
        val[2 * i + 1] = ak + u0 * ck0 + u1 * ck1;
    }
    // reduce-scatter over the 8 lanes of the row group: lane s ends with value s (row s / 2; P if s even, else Q)
#pragma unroll
    for (int m = 4; m >= 1; m >>= 1) {
        const bool upper = (s & m) != 0;
#pragma unroll
        for (int i = 0; i < m; ++i) {
            const float lo = val[i], hi = val[i + m];
            val[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, m);
        }
    }
    const float Q = __shfl_down_sync(0xffffffffu, val[0], 1);
    if ((s & 1) == 0) {
        const int row = r0 + 4 * (s >> 1) + g;
        const float vv = __bfloat162float(v[row]);
        out[row] = val[0] + 0.5f * (vv - Q);
    }
}

// the coefficients' pointer: under PDL not __restrict__, so that their loads are not compiled as invariant and
// scheduled above griddepcontrol.wait (gdn_main.cu's load_pre says why)
#if PDL
#define COEF_RESTRICT
#else
#define COEF_RESTRICT __restrict__
#endif

// the coefficients' dots for key record j of a (row, key head): lanes j and j + 16 take its columns [0, 64) and
// [64, 128) (half = lane >> 4), 8 bf16 a 16-byte load from q, k and the record (global or shared memory); the
// record only where valid (j < h), zeros otherwise; the two halves summed, every lane ends with its j's dots
__device__ __forceinline__ void coef_dots(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* kr,
                                          bool valid, int half, float& dq, float& dk) {
    dq = 0.0f;
    dk = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const int col = 64 * half + 8 * c;
        float fq[8], fk[8], fr[8];
        load8_bf16(q + col, fq);
        load8_bf16(k + col, fk);
        if (valid) {
            load8_bf16(kr + col, fr);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) fr[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            dq = fmaf(fr[e], fq[e], dq);
            dk = fmaf(fr[e], fk[e], dk);
        }
    }
    dq += __shfl_xor_sync(0xffffffffu, dq, 16);
    dk += __shfl_xor_sync(0xffffffffu, dk, 16);
}

// The producer warp of both persistent forms: the slots, ring rows and h of 32 items at a time (lane j: item it0 + j,
// batch row row_of(it)), the next 32's loaded while this batch's copies are issued; per item, wait for its stage to be
// empty, then copy(it, stage, slot, ring row, h) (h at most CAP).
template <typename RowOf, typename Copy>
__device__ __forceinline__ void produce(int n_items, int lane, uint64_t* empty, const int* slot_idx,
                                        const int* ring_idx, const int* ring_h, RowOf row_of, Copy copy) {
    auto load_ids = [&](int it0, int& sl, int& rr) {
        const int it = it0 + lane;
        sl = -1;
        rr = 0;
        if (it < n_items) {
            const int n = row_of(it);
            sl = slot_idx[n];
            rr = ring_idx[n];
        }
    };
    int sl, rr, hh;
    load_ids(0, sl, rr);
    hh = sl >= 0 ? ring_h[rr] : 0;
    for (int it0 = 0; it0 < n_items; it0 += 32) {
        int nsl, nrr;
        load_ids(it0 + 32, nsl, nrr);  // (in flight through this batch)
        const int cnt = min(32, n_items - it0);
        for (int j = 0; j < cnt; ++j) {
            const int it = it0 + j, st = it % STAGES;
            if (it >= STAGES) mbar_wait(&empty[st], ((it / STAGES) - 1) & 1);
            const int slot = __shfl_sync(0xffffffffu, sl, j);
            const int rrow = __shfl_sync(0xffffffffu, rr, j);
            const int h = min(__shfl_sync(0xffffffffu, hh, j), CAP);
            copy(it, st, slot, rrow, h);
        }
        sl = nsl;
        rr = nrr;
        hh = sl >= 0 ? ring_h[rr] : 0;
    }
}

#if !GROUP
// (c) the pre launch: one warp per (row n, key head i_h) = blockIdx.x / H_, % H_; coef [B, HV, 2, CAP] of the key
// head's R_ value heads (nothing for a padded row, whose coefficients nobody reads)
extern "C" __global__ void __launch_bounds__(32)
    stream_pre(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ ring_k,
               const float* __restrict__ ring_g, const float* __restrict__ gt, const int* __restrict__ ring_h,
               const int* __restrict__ slot_idx, const int* __restrict__ ring_idx, float* __restrict__ coef,
               int stride_x) {
#if PDL
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the main launch may start its tile loads
#endif
    const int lane = threadIdx.x;
    const int n = blockIdx.x / H_, i_h = blockIdx.x % H_;
    if (slot_idx[n] < 0) return;
    const int rrow = ring_idx[n];
    const int h = min(ring_h[rrow], CAP);
    const int j = lane & 15, half = lane >> 4;
    const __nv_bfloat16* px = x + static_cast<long long>(n) * stride_x;
    float dq, dk;
    coef_dots(px + i_h * K_, px + H_ * K_ + i_h * K_,
              ring_k + ((static_cast<long long>(rrow) * H_ + i_h) * CAP + j) * K_, j < h, half, dq, dk);
    if (lane < 16) {
#pragma unroll
        for (int r = 0; r < R_; ++r) {
            const int hv = i_h * R_ + r;
            const float e =
                j < h ? __expf(gt[static_cast<long long>(n) * HV_ + hv] -
                               ring_g[(static_cast<long long>(rrow) * HV_ + hv) * CAP + j])
                      : 0.0f;
            float* c = coef + (static_cast<long long>(n) * HV_ + hv) * 2 * CAP;
            c[j] = e * dq;
            c[CAP + j] = e * dk;
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * (NC + PERSIST))
    stream_persist(const unsigned char* __restrict__ state, const __nv_bfloat16* __restrict__ x,
                   const float* COEF_RESTRICT coef, const float* __restrict__ ring_u, const int* __restrict__ ring_h,
                   const int* __restrict__ slot_idx, const int* __restrict__ ring_idx, float* __restrict__ out, int T,
                   int stride_x) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if !PERSIST
    // one block of NC warps per item, everything loaded straight from global memory
    {
        const int w = blockIdx.x;
        const int n = w / (HV_ * NV), hv = (w / NV) % HV_, iv = w % NV;
        float* o = out + (static_cast<long long>(n) * HV_ + hv) * V_ + iv * BV;
        const int slot = slot_idx[n];
        if (slot < 0) {
            if (lane < 16) o[warp * 16 + lane] = 0.0f;
            return;
        }
        const int rrow = ring_idx[n];
        const int h = min(ring_h[rrow], CAP);
        const unsigned char* tile =
            state + ((static_cast<long long>(slot) * HV_ + hv) * V_ + iv * BV) * K_ * ESZ;
        const __nv_bfloat16* px = x + static_cast<long long>(n) * stride_x;
        const int i_h = hv / (HV_ / H_);
        consume(tile, ring_u + (static_cast<long long>(rrow) * HV_ + hv) * CAP * V_ + iv * BV, V_, px + i_h * K_,
                px + H_ * K_ + i_h * K_, coef + (static_cast<long long>(n) * HV_ + hv) * 2 * CAP,
                px + 2 * H_ * K_ + hv * V_ + iv * BV, h, o, 16 * warp, lane);
    }
#else
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE_BYTES);
    uint64_t* empty = full + STAGES;
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(&full[st], 1);      // the producer's arrive (with the stage's byte count)
            mbar_init(&empty[st], NC);    // one arrive per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int n_items = T > static_cast<int>(blockIdx.x) ? (T - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    if (warp == NC) {
        // the producer (produce): per item its stage's meta, byte count and bulk copies
        auto item_of = [&](int it) { return static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x); };
        auto copy = [&](int it, int st, int slot, int rrow, int h) {
            const int w = item_of(it);
            const int n = w / (HV_ * NV), hv = (w / NV) % HV_, iv = w % NV;
            unsigned char* sb = smem + st * STAGE_BYTES;
            if (lane == 0) {
                int* meta = reinterpret_cast<int*>(sb + OFF_META);
                meta[0] = slot < 0;
                meta[1] = h;
                const unsigned bytes =
                    slot < 0 ? 0u : TILE_BYTES + h * BV * 4 + 2 * K_ * 2 + 2 * CAP * 4 + BV * 2;
                mbar_arrive_expect_tx(&full[st], bytes);
            }
            __syncwarp();
            if (slot >= 0) {
                const __nv_bfloat16* px = x + static_cast<long long>(n) * stride_x;
                const int i_h = hv / (HV_ / H_);
                if (lane < h) {
                    bulk_g2s(sb + OFF_U + lane * BV * 4,
                             ring_u + ((static_cast<long long>(rrow) * HV_ + hv) * CAP + lane) * V_ + iv * BV,
                             BV * 4, &full[st]);
                } else if (lane == 16) {
                    bulk_g2s(sb, state + ((static_cast<long long>(slot) * HV_ + hv) * V_ + iv * BV) * K_ * ESZ,
                             TILE_BYTES, &full[st]);
                } else if (lane == 17) {
                    bulk_g2s(sb + OFF_QK, px + i_h * K_, K_ * 2, &full[st]);
                } else if (lane == 18) {
                    bulk_g2s(sb + OFF_QK + K_ * 2, px + H_ * K_ + i_h * K_, K_ * 2, &full[st]);
                } else if (lane == 19) {
                    bulk_g2s(sb + OFF_C, coef + (static_cast<long long>(n) * HV_ + hv) * 2 * CAP, 2 * CAP * 4,
                             &full[st]);
                } else if (lane == 20) {
                    bulk_g2s(sb + OFF_V, px + 2 * H_ * K_ + hv * V_ + iv * BV, BV * 2, &full[st]);
                }
            }
        };
        produce(n_items, lane, empty, slot_idx, ring_idx, ring_h, [&](int it) { return item_of(it) / (HV_ * NV); }, copy);
    } else {
        for (int it = 0; it < n_items; ++it) {
            const int st = it % STAGES;
            mbar_wait(&full[st], (it / STAGES) & 1);
            const unsigned char* sb = smem + st * STAGE_BYTES;
            const int* meta = reinterpret_cast<const int*>(sb + OFF_META);
            const int w = static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x);
            const int n = w / (HV_ * NV), hv = (w / NV) % HV_, iv = w % NV;
            float* o = out + (static_cast<long long>(n) * HV_ + hv) * V_ + iv * BV;
            if (meta[0]) {
                if (lane < 16) o[warp * 16 + lane] = 0.0f;
            } else {
                const __nv_bfloat16* qk = reinterpret_cast<const __nv_bfloat16*>(sb + OFF_QK);
                consume(sb, reinterpret_cast<const float*>(sb + OFF_U), BV, qk, qk + K_,
                        reinterpret_cast<const float*>(sb + OFF_C), reinterpret_cast<const __nv_bfloat16*>(sb + OFF_V),
                        meta[1], o, 16 * warp, lane);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[st]);
        }
    }
#endif
}
#endif  // !GROUP

#if GROUP
// (d) the persistent walk over groups w = (row n, key head i_h) = (w / H_, w % H_), w = blockIdx.x + it gridDim.x:
// warps 0 .. NCG - 1 consume, warp NCG produces, warp NCG + 1 makes the coefficients (COEF_WARP). Per stage three
// mbarriers: full (the producer's copies, counted in bytes), ready (the coefficient warp's arrive: its coefficients
// are in the stage), empty (every consumer's arrive). coef: the given coefficients, read only without COEF_WARP.
extern "C" __global__ void __launch_bounds__(32 * (NCG + 1 + COEF_WARP))
    stream_group(const unsigned char* __restrict__ state, const __nv_bfloat16* __restrict__ x,
                 const float* __restrict__ coef, const float* __restrict__ ring_u, const int* __restrict__ ring_h,
                 const int* __restrict__ slot_idx, const int* __restrict__ ring_idx, float* __restrict__ out, int T,
                 int stride_x, const __nv_bfloat16* __restrict__ ring_k, const float* __restrict__ ring_g,
                 const float* __restrict__ gt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * GSTAGE_BYTES);
    uint64_t* ready = full + STAGES;
    uint64_t* empty = ready + STAGES;
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(&full[st], 1);     // the producer's arrive (with the stage's byte count)
            mbar_init(&ready[st], 1);    // the coefficient warp's arrive
            mbar_init(&empty[st], NCG);  // one arrive per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int n_items = T > static_cast<int>(blockIdx.x) ? (T - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    auto item_of = [&](int it) { return static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x); };
    if (warp == NCG) {
        // the producer (produce): per group its stage's meta, byte count and bulk copies
        auto copy = [&](int it, int st, int slot, int rrow, int h) {
            const int w = item_of(it);
            const int n = w / H_, i_h = w % H_, hv0 = i_h * R_;
            unsigned char* sb = smem + st * GSTAGE_BYTES;
            if (lane == 0) {
                int* meta = reinterpret_cast<int*>(sb + G_OFF_META);
                meta[0] = slot < 0;
                meta[1] = h;
                const unsigned bytes = slot < 0 ? 0u
                                                : GT_BYTES + R_ * h * V_ * 4 + h * K_ * 2 + 2 * K_ * 2 +
                                                      R_ * V_ * 2 + R_ * CAP * 4 + (COEF_WARP ? 0 : R_ * 2 * CAP * 4);
                mbar_arrive_expect_tx(&full[st], bytes);
            }
            __syncwarp();
            if (slot >= 0) {
                const __nv_bfloat16* px = x + static_cast<long long>(n) * stride_x;
                if (lane < R_) {  // the value heads' tiles
                    bulk_g2s(sb + lane * V_ * K_ * ESZ,
                             state + (static_cast<long long>(slot) * HV_ + hv0 + lane) * V_ * K_ * ESZ,
                             V_ * K_ * ESZ, &full[st]);
                } else if (lane < 2 * R_) {  // their h records
                    const int r = lane - R_;
                    if (h > 0)
                        bulk_g2s(sb + G_OFF_U + r * CAP * V_ * 4,
                                 ring_u + (static_cast<long long>(rrow) * HV_ + hv0 + r) * CAP * V_, h * V_ * 4,
                                 &full[st]);
                } else if (lane == 2 * R_) {  // the key head's h key records
                    if (h > 0)
                        bulk_g2s(sb + G_OFF_KEYS, ring_k + (static_cast<long long>(rrow) * H_ + i_h) * CAP * K_,
                                 h * K_ * 2, &full[st]);
                } else if (lane == 2 * R_ + 1) {
                    bulk_g2s(sb + G_OFF_QK, px + i_h * K_, K_ * 2, &full[st]);
                } else if (lane == 2 * R_ + 2) {
                    bulk_g2s(sb + G_OFF_QK + K_ * 2, px + H_ * K_ + i_h * K_, K_ * 2, &full[st]);
                } else if (lane == 2 * R_ + 3) {
                    bulk_g2s(sb + G_OFF_V, px + 2 * H_ * K_ + hv0 * V_, R_ * V_ * 2, &full[st]);
                } else if (lane == 2 * R_ + 4) {
                    bulk_g2s(sb + G_OFF_G, ring_g + (static_cast<long long>(rrow) * HV_ + hv0) * CAP,
                             R_ * CAP * 4, &full[st]);
                } else if (lane == 2 * R_ + 5 && !COEF_WARP) {
                    bulk_g2s(sb + G_OFF_C, coef + (static_cast<long long>(n) * HV_ + hv0) * 2 * CAP,
                             R_ * 2 * CAP * 4, &full[st]);
                }
            }
        };
        produce(n_items, lane, empty, slot_idx, ring_idx, ring_h, [&](int it) { return item_of(it) / H_; }, copy);
    } else if (warp == NCG + 1) {
        // the coefficient warp (COEF_WARP): per group, once its stage is full, the dots of q and k with the key
        // records (lanes j, j + 16: record j) and the decays, into the stage's coefficients; then ready
        for (int it = 0; it < n_items; ++it) {
            const int st = it % STAGES;
            const int w = item_of(it);
            const int n = w / H_, hv0 = (w % H_) * R_;
            float g_t[R_];
#pragma unroll
            for (int r = 0; r < R_; ++r) g_t[r] = gt[static_cast<long long>(n) * HV_ + hv0 + r];  // (before the wait)
            mbar_wait(&full[st], (it / STAGES) & 1);
            unsigned char* sb = smem + st * GSTAGE_BYTES;
            const int* meta = reinterpret_cast<const int*>(sb + G_OFF_META);
            if (!meta[0]) {
                const int h = meta[1], j = lane & 15, half = lane >> 4;
                const __nv_bfloat16* qk = reinterpret_cast<const __nv_bfloat16*>(sb + G_OFF_QK);
                float dq, dk;
                coef_dots(qk, qk + K_, reinterpret_cast<const __nv_bfloat16*>(sb + G_OFF_KEYS) + j * K_, j < h, half,
                          dq, dk);
                if (lane < 16) {
                    const float* G = reinterpret_cast<const float*>(sb + G_OFF_G);
                    float* c = reinterpret_cast<float*>(sb + G_OFF_C);
#pragma unroll
                    for (int r = 0; r < R_; ++r) {
                        const float e = j < h ? __expf(g_t[r] - G[r * CAP + j]) : 0.0f;
                        c[r * 2 * CAP + j] = e * dq;
                        c[r * 2 * CAP + CAP + j] = e * dk;
                    }
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&ready[st]);  // (release: the coefficients' stores are visible after it)
        }
    } else {
        // the consumers: the group's R_ x V / 16 blocks of 16 rows, block b = warp, warp + NCG, ...
        for (int it = 0; it < n_items; ++it) {
            const int st = it % STAGES;
            mbar_wait(&full[st], (it / STAGES) & 1);
#if COEF_WARP
            mbar_wait(&ready[st], (it / STAGES) & 1);
#endif
            const unsigned char* sb = smem + st * GSTAGE_BYTES;
            const int* meta = reinterpret_cast<const int*>(sb + G_OFF_META);
            const int w = item_of(it);
            const int n = w / H_, hv0 = (w % H_) * R_;
            for (int b = warp; b < R_ * (V_ / 16); b += NCG) {
                const int r = b / (V_ / 16), r0 = 16 * (b % (V_ / 16));
                float* o = out + (static_cast<long long>(n) * HV_ + hv0 + r) * V_;
                if (meta[0]) {
                    if (lane < 16) o[r0 + lane] = 0.0f;
                } else {
                    const __nv_bfloat16* qk = reinterpret_cast<const __nv_bfloat16*>(sb + G_OFF_QK);
                    consume(sb + r * V_ * K_ * ESZ, reinterpret_cast<const float*>(sb + G_OFF_U) + r * CAP * V_, V_,
                            qk, qk + K_, reinterpret_cast<const float*>(sb + G_OFF_C) + r * 2 * CAP,
                            reinterpret_cast<const __nv_bfloat16*>(sb + G_OFF_V) + r * V_, meta[1], o, r0, lane);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[st]);
        }
    }
}
#endif  // GROUP
