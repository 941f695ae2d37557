// The main launch of decode v3 for GDN, and for KDA with predecayed key records (IS_KDA), with an fp32 or bf16
// checkpoint and no read copy, written in CUDA for sm_90 (kernels/cuda_main.py builds and launches it;
// decode_v3.launch(main_impl="cuda") picks it). The pre launches that feed it (replay_gdn_pre, replay_kda_pre: one
// warp per (row, key head), decode_v3.launch(pre_impl="cuda")) are at the end of the file, in the same module.
//
// It computes exactly what decode_v3's Triton main launch (_main_tile, no read copy) computes,
// for one (row, value head, V-tile) per block, and takes the pre launch's coefficients (coef, scal) the same way:
//   Cq = C q~ e^{G_t}, Ck = C k~ e^{G_t}                     (C the [V, K] checkpoint tile, q~ = scale q/|q|,
//                                                              k~ = k/|k|, e^{G_t} from scal)
//   u_t = beta (v - Ck - sum_j u_j ck_j),  o = Cq + sum_j u_j cq_j + u_t <k~, q~>
//   flush / pre-fold: C <- C e^{G_f} + sum_{j<h} u_j e^{G_f - G_j} k_j^T (+ u_t k~^T on a flush), stored
//   no flush: u_t appended to the ring at h_eff.
// KDA (IS_KDA; the ring's keys predecayed, k_j e^{-G_j}, docs/design.md "Pre-decayed KDA keys"): the decay is per K
// column, so there is no scalar e^{G_t}: each lane makes e^{G_t} of its 4 columns (G_t = G_{h-1} + g_t, SGLang's KDA
// gate) and multiplies its q and k by it before the tile's dots; the fold decays the tile by e^{G_f} per column and
// every record key by the same e^{G_f} (applied in two halves, e^{G_f/2} twice, as the Triton launches do), with no
// per-record weight; the pre launch's overflow flags (ovf) turn a pre-fold into a flush or rebase one head. With
// GT_PRE (the "_gp" shapes, KDA's defaults) G_t comes from the pre launch's scratch (gts) instead, after the wait.
// What differs is how the tile moves and where the fold runs. LOAD_REG = 1 (the default shapes, "g*"): each lane
// loads its 16 bytes of each of the warp's 8 rows straight into registers, all in flight at once, and every load
// that does not need the tile (records, value, beta, the pre launch's coefficients, a folding row's G and gate
// inputs) is issued before the dots, so the epilogue waits on as few round trips as possible; a folding row reads
// its tile again (from L2) and its record keys four at a time. LOAD_REG = 0 ("r*", the first version, slower on
// the H200): one thread per warp copies the warp's rows into shared memory with one bulk asynchronous copy
// (cp.async.bulk). Either way the fold is fp32 CUDA-core FMAs (no tensor-core splits) and 16-byte stores.
// docs/design.md, "Session 26", has what each form measured.
//
// Layout: lane l of a warp owns K columns [4l, 4l + 4) (K = 128); a warp owns RPW consecutive V-rows; after the
// tile dots a butterfly reduce-scatter leaves row (l mod RPW) of the warp's rows in lane l, which then computes
// that row's output and record. Compile-time parameters come as -D macros (cuda_main.py): the shapes, the
// block's shape, which optional arguments the launch has, and the element types of the tensors (ST_T: the
// checkpoint's, float or __nv_bfloat16; a bf16 checkpoint is read and written four elements per lane as one 8-byte
// access, computed on in fp32 and rounded to nearest where the fold stores it).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#ifndef H_
#error "cuda_main.py passes the shapes: -DH_=.. -DHV_=.. -DV_=.. -DCAP_=.. -DBC_=.. -DRPW=.. -DNWARPS=.."
#endif
#define K_ 128
#ifndef IS_KDA
#define IS_KDA 0  // 1: KDA (per-K decay, predecayed key records, the pre launch's overflow flags)
#endif
#ifndef GT_PRE
#define GT_PRE 0  // KDA: G_t per column read from the pre launch's scratch (gts) after the wait, not made per warp
#endif
#if GT_PRE && !IS_KDA
#error "GT_PRE is KDA's (GDN's e^{G_t} is one scalar per head, in scal)"
#endif
#ifndef USE_LOWER_BOUND
#define USE_LOWER_BOUND 0  // KDA's safe gate g = lower_bound sigmoid(e^{A_log} (a + dt_bias)) instead of SGLang's
#endif
#ifndef ST_T
#define ST_T float  // the checkpoint's element type (cuda_main.py passes it)
#endif
#ifndef LOAD_REG
#define LOAD_REG 0  // 1: the tile is loaded into registers (RPW 16- or 8-byte loads per lane) instead of shared memory
#endif
#ifndef LATE_COEF
#define LATE_COEF 0  // 1: the pre launch's coefficients loaded after the tile's dots (the first version's order)
#endif
#ifndef MINB
#define MINB 1  // __launch_bounds__'s minimum blocks per SM (a register cap: 65536 / (MINB x block threads))
#endif
#ifndef DIAG_STREAM
#define DIAG_STREAM 0  // benchmark diagnostics, wrong results: 1 stop after the tile dots (output C q~ + C k~),
#endif             // 2 everything but the fold
#ifndef XL
#define XL 0  // 1: the eight-lanes-per-row layout (replay_gdn_main below, "x" shapes): GDN only, the tile in registers
#endif
#ifndef NCH
#define NCH 1  // XL: V-tiles of RPW x NWARPS rows a block walks in turn (its setup paid once, the next tile prefetched)
#endif
#ifndef SELF_PRE
#define SELF_PRE 0  // XL, GDN: no pre launch; every warp makes the pre launch's coefficients of its (row, value head)
#endif              // itself, and one block per head appends the token's record (docs/design.md "Session 37");
                    // 2 (session 47): the block's warps share the record dots (warp w's group g dots position 4 w + g,
                    // one barrier; 4 NWARPS >= CAP_), made after the tile's dots, and the checkpoint's tile is loaded
                    // where the pre launch's shapes load it; MMA_FOLD may go with it
#if SELF_PRE < 0 || SELF_PRE > 2
#error "SELF_PRE is 0, 1 (each warp its own record dots) or 2 (the block's warps share them)"
#endif
#if SELF_PRE && (IS_KDA || !XL || RPW != 16 || LATE_COEF || USE_PDL || CAP_ > 16)
#error "SELF_PRE: GDN's XL layout with 16 rows per warp, a ring capacity of at most 16, no pre launch to wait for"
#endif
#if SELF_PRE
#define SP_CONST  // (the main launch appends the token's record: it writes ring_k and ring_g)
#else
#define SP_CONST const
#endif
#ifndef TRIGGER_POST
#define TRIGGER_POST 0  // 1: the main launch lets its programmatic dependent (the post launch, decode_v3) start at once
#endif              // (griddepcontrol.launch_dependents first thing; the post launch waits for it to finish before
                    // it reads anything: session 48)
#ifndef PRE_EARLY
#define PRE_EARLY 0  // 1: the CUDA pre launches issue what does not wait for the slot (q, k, the gate inputs) before the
#endif               // slot, the G records with the key records, and a bf16 key record's four columns as one load,
                     // so that a warp's chain is slot -> h -> records (session 49)
#ifndef PRE_EARLY_F32
#define PRE_EARLY_F32 0  // > 0 (with PRE_EARLY, fp32 records): the first PRE_EARLY_F32 key records (at most 8: 4
#endif                   // registers each) loaded beside the G records too, the rest where the dots need them
                         // (session 50; without it an fp32 record is loaded only at its dot, after the stores)
#if PRE_EARLY_F32 > 8
#error "PRE_EARLY_F32 holds at most 8 records (32 registers, as a bf16 build's 16 record words)"
#endif
#ifndef PRE_PF
#define PRE_PF 0  // > 0: the pre launch's warps of batch rows [0, PRE_PF) also prefetch into L2 the tiles the main launch
#endif            // reads first (its rows outermost: those rows' blocks are dispatched first), while the pre launch
                  // waits on its own loads and the memory is idle (session 49)
#ifndef REC_SPLIT
#define REC_SPLIT 0  // 1: fp32 records kept as two 16-bit planes (session 51): U_T and KR_T are the high plane, each
#endif               // element's bf16 rounded to nearest (what every dot and output reads: half an fp32 record's
                     // bytes), and ring_u_lo / ring_k_lo hold the low 16 bits of its fp32 bits, so that a fold reads
                     // both and folds the exact fp32 record (rec_join); a record is written to both planes (by the
                     // pre launch, or under SELF_PRE by the main launch)
#if REC_SPLIT && !XL
#error "REC_SPLIT: the XL layout"
#endif
#ifndef VEC_U
#define VEC_U 0  // 1 (the XL layout): a lane's RPL value records at one position, consecutive in the ring, read as one
#endif           // vector load (16 bytes fp32, 8 bf16 at RPL 4) instead of RPL element loads; likewise its rows'
                 // fp8 scales, and its positions' coefficients from the pre launch in pairs (session 52). 2: the
                 // same loads with no branch: a position at or past h loads position 0's vector (a row with a
                 // record reads it anyway) and takes zeros by a select (session 55: at 1 KDA's build put each load in a branch of its own,
                 // whose use waits for it before the next is issued)
#if VEC_U && !XL
#error "VEC_U: the XL layout"
#endif
#ifndef TILE_EARLY
#define TILE_EARLY 0  // 1 (the XL layout, under USE_PDL): the tile's 16-byte words are loaded with a plain ld.global, not
#endif                // __ldg: ptxas hoists griddepcontrol.wait above read-only (.nc) loads, and for KDA's shapes it
                      // moved the tile's loads below the wait, so a block that started early held nothing (session 54)
#ifndef LEAD_PDL
#define LEAD_PDL 0  // 1: the step's first launch (the pre launch; the main launch under SELF_PRE) is a programmatic
#endif              // dependent of whatever ran before it on the stream and waits for it first thing, so only its
                    // launch and dispatch overlap that kernel's end (session 48)
#ifndef HAS_RC
#define HAS_RC 0  // XL: a read copy of the checkpoint (issue 7; per ring row: rc [rows, HV, V, K], rc_valid [rows]):
#endif            // a row that writes no checkpoint this step reads it, a folding row the checkpoint (and writes both)
#ifndef RC_LEAN
#define RC_LEAN 0  // with a read copy: the tile's registers sized for the copy's words, not the checkpoint's; a folding
#endif             // block reads its fp32 tile for the dots one 16-byte word per row at a time and folds 4 rows at a
                   // time, so that the common path (the copy's rows) fits a smaller register budget (session 40)
#if RC_LEAN && (!HAS_RC || NCH != 1 || SELF_PRE == 1)
#error "RC_LEAN: a read copy, one V-tile per block, the pre launch's coefficients or SELF_PRE 2 (not 1)"
#endif
#ifndef RC_FP8
#define RC_FP8 0  // the read copy holds fp8 e4m3 codes (RC_T unsigned char) and one fp32 scale per V-row (rc_scale
#endif            // [rows, HV, V]); else bf16 values (RC_T __nv_bfloat16)
#ifndef RC_MMA
#define RC_MMA 0  // RC_LEAN, and a copy block's tile dots on the tensor cores (session 41): each warp's 16 rows x 128
#endif            // columns (e4m3 codes as f16, or bf16 values) times the pre launch's split operand [q_hi, q_lo,
                  // k_hi, k_lo] of q / |q| and k / |k| (KDA: times e^{G_t}; qk_frag, the main launch's last
                  // parameter), mma.sync m16n8k16 with fp32 sums; no q, k staging or norms
#if RC_MMA && (!RC_LEAN || RPW != 16 || LATE_COEF || K_ != 128 || SELF_PRE)
#error "RC_MMA: RC_LEAN, 16 rows per warp, the coefficients before the dots, K = 128, the pre launch's operand"
#endif
#ifndef ST_MMA
#define ST_MMA 0  // a bf16 checkpoint without a read copy: every block's tile dots on the tensor cores as RC_MMA's
#endif            // (session 42); no q, k staging (a folding block loads k for its fold), the fold as before
#if ST_MMA && (HAS_RC || !XL || RPW != 16 || LATE_COEF || NCH != 1 || SELF_PRE || K_ != 128)
#error "ST_MMA: the XL layout, a bf16 checkpoint and no read copy, 16 rows per warp, one V-tile per block, the pre launch's coefficients before the dots, K = 128"
#endif
#ifndef MMA_FOLD
#define MMA_FOLD 0  // XL: a folding warp's fold on the tensor cores (session 43; fold_mma): its 16 rows x 128 columns
#endif              // take the records as products of 16 (bf16) or 2 x 8 (tf32) records per 8 columns
#if MMA_FOLD && (!XL || RPW != 16 || CAP_ > 16 || SELF_PRE == 1 || K_ != 128)
#error "MMA_FOLD: the XL layout, 16 rows per warp, a ring capacity of at most 16, no SELF_PRE 1, K = 128"
#endif
#ifndef FOLD_OUT
#define FOLD_OUT 0  // RC_LEAN (session 57): a block whose rows flush from the checkpoint (the token folded in) takes
#endif              // its outputs from the fold: each batch of a warp's rows is folded first, then dotted with q~, k~
                    // as it stands in registers (P = S' q~, Q = S' k~ of the folded S' without the token), then
                    // u_t = beta (v - Q) and o = P + u_t <k~, q~> and the token's u_t k~ added before the stores. So
                    // the checkpoint is read once, by the fold, where the copy-sized registers otherwise read it twice:
                    // word by word for the dots (NACC serial round trips), then again to fold. FOLD_OUT 2: such a
                    // block folds 8 rows at a time, not 4 (twice the checkpoint's loads in flight); 3: 4 at a time,
                    // the next 4 rows' loads issued before these are folded
#if FOLD_OUT && (!RC_LEAN || MMA_FOLD || REC_SPLIT || LATE_COEF || SELF_PRE)
#error "FOLD_OUT: RC_LEAN (a read copy), the CUDA-core fold (no MMA_FOLD), whole records (no REC_SPLIT), the coefficients before the dots (no LATE_COEF, no SELF_PRE)"
#endif
#ifndef FLUSH_FIRST
#define FLUSH_FIRST 0  // 1 (session 59): the main launch's blocks of batch rows FF_FROM .. B - 1 take their row from
#endif                 // the order the CUDA pre launch writes (order_rows): the rows that fold this step first, so
                       // that their long blocks start early and the launch ends on short ones. Rows below FF_FROM
                       // keep their place: those blocks start while the pre launch runs and load their tiles ahead
                       // of its wait
#ifndef FF_FROM
#define FF_FROM 16  // FLUSH_FIRST: the batch rows that keep their place (the first blocks dispatched)
#endif
#ifndef FF_RPL
#define FF_RPL 8  // FLUSH_FIRST: batch rows per lane whose flags order_rows loads at once (32 FF_RPL rows a round)
#endif
#if FLUSH_FIRST && (!XL || SELF_PRE || CAP_ > 16 || BC_ > 16 || FF_FROM < 0)
#error "FLUSH_FIRST: the XL layout with the CUDA pre launch (no SELF_PRE; ring capacity at most 16), FF_FROM >= 0"
#endif
#define TC_DOTS (RC_MMA || ST_MMA)               // the tile's dots on the tensor cores (either form)
#define MMA_BF16 (ST_MMA || (RC_MMA && !RC_FP8))  // their A is bf16 values (else e4m3 codes widened to f16)
#ifndef RC_T
#define RC_T unsigned char  // (unused without HAS_RC)
#endif
#if HAS_RC && !XL
#error "a read copy is read by the XL layout only"
#endif
#if XL && ((IS_KDA && (!GT_PRE || LATE_COEF)) || !LOAD_REG || (RPW != 8 && RPW != 16) || (CAP_ % 8) != 0)
#error "XL reads the tile into registers, 8 or 16 rows per warp, a ring capacity that is a multiple of 8; KDA's G_t from the pre launch, waited for early"
#endif
#if !XL && NCH != 1
#error "NCH is XL's"
#endif
#define KB 4       // LOAD_REG's fold: record keys loaded KB at a time (CAP_ a multiple of KB)
#if LOAD_REG && (CAP_ % KB) != 0
#error "LOAD_REG needs a ring capacity that is a multiple of KB"
#endif
#define VT (RPW * NWARPS)
#define HK_ (IS_KDA ? HV_ : H_)  // key heads of the ring's key records (KDA: one per value head)
#define NG (32 / RPW)      // lanes per row after the reduction: each holds JPL of the row's CAP record positions
#define JPL (CAP_ / NG)
#if !XL && (CAP_ % (4 * NG)) != 0
#error "the ring capacity must be a multiple of 4 x (32 / RPW): each lane loads its records' coefficients as float4"
#endif
static_assert(LOAD_REG || sizeof(ST_T) == 4, "a bf16 checkpoint is read into registers (LOAD_REG 1)");
static_assert(LOAD_REG || !IS_KDA, "KDA is written for the tile in registers (LOAD_REG 1)");
static_assert(!HAS_RC || sizeof(ST_T) == 4, "a read copy is kept beside an fp32 checkpoint only");
static_assert(!ST_MMA || sizeof(ST_T) == 2, "ST_MMA reads a bf16 checkpoint (an fp32 one: RC_MMA's read copy)");
#if (V_ % (VT * NCH)) != 0
#error "the V-tile (times NCH) must divide V"
#endif
#if RPW != 8 && RPW != 16 && RPW != 32
#error "RPW must be 8, 16 or 32"
#endif

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f(float* p, float x) { *p = x; }
__device__ __forceinline__ void from_f(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void from_f(__half* p, float x) { *p = __float2half_rn(x); }
// x rounded to T's precision and back (GDN's beta is rounded through b's dtype, as SGLang's kernels do)
__device__ __forceinline__ float round_as(float x, float*) { return x; }
__device__ __forceinline__ float round_as(float x, __nv_bfloat16*) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float round_as(float x, __half*) { return __half2float(__float2half_rn(x)); }

// one 16-byte word of the XL tile (the checkpoint's or the read copy's): __ldg, or under TILE_EARLY (with PDL) a plain
// ld.global, which ptxas keeps above the PDL wait where the source issues it (the emulation has no PDL: __ldg)
__device__ __forceinline__ uint4 ld_tile16(const void* p) {
#if TILE_EARLY && USE_PDL
    uint4 r;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

// four consecutive checkpoint elements (16-byte aligned for fp32, 8-byte for bf16) as fp32, in one access
__device__ __forceinline__ float4 ld_state4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 ld_state4(const __nv_bfloat16* p) {
    const uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void st_state4(float* p, float4 x) { *reinterpret_cast<float4*>(p) = x; }
__device__ __forceinline__ void st_state4(__nv_bfloat16* p, float4 x) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 r;
    r.x = *reinterpret_cast<uint32_t*>(&lo);
    r.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = r;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// one bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared, completing on bar
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(phase)
        : "memory");
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) x += __shfl_xor_sync(0xffffffffu, x, s);
    return x;
}

