/* Block quantization kernels for the "int8" and "int4" codecs (ccoll/codecs/quant.py).

Algorithm (written once, templated on BITS in {8, 4} and on the input type f32 / bf16 / f16):
  per block of B consecutive values: absmax = max |x| (computed in fp32), scale = absmax / qmax with
  qmax = 2^(BITS-1) - 1 (127 or 7), q = clamp(round(x / scale), -qmax, qmax), decode y = q * scale.
  - round = nearest: rintf, i.e. round half to EVEN (IEEE default; the same as torch.round).
  - round = stochastic: q = floor(x / scale + u), u in [0, 1) from a counter-based hash of
    (seed, global element index) -- see cq_uniform; identical to the torch backend's int64 emulation.
  - a scale with qmax * scale > FLT_MAX (absmax within ~1 ulp of FLT_MAX) is replaced by the next smaller
    float, so finite input never decodes to Inf.
  - scale == 0 (all-zero block, or absmax so small that absmax/qmax underflows): the divisor becomes
    +inf, so every q is exactly 0 and the block decodes to exact zeros.
  - a block holding NaN or +-Inf stores NaN as its scale and q = 0: it decodes to NaN for the whole block
    (ccoll's non-finite rule, ccoll/codecs/base.py).
  Every fp32 operation is a single IEEE round-to-nearest operation in a fixed order (divisions are true
  divisions, device adds/multiplies use __fadd_rn/__fmul_rn so nvcc/NVRTC cannot contract them into
  FMAs), so the GPU, the host build and the torch backend produce the same bytes.

Payload layout (little-endian), numel values, nblocks = ceil(numel / B):
  [scales: nblocks fp32, zero-padded to a multiple of 16 bytes]
  [q: numel BITS-bit two's-complement integers packed in element order -- int8: one byte each; int4: two
      per byte, the even element in the low nibble -- zero-padded to a multiple of 16 bytes]
  B is a multiple of 8, so every block starts on a 32-bit word of the q section (one word = G = 32/BITS
  values) and no two blocks share a byte or a word; the 16-byte padding keeps every row of a [p, nbytes]
  batch of payloads 16-byte aligned for vector loads, and lets the last word be written whole.

Thread mapping (GPU):
  encode: a "team" of T lanes (T = min(32, next_pow2(B / G)), a power of two, so teams never straddle a
          warp) per quant block; each lane handles whole 32-bit q words (G consecutive inputs, one 16- or
          32-byte vector load when aligned), absmax by __shfl_xor_sync within the team, then a second pass
          over the same (L1/L2-resident) inputs writes the q words. Coalesced: consecutive lanes touch
          consecutive words, consecutive teams consecutive blocks.
  decode: one thread per q word (G outputs, vector store when aligned); pure streaming.
  decode_sum: one thread per q word of the output, looping over the p payload rows in order 0..p-1.
Host (-DCCOLL_HOST, the "emulated" backend): extern "C" ccoll_host_* entry points loop over blocks / words
with OpenMP and call exactly the same per-word functions; only the warp reduction differs (a serial max,
which is exact: max is associative).
*/
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#endif

typedef unsigned char cq_u8;
typedef unsigned short cq_u16;
typedef unsigned int cq_u32;
typedef long long cq_i64;
typedef unsigned long long cq_u64;

#define CQ_HD __host__ __device__ __forceinline__

// ------------------------------------------------------------------------------------------------
// bit casts and exact arithmetic helpers

