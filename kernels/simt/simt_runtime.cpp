// The simt scheduler (see simt.h for what it models and what it cannot see). Included once, after the
// kernel source, by the wrapper that ccoll/simt.py generates: one shared library per kernel source.
#include "simt.h"

#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace simt {

// ---- fibers ---------------------------------------------------------------------------------------------
#if defined(__x86_64__)
// simt_switch(&save_sp, new_sp): push the callee-saved registers, swap stacks, pop them, return there
extern "C" void simt_switch(void** save_sp, void* new_sp);
asm(R"(
    .text
    .p2align 4
    .globl simt_switch
    .hidden simt_switch
    .type simt_switch, @function
simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size simt_switch, .-simt_switch
)");
#endif

enum State : int { RUNNABLE, BLOCKED, DONE };

struct Thread {
    uint3 tid;
    int lane, warp;
    State state;
    // the warp operation or barrier it is blocked in
    int op;
    unsigned mask;
    unsigned long long value, result;
    int arg, width;
    const char* file;
    int line;
#if defined(__x86_64__)
    void* sp;
#else
    ucontext_t ctx;
#endif
    char* stack;  // its usable part (above the guard page)
};

static const size_t STACK = 128 << 10;
static const size_t PAGE = 4096;

Thread* current = nullptr;
static const KernelDesc* g_desc;
static void** g_params;
static uint3 g_block_idx, g_block_dim, g_grid_dim;
static std::vector<unsigned char> g_dyn_shared;
#if defined(__x86_64__)
static void* g_sched_sp;
#else
static ucontext_t g_sched_ctx;
#endif
static sigjmp_buf g_abort;
static char g_msg[2048];

const uint3& thread_idx() { return current->tid; }
const uint3& block_idx() { return g_block_idx; }
const uint3& block_dim() { return g_block_dim; }
const uint3& grid_dim() { return g_grid_dim; }
void* dyn_shared() { return g_dyn_shared.empty() ? nullptr : g_dyn_shared.data(); }

static void where(char* buf, size_t n, const Thread* t) {
    if (t)
        snprintf(buf, n, "CTA (%u,%u,%u) thread (%u,%u,%u) [warp %d lane %d]", g_block_idx.x, g_block_idx.y,
                 g_block_idx.z, t->tid.x, t->tid.y, t->tid.z, t->warp, t->lane);
    else
        snprintf(buf, n, "CTA (%u,%u,%u)", g_block_idx.x, g_block_idx.y, g_block_idx.z);
}

__attribute__((format(printf, 2, 3))) static void set_msg(const Thread* t, const char* fmt, ...) {
    char at[160];
    where(at, sizeof at, t);
    int k = snprintf(g_msg, sizeof g_msg, "%s: ", at);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg + k, sizeof g_msg - k, fmt, ap);
    va_end(ap);
}

static void to_scheduler() {
    Thread* self = current;
#if defined(__x86_64__)
    simt_switch(&self->sp, g_sched_sp);
#else
    swapcontext(&self->ctx, &g_sched_ctx);
#endif
}

static void run(Thread* t) {
    current = t;
#if defined(__x86_64__)
    simt_switch(&g_sched_sp, t->sp);
#else
    swapcontext(&g_sched_ctx, &t->ctx);
#endif
    current = nullptr;
}

[[noreturn]] static void fiber_main() {
    g_desc->thunk(g_params);
    current->state = DONE;
    to_scheduler();
    __builtin_trap();  // never resumed
}

static void start(Thread* t) {
    char* top = t->stack + STACK;
#if defined(__x86_64__)
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                                       // fiber_main's return address (never used)
    *--sp = reinterpret_cast<void*>(&fiber_main);          // simt_switch's `ret` enters fiber_main
    for (int i = 0; i < 6; ++i) *--sp = nullptr;           // rbp rbx r12..r15
    t->sp = sp;
#else
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = STACK;
    t->ctx.uc_link = nullptr;
    makecontext(&t->ctx, (void (*)())fiber_main, 0);
#endif
    t->state = RUNNABLE;
    t->op = OP_NONE;
}