// word i (0-3) of a 16-byte word
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

#if TC_DOTS
// The tensor-core dots (RC_MMA, ST_MMA). mma.sync m16n8k16 (f16 or bf16 in, fp32 sums), PTX ISA's fragments, lane =
// 4 gid + tig: A (16 x 16, rows): a0 = (row gid; k 2 tig, 2 tig + 1), a1 = (row gid + 8; same k), a2 = (row gid; k
// 2 tig + 8, 2 tig + 9), a3 = (row gid + 8; those k); B (16 x 8, columns): b0 = (k 2 tig, 2 tig + 1; column gid), b1
// = (k 2 tig + 8, 2 tig + 9; column gid); D: d0, d1 = (row gid; columns 2 tig, 2 tig + 1), d2, d3 = (row gid + 8;
// same columns); in each 16-bit pair the lower k (or column) in the low half. A dot over K may take its K in any
// order that A and B share: K-step s of lane tig holds the tile's columns mma_col(tig, s) .. + 3 (k 2 tig, 2 tig + 1,
// 2 tig + 8, 2 tig + 9 in that order), so that each lane reads 16-byte runs of a row, MMA_SPR K-steps per run: fp8
// codes (1 byte) 4 K-steps per run, runs [16 tig, + 16) and [64 + 16 tig, + 16); bf16 values (2 bytes) 2 K-steps per
// run, runs [8 tig + 32 r, + 8) for r = 0 .. 3 (the 4 lanes of a gid read 64 contiguous bytes of a row per run).
#define MMA_EB (MMA_BF16 ? 2 : 1)  // bytes of an A element
#define MMA_SPR (4 / MMA_EB)       // K-steps per 16-byte run
#define MMA_NRUN (8 / MMA_SPR)     // runs per row per lane (fp8 2, bf16 4): a lane holds 2 MMA_NRUN words
__device__ __forceinline__ int mma_col(int tig, int s) {
    return (s / MMA_SPR) * (64 / MMA_EB) + (16 / MMA_EB) * tig + 4 * (s % MMA_SPR);
}
#define FRAG_WORDS (16 * 8 * 2)  // the operand per (row, key head): lanes 0-15 (columns 0-3), 8 K-steps, 2 words

// two e4m3 codes (the low one at the lower address) as an f16 pair (exactly: every e4m3 value is a half)
__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t codes) {
#ifdef __CUDA_ARCH__
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<unsigned short>(codes)));
    return h;
#else
    uint32_t r = 0;
    for (int d = 0; d < 2; ++d) {
        const uint32_t c = (codes >> (8 * d)) & 0xffu;
        const float f = __uint_as_float(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)) * 0x1p120f;
        r |= static_cast<uint32_t>(__half_as_ushort(__float2half_rn(f))) << (16 * d);
    }
    return r;
#endif
}

// the 16-bit element type of the fragments (MMA_BF16: bf16, else f16): a float rounded to nearest as its bits, and
// the float of the low or high half of a 32-bit pair
__device__ __forceinline__ uint32_t mma_bits(float x) {
#if MMA_BF16
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    return *reinterpret_cast<const unsigned short*>(&b);
#else
    return __half_as_ushort(__float2half_rn(x));
#endif
}
__device__ __forceinline__ float mma_float(uint32_t bits16) {
#if MMA_BF16
    return __uint_as_float(bits16 << 16);
#else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
#endif
}
__device__ __forceinline__ float h_lo(uint32_t w) { return mma_float(w & 0xffffu); }
__device__ __forceinline__ float h_hi(uint32_t w) { return mma_float(w >> 16); }

// d += A B (the fragments above); the CPU emulation (kernels/cuda_emu.py) forms the same sums from the fragments'
// definition, through shuffles
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int lane) {
#ifdef __CUDA_ARCH__
#if MMA_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
#else
    (void)lane;  // (the k of lanes with tig = st: 2 st, 2 st + 1 in a0 / a1 and b0, + 8 in a2 / a3 and b1)
    emu_mma(d, a, b0, b1, [](uint32_t x, uint32_t y, uint32_t p, uint32_t q) {
        return h_lo(x) * h_lo(p) + h_hi(x) * h_hi(p) + h_lo(y) * h_lo(q) + h_hi(y) * h_hi(q);
    });
#endif
}

// the A fragment of K-step st from a lane's tile words (rw: run r of row gid at rw[r], of row gid + 8 at
// rw[MMA_NRUN + r]): fp8, one word of each row holds the step's 4 codes, widened to f16 pairs; bf16, two words of each
template <typename W>
__device__ __forceinline__ void mma_a_frag(uint32_t (&af)[4], const W& rw, int st) {
    const uint4 r0 = rw(st / MMA_SPR), r1 = rw(MMA_NRUN + st / MMA_SPR);
#if MMA_BF16
    const int q = 2 * (st % MMA_SPR);
    af[0] = word_of(r0, q), af[1] = word_of(r1, q), af[2] = word_of(r0, q + 1), af[3] = word_of(r1, q + 1);
#else
    const uint32_t w0 = word_of(r0, st % MMA_SPR), w1 = word_of(r1, st % MMA_SPR);
    af[0] = e4m3x2_to_h2(w0 & 0xffffu), af[1] = e4m3x2_to_h2(w1 & 0xffffu), af[2] = e4m3x2_to_h2(w0 >> 16),
    af[3] = e4m3x2_to_h2(w1 >> 16);
#endif
}
#endif

// v[i] holds this lane's part of value i (i < P); returns the sum over the warp's lanes of value (lane mod P)
template <int P>
__device__ __forceinline__ float reduce_scatter(float (&v)[P], int lane) {
#pragma unroll
    for (int s = 16; s >= P; s >>= 1) {
#pragma unroll
        for (int i = 0; i < P; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], s);
    }
#pragma unroll
    for (int s = P / 2; s >= 1; s >>= 1) {
        const bool upper = (lane & s) != 0;
#pragma unroll
        for (int i = 0; i < s; ++i) {
            const float send = upper ? v[i] : v[i + s];
            const float keep = upper ? v[i + s] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, s);
        }
    }
    return v[0];
}

template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
    return make_float4(to_f(p[0]), to_f(p[1]), to_f(p[2]), to_f(p[3]));
}
template <>
__device__ __forceinline__ float4 load4<float>(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
// four consecutive elements as fp32 with no alignment assumed (KDA's gate inputs: a may be a strided view)
template <typename T>
__device__ __forceinline__ float4 load4_any(const T* p) {
    return make_float4(to_f(p[0]), to_f(p[1]), to_f(p[2]), to_f(p[3]));
}
// N consecutive records as fp32 from one vector load (VEC_U: a lane's RPL value records at one position; p is a
// multiple of N elements, which cuda_main.launch checks for the ring's base and rows)
template <int N>
__device__ __forceinline__ void load_run(const float* p, float (&f)[N]) {
    static_assert(N == 2 || N == 4, "VEC_U: 2 or 4 rows per lane");
    if constexpr (N == 4) {
        const float4 w = *reinterpret_cast<const float4*>(p);
        f[0] = w.x, f[1] = w.y, f[2] = w.z, f[3] = w.w;
    } else {
        const float2 w = *reinterpret_cast<const float2*>(p);
        f[0] = w.x, f[1] = w.y;
    }
}
template <int N>
__device__ __forceinline__ void load_run(const __nv_bfloat16* p, float (&f)[N]) {
    static_assert(N == 2 || N == 4, "VEC_U: 2 or 4 rows per lane");
    if constexpr (N == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        f[0] = __uint_as_float(w.x << 16), f[1] = __uint_as_float(w.x & 0xffff0000u);
        f[2] = __uint_as_float(w.y << 16), f[3] = __uint_as_float(w.y & 0xffff0000u);
    } else {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
        f[0] = __uint_as_float(w << 16), f[1] = __uint_as_float(w & 0xffff0000u);
    }
}
// four bf16 in two words, element 0 in the low half of w.x (PRE_EARLY's key records: a record's row starts at a
// multiple of K_ elements and a lane's columns at a multiple of 4, so a bf16 lane's four are one aligned 8-byte load)
__device__ __forceinline__ float4 bf16x4_of(uint2 w) {
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xffff0000u));
}
#if REC_SPLIT
static_assert(sizeof(U_T) == 2 && sizeof(KR_T) == 2 && sizeof(ST_T) == 4,
              "REC_SPLIT: bf16 high planes (U_T, KR_T) beside an fp32 checkpoint");
// x's fp32 bits b as two 16-bit halves: hi = (b + 0x8000) >> 16 (the bf16 nearest to x, ties away from zero) and lo
// = b & 0xffff. Then b = (hi << 16) + lo taken as a signed 16-bit value: exact, with no bit to spare
__device__ __forceinline__ void rec_store(U_T* hi, unsigned short* lo, float x) {
    const uint32_t b = __float_as_uint(x);
    *reinterpret_cast<unsigned short*>(hi) = static_cast<unsigned short>((b + 0x8000u) >> 16);
    *lo = static_cast<unsigned short>(b & 0xffffu);
}
// the token's key record, this lane's 4 columns, into both planes
__device__ __forceinline__ void store_key(KR_T* dst, unsigned short* lo, float4 k) {
    rec_store(dst, lo, k.x);
    rec_store(dst + 1, lo + 1, k.y);
    rec_store(dst + 2, lo + 2, k.z);
    rec_store(dst + 3, lo + 3, k.w);
}
// the exact fp32 of a record element from its high plane's value (hi, as read: a bf16's float) and its low half
__device__ __forceinline__ float rec_join(float hi, unsigned short lo) {
    return __uint_as_float(__float_as_uint(hi) + static_cast<uint32_t>(static_cast<int32_t>(static_cast<short>(lo))));
}
// the fold's view of the key records: both planes at one position, moved together; load4 / load8 join them
struct SplitRec {
    const KR_T* hi;
    const unsigned short* lo;
    __device__ __forceinline__ SplitRec operator+(long long o) const { return {hi + o, lo + o}; }
    __device__ __forceinline__ SplitRec operator-(long long o) const { return {hi - o, lo - o}; }
};
// (element pair i of a 32-bit word of each plane: the fp32 bits (high << 16) + low, low taken as signed)
__device__ __forceinline__ float rec_join_w(uint32_t hw, uint32_t lw, int i) {
    const uint32_t h = i ? (hw & 0xffff0000u) : (hw << 16);
    const int32_t l = i ? (static_cast<int32_t>(lw) >> 16) : (static_cast<int32_t>(lw << 16) >> 16);
    return __uint_as_float(h + static_cast<uint32_t>(l));
}
// four elements (8-byte aligned in both planes: a record row starts at a multiple of K_ and a lane's columns at a
// multiple of 4): one 8-byte load per plane
__device__ __forceinline__ float4 load4(SplitRec p) {
    const uint2 h = *reinterpret_cast<const uint2*>(p.hi), l = *reinterpret_cast<const uint2*>(p.lo);
    return make_float4(rec_join_w(h.x, l.x, 0), rec_join_w(h.x, l.x, 1), rec_join_w(h.y, l.y, 0),
                       rec_join_w(h.y, l.y, 1));
}
typedef SplitRec FoldKeys;
#define FK_RESTRICT
#else
typedef const KR_T* FoldKeys;
#define FK_RESTRICT __restrict__
#endif
__device__ __forceinline__ float4 mul4(float4 x, float4 y) { return make_float4(x.x * y.x, x.y * y.y, x.z * y.z, x.w * y.w); }
__device__ __forceinline__ float4 exp4(float4 x, float s) {  // (the fast approximation, as gate_of)
    return make_float4(__expf(s * x.x), __expf(s * x.y), __expf(s * x.z), __expf(s * x.w));
}

// one column's log-decay from x = a + dt_bias (A = e^{A_log}): SGLang's gate -A softplus(x) (softplus(x) = x above
// 20), or KDA's safe gate lower_bound sigmoid(A x). KDA makes it for every column of every row, in every warp, so it
// takes the fast approximations (ex2 / lg2.approx, as Triton's tl.exp and tl.log compile to): with the accurate expf
// and logf the gate alone cost more instructions than a warp's tile dots (KDA bf16: 167 us per layer-step at B = 256,
// kernels-20261203-0941)
__device__ __forceinline__ float gate_of(float x, float A, float lower_bound) {
#if USE_LOWER_BOUND
    return lower_bound / (1.0f + __expf(-A * x));
#else
    return -A * (x <= 20.0f ? __logf(1.0f + __expf(x)) : x);
#endif
}

// KDA: G_{h-1} (G_last, zero without records) and G_t = G_{h-1} + g_t of this lane's 4 columns (a, dt_bias at them)
// (kda_g_of: from a and dt_bias at this lane's columns already loaded, x and d; kda_g_last and kda_g_t its parts)
__device__ __forceinline__ float4 kda_g_last(const float* base_g, int h_old, int lane) {
    return h_old > 0 ? *reinterpret_cast<const float4*>(base_g + (h_old - 1) * K_ + 4 * lane)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float4 kda_g_t(float4 G_last, float4 x, float4 d, float a_log, float lower_bound) {
    const float A = __expf(a_log);
    return make_float4(G_last.x + gate_of(x.x + d.x, A, lower_bound), G_last.y + gate_of(x.y + d.y, A, lower_bound),
                       G_last.z + gate_of(x.z + d.z, A, lower_bound), G_last.w + gate_of(x.w + d.w, A, lower_bound));
}
__device__ __forceinline__ void kda_g_of(const float* base_g, int h_old, float4 x, float4 d, float a_log,
                                         float lower_bound, int lane, float4& G_last, float4& G_t) {
    G_last = kda_g_last(base_g, h_old, lane);
    G_t = kda_g_t(G_last, x, d, a_log, lower_bound);
}
template <typename TA, typename TD>
__device__ __forceinline__ void kda_g(const float* base_g, int h_old, const TA* a, const TD* dt_bias, float a_log,
                                      float lower_bound, int lane, float4& G_last, float4& G_t) {
    G_last = kda_g_last(base_g, h_old, lane);
    const float4 x = load4_any(a), d = load4_any(dt_bias);
    G_t = kda_g_t(G_last, x, d, a_log, lower_bound);
}

// batch row n's state slot and ring row (decode._slot_row): the ring row is ring_idx[n] where the launch has one (rings
// keyed by request row), else the slot; a row with either index < 0 is padding, both then -1
__device__ __forceinline__ void slot_and_ring_row(const SLOT_T* __restrict__ slot_idx,
                                                  const RIDX_T* __restrict__ ring_idx, int n, long long& slot,
                                                  long long& rrow) {
    slot = static_cast<long long>(slot_idx[n]);
    rrow = slot;
#if HAS_RING_IDX
    rrow = static_cast<long long>(ring_idx[n]);
    if (rrow < 0) slot = -1;
    if (slot < 0) rrow = -1;
#endif
}

// What the pre launch writes (coef, scal, ovf, gts) is read only after griddepcontrol.wait, and the kernels take those
// pointers without __restrict__: with it, nvcc compiles their loads as invariant (LDG.CONSTANT) and may schedule them
// above the wait, where under PDL they read what the pre launch has not written yet (the scratch of an earlier launch).
// That happened in session 35: XL for KDA read gts and ovf before the wait and the bf16-state XL shape coef and scal;
// served, KDA's logprobs moved by 0.526, while the float64 cases, launched one by one from Python, passed (the pre
// launch had long finished). tests/test_cuda_main.py::test_pre_outputs_read_after_the_wait checks the SASS.
// what the main launch takes from the pre launch for one (row, value head), this lane's share: the records'
// coefficients c_j, d_j at positions j0 .. j0 + JPL - 1, GDN's e^{G_t} (1 for KDA, whose e^{G_t} is per column, on q
// and k), <k~, q~>, and KDA's overflow flags (the row's, this head's). With PDL it first waits for the pre launch;
// LATE_COEF places the call before or after the tile's dots.
struct PreOut {
    float cq[JPL], ck[JPL], e_t, kq;
    int ov_row, ov_head;
};
__device__ __forceinline__ PreOut load_pre(const float* coef, const float* scal, const int* ovf, long long nh,
                                           long long rrow, int hv, int j0) {  // (no __restrict__: see above)
#if USE_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the pre launch's coefficients are visible from here on
#endif
    PreOut p;
    const float* pc = coef + nh * 2 * BC_;
#pragma unroll
    for (int t = 0; t < JPL; t += 4) {
        *reinterpret_cast<float4*>(p.cq + t) = *reinterpret_cast<const float4*>(pc + j0 + t);
        *reinterpret_cast<float4*>(p.ck + t) = *reinterpret_cast<const float4*>(pc + BC_ + j0 + t);
    }
    p.e_t = IS_KDA ? 1.0f : scal[nh * 2];
    p.kq = scal[nh * 2 + 1];
#if IS_KDA
    p.ov_row = ovf[rrow * (HV_ + 1) + HV_];
    p.ov_head = ovf[rrow * (HV_ + 1) + hv];
#else
    p.ov_row = p.ov_head = 0;
#endif
    return p;
}

// The LOAD_REG fold of NR rows of a warp, lane l on their columns 4l .. 4l + 3, shared by both layouts (the XL
// kernel folds in this layout too, 8 rows at a time): c holds the rows' checkpoint tile (this lane's 4 columns), rk the
// first KB records' keys (loaded by the caller beside the tile's re-read, so that the two round trips overlap). The
// rows are r_first .. r_first + NR - 1 of the block's shared wsm (their decayed records, BC_ apart) and uasm (this
// token's u_t, 0 where the fold takes no token). Each row: decayed by e^{G_f} (eG, per column for KDA), this token's
// u_t k~ added, then every record's u_j e^{G_f - G_j} k_j, KB keys per round trip (KDA: the predecayed keys times
// e^{G_f / 2} twice, eh). The caller stores c.
template <int NR, typename KP>
__device__ __forceinline__ void fold_rows(float4 (&c)[NR], float4 (&rk)[KB], const float* wsm, const float* uasm,
                                          int r_first, float4 eG, float4 eh, float4 kn, KP base_k, int h_old) {
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        const float ua = uasm[r_first + i];
        c[i] = make_float4(c[i].x * eG.x + ua * kn.x, c[i].y * eG.y + ua * kn.y, c[i].z * eG.z + ua * kn.z,
                           c[i].w * eG.w + ua * kn.w);
    }
#pragma unroll 1
    for (int jb = 0; jb < CAP_; jb += KB) {
        if (jb >= h_old) break;
        if (jb > 0) {
#pragma unroll
            for (int t = 0; t < KB; ++t)
                rk[t] = jb + t < h_old ? load4(base_k + (jb + t) * K_) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#if IS_KDA
#pragma unroll
        for (int t = 0; t < KB; ++t) rk[t] = mul4(mul4(rk[t], eh), eh);  // k_j e^{G_f - G_j}
#endif
#pragma unroll
        for (int t = 0; t < KB; ++t) {
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                const float wj = wsm[(r_first + i) * BC_ + jb + t];  // (0 past h_old)
                c[i].x += wj * rk[t].x;
                c[i].y += wj * rk[t].y;
                c[i].z += wj * rk[t].z;
                c[i].w += wj * rk[t].w;
            }
        }
    }
}