CQ_HD float cq_u2f(cq_u32 u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

CQ_HD cq_u32 cq_f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    cq_u32 u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

// a + b and a * b, each rounded once (never fused into an FMA)
CQ_HD float cq_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

CQ_HD float cq_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

#define CQ_INF_BITS 0x7f800000u
#define CQ_NAN_BITS 0x7fc00000u
#define CQ_FLT_MAX 3.40282346638528859812e+38f

// ------------------------------------------------------------------------------------------------
// element types: conversion to / from fp32 by hand (no cuda_bf16.h / cuda_fp16.h under NVRTC), with
// torch's exact semantics (round to nearest even; NaN -> 0x7FC0 for bf16, sign|0x7E00 for fp16)

struct CqF32 {
    typedef cq_u32 storage;
    static CQ_HD float to_f(storage b) { return cq_u2f(b); }
    static CQ_HD storage from_f(float f) { return cq_f2u(f); }
};

struct CqBF16 {
    typedef cq_u16 storage;
    static CQ_HD float to_f(storage b) { return cq_u2f((cq_u32)b << 16); }
    static CQ_HD storage from_f(float f) {
        cq_u32 u = cq_f2u(f);
        if ((u & 0x7fffffffu) > CQ_INF_BITS) return (storage)0x7fc0;
        u += 0x7fffu + ((u >> 16) & 1u);
        return (storage)(u >> 16);
    }
};

struct CqF16 {
    typedef cq_u16 storage;
    static CQ_HD float to_f(storage h) {
        const cq_u32 sign = ((cq_u32)h & 0x8000u) << 16;
        const cq_u32 expo = ((cq_u32)h >> 10) & 0x1fu;
        const cq_u32 mant = (cq_u32)h & 0x3ffu;
        if (expo == 0x1fu) return cq_u2f(sign | CQ_INF_BITS | (mant << 13));
        if (expo == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
            const float v = (float)mant * 5.9604644775390625e-08f;
            return cq_u2f(sign | cq_f2u(v));
        }
        return cq_u2f(sign | ((expo + 112u) << 23) | (mant << 13));
    }
    static CQ_HD storage from_f(float f) {
        const cq_u32 u = cq_f2u(f);
        const cq_u32 sign = (u >> 16) & 0x8000u;
        cq_u32 a = u & 0x7fffffffu;
        if (a > CQ_INF_BITS) return (storage)(sign | 0x7e00u);   // NaN
        if (a >= 0x477ff000u) return (storage)(sign | 0x7c00u);  // >= 65520 rounds to +-Inf
        if (a < 0x38800000u) {                                   // below 2^-14: fp16 subnormal or zero
            // |f| * 2^24 is exact (power-of-two scaling inside the normal range); rint = ties-to-even
            const float m = rintf(cq_mul(cq_u2f(a), 16777216.0f));
            return (storage)(sign | (cq_u32)m);
        }
        a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias exponent (-112 << 23), round to nearest even
        return (storage)(sign | (a >> 13));
    }
};

// ------------------------------------------------------------------------------------------------
// layout

CQ_HD cq_i64 cq_round16(cq_i64 n) { return (n + 15) & ~(cq_i64)15; }
CQ_HD cq_i64 cq_nblocks(cq_i64 numel, cq_i64 block) { return (numel + block - 1) / block; }
CQ_HD cq_i64 cq_scale_nbytes(cq_i64 numel, cq_i64 block) { return cq_round16(4 * cq_nblocks(numel, block)); }
template <int BITS>
CQ_HD cq_i64 cq_q_nbytes(cq_i64 numel) { return cq_round16((numel * BITS + 7) / 8); }

template <int BITS>
struct CqBits {
    static constexpr int G = 32 / BITS;                  // values per 32-bit q word
    static constexpr int QMAX = (1 << (BITS - 1)) - 1;   // 127 or 7
};

// ------------------------------------------------------------------------------------------------
// counter-based random numbers for stochastic rounding (same definition as quant.py's _uniform)

CQ_HD cq_u32 cq_mix32(cq_u32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// one key per (seed, 2^32-element segment); segments never split a q word (G divides 2^32)
CQ_HD cq_u32 cq_stream_key(cq_u32 seed, cq_u64 index) {
    return cq_mix32(seed ^ cq_mix32((cq_u32)(index >> 32) + 0x9e3779b9u));
}

// u in [0, 1): 24 random bits, exact in fp32
CQ_HD float cq_uniform(cq_u32 key, cq_u64 index) {
    const cq_u32 h = cq_mix32(cq_mix32((cq_u32)index ^ key) + key);
    return (float)(h >> 8) * 5.9604644775390625e-08f;
}

// ------------------------------------------------------------------------------------------------
// per-block and per-word logic (shared by the GPU kernels and the host entry points)

// running max of |x| in which NaN counts as +Inf, so "absmax is not finite" detects both
CQ_HD float cq_absmax_acc(float acc, float x) {
    float a = fabsf(x);
    if (!(a == a)) a = cq_u2f(CQ_INF_BITS);
    return fmaxf(acc, a);
}

struct CqBlock {
    float scale;    // stored in the payload
    float divisor;  // what x is divided by: scale, or +Inf when scale is 0 or the block is non-finite
    bool finite;
};

template <int BITS>
CQ_HD CqBlock cq_block_params(float absmax) {
    CqBlock b;
    b.finite = absmax <= CQ_FLT_MAX;
    if (!b.finite) {
        b.scale = cq_u2f(CQ_NAN_BITS);
        b.divisor = cq_u2f(CQ_INF_BITS);
    } else {
        b.scale = absmax / (float)CqBits<BITS>::QMAX;
        // absmax within ~1 ulp of FLT_MAX: qmax * scale would decode to Inf; take the next smaller scale
        // (the clamp then maps absmax to qmax)
        if (!(cq_mul(b.scale, (float)CqBits<BITS>::QMAX) <= CQ_FLT_MAX)) b.scale = cq_u2f(cq_f2u(b.scale) - 1u);
        b.divisor = b.scale > 0.0f ? b.scale : cq_u2f(CQ_INF_BITS);
    }
    return b;
}

template <int BITS>
CQ_HD int cq_quantize(float x, const CqBlock& b, bool stochastic, float u) {
    if (!b.finite) return 0;
    const float qmax = (float)CqBits<BITS>::QMAX;
    float v = x / b.divisor;
    v = stochastic ? floorf(cq_add(v, u)) : rintf(v);
    v = fminf(fmaxf(v, -qmax), qmax);
    return (int)v;
}

// G inputs starting at global element index i0 (count valid ones) -> one q word
template <int BITS>
CQ_HD cq_u32 cq_encode_word(const float* v, int count, const CqBlock& b, bool stochastic, cq_u32 seed, cq_i64 i0) {
    constexpr int G = CqBits<BITS>::G;
    constexpr cq_u32 MASK = (1u << BITS) - 1u;
    const cq_u32 key = stochastic ? cq_stream_key(seed, (cq_u64)i0) : 0u;
    cq_u32 w = 0;
#pragma unroll
    for (int k = 0; k < G; ++k) {
        if (k < count) {
            const float u = stochastic ? cq_uniform(key, (cq_u64)(i0 + k)) : 0.0f;
            w |= ((cq_u32)cq_quantize<BITS>(v[k], b, stochastic, u) & MASK) << (BITS * k);
        }
    }
    return w;
}

template <int BITS>
CQ_HD void cq_decode_word(cq_u32 w, float scale, float* v) {
    constexpr int G = CqBits<BITS>::G;
#pragma unroll
    for (int k = 0; k < G; ++k) {
        const cq_u32 field = (w >> (BITS * k)) & ((1u << BITS) - 1u);
        const int q = (int)(field ^ (1u << (BITS - 1))) - (1 << (BITS - 1));  // sign-extend BITS bits
        v[k] = cq_mul((float)q, scale);
    }
}

// load G values (count valid, the rest 0) as fp32; vec: 16-byte-aligned whole word, one vector access
struct alignas(16) CqV16 { cq_u32 w[4]; };
struct alignas(8) CqV8 { cq_u32 w[2]; };

template <class Tr, int G>
CQ_HD void cq_load_word(const typename Tr::storage* x, cq_i64 i0, int count, bool vec, float* v) {
    typedef typename Tr::storage S;
    constexpr int NBYTES = G * (int)sizeof(S);
#ifdef __CUDA_ARCH__
    if (vec && count == G) {
        cq_u32 words[NBYTES / 4];
        if (NBYTES % 16 == 0) {
#pragma unroll
            for (int j = 0; j < NBYTES / 16; ++j) {
                const CqV16 r = reinterpret_cast<const CqV16*>(x + i0)[j];
#pragma unroll
                for (int t = 0; t < 4; ++t) words[4 * j + t] = r.w[t];
            }
        } else {
#pragma unroll
            for (int j = 0; j < NBYTES / 8; ++j) {
                const CqV8 r = reinterpret_cast<const CqV8*>(x + i0)[j];
                words[2 * j] = r.w[0];
                words[2 * j + 1] = r.w[1];
            }
        }
#pragma unroll
        for (int k = 0; k < G; ++k) {
            const cq_u32 bits = sizeof(S) == 4 ? words[k] : (words[k >> 1] >> (16 * (k & 1))) & 0xffffu;
            v[k] = Tr::to_f((S)bits);
        }
        return;
    }
#else
    (void)vec;
#endif
#pragma unroll
    for (int k = 0; k < G; ++k) v[k] = k < count ? Tr::to_f(x[i0 + k]) : 0.0f;
}

template <class Tr, int G>
CQ_HD void cq_store_word(typename Tr::storage* y, cq_i64 i0, int count, bool vec, const float* v) {
    typedef typename Tr::storage S;
    constexpr int NBYTES = G * (int)sizeof(S);
#ifdef __CUDA_ARCH__
    if (vec && count == G) {
        cq_u32 words[NBYTES / 4];
#pragma unroll
        for (int j = 0; j < NBYTES / 4; ++j) words[j] = 0;
#pragma unroll
        for (int k = 0; k < G; ++k) {
            const cq_u32 bits = (cq_u32)Tr::from_f(v[k]);
            if (sizeof(S) == 4) words[k] = bits;
            else words[k >> 1] |= bits << (16 * (k & 1));
        }
        if (NBYTES % 16 == 0) {
#pragma unroll
            for (int j = 0; j < NBYTES / 16; ++j) {
                CqV16 r;
#pragma unroll
                for (int t = 0; t < 4; ++t) r.w[t] = words[4 * j + t];
                reinterpret_cast<CqV16*>(y + i0)[j] = r;
            }
        } else {
#pragma unroll
            for (int j = 0; j < NBYTES / 8; ++j) {
                CqV8 r;
                r.w[0] = words[2 * j];
                r.w[1] = words[2 * j + 1];
                reinterpret_cast<CqV8*>(y + i0)[j] = r;
            }
        }
        return;
    }
#else
    (void)vec;
#endif
#pragma unroll
    for (int k = 0; k < G; ++k)
        if (k < count) y[i0 + k] = Tr::from_f(v[k]);
}

CQ_HD cq_i64 cq_min(cq_i64 a, cq_i64 b) { return a < b ? a : b; }

// the padding words after the last scale and after the last q word are zero (deterministic bytes)
template <int BITS>
CQ_HD void cq_zero_padding(cq_u8* payload, cq_i64 numel, cq_i64 block) {
    constexpr int G = CqBits<BITS>::G;
    const cq_i64 nblocks = cq_nblocks(numel, block);
    const cq_i64 sbytes = cq_scale_nbytes(numel, block);
    cq_u32* scale_words = reinterpret_cast<cq_u32*>(payload);
    for (cq_i64 i = nblocks; i < sbytes / 4; ++i) scale_words[i] = 0;
    cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + sbytes);
    for (cq_i64 i = (numel + G - 1) / G; i < cq_q_nbytes<BITS>(numel) / 4; ++i) qwords[i] = 0;
}

// block index of q word w without a 64-bit division per word: a shift when the block's word count is a
// power of two (log2_words >= 0), else a 32-bit division while the indices fit (always, below 2^32 words)
struct CqWordToBlock {
    cq_i64 words;   // q words per block (block / G)
    int log2_words; // -1 if words is not a power of two
    CQ_HD CqWordToBlock(cq_i64 block, int G) : words(block / G), log2_words(-1) {
        if ((words & (words - 1)) == 0) {
            log2_words = 0;
            while (((cq_i64)1 << log2_words) < words) ++log2_words;
        }
    }
    CQ_HD cq_i64 operator()(cq_i64 w) const {
        if (log2_words >= 0) return w >> log2_words;
        if (w <= 0xffffffffll) return (cq_i64)((cq_u32)w / (cq_u32)words);
        return w / words;
    }
};

// decode of q word w (of block b) of one payload row, rounded to the codec's dtype and widened back
// (what decode_sum adds: the decoded tensor's values)
template <class Tr, int BITS>
CQ_HD void cq_decode_row_word(const cq_u8* row, cq_i64 scale_nbytes, cq_i64 w, cq_i64 b, float* v) {
    constexpr int G = CqBits<BITS>::G;
    const float* scales = reinterpret_cast<const float*>(row);
    const cq_u32* qwords = reinterpret_cast<const cq_u32*>(row + scale_nbytes);
    cq_decode_word<BITS>(qwords[w], scales[b], v);
#pragma unroll
    for (int k = 0; k < G; ++k) v[k] = Tr::to_f(Tr::from_f(v[k]));
}

// ------------------------------------------------------------------------------------------------
// GPU kernels: only the thread -> block/word mapping and the warp reduction live here

template <class Tr, int BITS>
__device__ void cq_encode_kernel(const typename Tr::storage* x, cq_i64 numel, cq_i64 block, int team,
                                 int stochastic, cq_u32 seed, cq_u8* payload) {
    constexpr int G = CqBits<BITS>::G;
    const cq_i64 nblocks = cq_nblocks(numel, block);
    float* scales = reinterpret_cast<float*>(payload);
    cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + cq_scale_nbytes(numel, block));
    const bool vec = (reinterpret_cast<cq_u64>(x) & 15u) == 0;
    const int lane = threadIdx.x & 31;
    const int tlane = lane & (team - 1);
    const int teams_per_warp = 32 / team;
    const cq_i64 warp = ((cq_i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const cq_i64 nwarps = ((cq_i64)gridDim.x * blockDim.x) >> 5;
    if (blockIdx.x == 0 && threadIdx.x == 0) cq_zero_padding<BITS>(payload, numel, block);
    // the loop bound is warp-uniform, so every lane reaches every shuffle
    for (cq_i64 base = warp * teams_per_warp; base < nblocks; base += nwarps * teams_per_warp) {
        const cq_i64 b = base + lane / team;
        const cq_i64 start = b * block;
        const cq_i64 len = b < nblocks ? cq_min(block, numel - start) : 0;
        float absmax = 0.0f;
        for (cq_i64 w = tlane; w * G < len; w += team) {
            float v[G];
            cq_load_word<Tr, G>(x, start + w * G, (int)cq_min(G, len - w * G), vec, v);
#pragma unroll
            for (int k = 0; k < G; ++k) absmax = cq_absmax_acc(absmax, v[k]);
        }
        for (int off = team >> 1; off > 0; off >>= 1)
            absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, off));
        if (len == 0) continue;
        const CqBlock bp = cq_block_params<BITS>(absmax);
        if (tlane == 0) scales[b] = bp.scale;
        for (cq_i64 w = tlane; w * G < len; w += team) {
            float v[G];
            const int count = (int)cq_min(G, len - w * G);
            cq_load_word<Tr, G>(x, start + w * G, count, vec, v);
            qwords[start / G + w] = cq_encode_word<BITS>(v, count, bp, stochastic != 0, seed, start + w * G);
        }
    }
}

