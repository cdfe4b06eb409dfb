/* simt.h -- run the real `__global__` kernels of kernels/*.cu on the CPU ("simt" backend, ccoll/simt.py).

A .cu file is compiled as C++ (g++, -DCCOLL_SIMT) after this header. Every CUDA thread of a CTA is a fiber
(its own 128 KiB stack with a PROT_NONE page below it; an x86-64 register switch, ucontext elsewhere). The
scheduler runs one CTA at a time: the lanes of each warp run round-robin (forward, or reversed by the
launch's `order`, which also reverses the warp and CTA order) until every live lane is blocked at a sync
point or has exited; then, per warp, the warp-level operations are resolved for the whole warp at once,
and when every live thread of the CTA is at __syncthreads the barrier opens. The kernel's own code runs
unchanged; only the opened `#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)` sections (vector
loads/stores, warp shuffles, per-lane register arrays) switch from the host build's path to the device
path. Arithmetic stays on the host path (the kernels' inline-PTX fp32 ops have exact host twins).

What simt checks (a violation aborts the launch with a KernelError naming the CTA, thread and lane; the
process does not crash):
  * warp operations (__shfl_sync / _xor / _up / _down, __syncwarp, __ballot_sync, __any_sync,
    __all_sync): the caller's lane must be in its mask; every lane named in the mask must exist (a partial
    last warp has fewer lanes), must not have exited, and must be blocked in the same operation (same
    kind, mask, width and call site); a shuffle's source lane must be in the mask.
  * __syncthreads: a barrier of the CTA's live threads; a thread in a warp operation while others wait
    at the barrier (or the reverse) that can never be resolved is reported as a deadlock.
  * alignment: built with -fsanitize=alignment -fsanitize-undefined-trap-on-error, so a load or store
    through a misaligned pointer of an over-aligned type (the 16-byte CqV16 / ccoll_v4f vectors, an
    8-byte CqV8, a float at an odd address) traps; the trap is reported as a misaligned access.
  * bounds: buffers made by ccoll.simt.guarded_empty end at a PROT_NONE page (reads and writes past the
    end fault) or, when their requested misalignment leaves < 64 bytes before that page, at canary bytes
    checked after the launch (writes only). SIGSEGV / SIGBUS / SIGFPE / SIGILL in a fiber are caught and
    reported with the faulting address and the thread.
  * threadIdx / blockIdx / blockDim / gridDim are per fiber; `__shared__` variables are per CTA (CTAs
    run one at a time; see below); dynamic shared memory bytes are allocated per launch (simt_dyn_shared()).
  * order dependence, by the caller: `order="reverse"` runs CTAs, warps and lanes in reverse, and the
    tests require the same bytes both ways. `ctas=(lo, hi)` runs only some CTAs (sparse huge grids).

What simt cannot see:
  * memory-model races: CTAs run one after another and the threads of a CTA run one at a time between
    sync points, so a race between CTAs, or between warps of a CTA without a barrier, or a missing
    __threadfence / atomic, shows no symptom unless the lane order option exposes it.
  * warp-synchronous code that relies on implicit lock-step between sync points (pre-Volta style): lanes
    run one after another, so such code sees other lanes' writes either entirely or not at all, only at
    the sync points modelled above.
  * timing, occupancy, register pressure / spills, launch-bound limits, stack size on the device,
    shared-memory bank conflicts, coalescing, L1/L2 behaviour, texture / constant caches.
  * device arithmetic: fp32 ops run on the host path (exact twins of the PTX ops by construction) and
    __CUDA_ARCH__ stays undefined, so code only under __CUDA_ARCH__ (intrinsics like __ffsll, atomicOr,
    inline PTX) is not executed -- the host twin is. `__shared__` is a function static: CTAs run one at a
    time so it is per CTA, but it is not re-poisoned between CTAs.
  * `extern __shared__ T a[]` is not supported (ccoll/simt.py refuses a source declaring one;
    simt_dyn_shared() gives the launch's dynamic bytes), so a kernel using it cannot run here unchanged.
  * two simt libraries in one process whose C++ symbols coincide (a modified copy of a kernel source
    keeping its kernel names) stay apart only because ccoll/simt.py builds with -fno-gnu-unique: g++
    otherwise emits template statics (simt::Entry<&kernel>::desc) and inline functions' statics
    (`__shared__`) as STB_GNU_UNIQUE, which the dynamic linker binds process-wide to the first library
    loaded despite RTLD_LOCAL -- a launch through the second library then runs the first one's kernel
    thunk against the first one's idle runtime state, a SIGSEGV (tests/unit/test_simt.py::
    test_two_libraries_with_the_same_kernel_names_run_their_own_code without the flag). A library built
    by other means has no such guarantee.
  * reads in the < 64 canary bytes between a misaligned buffer's end and its guard page; any access
    past a buffer that was not made by guarded_empty (an ordinary torch tensor: no guard page); reads of
    uninitialised memory (no shadow state; simt is not a memory checker).
  * only x86-64 (the register switch) is exercised; the ucontext fallback for other hosts is untested.
*/
#pragma once