// The launches' first instructions (PDL, session 48). The main launch: under LEAD_PDL without a pre launch (SELF_PRE)
// it is the step's first launch and waits for the kernel before it; then TRIGGER_POST lets the post launch's blocks
// be dispatched (the post launch waits for this whole launch before it reads anything).
__device__ __forceinline__ void main_prologue() {
#if LEAD_PDL && SELF_PRE
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if TRIGGER_POST
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The pre launch: under LEAD_PDL it waits for the kernel before it first, before it lets the main launch start,
// whose loads ahead of its own wait read what that kernel wrote (ring_h, the records, the checkpoint); with USE_PDL
// it then lets the main launch start.
__device__ __forceinline__ void pre_prologue() {
#if LEAD_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if USE_PDL
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#if !XL
extern "C" __global__ void __launch_bounds__(NWARPS * 32, MINB) replay_gdn_main(
    const X_T* __restrict__ mixed_qkv, const A_T* __restrict__ a, const B_T* __restrict__ b,
    const ALOG_T* __restrict__ A_log, const DTB_T* __restrict__ dt_bias, OUT_T* __restrict__ out,
    ST_T* __restrict__ state, U_T* __restrict__ ring_u, SP_CONST KR_T* __restrict__ ring_k,
    SP_CONST float* __restrict__ ring_g, const int* __restrict__ ring_h, const int* __restrict__ h_rows,
    const SLOT_T* __restrict__ slot_idx, const FORCED_T* __restrict__ forced, const RIDX_T* __restrict__ ring_idx,
    const float* coef, const float* scal, const int* ovf,
    const float* gts, float scale, float lower_bound, int L, long long stride_qkv, long long stride_a,
    long long stride_b, long long stride_slot, RC_T* rc, float* rc_scale, const int* rc_valid,
    const unsigned int* qk_frag, unsigned short* __restrict__ ring_u_lo, SP_CONST unsigned short* __restrict__ ring_k_lo,
    const int* order) {  // (FLUSH_FIRST's, from the pre launch: no __restrict__, as coef)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    main_prologue();
#if LOAD_REG
    float* wsm = reinterpret_cast<float*>(smem_raw);  // [VT, BC]: the fold's decayed records u_j e^{G_f - G_j}
#else
    float* tile = reinterpret_cast<float*>(smem_raw);  // [VT, K]
    float* wsm = tile + VT * K_;                        // [VT, BC]: the fold's decayed records u_j e^{G_f - G_j}
#endif
    float* uasm = wsm + VT * BC_;                       // [VT]: this token's u_t where the fold takes it
    __shared__ __align__(8) uint64_t mbar[NWARPS];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int i_v = blockIdx.x, hv = blockIdx.y, n = blockIdx.z;  // rows outermost: a row's blocks together
    const int i_h = hv / (HV_ / H_);                              // the query head (q and k come from it)
    const int i_hk = IS_KDA ? hv : i_h;                           // the key head of the records: KDA's per value head
    const int wrow0 = i_v * VT + warp * RPW;                      // the warp's first V-row

    long long slot, rrow;
    slot_and_ring_row(slot_idx, ring_idx, n, slot, rrow);
    const int r = lane & (RPW - 1);  // the row this lane owns after the reduction
    const int v = wrow0 + r;
    if (slot < 0) {  // a padded row: zero output, nothing touched (the whole block takes this branch)
        if (lane < RPW) from_f(out + (static_cast<long long>(n) * HV_ + hv) * V_ + v, 0.0f);
        return;
    }

    const ST_T* src = state + slot * stride_slot + (static_cast<long long>(hv) * V_ + wrow0) * K_;
#if LOAD_REG
    // the warp's rows of the checkpoint: RPW loads per lane (16 bytes each for fp32, 8 for bf16), all in flight at once
    float4 c[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) c[i] = ld_state4(src + i * K_ + 4 * lane);
#else
    // the warp's rows of the checkpoint: one bulk copy, issued first
    float* wtile = tile + warp * RPW * K_;
    if (lane == 0) {
        mbar_init(&mbar[warp], 1);
        bulk_load(wtile, src, RPW * K_ * 4, &mbar[warp]);
    }
    __syncwarp();
#endif

    // while it flies: h, the flags and this row's q, k (lane: columns 4l .. 4l + 3)
#if HAS_H_ROWS
    const int h_old = h_rows[n];
#else
    const int h_old = ring_h[rrow];
#endif
    bool prefold = h_old >= L;  // (KDA: the pre launch's overflow flags may still turn it into a flush, below)
    const int h_eff = prefold ? 0 : h_old;
#if HAS_FORCED
    const bool is_forced = forced[n] != 0;
#else
    const bool is_forced = false;
#endif
    bool flush = (h_eff + 1 >= L) || is_forced;
#if IS_KDA
    // G_t = G_{h-1} + g_t of this lane's 4 columns: every row needs it (q and k times e^{G_t} before the dots), so
    // it is loaded for all rows beside the tile (and kept for the fold's per-column decay)
    const float* base_g = ring_g + (rrow * HV_ + hv) * CAP_ * K_;
#if GT_PRE
    // or as the pre launch made it for its coefficients (gts [B, HV, K]): no gate inputs, no G_{h-1} load behind h
    // here, at the price of the wait for the pre launch before the dots (the fold loads G_{h-1} itself)
#if USE_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const float4 G_t4 = *reinterpret_cast<const float4*>(gts + (static_cast<long long>(n) * HV_ + hv) * K_ + 4 * lane);
#else
    float4 G_last4, G_t4;
    kda_g(base_g, h_old, a + n * stride_a + hv * K_ + 4 * lane, dt_bias + hv * K_ + 4 * lane, to_f(A_log[hv]),
          lower_bound, lane, G_last4, G_t4);
#endif
#else
    // a row that writes its checkpoint this step (1 in L): what its fold needs besides the tile and the keys,
    // loaded now beside the tile, so that the fold's only round trips are the tile's re-read and the keys
    const float* base_g = ring_g + (rrow * HV_ + hv) * CAP_;
    float G_last = 0.0f, x_gate = 0.0f, a_log = 0.0f;
    if (flush || prefold) {
        G_last = h_old > 0 ? base_g[h_old - 1] : 0.0f;
        x_gate = to_f(a[n * stride_a + hv]) + to_f(dt_bias[hv]);
        a_log = to_f(A_log[hv]);
    }
#endif
    const X_T* px = mixed_qkv + static_cast<long long>(n) * stride_qkv;
    const float4 q4 = load4(px + i_h * K_ + 4 * lane);
    const float4 k4 = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
    const float n_q = warp_sum(q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w);
    const float n_k = warp_sum(k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w);
    const float s_q = scale / sqrtf(n_q + 1e-6f);
    const float s_k = 1.0f / sqrtf(n_k + 1e-6f);
#if IS_KDA
    const float4 e_t4 = exp4(G_t4, 1.0f);
    const float4 qd = mul4(q4, e_t4), kd = mul4(k4, e_t4);  // the tile's dots take q e^{G_t}, k e^{G_t} (norms: raw)
#else
    const float4 qd = q4, kd = k4;
#endif

    // this lane's row's records, value and beta: nothing here needs the tile or the pre launch, so their loads
    // are in flight beside the tile's
    // (the NG lanes of row r split its CAP record positions: lane l takes j0 .. j0 + JPL - 1)
    const int j0 = (lane / RPW) * JPL;
    U_T* base_u = ring_u + (rrow * HV_ + hv) * CAP_ * V_;
    float ru[JPL];
#pragma unroll
    for (int t = 0; t < JPL; ++t) ru[t] = j0 + t < h_old ? to_f(base_u[(j0 + t) * V_ + v]) : 0.0f;
    const float x_v = to_f(px[2 * H_ * K_ + hv * V_ + v]);
    const float b_val = to_f(b[n * stride_b + hv]);

    const long long nh = static_cast<long long>(n) * HV_ + hv;
#if !LATE_COEF
    // the pre launch's coefficients, loaded before the tile's dots: their round trip overlaps the tile's (with
    // PDL, a block of the first wave waits here for the pre launch, its tile already in flight)
    const PreOut pre = load_pre(coef, scal, ovf, nh, rrow, hv, j0);
#endif

    // C q and C k over the warp's rows (raw q, k; the norms scale the sums)
    float aq[RPW], ak[RPW];
#if LOAD_REG
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        aq[i] = c[i].x * qd.x + c[i].y * qd.y + c[i].z * qd.z + c[i].w * qd.w;
        ak[i] = c[i].x * kd.x + c[i].y * kd.y + c[i].z * kd.z + c[i].w * kd.w;
    }
#else
    mbar_wait(&mbar[warp], 0);
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const float4 ci = *reinterpret_cast<const float4*>(wtile + i * K_ + 4 * lane);
        aq[i] = ci.x * qd.x + ci.y * qd.y + ci.z * qd.z + ci.w * qd.w;
        ak[i] = ci.x * kd.x + ci.y * kd.y + ci.z * kd.z + ci.w * kd.w;
    }
#endif
    float Cq = reduce_scatter<RPW>(aq, lane) * s_q;
    float Ck = reduce_scatter<RPW>(ak, lane) * s_k;

#if LATE_COEF
    const PreOut pre = load_pre(coef, scal, ovf, nh, rrow, hv, j0);
#endif
    const float* cq = pre.cq;
    const float* ck = pre.ck;
    const float e_t = pre.e_t, kq = pre.kq;
#if DIAG_STREAM == 1
    if (lane < RPW) from_f(out + nh * V_ + v, Cq + Ck * e_t + kq);
    return;
#endif
#if IS_KDA
    const float beta = 1.0f / (1.0f + __expf(-b_val));
    // a pre-folding row one of whose heads would pass the predecayed keys' floor flushes whole; on a row that
    // appends, such a head is rebased: folded through this token like a flush, this head alone
    flush = flush || pre.ov_row != 0;
    prefold = prefold && pre.ov_row == 0;
    const bool rebase = pre.ov_head != 0 && !flush && !prefold;
#else
    const float beta = round_as(1.0f / (1.0f + __expf(-b_val)), static_cast<B_T*>(nullptr));
    Cq *= e_t;
    Ck *= e_t;
    const bool rebase = false;
#endif
    const bool tok = flush || rebase;  // the fold (if any) takes this token too


    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int t = 0; t < JPL; ++t) {
        sq += ru[t] * cq[t];
        sk += ru[t] * ck[t];
    }
#pragma unroll
    for (int s = RPW; s < 32; s <<= 1) {  // the row's sums over its NG lanes
        sq += __shfl_xor_sync(0xffffffffu, sq, s);
        sk += __shfl_xor_sync(0xffffffffu, sk, s);
    }
    const float u_t = beta * (x_v - (Ck + sk));
    const float o = Cq + sq + u_t * kq;
    if (lane < RPW) from_f(out + nh * V_ + v, o);

    if ((flush || prefold || rebase) && DIAG_STREAM != 2) {
        // write the checkpoint: fold the h_old records (and this token on a flush or a rebase) into the tile
        const KR_T* base_k = ring_k + ((rrow * HK_ + i_hk) * CAP_) * K_ + 4 * lane;
#if LOAD_REG
        // what the fold reads, issued together before anything waits on it (a loop over the records would wait
        // for each record's keys in turn): the first KB records' keys and the tile again (from L2: read a moment
        // ago, and not held in registers through the epilogue)
        float4 rk[KB];
#pragma unroll
        for (int t = 0; t < KB; ++t) rk[t] = t < h_old ? load4(base_k + t * K_) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int i = 0; i < RPW; ++i) c[i] = ld_state4(src + i * K_ + 4 * lane);
#endif
        float* w = wsm + (warp * RPW + r) * BC_ + j0;  // (positions CAP .. BC - 1, if any, are never read)
#if IS_KDA
        // per column: the tile decays by e^{G_f}, every predecayed key k_j e^{-G_j} by e^{G_f / 2} twice
#if GT_PRE
        const float4 G_last4 = h_old > 0 ? *reinterpret_cast<const float4*>(base_g + (h_old - 1) * K_ + 4 * lane)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
        const float4 G_f4 = tok ? G_t4 : G_last4;
        const float4 eG = exp4(G_f4, 1.0f), eh = exp4(G_f4, 0.5f);
#pragma unroll
        for (int t = 0; t < JPL; ++t) w[t] = j0 + t < h_old ? ru[t] : 0.0f;
#else
        const float sp = x_gate <= 20.0f ? logf(1.0f + expf(x_gate)) : x_gate;
        const float g_t = -expf(a_log) * sp;
        const float G_f = tok ? G_last + g_t : G_last;
        const float eG1 = expf(G_f);
        const float4 eG = make_float4(eG1, eG1, eG1, eG1), eh = eG;  // (eh: KDA's key factor, not used for GDN)
#pragma unroll
        for (int t = 0; t < JPL; ++t) w[t] = j0 + t < h_old ? ru[t] * expf(G_f - base_g[j0 + t]) : 0.0f;
#endif
        if (lane < RPW) uasm[warp * RPW + r] = tok ? u_t : 0.0f;
        __syncwarp();
        const float4 kn = make_float4(k4.x * s_k, k4.y * s_k, k4.z * s_k, k4.w * s_k);
        ST_T* dst = state + slot * stride_slot + (static_cast<long long>(hv) * V_ + wrow0) * K_ + 4 * lane;
#if LOAD_REG
        // decayed, this token added, then KB records at a time over all rows
        fold_rows<RPW>(c, rk, wsm, uasm, warp * RPW, eG, eh, kn, base_k, h_old);
#pragma unroll
        for (int i = 0; i < RPW; ++i) st_state4(dst + i * K_, c[i]);
#else
        float4 rk[CAP_];
#pragma unroll
        for (int j = 0; j < CAP_; ++j) rk[j] = j < h_old ? load4(base_k + j * K_) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int i = 0; i < RPW; ++i) {
            const float4 ci = *reinterpret_cast<const float4*>(wtile + i * K_ + 4 * lane);
            const float ua = uasm[warp * RPW + i];
            float4 s = make_float4(ci.x * eG.x + ua * kn.x, ci.y * eG.y + ua * kn.y, ci.z * eG.z + ua * kn.z,
                                   ci.w * eG.w + ua * kn.w);
            const float* w = wsm + (warp * RPW + i) * BC_;
#pragma unroll
            for (int j = 0; j < CAP_; ++j) {
                const float wj = w[j];
                s.x += wj * rk[j].x;
                s.y += wj * rk[j].y;
                s.z += wj * rk[j].z;
                s.w += wj * rk[j].w;
            }
            st_state4(dst + i * K_, s);
        }
#endif
    }
    if (!flush && lane < RPW) from_f(base_u + h_eff * V_ + v, u_t);
}

#endif  // !XL

#if XL
// ---------------------------------------------------------------------------------------------------------------
// XL: the main launch for GDN in the eight-lanes-per-row layout (the "x" shapes; session 34; GDN's default shapes since,
// x16w4c1_m5 for an fp32 and x16w4c1_m6 for a bf16 checkpoint). Same arithmetic as the kernel above; what changes is
// which lane holds what, so that a warp's 8 or 16 rows cost a handful of shuffles instead of ~60 (the layout above
// reduces each row's dots over all 32 lanes: a 23-shuffle reduce-scatter for each of C q and C k, per 8 rows, plus the
// q and k norms; the H200 issues one warp shuffle per SM per clock). Measured (kernels-20261203-2019, B = 256, 16 rows
// per warp against g8w4): the work between the streaming floor and everything but the fold 16.2 -> 8.8 us (fp32),
// 19.9 -> 11.3 (bf16); the streaming floor itself no lower (135.7 -> 141.4 fp32). docs/design.md, "Session 34".
//   lane l: group g = l / 8 owns the warp's rows g RPL .. g RPL + RPL - 1 (RPL = RPW / 4), sub-lane s = l % 8 owns
//   16 columns of each: NACC accesses of 16 bytes (fp32: 4 columns at 4s + 32t; bf16: 8 columns at 8s + 64t), so
//   each load instruction reads 4 rows x 8 lanes x 16 contiguous bytes;
//   record positions j = s JX .. s JX + JX - 1 (JX = CAP / 8) of its rows, and their coefficients;
//   its per-lane parts P_i = s_q e^{G_t} (C q)_part + sum_j u_ij c_j and Q_i = s_k e^{G_t} (C k)_part + sum_j u_ij d_j
//   (linear, so one reduction gives both C q~ + sum u c and C k~ + sum u d) are reduce-scattered over the 8 lanes
//   of the group (2 RPL values: 2 RPL - 1 + ... shuffles), one more shuffle puts each row's Q beside its P, and
//   the lane of P_i finishes row i: u_t = beta (v - Q_i), o = P_i + u_t <k~, q~>.
// A block walks NCH V-tiles in turn (its slot, h, flags, q, k, norms and the pre launch's coefficients once), the
// next tile's loads issued before this tile's reduction and epilogue. The fold (a flush or pre-fold row: the whole
// block) is the kernel above's: lane l on 4 columns of 8 rows at a time, the tile re-read from L2, KB records' keys
// per round trip, the decayed records and u_t from shared memory.
#define RPL (RPW / 4)
#define JX (CAP_ / 8)
#define CPA (16 / (int)sizeof(ST_T))  // columns per 16-byte access
#define NACC (16 / CPA)               // accesses per row per lane
#define NVAL (2 * RPL)                // P and Q of each of the lane's rows

// the 16 columns of lane s as floats, from NACC 16-byte words of the checkpoint
__device__ __forceinline__ void unpack16(const uint4 (&w)[NACC], float (&f)[16], const float*) {
#pragma unroll
    for (int t = 0; t < NACC; ++t) {
        f[4 * t] = __uint_as_float(w[t].x);
        f[4 * t + 1] = __uint_as_float(w[t].y);
        f[4 * t + 2] = __uint_as_float(w[t].z);
        f[4 * t + 3] = __uint_as_float(w[t].w);
    }
}
// bf16 values from NA 16-byte words (8 each) from word o: a bf16 checkpoint's, and a bf16 read copy's (unpack16_rc)
template <int NA, int W>
__device__ __forceinline__ void unpack_bf16(const uint4 (&w)[W], float (&f)[16], int o = 0) {
#pragma unroll
    for (int t = 0; t < NA; ++t) {
        const uint32_t u[4] = {w[o + t].x, w[o + t].y, w[o + t].z, w[o + t].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[c]));
            f[8 * t + 2 * c] = p.x;
            f[8 * t + 2 * c + 1] = p.y;
        }
    }
}
__device__ __forceinline__ void unpack16(const uint4 (&w)[NACC], float (&f)[16], const __nv_bfloat16*) {
    unpack_bf16<NACC>(w, f);
}
__device__ __forceinline__ uint4 pack4(const float* f, const float*) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
__device__ __forceinline__ uint4 pack4(const float* f, const __nv_bfloat16*) {  // 8 values, rounded to nearest
    uint32_t u[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * c], f[2 * c + 1]);
        u[c] = *reinterpret_cast<uint32_t*>(&p);
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}
// column of element e (0..15) of sub-lane s
__device__ __forceinline__ int xl_col(int s, int e) { return CPA * s + 8 * CPA * (e / CPA) + (e % CPA); }