template <class Tr, int BITS>
__device__ void cq_decode_kernel(const cq_u8* payload, cq_i64 numel, cq_i64 block, typename Tr::storage* y) {
    constexpr int G = CqBits<BITS>::G;
    const float* scales = reinterpret_cast<const float*>(payload);
    const cq_u32* qwords = reinterpret_cast<const cq_u32*>(payload + cq_scale_nbytes(numel, block));
    const bool vec = (reinterpret_cast<cq_u64>(y) & 15u) == 0;
    const cq_i64 nwords = (numel + G - 1) / G;
    const CqWordToBlock block_of(block, G);
    for (cq_i64 w = (cq_i64)blockIdx.x * blockDim.x + threadIdx.x; w < nwords; w += (cq_i64)gridDim.x * blockDim.x) {
        float v[G];
        cq_decode_word<BITS>(qwords[w], scales[block_of(w)], v);
        cq_store_word<Tr, G>(y, w * G, (int)cq_min(G, numel - w * G), vec, v);
    }
}

template <class Tr, int BITS>
__device__ void cq_decode_sum_kernel(const cq_u8* payloads, cq_i64 p, cq_i64 row_nbytes, cq_i64 numel,
                                     cq_i64 block, float* out) {
    constexpr int G = CqBits<BITS>::G;
    const bool vec = (reinterpret_cast<cq_u64>(out) & 15u) == 0;
    const cq_i64 nwords = (numel + G - 1) / G;
    const cq_i64 scale_nbytes = cq_scale_nbytes(numel, block);
    const CqWordToBlock block_of(block, G);
    for (cq_i64 w = (cq_i64)blockIdx.x * blockDim.x + threadIdx.x; w < nwords; w += (cq_i64)gridDim.x * blockDim.x) {
        float acc[G];
#pragma unroll
        for (int k = 0; k < G; ++k) acc[k] = 0.0f;
        const cq_i64 b = block_of(w);
        for (cq_i64 r = 0; r < p; ++r) {
            float v[G];
            cq_decode_row_word<Tr, BITS>(payloads + r * row_nbytes, scale_nbytes, w, b, v);
#pragma unroll
            for (int k = 0; k < G; ++k) acc[k] = cq_add(acc[k], v[k]);
        }
        cq_store_word<CqF32, G>(reinterpret_cast<cq_u32*>(out), w * G, (int)cq_min(G, numel - w * G), vec, acc);
    }
}

