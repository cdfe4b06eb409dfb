/* ptx_model.h -- the device-only code of kernels/*.cu (the `#ifdef __CUDA_ARCH__` twins: inline PTX and CUDA
intrinsics) executed on the CPU, for tests/unit/test_device_twins.py.

Why: the simt and host builds compile the host twin of every such branch, so a device branch that differs
from its host twin (a PTX rounding mode changed, .ftz added, an intrinsic's off-by-one) passed every CPU
test. The test extracts each device branch from the sources, rewrites each `asm("...")` statement into a call
of `ccoll_ptx::exec` with the instruction's text, and compiles it after this header, which gives:

  * ccoll_ptx::exec(template, operands...): parses the PTX instruction at run time (mnemonic, %N operands,
    0f / 0d immediates) and runs what the PTX ISA specifies for it, with the rounding mode the mnemonic names
    (.rn .rz .rm .rp; .rni .rzi .rmi .rpi) set in the CPU's floating-point environment (SSE honours it, as does
    libgcc's _Float16 conversion), .ftz flushing subnormal operands and results to signed zero, cvt to s32
    saturating with NaN -> 0, min / max returning the non-NaN operand. An instruction it does not know aborts
    the probe with its text (the test fails: a new instruction needs a model here, or a GPU check case).
  * CUDA's integer and bit-cast intrinsics (__ffs, __clz, __popc, __brev, __umulhi, __byte_perm,
    __float_as_uint, ...), written from the CUDA Math API's definitions, bit by bit, not from the host twins.

Nothing here is shipped; only the test compiles it (with the simt shim, g++).
*/
#pragma once

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ccoll_ptx {

enum Kind { F32, F64, B32, B16, B64 };

struct Reg {
  Kind kind;
  uint64_t bits;
  void* out;  // non-null: an output operand ("=f"(x) ...)
};

inline Reg in(float v) { uint32_t u; memcpy(&u, &v, 4); return {F32, u, nullptr}; }
inline Reg in(double v) { uint64_t u; memcpy(&u, &v, 8); return {F64, u, nullptr}; }
inline Reg in(int v) { return {B32, (uint32_t)v, nullptr}; }
inline Reg in(unsigned v) { return {B32, v, nullptr}; }
inline Reg in(unsigned short v) { return {B16, v, nullptr}; }
inline Reg in(unsigned long long v) { return {B64, v, nullptr}; }
inline Reg in(long long v) { return {B64, (uint64_t)v, nullptr}; }
inline Reg out(float& v) { return {F32, 0, &v}; }
inline Reg out(double& v) { return {F64, 0, &v}; }
inline Reg out(int& v) { return {B32, 0, &v}; }
inline Reg out(unsigned& v) { return {B32, 0, &v}; }
inline Reg out(unsigned short& v) { return {B16, 0, &v}; }
inline Reg out(unsigned long long& v) { return {B64, 0, &v}; }

[[noreturn]] inline void unsupported(const char* tmpl, const char* why) {
  fprintf(stderr, "ptx_model: no CPU model for `%s` (%s)\n", tmpl, why);
  fflush(stderr);
  abort();
}

inline float f32(uint64_t b) { uint32_t u = (uint32_t)b; float f; memcpy(&f, &u, 4); return f; }
inline uint32_t bits32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// .ftz: a subnormal fp32 operand or result is +-0
inline float ftz(float f, bool on) {
  if (on && f != 0.0f && std::fabs(f) < 1.17549435e-38f) return f < 0 ? -0.0f : 0.0f;
  return f;
}

inline int fe_mode(const char* r) {  // "rn" "rz" "rm" "rp" (and the integer forms "rni" ...): fenv mode
  if (r[1] == 'n') return FE_TONEAREST;
  if (r[1] == 'z') return FE_TOWARDZERO;
  if (r[1] == 'm') return FE_DOWNWARD;
  return FE_UPWARD;
}

struct Insn {
  char op[16] = {0};
  char rnd[8] = {0};
  bool ftz = false, sat = false, nan = false;
  char types[2][8] = {{0}, {0}};
  int ntypes = 0;
};

inline Insn parse_mnemonic(const char* tmpl, const char* end) {
  Insn in;
  char buf[64];
  size_t n = (size_t)(end - tmpl);
  if (n >= sizeof buf) unsupported(tmpl, "mnemonic too long");
  memcpy(buf, tmpl, n);
  buf[n] = 0;
  char* save = nullptr;
  char* part = strtok_r(buf, ".", &save);
  snprintf(in.op, sizeof in.op, "%s", part);
  while ((part = strtok_r(nullptr, ".", &save))) {
    if (!strcmp(part, "rn") || !strcmp(part, "rz") || !strcmp(part, "rm") || !strcmp(part, "rp") ||
        !strcmp(part, "rni") || !strcmp(part, "rzi") || !strcmp(part, "rmi") || !strcmp(part, "rpi"))
      snprintf(in.rnd, sizeof in.rnd, "%s", part);
    else if (!strcmp(part, "ftz")) in.ftz = true;
    else if (!strcmp(part, "sat")) in.sat = true;
    else if (!strcmp(part, "NaN")) in.nan = true;
    else if (in.ntypes < 2) snprintf(in.types[in.ntypes++], 8, "%s", part);
    else unsupported(tmpl, "modifier");
  }
  return in;
}

inline uint64_t operand(const char* tok, size_t len, Reg* regs, int nregs, const char* tmpl) {
  if (tok[0] == '%') {
    int i = atoi(tok + 1);
    if (i < 0 || i >= nregs) unsupported(tmpl, "operand index");
    return regs[i].bits;
  }
  if (len > 2 && tok[0] == '0' && (tok[1] == 'f' || tok[1] == 'd')) return strtoull(tok + 2, nullptr, 16);
  return strtoull(tok, nullptr, 0);
}

inline void store(Reg& r, uint64_t bits) {
  switch (r.kind) {
    case F32: case B32: { uint32_t u = (uint32_t)bits; memcpy(r.out, &u, 4); break; }
    case B16: { uint16_t u = (uint16_t)bits; memcpy(r.out, &u, 2); break; }
    case F64: case B64: memcpy(r.out, &bits, 8); break;
  }
}

// one fp32 operation under rounding mode `mode` (volatile: nothing is folded or moved across fesetround)
inline float arith(char op, int mode, float a, float b, float c = 0.0f) {
  volatile float va = a, vb = b, vc = c, r;
  fesetround(mode);
  switch (op) {
    case '+': r = va + vb; break;
    case '-': r = va - vb; break;
    case '*': r = va * vb; break;
    case '/': r = va / vb; break;
    case 'f': r = fmaf(va, vb, vc); break;
    default: r = nearbyintf(va); break;  // 'i': to an integral value
  }
  fesetround(FE_TONEAREST);
  return r;
}

inline uint32_t canonical_nan32() { return 0x7fffffffu; }

// executes one PTX instruction; regs[0] is the destination (every instruction modelled has one)
inline void exec_regs(const char* tmpl, Reg* regs, int nregs) {
  const char* sp = strchr(tmpl, ' ');
  if (!sp) unsupported(tmpl, "no operands");
  Insn I = parse_mnemonic(tmpl, sp);
  // operands after the destination
  uint64_t src[4] = {0, 0, 0, 0};
  int nsrc = -1;
  const char* p = sp;
  while (*p) {
    while (*p == ' ' || *p == ',' || *p == '\t') ++p;
    if (!*p || *p == ';') break;
    const char* q = p;
    while (*q && *q != ',' && *q != ';' && *q != ' ') ++q;
    char tok[40];
    size_t len = (size_t)(q - p);
    if (len >= sizeof tok) unsupported(tmpl, "operand too long");
    memcpy(tok, p, len);
    tok[len] = 0;
    if (nsrc >= 0) {
      if (nsrc >= 4) unsupported(tmpl, "too many operands");
      src[nsrc] = operand(tok, len, regs, nregs, tmpl);
    }
    ++nsrc;
    p = q;
  }
  Reg& dst = regs[0];
  const bool f32_op = I.ntypes == 1 && !strcmp(I.types[0], "f32");
  if ((!strcmp(I.op, "add") || !strcmp(I.op, "sub") || !strcmp(I.op, "mul") || !strcmp(I.op, "div")) && f32_op) {
    if (!I.rnd[0] || I.rnd[2]) unsupported(tmpl, "fp32 arithmetic without an IEEE rounding modifier");
    if (I.sat) unsupported(tmpl, ".sat");
    const char op = I.op[0] == 'a' ? '+' : I.op[0] == 's' ? '-' : I.op[0] == 'm' ? '*' : '/';
    float r = arith(op, fe_mode(I.rnd), ftz(f32(src[0]), I.ftz), ftz(f32(src[1]), I.ftz));
    r = ftz(r, I.ftz);
    store(dst, std::isnan(r) ? canonical_nan32() : bits32(r));
    return;
  }
  if (!strcmp(I.op, "fma") && f32_op) {
    if (!I.rnd[0] || I.rnd[2] || I.sat) unsupported(tmpl, "fma without an IEEE rounding modifier, or .sat");
    float r = arith('f', fe_mode(I.rnd), ftz(f32(src[0]), I.ftz), ftz(f32(src[1]), I.ftz), ftz(f32(src[2]), I.ftz));
    r = ftz(r, I.ftz);
    store(dst, std::isnan(r) ? canonical_nan32() : bits32(r));
    return;
  }
  if ((!strcmp(I.op, "max") || !strcmp(I.op, "min")) && f32_op) {
    const float a = ftz(f32(src[0]), I.ftz), b = ftz(f32(src[1]), I.ftz);
    float r;
    if (std::isnan(a) && std::isnan(b)) r = NAN;
    else if (std::isnan(a) || std::isnan(b)) r = I.nan ? NAN : (std::isnan(a) ? b : a);
    else if (a == b) r = (I.op[1] == 'a') == std::signbit(a) ? b : a;  // max(+0, -0) = +0, min = -0
    else r = (I.op[1] == 'a') == (a > b) ? a : b;
    store(dst, std::isnan(r) ? canonical_nan32() : bits32(r));
    return;
  }
  if (!strcmp(I.op, "cvt") && I.ntypes == 2) {
    const char* d = I.types[0];
    const char* s = I.types[1];
    if (!strcmp(d, "f32") && !strcmp(s, "f16")) {  // exact widening; NaN canonical
      if (I.rnd[0]) unsupported(tmpl, "a rounding modifier on an exact conversion");
      const uint16_t h = (uint16_t)src[0];
      _Float16 x;
      memcpy(&x, &h, 2);
      const float f = ftz((float)x, I.ftz);
      store(dst, std::isnan(f) ? canonical_nan32() : bits32(f));
      return;
    }
    if (!strcmp(d, "f16") && !strcmp(s, "f32")) {
      if (!I.rnd[0] || I.rnd[2]) unsupported(tmpl, "cvt.f16.f32 needs .rn/.rz/.rm/.rp");
      const float f = ftz(f32(src[0]), I.ftz);
      volatile float vf = f;
      fesetround(fe_mode(I.rnd));
      volatile _Float16 x = (_Float16)vf;
      fesetround(FE_TONEAREST);
      uint16_t h;
      memcpy(&h, (const void*)&x, 2);
      store(dst, std::isnan(f) ? 0x7fffu : h);
      return;
    }
    if (!strcmp(d, "f32") && !strcmp(s, "f32")) {  // round to an integral value
      if (!I.rnd[0] || !I.rnd[2]) unsupported(tmpl, "cvt.f32.f32 needs .rni/.rzi/.rmi/.rpi");
      const float r = ftz(arith('i', fe_mode(I.rnd), ftz(f32(src[0]), I.ftz), 0.0f), I.ftz);
      store(dst, std::isnan(r) ? canonical_nan32() : bits32(r));
      return;
    }
    if (!strcmp(d, "s32") && !strcmp(s, "f32")) {  // integer rounding, saturated, NaN -> 0
      if (!I.rnd[0] || !I.rnd[2]) unsupported(tmpl, "cvt.s32.f32 needs .rni/.rzi/.rmi/.rpi");
      const float f = ftz(f32(src[0]), I.ftz);
      int32_t v;
      if (std::isnan(f)) v = 0;
      else {
        const float r = arith('i', fe_mode(I.rnd), f, 0.0f);
        v = r >= 2147483648.0f ? INT32_MAX : r < -2147483648.0f ? INT32_MIN : (int32_t)r;
      }
      store(dst, (uint32_t)v);
      return;
    }
  }
  unsupported(tmpl, "instruction");
}

template <class... Ops> inline void exec(const char* tmpl, Ops... ops) {
  Reg regs[] = {ops...};
  exec_regs(tmpl, regs, (int)sizeof...(Ops));
}

}  // namespace ccoll_ptx