#ifndef CCOLL_SIMT
#define CCOLL_SIMT 1
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// ---- CUDA keywords as C++ ---------------------------------------------------------------------------
#define __host__
#define __device__
#ifdef SIMT_LIST_KERNELS  // ccoll/simt.py's preprocessor pass finds the kernels' names by this mark
#define __global__ __simt_global__
#else
#define __global__
#endif
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;

namespace simt {

enum Op : int { OP_NONE = 0, OP_SHFL_IDX, OP_SHFL_XOR, OP_SHFL_UP, OP_SHFL_DOWN, OP_SYNCWARP, OP_BALLOT,
                OP_ANY, OP_ALL, OP_BAR };

struct Thread;
// the running fiber (set by the scheduler before every switch)
extern Thread* current;
// block on a warp operation: returns the resolved 64-bit result (shuffled value, ballot, vote)
unsigned long long warp_op(int op, unsigned mask, unsigned long long value, int arg, int width, const char* file,
                           int line);
void syncthreads(const char* file, int line);
[[noreturn]] void fail(const char* what);
const uint3& thread_idx();
const uint3& block_idx();
const uint3& block_dim();
const uint3& grid_dim();
void* dyn_shared();

template <class T>
inline unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T from_bits(unsigned long long b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

// ---- kernel descriptors: Python calls a kernel through its argument sizes and kinds ------------------
struct KernelDesc {
    void (*thunk)(void** params);
    int nargs;
    const int* sizes;  // sizeof each parameter
    const char* kinds; // 'p' pointer, 'f' floating, 'i' signed integer, 'u' unsigned integer
};

template <class A>
constexpr char kind_of() {
    return std::is_pointer<A>::value ? 'p' : std::is_floating_point<A>::value ? 'f' : std::is_signed<A>::value ? 'i' : 'u';
}

template <auto F>
struct Entry;
template <class... A, void (*F)(A...)>
struct Entry<F> {
    template <std::size_t... I>
    static void call(void** p, std::index_sequence<I...>) {
        F(*static_cast<typename std::remove_cv<typename std::remove_reference<A>::type>::type*>(p[I])...);
    }
    static void thunk(void** p) { call(p, std::index_sequence_for<A...>{}); }
    static constexpr int sizes[sizeof...(A) + 1] = {(int)sizeof(A)..., 0};
    static constexpr char kinds[sizeof...(A) + 1] = {kind_of<A>()..., 0};
    static constexpr KernelDesc desc = {&thunk, (int)sizeof...(A), sizes, kinds};
};

}  // namespace simt

// exported by the generated wrapper (ccoll/simt.py), one per `__global__` kernel found in the source
#define SIMT_EXPORT(K) extern "C" const simt::KernelDesc* simt_desc_##K() { return &simt::Entry<&K>::desc; }

// ---- built-in variables ------------------------------------------------------------------------------
#define threadIdx (simt::thread_idx())
#define blockIdx (simt::block_idx())
#define blockDim (simt::block_dim())
#define gridDim (simt::grid_dim())
static const int warpSize = 32;

// ---- warp and CTA synchronisation ---------------------------------------------------------------------
#define SIMT_SITE __builtin_FILE(), __builtin_LINE()

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32, const char* f = __builtin_FILE(),
                     int l = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_op(simt::OP_SHFL_IDX, mask, simt::to_bits(v), src, width, f, l));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char* f = __builtin_FILE(),
                         int l = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_op(simt::OP_SHFL_XOR, mask, simt::to_bits(v), lane_mask, width, f, l));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* f = __builtin_FILE(),
                        int l = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_op(simt::OP_SHFL_UP, mask, simt::to_bits(v), (int)delta, width, f, l));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* f = __builtin_FILE(),
                          int l = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_op(simt::OP_SHFL_DOWN, mask, simt::to_bits(v), (int)delta, width, f, l));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    simt::warp_op(simt::OP_SYNCWARP, mask, 0, 0, 32, f, l);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)simt::warp_op(simt::OP_BALLOT, mask, pred != 0, 0, 32, f, l);
}
inline int __any_sync(unsigned mask, int pred, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)simt::warp_op(simt::OP_ANY, mask, pred != 0, 0, 32, f, l);
}
inline int __all_sync(unsigned mask, int pred, const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (int)simt::warp_op(simt::OP_ALL, mask, pred != 0, 0, 32, f, l);
}
inline void __syncthreads(const char* f = __builtin_FILE(), int l = __builtin_LINE()) { simt::syncthreads(f, l); }
[[noreturn]] inline void __trap() { simt::fail("__trap() called"); }
inline void* simt_dyn_shared() { return simt::dyn_shared(); }