// extern "C" entry points: ccoll_int{8,4}_{encode,decode,decode_sum}_{f32,bf16,f16}
#define CQ_GLOBALS(BITS, NAME, TR)                                                                        \
    extern "C" __global__ void ccoll_int##BITS##_encode_##NAME(const TR::storage* x, cq_i64 numel,        \
                                                               cq_i64 block, int team, int stochastic,   \
                                                               cq_u32 seed, cq_u8* payload) {            \
        cq_encode_kernel<TR, BITS>(x, numel, block, team, stochastic, seed, payload);                    \
    }                                                                                                     \
    extern "C" __global__ void ccoll_int##BITS##_decode_##NAME(const cq_u8* payload, cq_i64 numel,        \
                                                               cq_i64 block, TR::storage* y) {            \
        cq_decode_kernel<TR, BITS>(payload, numel, block, y);                                            \
    }                                                                                                     \
    extern "C" __global__ void ccoll_int##BITS##_decode_sum_##NAME(const cq_u8* payloads, cq_i64 p,       \
                                                                   cq_i64 row_nbytes, cq_i64 numel,      \
                                                                   cq_i64 block, float* out) {           \
        cq_decode_sum_kernel<TR, BITS>(payloads, p, row_nbytes, numel, block, out);                      \
    }