[[noreturn]] void fail(const char* what) {
    set_msg(current, "%s", what);
    siglongjmp(g_abort, 1);
}

unsigned long long warp_op(int op, unsigned mask, unsigned long long value, int arg, int width, const char* file,
                           int line) {
    Thread* t = current;
    t->op = op;
    t->mask = mask;
    t->value = value;
    t->arg = arg;
    t->width = width;
    t->file = file;
    t->line = line;
    t->state = BLOCKED;
    to_scheduler();
    return t->result;
}

void syncthreads(const char* file, int line) { warp_op(OP_BAR, 0, 0, 0, 0, file, line); }

static const char* op_name(int op) {
    static const char* names[] = {"(running)", "__shfl_sync", "__shfl_xor_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__syncwarp", "__ballot_sync", "__any_sync", "__all_sync", "__syncthreads"};
    return names[op];
}

static void describe(char* buf, size_t n, const Thread* t) {
    if (t->state == DONE)
        snprintf(buf, n, "has exited");
    else if (t->op == OP_BAR)
        snprintf(buf, n, "waits in __syncthreads at %s:%d", t->file, t->line);
    else
        snprintf(buf, n, "is in %s(mask 0x%08x, width %d) at %s:%d", op_name(t->op), t->mask, t->width, t->file,
                 t->line);
}

// Resolve the warp operations of one warp whose live lanes are all blocked. Returns -1 on a GPU-undefined
// operation (g_msg set), else the number of lanes released.
static int resolve_warp(Thread* const* lanes, int nlanes) {
    int released = 0;
    for (int l = 0; l < nlanes; ++l) {
        Thread* t = lanes[l];
        if (t->state != BLOCKED || t->op == OP_BAR || t->op == OP_NONE) continue;
        if (!((t->mask >> l) & 1u)) {
            set_msg(t, "%s at %s:%d with mask 0x%08x, which does not contain the calling lane %d", op_name(t->op),
                    t->file, t->line, t->mask, l);
            return -1;
        }
        if (t->width < 1 || t->width > 32 || (t->width & (t->width - 1))) {
            set_msg(t, "%s at %s:%d with width %d (not a power of two <= 32)", op_name(t->op), t->file, t->line,
                    t->width);
            return -1;
        }
        for (int m = 0; m < 32; ++m) {
            if (!((t->mask >> m) & 1u)) continue;
            if (m >= nlanes) {
                set_msg(t, "%s at %s:%d: mask 0x%08x names lane %d, which does not exist (the warp has %d lanes)",
                        op_name(t->op), t->file, t->line, t->mask, m, nlanes);
                return -1;
            }
            const Thread* o = lanes[m];
            if (o->state == DONE || o->op != t->op || o->mask != t->mask || o->width != t->width ||
                o->line != t->line || strcmp(o->file, t->file) != 0) {
                char d[400];
                describe(d, sizeof d, o);
                set_msg(t, "%s(mask 0x%08x) at %s:%d: lane %d of the mask %s", op_name(t->op), t->mask, t->file,
                        t->line, m, d);
                return -1;
            }
        }
    }
    // every blocked warp operation is consistent: compute the results, then release
    for (int l = 0; l < nlanes; ++l) {
        Thread* t = lanes[l];
        if (t->state != BLOCKED || t->op == OP_BAR) continue;
        const int w = t->width, seg = l & ~(w - 1);
        int src = l;
        switch (t->op) {
            case OP_SHFL_IDX: src = seg + (t->arg & (w - 1)); break;
            case OP_SHFL_XOR: src = l ^ t->arg; if ((src & ~(w - 1)) > seg) src = l; break;
            case OP_SHFL_UP: src = (l - seg) >= t->arg ? l - t->arg : l; break;
            case OP_SHFL_DOWN: src = (l - seg) + t->arg < w ? l + t->arg : l; break;
            default: break;
        }
        if (t->op >= OP_SHFL_IDX && t->op <= OP_SHFL_DOWN) {
            if (src < 0 || src >= 32 || !((t->mask >> src) & 1u)) {
                set_msg(t, "%s(mask 0x%08x) at %s:%d reads lane %d, which is not in the mask", op_name(t->op),
                        t->mask, t->file, t->line, src);
                return -1;
            }
            t->result = lanes[src]->value;
        } else if (t->op == OP_SYNCWARP) {
            t->result = 0;
        } else {
            unsigned ballot = 0;
            for (int m = 0; m < nlanes; ++m)
                if (((t->mask >> m) & 1u) && lanes[m]->value) ballot |= 1u << m;
            t->result = t->op == OP_BALLOT ? ballot : t->op == OP_ANY ? ballot != 0 : ballot == t->mask;
        }
    }
    for (int l = 0; l < nlanes; ++l) {
        Thread* t = lanes[l];
        if (t->state == BLOCKED && t->op != OP_BAR) {
            t->state = RUNNABLE;
            t->op = OP_NONE;
            ++released;
        }
    }
    return released;
}