// a row's 16 columns of lane s from a [.., K] row of any element type (q, k, key records)
template <typename T>
__device__ __forceinline__ void load16(const T* row, int s, float (&f)[16]) {
#pragma unroll
    for (int t = 0; t < NACC; ++t) {
        if constexpr (CPA == 4) {
            const float4 x = load4(row + CPA * s + 8 * CPA * t);
            f[4 * t] = x.x, f[4 * t + 1] = x.y, f[4 * t + 2] = x.z, f[4 * t + 3] = x.w;
        } else {
            const float4 x = load4(row + CPA * s + 8 * CPA * t), y = load4(row + CPA * s + 8 * CPA * t + 4);
            f[8 * t] = x.x, f[8 * t + 1] = x.y, f[8 * t + 2] = x.z, f[8 * t + 3] = x.w;
            f[8 * t + 4] = y.x, f[8 * t + 5] = y.y, f[8 * t + 6] = y.z, f[8 * t + 7] = y.w;
        }
    }
}

#if HAS_RC
// The read copy (issue 7) in this layout: lane s of a row's group reads 16 of its columns as RC_NACC 16-byte words
// (fp8: one word, columns 16s .. 16s + 15; bf16: two, 8s + 64t ..), so its column map differs from the checkpoint's.
// A copy's tile is 1/4 (fp8) or 1/2 (bf16) of a checkpoint tile's words: RC_CH tiles of the block fit in the registers
// of one (c[i][cc RC_NACC + t] holds word t of tile cc), so a block loads that many of its tiles at once, and the
// first before it knows whether its row reads the copy (the common case: a row folds once per window; a folding row
// loads the checkpoint's tile after that, and the copy's words go unused).
#define RCPA (16 / (int)sizeof(RC_T))  // read-copy columns per 16-byte access
#define RC_NACC (16 / RCPA)             // accesses per row per lane
#define RC_CH (NACC / RC_NACC)          // the copy's tiles in the registers of one checkpoint tile
#define CW (RC_LEAN ? RC_NACC : NACC)   // the tile's 16-byte words a lane holds per row (RC_LEAN: the copy's)
static_assert(NACC % RC_NACC == 0, "a read copy needs a checkpoint tile at least as wide as its own (fp32)");
__device__ __forceinline__ int rc_col(int s, int e) { return RCPA * s + 8 * RCPA * (e / RCPA) + (e % RCPA); }
// the 16 columns of lane s from its read-copy words w[o ..]: bf16 values, or the values of fp8 e4m3 codes (the row's
// scale is applied to its dots). On the GPU two codes per instruction (cvt.rn.f16x2.e4m3x2; every e4m3 value, the
// subnormals too, is a half exactly); elsewhere (the CPU emulation, kernels/cuda_emu.py) from the bits: the code's 7
// exponent-and-mantissa bits at fp32's bit 20 are the value times 2^-120 exactly, subnormal codes as fp32 subnormals.
// A NaN code reads NaN on the GPU and 480 in the emulation, but a checkpoint row holding NaN never reaches a read this
// way alone: the fold that wrote its copy read that row for its own output, so the step's u_t for the row, folded in (a
// flush: the whole row NaN, so its scale) or appended (the window's later reads take it), is NaN
__device__ __forceinline__ void unpack16_rc(const uint4 (&w)[CW], float (&f)[16], int o) {
#if RC_FP8
    const uint32_t u[4] = {w[o].x, w[o].y, w[o].z, w[o].w};
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int b = 0; b < 4; b += 2) {
#ifdef __CUDA_ARCH__
            uint32_t h;
            asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<unsigned short>(u[c] >> (8 * b))));
            const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&h));  // (low code in .x)
            f[4 * c + b] = p.x;
            f[4 * c + b + 1] = p.y;
#else
            for (int d = 0; d < 2; ++d) {
                const uint32_t code = u[c] >> (8 * (b + d));
                f[4 * c + b + d] = __uint_as_float(((code & 0x80u) << 24) | ((code & 0x7fu) << 20)) * 0x1p120f;
            }
#endif
        }
#else
    unpack_bf16<RC_NACC>(w, f, o);
#endif
}
// float -> fp8 e4m3 code, to nearest even (as decode_v3._round_e4m3), saturating at +-448, NaN kept (0x7f)
__device__ __forceinline__ uint32_t f_to_e4m3(float x) {
    const uint32_t sgn = (__float_as_uint(x) >> 24) & 0x80u;
    const float ax = fabsf(x);
    if (ax != ax) return sgn | 0x7fu;
    if (ax >= 448.0f) return sgn | 0x7eu;
    if (ax < 0x1p-6f) return sgn | static_cast<uint32_t>(rintf(ax * 512.0f));  // subnormal codes: units of 2^-9
    uint32_t u = __float_as_uint(ax);
    u += 0x7ffffu + ((u >> 20) & 1u);  // the mantissa rounded at its third bit, ties to even (a carry: the exponent)
    return sgn | ((((u >> 23) - 120u) & 0xfu) << 3) | ((u >> 20) & 7u);
}
// two floats -> two e4m3 codes (x in the low byte): on the GPU one instruction with the same rounding (to nearest
// even, saturating at +-448; a NaN stays a NaN code), elsewhere f_to_e4m3. The GPU's float64 cases check its codes
// against round(fold) (test_gpu_real_shapes_cuda_main_read_copy)
__device__ __forceinline__ uint32_t f2_to_e4m3x2(float x, float y) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(y), "f"(x));  // (the first source: the high byte)
    return h;
#else
    return f_to_e4m3(x) | (f_to_e4m3(y) << 8);
#endif
}
// an fp8 copy's V-row scale from the row's largest |value|: amax / 448 (e4m3's largest), 1 for a zero row
__device__ __forceinline__ float fp8_row_scale(float amax) { return amax == 0.0f ? 1.0f : amax / 448.0f; }
// the fold's store of one row's 4 columns (this lane's) into the read copy: bf16 to nearest even, or fp8 codes of
// x / scale with the row's scale = max |x| over the warp's 32 lanes / 448 (1 for a zero row; lane 0 stores it), as
// decode_v3's fold writes them
__device__ __forceinline__ void rc_store_row(RC_T* dst, float* sdst, float4 x, int lane) {
#if RC_FP8
    float m = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float sc = fp8_row_scale(m);
    *reinterpret_cast<uint32_t*>(dst) = f2_to_e4m3x2(x.x / sc, x.y / sc) | (f2_to_e4m3x2(x.z / sc, x.w / sc) << 16);
    if (lane == 0) *sdst = sc;
#else
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(dst) = make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
#endif
}
#endif
// q and k in shared memory (qk_sm): with a read copy each 32 columns are followed by 4 unused floats (QK_ROW: a
// vector's stride), so that the tile's dots read them without bank conflicts in all three column maps (the
// checkpoint's 4s + 32t, the fp8 copy's 16s + e, the bf16 copy's 8s + 64t: 8 lanes of a group on 8 distinct 4-bank
// groups; unpadded the fp8 copy's reads were 4-way conflicts, the bf16 copy's 2-way), and the fold's 4l too
__device__ __forceinline__ int qk_at(int c) { return HAS_RC ? c + 4 * (c >> 5) : c; }
#define QK_ROW (HAS_RC ? K_ + K_ / 8 : K_)

// one halving of the 8-lane reduce-scatter: lanes with bit S set keep the upper half of the CNT values (moved down)
template <int S, int CNT>
__device__ __forceinline__ void xl_rs_step(float (&v)[NVAL], int lane) {
    if constexpr (CNT > 1) {
        const bool upper = (lane & S) != 0;
#pragma unroll
        for (int i = 0; i < CNT / 2; ++i) {
            const float lo = v[i], hi = v[i + CNT / 2];
            v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, S);
        }
    } else {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], S);
    }
}
// the sums over the 8 lanes of a group of NVAL values: value (s / (8 / NVAL)) of the lane's group in v[0]
__device__ __forceinline__ float xl_reduce(float (&v)[NVAL], int lane) {
    xl_rs_step<4, NVAL>(v, lane);
    xl_rs_step<2, (NVAL > 1 ? NVAL / 2 : 1)>(v, lane);
    xl_rs_step<1, (NVAL > 2 ? NVAL / 4 : 1)>(v, lane);
    return v[0];
}

#if MMA_FOLD
template <typename T> struct is_bf16_t { static constexpr bool value = false; };
template <> struct is_bf16_t<__nv_bfloat16> { static constexpr bool value = true; };
// eight consecutive elements as fp32 (16-byte aligned for bf16: one load; 32-byte for fp32: two)
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
    const float4 x = load4(p), y = load4(p + 4);
    f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
}
template <>
__device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float (&f)[8]) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = __uint_as_float(ws[i] << 16), f[2 * i + 1] = __uint_as_float(ws[i] & 0xffff0000u);
}
// a bf16 key record's 8 columns as they are (fold_mma's BF16_K)
template <typename P>
__device__ __forceinline__ uint4 key_words(P p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
#if REC_SPLIT
__device__ __forceinline__ uint4 key_words(SplitRec p) { return key_words(p.hi); }  // (not taken: BF16_K is 0)
// eight elements, the exact fp32 values (16-byte aligned in both planes, as the bf16 keys' words): one 16-byte load
// per plane
__device__ __forceinline__ void load8(SplitRec p, float (&f)[8]) {
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(p.hi)), l = __ldg(reinterpret_cast<const uint4*>(p.lo));
    const uint32_t hs[4] = {h.x, h.y, h.z, h.w}, ls[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = rec_join_w(hs[i], ls[i], 0), f[2 * i + 1] = rec_join_w(hs[i], ls[i], 1);
}
#endif
// two floats as a bf16 pair rounded to nearest (from_f's rounding; x in the low half): one cvt.rn.bf16x2.f32
__device__ __forceinline__ uint32_t bf16x2(float x, float y) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
}
// x and y as bf16 pairs (x in the low half): their high parts, and the low parts x - hi (x = hi + lo to ~2^-17)
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
    hi = bf16x2(x, y);
    lo = bf16x2(x - __uint_as_float(hi << 16), y - __uint_as_float(hi & 0xffff0000u));
}
// x as a high and a low tf32 part, x = hi + lo to ~2^-20: hi its fp32 word cut to tf32's 10 mantissa bits (exact:
// a truncation), lo = x - hi (exact in fp32) passed as it is, which the tensor cores read as tf32 by dropping its low
// 13 bits (round toward zero, as CUTLASS's fast tf32 path relies on; the emulation below does the same)
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}
// d += A B for the fold: mma.sync m16n8k16 with bf16 A, B (whatever the dots' MMA_BF16), and m16n8k8 with tf32
// ones; the fragments as in the TC_DOTS comment (tf32: a0 = (row gid; k tig), a1 = (row gid + 8; k tig), a2, a3 the
// same at k tig + 4; b0 = (k tig; column gid), b1 = (k tig + 4; column gid); d as m16n8k16's). The CPU emulation forms
// the same sums from the fragments' definition
__device__ __forceinline__ void fold_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                              int lane) {
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)lane;
    emu_mma(d, a, b0, b1, [](uint32_t x, uint32_t y, uint32_t p, uint32_t q) {
        auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
        auto hi = [](uint32_t w) { return __uint_as_float(w & 0xffff0000u); };
        return lo(x) * lo(p) + hi(x) * hi(p) + lo(y) * lo(q) + hi(y) * hi(q);
    });
#endif
}
__device__ __forceinline__ void fold_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                              int lane) {
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)lane;  // (the k of lanes with tig = st: st in a0 / a1 and b0, st + 4 in a2 / a3 and b1)
    emu_mma(d, a, b0, b1, [](uint32_t x, uint32_t y, uint32_t p, uint32_t q) {
        auto tf = [](uint32_t w) { return __uint_as_float(w & 0xffffe000u); };  // (a tf32 operand: its top 19 bits)
        return tf(x) * tf(p) + tf(y) * tf(q);
    });
#endif
}

// A folding warp's fold on the tensor cores (MMA_FOLD, session 43): its 16 rows of the tile become
//   C e^{G_f} + u_t k~^T + sum_{j < h} w_j k_j^T,
// what fold_rows computes (GDN: w_j = u_j e^{G_f - G_j}, from wsm; KDA: w_j = u_j, k_j the predecayed key times
// e^{G_f / 2} twice, e^{G_f} per column), as products on the tensor cores with fp32 sums, A = W [16 rows x the
// records], B = the keys [the records x 8 columns], D = the tile decayed, the token's term added on the CUDA cores
// first (a pre-fold that also flushes folds 16 records and the token, one more than a 16-deep product holds).
// A bf16 checkpoint: one 16-deep bf16 product per 8 columns, a factor that is not a bf16 value as it stands (GDN's
// w_j, KDA's scaled keys, fp32 records) split into high and low bf16 parts with a second product, so each term keeps
// ~2^-17 relative before the bf16 store. An fp32 checkpoint: 3xTF32, two 8-deep steps, every factor split into high
// and low tf32 parts and hi hi + lo hi + hi lo summed (~2^-20 relative per term), and the read copy written from the
// same unrounded values (bf16 to nearest; fp8 codes of x / scale with scale = max |x| over the V-row / 448, as
// rc_store_row: a second pass over the stored row, after its maximum is known).
// The column map: D's n-tile 4 a + b, column n, is the tile's column 32 a + 8 (n >> 1) + 2 b + (n & 1), so lane (gid,
// tig) holds columns 32 a + 8 tig .. + 7 of rows gid and gid + 8 (16-byte runs of a bf16 row, two of an fp32 one) and
// B's lane (column n = gid) reads 8 columns of a record at 32 a + 8 (gid >> 1), taking those of its parity.
// tsrc, tdst: the warp's first row of the checkpoint (the same rows: each run is read before it is written); wrow,
// urow: the warp's rows of wsm (BC_ apart) and uasm (u_t, 0 without the token); base_k: the key head's CAP_ records;
// eG1: GDN's e^{G_f}; gf: KDA's G_f per column (null: 0); kraw, sk: the token's raw key and 1 / |k|; rdst, sdst: the
// warp's first row of the read copy and of its scales (HAS_RC).
__device__ __forceinline__ void fold_mma(const ST_T* tsrc, ST_T* tdst, const float* wrow, const float* urow,
                                         FoldKeys FK_RESTRICT base_k, int h_old, float eG1,
                                         const float* __restrict__ gf, const X_T* __restrict__ kraw, float sk,
                                         RC_T* rdst, float* sdst, int lane) {
    constexpr bool BF16_ST = sizeof(ST_T) == 2;
    // (bf16: KDA's w_j, the records' u_j as stored; split records: their fp32 values, as fp32 records)
    constexpr bool A_SPLIT = !(IS_KDA && is_bf16_t<U_T>::value && !REC_SPLIT);
    constexpr bool BF16_K = is_bf16_t<KR_T>::value && !REC_SPLIT;  // (the keys' words loaded as they are)
    constexpr bool RAW_B = BF16_ST && !IS_KDA && BF16_K;           // (bf16: GDN's keys as stored, no low part)
    const int gid = lane >> 2, tig = lane & 3, odd = gid & 1;
    // A. bf16: rows gid (a0, a2) and gid + 8 (a1, a3); records 2 tig, 2 tig + 1 (a0, a1) and 2 tig + 8, 2 tig + 9
    // (a2, a3). tf32, step ks: records 8 ks + tig (a0, a1) and 8 ks + tig + 4 (a2, a3)
    uint32_t ah[2][4], al[2][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = gid + 8 * (r & 1);
        if constexpr (BF16_ST) {
            const int j = 2 * tig + 8 * (r >> 1);
            const float x = j < CAP_ ? wrow[row * BC_ + j] : 0.0f, y = j + 1 < CAP_ ? wrow[row * BC_ + j + 1] : 0.0f;
            split2(x, y, ah[0][r], al[0][r]);
        } else {
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const int j = 8 * ks + tig + 4 * (r >> 1);
                split_tf32(j < CAP_ ? wrow[row * BC_ + j] : 0.0f, ah[ks][r], al[ks][r]);
            }
        }
    }
    const float ut0 = urow[gid], ut1 = urow[gid + 8];
    float am0 = 0.0f, am1 = 0.0f;  // (an fp8 copy: the rows' largest |value|, this lane's columns)
#pragma unroll 1
    for (int a = 0; a < 4; ++a) {  // (rolled: one run's values live at a time)
        // D: this lane's run of rows gid and gid + 8 (columns cc .. cc + 7), decayed, plus the token's term
        const int cc = 32 * a + 8 * tig, cb = 32 * a + 8 * (gid >> 1);
        float c0[8], c1[8], kt[8];
        load8(tsrc + gid * K_ + cc, c0);
        load8(tsrc + (gid + 8) * K_ + cc, c1);
        load8(kraw + cc, kt);
        // B's records at columns cb .. cb + 7 (bf16: 2 tig + (e & 1) + 8 (e >> 1); tf32: tig + 4 e), 0 past h (a
        // stale record may hold anything, NaN included)
        float kf[4][8];
        uint4 kw[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = BF16_ST ? 2 * tig + (e & 1) + 8 * (e >> 1) : tig + 4 * e;
            const bool live = j < CAP_ && j < h_old;
            if constexpr (BF16_K) {
                kw[e] = live ? key_words(base_k + j * K_ + cb) : make_uint4(0u, 0u, 0u, 0u);
            } else if (live) {
                load8(base_k + j * K_ + cb, kf[e]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) kf[e][i] = 0.0f;
            }
        }
#if IS_KDA
        float gd[8], gb[8];
        if (gf != nullptr) {
            load8(gf + cc, gd);
            load8(gf + cb, gb);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) gd[e] = gb[e] = 0.0f;
        }
#endif
        float d[4][4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = 2 * b + c;
#if IS_KDA
                const float eg = __expf(gd[e]);  // (exp4's approximation, as fold_rows's eG)
#else
                const float eg = eG1;
#endif
                const float k = kt[e] * sk;
                d[b][c] = c0[e] * eg + ut0 * k;
                d[b][2 + c] = c1[e] * eg + ut1 * k;
            }
            float v[4];  // (this lane's B values at column cb + 2 b + odd, records as above)
            if constexpr (!RAW_B) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if constexpr (BF16_K) {  // (this lane's half of word b: the column of its parity)
                        const uint32_t w = word_of(kw[e], b);
                        v[e] = __uint_as_float(odd ? (w & 0xffff0000u) : (w << 16));
                    } else {
                        v[e] = odd ? kf[e][2 * b + 1] : kf[e][2 * b];
                    }
                }
