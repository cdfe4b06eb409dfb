/* Lossless kernels for the "lossless" codec (ccoll/codecs/lossless.py): exact, bit for bit, for bf16, fp16
and fp32 (every bit pattern: NaN payloads, -0, subnormals, Inf).

Algorithm (written once, templated on the value type: W value bits, E exponent bits, R = W - E):
  u = the value's bits; v = rotl(u, 1) = [exponent E bits | mantissa | sign] (the sign moves to bit 0 so
  the top E bits are exactly the exponent field); e = v >> R (the exponent), r = v & (2^R - 1) (mantissa and
  sign). Per block of B values (B a multiple of 32): base = min e, width = bit length of (max e - base)
  (0..E); each e is stored as e - base in `width` bits, each r raw in R bits. Exponents of real tensors
  span a few binades per block, so `width` is 3..6 instead of 8: bf16 16 -> ~12.5 bits, fp32 32 -> ~28.5.
  A row whose coded size is not smaller than its raw size is stored raw (mode 1): the payload never
  exceeds raw + 16 bytes (the capacity, Codec.encoded_nbytes).

Bit packing: a group of 32 consecutive values of width k bits is exactly k 32-bit words (value j at bits
[j*k, (j+1)*k) of the group's little-endian bit stream), so one GPU thread owns whole words: no atomics.

Row payload layout (little-endian u32 words; n = row_numel, G = ceil(n / 32), nb = ceil(n / B)):
  header  16 bytes: [used_nbytes, mode (0 coded, 1 raw), n, B]
  mode 1: the n raw values at byte 16, zero-padded to a multiple of 16 (used = 16 + pad16(n * W / 8)).
  mode 0: desc  pad16(4 nb) bytes: block b's base | width << 8
          offs  pad16(4 nb) bytes: block b's first word in the exp section (exclusive prefix sum of the
                blocks' exp words ngroups_b * width_b: the scan that lets a GPU decode in one pass)
          rem   pad16(4 G R) bytes: group g's R words at word g * R
          exp   pad16(4 * total exp words) bytes: group g of block b at word offs[b] + (g - b B/32) width_b
          used = 16 + 2 pad16(4 nb) + pad16(4 G R) + pad16(4 exp words).
  Values past n in the last group pack as e = base, r = 0. Bytes of a row past `used` are zero.

Passes (each `__global__` maps one thread to one (row, group of 32 values); the per-group functions are
shared with the host build):
  range  : per group, min and max exponent of its values -> ranges[row * G + g] = min | max << 16.
  (glue, torch ops on the device: per-block base/width, prefix sums, mode, header/desc/offs words)
  pack   : per group, its rem words and exp words (mode 0) or its raw values (mode 1).
  decode : per group, the values back (rows and groups past `numel` of the output are skipped).
Host (-DCCOLL_HOST, the "emulated" backend): extern "C" ccoll_host_lossless_* loop over the same groups with
OpenMP and call the same functions.
*/
#ifndef __CUDACC_RTC__
#include <cstring>
#endif

typedef unsigned char ll_u8;
typedef unsigned short ll_u16;
typedef unsigned int ll_u32;
typedef long long ll_i64;
typedef unsigned long long ll_u64;

#define LL_HD __host__ __device__ __forceinline__

// value traits: W value bits, E exponent bits; storage is the unsigned integer of W bits
struct LlBF16 { typedef ll_u16 storage; static constexpr int W = 16, E = 8; };
struct LlF16  { typedef ll_u16 storage; static constexpr int W = 16, E = 5; };
struct LlF32  { typedef ll_u32 storage; static constexpr int W = 32, E = 8; };

LL_HD ll_i64 ll_pad16(ll_i64 n) { return (n + 15) / 16 * 16; }

// byte offsets of the sections of a coded row
struct LlLayout {
    ll_i64 groups, blocks, desc, offs, rem, exp;
    LL_HD LlLayout(ll_i64 row_numel, ll_i64 block, int R) {
        groups = (row_numel + 31) / 32;
        blocks = (row_numel + block - 1) / block;
        desc = 16;
        offs = desc + ll_pad16(4 * blocks);
        rem = offs + ll_pad16(4 * blocks);
        exp = rem + ll_pad16(4 * groups * R);
    }
};

template <class Tr>
LL_HD ll_u32 ll_rotl(ll_u32 u) {
    const ll_u32 mask = Tr::W == 32 ? 0xffffffffu : (1u << Tr::W) - 1u;
    return ((u << 1) | (u >> (Tr::W - 1))) & mask;
}

template <class Tr>
LL_HD ll_u32 ll_rotr(ll_u32 v) {
    return (v >> 1) | ((v & 1u) << (Tr::W - 1));
}

// 32 values of k bits (k <= 24) -> k words
LL_HD void ll_pack32(const ll_u32* vals, int k, ll_u32* words) {
    ll_u64 acc = 0;
    int nacc = 0, w = 0;
    for (int j = 0; j < 32; ++j) {
        acc |= (ll_u64)vals[j] << nacc;
        nacc += k;
        if (nacc >= 32) {
            words[w++] = (ll_u32)acc;
            acc >>= 32;
            nacc -= 32;
        }
    }
}