CQ_GLOBALS(8, f32, CqF32)
CQ_GLOBALS(8, bf16, CqBF16)
CQ_GLOBALS(8, f16, CqF16)
CQ_GLOBALS(4, f32, CqF32)
CQ_GLOBALS(4, bf16, CqBF16)
CQ_GLOBALS(4, f16, CqF16)

// ------------------------------------------------------------------------------------------------
// host build: the "emulated" backend

#ifdef CCOLL_HOST
template <class Tr, int BITS>
static void cq_host_encode(const typename Tr::storage* x, cq_i64 numel, cq_i64 block, int stochastic,
                           cq_u32 seed, cq_u8* payload) {
    constexpr int G = CqBits<BITS>::G;
    const cq_i64 nblocks = cq_nblocks(numel, block);
    float* scales = reinterpret_cast<float*>(payload);
    cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + cq_scale_nbytes(numel, block));
    cq_zero_padding<BITS>(payload, numel, block);
#pragma omp parallel for schedule(static)
    for (cq_i64 b = 0; b < nblocks; ++b) {
        const cq_i64 start = b * block;
        const cq_i64 len = cq_min(block, numel - start);
        float absmax = 0.0f;
        for (cq_i64 w = 0; w * G < len; ++w) {
            float v[G];
            cq_load_word<Tr, G>(x, start + w * G, (int)cq_min(G, len - w * G), false, v);
            for (int k = 0; k < G; ++k) absmax = cq_absmax_acc(absmax, v[k]);
        }
        const CqBlock bp = cq_block_params<BITS>(absmax);
        scales[b] = bp.scale;
        for (cq_i64 w = 0; w * G < len; ++w) {
            float v[G];
            const int count = (int)cq_min(G, len - w * G);
            cq_load_word<Tr, G>(x, start + w * G, count, false, v);
            qwords[start / G + w] = cq_encode_word<BITS>(v, count, bp, stochastic != 0, seed, start + w * G);
        }
    }
}

