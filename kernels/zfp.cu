// ZFP fixed-rate encode/decode for 1-D and 2-D blocks of float32/float64, bit-exact with libzfp 1.0.1
// (zfpy.compress_numpy(x, rate=R, write_header=False)) for finite blocks; see shared ZFP_FIXED_RATE.md.
//
// One algorithm, written once: per-block functions templated on a traits struct (float / double), on a
// storage struct (the tensor's dtype: fp32, bf16, f16 read and written directly, coded as zfp float; fp64
// as zfp double) and on the number of dimensions (1 or 2). The same functions serve the CUDA kernels (a
// warp per 32 blocks to encode, a thread per block to decode), NVRTC (CuPy RawModule) and the host build
// (-DCCOLL_HOST, OpenMP loop over tiles / blocks) that backs the "emulated" backend.
//
// The API is batched (ccoll/codecs/base.py): encode_rows / decode_rows / decode_sum each code every
// block of every row in ONE launch. encode_rows optionally fuses error feedback per block in the same
// thread (compensate, encode, decode the block back, store the residual). A plain encode/decode is one
// row.
//
// Where libzfp has no defined result we define one, identically on every backend:
//  * Non-finite block (any NaN/Inf among its values): written as header bit 1 followed by a biased
//    exponent of 0 and zeros. libzfp never emits that code (biased exponent 0 always takes its all-zero
//    path), so decoders recognise it and return NaN for every value of the block.
//  * Tiny block (max |v| < 2^-98 for float, < 2^-962 for double, i.e. frexp exponent <= P-4-EBIAS):
//    libzfp's scale factor 2^(P-2-emax) overflows to inf and its output is garbage (it differs between
//    x86 and GPU). Such blocks are written as all-zero blocks and decode to +0. The error is below the
//    threshold, far below anything a gradient cares about.
//  * NaN bits: a decoded NaN is the canonical quiet NaN, narrowed as torch (CPU) narrows it; a NaN
//    decode_sum is the canonical fp32 NaN (x86 and the GPU propagate different NaNs through additions).
//
// Flush-to-zero: results never depend on it (CuPy compiles with -ftz=true); see "exact float
// arithmetic" below for how.
//
// Dims=2 reads a flat array as rows of 4 values (nx = 4, ny = ceil(n/4)), so 2-D block b holds the 16
// consecutive values [16b, 16b+16). A partial last row (n % 4 != 0) is padded along x with zfp's
// partial-block rule before the usual padding of missing rows along y; for n % 4 == 0 this is exactly
// zfp on x.reshape(-1, 4).
//
// Output words: blocks are back to back at bit granularity, so neighbouring blocks share words. Two
// encoders give the same bytes (tests/unit/test_simt.py compares them on simt; the codec launches
// encode_tiles):
//  * encode_tiles (the default): one warp per tile of 32 consecutive blocks of a row (a warp codes a run of
//    consecutive tiles, 1 for small inputs, up to 8 for large ones: see encode_tiles_run). A tile's bits,
//    [32t*maxbits, 32(t+1)*maxbits) of its row, are exactly the 32-bit words [t*maxbits, (t+1)*maxbits),
//    owned by that warp alone. Each lane codes its block into its own words of a shared-memory buffer with a
//    32-bit bit writer (LaneWriter), then, after a __syncwarp, the lanes store the tile's words round robin,
//    each word assembled from the (at most 5) lane buffers it overlaps (copied from one where blocks are whole
//    words): every output word stored once,
//    coalesced, no atomics, no zero-initialised output (the row's last tile writes the zero padding up to
//    the row's 64-bit end). 64/63/63/94 registers (f32/bf16/f16/f64, sm_90, capped by __launch_bounds__
//    (128, 8 | 5) at 64 | 102; no local memory on sm_90, on sm_80 8 / 16 bytes of spills for f32 / f64, refilled on
//    the general path of a tile that is not whole and, f64 only, once per tile; 64/63/64/96 before the nibble
//    stream from 3 significant coefficients and the copy assembly, 64/56/64/93 before the whole-tile
//    load and the run's additive stepping, 63/63/63/95 before the runs of tiles per warp and the word assembly's
//    multiply for its division, 64/63/63/93 before the dims=1 plane-loop changes, 63/56/56/92 before the
//    dims=2 plane transpose), no local memory, 24.5 KiB shared memory
//    per 128-thread CTA (32.5 KiB for f64; 8 KiB / 16 KiB of it the plane stores), so 8 | 5 CTAs still fit
//    an SM.
//  * encode_rows (kept as the reference and for comparison): one thread per block; words that lie inside
//    the block are plain stores and the (at most two) boundary words are OR-ed atomically into an output
//    the caller zeroes first. 76/72/72/114 registers on sm_90 (77/72/72/110 on sm_80; this header said
//    76/72/72/109 before the nibble stream from 3 significant coefficients, 72/72/72/119 before the dims=1
//    plane-loop changes)
//    and a 64/64/64/128-byte stack frame, the dims=2 plane store (was 72/74/74/112 and none before the plane transpose; 102/102/102/153 before the 32-bit
//    plane words and the RECON/feedback register savings that both encoders share).
// The block coder itself is the same serial per-block function in both (encode_values); lanes of a warp
// diverge only in how many group-test steps (dims=1: planes) their blocks take. A dims=2 block's bit planes
// come from a bit-matrix transpose done once per block into a plane store (shared memory in the tile
// encoder, a thread-private array in encode_rows and on the host; see transpose_planes); dims=1 gathers
// the few planes it codes with group tests and writes the rest as a nibble stream (plane_nibbles).
//
// Roofline estimate (not measured: no GPU has run this yet), re-derived by `make sass-estimate`
// (tools/sass_estimate.py, which keeps the H200 constants below in its Budget class). Per value, encode reads
// 4 B (f32) and writes R/8 B; a copy moves 8 B. On an H200 (~4 TB/s achievable, 132 SMs x 64 INT32 lanes x
// ~1.9 GHz ~ 16e12 integer thread-instructions/s) a copy runs at ~5e11 values/s, so encode at 25% of copy
// bandwidth needs ~1.25e11 values/s: a budget of ~130 thread-instructions per value at full issue efficiency.
// Memory is far from the limit (<= 5 B per value at ~4 TB/s); encode is instruction-bound. The tool compiles
// this file for sm_90 with NVRTC and the codec's own options plus -lineinfo, splits the SASS of
// ccoll_zfp_encode_tiles_f32 (nvdisasm -c -g) into basic blocks, keeps each dims' path without error
// feedback, gives every block a region by its source lines (once per lane, once per coded block, per plane,
// per group test, per output word, ...) and weights the regions' static counts by the events of a Python
// mirror of the block coder (Gaussian f32, seed 0, 3200 blocks a case), whose bytes
// tests/unit/test_sass_estimate.py checks against libzfp. A region's blocks all count once per event, so
// the counts lean high. What it prints now (NVRTC 13.5; instructions per block for the whole kernel path; per
// value; fraction of copy at full issue efficiency), for the two runs of tiles per warp the codec launches
// (ccoll/codecs/zfp.py tiles_per_warp): 1 tile per warp below 33792 tiles (dims=1: ~4.3M values), 8 from
// 135168 tiles (dims=1 ~17M values, dims=2 ~69M), 2 and 4 between:
//                    1 tile per warp: mean lane    slowest lane of each warp  | 8 tiles per warp: mean   slowest
//    dims=1 rate 8:   511 (128 per value, 25%)   661 (165 per value, 19%)    |  346 ( 87, 37%)   496 (124, 26%)
//    dims=1 rate 16:  575 (144 per value, 22%)   725 (181 per value, 18%)    |  410 (103, 31%)   561 (140, 23%)
//    dims=2 rate 8:  1479 ( 92 per value, 35%)  1756 (110 per value, 29%)    | 1322 ( 83, 39%)  1600 (100, 32%)
//    dims=2 rate 16: 1880 (118 per value, 27%)  2164 (135 per value, 24%)    | 1723 (108, 30%)  2008 (126, 26%)
// (a warp is at best as fast as its slowest lane). With 8 tiles per warp, rate 8 meets the 25% target at the
// slowest lane in both dims; rate 16 does not (dims=1 23%: its two nibble-stream writes and two copied words).
// Before the last two changes (the nibble stream from 3 significant coefficients, the copy assembly; see
// below), 8 tiles per warp: dims=1 rate 8 409 / 580 (31% / 22%), rate 16 505 / 748; dims=2 rate 8 1422 / 1699,
// rate 16 1935 / 2219 (1 tile per warp: 571 / 742, 667 / 909, 1578 / 1855, 2091 / 2375).
// Before the changes below (8 tiles per warp): dims=1 rate 8 501 / 668 (26% / 19%), rate 16 601 / 839; dims=2
// rate 8 1597 / 1869, rate 16 2122 / 2400 (1 tile per warp: 611 / 779, 711 / 949, 1707 / 1979, 2232 / 2510):
//  * dims=1 writes the nibble stream as soon as 3 coefficients are significant (was: all 4): with 3, a plane is
//    their 3 verbatim bits and the last coefficient's group test, which is that coefficient's plane bit (its 1 is
//    implied, no scan), so the block's remaining bits are the same nibbles. Group-test planes per block 2.2 -> 1.5;
//  * where a block is whole 32-bit words (maxbits % 32 == 0: rate 8, 16, ... in dims=1, every even rate in
//    dims=2), each output word is one lane-buffer word, copied (assemble_tile_lane's first loop: 14 instructions
//    a word, was 8 + 34 for the word and its one piece);
//  * a whole tile (every block S values inside its row and the tensor, no feedback, src and rows 16-byte aligned
//    for fp32 / fp64: whole_values, whole_limit) loads each lane's block straight from src + pos + lane * S
//    (load_whole) with no Span range checks and no alignment test; the general path (encode_tile_lane's else side:
//    a row's last partial tile, the tensor's end, feedback, an unaligned source) is 'partial' below, which the
//    tool's whole tiles never take;
//  * the run steps its tile's first value, row end and first output word by additions (no per-tile multiply, no
//    tile -> (row, tile in row) state), and dispatches on dims once outside the tile loop;
//  * to_fixed is one right shift of the significand by a clamped amount (tcap, once per block) instead of a shift
//    either way and an exponent select (~10 instructions a value instead of ~15).
// Its regions (static instructions x events per block, rate 8, 8 tiles per warp):
//  * dims=1: per warp 188 (x 1/8: kernel set-up, the run, the one 64-bit division, the reciprocal of maxbits);
//    per tile 54 (the whole test and the load, the run's step, the word assembly's set-up, ~12 of them the
//    divergent-__syncwarp fallbacks); per coded block 96 (max, header, fixed point, lifting, leading all-zero
//    planes at once); a group-test plane 61 (x 1.5, one branch-free write from group_code); the nibble
//    stream's set-up 9, and 50 per write of 8 planes (x 1; rate 16: x 2); finish 9; the copy assembly 14 per
//    output word (x 1; rate 16: x 2). Rates whose blocks are not whole words take the general assembly: 10 per
//    word, 34 for its first lane buffer, 19 for each further one (up to 5).
//  * dims=2: per warp 179, per tile 106; per coded block 511 (the transpose and plane store, transpose_planes,
//    ~170 of them); a plane 42 (x 7.9; rate 16: x 15.9); a group test 26 (x 6.4), a test that finds its
//    coefficient 21 (x 3.5) and one that stops at the budget or the implied last coefficient 9 (x 1), then 7 for
//    either; the copy assembly 16 per word, 4 words (rate 16: 8).
// The figures before the runs of tiles per warp (one tile per warp, the only launch then): dims=1 rate 8 612 / 780,
// rate 16 738 / 976; dims=2 rate 8 1788 / 2065, rate 16 2417 / 2701. Earlier still, this header's figures came from
// ad-hoc scripts outside the repo: dims=1 rate 8 ~360 per block, ~90 per value, ~35% of copy, ~25% with the slowest
// lane; dims=2 ~93 per value, ~33%; they put the load and the word assembly at ~70 per block where the kernel's path
// then spent 224 + 73 (dims=1 rate 8).
// What would cut the count next: a warp-wide plane loop (lanes coding 32 blocks' plane k together) to remove the
// remaining divergence (most of the 150 between dims=1 rate 8's mean and slowest lane),
// dims=2's group tests (the table of group_code does not scale to 16 coefficients) and the ~10 of dims=2's
// instructions per plane that recompute the lane's shared-memory address (rematerialised under the register cap).