// run one CTA to completion; false on an error (g_msg set)
static bool run_cta(std::vector<Thread>& threads, int nthreads, bool reverse) {
    const int nwarps = (nthreads + 31) / 32;
    for (int i = 0; i < nthreads; ++i) start(&threads[i]);
    int live = nthreads;
    std::vector<Thread*> lanes(32);
    while (live > 0) {
        bool progress = false;
        for (int wi = 0; wi < nwarps; ++wi) {
            const int w = reverse ? nwarps - 1 - wi : wi;
            const int n = nthreads - 32 * w < 32 ? nthreads - 32 * w : 32;
            for (int li = 0; li < n; ++li) {
                Thread* t = &threads[32 * w + (reverse ? n - 1 - li : li)];
                if (t->state != RUNNABLE) continue;
                run(t);
                progress = true;
                if (t->state == DONE) --live;
            }
        }
        for (int w = 0; w < nwarps; ++w) {
            const int n = nthreads - 32 * w < 32 ? nthreads - 32 * w : 32;
            for (int l = 0; l < n; ++l) lanes[l] = &threads[32 * w + l];
            const int r = resolve_warp(lanes.data(), n);
            if (r < 0) return false;
            if (r > 0) progress = true;
        }
        if (live > 0) {
            int at_bar = 0;
            for (int i = 0; i < nthreads; ++i) at_bar += threads[i].state == BLOCKED && threads[i].op == OP_BAR;
            if (at_bar == live) {
                for (int i = 0; i < nthreads; ++i)
                    if (threads[i].state == BLOCKED) {
                        threads[i].state = RUNNABLE;
                        threads[i].op = OP_NONE;
                    }
                progress = true;
            }
        }
        if (!progress) {
            const Thread* a = nullptr;
            const Thread* b = nullptr;
            for (int i = 0; i < nthreads; ++i) {
                if (threads[i].state != BLOCKED) continue;
                if (threads[i].op == OP_BAR) a = a ? a : &threads[i];
                else b = b ? b : &threads[i];
            }
            char da[400] = "", db[400] = "";
            if (a) describe(da, sizeof da, a);
            if (b) describe(db, sizeof db, b);
            set_msg(b ? b : a, "deadlock: no warp operation or barrier can complete (%s%s%s)", db,
                    a && b ? "; another thread " : "", da);
            return false;
        }
    }
    return true;
}

// ---- faults in a fiber: report, never crash the process ------------------------------------------------
static const int SIGNALS[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP};
static struct sigaction g_old[sizeof SIGNALS / sizeof SIGNALS[0]];

static void on_fault(int sig, siginfo_t* info, void* uctx) {
    const void* pc = nullptr;
#if defined(__x86_64__)
    pc = reinterpret_cast<void*>(static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_RIP]);
#else
    (void)uctx;
