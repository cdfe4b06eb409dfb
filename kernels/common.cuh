/* Shared by kernels/quant.cu and kernels/zfp.cu (and included by lossless.cu, which converts nothing):
fp32 <-> bf16 / fp16 conversions on bit patterns (and CUDA's byte permute), written once.

Integer code only (the host build), or an IEEE conversion instruction whose result for every non-NaN value
is exact (fp16 -> fp32) or correctly rounded to nearest even with subnormals kept (fp32 -> fp16), around a
select that gives NaN the integer code's rule (the GPU build and the simt build): no flush-to-zero setting,
contraction or compiler option can change a result, so NVRTC, nvcc for the GPU, the simt build and the host
build give the same bits. The device's conversions are explicit PTX without .ftz (CuPy's -ftz=true cannot
add it); the simt build stands in with g++'s _Float16 conversions (IEEE too; NaN made the canonical NaN, the
payload dropped, as the GPU's conversion may: only the select may decide a NaN's bits), so the selects run
on the CPU in CI and tests/unit/test_simt.py compares them with the integer code on every half and on the
floats at and around every half and every midpoint between two. Why not integer code on the GPU too: it is
~10 (fp16 -> fp32) and ~20 (fp32 -> fp16) instructions with branches per value where the hardware takes one
(sm_90: HADD2.F32 and F2FP.F16.F32.PACK_AB), and an fp16 encode streams 3 B per value, a budget of ~21
instructions per value at full HBM rate (kernels/quant.cu's header). No #include: NVRTC has no system
headers.

Semantics (torch's CPU casts, which the "torch" backend runs, so every backend writes the same bytes):
- fp32 -> bf16 / fp16: round to nearest, ties to even; fp16 subnormals kept; |x| >= 65520 -> +-Inf (fp16).
- NaN: one rule per format, the one torch's CPU cast applies:
    bf16 NaN -> 0xFFFF                               (every NaN, whatever its sign and payload)
    fp16 NaN -> sign | 0x7E00 | (payload >> 13)      (quieted, top payload bits kept: x86 F16C)
  The codecs' own NaN (a non-finite block decodes to fp32 0x7FC00000) is therefore bf16 0xFFFF and fp16
  0x7E00 on every backend. Before this header quant.cu wrote bf16 0x7FC0 (torch: 0xFFFF) and dropped
  fp16 payloads (torch keeps them), so a NaN block decoded to different bf16 bytes on the torch and
  kernel backends (NaN values either way).
- bf16 / fp16 -> fp32: exact (fp16 subnormals normalised, Inf and NaN payloads carried over).
*/
#ifndef CCOLL_COMMON_CUH
#define CCOLL_COMMON_CUH

#define CCOLL_CONV_HD __host__ __device__ __forceinline__