// k words -> 32 values of k bits
LL_HD void ll_unpack32(const ll_u32* words, int k, ll_u32* vals) {
    const ll_u64 mask = (1ull << k) - 1ull;
    ll_u64 acc = 0;
    int nacc = 0, w = 0;
    for (int j = 0; j < 32; ++j) {
        if (nacc < k) {
            acc |= (ll_u64)words[w++] << nacc;
            nacc += 32;
        }
        vals[j] = (ll_u32)(acc & mask);
        acc >>= k;
        nacc -= k;
    }
}

// the W-bit pattern of flat element i of src (zero past numel: the rows API pads with zeros)
template <class Tr>
LL_HD ll_u32 ll_load(const typename Tr::storage* src, ll_i64 numel, ll_i64 i) {
    return i < numel ? (ll_u32)src[i] : 0u;
}

// the descriptor of the block holding group g of one payload row: its exponent base and width, and the
// first 32-bit word of group g's packed exponents in the exp section (shared by pack and decode)
struct LlBlock {
    ll_u32 base, width;
    ll_i64 exp_word;
    LL_HD LlBlock(const ll_u8* p, const LlLayout& L, ll_i64 g, ll_i64 block) {
        const ll_i64 b = g * 32 / block;
        const ll_u32 desc = reinterpret_cast<const ll_u32*>(p + L.desc)[b];
        base = desc & 0xffu;
        width = (desc >> 8) & 0xffu;
        exp_word = reinterpret_cast<const ll_u32*>(p + L.offs)[b] + (g - b * (block / 32)) * (ll_i64)width;
    }
};

// pass 1: min | max << 16 of the exponents of group g of row `row`
template <class Tr>
LL_HD void ll_range_group(const typename Tr::storage* src, ll_i64 numel, ll_i64 row_numel, ll_i64 row, ll_i64 g,
                          ll_u32* ranges, ll_i64 groups) {
    constexpr int R = Tr::W - Tr::E;
    ll_u32 lo = 0xffffu, hi = 0;
    const ll_i64 first = row * row_numel + g * 32;
    const ll_i64 count = row_numel - g * 32 < 32 ? row_numel - g * 32 : 32;
    for (ll_i64 j = 0; j < count; ++j) {
        const ll_u32 e = ll_rotl<Tr>(ll_load<Tr>(src, numel, first + j)) >> R;
        lo = e < lo ? e : lo;
        hi = e > hi ? e : hi;
    }
    ranges[row * groups + g] = lo | hi << 16;
}

// pass 2: group g of row `row` into its payload row (header, desc and offs already written by the glue)
template <class Tr>
LL_HD void ll_pack_group(const typename Tr::storage* src, ll_i64 numel, ll_i64 row_numel, ll_i64 block,
                         ll_i64 row_nbytes, ll_i64 row, ll_i64 g, ll_u8* out) {
    constexpr int R = Tr::W - Tr::E;
    const LlLayout L(row_numel, block, R);
    ll_u8* p = out + row * row_nbytes;
    const ll_u32* hdr = reinterpret_cast<const ll_u32*>(p);
    const ll_i64 first = row * row_numel + g * 32;
    const int count = (int)(row_numel - g * 32 < 32 ? row_numel - g * 32 : 32);
    if (hdr[1] == 1u) {  // raw row
        typename Tr::storage* raw = reinterpret_cast<typename Tr::storage*>(p + 16);
        for (int j = 0; j < count; ++j) raw[g * 32 + j] = (typename Tr::storage)ll_load<Tr>(src, numel, first + j);
        return;
    }
    const LlBlock B(p, L, g, block);
    ll_u32 e[32], r[32];
    for (int j = 0; j < 32; ++j) {
        const ll_u32 v = j < count ? ll_rotl<Tr>(ll_load<Tr>(src, numel, first + j)) : B.base << R;
        e[j] = (v >> R) - B.base;
        r[j] = v & ((1u << R) - 1u);
    }
    ll_pack32(r, R, reinterpret_cast<ll_u32*>(p + L.rem) + g * R);
    if (B.width) ll_pack32(e, (int)B.width, reinterpret_cast<ll_u32*>(p + L.exp) + B.exp_word);
}