// No system #include: NVRTC (CuPy RawModule) has no system headers; the host build needs none either.
#include "common.cuh"

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
CCOLL_HD int ctz32(ccoll_u32 x) {  // x != 0
#ifdef __CUDA_ARCH__
  return __ffs((int)x) - 1;
#else
  return __builtin_ctz(x);
#endif
}

CCOLL_HD int clz32(ccoll_u32 x) {  // 32 for 0
#ifdef __CUDA_ARCH__
  return __clz((int)x);
#else
  return x ? __builtin_clz(x) : 32;
#endif
}
CCOLL_HD int clz64(ccoll_u64 x) {  // 64 for 0
#ifdef __CUDA_ARCH__
  return __clzll((long long)x);
#else
  return x ? __builtin_clzll(x) : 64;
#endif
}
CCOLL_HD int popc32(ccoll_u32 x) {
#ifdef __CUDA_ARCH__
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}
CCOLL_HD int clz_of(ccoll_u32 x) { return clz32(x); }
CCOLL_HD int clz_of(ccoll_u64 x) { return clz64(x); }
CCOLL_HD ccoll_u32 brev_of(ccoll_u32 x) {  // bit i -> bit 31 - i
#ifdef __CUDA_ARCH__
  return __brev(x);
#else
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
#endif
}
CCOLL_HD ccoll_u64 brev_of(ccoll_u64 x) {  // bit i -> bit 63 - i
#ifdef __CUDA_ARCH__
  return __brevll(x);
#else
  return ((ccoll_u64)brev_of((ccoll_u32)x) << 32) | brev_of((ccoll_u32)(x >> 32));
#endif
}

CCOLL_HD void atomic_or_word(ccoll_u64* w, ccoll_u64 v) {
#ifdef __CUDA_ARCH__
  atomicOr(w, v);
#else
  __atomic_fetch_or(w, v, __ATOMIC_RELAXED);
#endif
}

// Writes one block's bits [begin, end) into a zero-initialised word array (words shared with
// neighbouring blocks are OR-ed in atomically).
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
  // write_bits for 1 <= n <= 32 (LaneWriter's is cheaper without the n == 0 test)
  CCOLL_HD void write_some(ccoll_u32 v, int n) { write_bits(v, n); }
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

// ---- exact float arithmetic that no flush-to-zero setting can change --------------------------------
// CuPy compiles with -ftz=true, which makes every fp32 multiply, add and conversion flush subnormal
// operands and results to zero. Results must not depend on it (issue 8, finding 1), so:
//  * fixed-point conversions (encode: v * 2^(P-2-emax) -> Int; decode: Int -> Scalar times 2^(emax-P+2))
//    are integer bit manipulation, exact and rounded as IEEE does (round to nearest even, subnormals);
//  * dtype conversions (fp32 <-> bf16 / f16, fp64 -> fp32) are integer bit manipulation;
//  * the few fp32 additions (decode-sum accumulation, error-feedback compensation and residual) are
//    explicit PTX add.rn.f32 on the GPU: without the .ftz modifier whatever the compile
//    options say (and .rn also keeps them from being contracted into FMAs). fp64 never flushes.
// Nothing else in this file does floating-point arithmetic.

CCOLL_HD int bitlen64(ccoll_u64 x) {  // number of significant bits, 0 for 0
#ifdef __CUDA_ARCH__
  return 64 - __clzll((long long)x);
#else
  return x ? 64 - __builtin_clzll(x) : 0;
#endif
}

// x / 2^s rounded to nearest, ties to even (0 <= s; s >= 64 gives 0 as x < 2^64 <= 2^s and s > bitlen)
CCOLL_HD ccoll_u64 rne_shr(ccoll_u64 x, int s) {
  if (s <= 0) return x;
  if (s >= 64) return (s == 64 && x > (1ull << 63)) ? 1 : 0;
  ccoll_u64 q = x >> s, rem = x & ((1ull << s) - 1), half = 1ull << (s - 1);
  return q + (rem > half || (rem == half && (q & 1)));
}

// The Scalar nearest to (-1)^neg * m * 2^k (one rounding, to nearest even, subnormal and overflow
// included), built from its bits.
template <class Scalar> CCOLL_HD Scalar make_scalar(bool neg, ccoll_u64 m, int k) {
  typedef Traits<Scalar> T;
  typedef typename T::UInt UInt;
  const UInt sign = neg ? (UInt)1 << (T::P - 1) : 0;
  const UInt inf = (((UInt)1 << T::EBITS) - 1) << T::MANT;
  if (m == 0) return T::from_bits(sign);
  int L = bitlen64(m);
  const int emin = 1 - T::EBIAS;             // exponent of the smallest normal
  const int qmin = emin - T::MANT;           // exponent of the smallest subnormal step
  if (k + L - 1 >= emin) {                   // normal (before rounding)
    int sh = L - (T::MANT + 1);
    ccoll_u64 r = sh > 0 ? rne_shr(m, sh) : m << -sh;
    int e = k + sh + T::MANT;                // exponent of r's leading bit (r has MANT+1 bits)
    if (r >> (T::MANT + 1)) { r >>= 1; ++e; }  // rounding carried into a new bit
    if (e > T::EBIAS) return T::from_bits(sign | inf);
    return T::from_bits(sign | ((UInt)(e + T::EBIAS) << T::MANT) | ((UInt)r & ((((UInt)1) << T::MANT) - 1)));
  }
  // subnormal: count steps of 2^qmin; a carry into bit MANT is exactly the smallest normal's code
  int s = qmin - k;
  ccoll_u64 r = s > 0 ? rne_shr(m, s) : m << -s;
  return T::from_bits(sign | (UInt)r);
}

// libzfp's decode of one coefficient: (Scalar)q * 2^k, i.e. q rounded to Scalar, then scaled with a
// second rounding only where the result is subnormal. All-normal cases take the plain multiply.
template <class Scalar> CCOLL_HD Scalar int_ldexp(typename Traits<Scalar>::Int q, int k, Scalar scale, bool normal) {
  typedef Traits<Scalar> T;
  if (normal) return scale * (Scalar)q;  // scale and every nonzero result are normal: FTZ cannot apply
  bool neg = q < 0;
  ccoll_u64 m = neg ? (ccoll_u64)0 - (ccoll_u64)(ccoll_i64)q : (ccoll_u64)(ccoll_i64)q;
  int L = bitlen64(m);
  if (L > T::MANT + 1) {  // (Scalar)q
    int sh = L - (T::MANT + 1);
    m = rne_shr(m, sh);
    k += sh;
  }
  if (m == 0) return Scalar(0);  // +0, as (Scalar)0 * scale
  return make_scalar<Scalar>(neg, m, k);
}