#if IS_KDA
                const float eh = __expf(0.5f * (odd ? gb[2 * b + 1] : gb[2 * b]));
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = (v[e] * eh) * eh;
#endif
            }
            if constexpr (RAW_B) {
                const uint32_t sel = odd ? 0x7632u : 0x5410u;  // (the high or low halves of the two words)
                const uint32_t bh0 = __byte_perm(word_of(kw[0], b), word_of(kw[1], b), sel);
                const uint32_t bh1 = __byte_perm(word_of(kw[2], b), word_of(kw[3], b), sel);
                fold_mma_bf16(d[b], ah[0], bh0, bh1, lane);
                fold_mma_bf16(d[b], al[0], bh0, bh1, lane);
            } else if constexpr (BF16_ST) {
                uint32_t bh0, bl0, bh1, bl1;  // (b0: records 2 tig, 2 tig + 1; b1: 2 tig + 8, 2 tig + 9)
                split2(v[0], v[1], bh0, bl0);
                split2(v[2], v[3], bh1, bl1);
                fold_mma_bf16(d[b], ah[0], bh0, bh1, lane);
                if (A_SPLIT) fold_mma_bf16(d[b], al[0], bh0, bh1, lane);
                fold_mma_bf16(d[b], ah[0], bl0, bl1, lane);
            } else {
#pragma unroll
                for (int ks = 0; ks < 2; ++ks) {
                    if (8 * ks >= CAP_) break;
                    uint32_t bh0, bl0, bh1, bl1;  // (b0: record 8 ks + tig; b1: 8 ks + tig + 4)
                    split_tf32(v[2 * ks], bh0, bl0);
                    split_tf32(v[2 * ks + 1], bh1, bl1);
                    fold_mma_tf32(d[b], ah[ks], bh0, bh1, lane);
                    fold_mma_tf32(d[b], al[ks], bh0, bh1, lane);
                    fold_mma_tf32(d[b], ah[ks], bl0, bl1, lane);
                }
            }
        }
        // the two runs back (bf16: rounded to nearest), and the read copy's
        if constexpr (BF16_ST) {
            *reinterpret_cast<uint4*>(tdst + gid * K_ + cc) = make_uint4(
                bf16x2(d[0][0], d[0][1]), bf16x2(d[1][0], d[1][1]), bf16x2(d[2][0], d[2][1]), bf16x2(d[3][0], d[3][1]));
            *reinterpret_cast<uint4*>(tdst + (gid + 8) * K_ + cc) = make_uint4(
                bf16x2(d[0][2], d[0][3]), bf16x2(d[1][2], d[1][3]), bf16x2(d[2][2], d[2][3]), bf16x2(d[3][2], d[3][3]));
        } else {
            float* t0 = reinterpret_cast<float*>(tdst + gid * K_ + cc);
            float* t1 = reinterpret_cast<float*>(tdst + (gid + 8) * K_ + cc);
            *reinterpret_cast<float4*>(t0) = make_float4(d[0][0], d[0][1], d[1][0], d[1][1]);
            *reinterpret_cast<float4*>(t0 + 4) = make_float4(d[2][0], d[2][1], d[3][0], d[3][1]);
            *reinterpret_cast<float4*>(t1) = make_float4(d[0][2], d[0][3], d[1][2], d[1][3]);
            *reinterpret_cast<float4*>(t1 + 4) = make_float4(d[2][2], d[2][3], d[3][2], d[3][3]);
#if HAS_RC && !RC_FP8
            *reinterpret_cast<uint4*>(rdst + gid * K_ + cc) = make_uint4(
                bf16x2(d[0][0], d[0][1]), bf16x2(d[1][0], d[1][1]), bf16x2(d[2][0], d[2][1]), bf16x2(d[3][0], d[3][1]));
            *reinterpret_cast<uint4*>(rdst + (gid + 8) * K_ + cc) = make_uint4(
                bf16x2(d[0][2], d[0][3]), bf16x2(d[1][2], d[1][3]), bf16x2(d[2][2], d[2][3]), bf16x2(d[3][2], d[3][3]));
#elif HAS_RC
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                am0 = fmaxf(am0, fmaxf(fabsf(d[b][0]), fabsf(d[b][1])));
                am1 = fmaxf(am1, fmaxf(fabsf(d[b][2]), fabsf(d[b][3])));
            }
#endif
        }
    }
#if HAS_RC && RC_FP8
    // the fp8 copy: each V-row's scale from its largest |value| (the row's 4 lanes: tig 0-3), then its codes from the
    // values just stored (this lane's own stores, read back)
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        am0 = fmaxf(am0, __shfl_xor_sync(0xffffffffu, am0, o));
        am1 = fmaxf(am1, __shfl_xor_sync(0xffffffffu, am1, o));
    }
    const float sc0 = fp8_row_scale(am0), sc1 = fp8_row_scale(am1);
#pragma unroll 1
    for (int a = 0; a < 4; ++a) {
        const int cc = 32 * a + 8 * tig;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float* t = reinterpret_cast<const float*>(tdst + (gid + 8 * h) * K_ + cc);
            const float4 x = *reinterpret_cast<const float4*>(t), y = *reinterpret_cast<const float4*>(t + 4);
            const float s = h ? sc1 : sc0;
            *reinterpret_cast<uint2*>(rdst + (gid + 8 * h) * K_ + cc) = make_uint2(
                f2_to_e4m3x2(x.x / s, x.y / s) | (f2_to_e4m3x2(x.z / s, x.w / s) << 16),
                f2_to_e4m3x2(y.x / s, y.y / s) | (f2_to_e4m3x2(y.z / s, y.w / s) << 16));
        }
    }
    if (tig == 0) {
        sdst[gid] = sc0;
        sdst[gid + 8] = sc1;
    }
#else
    (void)am0, (void)am1, (void)rdst, (void)sdst;
#endif
}
#endif

extern "C" __global__ void __launch_bounds__(NWARPS * 32, MINB) replay_gdn_main(
    const X_T* __restrict__ mixed_qkv, const A_T* __restrict__ a, const B_T* __restrict__ b,
    const ALOG_T* __restrict__ A_log, const DTB_T* __restrict__ dt_bias, OUT_T* __restrict__ out,
    ST_T* __restrict__ state, U_T* __restrict__ ring_u, SP_CONST KR_T* __restrict__ ring_k,
    SP_CONST float* __restrict__ ring_g, const int* __restrict__ ring_h, const int* __restrict__ h_rows,
    const SLOT_T* __restrict__ slot_idx, const FORCED_T* __restrict__ forced, const RIDX_T* __restrict__ ring_idx,
    const float* coef, const float* scal, const int* ovf,
    const float* gts, float scale, float lower_bound, int L, long long stride_qkv, long long stride_a,
    long long stride_b, long long stride_slot, RC_T* rc, float* rc_scale, const int* rc_valid,
    const unsigned int* qk_frag, unsigned short* __restrict__ ring_u_lo, SP_CONST unsigned short* __restrict__ ring_k_lo,
    const int* order) {  // (FLUSH_FIRST's, from the pre launch: no __restrict__, as coef)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    main_prologue();
    float* wsm = reinterpret_cast<float*>(smem_raw);  // [VT, BC]: the fold's decayed records u_j e^{G_f - G_j}
    float* uasm = wsm + VT * BC_;                       // [VT]: this token's u_t where the fold takes it

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 3, s = lane & 7;
    const int i_v = blockIdx.x, hv = blockIdx.y;  // rows outermost: a row's blocks together
#if FLUSH_FIRST
    // past the first FF_FROM rows, the row comes from the pre launch's order (folding rows first): read after the
    // wait, so these blocks load nothing early (they are dispatched after the first ones, mostly once it has ended)
    int n = blockIdx.z;
    if (n >= FF_FROM) {
#if USE_PDL
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        n = order[n - FF_FROM];
    }
#else
    const int n = blockIdx.z;
#endif
    const int i_h = hv / (HV_ / H_);
    const int row0 = i_v * VT * NCH;  // the block's first V-row; tile ch: rows row0 + ch VT .. + VT - 1
    const long long nh = static_cast<long long>(n) * HV_ + hv;

    long long slot, rrow;
    slot_and_ring_row(slot_idx, ring_idx, n, slot, rrow);
    if (slot < 0) {  // a padded row: zero output, nothing touched (the whole block takes this branch)
        for (int r = threadIdx.x; r < VT * NCH; r += NWARPS * 32) from_f(out + nh * V_ + row0 + r, 0.0f);
        return;
    }
    // the lane's first row within a tile, and the row it finishes after the reduction (value index fin = s / (8 /
    // NVAL): even values are P_i, so lanes with s % (8 / RPL) == 0 finish row fin / 2)
    const int lrow = warp * RPW + g * RPL;
    const int fin = s / (8 / NVAL);
    const bool finisher = (fin & 1) == 0 && (s % (8 / NVAL)) == 0;
    const int frow = lrow + fin / 2;  // (for the non-finishers: some row of the lane's, loaded harmlessly)

    const ST_T* src = state + slot * stride_slot + static_cast<long long>(hv) * V_ * K_;
    // the tile's words of this lane: rows lrow + i of tile ch, its NACC accesses
#if HAS_RC
    uint4 c[RPL][CW];
#else
    uint4 c[RPL][NACC];
#endif
#if TC_DOTS
    // the tensor cores' layout instead (mma_col): flat word u = h MMA_NRUN + r of c holds run r of the warp's row
    // gid + 8 h (row0 + warp RPW + gid + 8 h), from base (the value head's [V, K] copy or checkpoint)
    constexpr int TW = sizeof(c[0]) / sizeof(uint4);  // (words per c[i])
    static_assert(RPL * TW == 2 * MMA_NRUN, "a lane's tile words are its two rows' runs");
    auto load_mma = [&](const auto* base) {
        // (one address per lane, the runs at constant offsets: mma_col(tig, r MMA_SPR) = mma_col(tig, 0) + r 64 / EB)
        const auto* lb = base + static_cast<long long>(row0 + warp * RPW + (lane >> 2)) * K_ + mma_col(lane & 3, 0);
#pragma unroll
        for (int u = 0; u < 2 * MMA_NRUN; ++u)
            c[u / TW][u % TW] = ld_tile16(lb + (u / MMA_NRUN) * 8 * K_ + (u % MMA_NRUN) * (64 / MMA_EB));
    };
#endif
#if HAS_RC
    // with a read copy the tile's source depends on the row's flags: a row that writes no checkpoint this step reads
    // the copy (rsrc; fp8: rsc[cc][i] = the V-row's scale), the others the checkpoint. The copy's first RC_CH tiles
    // are loaded before the flags are known (below); a folding row then loads the checkpoint's tile over them.
    // (The pre launch writes none of rc, rc_scale, rc_valid: loading them before the PDL wait is safe.)
    bool from_rc = true;
    const RC_T* rsrc = rc + (rrow * HV_ + hv) * static_cast<long long>(V_) * K_;
    float rsc[RC_CH][RPL];
    auto load_rc = [&](int ch0) {  // the copy's tiles ch0 .. ch0 + RC_CH - 1 (those the block has), at once
#if RC_MMA
        load_mma(rsrc);  // (RC_LEAN: one V-tile per block)
#endif
#pragma unroll
        for (int cc = 0; cc < (RC_LEAN ? 1 : RC_CH); ++cc) {
            if (ch0 + cc >= NCH) break;
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
                const int v = row0 + (ch0 + cc) * VT + lrow + i;
#if !RC_MMA
                const RC_T* rp = rsrc + static_cast<long long>(v) * K_ + RCPA * s;
#pragma unroll
                for (int t = 0; t < RC_NACC; ++t)
                    c[i][cc * RC_NACC + t] = ld_tile16(rp + 8 * RCPA * t);
#endif
#if RC_FP8 && !VEC_U
                rsc[cc][i] = rc_scale[(rrow * HV_ + hv) * V_ + v];
#endif
            }
#if RC_FP8 && VEC_U
            // (the lane's RPL V-rows' scales, consecutive: one vector load)
            load_run<RPL>(rc_scale + (rrow * HV_ + hv) * V_ + row0 + (ch0 + cc) * VT + lrow, rsc[cc]);
#endif
        }
    };
    load_rc(0);
#endif
    auto load_tile = [&](int ch) {
#if ST_MMA
        load_mma(src);  // (one V-tile per block)
        return;
#endif
#if HAS_RC
        if (from_rc) {
            if (ch % RC_CH == 0) load_rc(ch);  // (the others came with it)
            return;
        }
#if RC_LEAN
        return;  // (a folding block reads its checkpoint's words at the dots, one word per row at a time)
#endif
#endif
#pragma unroll
        for (int i = 0; i < RPL; ++i) {
            const ST_T* rp = src + static_cast<long long>(row0 + ch * VT + lrow + i) * K_ + CPA * s;
#pragma unroll
            for (int t = 0; t < NACC; ++t) c[i][t] = ld_tile16(rp + 8 * CPA * t);
        }
    };
#if !HAS_RC && SELF_PRE != 1
    load_tile(0);
#endif

#if HAS_H_ROWS
    const int h_old = h_rows[n];
#else
    const int h_old = ring_h[rrow];
#endif
    bool prefold = h_old >= L;  // (KDA: the pre launch's overflow flags may still turn it into a flush, below)
    const int h_eff = prefold ? 0 : h_old;
#if HAS_FORCED
    bool is_forced = forced[n] != 0;
#else
    bool is_forced = false;
#endif
#if HAS_RC
    is_forced = is_forced || rc_valid[rrow] == 0;  // a stale read copy: the row flushes (decode._decode_rule_rc)
#endif
    bool flush = (h_eff + 1 >= L) || is_forced;
#if HAS_RC
    from_rc = !(flush || prefold);
#if SELF_PRE != 1
    if (!from_rc) load_tile(0);
#endif
#endif
    bool rebase = false;  // KDA: a head past the predecayed keys' floor, folded through this token alone
    bool fold = (flush || prefold) && DIAG_STREAM == 0;
#if !IS_KDA
    const float* base_g = ring_g + (rrow * HV_ + hv) * CAP_;
    float G_last = 0.0f, x_gate = 0.0f, a_log = 0.0f;
    if (fold) {
        G_last = h_old > 0 ? base_g[h_old - 1] : 0.0f;
        x_gate = to_f(a[n * stride_a + hv]) + to_f(dt_bias[hv]);
        a_log = to_f(A_log[hv]);
    }
#endif
    const X_T* px = mixed_qkv + static_cast<long long>(n) * stride_qkv;
    // q and k of the query head, raw, in the warp's slice of shared memory (in registers they would hold 32 of every
    // lane's registers through the tile's round trips; one slice per warp: no barrier across the block's warps); the
    // norms from the lane's 16 columns and 3 shuffles
    // (KDA: a third slot keeps the raw k for the fold's token term; the first two take q e^{G_t}, k e^{G_t} below)
    constexpr int NQK = IS_KDA ? 3 : 2;
    // (column c of vector j at qk_sm[j QK_ROW + qk_at(c)])
    __shared__ __align__(16) float qk_all[NWARPS][NQK * QK_ROW];
    float* qk_sm = qk_all[warp];
    const float* k_raw = qk_sm + (NQK - 1) * QK_ROW;  // k as loaded (GDN: the dots' k itself)
#if RC_MMA
    const bool mma_dots = from_rc;    // a copy block's dots take the pre launch's operand, normalised:
    const bool qk_staged = !from_rc;  // no q, k here
#elif ST_MMA
    constexpr bool mma_dots = true;     // every block's dots take the pre launch's operand (a folding
    constexpr bool qk_staged = false;   // block loads k~ for its fold there)
#else
    constexpr bool mma_dots = false;
    constexpr bool qk_staged = true;
#endif
    if (qk_staged) {
#pragma unroll
        for (int t = lane; t < 2 * K_; t += 32) {
            const float x = to_f(px[(t < K_ ? i_h * K_ : H_ * K_ + i_h * K_ - K_) + t]);
            const int j = t < K_ ? 0 : 1, at = qk_at(t - j * K_);
            qk_sm[j * QK_ROW + at] = x;
            if (IS_KDA && j == 1) qk_sm[2 * QK_ROW + at] = x;
        }
    }
    __syncwarp();
    float n_q = 0.0f, n_k = 0.0f;
#if SELF_PRE
    float qk = 0.0f;  // <k, q> (SELF_PRE's <k~, q~>, below), from the same reads
#endif
    if (qk_staged) {
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            const float qe = qk_sm[qk_at(xl_col(s, e))], ke = qk_sm[QK_ROW + qk_at(xl_col(s, e))];
            n_q += qe * qe;
            n_k += ke * ke;
#if SELF_PRE
            qk += qe * ke;
#endif
        }
#pragma unroll
        for (int m = 1; m < 8; m <<= 1) {  // over the 8 lanes of the group (each group holds all 128 columns)
            n_q += __shfl_xor_sync(0xffffffffu, n_q, m);
            n_k += __shfl_xor_sync(0xffffffffu, n_k, m);
#if SELF_PRE
            qk += __shfl_xor_sync(0xffffffffu, qk, m);
#endif
        }
    }
    // (nothing staged: the tensor cores' dots, of q / |q| and k / |k| already, take scale and 1)
    const float s_q = qk_staged ? scale / sqrtf(n_q + 1e-6f) : scale;
    const float s_k = qk_staged ? 1.0f / sqrtf(n_k + 1e-6f) : 1.0f;
#if IS_KDA
    const float beta = 1.0f / (1.0f + __expf(-to_f(b[n * stride_b + hv])));
#else
    const float beta = round_as(1.0f / (1.0f + __expf(-to_f(b[n * stride_b + hv]))), static_cast<B_T*>(nullptr));
#endif

    // the lane's records (positions s JX .. s JX + JX - 1 of its rows) and the value of the row it finishes
    U_T* base_u = ring_u + (rrow * HV_ + hv) * CAP_ * V_;
#if REC_SPLIT
    unsigned short* base_u_lo = ring_u_lo + (rrow * HV_ + hv) * CAP_ * V_;  // (the records' low halves: folds only)
#else
    (void)ring_u_lo;