template <class Tr, int BITS>
static void cq_host_decode(const cq_u8* payload, cq_i64 numel, cq_i64 block, typename Tr::storage* y) {
    constexpr int G = CqBits<BITS>::G;
    const float* scales = reinterpret_cast<const float*>(payload);
    const cq_u32* qwords = reinterpret_cast<const cq_u32*>(payload + cq_scale_nbytes(numel, block));
    const cq_i64 nwords = (numel + G - 1) / G;
    const CqWordToBlock block_of(block, G);
#pragma omp parallel for schedule(static)
    for (cq_i64 w = 0; w < nwords; ++w) {
        float v[G];
        cq_decode_word<BITS>(qwords[w], scales[block_of(w)], v);
        cq_store_word<Tr, G>(y, w * G, (int)cq_min(G, numel - w * G), false, v);
    }
}

template <class Tr, int BITS>
static void cq_host_decode_sum(const cq_u8* payloads, cq_i64 p, cq_i64 row_nbytes, cq_i64 numel, cq_i64 block,
                               float* out) {
    constexpr int G = CqBits<BITS>::G;
    const cq_i64 nwords = (numel + G - 1) / G;
    const cq_i64 scale_nbytes = cq_scale_nbytes(numel, block);
    const CqWordToBlock block_of(block, G);
#pragma omp parallel for schedule(static)
    for (cq_i64 w = 0; w < nwords; ++w) {
        float acc[G];
        for (int k = 0; k < G; ++k) acc[k] = 0.0f;
        const cq_i64 b = block_of(w);
        for (cq_i64 r = 0; r < p; ++r) {
            float v[G];
            cq_decode_row_word<Tr, BITS>(payloads + r * row_nbytes, scale_nbytes, w, b, v);
            for (int k = 0; k < G; ++k) acc[k] = cq_add(acc[k], v[k]);
        }
        cq_store_word<CqF32, G>(reinterpret_cast<cq_u32*>(out), w * G, (int)cq_min(G, numel - w * G), false, acc);
    }
}