// ---- CUDA intrinsics (CUDA Math API / Programming Guide definitions), bit by bit ------------------------------
inline int __ffs(int x) {  // position of the least significant set bit, from 1; 0 for 0
  for (int i = 0; i < 32; ++i)
    if ((unsigned)x >> i & 1u) return i + 1;
  return 0;
}
inline int __ffsll(long long x) {
  for (int i = 0; i < 64; ++i)
    if ((unsigned long long)x >> i & 1ull) return i + 1;
  return 0;
}
inline int __clz(int x) {  // leading zero bits, 32 for 0
  int n = 0;
  for (int i = 31; i >= 0 && !((unsigned)x >> i & 1u); --i) ++n;
  return n;
}
inline int __clzll(long long x) {
  int n = 0;
  for (int i = 63; i >= 0 && !((unsigned long long)x >> i & 1ull); --i) ++n;
  return n;
}
inline int __popc(unsigned x) {
  int n = 0;
  for (int i = 0; i < 32; ++i) n += x >> i & 1u;
  return n;
}
inline unsigned __brev(unsigned x) {  // bit i -> bit 31 - i
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (x >> i & 1u) << (31 - i);
  return r;
}
inline unsigned long long __brevll(unsigned long long x) {
  unsigned long long r = 0;
  for (int i = 0; i < 64; ++i) r |= (x >> i & 1ull) << (63 - i);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) {  // the high 32 bits of the 64-bit product
  unsigned long long p = 0;
  for (int i = 0; i < 32; ++i)
    if (b >> i & 1u) p += (unsigned long long)a << i;
  return (unsigned)(p >> 32);
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  // result byte n = byte (s >> 4n) & 7 of the 8 bytes {y (high), x (low)}
  unsigned char bytes[8];
  for (int i = 0; i < 4; ++i) bytes[i] = (unsigned char)(x >> (8 * i));
  for (int i = 0; i < 4; ++i) bytes[4 + i] = (unsigned char)(y >> (8 * i));
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= (unsigned)bytes[(s >> (4 * n)) & 7u] << (8 * n);
  return r;
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) {  // one thread at a time here
  const unsigned long long old = *p;
  *p = old | v;
  return old;
}