#endif
    (void)ring_k_lo;
    const X_T* pv = px + 2 * H_ * K_ + hv * V_;
    const int j0 = s * JX;
    float ru[RPL][JX];
    float x_v;
    auto load_rows = [&](int ch) {
        const int v0 = row0 + ch * VT + lrow;
#if VEC_U == 2
#pragma unroll
        for (int t = 0; t < JX; ++t) {
            const bool live = j0 + t < h_old;
            float f[RPL];
            load_run<RPL>(base_u + (live ? j0 + t : 0) * V_ + v0, f);  // (every load issued; a dead one's values
#pragma unroll                                                           // are dropped by the select, NaN too)
            for (int i = 0; i < RPL; ++i) ru[i][t] = live ? f[i] : 0.0f;
        }
#elif VEC_U
#pragma unroll
        for (int t = 0; t < JX; ++t) {
            float f[RPL];
            if (j0 + t < h_old)
                load_run<RPL>(base_u + (j0 + t) * V_ + v0, f);
            else
#pragma unroll
                for (int i = 0; i < RPL; ++i) f[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < RPL; ++i) ru[i][t] = f[i];
        }
#else
#pragma unroll
        for (int i = 0; i < RPL; ++i)
#pragma unroll
            for (int t = 0; t < JX; ++t) ru[i][t] = j0 + t < h_old ? to_f(base_u[(j0 + t) * V_ + v0 + i]) : 0.0f;
#endif
        x_v = to_f(pv[row0 + ch * VT + frow]);
    };
    load_rows(0);

    // the pre launch's coefficients of this (row, value head): positions j0 .., e^{G_t}, <k~, q~>
    float cq[JX], ck[JX], e_t = 1.0f, kq = 0.0f;
#if SELF_PRE
    // ... made here instead (no pre launch), as replay_gdn_pre makes them: the record dots <k_j, q~>, <k_j, k~> for
    // j < h_old, group g on positions 4g .. 4g + 3 with its 8 lanes' 16 columns each, reduce-scattered so that lane s
    // holds the dot of position 4g + s / 2 with q~ (s even) or k~ (s odd), then shared through the warp's sp_dots
    static_assert(NVAL == 8, "SELF_PRE: 4 positions x 2 dots per group, one per lane after the reduction");
    const KR_T* base_k = ring_k + ((rrow * H_ + i_h) * CAP_) * K_;
    // G_{h-1}, the gate's inputs and G_j of the lane's positions, loaded here with the records (so that no dot or
    // barrier waits for them)
    const float* bg = ring_g + (rrow * HV_ + hv) * CAP_;
    const float sp_G_last = h_old > 0 ? bg[h_old - 1] : 0.0f;
    const float sp_x = to_f(a[n * stride_a + hv]) + to_f(dt_bias[hv]), sp_alog = to_f(A_log[hv]);
    float G_j[JX];
#pragma unroll
    for (int t = 0; t < JX; ++t) G_j[t] = j0 + t < h_old ? bg[j0 + t] : 0.0f;
#if SELF_PRE == 2
    // SELF_PRE 2: the block's warps share the record dots, one copy per block. Group g of warp w dots position
    // p = 4 w + g; its 16 columns of that record are loaded here, with the records, and dotted after the tile's dots
    // (load_coef is then called where LATE_COEF calls it), so that the tile's dots wait for no record key
    static_assert(4 * NWARPS >= CAP_, "SELF_PRE 2: one position per group of the block's warps");
    __shared__ float sp_dots[1][32];
    const int sp_p = 4 * warp + g;
    float sp_f[16];
    if (sp_p < h_old) {
        load16(base_k + static_cast<long long>(sp_p) * K_, s, sp_f);
    } else {
#pragma unroll
        for (int e = 0; e < 16; ++e) sp_f[e] = 0.0f;  // (a stale record past h may hold anything)
    }
#else
    __shared__ float sp_dots[NWARPS][32];
#endif
    auto load_coef = [&]() {
#if SELF_PRE == 2
        // position sp_p's dots with q~ and k~ summed over the group's 8 lanes; lane s = 0 stores both, then one
        // barrier (every warp of the block gets here: a padded row left as a whole block above)
        float pq = 0.0f, pk = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            pq += sp_f[e] * qk_sm[qk_at(xl_col(s, e))];
            pk += sp_f[e] * qk_sm[QK_ROW + qk_at(xl_col(s, e))];
        }
#pragma unroll
        for (int m = 1; m < 8; m <<= 1) {
            pq += __shfl_xor_sync(0xffffffffu, pq, m);
            pk += __shfl_xor_sync(0xffffffffu, pk, m);
        }
        if (s == 0 && sp_p < CAP_) {
            sp_dots[0][sp_p] = pq * s_q;
            sp_dots[0][16 + sp_p] = pk * s_k;
        }
        __syncthreads();
        constexpr int SPW = 0;  // (the block's one copy)
#else
        float v[NVAL];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const int j = 4 * g + p;
            float f[16];
            if (j < h_old && j < CAP_) {
                load16(base_k + static_cast<long long>(j) * K_, s, f);
            } else {
#pragma unroll
                for (int e = 0; e < 16; ++e) f[e] = 0.0f;  // (a stale record past h may hold anything)
            }
            float pq = 0.0f, pk = 0.0f;
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                pq += f[e] * qk_sm[qk_at(xl_col(s, e))];
                pk += f[e] * qk_sm[QK_ROW + qk_at(xl_col(s, e))];
            }
            v[2 * p] = pq * s_q;
            v[2 * p + 1] = pk * s_k;
        }
        const float d = xl_reduce(v, lane);
        sp_dots[warp][(s & 1) * 16 + 4 * g + s / 2] = d;
        __syncwarp();
        const int SPW = warp;
#endif  // SELF_PRE == 2
        // G_t of the value head (SGLang's gate), the lane's coefficients c_j = <k_j, q~> e^{G_t - G_j} and d_j,
        // e^{G_t} and <k~, q~>
        const float G_t = sp_G_last + gate_of(sp_x, __expf(sp_alog), lower_bound);
#pragma unroll
        for (int t = 0; t < JX; ++t) {
            const int j = j0 + t;
            const float w = j < h_old ? __expf(G_t - G_j[t]) : 0.0f;
            cq[t] = sp_dots[SPW][j] * w;
            ck[t] = sp_dots[SPW][16 + j] * w;
        }
        e_t = __expf(G_t);
        kq = qk * s_q * s_k;
        // a row that appends: the token's record at h_eff (past every position a block of this step reads), its key
        // k~ by the first block of each key head, G_t by the first block of each value head
        if (!flush && !prefold && i_v == 0 && warp == 0) {
            if (hv % (HV_ / H_) == 0) {
                KR_T* dst = ring_k + ((rrow * H_ + i_h) * CAP_ + h_eff) * K_ + 4 * lane;
                const float* kr = qk_sm + QK_ROW + qk_at(4 * lane);
#if REC_SPLIT
                store_key(dst, ring_k_lo + (dst - ring_k), make_float4(kr[0] * s_k, kr[1] * s_k, kr[2] * s_k, kr[3] * s_k));
#else
#pragma unroll
                for (int c = 0; c < 4; ++c) from_f(dst + c, kr[c] * s_k);
#endif
            }
            if (lane == 0) ring_g[(rrow * HV_ + hv) * CAP_ + h_eff] = G_t;
        }
    };
#else
    auto load_coef = [&]() {
#if USE_PDL
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        const float* pc = coef + nh * 2 * BC_;
#if VEC_U && JX % 2 == 0
        // (the lane's JX positions' coefficients, consecutive and 8-byte aligned: a vector load per pair)
#pragma unroll
        for (int t = 0; t < JX; t += 2) {
            const float2 wq = *reinterpret_cast<const float2*>(pc + j0 + t);
            const float2 wk = *reinterpret_cast<const float2*>(pc + BC_ + j0 + t);
            cq[t] = wq.x, cq[t + 1] = wq.y, ck[t] = wk.x, ck[t + 1] = wk.y;
        }
#else
#pragma unroll
        for (int t = 0; t < JX; ++t) {
            cq[t] = pc[j0 + t];
            ck[t] = pc[BC_ + j0 + t];
        }
#endif
#if IS_KDA
        kq = scal[nh * 2 + 1];  // (e^{G_t} is per column, on q and k: e_t stays 1)
        // a pre-folding row one of whose heads would pass the predecayed keys' floor flushes whole; on a row that
        // appends, such a head is rebased: folded through this token like a flush, this head alone
        const int ov_row = ovf[rrow * (HV_ + 1) + HV_], ov_head = ovf[rrow * (HV_ + 1) + hv];
        flush = flush || ov_row != 0;
        prefold = prefold && ov_row == 0;
        rebase = ov_head != 0 && !flush && !prefold;
        fold = (flush || prefold || rebase) && DIAG_STREAM == 0;
#else
        e_t = scal[nh * 2];
        kq = scal[nh * 2 + 1];
#endif
    };
#endif  // SELF_PRE
#if !LATE_COEF && SELF_PRE != 2
    load_coef();
#endif
#if SELF_PRE == 1
    // the checkpoint's tile after the record dots (both in flight at once would want ~128 registers: at 96 the
    // dots spilled 152 bytes); a read copy's tile came before the flags, as without SELF_PRE
#if HAS_RC
    if (!from_rc) load_tile(0);
#else
    load_tile(0);
#endif
#endif
#if FOLD_OUT
    // a block that flushes from the checkpoint takes its outputs from the fold, not from the tile's dots (KDA: the
    // flags are final here, after the pre launch's overflow flags; a row the flags turned into a flush after its
    // copy's tile was loaded, or a rebase, keeps the dots)
    const bool fold_out = fold && flush && !from_rc;
#else
    constexpr bool fold_out = false;
#endif
#if IS_KDA
    // the tile's dots take q e^{G_t} and k e^{G_t} per column, G_t from the pre launch (the norms came from the raw q,
    // k; the tensor cores' operand has it already). FOLD_OUT's dots take the raw q~ and k~ of the decayed fold
    __syncwarp();  // (every lane's reads of the raw values for the norms are done)
    if (qk_staged && !fold_out) {
#pragma unroll
        for (int t = lane; t < K_; t += 32) {
            const float e = __expf(gts[nh * K_ + t]);
            qk_sm[qk_at(t)] *= e;
            qk_sm[QK_ROW + qk_at(t)] *= e;
        }
    }
    __syncwarp();
#endif

#pragma unroll
    for (int ch = 0; ch < NCH; ++ch) {
        // the tile's dots, this lane's 16 columns of each of its rows
        float aq[RPL], ak[RPL];
#if TC_DOTS
        if (mma_dots) {
            // the warp's 16 rows on the tensor cores: 8 K-steps of [16 rows x 16 k] (c, loaded in the mma layout: fp8
            // codes widened to f16, or bf16 values) times B = [q_hi, q_lo, k_hi, k_lo, 0 ..] (the pre launch's
            // qk_frag, lanes 0-15: read after the PDL wait, in load_coef above); then lane (g, s) of the XL layout
            // takes one sum: row 4 g + (s & 3) of the warp, its q dot (s < 4) or k dot, from lane 4 ((4 g + (s & 3)) &
            // 7) + (s >> 2) (d0 + d1: row gid, d2 + d3: row gid + 8), and adds it to its value i = s & 3; the other
            // three of its values take 0
            uint32_t bw[16];
            if (lane < 16) {
                // (per key head: GDN's query head, KDA's value head)
                const uint4* fp = reinterpret_cast<const uint4*>(
                    qk_frag + (static_cast<long long>(n) * HK_ + (IS_KDA ? hv : i_h)) * FRAG_WORDS) + 4 * lane;
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const uint4 w = fp[t];
                    bw[4 * t] = w.x, bw[4 * t + 1] = w.y, bw[4 * t + 2] = w.z, bw[4 * t + 3] = w.w;
                }
            } else {
#pragma unroll
                for (int t = 0; t < 16; ++t) bw[t] = 0u;
            }
            const auto rw = [&](int u) { return c[u / TW][u % TW]; };  // (flat word u: load_mma's)
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int st = 0; st < 8; ++st) {
                uint32_t af[4];
                mma_a_frag(af, rw, st);
                mma_16816(d, af, bw[2 * st], bw[2 * st + 1], lane);
            }
            const int src = 4 * ((4 * g + (s & 3)) & 7) + (s >> 2);
            const float lo = __shfl_sync(0xffffffffu, d[0] + d[1], src);
            const float hi = __shfl_sync(0xffffffffu, d[2] + d[3], src);
            const float dot = g < 2 ? lo : hi;  // (the warp's rows 0-7 are groups 0 and 1)
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
#if RC_MMA && RC_FP8
                const float v = i == (s & 3) ? dot * rsc[0][i] : 0.0f;  // (the fp8 copy's V-row scale)
#else
                const float v = i == (s & 3) ? dot : 0.0f;
#endif
                aq[i] = s < 4 ? v : 0.0f;
                ak[i] = s < 4 ? 0.0f : v;
            }
        } else
#elif HAS_RC
        if (from_rc) {
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
                float f[16];
                unpack16_rc(c[i], f, (ch % RC_CH) * RC_NACC);
                aq[i] = 0.0f;
                ak[i] = 0.0f;
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    aq[i] += f[e] * qk_sm[qk_at(rc_col(s, e))];
                    ak[i] += f[e] * qk_sm[QK_ROW + qk_at(rc_col(s, e))];
                }
#if RC_FP8
                aq[i] *= rsc[ch % RC_CH][i];
                ak[i] *= rsc[ch % RC_CH][i];
#endif
            }
        } else
#endif
#if RC_LEAN
        {
            // a folding block (1 row in L): the checkpoint's words of its rows, word t of each row at a time (the
            // registers of one copy tile), its columns xl_col(s, 4t ..) dotted as they land
#pragma unroll
            for (int i = 0; i < RPL; ++i) aq[i] = ak[i] = 0.0f;
#pragma unroll 1
            for (int t = 0; t < (fold_out ? 0 : NACC); ++t) {  // (FOLD_OUT: the fold makes the outputs)
                uint4 w[RPL];
#pragma unroll
                for (int i = 0; i < RPL; ++i)
                    w[i] = __ldg(reinterpret_cast<const uint4*>(
                        src + static_cast<long long>(row0 + ch * VT + lrow + i) * K_ + CPA * s + 8 * CPA * t));
#pragma unroll
                for (int i = 0; i < RPL; ++i) {
                    const float f[4] = {__uint_as_float(w[i].x), __uint_as_float(w[i].y), __uint_as_float(w[i].z),
                                        __uint_as_float(w[i].w)};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        aq[i] += f[e] * qk_sm[qk_at(xl_col(s, 4 * t + e))];
                        ak[i] += f[e] * qk_sm[QK_ROW + qk_at(xl_col(s, 4 * t + e))];
                    }
                }
            }
        }
#else
        {
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
                float f[16];
                unpack16(c[i], f, static_cast<const ST_T*>(nullptr));
                aq[i] = 0.0f;
                ak[i] = 0.0f;
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    aq[i] += f[e] * qk_sm[qk_at(xl_col(s, e))];
                    ak[i] += f[e] * qk_sm[QK_ROW + qk_at(xl_col(s, e))];
                }
            }
        }
#endif
#if LATE_COEF || SELF_PRE == 2
        if (ch == 0) load_coef();  // (SELF_PRE 2: the record dots and the block's barrier after the tile's dots)
#endif
        const float wq = s_q * e_t, wk = s_k * e_t;
        float val[NVAL];
#pragma unroll
        for (int i = 0; i < RPL; ++i) {
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int t = 0; t < JX; ++t) {
                sq += ru[i][t] * cq[t];
                sk += ru[i][t] * ck[t];
            }
            val[2 * i] = aq[i] * wq + sq;
            val[2 * i + 1] = ak[i] * wk + sk;
        }
        const float xv_now = x_v;
        // the next tile in flight through this tile's reduction and epilogue (a folding block issues it after its fold,
        // which still reads this tile's records)
        if (!fold && ch + 1 < NCH) {
            load_tile(ch + 1);
            load_rows(ch + 1);
        }
        const float P = xl_reduce(val, lane);
        const float Q = __shfl_down_sync(0xffffffffu, P, 8 / NVAL);  // the Q of the finisher's row
        const float u_t = beta * (xv_now - Q);
        const float o = P + u_t * kq;
        const int vrow = row0 + ch * VT + frow;
#if DIAG_STREAM == 1
        if (finisher) from_f(out + nh * V_ + vrow, P + Q);
        continue;
