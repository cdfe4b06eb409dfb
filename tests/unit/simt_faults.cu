// Test-only kernels for tests/unit/test_simt.py: negative controls the simt runtime must catch (each a
// GPU-undefined or out-of-bounds operation), and small positive ones (shuffle variants, __syncthreads with
// __shared__). Never built by the codecs; compiled by ccoll.simt with the same shim as kernels/*.cu.

// every lane: v = its lane, then the xor-butterfly sum over `team` lanes with `mask` (team sums are exact)
extern "C" __global__ void simt_team_sum(const int* in, int* out, unsigned mask, int team, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    for (int off = team >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
    if (i < n) out[i] = v;
}

// lane `quit` returns before the team shuffle its partner waits in
extern "C" __global__ void simt_exit_before_shuffle(int* out, int quit) {
    const int lane = threadIdx.x & 31;
    if (lane == quit) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, lane, 1);
}

// two halves of a warp in different shuffles (different call sites) under the full mask
extern "C" __global__ void simt_divergent_shuffle(int* out) {
    const int lane = threadIdx.x & 31;
    int v;
    if (lane < 16) v = __shfl_xor_sync(0xffffffffu, lane, 1);
    else v = __shfl_xor_sync(0xffffffffu, lane, 2);
    out[threadIdx.x] = v;
}

// a 16-byte vector load at p + offset floats (misaligned unless offset % 4 == 0)
struct alignas(16) simt_v4 { float x, y, z, w; };
extern "C" __global__ void simt_vector_copy(const float* p, float* out, int offset) {
    const simt_v4 v = *reinterpret_cast<const simt_v4*>(p + offset + 4 * threadIdx.x);
    out[4 * threadIdx.x] = v.x + v.y + v.z + v.w;
}

// out[i] = i for i < n + extra (extra > 0 writes past the end)
extern "C" __global__ void simt_fill(float* out, long long n, int extra) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + extra) out[i] = (float)i;
}

// a CTA-wide reversal through __shared__ memory and __syncthreads; `skip` >= 0: that thread skips the barrier
// and then waits in a shuffle instead (a deadlock)
extern "C" __global__ void simt_block_reverse(const int* in, int* out, int skip) {
    __shared__ int tile[1024];
    const int t = threadIdx.x;
    tile[t] = in[blockIdx.x * blockDim.x + t];
    if (t == skip) {
        out[0] = __shfl_xor_sync(0xffffffffu, t, 1);
        return;
    }
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = tile[blockDim.x - 1 - t];
}

// shuffle variants and votes (positive control of their semantics): out[5 * i + k]
extern "C" __global__ void simt_warp_ops(int* out, int width) {
    const int i = threadIdx.x, lane = i & 31;
    out[5 * i + 0] = __shfl_sync(0xffffffffu, 100 + lane, 3, width);
    out[5 * i + 1] = __shfl_up_sync(0xffffffffu, 100 + lane, 2, width);
    out[5 * i + 2] = __shfl_down_sync(0xffffffffu, 100 + lane, 2, width);
    out[5 * i + 3] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    __syncwarp();
    out[5 * i + 4] = __all_sync(0xffffffffu, lane < 40) + 2 * __any_sync(0xffffffffu, lane == 7);
}