#endif
    Dl_info dl;
    const char* fn = pc && dladdr(pc, &dl) && dl.dli_sname ? dl.dli_sname : "?";
    if (sig == SIGILL || sig == SIGTRAP)
        set_msg(current, "trap (SIG%s) at pc %p in %s: a misaligned access caught by -fsanitize=alignment "
                "(or __builtin_trap)", sig == SIGILL ? "ILL" : "TRAP", pc, fn);
    else if (sig == SIGSEGV)
        set_msg(current, "SIGSEGV: invalid access to address %p at pc %p in %s (past a guarded buffer's end, "
                "a bad pointer, or a stack overflow)", info->si_addr, pc, fn);
    else
        set_msg(current, "signal %d at address %p, pc %p in %s", sig, info->si_addr, pc, fn);
    siglongjmp(g_abort, 1);
}

static stack_t g_alt, g_old_alt;

static void install() {
    static std::vector<char> alt(1 << 16);
    g_alt.ss_sp = alt.data();
    g_alt.ss_size = alt.size();
    g_alt.ss_flags = 0;
    sigaltstack(&g_alt, &g_old_alt);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof SIGNALS / sizeof SIGNALS[0]; ++i) sigaction(SIGNALS[i], &sa, &g_old[i]);
}

static void uninstall() {
    for (size_t i = 0; i < sizeof SIGNALS / sizeof SIGNALS[0]; ++i) sigaction(SIGNALS[i], &g_old[i], nullptr);
    sigaltstack(&g_old_alt, nullptr);
}

}  // namespace simt

// Launch `desc` over grid x block threads. CTAs with linear index outside [cta_lo, cta_hi) are skipped
// (the sparse-grid tests run only the CTAs touching the top of a huge tensor). order 1: reverse CTA, warp
// and lane order. Returns 0, or 1 with the error in err.
extern "C" int simt_launch(const simt::KernelDesc* desc, void** params, const unsigned* grid, const unsigned* block,
                           unsigned long long shared_bytes, int order, unsigned long long cta_lo,
                           unsigned long long cta_hi, char* err, unsigned long long errlen) {
    using namespace simt;
    const unsigned long long nthreads = (unsigned long long)block[0] * block[1] * block[2];
    if (nthreads == 0 || nthreads > 1024) {
        snprintf(err, errlen, "block of %llu threads (CUDA allows 1..1024)", nthreads);
        return 1;
    }
    const unsigned long long nctas = (unsigned long long)grid[0] * grid[1] * grid[2];
    g_desc = desc;
    g_params = params;
    g_block_dim = {block[0], block[1], block[2]};
    g_grid_dim = {grid[0], grid[1], grid[2]};
    g_dyn_shared.assign(shared_bytes, 0xA5);
    // every stack with a PROT_NONE page below it (a stack overflow faults, reported, never silent)
    const size_t per = STACK + PAGE;
    char* region = static_cast<char*>(
        mmap(nullptr, per * nthreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (region == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %llu fiber stacks", nthreads);
        return 1;
    }
    std::vector<Thread> threads(nthreads);
    for (unsigned long long i = 0; i < nthreads; ++i) {
        mprotect(region + i * per, PAGE, PROT_NONE);
        threads[i].stack = region + i * per + PAGE;
        threads[i].tid = {(unsigned)(i % block[0]), (unsigned)(i / block[0] % block[1]),
                          (unsigned)(i / block[0] / block[1])};
        threads[i].lane = (int)(i % 32);
        threads[i].warp = (int)(i / 32);
    }
    int status = 0;
    install();
    if (sigsetjmp(g_abort, 1) == 0) {
        const unsigned long long lo = cta_lo, hi = cta_hi < nctas ? cta_hi : nctas;
        for (unsigned long long k = lo; k < hi; ++k) {
            const unsigned long long c = order == 1 ? hi - 1 - (k - lo) : k;
            g_block_idx = {(unsigned)(c % grid[0]), (unsigned)(c / grid[0] % grid[1]), (unsigned)(c / grid[0] / grid[1])};
            if (!run_cta(threads, (int)nthreads, order == 1)) {
                status = 1;
                break;
            }
        }
    } else {
        status = 1;
    }
    uninstall();
    current = nullptr;
    if (status) snprintf(err, errlen, "%s", g_msg);
    munmap(region, per * nthreads);
    return status;
}