#endif
        if (finisher && !fold_out) {  // (FOLD_OUT: a flush, whose output the fold writes and which stores no record)
            from_f(out + nh * V_ + vrow, o);
#if REC_SPLIT
            // (a pre-folding row's record goes to position 0, whose low half its fold reads: stored after the fold)
            if (!flush && !prefold) rec_store(base_u + h_eff * V_ + vrow, base_u_lo + h_eff * V_ + vrow, u_t);
#else
            if (!flush) from_f(base_u + h_eff * V_ + vrow, u_t);
#endif
        }
        if (fold) {
            // write the checkpoint: the h_old records (and this token on a flush or a rebase) folded into the tile
            const bool tok = flush || rebase;
#if REC_SPLIT
            // (the exact fp32 records: the high plane's values as the dots read them, joined with the low plane; a
            // pre-folding row's u_t, bound for record 0, is stored after this)
            const auto ru_of = [&](int i, int t) {
                return rec_join(ru[i][t], base_u_lo[(j0 + t) * V_ + row0 + ch * VT + lrow + i]);
            };
#else
            const auto ru_of = [&](int i, int t) { return ru[i][t]; };
#endif
#if IS_KDA
            // per column: the tile decays by e^{G_f}, every predecayed key k_j e^{-G_j} by e^{G_f / 2} twice; the
            // records go in as they are (no per-record weight)
            const float* base_gk = ring_g + (rrow * HV_ + hv) * CAP_ * K_ + 4 * lane;
            const float4 G_f4 = tok ? *reinterpret_cast<const float4*>(gts + nh * K_ + 4 * lane)
                                    : (h_old > 0 ? *reinterpret_cast<const float4*>(base_gk + (h_old - 1) * K_)
                                                 : make_float4(0.f, 0.f, 0.f, 0.f));
            const float4 eG = exp4(G_f4, 1.0f), eh = exp4(G_f4, 0.5f);
#pragma unroll
            for (int i = 0; i < RPL; ++i)
#pragma unroll
                for (int t = 0; t < JX; ++t) wsm[(lrow + i) * BC_ + j0 + t] = j0 + t < h_old ? ru_of(i, t) : 0.0f;
#else
            const float sp = x_gate <= 20.0f ? logf(1.0f + expf(x_gate)) : x_gate;
            const float g_t = -expf(a_log) * sp;
            const float G_f = tok ? G_last + g_t : G_last;
            const float eG1 = expf(G_f);
            const float4 eG = make_float4(eG1, eG1, eG1, eG1), eh = eG;  // (eh: KDA's key factor, not used for GDN)
#pragma unroll
            for (int i = 0; i < RPL; ++i)
#pragma unroll
                for (int t = 0; t < JX; ++t)
                    wsm[(lrow + i) * BC_ + j0 + t] = j0 + t < h_old ? ru_of(i, t) * expf(G_f - base_g[j0 + t]) : 0.0f;
#endif
            if (finisher) uasm[frow] = tok && !fold_out ? u_t : 0.0f;  // (FOLD_OUT: u_t is the fold's, below)
            __syncwarp();
            // the fold itself in the other layout (lane l on columns 4l .. 4l + 3 of every row of the warp, 8 rows at a
            // time): its decayed records and this token's u_t are in shared memory, so any lane can take any row, and
            // then each record key is one 16-byte load per lane shared by 8 rows, KB records per round trip
#if REC_SPLIT
            const long long k_at = ((rrow * HK_ + (IS_KDA ? hv : i_h)) * CAP_) * K_ + 4 * lane;
            const FoldKeys base_k = {ring_k + k_at, ring_k_lo + k_at};
#else
            const KR_T* base_k = ring_k + ((rrow * HK_ + (IS_KDA ? hv : i_h)) * CAP_) * K_ + 4 * lane;
#endif
            float4 kn;
            float sk_t = s_k;  // (1 / |k|: the token's key is its raw k times it)
            if (qk_staged) {
                const float* kr = k_raw + qk_at(4 * lane);
                kn = make_float4(kr[0] * s_k, kr[1] * s_k, kr[2] * s_k, kr[3] * s_k);
            } else {  // (the tensor cores' dots staged no q, k: this lane's 4 columns of k, its norm over the warp)
                const float4 kx = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
                const float sk = 1.0f / sqrtf(warp_sum(kx.x * kx.x + kx.y * kx.y + kx.z * kx.z + kx.w * kx.w) + 1e-6f);
                kn = make_float4(kx.x * sk, kx.y * sk, kx.z * sk, kx.w * sk);
                sk_t = sk;
            }
            const long long wrow = static_cast<long long>(row0 + ch * VT + warp * RPW);  // the warp's first row
#if MMA_FOLD
            // the warp's 16 rows on the tensor cores (fold_mma), the token's raw key and its norm from above
#if IS_KDA
            const float* gf = tok ? gts + nh * K_ : (h_old > 0 ? ring_g + ((rrow * HV_ + hv) * CAP_ + h_old - 1) * K_
                                                              : nullptr);
#else
            const float* gf = nullptr;
#endif
#if HAS_RC
            RC_T* rdst = rc + (rrow * HV_ + hv) * static_cast<long long>(V_) * K_ + wrow * K_;
            float* sdst = RC_FP8 ? rc_scale + (rrow * HV_ + hv) * V_ + wrow : nullptr;  // (bf16: no scales)
#else
            RC_T* rdst = nullptr;
            float* sdst = nullptr;
#endif
            fold_mma(src + wrow * K_, state + slot * stride_slot + static_cast<long long>(hv) * V_ * K_ + wrow * K_,
                     wsm + warp * RPW * BC_, uasm + warp * RPW, base_k - 4 * lane, h_old, eG.x, gf,
                     px + H_ * K_ + i_h * K_, sk_t, rdst, sdst, lane);
            (void)kn;
            (void)eh;
#else
            const ST_T* fsrc = src + wrow * K_ + 4 * lane;
            ST_T* fdst = state + slot * stride_slot + static_cast<long long>(hv) * V_ * K_ + wrow * K_ + 4 * lane;
            // rows folded at a time (RC_LEAN, ST_MMA: half the registers; FOLD_OUT 2: 8)
            constexpr int FR = FOLD_OUT == 2 ? 8 : (RC_LEAN || ST_MMA) ? 4 : 8;
            constexpr bool FPF = FOLD_OUT == 3;  // (FOLD_OUT 3: the next FR rows loaded before these are folded)
            float4 cf[FR], cn[FR];
#pragma unroll
            for (int i = 0; i < FR; ++i) cf[i] = ld_state4(fsrc + i * K_);
#pragma unroll
            for (int r0 = 0; r0 < RPW; r0 += FR) {
                if (r0 > 0 && !FPF) {
#pragma unroll
                    for (int i = 0; i < FR; ++i) cf[i] = ld_state4(fsrc + (r0 + i) * K_);
                }
                if (FPF && r0 + FR < RPW) {
#pragma unroll
                    for (int i = 0; i < FR; ++i) cn[i] = ld_state4(fsrc + (r0 + FR + i) * K_);
                }
#if FOLD_OUT
                // (the rows' v: lane i < FR holds row r0 + i's, handed round after the dots)
                const float xv = fold_out && lane < FR ? to_f(pv[wrow + r0 + lane]) : 0.0f;
#endif
                float4 rk[KB];
#pragma unroll
                for (int t = 0; t < KB; ++t) rk[t] = t < h_old ? load4(base_k + t * K_) : make_float4(0.f, 0.f, 0.f, 0.f);
                fold_rows<FR>(cf, rk, wsm, uasm, warp * RPW + r0, eG, eh, kn, base_k, h_old);
#if FOLD_OUT
                if (fold_out) {
                    // the folded rows (the token not yet in: uasm is 0) dotted with q~ and k~, summed over the warp
                    // (an xor butterfly: every lane ends with the same sums), then each row's u_t and output, and the
                    // token's u_t k~ into the rows before they are stored
                    const float* qr = qk_sm + qk_at(4 * lane);  // (this lane's 4 columns of q; k~ is kn)
                    const float4 q4 = make_float4(qr[0] * s_q, qr[1] * s_q, qr[2] * s_q, qr[3] * s_q);
                    float d[2 * FR];
#pragma unroll
                    for (int i = 0; i < FR; ++i) {
                        d[2 * i] = cf[i].x * q4.x + cf[i].y * q4.y + cf[i].z * q4.z + cf[i].w * q4.w;
                        d[2 * i + 1] = cf[i].x * kn.x + cf[i].y * kn.y + cf[i].z * kn.z + cf[i].w * kn.w;
                    }
#pragma unroll
                    for (int m = 16; m >= 1; m >>= 1)
#pragma unroll
                        for (int e = 0; e < 2 * FR; ++e) d[e] += __shfl_xor_sync(0xffffffffu, d[e], m);
#pragma unroll
                    for (int i = 0; i < FR; ++i) {
                        const float ui = beta * (__shfl_sync(0xffffffffu, xv, i) - d[2 * i + 1]);
                        if (lane == i) from_f(out + nh * V_ + wrow + r0 + i, d[2 * i] + ui * kq);
                        cf[i] = make_float4(cf[i].x + ui * kn.x, cf[i].y + ui * kn.y, cf[i].z + ui * kn.z,
                                            cf[i].w + ui * kn.w);
                    }
                }
#endif
#pragma unroll
                for (int i = 0; i < FR; ++i) st_state4(fdst + (r0 + i) * K_, cf[i]);
#if HAS_RC
                // the read copy from the same unrounded values (issue 7: written where the checkpoint is)
                RC_T* rdst = rc + (rrow * HV_ + hv) * static_cast<long long>(V_) * K_ + wrow * K_ + 4 * lane;
                float* sdst = RC_FP8 ? rc_scale + (rrow * HV_ + hv) * V_ + wrow : nullptr;  // (bf16: no scales)
#pragma unroll
                for (int i = 0; i < FR; ++i) rc_store_row(rdst + (r0 + i) * K_, sdst + r0 + i, cf[i], lane);
#endif
                if (FPF) {
#pragma unroll
                    for (int i = 0; i < FR; ++i) cf[i] = cn[i];
                }
            }
#endif  // MMA_FOLD
            __syncwarp();  // (wsm and uasm are taken again by the next tile)
#if REC_SPLIT
            if (finisher && prefold && !flush) rec_store(base_u + vrow, base_u_lo + vrow, u_t);  // (h_eff = 0)
#endif
            if (ch + 1 < NCH) {
                load_tile(ch + 1);
                load_rows(ch + 1);
            }
        }
    }
}
#endif  // XL

// The pre launches (a ring capacity of at most 16: a row's 2 x 16 record dots are one value per lane of a warp)
#if CAP_ <= 16 && BC_ <= 16
#ifndef PRE_MINB
// __launch_bounds__'s minimum one-warp blocks per SM for the pre launch: GDN 32 (64 registers: B = 256's 4,096 items in
// one wave on the H200), KDA 28 (72 registers: at 64 its 16 fp32 record loads in flight spill 36 bytes, ptxas sm_90)
#define PRE_MINB (IS_KDA ? 28 : 32)
#endif
// one step of a warp's reduce-scatter: lanes with bit S set keep values S .. 2S - 1 (moved to 0 .. S - 1), the others
// values 0 .. S - 1, each adding its partner's (lane ^ S) copy of them
template <int S>
__device__ __forceinline__ void rs_half(float (&v)[32], int lane) {
    const bool upper = (lane & S) != 0;
#pragma unroll
    for (int i = 0; i < S; ++i) {
        const float lo = v[i], hi = v[i + S];
        v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, S);
    }
}
// the whole reduce-scatter (31 shuffles): lane l ends with the warp's sum of value l in v[0]. (One step per halving,
// each with a compile-time count: written as reduce_scatter's loop over s, nvcc kept the 32 values in local memory.)
__device__ __forceinline__ float rs_32(float (&v)[32], int lane) {
    rs_half<16>(v, lane);
    rs_half<8>(v, lane);
    rs_half<4>(v, lane);
    rs_half<2>(v, lane);
    rs_half<1>(v, lane);
    return v[0];
}

// what a pre launch's (row, head) does this step (decode._decode_rule_rc): h, a pre-fold, a flush, an append of the
// token's record at h_eff; with a read copy a row whose copy is stale (rc_valid[ring row] == 0) flushes as if forced
struct PreRule {
    int h_old, h_eff;
    bool prefold, flush, append;
};
__device__ __forceinline__ PreRule pre_rule(const int* __restrict__ ring_h, const int* __restrict__ h_rows,
                                            const FORCED_T* __restrict__ forced, const int* __restrict__ rc_valid,
                                            int n, long long rrow, int L) {
    PreRule r;
#if HAS_H_ROWS
    r.h_old = h_rows[n];
#else
    r.h_old = ring_h[rrow];
#endif
#if HAS_FORCED
    bool is_forced = forced[n] != 0;
#else
    bool is_forced = false;
#endif
#if HAS_RC
    is_forced = is_forced || rc_valid[rrow] == 0;
#endif
    r.prefold = r.h_old >= L;
    r.h_eff = r.prefold ? 0 : r.h_old;
    r.flush = (r.h_eff + 1 >= L) || is_forced;
    r.append = !r.flush && !r.prefold;
    return r;
}

#if FLUSH_FIRST
// FLUSH_FIRST: the main launch's row order, written by one warp of the pre launch (its grid's first block, so that it
// runs beside the rest): order[i] is the batch row that the main launch's blocks of row FF_FROM + i take. The rows
// from FF_FROM on that fold this step (a flush or a pre-fold by the decode rule, pre_rule: what makes a main block read
// and write its fp32 checkpoint, several times a plain block's time) come first in batch order, the others after
// them (in reverse batch order: each lane places them from the back). Padded rows count as plain. The flags of
// 32 FF_RPL rows are loaded at once (two round trips: the slots, then h and the flags).
__device__ __forceinline__ void order_rows(const int* __restrict__ ring_h, const int* __restrict__ h_rows,
                                           const SLOT_T* __restrict__ slot_idx, const FORCED_T* __restrict__ forced,
                                           const RIDX_T* __restrict__ ring_idx, const int* __restrict__ rc_valid,
                                           int L, int B, int* __restrict__ order, int lane) {
    const int m = B - FF_FROM;  // the rows ordered
    const unsigned below = (1u << lane) - 1u;
    int nf = 0, np = 0;  // folding rows placed from the front, the others from the back
    for (int base = FF_FROM; base < B; base += 32 * FF_RPL) {
        long long slot[FF_RPL], rrow[FF_RPL];
#pragma unroll
        for (int i = 0; i < FF_RPL; ++i) {
            const int n = base + 32 * i + lane;
            slot[i] = rrow[i] = -1;
            if (n < B) slot_and_ring_row(slot_idx, ring_idx, n, slot[i], rrow[i]);
        }
        bool fold[FF_RPL];
#pragma unroll
        for (int i = 0; i < FF_RPL; ++i) {
            const int n = base + 32 * i + lane;
            fold[i] = false;
            if (n < B && slot[i] >= 0) {
                const PreRule r = pre_rule(ring_h, h_rows, forced, rc_valid, n, rrow[i], L);
                fold[i] = r.flush || r.prefold;
            }
        }
#pragma unroll
        for (int i = 0; i < FF_RPL; ++i) {
            const int n = base + 32 * i + lane;
            const unsigned mf = __ballot_sync(0xffffffffu, n < B && fold[i]);
            const unsigned mp = __ballot_sync(0xffffffffu, n < B && !fold[i]);
            if (n < B) {
                if (fold[i])
                    order[nf + __popc(mf & below)] = n;
                else
                    order[m - 1 - np - __popc(mp & below)] = n;
            }
            nf += __popc(mf);
            np += __popc(mp);
        }
    }
}
#endif

// FLUSH_FIRST's pre grid is (key heads, B + 1): its first row of blocks orders the main launch's rows (the row's
// first block calls order_rows) and computes nothing else. True for those blocks (never without FLUSH_FIRST).
__device__ __forceinline__ bool ordering_block(const int* __restrict__ ring_h, const int* __restrict__ h_rows,
                                               const SLOT_T* __restrict__ slot_idx, const FORCED_T* __restrict__ forced,
                                               const RIDX_T* __restrict__ ring_idx, const int* __restrict__ rc_valid,
                                               int L, int n_rows, int* __restrict__ order, int lane) {
#if FLUSH_FIRST
    if (blockIdx.y != 0) return false;
    if (blockIdx.x == 0) order_rows(ring_h, h_rows, slot_idx, forced, ring_idx, rc_valid, L, n_rows, order, lane);
    return true;
#else
    (void)ring_h, (void)h_rows, (void)slot_idx, (void)forced, (void)ring_idx, (void)rc_valid, (void)L, (void)n_rows;
    (void)order, (void)lane;
    return false;
#endif
}

// q~ = scale q / |q| and k~ = k / |k| of this lane's 4 columns, as _pre_row makes them (a division by the norm, then
// the scale), and <k~, q~>; the norms |q|, |k| into nq, nk
__device__ __forceinline__ float pre_qk(float4& q, float4& k, float scale, float& nq, float& nk) {
    nq = sqrtf(warp_sum(q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w) + 1e-6f);
    nk = sqrtf(warp_sum(k.x * k.x + k.y * k.y + k.z * k.z + k.w * k.w) + 1e-6f);
    q = make_float4(q.x / nq * scale, q.y / nq * scale, q.z / nq * scale, q.w / nq * scale);
    k = make_float4(k.x / nk, k.y / nk, k.z / nk, k.w / nk);
    return warp_sum(k.x * q.x + k.y * q.y + k.z * q.z + k.w * q.w);
}
__device__ __forceinline__ float pre_qk(float4& q, float4& k, float scale) {
    float nq, nk;
    return pre_qk(q, k, scale, nq, nk);
}

#if TC_DOTS
// the main launch's tensor-core operand (RC_MMA, ST_MMA) from this lane's 4 columns of raw q and k and their norms nq,
// nk (pre_qk's): B's columns 0-3 are q / |q| and k / |k| (KDA, GATED: times e = e^{G_t} of the column, as the main
// launch's CUDA-core dots take them) split into high and low parts of the fragments' type (f16: x = hi + lo to
// ~2^-22 relative, |x| <= 1; bf16: to ~2^-17), columns 4-7 zero (not stored: main's lanes 16-31 hold them). Columns
// 4l .. 4l + 3 are K-step s of the lanes with tig (mma_col), so this lane writes word pair (b0, b1) of K-step s for
// the 4 main lanes gid 0-3 (= B's column) with that tig.
template <bool GATED>
__device__ __forceinline__ void mma_operand(unsigned int* __restrict__ frag, float4 q, float4 k, float nq, float nk,
                                            float4 e, int lane) {
    float v[2][4] = {{q.x / nq, q.y / nq, q.z / nq, q.w / nq}, {k.x / nk, k.y / nk, k.z / nk, k.w / nk}};
    if (GATED) {
#pragma unroll
        for (int j = 0; j < 2; ++j) v[j][0] *= e.x, v[j][1] *= e.y, v[j][2] *= e.z, v[j][3] *= e.w;
    }
    constexpr int RUN = 64 / MMA_EB, PER = 16 / MMA_EB;  // (a run's columns over the 4 tig; one lane's share)
    const int c0 = 4 * lane, tig = (c0 % RUN) / PER, s = (c0 / RUN) * MMA_SPR + (c0 % PER) / 4;  // mma_col(tig, s) == c0
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            hi[e] = mma_bits(v[j][e]);
            lo[e] = mma_bits(v[j][e] - mma_float(hi[e]));
        }
        unsigned int* dh = frag + ((4 * (2 * j) + tig) * 8 + s) * 2;  // column 2 j (hi) at main lane 4 (2 j) + tig
        unsigned int* dl = frag + ((4 * (2 * j + 1) + tig) * 8 + s) * 2;  // column 2 j + 1 (lo)
        dh[0] = hi[0] | (hi[1] << 16);
        dh[1] = hi[2] | (hi[3] << 16);
        dl[0] = lo[0] | (lo[1] << 16);
        dl[1] = lo[2] | (lo[3] << 16);
    }
}
#endif