// libzfp's encode of one value: (Int)(v * 2^(P-2-emax)), truncating, for v of a finite block whose largest
// magnitude has biased exponent bmax > P-4 (so emax = bmax - (EBIAS-1), and bmax >= 2). With be the biased
// exponent of v (a subnormal scales as be = 1) and m its significand (implicit bit included),
// v * 2^(P-2-emax) = m * 2^(D0 - t), D0 = P-3-MANT, t = bmax - max(be, 1) >= 0; m << D0 < 2^(P-2), so that is
// (m << D0) >> t exactly, and 0 for t >= P-1. One right shift by t clamped to tcap = min(bmax - 1, P - 1) (once
// per block; a subnormal's bmax - 0 clamps to its bmax - 1) instead of a shift either way and the exponent's
// select: ~10 instructions a value instead of ~15 (f32, sm_90).
template <class Scalar> CCOLL_HD typename Traits<Scalar>::Int to_fixed(Scalar v, int bmax, int tcap) {
  typedef Traits<Scalar> T;
  typedef typename T::UInt UInt;
  typedef typename T::Int Int;
  const int D0 = T::P - 3 - T::MANT;
  UInt u = T::bits(v);
  int be = (int)((u >> T::MANT) & ((1u << T::EBITS) - 1));
  UInt m = (u & ((((UInt)1) << T::MANT) - 1)) | (be ? (UInt)1 << T::MANT : (UInt)0);
  int t = bmax - be < tcap ? bmax - be : tcap;
  UInt q = (m << D0) >> t;
  return (u >> (T::P - 1)) ? (Int)((UInt)0 - q) : (Int)q;
}

CCOLL_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a + b;
#endif
}
// a - b == a + (-b) exactly; the sign flip is a bit flip (PTX neg.f32 would flush under -ftz)
CCOLL_HD float sub_rn(float a, float b) { return add_rn(a, Traits<float>::from_bits(Traits<float>::bits(b) ^ 0x80000000u)); }
CCOLL_HD double add_rn(double a, double b) { return a + b; }
CCOLL_HD double sub_rn(double a, double b) { return a - b; }

// ---- storage types: what a tensor holds vs the zfp scalar it is coded as -----------------------------
// Code: the zfp scalar (float or double); Stor: the tensor's element; Fb: error-feedback residuals.
// widen is exact; narrow rounds to nearest even as torch's .to(dtype) does (NaN stays NaN, overflow -> Inf).

struct StF32 {
  typedef float Stor; typedef float Code; typedef float Fb;
  static CCOLL_HD float widen(float x) { return x; }
  static CCOLL_HD float narrow(float x) { return x; }
};
struct StF64 {
  typedef double Stor; typedef double Code; typedef double Fb;
  static CCOLL_HD double widen(double x) { return x; }
  static CCOLL_HD double narrow(double x) { return x; }
};
struct StBF16 {  // conversions: kernels/common.cuh
  typedef unsigned short Stor; typedef float Code; typedef float Fb;
  static CCOLL_HD float widen(unsigned short h) { return Traits<float>::from_bits(ccoll_conv::bf16_to_f32(h)); }
  static CCOLL_HD unsigned short narrow(float f) { return ccoll_conv::f32_to_bf16(Traits<float>::bits(f)); }
};
struct StF16 {
  typedef unsigned short Stor; typedef float Code; typedef float Fb;
  static CCOLL_HD float widen(unsigned short h) { return Traits<float>::from_bits(ccoll_conv::f16_to_f32(h)); }
  static CCOLL_HD unsigned short narrow(float f) { return ccoll_conv::f32_to_f16(Traits<float>::bits(f)); }
};

template <class St> CCOLL_HD typename St::Code round_to(typename St::Code x) { return St::widen(St::narrow(x)); }

// fp32 value of a decoded Code (fp64 -> fp32 rounds to nearest even; integer-only, see above)
CCOLL_HD float to_f32(float x) { return x; }
CCOLL_HD float to_f32(double x) {
  ccoll_u64 u = Traits<double>::bits(x), a = u & 0x7fffffffffffffffull;
  bool neg = (u >> 63) != 0;
  if (a >= 0x7ff0000000000000ull)
    return Traits<float>::from_bits((neg ? 0x80000000u : 0u) | 0x7f800000u | (a > 0x7ff0000000000000ull ? 0x400000u : 0u));
  int be = (int)(a >> 52);
  ccoll_u64 m = a & 0xfffffffffffffull;
  if (be) m |= 1ull << 52; else be = 1;
  return make_scalar<float>(neg, m, be - 1023 - 52);
}