// decode group g of payload row `row` into y (flat index row * row_numel + j, clipped at numel)
template <class Tr>
LL_HD void ll_decode_group(const ll_u8* payloads, ll_i64 row_nbytes, ll_i64 row_numel, ll_i64 numel, ll_i64 block,
                           ll_i64 row, ll_i64 g, typename Tr::storage* y) {
    constexpr int R = Tr::W - Tr::E;
    const ll_i64 first = row * row_numel + g * 32;
    ll_i64 count = row_numel - g * 32 < 32 ? row_numel - g * 32 : 32;
    if (numel - first < count) count = numel - first;
    if (count <= 0) return;
    const LlLayout L(row_numel, block, R);
    const ll_u8* p = payloads + row * row_nbytes;
    const ll_u32* hdr = reinterpret_cast<const ll_u32*>(p);
    if (hdr[1] == 1u) {
        const typename Tr::storage* raw = reinterpret_cast<const typename Tr::storage*>(p + 16);
        for (ll_i64 j = 0; j < count; ++j) y[first + j] = raw[g * 32 + j];
        return;
    }
    const LlBlock B(p, L, g, block);
    ll_u32 e[32], r[32];
    ll_unpack32(reinterpret_cast<const ll_u32*>(p + L.rem) + g * R, R, r);
    if (B.width) ll_unpack32(reinterpret_cast<const ll_u32*>(p + L.exp) + B.exp_word, (int)B.width, e);
    const ll_u32 emask = (1u << Tr::E) - 1u;
    for (ll_i64 j = 0; j < count; ++j) {
        const ll_u32 ex = ((B.width ? e[j] : 0u) + B.base) & emask;
        y[first + j] = (typename Tr::storage)ll_rotr<Tr>(ex << R | r[j]);
    }
}

// ------------------------------------------------------------------------------------------------
// GPU kernels: one thread per (row, group), grid-stride

#define LL_FOR_GROUPS(N)                                                                             \
    for (ll_i64 t = (ll_i64)blockIdx.x * blockDim.x + threadIdx.x; t < (N); t += (ll_i64)gridDim.x * blockDim.x)

// extern "C" entry points: ccoll_lossless_{range,pack,decode}_{bf16,f16,f32}
// (ccoll/codecs/lossless.py CUDA_KERNELS lists them)
#define LL_GLOBALS(NAME, TR)                                                                          \
    extern "C" __global__ void ccoll_lossless_range_##NAME(const TR::storage* src, ll_i64 numel,      \
                                                           ll_i64 rows, ll_i64 row_numel, ll_u32* ranges) { \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        LL_FOR_GROUPS(rows * groups) ll_range_group<TR>(src, numel, row_numel, t / groups, t % groups, ranges, groups); \
    }                                                                                                 \
    extern "C" __global__ void ccoll_lossless_pack_##NAME(const TR::storage* src, ll_i64 numel,       \
                                                          ll_i64 rows, ll_i64 row_numel, ll_i64 block, \
                                                          ll_i64 row_nbytes, ll_u8* out) {            \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        LL_FOR_GROUPS(rows * groups)                                                                  \
            ll_pack_group<TR>(src, numel, row_numel, block, row_nbytes, t / groups, t % groups, out); \
    }                                                                                                 \
    extern "C" __global__ void ccoll_lossless_decode_##NAME(const ll_u8* payloads, ll_i64 rows,       \
                                                            ll_i64 row_nbytes, ll_i64 row_numel,      \
                                                            ll_i64 numel, ll_i64 block, TR::storage* y) { \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        LL_FOR_GROUPS(rows * groups)                                                                  \
            ll_decode_group<TR>(payloads, row_nbytes, row_numel, numel, block, t / groups, t % groups, y); \
    }

LL_GLOBALS(bf16, LlBF16)
LL_GLOBALS(f16, LlF16)
LL_GLOBALS(f32, LlF32)

// ------------------------------------------------------------------------------------------------
// host build: the "emulated" backend (OpenMP over the same groups)

#ifdef CCOLL_HOST
#define LL_HOST(NAME, TR)                                                                             \
    extern "C" void ccoll_host_lossless_range_##NAME(const void* src, ll_i64 numel, ll_i64 rows,      \
                                                     ll_i64 row_numel, void* ranges) {                \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (ll_i64 t = 0; t < rows * groups; ++t)                                                    \
            ll_range_group<TR>(static_cast<const TR::storage*>(src), numel, row_numel, t / groups,    \
                               t % groups, static_cast<ll_u32*>(ranges), groups);                     \
    }                                                                                                 \
    extern "C" void ccoll_host_lossless_pack_##NAME(const void* src, ll_i64 numel, ll_i64 rows,       \
                                                    ll_i64 row_numel, ll_i64 block, ll_i64 row_nbytes, \
                                                    void* out) {                                      \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (ll_i64 t = 0; t < rows * groups; ++t)                                                    \
            ll_pack_group<TR>(static_cast<const TR::storage*>(src), numel, row_numel, block,          \
                              row_nbytes, t / groups, t % groups, static_cast<ll_u8*>(out));          \
    }                                                                                                 \
    extern "C" void ccoll_host_lossless_decode_##NAME(const void* payloads, ll_i64 rows,              \
                                                      ll_i64 row_nbytes, ll_i64 row_numel,            \
                                                      ll_i64 numel, ll_i64 block, void* y) {          \
        const ll_i64 groups = (row_numel + 31) / 32;                                                  \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (ll_i64 t = 0; t < rows * groups; ++t)                                                    \
            ll_decode_group<TR>(static_cast<const ll_u8*>(payloads), row_nbytes, row_numel, numel,    \
                                block, t / groups, t % groups, static_cast<TR::storage*>(y));         \
    }

LL_HOST(bf16, LlBF16)
LL_HOST(f16, LlF16)
LL_HOST(f32, LlF32)
#endif  // CCOLL_HOST