// this lane's parts of a row's 2 x 16 record dots, <r_j, qa> in v[j] and <r_j, ka> in v[16 + j] for j < h (positions
// past h and past CAP: zero), then reduce-scattered: lane l returns dot l. HALVES (KDA): each product is weighted by
// e twice, (r qa) e with qa = q e (e = e^{G_t / 2}), the Triton launches' order, so that e^{G_t - G_j} survives where
// e^{G_t} alone would underflow
// (record_dots_with: record j's four columns from rec(j), which record_dots loads and a caller may have in registers)
template <bool HALVES, typename Rec>
__device__ __forceinline__ float record_dots_with(Rec rec, int h_old, float4 qa, float4 ka, float4 e, int lane) {
    float v[32];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        v[j] = 0.0f;
        v[16 + j] = 0.0f;
        if (j < CAP_) {
            const float4 r = j < h_old ? rec(j) : make_float4(0.f, 0.f, 0.f, 0.f);
            // (a select, not a product: a stale record past h may hold anything, NaN included)
            if (HALVES) {
                v[j] = j < h_old ? (r.x * qa.x) * e.x + (r.y * qa.y) * e.y + (r.z * qa.z) * e.z + (r.w * qa.w) * e.w
                                 : 0.0f;
                v[16 + j] = j < h_old ? (r.x * ka.x) * e.x + (r.y * ka.y) * e.y + (r.z * ka.z) * e.z
                                            + (r.w * ka.w) * e.w
                                      : 0.0f;
            } else {
                v[j] = j < h_old ? r.x * qa.x + r.y * qa.y + r.z * qa.z + r.w * qa.w : 0.0f;
                v[16 + j] = j < h_old ? r.x * ka.x + r.y * ka.y + r.z * ka.z + r.w * ka.w : 0.0f;
            }
        }
    }
    return rs_32(v, lane);
}
template <bool HALVES>
__device__ __forceinline__ float record_dots(const KR_T* __restrict__ base_k, int h_old, float4 qa, float4 ka,
                                             float4 e, int lane) {
    return record_dots_with<HALVES>([&](int j) { return load4(base_k + j * K_); }, h_old, qa, ka, e, lane);
}
#if PRE_EARLY
// (PRE_EARLY) this lane's four columns of the h key records, zero past h, loads issued at once: bf16 records as word
// pairs (all 16; record_dots_with takes them through bf16x4_of), fp32 records the first PRE_EARLY_F32 (none without
// it: 64 registers for all 16)
constexpr int EARLY_F32 = PRE_EARLY_F32 > 0 ? PRE_EARLY_F32 : 1;  // (an array's size; unused at 0)
struct EarlyRecords {
    uint2 w[sizeof(KR_T) == 2 ? 16 : 1];            // bf16 records
    float4 f[sizeof(KR_T) == 2 ? 1 : EARLY_F32];  // fp32 records [0, PRE_EARLY_F32)
};
__device__ __forceinline__ void record_words(const KR_T* base_k, int h_old, EarlyRecords& er) {
    if constexpr (sizeof(KR_T) == 2) {
#pragma unroll
        for (int j = 0; j < 16; ++j)
            er.w[j] = j < CAP_ && j < h_old ? *reinterpret_cast<const uint2*>(base_k + j * K_) : make_uint2(0u, 0u);
    } else {
#pragma unroll
        for (int j = 0; j < PRE_EARLY_F32; ++j)
            er.f[j] = j < CAP_ && j < h_old ? load4(base_k + j * K_) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}
// the record dots from record_words' records; fp32 records past PRE_EARLY_F32 loaded where the dots need them
template <bool HALVES>
__device__ __forceinline__ float record_dots_early(const KR_T* __restrict__ base_k, const EarlyRecords& er,
                                                   int h_old, float4 qa, float4 ka, float4 e, int lane) {
    if constexpr (sizeof(KR_T) == 2) {
        return record_dots_with<HALVES>([&](int j) { return bf16x4_of(er.w[j]); }, h_old, qa, ka, e, lane);
    } else {
        return record_dots_with<HALVES>(
            [&](int j) { return j < PRE_EARLY_F32 ? er.f[j < PRE_EARLY_F32 ? j : 0] : load4(base_k + j * K_); },
            h_old, qa, ka, e, lane);
    }
}
#endif
#if PRE_PF
// (PRE_PF) value head hv's tile of batch row n as the main launch will read it, into L2: the read copy's where the row
// reads it (HAS_RC, no flush, no pre-fold), else the checkpoint's; one bulk prefetch (a hint: no value changes)
__device__ __forceinline__ void prefetch_tile(const ST_T* state, const RC_T* rc, long long slot, long long rrow,
                                              int hv, const PreRule& rule) {
    constexpr long long T = static_cast<long long>(V_) * K_;
    const void* p = state + (slot * HV_ + hv) * T;
    unsigned int bytes = static_cast<unsigned int>(T * sizeof(ST_T));
#if HAS_RC
    if (!rule.flush && !rule.prefold) {
        p = rc + (rrow * HV_ + hv) * T;
        bytes = static_cast<unsigned int>(T * sizeof(RC_T));
    }
#endif
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p;
    (void)bytes;
#endif
}
#endif
#endif

#if !IS_KDA && CAP_ <= 16 && BC_ <= 16
// The pre launch of decode v3 for GDN, in CUDA (decode_v3.launch(pre_impl="cuda"), the default beside the CUDA main
// launch since session 32; docs/design.md "Session 31, second part"). It computes what decode_v3._pre_row computes
// for one (row, key head), one warp per block, grid (H, B) (a row's key heads dispatched together), lane l on K
// columns [4l, 4l + 4):
//   q~ = scale q / |q|, k~ = k / |k|, <k~, q~>; the record dots <k_j, q~>, <k_j, k~> for j < h (a reduce-scatter
//   leaves dot (lane mod 16) of q~ (lanes 0-15) or k~ (lanes 16-31) in each lane); for each value head of the key
//   head: G_t = G_{h-1} + g_t, the coefficients c_j = <k_j, q~> e^{G_t - G_j}, d_j = <k_j, k~> e^{G_t - G_j}
//   (coef), e^{G_t} and <k~, q~> (scal), and on a row that appends, G_t into the ring; then the token's key k~.
// Padded rows write nothing. With USE_PDL it lets the main launch (its programmatic dependent) start at once.
extern "C" __global__ void __launch_bounds__(32, PRE_MINB) replay_gdn_pre(
    const X_T* __restrict__ mixed_qkv, const A_T* __restrict__ a, const ALOG_T* __restrict__ A_log,
    const DTB_T* __restrict__ dt_bias, KR_T* __restrict__ ring_k, float* __restrict__ ring_g,
    const int* __restrict__ ring_h, const int* __restrict__ h_rows, const SLOT_T* __restrict__ slot_idx,
    const FORCED_T* __restrict__ forced, const RIDX_T* __restrict__ ring_idx, float* __restrict__ coef,
    float* __restrict__ scal, float scale, float lower_bound, int L, long long stride_qkv, long long stride_a,
    const int* __restrict__ rc_valid, unsigned int* __restrict__ qk_frag, const ST_T* __restrict__ pf_state,
    const RC_T* __restrict__ pf_rc, unsigned short* __restrict__ ring_k_lo, int* __restrict__ order, int n_rows) {
    pre_prologue();
    const int lane = threadIdx.x;
    if (ordering_block(ring_h, h_rows, slot_idx, forced, ring_idx, rc_valid, L, n_rows, order, lane)) return;
    const int i_h = blockIdx.x, n = blockIdx.y - FLUSH_FIRST;  // (FLUSH_FIRST: the grid's first row orders)
    constexpr int R = HV_ / H_;  // value heads per key head
    const X_T* px = mixed_qkv + static_cast<long long>(n) * stride_qkv;
#if PRE_EARLY
    // what waits for no index first, so that its round trip overlaps the slot's and h's: q, k and the value heads'
    // gate inputs (a padded row reads them and writes nothing)
    float4 q = load4(px + i_h * K_ + 4 * lane);
    float4 k = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
    float gx[R], gA[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        gx[r] = to_f(a[n * stride_a + i_h * R + r]) + to_f(dt_bias[i_h * R + r]);
        gA[r] = to_f(A_log[i_h * R + r]);
    }
#endif
    long long slot, rrow;
    slot_and_ring_row(slot_idx, ring_idx, n, slot, rrow);
    if (slot < 0) return;  // padding: nothing written (the main launch zeroes its output)
    const PreRule rule = pre_rule(ring_h, h_rows, forced, rc_valid, n, rrow, L);
    const int h_old = rule.h_old, h_eff = rule.h_eff;
    const bool append = rule.append;
#if !PRE_EARLY
    float4 q = load4(px + i_h * K_ + 4 * lane);
    float4 k = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
#endif
    const KR_T* base_k = ring_k + ((rrow * H_ + i_h) * CAP_) * K_ + 4 * lane;
    const int j = lane & 15;
    const bool valid = j < h_old && j < CAP_;
#if PRE_EARLY
    // the value heads' G at this lane's record, loaded beside the key records (both wait only for h)
    float rgs[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rgs[r] = valid ? ring_g[(rrow * HV_ + i_h * R + r) * CAP_ + j] : 0.0f;
    // bf16 records: the h key records' words too (as KDA's), ahead of the tensor-core operand's stores, which the
    // compiler would otherwise keep them behind; fp32 records (64 registers for 16): the first PRE_EARLY_F32, the
    // rest where the dots need them
    EarlyRecords er;
    record_words(base_k, h_old, er);
#endif
#if PRE_PF
    if (n < PRE_PF && lane < R) prefetch_tile(pf_state, pf_rc, slot, rrow, i_h * R + lane, rule);
#endif
#if TC_DOTS
    const float4 q_raw = q, k_raw = k;
#endif
    float nq, nk;
    const float kq = pre_qk(q, k, scale, nq, nk);
#if TC_DOTS
    mma_operand<false>(qk_frag + (static_cast<long long>(n) * H_ + i_h) * FRAG_WORDS, q_raw, k_raw, nq, nk,
                       make_float4(1.f, 1.f, 1.f, 1.f), lane);
#endif

    // lane l: <k_l, q~> (l < 16) or <k_{l - 16}, k~>
#if PRE_EARLY
    const float dot = record_dots_early<false>(base_k, er, h_old, q, k, q, lane);
#else
    const float dot = record_dots<false>(base_k, h_old, q, k, q, lane);
#endif

#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int hv = i_h * R + r;
        float* base_g = ring_g + (rrow * HV_ + hv) * CAP_;
#if PRE_EARLY
        const float rg = rgs[r], x = gx[r], A = __expf(gA[r]);
#else
        const float rg = valid ? base_g[j] : 0.0f;
        const float x = to_f(a[n * stride_a + hv]) + to_f(dt_bias[hv]);
        const float A = __expf(to_f(A_log[hv]));
#endif
        const float g_prev = __shfl_sync(0xffffffffu, rg, h_old > 0 ? h_old - 1 : 0);  // G_{h-1}: lane h - 1's
        const float G_last = h_old > 0 ? g_prev : 0.0f;
        const float G_t = G_last + gate_of(x, A, lower_bound);
        const float w = valid ? __expf(G_t - rg) : 0.0f;
        float* pc = coef + (static_cast<long long>(n) * HV_ + hv) * 2 * BC_;
        if (j < BC_) pc[(lane < 16 ? 0 : BC_) + j] = dot * w;
        if (lane == 0) {
            scal[(static_cast<long long>(n) * HV_ + hv) * 2] = __expf(G_t);
            scal[(static_cast<long long>(n) * HV_ + hv) * 2 + 1] = kq;
            if (append) base_g[h_eff] = G_t;
        }
    }
    if (append) {
        KR_T* dst = ring_k + ((rrow * H_ + i_h) * CAP_ + h_eff) * K_ + 4 * lane;
#if REC_SPLIT
        store_key(dst, ring_k_lo + (dst - ring_k), k);
#else
        from_f(dst, k.x);
        from_f(dst + 1, k.y);
        from_f(dst + 2, k.z);
        from_f(dst + 3, k.w);
#endif
    }
}
#endif

#if IS_KDA && CAP_ <= 16 && BC_ <= 16
__device__ __forceinline__ float warp_min(float x) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) x = fminf(x, __shfl_xor_sync(0xffffffffu, x, s));
    return x;
}

// The pre launch of decode v3 for KDA with predecayed key records (records k_j e^{-G_j}), in CUDA
// (decode_v3.launch(pre_impl="cuda"); the default beside KDA's CUDA main launch once measured, docs/design.md
// "Session 32"). It computes what decode_v3._pre_row computes for KDA (PRED) for one (row, value head) (KDA's key
// heads are its value heads), one warp per block, grid (HV, B), lane l on K columns [4l, 4l + 4):
//   q~, k~ of the value head's query head, <k~, q~> (scal); G_t = G_{h-1} + g_t per column (SGLang's KDA gate), into
//   gts where the main launch takes it from there (gt_pre shapes; gts null otherwise);
//   the coefficients c_j = <k_j e^{-G_j}, q~ e^{G_t}>, d_j = <k_j e^{-G_j}, k~ e^{G_t}> for j < h (coef), e^{G_t}
//   applied in two halves as (r e^{G_t/2}) e^{G_t/2}, so a weight e^{G_t - G_j} survives where e^{G_t} would
//   underflow; a head whose G_t falls below min_g in any column raises its overflow flag (ovf[ring row, head] on a
//   row that appends: rebased, its record appended as zeros with G = 0) or the row's (ovf[ring row, HV] on a row that
//   pre-folds: it flushes); on a row that appends, the token's record k~ e^{-max(G_t, min_g)} and G_t.
// Padded rows write nothing. With USE_PDL it lets the main launch (its programmatic dependent) start at once.
extern "C" __global__ void __launch_bounds__(32, PRE_MINB) replay_kda_pre(
    const X_T* __restrict__ mixed_qkv, const A_T* __restrict__ a, const ALOG_T* __restrict__ A_log,
    const DTB_T* __restrict__ dt_bias, KR_T* __restrict__ ring_k, float* __restrict__ ring_g,
    const int* __restrict__ ring_h, const int* __restrict__ h_rows, const SLOT_T* __restrict__ slot_idx,
    const FORCED_T* __restrict__ forced, const RIDX_T* __restrict__ ring_idx, float* __restrict__ coef,
    float* __restrict__ scal, float* __restrict__ gts, int* __restrict__ ovf, float scale, float lower_bound,
    float min_g, int L, long long stride_qkv, long long stride_a, const int* __restrict__ rc_valid,
    unsigned int* __restrict__ qk_frag, const ST_T* __restrict__ pf_state, const RC_T* __restrict__ pf_rc,
    unsigned short* __restrict__ ring_k_lo, int* __restrict__ order, int n_rows) {
    pre_prologue();
    const int lane = threadIdx.x;
    if (ordering_block(ring_h, h_rows, slot_idx, forced, ring_idx, rc_valid, L, n_rows, order, lane)) return;
    const int hv = blockIdx.x, n = blockIdx.y - FLUSH_FIRST;  // (FLUSH_FIRST: the grid's first row orders)
    const int i_h = hv / (HV_ / H_);  // the value head's query head
    const X_T* px = mixed_qkv + static_cast<long long>(n) * stride_qkv;
#if PRE_EARLY
    // what waits for no index first (as GDN's): q, k and the gate inputs (a padded row reads them and writes nothing)
    float4 q = load4(px + i_h * K_ + 4 * lane);
    float4 k = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
    const float4 gx = load4_any(a + n * stride_a + hv * K_ + 4 * lane), gd = load4_any(dt_bias + hv * K_ + 4 * lane);
    const float ga = to_f(A_log[hv]);
#endif
    long long slot, rrow;
    slot_and_ring_row(slot_idx, ring_idx, n, slot, rrow);
    if (slot < 0) return;  // padding: nothing written (the main launch zeroes its output)
    const PreRule rule = pre_rule(ring_h, h_rows, forced, rc_valid, n, rrow, L);
    const int h_old = rule.h_old;
    KR_T* base_k = ring_k + ((rrow * HV_ + hv) * CAP_) * K_ + 4 * lane;
    float* base_g = ring_g + (rrow * HV_ + hv) * CAP_ * K_;
    float4 G_last, G_t;
#if PRE_EARLY
    // bf16 records: the h key records' words loaded now, beside G_{h-1} (both wait only for h), not after the
    // token's record is stored (position h_eff >= h, which no dot reads, but the compiler cannot tell). fp32 records
    // (64 registers for 16): the first PRE_EARLY_F32 likewise, the rest where the dots need them
    EarlyRecords er;
    record_words(base_k, h_old, er);
    kda_g_of(base_g, h_old, gx, gd, ga, lower_bound, lane, G_last, G_t);
#else
    float4 q = load4(px + i_h * K_ + 4 * lane);
    float4 k = load4(px + H_ * K_ + i_h * K_ + 4 * lane);
    kda_g(base_g, h_old, a + n * stride_a + hv * K_ + 4 * lane, dt_bias + hv * K_ + 4 * lane, to_f(A_log[hv]),
          lower_bound, lane, G_last, G_t);
#endif
#if PRE_PF
    if (n < PRE_PF && lane == 0) prefetch_tile(pf_state, pf_rc, slot, rrow, hv, rule);
#endif
#if TC_DOTS
    const float4 q_raw = q, k_raw = k;
    float nq, nk;
    const float kq = pre_qk(q, k, scale, nq, nk);
    // the main launch's tensor-core operand of this value head: q / |q| and k / |k| times e^{G_t} per column
    mma_operand<true>(qk_frag + (static_cast<long long>(n) * HV_ + hv) * FRAG_WORDS, q_raw, k_raw, nq, nk,
                      exp4(G_t, 1.0f), lane);
#else
    const float kq = pre_qk(q, k, scale);
#endif
    const long long nh = static_cast<long long>(n) * HV_ + hv;
#if TC_DOTS
    // the overflow test and the token's record first (position h_eff is past every record the dots read), so that
    // k and G_t are dead before the dots
    const bool rb = warp_min(fminf(fminf(G_t.x, G_t.y), fminf(G_t.z, G_t.w))) < min_g;
    // G_t only where the main launch reads it (session 51): with the tile's dots on the tensor cores (their operand
    // holds e^{G_t} already) a row reads gts only where it folds with its token or stages q, k for the CUDA-core dots
    // (RC_MMA's checkpoint rows): not on a row that appends, unless this head is rebased
    if (gts != nullptr && (!rule.append || rb)) *reinterpret_cast<float4*>(gts + nh * K_ + 4 * lane) = G_t;
#else
    if (gts != nullptr) *reinterpret_cast<float4*>(gts + nh * K_ + 4 * lane) = G_t;

    // the overflow test and the token's record first (position h_eff is past every record the dots read), so that
    // k and G_t are dead before the dots
    const bool rb = warp_min(fminf(fminf(G_t.x, G_t.y), fminf(G_t.z, G_t.w))) < min_g;
#endif
    if (lane == 0) {
        scal[nh * 2 + 1] = kq;
        if (rb && rule.prefold) ovf[rrow * (HV_ + 1) + HV_] = 1;  // the row flushes (any head may write the same 1)
        if (rb && rule.append) ovf[rrow * (HV_ + 1) + hv] = 1;    // this head is rebased
    }
    if (rule.append) {
        const float4 kr = rb ? make_float4(0.f, 0.f, 0.f, 0.f)
                             : make_float4(k.x * __expf(-fmaxf(G_t.x, min_g)), k.y * __expf(-fmaxf(G_t.y, min_g)),
                                           k.z * __expf(-fmaxf(G_t.z, min_g)), k.w * __expf(-fmaxf(G_t.w, min_g)));
        KR_T* dst = base_k + rule.h_eff * K_;
#if REC_SPLIT
        store_key(dst, ring_k_lo + (dst - ring_k), kr);
#else
        from_f(dst, kr.x);
        from_f(dst + 1, kr.y);
        from_f(dst + 2, kr.z);
        from_f(dst + 3, kr.w);
#endif
        // (as stored: a rebased head's G restarts at its new checkpoint)
        *reinterpret_cast<float4*>(base_g + rule.h_eff * K_ + 4 * lane) = rb ? make_float4(0.f, 0.f, 0.f, 0.f) : G_t;
    }

    // the record dots with q~ e^{G_t} and k~ e^{G_t}, e^{G_t} in two halves
    const float4 e = exp4(G_t, 0.5f);
    const float4 qh = mul4(q, e), kh = mul4(k, e);
    // lane l: c_l (l < 16) or d_{l - 16}; past h (and past CAP) zero, as Triton's masked sums
#if PRE_EARLY
    const float dot = record_dots_early<true>(base_k, er, h_old, qh, kh, e, lane);
#else
    const float dot = record_dots<true>(base_k, h_old, qh, kh, e, lane);
#endif
    const int j = lane & 15;
    if (j < BC_) coef[nh * 2 * BC_ + (lane < 16 ? 0 : BC_) + j] = dot;
}
#endif