namespace ccoll_conv {

typedef unsigned short u16;
typedef unsigned int u32;

//! bf16 NaN (every NaN) and the fp16 quiet-NaN bits (| sign | payload), see the header comment
const u16 BF16_NAN = 0xffffu;
const u16 F16_QNAN = 0x7e00u;

// number of significant bits of a nonzero x < 2^31
CCOLL_CONV_HD int bitlen32(u32 x) {
#ifdef __CUDA_ARCH__
  return 32 - __clz((int)x);
#else
  return 32 - __builtin_clz(x);
#endif
}

CCOLL_CONV_HD u32 bf16_to_f32(u16 h) { return (u32)h << 16; }

CCOLL_CONV_HD u16 f32_to_bf16(u32 u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16_NAN;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (may carry into the exponent: to Inf)
  return (u16)(u >> 16);
}

// CUDA's __byte_perm: byte i of the result is byte (sel >> 4i) & 7 of y:x (one PRMT instruction on the GPU)
CCOLL_CONV_HD u32 byte_perm(u32 x, u32 y, u32 sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, sel);
#else
  const unsigned long long xy = ((unsigned long long)y << 32) | x;
  u32 r = 0;
  for (int i = 0; i < 4; i++) r |= (u32)((xy >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// x rounded to bf16 (nearest, ties to even) and widened back -- bf16_to_f32(f32_to_bf16(x)) -- for x = +-0 or
// a normal x with |x| < 2^111, by Veltkamp's split: c = 65537 x, then c - (c - x) keeps x's top 8 significant
// bits, rounded to nearest even. Three fp32 operations on the FMA pipe where the integer code is ~7 with
// its NaN test, on the integer pipe (half the issue rate): bf16 decode_sum rounds every decoded value of
// every payload row. Outside the range it is wrong, so callers take it only where they know the range
// (CqInt::decodes_normal): an fp32 subnormal keeps bits bf16 has not (the split is exact there), and
// 65537 x overflows near 2^112. tests/unit/test_simt.py checks it against the integer code on every fp32
// of three binades (the lowest normal one, [1, 2), the top one below 2^111) and both signs: every other
// binade scales from [1, 2) exactly, as no operation underflows or overflows there; the device branch (its PTX
// immediate included) is run against this host one by tests/unit/test_device_twins.py.
CCOLL_CONV_HD float f32_round_bf16_normal(float x) {
#ifdef __CUDA_ARCH__
  float c, d, r;
  asm("mul.rn.f32 %0, %1, 0f47800080;" : "=f"(c) : "f"(x));  // 65537 = 2^16 + 1: 0x47800080
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(c), "f"(x));
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(c), "f"(d));
  return r;
#else
  const float c = x * 65537.0f;  // the host and simt builds run with -ffp-contract=off
  return c - (c - x);
#endif
}

CCOLL_CONV_HD u32 f16_to_f32_int(u16 h) {
  const u32 sign = ((u32)h & 0x8000u) << 16, e = ((u32)h >> 10) & 31u, m = (u32)h & 0x3ffu;
  if (e == 31) return sign | 0x7f800000u | (m << 13);
  if (e) return sign | ((e + 112u) << 23) | (m << 13);
  if (!m) return sign;
  const int L = bitlen32(m);  // value m * 2^-24, leading bit L - 1
  return sign | ((u32)(L - 25 + 127) << 23) | ((m << (24 - L)) & 0x7fffffu);
}

CCOLL_CONV_HD u16 f32_to_f16_int(u32 u) {
  const u32 a = u & 0x7fffffffu;
  const u16 sign = (u16)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | F16_QNAN | (u16)((a >> 13) & 0x3ffu);  // quieted, top payload bits kept
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                        // normal half: rebias the exponent, round to nearest even
    const u32 r = a - (112u << 23);
    return sign | (u16)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
  }
  // subnormal half: steps of 2^-24; a normal float's value is (m | 2^23) * 2^(e - 150)
  const u32 e = a >> 23;
  if (e < 101) return sign;  // below 2^-26 (a subnormal float included): rounds to 0
  const u32 m = (a & 0x7fffffu) | 0x800000u;
  const int s = 126 - (int)e;  // 1..25
  const u32 q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  return sign | (u16)(q + (rem > half || (rem == half && (q & 1u))));
}

#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
// the conversion instructions alone: the integer code's bits for every non-NaN value, a NaN's bits the
// hardware's (for callers that only test for NaN, e.g. a block's absmax)
CCOLL_CONV_HD u32 f16_to_f32_ieee(u16 h) {
  u32 u;
#ifdef __CUDA_ARCH__
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  u = __float_as_uint(f);
#else
  _Float16 x;
  __builtin_memcpy(&x, &h, 2);
  const float f = (float)x;
  __builtin_memcpy(&u, &f, 4);
  if (f != f) u = 0x7fffffffu;  // as the GPU's conversion may: a NaN's payload is not kept (the select is)
#endif
  return u;
}

CCOLL_CONV_HD u16 f32_to_f16_ieee(u32 u) {
  u16 h;
#ifdef __CUDA_ARCH__
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(__uint_as_float(u)));
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  const _Float16 x = (_Float16)f;
  __builtin_memcpy(&h, &x, 2);
  if (f != f) h = 0x7fffu;  // as the GPU's conversion may (see above)
#endif
  return h;
}

// the conversion instructions, NaN by the integer code's rule (see the header)
CCOLL_CONV_HD u32 f16_to_f32(u16 h) {
  const u32 nan = ((u32)h & 0x8000u) << 16 | 0x7f800000u | ((u32)h & 0x3ffu) << 13;
  return ((u32)h & 0x7fffu) > 0x7c00u ? nan : f16_to_f32_ieee(h);
}

CCOLL_CONV_HD u16 f32_to_f16(u32 u) {
  const u32 a = u & 0x7fffffffu;
  const u16 nan = (u16)((u >> 16) & 0x8000u) | F16_QNAN | (u16)((a >> 13) & 0x3ffu);
  return a > 0x7f800000u ? nan : f32_to_f16_ieee(u);
}
#else
CCOLL_CONV_HD u32 f16_to_f32(u16 h) { return f16_to_f32_int(h); }
CCOLL_CONV_HD u16 f32_to_f16(u32 u) { return f32_to_f16_int(u); }
CCOLL_CONV_HD u32 f16_to_f32_ieee(u16 h) { return f16_to_f32_int(h); }
CCOLL_CONV_HD u16 f32_to_f16_ieee(u32 u) { return f32_to_f16_int(u); }
#endif

}  // namespace ccoll_conv

#endif  // CCOLL_COMMON_CUH
