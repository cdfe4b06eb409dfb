/* Shared by kernels/quant.cu and kernels/zfp.cu (and included by lossless.cu, which converts nothing):
fp32 <-> bf16 / fp16 conversions on bit patterns, written once.

Integer code only: no floating-point operation, so no flush-to-zero setting, contraction or compiler
option can change a result (NVRTC, nvcc for the GPU and the host build give the same bits). No #include:
NVRTC has no system headers.

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

CCOLL_CONV_HD u32 f16_to_f32(u16 h) {
  const u32 sign = ((u32)h & 0x8000u) << 16, e = ((u32)h >> 10) & 31u, m = (u32)h & 0x3ffu;
  if (e == 31) return sign | 0x7f800000u | (m << 13);
  if (e) return sign | ((e + 112u) << 23) | (m << 13);
  if (!m) return sign;
  const int L = bitlen32(m);  // value m * 2^-24, leading bit L - 1
  return sign | ((u32)(L - 25 + 127) << 23) | ((m << (24 - L)) & 0x7fffffu);
}

CCOLL_CONV_HD u16 f32_to_f16(u32 u) {
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

}  // namespace ccoll_conv

#endif  // CCOLL_COMMON_CUH
