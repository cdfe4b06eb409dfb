// ZFP fixed-rate encode/decode for 1-D and 2-D blocks of float32/float64, bit-exact with libzfp 1.0.1
// (zfpy.compress_numpy(x, rate=R, write_header=False)) for finite blocks; see shared ZFP_FIXED_RATE.md.
//
// One algorithm, written once: per-block functions templated on a traits struct (float / double) and on
// the number of dimensions (1 or 2); 1-D and 2-D differ only in gather/scatter and the transform loop.
// The same functions serve the CUDA kernels (one thread per block), NVRTC (CuPy RawModule) and the host
// build (-DCCOLL_HOST, OpenMP loop over blocks) that backs the "emulated" backend.
//
// Where libzfp has no defined result we define one, identically on every backend:
//  * Non-finite block (any NaN/Inf among its values): written as header bit 1 followed by a biased
//    exponent of 0 and zeros. libzfp never emits that code (biased exponent 0 always takes its all-zero
//    path), so decoders recognise it and return NaN for every value of the block.
//  * Tiny block (max |v| < 2^-98 for float, < 2^-962 for double, i.e. frexp exponent <= P-4-EBIAS):
//    libzfp's scale factor 2^(P-2-emax) overflows to inf and its output is garbage (it differs between
//    x86 and GPU). Such blocks are written as all-zero blocks and decode to +0. The error is below the
//    threshold, far below anything a gradient cares about.
//
// Dims=2 reads a flat array as rows of 4 values (nx = 4, ny = ceil(n/4)), so 2-D block b holds the 16
// consecutive values [16b, 16b+16). A partial last row (n % 4 != 0) is padded along x with zfp's
// partial-block rule before the usual padding of missing rows along y; for n % 4 == 0 this is exactly
// zfp on x.reshape(-1, 4).
//
// Output words: blocks are back to back at bit granularity, so neighbouring blocks share 64-bit words.
// Each thread stores the words that lie entirely inside its block with plain stores and ORs the (at most
// two) boundary words atomically into a zero-initialised output. Compared with a layout in which one
// thread owns whole words, this keeps the per-block coder independent and sequential (no inter-thread
// exchange of bit counts), costs one cheap memset of the (small) output, and at most two atomics per
// block, which resolve in L2 on the GPU and are uncontended cache-line operations on the host.

// No #include: NVRTC (CuPy RawModule) has no system headers; the host build needs none either.

typedef unsigned long long ccoll_u64;
typedef long long ccoll_i64;
typedef unsigned int ccoll_u32;

#define CCOLL_HD __host__ __device__ __forceinline__