#define CQ_HOST(BITS, NAME, TR)                                                                           \
    extern "C" void ccoll_host_int##BITS##_encode_##NAME(const void* x, cq_i64 numel, cq_i64 block,       \
                                                         int stochastic, cq_u32 seed, void* payload) {   \
        cq_host_encode<TR, BITS>(static_cast<const TR::storage*>(x), numel, block, stochastic, seed,     \
                                 static_cast<cq_u8*>(payload));                                          \
    }                                                                                                     \
    extern "C" void ccoll_host_int##BITS##_decode_##NAME(const void* payload, cq_i64 numel, cq_i64 block, \
                                                         void* y) {                                      \
        cq_host_decode<TR, BITS>(static_cast<const cq_u8*>(payload), numel, block,                       \
                                 static_cast<TR::storage*>(y));                                          \
    }                                                                                                     \
    extern "C" void ccoll_host_int##BITS##_decode_sum_##NAME(const void* payloads, cq_i64 p,              \
                                                             cq_i64 row_nbytes, cq_i64 numel,            \
                                                             cq_i64 block, void* out) {                  \
        cq_host_decode_sum<TR, BITS>(static_cast<const cq_u8*>(payloads), p, row_nbytes, numel, block,   \
                                     static_cast<float*>(out));                                          \
    }

CQ_HOST(8, f32, CqF32)
CQ_HOST(8, bf16, CqBF16)
CQ_HOST(8, f16, CqF16)
CQ_HOST(4, f32, CqF32)
CQ_HOST(4, bf16, CqBF16)
CQ_HOST(4, f16, CqF16)
#endif  // CCOLL_HOST