CCOLL_HD bool is_finite(float x) { return (Traits<float>::bits(x) & 0x7f800000u) != 0x7f800000u; }
CCOLL_HD bool is_finite(double x) {
  return (Traits<double>::bits(x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

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

// Pads a block of which the first m (1 <= m < S) values are present, as zfp pads a partial block.
template <class Scalar, int D> CCOLL_HD void pad_block(Scalar* v, int m) {
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

#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
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
// 16-bit storage: no vector path (a block is 8 or 32 bytes; the scalar loads coalesce in L1)
__device__ __forceinline__ bool vec_ok(const unsigned short*) { return false; }
__device__ __forceinline__ bool vec_ok(const float* p) { return ((unsigned long long)p & 15) == 0; }
__device__ __forceinline__ bool vec_ok(const double* p) { return ((unsigned long long)p & 15) == 0; }
__device__ __forceinline__ void load16(const unsigned short*, unsigned short*) {}
__device__ __forceinline__ void store16(unsigned short*, const unsigned short*) {}
#endif

// Where block b of row r lies: values [g0, g0 + m) of the flat tensor are the block's row positions
// (m < S only for a row's partial last block), of which the first `valid` exist (the rest is the
// zero padding past the tensor's end).
struct Span {
  ccoll_u64 g0;
  int m, valid;
  CCOLL_HD Span(ccoll_u64 numel, ccoll_u64 row_numel, ccoll_u64 r, ccoll_u64 b, int S) {
    set(numel, row_numel, r * row_numel + b * S, b * S, S);
  }
  // the block at row position in_row (< row_numel), flat position g
  CCOLL_HD Span(ccoll_u64 numel, ccoll_u64 row_numel, ccoll_u64 g, ccoll_u64 in_row, int S, bool) {
    set(numel, row_numel, g, in_row, S);
  }
  CCOLL_HD void set(ccoll_u64 numel, ccoll_u64 row_numel, ccoll_u64 g, ccoll_u64 in_row, int S) {
    ccoll_u64 left = row_numel - in_row;
    m = left >= (ccoll_u64)S ? S : (int)left;
    g0 = g;
    ccoll_u64 avail = numel > g0 ? numel - g0 : 0;
    valid = avail >= (ccoll_u64)m ? m : (int)avail;
  }
};

// Loads a block's values (as Code) from a tensor of Stor, zeros past the end.
template <class St, int D> CCOLL_HD void load_block(const typename St::Stor* src, const Span& sp, typename St::Code* v) {
  typedef typename St::Stor Stor;
  const int S = Dims<D>::S;
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
  if (sp.valid == S && vec_ok(src + sp.g0)) {  // a block is 16..128 contiguous bytes: 16-byte loads
    const int PER = 16 / (int)sizeof(Stor);
    Stor raw[S];
#pragma unroll
    for (int c = 0; c < S / PER; c++) load16(src + sp.g0 + c * PER, raw + c * PER);
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = St::widen(raw[i]);
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < S; i++) v[i] = i < sp.valid ? St::widen(src[sp.g0 + i]) : typename St::Code(0);
}

// Loads a whole block (S values, all inside the tensor) from p, without Span's range checks: the tile encoder's
// whole tiles (whole_values: for fp32 / fp64, p 16-byte aligned).
template <class St, int D> CCOLL_HD void load_whole(const typename St::Stor* p, typename St::Code* v) {
  typedef typename St::Stor Stor;
  const int S = Dims<D>::S;
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
  if constexpr (sizeof(Stor) >= 4) {  // 16-byte loads (16-bit storage: the scalar loads below)
    const int PER = 16 / (int)sizeof(Stor);
    Stor raw[S];
#pragma unroll
    for (int c = 0; c < S / PER; c++) load16(p + c * PER, raw + c * PER);
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = St::widen(raw[i]);
    return;
  }  // constexpr: else nvcc warns that the loop below is unreachable for fp32 / fp64 (#128-D)
  else
#endif
  {
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = St::widen(p[i]);
  }
}

// Stores the block's first min(m, valid) values, narrowed to Stor.
template <class St, int D> CCOLL_HD void store_block(const typename St::Code* v, const Span& sp, typename St::Stor* dst) {
  typedef typename St::Stor Stor;
  const int S = Dims<D>::S;
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
  if (sp.valid == S && vec_ok(dst + sp.g0)) {
    const int PER = 16 / (int)sizeof(Stor);
    Stor raw[S];
#pragma unroll
    for (int i = 0; i < S; i++) raw[i] = St::narrow(v[i]);
#pragma unroll
    for (int c = 0; c < S / PER; c++) store16(dst + sp.g0 + c * PER, raw + c * PER);
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < S; i++)
    if (i < sp.valid) dst[sp.g0 + i] = St::narrow(v[i]);
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

// ---- bit planes by a bit-matrix transpose (dims=2) -----------------------------------------------------
// The coder needs plane k of the block (bit k of the S coefficients u[0..S-1], as an S-bit word) for
// k = P-1, P-2, ... Gathering it per plane costs S shift/and/or: for dims=2 47 of the 57 SASS
// instructions that start each plane (f32, sm_90). Instead a dims=2 block is transposed once: 4 rounds of
// delta swaps exchanging bit s of the row index with bit s of the column index (s = 1, 2, 4, 8), after which
//   t[k & 15] bits [k & ~15, (k & ~15) + 16)  = plane k,
// i.e. word j holds planes j, j+16 (, j+32, j+48 for double) as 16-bit fields. The words go to a plane store
// (the tile encoder: the lane's slice of shared memory, conflict-free; the per-block encoder and the host:
// an array), because k is not a compile-time constant and a dynamically indexed register array would be
// local memory; a plane is then one load, a shift and a mask (plane_of). Counted in the sm_90 SASS of
// ccoll_zfp_encode_tiles_f32 (nvdisasm): the block's straight-line code before the plane loop grows by 164
// instructions (32 swaps, those of the s = 8 round two byte permutes each, 16 stores; 188 with that round
// as shifts too), each plane's start shrinks from 57 to 26. dims=1 keeps the gather for the planes that
// still carry group tests (4 values make it 11 instructions a plane); it skips its leading all-zero planes
// at once and writes its all-significant tail as a nibble stream (plane_nibbles below), so only ~2-3 planes
// of a block are gathered.
using ccoll_conv::byte_perm;  // kernels/common.cuh
// ---- dims=1: planes as a nibble stream --------------------------------------------------------------
// Once 3 of the 4 coefficients of a dims=1 block are significant, every further plane is its 4 bits
// verbatim (with 3 significant, the one group test left is the 4th coefficient's bit, its 1 implied),
// so the rest of the block is the planes' nibbles back to back: plane k-1 (coefficient i at bit i), then
// plane k-2, ... The encoder writes that tail 8 planes (32 bits) at a time from r_i = brev(u_i) (bit p of
// r_i is plane P-1-p): the low bytes of r_i >> (P-k) (planes k-1 .. k-8 of coefficient i, bit p for
// plane k-1-p), packed into one word (byte i) and transposed as a 4 x 8 bit matrix (bit 8i + p -> 4p + i).
// dims=1 group tests of one plane: with y the plane's bits above nsig (coefficient nsig + j at bit j), the
// bits the group-test loop writes are, for each one of y from the lowest, a 1 test and the scan (zeros up to
// it, then its 1), and after the last one a 0 test: the scan's final 1 and that 0 are dropped when the last
// one is the block's last coefficient (implied). group_code(y) is that sequence, least significant bit
// first, with the final 1 always in and the 0 test (a zero) left to the length; 8 bits for each y in 0..15.
CCOLL_HD ccoll_u32 group_code(ccoll_u32 y) {
  return (ccoll_u32)(((y & 8) ? 0xff7d77395f2d2711ull : 0x3f1d17090f050300ull) >> (8 * (y & 7))) & 0xffu;
}
// Delta swap of index bits a > b of a 32-bit word: bits whose index has bit a clear and bit b set trade
// places with those at + (2^a - 2^b); m selects the former.
CCOLL_HD ccoll_u32 swap_index_bits(ccoll_u32 x, int d, ccoll_u32 m) {
  ccoll_u32 t = (x ^ (x >> d)) & m;
  return x ^ t ^ (t << d);
}
// bytes b_i (the low byte of each argument; bit p of b_i at bit 8i + p) -> bit 4p + i
CCOLL_HD ccoll_u32 interleave_nibbles(ccoll_u32 b0, ccoll_u32 b1, ccoll_u32 b2, ccoll_u32 b3) {
  ccoll_u32 x = byte_perm(byte_perm(b0, b1, 0x0040), byte_perm(b2, b3, 0x0040), 0x5410);
  // index bits (i1 i0 p2 p1 p0) -> (p2 p1 p0 i1 i0) by four index swaps: 4<->2, 3<->1, 2<->0, 1<->0
  x = swap_index_bits(x, 12, 0x0000f0f0u);
  x = swap_index_bits(x, 6, 0x00cc00ccu);
  x = swap_index_bits(x, 3, 0x0a0a0a0au);
  return swap_index_bits(x, 1, 0x22222222u);
}
// the nibbles of planes k-1 .. k-8 (1 <= k <= P; planes below 0 read as zero) of the coefficients whose
// bit-reversed words are r[0..3]
template <class UInt> CCOLL_HD ccoll_u32 plane_nibbles(const UInt* r, int k) {
  const int sh = (int)(8 * sizeof(UInt)) - k;
  return interleave_nibbles((ccoll_u32)(r[0] >> sh), (ccoll_u32)(r[1] >> sh), (ccoll_u32)(r[2] >> sh),
                            (ccoll_u32)(r[3] >> sh));
}

// rows a (index bit s clear) and b (set): a's columns c with (c & s) != 0 trade places with b's c - s
template <class UInt> CCOLL_HD void delta_swap(UInt& a, UInt& b, int s) {
  // the columns c with (c & s) == 0: 0x55.., 0x33.., 0x0f.., 0x00ff.. for s = 1, 2, 4, 8
  const UInt m = ~(UInt)0 / (((UInt)1 << s) + 1);
  UInt x = ((a >> s) ^ b) & m;
  b ^= x;
  a ^= x << s;
}
CCOLL_HD void delta_swap(ccoll_u32& a, ccoll_u32& b, int s) {
  if (s == 8) {  // whole bytes: a = (a0, b0, a2, b2), b = (a1, b1, a3, b3), two PRMT instead of five ops
    ccoll_u32 na = byte_perm(a, b, 0x6240), nb = byte_perm(a, b, 0x7351);
    a = na;
    b = nb;
    return;
  }
  delta_swap<ccoll_u32>(a, b, s);
}
template <class UInt, int S> CCOLL_HD void transpose_planes(UInt* t) {
#pragma unroll
  for (int s = 1; s < S; s <<= 1) {
#pragma unroll
    for (int i = 0; i < S; i++)
      if (!(i & s)) delta_swap(t[i], t[i + s], s);
  }
}

// Where a block's transposed plane words live: word j at p[j * stride].
template <class UInt> struct PlaneStore {
  UInt* p;
  int stride;
  CCOLL_HD PlaneStore(UInt* base, int s) : p(base), stride(s) {}
  CCOLL_HD void put(int j, UInt w) { p[j * stride] = w; }
  // plane k (an S-bit word) of the block stored by put
  template <int S> CCOLL_HD ccoll_u32 plane_of(int k) const {
    return (ccoll_u32)(p[(k & (S - 1)) * stride] >> (k & ~(S - 1))) & (ccoll_u32)((1ull << S) - 1);
  }
};

// ---- one block ------------------------------------------------------------------------------------

// The values a decoder reconstructs from a block's coefficients u (bit planes as read) and exponent.
template <class Scalar, int D>
CCOLL_HD void reconstruct(const typename Traits<Scalar>::UInt* u, int emax, Scalar* v) {
  typedef Traits<Scalar> T;
  typedef typename T::Int Int;
  const int S = Dims<D>::S;
  Int q[S];
#pragma unroll
  for (int i = 0; i < S; i++) q[Dims<D>::perm(i)] = (Int)((u[i] ^ T::nbmask()) - T::nbmask());
  inv_xform<Int, typename T::UInt, D>(q);
  // libzfp: 2^(emax - (P-2)) * (Scalar)q. Where that scale is subnormal (float blocks with max in
  // [2^-98, 2^-96)) FTZ would zero the whole block, so those blocks take the exact integer path.
  int k = emax - (T::P - 2);
  bool normal = k >= 1 - T::EBIAS;
  Scalar scale = normal ? pow2<Scalar>(k) : Scalar(0);
#pragma unroll
  for (int i = 0; i < S; i++) v[i] = int_ldexp<Scalar>(q[i], k, scale, normal);
}

// the canonical quiet NaN (as torch's float('nan') and numpy's nan): every backend decodes the same bits
template <class Scalar> CCOLL_HD Scalar canonical_nan() {
  typedef Traits<Scalar> T;
  return T::from_bits((((typename T::UInt)1 << (T::EBITS + 1)) - 1) << (T::MANT - 1));
}

// Encodes one (padded) block of values v into w, which covers maxbits zero-initialised bits. With
// RECON it also writes to d what decode_block will read back from those bits (for error feedback,
// without reading the bits back): the encoder knows every bit it emits, including the one libzfp's
// decoder infers when the budget runs out inside a group test.
// W is the bit writer: BlockWriter (64-bit words, boundary words OR-ed in; the per-block kernel) or
// LaneWriter (32-bit words into a lane-private buffer; the tile kernel). Both take n <= 32 bits per call
// (write_bits: 0..32, write_some: 1..32).
// Bits not written read as zero: BlockWriter's output is zeroed first, LaneWriter::finish() (which the
// tile encoder calls after every block, also after an early return here) zero-fills the rest.
// ps: S words of scratch for the transposed bit planes of a dims=2 block (transpose_planes; dims=1 uses none).
template <class Scalar, int D, bool RECON, class W>
CCOLL_HD void encode_values(const Scalar* v, int maxbits, W& w, Scalar* d,
                            PlaneStore<typename Traits<Scalar>::UInt> ps) {
  typedef Traits<Scalar> T;
  typedef typename T::Int Int;
  typedef typename T::UInt UInt;
  const int S = Dims<D>::S;
  const int P = T::P;
  const UInt MAG = ~(UInt)0 >> 1;
  const UInt EXPMASK = ((UInt)((1 << T::EBITS) - 1)) << T::MANT;

  // magnitudes compare as integers; NaN/Inf have all exponent bits set, so one max finds both
  UInt maxmag = 0;
#pragma unroll
  for (int i = 0; i < S; i++) {
    UInt m = T::bits(v[i]) & MAG;
    maxmag = m > maxmag ? m : maxmag;
  }
  int biased_exp = (int)(maxmag >> T::MANT);  // of the block maximum
  if (maxmag >= EXPMASK) {  // non-finite: marker header (flag 1, biased exponent 0)
    w.write_bits(1, 1 + T::EBITS);
    w.finish();
    if (RECON) {
#pragma unroll
      for (int i = 0; i < S; i++) d[i] = canonical_nan<Scalar>();
    }
    return;
  }
  if (biased_exp <= P - 4) {  // all zero or tiny: maxbits zero bits, already in the output
    if (RECON) {
#pragma unroll
      for (int i = 0; i < S; i++) d[i] = Scalar(0);
    }
    return;
  }
  // frexp exponent of the maximum; with the tiny blocks gone no clamping is needed
  int emax = biased_exp - (T::EBIAS - 1);
  w.write_bits(2 * (ccoll_u64)(emax + T::EBIAS) + 1, 1 + T::EBITS);

  Int q[S];
  const int tcap = biased_exp - 1 < P - 1 ? biased_exp - 1 : P - 1;
#pragma unroll
  for (int i = 0; i < S; i++) q[i] = to_fixed<Scalar>(v[i], biased_exp, tcap);
  fwd_xform<Int, UInt, D>(q);
  UInt u[S];
#pragma unroll
  for (int i = 0; i < S; i++) u[i] = ((UInt)q[Dims<D>::perm(i)] + T::nbmask()) ^ T::nbmask();
  const bool TRANSPOSE = S == 16;  // dims=2 (see transpose_planes)
  if (TRANSPOSE) {
    UInt t[S];  // a copy: RECON still needs u after the plane loop
#pragma unroll
    for (int i = 0; i < S; i++) t[i] = u[i];
    transpose_planes<UInt, S>(t);
#pragma unroll
    for (int j = 0; j < S; j++) ps.put(j, t[j]);
  }

  // embedded bit-plane coder with group testing
  int bits = maxbits - 1 - T::EBITS;
  int kmin = kmin_for<Scalar, D>(emax);
  int nsig = 0;  // coefficients known to be significant
  // with RECON: every coded plane but the last reaches the decoder whole (a plane stops early only when
  // the budget runs out), so the decoder's planes are u's planes above klast, xlast as plane klast and
  // zeros below; two scalars instead of a second u[] array (registers)
  int klast = P;
  ccoll_u32 xlast = 0;
  int k = P;
  {
    // the leading all-zero planes at once: with no coefficient significant yet, such a plane is one
    // group-test bit, a zero
    UInt any = 0;
#pragma unroll
    for (int i = 0; i < S; i++) any |= u[i];
    int z = clz_of(any);
    if (z > k - kmin) z = k - kmin;
    if (z > bits) z = bits;
    if (P > 32 && z > 32) { w.write_bits(0, 32); z -= 32; bits -= 32; k -= 32; }  // double
    w.write_bits(0, z);
    bits -= z;
    k -= z;
    if (RECON && k < P) klast = k;  // xlast stays 0
  }
  while (bits > 0 && k > kmin) {
    if (S == 4 && nsig >= S - 1) {
      // dims=1, at least 3 coefficients significant: the rest of the budget is the nibble stream of planes
      // k-1, k-2, ... (see plane_nibbles), written 8 planes at a time. With 3 significant, a plane is
      // their 3 verbatim bits and one group test, which says whether the last coefficient becomes
      // significant (its 1 implied, no scan): that test bit is the coefficient's plane bit, so the
      // plane is its nibble as well, and so is every plane after it.
      int n = 4 * (k - kmin) < bits ? 4 * (k - kmin) : bits;
      UInt r[4];
#pragma unroll
      for (int i = 0; i < 4; i++) r[i] = brev_of(u[i]);
      const int ktop = k;
#pragma unroll 1
      for (int done = 0; done < n; done += 32, k -= 8) {
        int c = n - done < 32 ? n - done : 32;
        w.write_some(plane_nibbles<UInt>(r, k), c);
      }
      if (RECON) {  // the last plane reached, as far as the budget let it
        int planes = (n + 3) >> 2;
        klast = ktop - planes;
        xlast = 0;
#pragma unroll
        for (int i = 0; i < S; i++) xlast |= (ccoll_u32)((u[i] >> klast) & 1) << i;
        xlast &= (1u << (n - 4 * (planes - 1))) - 1;
      }
      break;
    }
    --k;
    ccoll_u32 x = 0;  // the plane as an S-bit word (S <= 16)
    if (TRANSPOSE) {
      x = ps.template plane_of<S>(k);
    } else {
#pragma unroll
      for (int i = 0; i < S; i++) x |= (ccoll_u32)((u[i] >> k) & 1) << i;
    }
    if (S == 4 && !RECON) {
      // dims=1 without feedback: the plane's verbatim bits and its group tests (the loop below) in one
      // write: x's low nsig bits, then group_code(y) of y, x's bits above nsig, cut to the budget (where
      // the budget runs out, the loop writes a prefix of the same bits and stops). With feedback the loop
      // runs, as it also tracks what the decoder infers from a cut plane.
      const int s0 = nsig;
      ccoll_u32 y = x >> s0;
      // h: the last new significant coefficient relative to s0 (-1 for none: then len is the one 0 test);
      // h + 1 scan bits and a 1 test per one of y, then the 0 test, or the implied 1 dropped
      int h = 31 - clz32(y);
      int len = popc32(y) + h + (h == S - 1 - s0 ? 0 : 2);
      nsig = s0 + h + 1;
      int n = s0 + len < bits ? s0 + len : bits;
      w.write_some((x ^ (y << s0)) | (group_code(y) << s0), n);  // n >= 1
      bits -= n;
      continue;
    }
    int m = nsig < bits ? nsig : bits;
    bits -= m;
    ccoll_u32 xr = x & ((1u << m) - 1);  // m <= 16
    x = (ccoll_u32)w.write_bits(x, m);
    // group tests: a 1 says "another coefficient becomes significant in this plane", followed by a
    // unary scan for it (zeros, then a 1 unless it is the last coefficient, whose 1 is implied). The
    // scan is emitted in one step from the position of the next one instead of bit by bit.
    while (bits > 0 && nsig < S) {
      --bits;
      if (!w.write_bit(x != 0)) break;
      int lim = S - 1 - nsig < bits ? S - 1 - nsig : bits;  // scan bits that may be written
      int t = ctz32(x);
      if (t < lim) {
        w.write_bits(x, t + 1);  // t zeros and the one
        bits -= t + 1;
      } else {  // budget or implied last coefficient first: lim zeros
        w.write_bits(0, lim);
        bits -= lim;
        t = lim;
      }
      xr |= 1u << (nsig + t);  // the decoder's one (inferred where the budget ran out)
      x >>= t + 1;
      nsig += t + 1;
    }
    if (RECON) { klast = k; xlast = xr; }
  }
  w.finish();
  if (RECON) {
#pragma unroll
    for (int i = 0; i < S; i++) {
      UInt above = klast >= P - 1 ? (UInt)0 : (u[i] >> (klast + 1)) << (klast + 1);
      u[i] = klast == P ? (UInt)0 : above | ((UInt)((xlast >> i) & 1) << klast);
    }
    reconstruct<Scalar, D>(u, emax, d);
  }
}

// Decodes the block that starts at bit `begin` of `in` into v (S values); a non-finite marker block
// decodes to NaN everywhere.
template <class Scalar, int D>
CCOLL_HD void decode_block(const ccoll_u64* in, ccoll_u64 begin, int maxbits, Scalar* v) {
  typedef Traits<Scalar> T;
  typedef typename T::Int Int;
  typedef typename T::UInt UInt;
  const int S = Dims<D>::S;
  const int P = T::P;
  BlockReader r(in, begin);
  if (!r.read_bit()) {
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = Scalar(0);
    return;
  }
  int biased = (int)r.read_bits(T::EBITS);
  if (biased == 0) {  // our non-finite marker
#pragma unroll
    for (int i = 0; i < S; i++) v[i] = canonical_nan<Scalar>();
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
  reconstruct<Scalar, D>(u, emax, v);
}

// ---- rows: the batched API (one thread per block of one row; all rows in one launch) ------------------
// Row r of the payload starts at word r * row_words; its blocks code the zero-padded row_numel-element
// vector src[r*row_numel : (r+1)*row_numel] exactly as a standalone encode of that vector would.

CCOLL_HD ccoll_u64 blocks_per(ccoll_u64 n, int dims) { return dims == 2 ? (n + 15) / 16 : (n + 3) / 4; }

// Encodes the block at sp (with error feedback when `feedback` is not null) through the bit writer w.
template <class St, int D, class W>
CCOLL_HD void encode_span(const typename St::Stor* src, const Span& sp, int maxbits, typename St::Fb* feedback,
                          W& w, PlaneStore<typename Traits<typename St::Code>::UInt> ps) {
  typedef typename St::Code Code;
  typedef typename St::Fb Fb;
  const int S = Dims<D>::S;
  Code v[S];
  load_block<St, D>(src, sp, v);
  if (!feedback) {
    if (sp.m < S) pad_block<Code, D>(v, sp.m);
    encode_values<Code, D, false>(v, maxbits, w, v, ps);
    return;
  }
  // error feedback: c = x + r in the residual type, sent = c rounded to the tensor's dtype
#pragma unroll
  for (int i = 0; i < S; i++)
    if (i < sp.m) v[i] = round_to<St>((Code)add_rn((Fb)v[i], feedback[sp.g0 + i]));
  if (sp.m < S) pad_block<Code, D>(v, sp.m);
  Code d[S];  // what every receiver will decode
  encode_values<Code, D, true>(v, maxbits, w, d, ps);
#pragma unroll
  for (int i = 0; i < S; i++) {
    if (i < sp.valid) {  // c recomputed from the (cached) inputs instead of held in registers
      Fb c = add_rn((Fb)St::widen(src[sp.g0 + i]), feedback[sp.g0 + i]);
      Fb res = sub_rn(c, (Fb)round_to<St>(d[i]));
      feedback[sp.g0 + i] = is_finite(res) ? res : Fb(0);
    } else if (i < sp.m) {
      feedback[sp.g0 + i] = Fb(0);
    }
  }
}

template <class St, int D>
CCOLL_HD void encode_row_block(const typename St::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel, ccoll_u64 g,
                               ccoll_u64 nblk_row, int maxbits, ccoll_u64 row_words,
                               typename St::Fb* feedback, ccoll_u64* out) {
  ccoll_u64 r = g / nblk_row, b = g - r * nblk_row;
  Span sp(numel, row_numel, r, b, Dims<D>::S);
  BlockWriter w(out + r * row_words, b * (ccoll_u64)maxbits, (b + 1) * (ccoll_u64)maxbits);
  // the plane words in a thread-private array (local memory on the GPU: this is the reference encoder;
  // the tile encoder keeps them in shared memory)
  typename Traits<typename St::Code>::UInt planes[Dims<D>::S];
  encode_span<St, D>(src, sp, maxbits, feedback, w, PlaneStore<typename Traits<typename St::Code>::UInt>(planes, 1));
}

// ---- tiles: the warp-cooperative encoder (one warp per 32 consecutive blocks of a row) -----------------
// Tile t of row r holds blocks 32t .. 32t+31 of the row, i.e. row bits [32t*maxbits, 32(t+1)*maxbits):
// a whole number of 32-bit words, [t*maxbits, (t+1)*maxbits), that no other tile touches. Lane l codes
// block 32t+l into its own words of a per-warp buffer (LaneWriter: 32-bit words, block bit 0 at word 0
// bit 0, the block's unused tail written as zeros), then after a __syncwarp every lane assembles output
// words j = lane, lane+32, ... of the tile from those buffers and stores each whole word once: no
// atomics, no zero-initialised output, coalesced 32-bit stores. The row's last tile also writes the
// zero words up to the row's 64-bit end; lanes past the row's last block code nothing (all zero bits).

const int TILE = 32;  // blocks per tile (= lanes of a warp)

// 32-bit words a lane buffer holds for one block, and the stride between lanes' buffers (odd, so that
// the lanes' word i lie in 32 different shared-memory banks); maxbits <= 1024 gives at most 33
CCOLL_HD int lane_words(int maxbits) { return (maxbits + 31) >> 5; }
CCOLL_HD int lane_stride(int maxbits) { return lane_words(maxbits) | 1; }
const int MAX_LANE_STRIDE = 33;
const int MAX_PLANE_WORDS = 16;  // transposed plane words per block (S of dims=2)

// One block's bits into `nwords` 32-bit words, least significant bit first; finish() writes the
// pending word and zeros up to nwords (idempotent). At most 32 bits per write_bits call.
struct LaneWriter {
  ccoll_u32* words;
  int nwords;
  int widx;       // next word to store
  ccoll_u32 acc;  // its pending bits
  int fill;       // bit position of the next bit in acc

  CCOLL_HD LaneWriter(ccoll_u32* w, int n) : words(w), nwords(n), widx(0), acc(0), fill(0) {}

  CCOLL_HD ccoll_u32 write_bit(ccoll_u32 bit) {
    acc |= bit << fill;
    if (++fill == 32) { words[widx++] = acc; acc = 0; fill = 0; }
    return bit;
  }
  // the low n bits of v (0 <= n <= 32), least significant first; returns v >> n
  CCOLL_HD ccoll_u64 write_bits(ccoll_u64 v, int n) {
    if (n == 0) return v;
    write_some((ccoll_u32)v, n);
    return v >> n;
  }
  // the low n bits of v, 1 <= n <= 32
  CCOLL_HD void write_some(ccoll_u32 v, int n) {
    ccoll_u32 low = v << (32 - n) >> (32 - n);
    ccoll_u64 wide = (ccoll_u64)low << fill;  // fill < 32: no bit lost
    acc |= (ccoll_u32)wide;
    int total = fill + n;
    if (total >= 32) {
      words[widx++] = acc;
      acc = (ccoll_u32)(wide >> 32);  // the bits of low that did not fit
      total -= 32;
    }
    fill = total;
  }
  CCOLL_HD void finish() {
    if (fill) { words[widx++] = acc; acc = 0; fill = 0; }
    while (widx < nwords) words[widx++] = 0;
  }
};

CCOLL_HD ccoll_u64 tiles_per(ccoll_u64 nblk_row) { return (nblk_row + TILE - 1) / TILE; }

// The output words of tile t of a row that has ntile tiles: maxbits, and for the row's last tile the rest of the
// row's 2 * row_words (the zero padding up to the row's 64-bit end; at most maxbits + 1): a 32-bit count.
CCOLL_HD int tile_nwords(ccoll_u64 t, ccoll_u64 ntile, int maxbits, ccoll_u64 row_words) {
  return t + 1 == ntile ? (int)(2 * row_words - t * (ccoll_u64)maxbits) : maxbits;
}

// Phase 1, lane `lane` of the tile whose first value is pos (its row ends at row_end): its block into
// buf + lane * lane_stride(maxbits). planes: the warp's plane scratch, MAX_PLANE_WORDS words per lane, lane-interleaved
// (word j of lane l at planes[j * TILE + l]: the 32 lanes' word j are consecutive, no bank conflicts).
// whole (the same for every lane, whole_limit): every block of the tile has S values inside its row and the tensor,
// and no error feedback: the block is loaded straight from src + pos + lane * S (load_whole). Otherwise (a row's
// last tile, the tensor's end, error feedback, an unaligned source) the general path: Span's range checks, zeros
// past the end, zfp's padding of a partial block, lanes past the row's last block coding nothing.
template <class St, int D>
CCOLL_HD void encode_tile_lane(const typename St::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel, ccoll_u64 pos,
                               ccoll_u64 row_end, bool whole, int maxbits, typename St::Fb* feedback, int lane,
                               ccoll_u32* buf, typename Traits<typename St::Code>::UInt* planes) {
  typedef typename St::Code Code;
  const int S = Dims<D>::S;
  LaneWriter w(buf + lane * lane_stride(maxbits), lane_words(maxbits));
  PlaneStore<typename Traits<Code>::UInt> ps(planes + lane, TILE);
  Code v[S];
  if (whole) {
    load_whole<St, D>(src + pos + (ccoll_u32)(lane * S), v);
  } else {
    const ccoll_u64 in_row = pos - (row_end - row_numel) + (ccoll_u32)(lane * S);
    if (in_row >= row_numel) {  // past the row's last block: coded as zeros, i.e. all zero bits
#pragma unroll
      for (int i = 0; i < S; i++) v[i] = Code(0);
    } else {
      Span sp(numel, row_numel, pos + (ccoll_u32)(lane * S), in_row, S, true);
      if (!feedback) {
        load_block<St, D>(src, sp, v);
        if (sp.m < S) pad_block<Code, D>(v, sp.m);
      } else {
        encode_span<St, D>(src, sp, maxbits, feedback, w, ps);
        w.finish();
        return;
      }
    }
  }
  encode_values<Code, D, false>(v, maxbits, w, v, ps);
  w.finish();
}

// Whether a tile is whole for encode_tile_lane: it ends (pos + TILE * S) by whole_limit(numel, its row's start,
// whole_values(...)), i.e. inside the row's whole tiles and inside the tensor.
// whole_values: the values of a row in whole tiles (a multiple of TS = TILE * S), 0 where no tile is whole: error
// feedback, or (fp32 / fp64: 16-byte loads) src or a row not 16-byte aligned (a tile's first value
// r * row_numel + t * TS).
template <class Stor>
CCOLL_HD ccoll_u64 whole_values(const Stor* src, ccoll_u64 row_numel, const void* feedback, ccoll_u64 TS) {
  if (feedback) return 0;
  bool aligned = sizeof(Stor) < 4 || (((unsigned long long)src & 15) == 0 && ((row_numel * sizeof(Stor)) & 15) == 0);
  return aligned ? row_numel & ~(TS - 1) : 0;
}
CCOLL_HD ccoll_u64 whole_limit(ccoll_u64 numel, ccoll_u64 row_start, ccoll_u64 whole_values) {
  return row_start + whole_values < numel ? row_start + whole_values : numel;
}

// floor(p / d) as mulhi32(p, div_magic(d)) for 2 <= d and p * d < 2^32: magic = 2^32 / d + e with 0 <= e < 1, so
// p * magic / 2^32 exceeds p / d by less than p / 2^32 < 1 / d, too little to reach the next integer. The word
// assembly divides tile bit positions p < 32 * (maxbits + 1) by maxbits <= 1024 (p * maxbits < 2^26) once per
// output word; a multiply instead of a ~25-instruction integer division.
CCOLL_HD ccoll_u32 div_magic(int d) { return 0xffffffffu / (ccoll_u32)d + 1; }
CCOLL_HD ccoll_u32 mulhi32(ccoll_u32 a, ccoll_u32 b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return (ccoll_u32)(((ccoll_u64)a * b) >> 32);
#endif
}

// Phase 2, after every lane's phase 1: lane `lane` stores words lane, lane+32, ... of the tile's nwords output words
// at tile_words (tile_nwords). maxbits_magic: div_magic(maxbits).
CCOLL_HD void assemble_tile_lane(const ccoll_u32* buf, int maxbits, ccoll_u32 maxbits_magic, int nwords, int lane,
                                 ccoll_u32* tile_words) {
  const int stride = lane_stride(maxbits);
  if ((maxbits & 31) == 0) {  // blocks of whole words (rate 8, 16, ... in dims=1): each word one lane-buffer word
    const int block_words = maxbits >> 5;
#pragma unroll 1
    for (int j = lane; j < nwords; j += TILE) {
      int blk = (int)mulhi32((ccoll_u32)j * 32, maxbits_magic);
      tile_words[j] = blk < TILE ? buf[blk * stride + (j - blk * block_words)] : 0u;
    }
    return;
  }
  for (int j = lane; j < nwords; j += TILE) {
    ccoll_u32 p = (ccoll_u32)j * 32;  // tile bit of the word's bit 0 (< 32 * (maxbits + 1))
    int blk = (int)mulhi32(p, maxbits_magic), off = (int)p - blk * maxbits;
    ccoll_u32 word = 0;
    for (int got = 0; got < 32 && blk < TILE; ++blk, off = 0) {  // the (up to 5) blocks the word meets
      int take = 32 - got < maxbits - off ? 32 - got : maxbits - off;
      const ccoll_u32* lb = buf + blk * stride;
      int wi = off >> 5, sh = off & 31;
      ccoll_u32 bits = lb[wi] >> sh;
      if (sh + take > 32) bits |= lb[wi + 1] << (32 - sh);
      if (take < 32) bits &= (1u << take) - 1;
      word |= bits << got;
      got += take;
    }
    tile_words[j] = word;
  }
}

template <class St, int D>
CCOLL_HD void decode_row_block(const ccoll_u64* in, ccoll_u64 row_words, ccoll_u64 numel, ccoll_u64 row_numel,
                               ccoll_u64 g, ccoll_u64 nblk_row, int maxbits, typename St::Stor* out) {
  const int S = Dims<D>::S;
  ccoll_u64 r = g / nblk_row, b = g - r * nblk_row;
  Span sp(numel, row_numel, r, b, S);
  if (sp.valid <= 0) return;
  typename St::Code v[S];
  decode_block<typename St::Code, D>(in + r * row_words, b * (ccoll_u64)maxbits, maxbits, v);
  store_block<St, D>(v, sp, out);
}

// Reduce step of all_reduce: out[block b] = sum over rows r = 0..rows-1 (in order, from +0) of
// decode(row r) rounded to the tensor's dtype, in fp32; a NaN sum is the canonical quiet NaN.
template <class St, int D>
CCOLL_HD void decode_sum_block(const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 n, ccoll_u64 b,
                               int maxbits, float* out) {
  const int S = Dims<D>::S;
  typedef typename St::Code Code;
  float acc[S];
  Code v[S];
#pragma unroll
  for (int i = 0; i < S; i++) acc[i] = 0.0f;
  for (int r = 0; r < rows; r++) {
    decode_block<Code, D>(in + (ccoll_u64)r * row_words, b * (ccoll_u64)maxbits, maxbits, v);
#pragma unroll
    for (int i = 0; i < S; i++) acc[i] = add_rn(acc[i], to_f32(round_to<St>(v[i])));
  }
  // which NaN an addition returns differs between x86 and the GPU: every NaN sum is the canonical one
#pragma unroll
  for (int i = 0; i < S; i++)
    if ((Traits<float>::bits(acc[i]) & 0x7fffffffu) > 0x7f800000u) acc[i] = Traits<float>::from_bits(0x7fc00000u);
  Span sp(n, n, 0, b, S);
  store_block<StF32, D>(acc, sp, out);
}

}  // namespace ccoll_zfp

// ---- CUDA entry points: one thread per block (grid-stride over every block of every row) --------------
// Entry names are spelled out in full below (ccoll/codecs/zfp.py CUDA_KERNELS lists them; the host twins
// are ccoll_host_zfp_<op>_<dtype> with the same arguments).
// encode_rows output must be zero-initialised: the boundary words of each block are OR-ed in.

#define CCOLL_ZFP_FOR_BLOCKS(nblk)                                                                              \
  for (ccoll_u64 g = (ccoll_u64)blockIdx.x * blockDim.x + threadIdx.x; g < (nblk);                              \
       g += (ccoll_u64)gridDim.x * blockDim.x)

#define CCOLL_ZFP_DIMS(...)                                                                                     \
  if (dims == 2) { const int D = 2; __VA_ARGS__; } else { const int D = 1; __VA_ARGS__; }

// One definition of the entry points for both builds: QUAL is the CUDA kernel qualifier or nothing, FOR
// the loop over blocks (grid-stride on the GPU, OpenMP on the host).
#define CCOLL_ZFP_ENTRIES(QUAL, FOR, ENCODE_ROWS, DECODE_ROWS, DECODE_SUM, ST)                                  \
  extern "C" QUAL void ENCODE_ROWS(                                                                             \
      const ST::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel, int rows, int dims, int maxbits,               \
      ccoll_u64 row_words, ST::Fb* feedback, ccoll_u64* out) {                                                  \
    ccoll_u64 per = ccoll_zfp::blocks_per(row_numel, dims);                                                     \
    CCOLL_ZFP_DIMS(FOR(per * rows) ccoll_zfp::encode_row_block<ST, D>(                                          \
        src, numel, row_numel, (ccoll_u64)g, per, maxbits, row_words, feedback, out))                           \
  }                                                                                                             \
  extern "C" QUAL void DECODE_ROWS(                                                                             \
      const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 numel, ccoll_u64 row_numel, int dims,       \
      int maxbits, ST::Stor* out) {                                                                             \
    ccoll_u64 per = ccoll_zfp::blocks_per(row_numel, dims);                                                     \
    CCOLL_ZFP_DIMS(FOR(per * rows) ccoll_zfp::decode_row_block<ST, D>(                                          \
        in, row_words, numel, row_numel, (ccoll_u64)g, per, maxbits, out))                                      \
  }                                                                                                             \
  extern "C" QUAL void DECODE_SUM(const ccoll_u64* in, ccoll_u64 row_words, int rows, ccoll_u64 numel,          \
                                  int dims, int maxbits, float* out) {                                          \
    CCOLL_ZFP_DIMS(FOR(ccoll_zfp::blocks_per(numel, dims))                                                      \
                   ccoll_zfp::decode_sum_block<ST, D>(in, row_words, rows, numel, (ccoll_u64)g, maxbits, out))  \
  }

#define CCOLL_ZFP_CUDA_ENTRIES(ENCODE_ROWS, DECODE_ROWS, DECODE_SUM, ST)                                        \
  CCOLL_ZFP_ENTRIES(__global__, CCOLL_ZFP_FOR_BLOCKS, ENCODE_ROWS, DECODE_ROWS, DECODE_SUM, ST)

CCOLL_ZFP_CUDA_ENTRIES(ccoll_zfp_encode_rows_f32, ccoll_zfp_decode_rows_f32, ccoll_zfp_decode_sum_f32,
                       ccoll_zfp::StF32)
CCOLL_ZFP_CUDA_ENTRIES(ccoll_zfp_encode_rows_bf16, ccoll_zfp_decode_rows_bf16, ccoll_zfp_decode_sum_bf16,
                       ccoll_zfp::StBF16)
CCOLL_ZFP_CUDA_ENTRIES(ccoll_zfp_encode_rows_f16, ccoll_zfp_decode_rows_f16, ccoll_zfp_decode_sum_f16,
                       ccoll_zfp::StF16)
CCOLL_ZFP_CUDA_ENTRIES(ccoll_zfp_encode_rows_f64, ccoll_zfp_decode_rows_f64, ccoll_zfp_decode_sum_f64,
                       ccoll_zfp::StF64)

// ---- the tile encoder: one warp per run of consecutive tiles of 32 blocks (over every tile of every row) ----
// ccoll_zfp_encode_tiles_<dtype>: encode_rows' arguments and bytes; blockDim.x must be
// CCOLL_ZFP_TILE_THREADS (ccoll/kernels/call.py launches the zfp family with 128 threads); the output
// needs no initialisation.

#define CCOLL_ZFP_TILE_THREADS 128

namespace ccoll_zfp {
// Tiles per warp: each warp codes a run of K consecutive tiles, K the smallest power of two with warps * K >= the
// tiles of all rows (the launch, ccoll/codecs/zfp.py tiles_per_warp, gives K = 1 for small inputs, up to 8 for
// large ones; any grid is coded correctly). Found by doubling, not a division (a test and no iteration for
// K = 1, one iteration per doubling); consecutive tiles step their place by additions (encode_tiles_run), so the
// only division, tile / ntile, is paid once per warp, not once per tile as a grid-stride loop would.
CCOLL_HD int tiles_per_warp_log2(ccoll_u64 warps, ccoll_u64 total) {
  int shift = 0;
  while ((warps << shift) < total) ++shift;  // ends without overflow: warps >= 1, total < 2^63 for any tensor
  return shift;
}

// A warp's run of tiles: the first tile's place (row r, tile t, its first value pos, its first output word) from the
// one division, then each next tile's by adding its size (pos by TILE * S values, the output by the tile's words;
// at a row's end both move on to the next row's start), so the per-tile set-up is a few additions.
template <class St, int D>
__device__ __forceinline__ void encode_tiles_run(const typename St::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel,
                                                 int rows, int maxbits, ccoll_u64 row_words, typename St::Fb* feedback,
                                                 ccoll_u32* out, ccoll_u32* buf,
                                                 typename Traits<typename St::Code>::UInt* planes) {
  const int lane = (int)(threadIdx.x & 31);
  const int WARPS_PER_CTA = CCOLL_ZFP_TILE_THREADS / 32;  // blockDim.x, checked by the kernel
  const ccoll_u64 TS = TILE * Dims<D>::S;  // values per tile
  const ccoll_u64 nblk = blocks_per(row_numel, D), ntile = tiles_per(nblk), total = ntile * rows;
  const ccoll_u64 warps = (ccoll_u64)gridDim.x * WARPS_PER_CTA;
  const int shift = tiles_per_warp_log2(warps, total);
  const ccoll_u32 maxbits_magic = div_magic(maxbits);
  const ccoll_u64 first = ((ccoll_u64)blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5)) << shift;
  if (first >= total) return;  // the same for the 32 lanes of a warp: every lane runs every tile (full-warp syncs)
  const ccoll_u64 run = total - first < (1ull << shift) ? total - first : 1ull << shift;  // tiles of the run
  const ccoll_u64 wvals = whole_values(src, row_numel, feedback, TS);
  const int last_words = tile_nwords(ntile - 1, ntile, maxbits, row_words);
  const ccoll_u64 r = first / ntile, t = first - r * ntile;
  ccoll_u64 pos = r * row_numel + t * TS;  // the tile's first value
  ccoll_u64 row_end = pos - t * TS + row_numel;  // its row's end
  ccoll_u64 lim = whole_limit(numel, row_end - row_numel, wvals);  // a tile that ends by lim is whole
  ccoll_u32* tile_words = out + r * 2 * row_words + t * (ccoll_u64)maxbits;
  for (ccoll_u64 left = run; left != 0; --left) {
    const ccoll_u64 next = pos + TS;
    encode_tile_lane<St, D>(src, numel, row_numel, pos, row_end, next <= lim, maxbits, feedback, lane, buf, planes);
    const bool last_in_row = next >= row_end;
    const int nwords = last_in_row ? last_words : maxbits;
    __syncwarp();
    assemble_tile_lane(buf, maxbits, maxbits_magic, nwords, lane, tile_words);
    __syncwarp();  // the buffer is rewritten by the next tile
    tile_words += nwords;
    pos = next;
    if (last_in_row) {
      pos = row_end;
      row_end += row_numel;
      lim = whole_limit(numel, pos, wvals);
    }
  }
}

template <class St>
__device__ __forceinline__ void encode_tiles_warp(const typename St::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel,
                                                  int rows, int dims, int maxbits, ccoll_u64 row_words,
                                                  typename St::Fb* feedback, ccoll_u32* out, ccoll_u32* buf,
                                                  typename Traits<typename St::Code>::UInt* planes) {
  if (dims == 2)
    encode_tiles_run<St, 2>(src, numel, row_numel, rows, maxbits, row_words, feedback, out, buf, planes);
  else
    encode_tiles_run<St, 1>(src, numel, row_numel, rows, maxbits, row_words, feedback, out, buf, planes);
}
}  // namespace ccoll_zfp

// MINB: CTAs per SM the register cap is sized for (65536 / (128 * MINB) registers per thread)
#define CCOLL_ZFP_TILE_KERNEL(NAME, ST, MINB)                                                                   \
  extern "C" __global__ void __launch_bounds__(CCOLL_ZFP_TILE_THREADS, MINB) NAME(                              \
      const ST::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel, int rows, int dims, int maxbits,               \
      ccoll_u64 row_words, ST::Fb* feedback, ccoll_u64* out) {                                                  \
    __shared__ ccoll_u32 buf[CCOLL_ZFP_TILE_THREADS / 32][ccoll_zfp::TILE * ccoll_zfp::MAX_LANE_STRIDE];        \
    __shared__ ccoll_zfp::Traits<ST::Code>::UInt                                                                \
        planes[CCOLL_ZFP_TILE_THREADS / 32][ccoll_zfp::TILE * ccoll_zfp::MAX_PLANE_WORDS];                      \
    if (blockDim.x != CCOLL_ZFP_TILE_THREADS) __trap();                                                         \
    ccoll_zfp::encode_tiles_warp<ST>(src, numel, row_numel, rows, dims, maxbits, row_words, feedback,          \
                                     reinterpret_cast<ccoll_u32*>(out), buf[threadIdx.x >> 5],                  \
                                     planes[threadIdx.x >> 5]);                                                 \
  }

CCOLL_ZFP_TILE_KERNEL(ccoll_zfp_encode_tiles_f32, ccoll_zfp::StF32, 8)
CCOLL_ZFP_TILE_KERNEL(ccoll_zfp_encode_tiles_bf16, ccoll_zfp::StBF16, 8)
CCOLL_ZFP_TILE_KERNEL(ccoll_zfp_encode_tiles_f16, ccoll_zfp::StF16, 8)
CCOLL_ZFP_TILE_KERNEL(ccoll_zfp_encode_tiles_f64, ccoll_zfp::StF64, 5)

// ---- host entry points (emulated backend): the same per-block functions, OpenMP over blocks ----------
#ifdef CCOLL_HOST

// the tile encoder's host twin: OpenMP over tiles, the 32 lanes of each tile run one after another
// (phase 1 for every lane, then phase 2), so the host build checks the tile layout against libzfp too
#define CCOLL_ZFP_HOST_TILES(NAME, ST)                                                                          \
  extern "C" void NAME(const ST::Stor* src, ccoll_u64 numel, ccoll_u64 row_numel, int rows, int dims,          \
                       int maxbits, ccoll_u64 row_words, ST::Fb* feedback, ccoll_u64* out) {                    \
    const ccoll_u64 nblk = ccoll_zfp::blocks_per(row_numel, dims), ntile = ccoll_zfp::tiles_per(nblk);         \
    _Pragma("omp parallel for schedule(static)")                                                                \
    for (ccoll_i64 tile = 0; tile < (ccoll_i64)(ntile * rows); tile++) {                                        \
      ccoll_u32 buf[ccoll_zfp::TILE * ccoll_zfp::MAX_LANE_STRIDE];                                              \
      ccoll_zfp::Traits<ST::Code>::UInt planes[ccoll_zfp::TILE * ccoll_zfp::MAX_PLANE_WORDS];                   \
      const ccoll_u64 r = (ccoll_u64)tile / ntile, t = (ccoll_u64)tile - r * ntile;                            \
      const ccoll_u64 TS = ccoll_zfp::TILE * (dims == 2 ? 16 : 4), pos = r * row_numel + t * TS;              \
      const bool whole = pos + TS <= ccoll_zfp::whole_limit(numel, r * row_numel,                               \
                                                            ccoll_zfp::whole_values(src, row_numel, feedback, TS)); \
      for (int lane = 0; lane < ccoll_zfp::TILE; lane++) {                                                      \
        if (dims == 2)                                                                                          \
          ccoll_zfp::encode_tile_lane<ST, 2>(src, numel, row_numel, pos, (r + 1) * row_numel, whole, maxbits,   \
                                              feedback, lane, buf, planes);                                     \
        else                                                                                                    \
          ccoll_zfp::encode_tile_lane<ST, 1>(src, numel, row_numel, pos, (r + 1) * row_numel, whole, maxbits,   \
                                              feedback, lane, buf, planes);                                     \
      }                                                                                                         \
      const int nwords = ccoll_zfp::tile_nwords(t, ntile, maxbits, row_words);                                  \
      ccoll_u32* tile_words = reinterpret_cast<ccoll_u32*>(out) + r * 2 * row_words + t * (ccoll_u64)maxbits;   \
      for (int lane = 0; lane < ccoll_zfp::TILE; lane++)                                                        \
        ccoll_zfp::assemble_tile_lane(buf, maxbits, ccoll_zfp::div_magic(maxbits), nwords, lane, tile_words);   \
    }                                                                                                           \
  }

CCOLL_ZFP_HOST_TILES(ccoll_host_zfp_encode_tiles_f32, ccoll_zfp::StF32)
CCOLL_ZFP_HOST_TILES(ccoll_host_zfp_encode_tiles_bf16, ccoll_zfp::StBF16)
CCOLL_ZFP_HOST_TILES(ccoll_host_zfp_encode_tiles_f16, ccoll_zfp::StF16)
CCOLL_ZFP_HOST_TILES(ccoll_host_zfp_encode_tiles_f64, ccoll_zfp::StF64)

#define CCOLL_ZFP_HOST_FOR_BLOCKS(nblk)                                                                         \
  _Pragma("omp parallel for schedule(static)")                                                                  \
  for (ccoll_i64 g = 0; g < (ccoll_i64)(nblk); g++)

#define CCOLL_ZFP_HOST_ENTRIES(ENCODE_ROWS, DECODE_ROWS, DECODE_SUM, ST)                                        \
  CCOLL_ZFP_ENTRIES(, CCOLL_ZFP_HOST_FOR_BLOCKS, ENCODE_ROWS, DECODE_ROWS, DECODE_SUM, ST)

CCOLL_ZFP_HOST_ENTRIES(ccoll_host_zfp_encode_rows_f32, ccoll_host_zfp_decode_rows_f32, ccoll_host_zfp_decode_sum_f32,
                       ccoll_zfp::StF32)
CCOLL_ZFP_HOST_ENTRIES(ccoll_host_zfp_encode_rows_bf16, ccoll_host_zfp_decode_rows_bf16, ccoll_host_zfp_decode_sum_bf16,
                       ccoll_zfp::StBF16)
CCOLL_ZFP_HOST_ENTRIES(ccoll_host_zfp_encode_rows_f16, ccoll_host_zfp_decode_rows_f16, ccoll_host_zfp_decode_sum_f16,
                       ccoll_zfp::StF16)
CCOLL_ZFP_HOST_ENTRIES(ccoll_host_zfp_encode_rows_f64, ccoll_host_zfp_decode_rows_f64, ccoll_host_zfp_decode_sum_f64,
                       ccoll_zfp::StF64)

#endif  // CCOLL_HOST