namespace ccoll_zfp {

template <class Scalar> struct Traits;

template <> struct Traits<float> {
  typedef int Int;
  typedef ccoll_u32 UInt;
  static const int P = 32;           // integer precision in bits
  static const int EBITS = 8;        // exponent bits in the block header
  static const int EBIAS = 127;
  static const int MANT = 23;        // stored mantissa bits of the scalar
  static CCOLL_HD UInt nbmask() { return 0xaaaaaaaau; }
  static CCOLL_HD UInt bits(float v) { union { float f; UInt u; } c; c.f = v; return c.u; }
  static CCOLL_HD float from_bits(UInt u) { union { float f; UInt u; } c; c.u = u; return c.f; }
};

template <> struct Traits<double> {
  typedef ccoll_i64 Int;
  typedef ccoll_u64 UInt;
  static const int P = 64;
  static const int EBITS = 11;
  static const int EBIAS = 1023;
  static const int MANT = 52;
  static CCOLL_HD UInt nbmask() { return 0xaaaaaaaaaaaaaaaaull; }
  static CCOLL_HD UInt bits(double v) { union { double f; UInt u; } c; c.f = v; return c.u; }
  static CCOLL_HD double from_bits(UInt u) { union { double f; UInt u; } c; c.u = u; return c.f; }
};

// 2^k in Scalar, exact, including subnormal results (k >= 1 - EBIAS - MANT and k <= EBIAS).
template <class Scalar> CCOLL_HD Scalar pow2(int k) {
  typedef Traits<Scalar> T;
  typedef typename T::UInt UInt;
  if (k >= 1 - T::EBIAS) return T::from_bits((UInt)(k + T::EBIAS) << T::MANT);
  if (k < 1 - T::EBIAS - T::MANT) return Scalar(0);  // as ldexp: only reachable from foreign payloads
  return T::from_bits((UInt)1 << (k + T::EBIAS - 1 + T::MANT));
}

// ---- bit stream: stream bit j is bit (j % 64) of word j / 64 ------------------------------------------

CCOLL_HD int ctz64(ccoll_u64 x) {  // x != 0
#ifdef __CUDA_ARCH__
  return __ffsll((long long)x) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

CCOLL_HD void atomic_or_word(ccoll_u64* w, ccoll_u64 v) {
#ifdef __CUDA_ARCH__
  atomicOr(w, v);
#else
  __atomic_fetch_or(w, v, __ATOMIC_RELAXED);
#endif
}

// Writes one block's bits [begin, end) into a zero-initialised word array.
struct BlockWriter {
  ccoll_u64* words;
  ccoll_u64 begin, end;  // the block's bit range
  ccoll_u64 widx;        // word being filled
  ccoll_u64 acc;         // its pending bits
  int fill;              // bit position of the next bit in acc

  CCOLL_HD BlockWriter(ccoll_u64* w, ccoll_u64 b, ccoll_u64 e)
      : words(w), begin(b), end(e), widx(b >> 6), acc(0), fill((int)(b & 63)) {}

  CCOLL_HD void flush_word() {
    if (acc) {
      bool owned = (widx << 6) >= begin && ((widx + 1) << 6) <= end;
      if (owned) words[widx] = acc; else atomic_or_word(words + widx, acc);
    }
    acc = 0;
    fill = 0;
    ++widx;
  }
  CCOLL_HD ccoll_u32 write_bit(ccoll_u32 bit) {
    acc |= (ccoll_u64)bit << fill;
    if (++fill == 64) flush_word();
    return bit;
  }
  // the low n bits of v (0 <= n <= 64), least significant first; returns v >> n
  CCOLL_HD ccoll_u64 write_bits(ccoll_u64 v, int n) {
    if (n == 0) return v;
    ccoll_u64 low = n == 64 ? v : (v & ((1ull << n) - 1));
    acc |= low << fill;
    int total = fill + n;
    if (total >= 64) {
      int consumed = 64 - fill;  // bits of low that went into this word
      flush_word();
      acc = consumed == 64 ? 0 : low >> consumed;
      fill = total - 64;
    } else {
      fill = total;
    }
    return n == 64 ? 0 : v >> n;
  }
  // the remaining bits of the block are zeros, already there
  CCOLL_HD void finish() {
    if (fill) flush_word();
  }
};

struct BlockReader {
  const ccoll_u64* words;
  ccoll_u64 widx;  // next word to load
  ccoll_u64 buf;   // unread bits, next one at bit 0
  int avail;       // number of unread bits in buf

  CCOLL_HD BlockReader(const ccoll_u64* w, ccoll_u64 begin) : words(w), widx((begin >> 6) + 1) {
    int off = (int)(begin & 63);
    buf = w[begin >> 6] >> off;
    avail = 64 - off;
  }
  CCOLL_HD ccoll_u32 read_bit() {
    if (avail == 0) { buf = words[widx++]; avail = 64; }
    ccoll_u32 b = (ccoll_u32)(buf & 1);
    buf >>= 1;
    --avail;
    return b;
  }
  // the next n bits (0 <= n < 64) without consuming them; they must lie inside the payload
  CCOLL_HD ccoll_u64 peek_bits(int n) {
    if (n == 0) return 0;
    ccoll_u64 v = buf;
    if (n > avail) v |= words[widx] << avail;
    return v & ((1ull << n) - 1);
  }
  CCOLL_HD void skip_bits(int n) { read_bits(n); }
  CCOLL_HD ccoll_u64 read_bits(int n) {  // 0 <= n <= 64
    if (n == 0) return 0;
    ccoll_u64 v;
    if (n <= avail) {
      v = buf;
      buf = n == 64 ? 0 : buf >> n;
      avail -= n;
    } else {
      v = buf;  // avail bits (n > avail, so avail < 64)
      ccoll_u64 next = words[widx++];
      v |= next << avail;
      int taken = n - avail;  // 1..64
      buf = taken == 64 ? 0 : next >> taken;
      avail = 64 - taken;
    }
    return n == 64 ? v : (v & ((1ull << n) - 1));
  }
};

// ---- block layout -----------------------------------------------------------------------------------

template <int D> struct Dims;
template <> struct Dims<1> {
  static const int S = 4;
  static CCOLL_HD int perm(int i) { return i; }
};
template <> struct Dims<2> {
  static const int S = 16;
  static CCOLL_HD int perm(int i) {
    // coefficients in order of increasing total sequency
    const unsigned long long table = 0xfebd7ac396825410ull;  // nibble i = perm2[i]
    return (int)((table >> (4 * i)) & 15);
  }
};

// zfp's partial-run padding along stride s: n=1 -> aaaa, n=2 -> abba, n=3 -> abca, n=0 -> 0000
template <class Scalar> CCOLL_HD void pad_run(Scalar* p, int n, int s) {
  switch (n) {
    case 0: p[0 * s] = 0;  // fall through
    case 1: p[1 * s] = p[0 * s];  // fall through
    case 2: p[2 * s] = p[1 * s];  // fall through
    case 3: p[3 * s] = p[0 * s];  // fall through
    default: break;
  }
}

#ifdef __CUDA_ARCH__
// own 16-byte vector types (alignas, no CUDA headers needed under NVRTC); ptxas emits v4/v2 accesses
struct alignas(16) ccoll_v4f { float x, y, z, w; };
struct alignas(16) ccoll_v2d { double x, y; };
__device__ __forceinline__ void load16(const float* p, float* v) {
  ccoll_v4f f = *reinterpret_cast<const ccoll_v4f*>(p);
  v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}
__device__ __forceinline__ void load16(const double* p, double* v) {
  ccoll_v2d d = *reinterpret_cast<const ccoll_v2d*>(p);
  v[0] = d.x; v[1] = d.y;
}
__device__ __forceinline__ void store16(float* p, const float* v) {
  ccoll_v4f f;
  f.x = v[0]; f.y = v[1]; f.z = v[2]; f.w = v[3];
  *reinterpret_cast<ccoll_v4f*>(p) = f;
}
__device__ __forceinline__ void store16(double* p, const double* v) {
  ccoll_v2d d;
  d.x = v[0]; d.y = v[1];
  *reinterpret_cast<ccoll_v2d*>(p) = d;
}
#endif

// Gathers block b (values [S*b, S*b + S) of the flat array; see the file comment) into v, padded.
template <class Scalar, int D> CCOLL_HD void gather(const Scalar* in, ccoll_u64 n, ccoll_u64 b, Scalar* v) {
  const int S = Dims<D>::S;
  ccoll_u64 start = b * S;
  ccoll_u64 left = n - start;
  if (left >= (ccoll_u64)S) {
#ifdef __CUDA_ARCH__
    // a block is 16, 32, 64 or 128 contiguous bytes: 16-byte vector loads when the tensor allows
    // (the test is uniform across the grid: S * sizeof(Scalar) is a multiple of 16)
    if ((((unsigned long long)in) & 15) == 0) {
      const int PER = 16 / (int)sizeof(Scalar);
#pragma unroll
      for (int c = 0; c < S / PER; c++) load16(in + start + c * PER, v + c * PER);
      return;
    }
#endif
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = in[start + i];
    return;
  }
  int m = (int)left;
#pragma unroll
  for (int i = 0; i < S; i++) v[i] = i < m ? in[start + i] : Scalar(0);
  // loops are unrolled with constant offsets so that v stays in registers on the GPU
  if (D == 1) {
    pad_run(v, m, 1);
  } else {
#pragma unroll
    for (int j = 0; j < 4; j++) {  // each present row along x (absent rows are rebuilt below)
      int len = m - 4 * j;
      pad_run(v + 4 * j, len < 0 ? 0 : (len > 4 ? 4 : len), 1);
    }
    int rows = (m + 3) / 4;
#pragma unroll
    for (int i = 0; i < 4; i++) pad_run(v + i, rows, 4);  // then every column along y
  }
}

template <class Scalar, int D> CCOLL_HD void scatter(const Scalar* v, ccoll_u64 n, ccoll_u64 b, Scalar* out) {
  const int S = Dims<D>::S;
  ccoll_u64 start = b * S;
  ccoll_u64 left = n - start;
  int m = left >= (ccoll_u64)S ? S : (int)left;
#ifdef __CUDA_ARCH__
  if (m == S && (((unsigned long long)out) & 15) == 0) {  // 16-byte vector stores, as in gather
    const int PER = 16 / (int)sizeof(Scalar);
#pragma unroll
    for (int c = 0; c < S / PER; c++) store16(out + start + c * PER, v + c * PER);
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < S; i++)
    if (i < m) out[start + i] = v[i];
}

// ---- decorrelating transform (wrapping arithmetic through the unsigned type) ---------------------------

template <class Int, class UInt> CCOLL_HD void fwd_lift(Int* p, int s) {
  Int x = p[0 * s], y = p[1 * s], z = p[2 * s], w = p[3 * s];
  x = (Int)((UInt)x + (UInt)w); x >>= 1; w = (Int)((UInt)w - (UInt)x);
  z = (Int)((UInt)z + (UInt)y); z >>= 1; y = (Int)((UInt)y - (UInt)z);
  x = (Int)((UInt)x + (UInt)z); x >>= 1; z = (Int)((UInt)z - (UInt)x);
  w = (Int)((UInt)w + (UInt)y); w >>= 1; y = (Int)((UInt)y - (UInt)w);
  w = (Int)((UInt)w + (UInt)(y >> 1)); y = (Int)((UInt)y - (UInt)(w >> 1));
  p[0 * s] = x; p[1 * s] = y; p[2 * s] = z; p[3 * s] = w;
}

template <class Int, class UInt> CCOLL_HD void inv_lift(Int* p, int s) {
  Int x = p[0 * s], y = p[1 * s], z = p[2 * s], w = p[3 * s];
  y = (Int)((UInt)y + (UInt)(w >> 1)); w = (Int)((UInt)w - (UInt)(y >> 1));
  y = (Int)((UInt)y + (UInt)w); w = (Int)(((UInt)w << 1) - (UInt)y);
  z = (Int)((UInt)z + (UInt)x); x = (Int)(((UInt)x << 1) - (UInt)z);
  y = (Int)((UInt)y + (UInt)z); z = (Int)(((UInt)z << 1) - (UInt)y);
  w = (Int)((UInt)w + (UInt)x); x = (Int)(((UInt)x << 1) - (UInt)w);
  p[0 * s] = x; p[1 * s] = y; p[2 * s] = z; p[3 * s] = w;
}

template <class Int, class UInt, int D> CCOLL_HD void fwd_xform(Int* q) {
  if (D == 1) {
    fwd_lift<Int, UInt>(q, 1);
  } else {
#pragma unroll
    for (int j = 0; j < 4; j++) fwd_lift<Int, UInt>(q + 4 * j, 1);
#pragma unroll
    for (int i = 0; i < 4; i++) fwd_lift<Int, UInt>(q + i, 4);
  }
}

template <class Int, class UInt, int D> CCOLL_HD void inv_xform(Int* q) {
  if (D == 1) {
    inv_lift<Int, UInt>(q, 1);
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) inv_lift<Int, UInt>(q + i, 4);
#pragma unroll
    for (int j = 0; j < 4; j++) inv_lift<Int, UInt>(q + 4 * j, 1);
  }
}

// number of bit planes below which nothing is coded (libzfp's precision() with maxprec 64, minexp -1074)
template <class Scalar, int D> CCOLL_HD int kmin_for(int emax) {
  int prec = emax + 1074 + 2 * D + 2;
  if (prec > 64) prec = 64;
  if (prec < 0) prec = 0;
  int kmin = Traits<Scalar>::P - prec;
  return kmin > 0 ? kmin : 0;
}

// ---- one block ------------------------------------------------------------------------------------

template <class Scalar, int D>
CCOLL_HD void encode_block(const Scalar* in, ccoll_u64 n, ccoll_u64 b, int maxbits, ccoll_u64* out) {
  typedef Traits<Scalar> T;
  typedef typename T::Int Int;
  typedef typename T::UInt UInt;
  const int S = Dims<D>::S;
  const int P = T::P;
  const UInt MAG = ~(UInt)0 >> 1;
  const UInt EXPMASK = ((UInt)((1 << T::EBITS) - 1)) << T::MANT;

  Scalar v[S];
  gather<Scalar, D>(in, n, b, v);
  // magnitudes compare as integers; NaN/Inf have all exponent bits set, so one max finds both
  UInt maxmag = 0;
#pragma unroll
  for (int i = 0; i < S; i++) {
    UInt m = T::bits(v[i]) & MAG;
    maxmag = m > maxmag ? m : maxmag;
  }
  ccoll_u64 begin = b * (ccoll_u64)maxbits;
  BlockWriter w(out, begin, begin + (ccoll_u64)maxbits);
  int biased_exp = (int)(maxmag >> T::MANT);  // of the block maximum
  if (maxmag >= EXPMASK) {  // non-finite: marker header (flag 1, biased exponent 0)
    w.write_bits(1, 1 + T::EBITS);
    w.finish();
    return;
  }
  if (biased_exp <= P - 4) return;  // all zero or tiny: maxbits zero bits, already in the output
  // frexp exponent of the maximum; with the tiny blocks gone no clamping is needed
  int emax = biased_exp - (T::EBIAS - 1);
  w.write_bits(2 * (ccoll_u64)(emax + T::EBIAS) + 1, 1 + T::EBITS);

  Int q[S];
  Scalar scale = pow2<Scalar>(P - 2 - emax);
#pragma unroll
  for (int i = 0; i < S; i++) q[i] = (Int)(scale * v[i]);
  fwd_xform<Int, UInt, D>(q);
  UInt u[S];
#pragma unroll
  for (int i = 0; i < S; i++) u[i] = ((UInt)q[Dims<D>::perm(i)] + T::nbmask()) ^ T::nbmask();

  // embedded bit-plane coder with group testing
  int bits = maxbits - 1 - T::EBITS;
  int kmin = kmin_for<Scalar, D>(emax);
  int nsig = 0;  // coefficients known to be significant
  for (int k = P; bits > 0 && k > kmin;) {
    --k;
    ccoll_u64 x = 0;
#pragma unroll
    for (int i = 0; i < S; i++) x |= (ccoll_u64)((u[i] >> k) & 1) << i;
    int m = nsig < bits ? nsig : bits;
    bits -= m;
    x = w.write_bits(x, m);
    // group tests: a 1 says "another coefficient becomes significant in this plane", followed by a
    // unary scan for it (zeros, then a 1 unless it is the last coefficient, whose 1 is implied). The
    // scan is emitted in one step from the position of the next one instead of bit by bit.
    while (bits > 0 && nsig < S) {
      --bits;
      if (!w.write_bit(x != 0)) break;
      int lim = S - 1 - nsig < bits ? S - 1 - nsig : bits;  // scan bits that may be written
      int t = ctz64(x);
      if (t < lim) {
        w.write_bits(x, t + 1);  // t zeros and the one
        bits -= t + 1;
      } else {  // budget or implied last coefficient first: lim zeros
        w.write_bits(0, lim);
        bits -= lim;
        t = lim;
      }
      x >>= t + 1;
      nsig += t + 1;
    }
  }
  w.finish();
}

// Decodes block b into v (S values); a non-finite marker block decodes to NaN everywhere.
template <class Scalar, int D>
CCOLL_HD void decode_block(const ccoll_u64* in, ccoll_u64 b, int maxbits, Scalar* v) {
  typedef Traits<Scalar> T;
  typedef typename T::Int Int;
  typedef typename T::UInt UInt;
  const int S = Dims<D>::S;
  const int P = T::P;
  BlockReader r(in, b * (ccoll_u64)maxbits);
  if (!r.read_bit()) {
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = Scalar(0);
    return;
  }
  int biased = (int)r.read_bits(T::EBITS);
  if (biased == 0) {  // our non-finite marker
    // the canonical quiet NaN (as torch's float('nan') and numpy's nan), so every backend decodes the
    // same bits
    Scalar nan = T::from_bits((((UInt)1 << (T::EBITS + 1)) - 1) << (T::MANT - 1));
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = nan;
    return;
  }
  int emax = biased - T::EBIAS;
  int bits = maxbits - 1 - T::EBITS;
  int kmin = kmin_for<Scalar, D>(emax);
  UInt u[S];
#pragma unroll
  for (int i = 0; i < S; i++) u[i] = 0;
  int nsig = 0;
  for (int k = P; bits > 0 && k > kmin;) {
    --k;
    int m = nsig < bits ? nsig : bits;
    bits -= m;
    ccoll_u64 x = r.read_bits(m);
    while (bits > 0 && nsig < S) {  // group tests, mirroring the encoder
      --bits;
      if (!r.read_bit()) break;
      int lim = S - 1 - nsig < bits ? S - 1 - nsig : bits;
      ccoll_u64 window = r.peek_bits(lim);
      int t = window ? ctz64(window) : lim;
      if (t < lim) {
        r.skip_bits(t + 1);
        bits -= t + 1;
      } else {
        r.skip_bits(lim);
        bits -= lim;
        t = lim;
      }
      nsig += t;
      x |= 1ull << nsig;  // as libzfp, also when the budget ran out before the one was seen
      ++nsig;
    }
#pragma unroll
    for (int i = 0; i < S; i++) u[i] += (UInt)((x >> i) & 1) << k;
  }
  Int q[S];
#pragma unroll
  for (int i = 0; i < S; i++) q[Dims<D>::perm(i)] = (Int)((u[i] ^ T::nbmask()) - T::nbmask());
  inv_xform<Int, UInt, D>(q);
  Scalar scale = pow2<Scalar>(emax - (P - 2));
#pragma unroll
  for (int i = 0; i < S; i++) v[i] = scale * (Scalar)q[i];
}

// fp32 -> bf16 -> fp32, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN
CCOLL_HD float round_bf16(float f) {
  ccoll_u32 u = Traits<float>::bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Traits<float>::from_bits((u | 0x00400000u) & 0xffff0000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return Traits<float>::from_bits(u & 0xffff0000u);
}

template <int D>
CCOLL_HD void decode_sum_block(const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 n, ccoll_u64 b,
                               int maxbits, int round_to_bf16, float* out) {
  const int S = Dims<D>::S;
  float acc[S], v[S];
#pragma unroll
  for (int i = 0; i < S; i++) acc[i] = 0.0f;
  for (int r = 0; r < rows; r++) {
    decode_block<float, D>(in + (ccoll_u64)r * row_words, b, maxbits, v);
    if (round_to_bf16) {
#pragma unroll
      for (int i = 0; i < S; i++) v[i] = round_bf16(v[i]);
    }
#pragma unroll
    for (int i = 0; i < S; i++) acc[i] += v[i];
  }
  scatter<float, D>(acc, n, b, out);
}

CCOLL_HD ccoll_u64 num_blocks(ccoll_u64 n, int dims) { return dims == 2 ? (n + 15) / 16 : (n + 3) / 4; }

// ---- loops over blocks, shared by the CUDA kernels and the host entry points --------------------------

template <class Scalar, int D>
CCOLL_HD void decode_scatter(const ccoll_u64* in, ccoll_u64 n, ccoll_u64 b, int maxbits, Scalar* out) {
  Scalar v[Dims<D>::S];
  decode_block<Scalar, D>(in, b, maxbits, v);
  scatter<Scalar, D>(v, n, b, out);
}

}  // namespace ccoll_zfp

// ---- CUDA entry points: one thread per block (grid-stride) ------------------------------------------
// Encode output must be zero-initialised: the boundary words of each block are OR-ed in.

#define CCOLL_ZFP_FOR_BLOCKS(nblk)                                                                  \
  for (ccoll_u64 b = (ccoll_u64)blockIdx.x * blockDim.x + threadIdx.x; b < (nblk);                \
       b += (ccoll_u64)gridDim.x * blockDim.x)

namespace ccoll_zfp {

template <class Scalar>
__device__ void encode_kernel(const Scalar* in, ccoll_u64 n, int dims, int maxbits, ccoll_u64* out) {
  ccoll_u64 nblk = num_blocks(n, dims);
  if (dims == 2) {
    CCOLL_ZFP_FOR_BLOCKS(nblk) encode_block<Scalar, 2>(in, n, b, maxbits, out);
  } else {
    CCOLL_ZFP_FOR_BLOCKS(nblk) encode_block<Scalar, 1>(in, n, b, maxbits, out);
  }
}

template <class Scalar>
__device__ void decode_kernel(const ccoll_u64* in, ccoll_u64 n, int dims, int maxbits, Scalar* out) {
  ccoll_u64 nblk = num_blocks(n, dims);
  if (dims == 2) {
    CCOLL_ZFP_FOR_BLOCKS(nblk) decode_scatter<Scalar, 2>(in, n, b, maxbits, out);
  } else {
    CCOLL_ZFP_FOR_BLOCKS(nblk) decode_scatter<Scalar, 1>(in, n, b, maxbits, out);
  }
}

}  // namespace ccoll_zfp

extern "C" __global__ void ccoll_zfp_encode_f32(const float* in, ccoll_u64 n, int dims, int maxbits,
                                                ccoll_u64* out) {
  ccoll_zfp::encode_kernel<float>(in, n, dims, maxbits, out);
}
extern "C" __global__ void ccoll_zfp_encode_f64(const double* in, ccoll_u64 n, int dims, int maxbits,
                                                ccoll_u64* out) {
  ccoll_zfp::encode_kernel<double>(in, n, dims, maxbits, out);
}
extern "C" __global__ void ccoll_zfp_decode_f32(const ccoll_u64* in, ccoll_u64 n, int dims, int maxbits,
                                                float* out) {
  ccoll_zfp::decode_kernel<float>(in, n, dims, maxbits, out);
}
extern "C" __global__ void ccoll_zfp_decode_f64(const ccoll_u64* in, ccoll_u64 n, int dims, int maxbits,
                                                double* out) {
  ccoll_zfp::decode_kernel<double>(in, n, dims, maxbits, out);
}

// Reduce step of all_reduce: out = sum over rows r = 0..rows-1 (in order, starting from +0) of
// decode(row r), in fp32. Row r starts at word r * row_words. round_to_bf16 rounds each decode to bf16
// first, so the result equals summing the decodes of a bf16 tensor.
extern "C" __global__ void ccoll_zfp_decode_sum_f32(const ccoll_u64* in, ccoll_u64 row_words, int rows,
                                                    ccoll_u64 n, int dims, int maxbits, int round_to_bf16,
                                                    float* out) {
  ccoll_u64 nblk = ccoll_zfp::num_blocks(n, dims);
  if (dims == 2) {
    CCOLL_ZFP_FOR_BLOCKS(nblk)
    ccoll_zfp::decode_sum_block<2>(in, row_words, rows, n, b, maxbits, round_to_bf16, out);
  } else {
    CCOLL_ZFP_FOR_BLOCKS(nblk)
    ccoll_zfp::decode_sum_block<1>(in, row_words, rows, n, b, maxbits, round_to_bf16, out);
  }
}

// ---- host entry points (emulated backend): the same per-block functions, OpenMP over blocks ----------
#ifdef CCOLL_HOST

namespace ccoll_zfp {

template <class Scalar, int D>
void host_encode(const Scalar* in, ccoll_u64 n, int maxbits, ccoll_u64* out) {
  ccoll_i64 nblk = (ccoll_i64)num_blocks(n, D);
#pragma omp parallel for schedule(static)
  for (ccoll_i64 b = 0; b < nblk; b++) encode_block<Scalar, D>(in, n, (ccoll_u64)b, maxbits, out);
}

template <class Scalar, int D>
void host_decode(const ccoll_u64* in, ccoll_u64 n, int maxbits, Scalar* out) {
  ccoll_i64 nblk = (ccoll_i64)num_blocks(n, D);
#pragma omp parallel for schedule(static)
  for (ccoll_i64 b = 0; b < nblk; b++) decode_scatter<Scalar, D>(in, n, (ccoll_u64)b, maxbits, out);
}

template <int D>
void host_decode_sum(const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 n, int maxbits,
                     int round_to_bf16, float* out) {
  ccoll_i64 nblk = (ccoll_i64)num_blocks(n, D);
#pragma omp parallel for schedule(static)
  for (ccoll_i64 b = 0; b < nblk; b++)
    decode_sum_block<D>(in, row_words, rows, n, (ccoll_u64)b, maxbits, round_to_bf16, out);
}

}  // namespace ccoll_zfp

extern "C" {
void ccoll_host_zfp_encode_f32(const float* in, ccoll_u64 n, int dims, int maxbits, ccoll_u64* out) {
  if (dims == 2) ccoll_zfp::host_encode<float, 2>(in, n, maxbits, out);
  else ccoll_zfp::host_encode<float, 1>(in, n, maxbits, out);
}
void ccoll_host_zfp_encode_f64(const double* in, ccoll_u64 n, int dims, int maxbits, ccoll_u64* out) {
  if (dims == 2) ccoll_zfp::host_encode<double, 2>(in, n, maxbits, out);
  else ccoll_zfp::host_encode<double, 1>(in, n, maxbits, out);
}
void ccoll_host_zfp_decode_f32(const ccoll_u64* in, ccoll_u64 n, int dims, int maxbits, float* out) {
  if (dims == 2) ccoll_zfp::host_decode<float, 2>(in, n, maxbits, out);
  else ccoll_zfp::host_decode<float, 1>(in, n, maxbits, out);
}
void ccoll_host_zfp_decode_f64(const ccoll_u64* in, ccoll_u64 n, int dims, int maxbits, double* out) {
  if (dims == 2) ccoll_zfp::host_decode<double, 2>(in, n, maxbits, out);
  else ccoll_zfp::host_decode<double, 1>(in, n, maxbits, out);
}
void ccoll_host_zfp_decode_sum_f32(const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 n, int dims,
                                   int maxbits, int round_to_bf16, float* out) {
  if (dims == 2) ccoll_zfp::host_decode_sum<2>(in, row_words, rows, n, maxbits, round_to_bf16, out);
  else ccoll_zfp::host_decode_sum<1>(in, row_words, rows, n, maxbits, round_to_bf16, out);
}
}

#endif  // CCOLL_HOST
