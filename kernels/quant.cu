/* Block quantization kernels for the "int8", "int4" and "fp8" codecs (ccoll/codecs/quant.py).

Algorithm (written once, templated on the element format F -- CqInt<8>, CqInt<4>, CqFp8 E4M3 / E5M2, see
"Element formats" below; the int formats are described here, fp8 at CqFp8 -- and on the input type
f32 / bf16 / f16; BITS = F::BITS):
  per block of B consecutive values: absmax = max |x| (computed in fp32), scale = absmax / qmax with
  qmax = 2^(BITS-1) - 1 (127 or 7), inv = 1 / scale (one correctly rounded division per block),
  q = clamp(round(x * inv), -qmax, qmax), decode y = q * scale.
  - x * inv, not x / scale: a correctly rounded division per value was ~10 of the ~28 instructions per
    value of the encode (div.rn's fast path with its range check and branch), a multiply is one. The
    quotient then errs by 2 roundings instead of 1 (<= 2^-23 relative, ~1.5e-5 of a step at qmax = 127),
    inside the codec's documented bound (ccoll/codecs/quant.py _FP32_MARGIN).
  - round = nearest: rintf, i.e. round half to EVEN (IEEE default; the same as torch.round).
  - round = stochastic: q = floor(x * inv + u), u in [0, 1) from a counter-based hash of
    (seed, global element index) -- see cq_uniform; identical to the torch backend's int64 emulation.
  - a scale with qmax * scale > FLT_MAX (absmax within ~1 ulp of FLT_MAX) is replaced by the next smaller
    float, so finite input never decodes to Inf.
  - a tiny block (0 < absmax < qmax * 2^-126, where absmax / qmax is subnormal or 0) takes scale 2^-126,
    the smallest normal float, so inv <= 2^126 is finite: q = rint(x * 2^126) exactly, error <= 2^-127.
  - an all-zero block stores scale 0 and multiplies by inv = 0: q = 0, exact zeros.
  - a block holding NaN or +-Inf stores NaN as its scale and q = 0: it decodes to NaN for the whole block
    (ccoll's non-finite rule, ccoll/codecs/base.py).
  Every fp32 operation is a single IEEE round-to-nearest operation in a fixed order, so the GPU, the host
  build and the torch backend produce the same bytes. On the device each one is an explicit inline-PTX
  instruction without .ftz (cq_add, cq_sub, cq_mul, cq_div, cq_rint, cq_floor, cq_clamp): the compiler can
  neither contract it into an FMA nor flush subnormals, whatever -ftz / -fmad flags the module is built
  with (CuPy appends -ftz=true). Comparisons that could see a subnormal (absmax, scale > 0, finiteness)
  are done on the bit patterns.

Batches of rows (encode_rows / decode_rows; ccoll/codecs/base.py): a 1-D tensor of numel values is read
as `rows` rows of row_numel values, zero past its end; row i is one payload of row_numel values (layout
below) at byte i * row_nbytes of a [rows, row_nbytes] buffer. Error feedback (optional, fp32 residuals r of
rows * row_numel values): c = x + r in fp32, rounded to the input type, is what is encoded; then
r = c - decode (the decode rounded to the input type), non-finite residuals -> 0, residuals of padding
(index >= numel) -> 0. The stochastic index of element j of row i is i * row_numel + j.

Optional rotate=hadamard (all formats): each whole block is replaced by H D x before quantizing and
rotated back after decoding (CqRot below); decode_sum rotates each payload's block back before adding it.
It is a compile-time choice: every op has a plain kernel and `_rot_w<W>` kernels (CqEncodeRows<.., ROT>, the
decodes' block_rotated; W = q words per lane, CqRotated), so the plain kernels contain no rotation code, no
per-lane block arrays and no stack, and the rotating ones hold a lane's words in registers, no stack either.
On a GPU the two sets are separate NVRTC modules ("quant" and "quant_rot", CCOLL_QUANT_KERNELS below): the
_rot module is compiled (or loaded from the bundle) on the first rotate=hadamard launch only.

Payload layout (little-endian), numel values, nblocks = ceil(numel / B):
  [scales: nblocks fp32 (int) or E8M0 bytes (fp8), zero-padded to a multiple of 16 bytes]
  [q: numel BITS-bit two's-complement integers packed in element order -- int8: one byte each; int4: two
      per byte, the even element in the low nibble -- zero-padded to a multiple of 16 bytes]
  B is a multiple of 8, so every block starts on a 32-bit word of the q section (one word = G = 32/BITS
  values) and no two blocks share a byte or a word; the 16-byte padding keeps every row of a [p, nbytes]
  batch of payloads 16-byte aligned for vector loads, and lets the last word be written whole.

Thread mapping (GPU; each `__global__` only maps threads to work, the per-block / per-word functions are
shared with the host build):
  encode_rows: a "team" of T lanes (a power of two <= 32, so teams never straddle a warp) per quant block of
          any row (grid over rows * blocks_per_row blocks); lane l handles the block's whole 32-bit q words
          l, l + T, ... (G consecutive inputs each, one 16- or 8-byte vector load when aligned; a whole
          block's lane takes 16-byte chunks of two 8-byte words instead: CqEncodeRows::V). Plain kernels: T
          from ccoll/codecs/quant_kernels.py _encode_team -- up to 8 words per lane, so the per-block work
          (indices, team max, scale) is spread over up to 32 values (int4: 64), but at least 64 bytes of
          input per team load instruction, i.e. T >= 4 lanes of 16-byte loads (int8 block 256: T = 8 for
          f32 and bf16, from its 64 words; fp8 block 32: T = 4, two words per lane). Rotate
          kernels: T = min(32, next_pow2(B / G)). Two passes: absmax (team max by __shfl_xor_sync), then
          quantize and store, reading the words again (L1/L2-resident). A whole block (B values long,
          before numel, vector-aligned input and residuals, finite) takes a path without per-word count
          and per-value finite tests, feedback a template parameter; anything else the general path.
          Coalesced: consecutive lanes touch consecutive words, consecutive teams consecutive blocks.
  decode_rows: one thread per 16-byte q group (4 q words: 16 values, int4 32) of any row: one 16-byte
          vector load (a warp: 512 contiguous bytes, 4 full lines), then per word decode and store (one
          vector store of its G outputs when aligned); pure streaming.
  decode_sum: one thread per q group of 16 values of the output (int8 / fp8 16 bytes; int4 8 bytes: a
          16-byte group's 32 accumulators left room for one row's loads at 64 registers, two rows spilled
          52 B), looping over the p payload rows in order 0..p-1; the group loads of 2 rows (int4 4) are
          issued before any of them is decoded (CqDecodeSum::group), 32 bytes of q per thread in flight.
  decode_rows and decode_sum take a path without per-word tests for a whole group (one scale, every word
  in the output) whose scale passes F::decodes_normal, and round with Tr::Normal there (bf16: Veltkamp's
  split, kernels/common.cuh; fp16: the conversion instructions without the NaN select); any other group
  (partial, straddling blocks, a tiny, huge or non-finite block's scale, fp8) the general per-word path.
  Payload pointers that are not 16-byte aligned (the codecs never pass one: ccoll/codecs/buffers.py
  copies them) fall back to word loads; outputs that are not aligned, to element stores.
  _rot_w<W> kernels: one team per block for every op; the team holds the whole block in registers (CqRot),
  W q words per lane (1 for blocks of <= 32 words, else a team of 32 with words / 32 each: CqRotated).

Roofline (plain kernels; an estimate from the code and ptxas -v, not a measurement: no GPU yet). `make
kernels-check` prints registers / local memory per kernel and fails any quant kernel with local memory and
a plain one above 64 registers (ccoll/kernels/check.py RESOURCE_LIMITS). sm_80 / sm_90: encode_rows 60..64
registers (capped by __launch_bounds__(256, 4): 4 CTAs = 32 warps per SM, 50% occupancy), decode_sum
54..64 (also capped: 32 warps), decode_rows 44..47 (5 CTAs: 40 warps); 0 bytes local everywhere.
  H200: 132 SMs, ~1.98 GHz, 4.8 TB/s HBM = ~18 bytes per clock per SM; ~800 ns loaded latency, so by
    Little's law ~29 KB per SM must be in flight to stream at full bandwidth (what one thread has in
    flight is its loads: stores retire into L2 without waiting).
  Bytes per value (q payload, + 4/B or 1/B scale bytes; feedback adds 8 B: residual read + write):
    encode f32 4 + 1 = 5 B (int4: 4.5), bf16/f16 2 + 1 = 3 B (int4: 2.5); decode_rows 1 + 4 / 1 + 2 B;
    decode_sum p + 4 B. A copy of the same dtype moves 8 B (f32) / 4 B (bf16) per value, so ">= 75% of copy
    bandwidth" means >= 3.6 TB/s of these bytes.
  Transactions per warp instruction (sector = 32 B, line = 128 B):
    encode: input loads 32 lanes x 16 B (teams of 8: 4 whole lines; teams of 4, e.g. f32 fp8 block 32:
      64 B of each of 8 lines, the team's next load the other halves; every sector whole); int4
      f32 a lane's two 16-B halves of a word are two instructions over the same sectors (the second an L1
      hit); bf16/f16 int8 / fp8 whole blocks 16-B loads of two words (4 lines), other blocks 8-B loads of
      one (2 lines). q stores 32 x 4 B consecutive words = 1 whole line (bf16 int8: two 4-B stores per lane).
    decode_rows / decode_sum: q loads 32 x 16 B = 512 contiguous bytes (4 lines, was 1 line of 4-B words;
      int4 decode_sum 32 x 8 B = 2 lines).
      Output stores: a thread's 16 outputs are contiguous, so one store instruction covers half of each of
      32 sectors (f32 int8 / fp8: lanes 64 B apart; bf16 8-B stores: a quarter); the group's next stores
      fill the rest before L2 writes back, so HBM sees whole sectors, but L1 -> L2 carries 2x (4x) the
      store requests of a lane-contiguous layout. L2 bandwidth is several times HBM's, so this is not
      expected to bind; it is the first thing to measure on a device (the fix: exchange the group's
      words across lanes with shuffles before decoding, so each store instruction is contiguous).
  Bytes in flight per SM (loads): decode_rows 40 warps x 32 x 16 B = 20 KB of q (the q share of its
    traffic is 1/5 (f32) to 1/3 (bf16), needing ~6..10 KB: met 2..3x; the 4-B word loads before gave
    ~6 KB, the edge); decode_sum 32 warps x 32 x 32 B (2 rows x 16 B; int4 4 x 8 B) = 32 KB: met. Before
    (5622825) it was 16 KB, about 55% of the ~29 KB: the compiler's unrolled row loop issued each row's
    loads after the previous row's branches (read off the SASS), and int4 had one row of 16 B; encode
    (pass 0 issues two 16-B loads before using either) 32 warps x 32 x 32 B = 32 KB for f32 and, with
    two-word loads, for bf16 whole blocks too (its reads are 2/3 of the traffic: met).
  Instructions per value, counted on the SASS (sm_90, NVRTC 13 with the codec's options + -lineinfo,
    `nvdisasm -c -gi`: every instruction carries its inline chain of source lines), by hand along the path
    of the common case -- encode_rows int8, f32, block 256, nearest, no feedback, aligned, whole block,
    blocks per row a power of two -- every instruction one warp issue slot (BSSY / BSYNC included; all
    lanes of a warp are in step, so a branch one team lane takes costs every lane); the warp's set-up
    before its unit loop left out. The plain encode's team (ccoll/codecs/quant_kernels.py _encode_team):
    8 lanes for this block, so 8 q words = 32 values per lane per block.
      per block and lane ~944: unit set-up (row / block / start / len, the whole-block test) ~66; dispatch
      ~11; pass 0 (absmax_whole, 2 LDG.128 in flight per lane) 4 pairs x 27 + 3 = 111; team max (3 active
      shuffle steps of 6, 2 skipped of 2) ~24; params (one div.rn) ~30; payload / scale store (lane 0's
      branch costs the warp) ~20; dispatch ~11; pass 1 (encode_whole: reload, quantize, store) 8 words
      x 82 = 656; loop turn ~15.
      A word of pass 1: address + LDG.128 + stochastic test 12, 4 values x ~15 (MUFU.RCP, FCHK, 5 FFMA,
      BRA, BSSY / BSYNC: div.rn's fast path, redone per value; FRND, 2 FMNMX, F2I) + pack 1, the q
      store + loop 9.
      = ~29.5 instructions per value: ~15 the quantization, ~5 the word's load / store, ~9 per-block
      overhead spread over 32 values per lane.
    Before the whole-block path and the 8-lane teams (d5f96d6, a team of 32 and 2 words per lane): 592
    per block and lane for 8 values = ~74 per value. Budget: 33e12 thread-instructions/s issue (132 SMs
    x 128 lanes x ~1.98 GHz; the integer ALU pipe has half that, and ALU instructions -- ISETP, LOP3,
    SHF, IADD3, SEL, LEA -- are under half of this kernel's, so issue is the ceiling;
    tools/sass_estimate.py's zfp figures assume the ALU pipe alone, zfp being all integer code), ~4.2e12/s
    conversions and MUFU (MUFU.RCP, FRND, F2I: 3 per value here, ~1.4e12 values/s, not binding);
    streaming 5 B/value at 4.8 TB/s is 0.96e12 values/s: ~35 instructions per value for 100%, ~46 for 75%.
  Expected (int8 f32 encode, from the count): ~1.1e12 values/s at full issue, above the 0.96e12 that
    HBM allows, so memory-bound by construction: issue 18's >= 75% of copy bandwidth is met on paper at
    full issue efficiency (to be measured: `make gpu-check`). Two more paths counted the same way
    (per word from the SASS; the per-block parts taken from the f32 count where the code is the same):
    - bf16 int8 block 256: a lane's unit is a 16-byte load of two words (V = 2), a team of 8, 4 loads = 32
      values per lane: a chunk of pass 1 (8 values) 152 (load 10, two words' quantization ~62 each, stores
      and loop ~18; the bf16 -> f32 conversion is one IMAD per value), pass 0 45 per pair of chunks; ~885
      per block and lane = ~28 per value against a budget of ~21 (100%) / ~28 (75%) for its ~3 B per value:
      ~1.2e12 values/s = ~75% of copy bandwidth at full issue -- on the line, no margin. (With 8-byte loads
      and a team of 16, 16 values per lane: 82 per word, ~36 per value, ~58%.) f16: the hardware conversions
      (kernels/common.cuh; whole blocks skip the NaN select: CqF16Ieee), one HADD2.F32 per value where bf16
      has one IMAD, so about bf16's ~28 is expected; not counted on the SASS. Before (integer
      conversions, ~10 / ~20 instructions with branches per value): sm_90 static SASS of int8 encode_rows_f16
      9376 instructions / 1089 BRA, now 4944 / 275 (bf16: 4288 / 259).
    - int4 f32 block 64 with error feedback (hybrid.yaml's DP codec; a team of 4: 2 words = 16 values
      per lane): a word of 8 values 234 in pass 1 (load 24, quantize ~131, decode + residual store 79),
      36 in pass 0 (4 LDG.128: x and residuals); ~727 per block and lane = ~45 per value against a
      budget of ~86 (100%) for its ~12.6 B per value (x 4, residual read + write 8, q 0.5): memory-bound
      with ~2x headroom.
    The counts above are of the x / scale encode (a correctly rounded division per value; 85f2b92). Now
    (x * inv, one division per block: "Algorithm" above), walked on the SASS along the nearest, no-key path
    of pass 1 (the loop of encode_whole, the stochastic key's and div.rn's slow-path branches not taken; the
    x * inv column: `python tools/sass_loop.py --encode ccoll_int8_encode_rows_f32 ...`):
      | path (pass 1)                              | x / scale | x * inv | per value, whole block and lane  |
      | int8 f32, a word of 4 values               | 82        | 45      | ~29.5 -> ~21 (budget 35 for 100%) |
      | int8 bf16, a chunk of 8 values             | 158       | 84      | ~28 -> ~19 (budget 21 for 100%)   |
      | int4 f32 + feedback, a word of 8 values    | 232       | 157     | ~45 -> ~38 (budget 86)            |
    (per value: the per-block parts as counted above; params' div.rn, ~30 with its range test, became
    CqInt::div_qmax (3 FMA-pipe instructions) and cq_recip_normal (~12), both correctly rounded, so the
    per-block part is not larger). So bf16 int8 encode -- TP and PP activations under hybrid.yaml -- goes
    from "on the line" for 75% to ~100% of copy bandwidth at full issue, and int8 f32 has ~1.6x headroom.
    Static sm_90 SASS of the plain encode_rows kernels (NVRTC 13, nvdisasm as in tools/sass_loop.py):
    int8 f32 3216 -> 2664 instructions, FCHK 33 -> 0, CALL (div.rn's slow path) 37 -> 4 (the 64-bit
    division and the divergent-shuffle fallbacks left); int8 bf16 4296 -> 3592 (FCHK 49 -> 0); int4 f32
    3648 -> 2912 (FCHK 49 -> 0).
    - fp8's MX block 32 is the weak one: 8 words per block. With a whole line per team load (before)
      f32 had a team of 8 with 1 word = 4 values per lane: ~162 per block and lane (int8's per-block parts
      above with fp8's params, ~15, for the division), pass 0 one load 16, pass 1 one word 77 (a fp8 word
      of pass 1 on the SASS, nearest, no feedback: sass_loop.py --encode) = ~255 over 4 values, ~64 per value (~55% of copy at
      full issue). With half a line per team load (ccoll/codecs/quant_kernels.py TEAM_LOAD_NBYTES): a
      team of 4 with 2 words per lane, ~156 (one shuffle step fewer) + a pass-0 pair 27 + two words 154 =
      ~337 over 8 values, ~42 per value (~83%) -- the >= 75% target on paper, at ~0.45 L1 wavefronts per
      clock (quant_kernels.py). bf16 already had a team of 4 (one two-word chunk = 8 values per lane).
    What would lift fp8 further: a team holding several blocks' words side by side (an absmax per block in
    registers, the team maxes interleaved) so that the per-block overhead is spread over 32 values per
    lane while each team load stays a line. Not done. Stochastic
    adds roughly 20 per value (the hash, read off the same SASS).
    decode_rows int8, counted the same way (a thread per 16-byte q group = 16 values; one scale per group,
    aligned, a whole group, rows > 1 with groups per row not a power of two: a 32-bit division). Before
    the whole-group path and the byte permutes (counted with the I2F conversions):
    - f32: loop head 5, row division 31, addresses 25, q load 21 (the scalar and vector loads are both
      issued, one predicated off), scale index 3 + load 11, then per word 19..24 (3 I2F.S8 + 1 I2FP, 4 FMUL,
      byte extracts, one STG.128) = 193 per group, ~12 per value (~10.5 with a power-of-two row of groups)
      against a budget of ~34 (100%) for its 5 B per value: memory-bound, ~2.8x headroom.
    - bf16: per word ~51 (the f32 -> bf16 rounding with its NaN test, ~7.5 per value, and an 8-byte store),
      ~316 per group = ~20 per value against ~21 (100%) / ~27 (75%) for 3 B per value: no margin.
    Now (nvcc 13 sm_90 SASS of the whole-group path, the same head of ~96): per value one PRMT (the q byte
    into the bits of 1.5 * 2^23, after one XOR per word: CqInt::decode_word), one FADD, one FMUL; bf16
    adds the split's three FMA-pipe instructions and half a PRMT to pack two bf16 (cq_pack2). bf16: 129
    per group after the head, ~222 = ~14 per value against ~21 (100%): memory-bound, ~1.5x headroom; f32
    ~9.5 per value.
    decode_sum, counted on the SASS (NVRTC 13, sm_90, `python tools/sass_loop.py
    ccoll_int8_decode_sum_bf16`: one turn of the row loop, two rows of a group = 32 value-rows, along the
    fall-through of every conditional branch; "before" by the same walk on nvcc 13's SASS of 5622825,
    taking the one-scale branches):
      | input | before (row loop unrolled by the compiler) | now (CqDecodeSum::group, whole groups)   |
      | f32   | 328 = ~10.3 per value-row                  | 200 = ~6.3                               |
      | bf16  | 556 = ~17.4 (integer rounding + NaN test)  | 297 = ~9.3 (the split: 3 FMA-pipe)       |
      | f16   | 376 = ~11.8                                | 248 = ~7.8 (2 conversions per value-row) |
      int4 (one 16-byte row of 32 values per turn before, four 8-byte rows of 16 now, `--values 64`): bf16
      ~503 per 32 = ~15.7 -> 582 per 64 = ~9.1; f32 390 per 64 = ~6.1. An int4 value's field is one
      PRMT after two masks and a shift per word (the byte permute with 1.5 * 2^23 as its first operand:
      the other order put the selector in a register, one more IMAD per value at the register cap).
    The budget per value-row is ~33e12 / (4.8e12 / bytes): ~1 B of q per value-row plus the 4 B fp32
    output over p rows, so ~7 issue slots for large p, ~10 at p = 8, ~20 at p = 2: f32 memory-bound, bf16
    ~75% at large p and memory-bound from p ~ 8 down (before: ~40% and ~67% at large p). I2F: the int ->
    fp32 conversion is no conversion-pipe instruction (a GPU's I2F runs at a quarter of the FMA rate,
    ~4.2e12/s on an H200, below the ~4.8e12 value-rows/s HBM allows); the static I2F left (sm_90 int8
    decode_sum_f32 22, decode_rows 13) are the 32-bit divisions' set-up. Tried and not kept:
    cvt.rn.bf16.f32 for the bf16 rounding (F2F.BF16.F32, one conversion-pipe instruction per value and
    row). fp16 keeps its conversion instructions (its integer code is ~10..20 branchy instructions each
    way): per value-row half an F2FP.F16.F32.PACK_AB and one HADD2.F32. If both ran on the quarter-rate
    conversion pipe, fp16 decode_sum would be conversion-bound near ~60%; the F2FP alone is not binding.
    Which pipe HADD2.F32 takes is not documented: a device measurement decides.
    fp8 decodes: a code becomes fp32 by placing its bits at fp32's and one FMUL by 2^(127 - BIAS)
    (CqFp8::value; exact, subnormal codes included), where a subnormal code was a branch and an I2F.
    Static sm_90 SASS (NVRTC 13): e4m3 decode_sum_f32 3608 -> 2512 instructions, I2F 118 -> 22 (the
    divisions' set-up), BRA 284 -> 119; decode_rows_f32 1472 -> 1128 (I2F 45 -> 13); e5m2 decode_sum_f32
    3992 -> 2928 (BRA 404 -> 212). Not walked per value-row: tools/sass_loop.py's fall-through rule does
    not come back to the loop head through the NaN-code tests.
    Rotate kernels (_rot_w<W>, sm_90 from the check): no local memory; registers grow with the words a
    lane holds: W = 1 45..70, W = 2 56..104, W = 4 80..152, W = 8 120..168 (encode with its feedback and
    stochastic paths the most). One kernel per W because with W a run-time count the lane's arrays were a
    128..256-byte stack frame (95..167 registers), every butterfly stage a round trip through local
    memory; a single kernel switching over W would hold W = 8's registers for every block size, and a cap
    of 128 registers spilled up to 1.7 KB. An estimate, not measured: a lane's W words of loads are in
    flight together (sm_90 SASS of int8 encode_rows_rot_w8_f32, decode_rows_rot_w8_f32 and int4
    encode_rows_rot_w4_bf16: every LDG comes before the first SHFL, no LDL / STL), so an SM has
    ~9..48 KB of input in flight (128-thread CTAs, ccoll/kernels/call.py ROT_THREADS; W = 8: 12 warps at
    155..168 registers, 32 values a lane, 48 KB f32 / 24 KB bf16 -- with 256-thread CTAs one CTA, 8 warps;
    int8 W = 1: 36 warps at 56 registers, 4 values a lane, 18 KB f32 / 9 KB bf16) against the ~29 KB that
    streaming at HBM rate needs,
    and a block of B values costs each value log2(B) butterfly adds (log2(team) of them after a shuffle)
    on top of the plain path's ~20..30 instructions: not streaming kernels, but no longer bound by
    local-memory traffic.
  Not done: 16-byte q groups per lane in encode_rows. Tried (a lane per group of 4 words, one 16-B q
    store): holding a group's 16 (int4 32) values across the team max needs > 64 registers, and even
    re-reading them per word (two passes, q words kept through selects, residuals in a third pass) spills
    8..44 B at the 64-register cap on int4 and on some f16 / int8 kernels (ptxas 13, sm_80 / sm_90). The
    q store is 1/5 of encode's bytes and a warp's 4-B word stores already fill whole lines, so the gain
    would be fewer store instructions only.

Host (-DCCOLL_HOST, the "emulated" backend): extern "C" ccoll_host_* entry points loop over blocks / words
with OpenMP and call exactly the same per-word functions; only the warp reduction differs (a serial max,
which is exact: max is associative). The int formats' unrotated ops take the host's own streaming paths
(bottom of this file, "the CPU's streaming paths": the same fp32 operations as loops the compiler
vectorises, whole blocks; anything else falls back to the per-block functions), which make the host build
the default CPU backend of int8 / int4 (ccoll/codecs/quant.py _cpu_backend).
*/
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#endif
#include "common.cuh"

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

// IEEE fp32 operations, each rounded once to nearest even, never fused, subnormals kept (see the header):
// on the device one PTX instruction without .ftz, on the host the C operator / libm function
#ifdef __CUDA_ARCH__
#define CQ_FP32_BINARY(NAME, PTX, OP)                                                 \
    CQ_HD float NAME(float a, float b) {                                              \
        float r;                                                                      \
        asm(PTX " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                           \
        return r;                                                                     \
    }
#define CQ_FP32_UNARY(NAME, PTX, LIBM)                                                \
    CQ_HD float NAME(float a) {                                                       \
        float r;                                                                      \
        asm(PTX " %0, %1;" : "=f"(r) : "f"(a));                                       \
        return r;                                                                     \
    }
#else
#define CQ_FP32_BINARY(NAME, PTX, OP) \
    CQ_HD float NAME(float a, float b) { return a OP b; }
#define CQ_FP32_UNARY(NAME, PTX, LIBM) \
    CQ_HD float NAME(float a) { return LIBM(a); }
#endif
CQ_FP32_BINARY(cq_add, "add.rn.f32", +)
CQ_FP32_BINARY(cq_sub, "sub.rn.f32", -)
CQ_FP32_BINARY(cq_mul, "mul.rn.f32", *)
CQ_FP32_BINARY(cq_div, "div.rn.f32", /)
CQ_FP32_UNARY(cq_rint, "cvt.rni.f32.f32", rintf)  // to the nearest integer, ties to even
CQ_FP32_UNARY(cq_floor, "cvt.rmi.f32.f32", floorf)

// a * b + c rounded once (fused multiply-add: fma.rn.f32 without .ftz; the host's fmaf is IEEE's fma too)
CQ_HD float cq_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
#else
    return __builtin_fmaf(a, b, c);
#endif
}

// 1 / s correctly rounded (= cq_div(1.0f, s)) for 2^-126 <= s < 2^126, where 1 / s is normal: the int
// scale's reciprocal, once per block. Why not div.rn: ~30 instructions with a range test and a slow-path
// CALL, against ~12 branch-free FMA-pipe ones here (per block, beside ~20 per value). A first guess from the
// exponent bits (~12% off), four Newton steps y += y (1 - s y) in fused multiply-adds (the error squares
// each step, to within an ulp), and the one case the last step rounds the wrong way: an all-ones
// significand, whose reciprocal lies just above a midpoint and comes out one ulp low. Every operation is
// IEEE (no approximate instruction), so the GPU, simt and host builds agree bit for bit; tests/unit/
// test_simt.py compares it with division on every float of [2^-126, 2^-125), [1, 2) and [2^125, 2^126).
CQ_HD float cq_recip_normal(float s) {
    const cq_u32 bits = cq_f2u(s);
    const float neg_s = cq_u2f(bits ^ 0x80000000u);  // a sign flip, not neg.f32 (which -ftz=true would flush)
    float y = cq_u2f(0x7EF311C7u - bits);
#pragma unroll
    for (int i = 0; i < 4; ++i) y = cq_fma(y, cq_fma(neg_s, y, 1.0f), y);
    return (bits & 0x7fffffu) == 0x7fffffu ? cq_u2f(cq_f2u(y) + 1u) : y;
}

// an integer-valued float as int (a plain (int) cast is a .ftz conversion under -ftz)
CQ_HD int cq_f2i(float a) {
#ifdef __CUDA_ARCH__
    int r;
    asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
#else
    return (int)a;
#endif
}

// min(max(a, -m), m) for non-NaN a
CQ_HD float cq_clamp(float a, float m) {
#ifdef __CUDA_ARCH__
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(-m));
    asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(r), "f"(m));
    return r;
#else
    return fminf(fmaxf(a, -m), m);
#endif
}

#define CQ_INF_BITS 0x7f800000u
#define CQ_NAN_BITS 0x7fc00000u

// decode_sum's outputs are fp32 sums: a NaN there takes whatever bits the adder's NaN rule gives (x86
// keeps the operand's sign and payload, PTX add.f32 returns its own canonical NaN), so the sum is
// stored with one NaN pattern, CQ_NAN_BITS, on every backend
CQ_HD float cq_canonical_nan(float a) {
    return (cq_f2u(a) & 0x7fffffffu) > 0x7f800000u ? cq_u2f(CQ_NAN_BITS) : a;
}
#define CQ_FLT_MAX_BITS 0x7f7fffffu
#define CQ_FLT_MIN_NORMAL_BITS 0x00800000u

// ------------------------------------------------------------------------------------------------
// element types: conversion to / from fp32 in kernels/common.cuh (integer code, torch's CPU semantics,
// one NaN pattern per format)

// round(f): f rounded to the type and widened back, to_f(from_f(f)): what a receiver of that type sees.
// ``Whole``: conversions exact for every non-NaN value, for code where a NaN's bits do not matter: the
// whole-block encode path (CqEncodeRows::load_whole only tests its values for NaN; a block with one takes the
// general path and converts again) and decode_sum's per-row rounding (a NaN makes the sum NaN, stored
// canonical).
// ``Normal``: conversions exact for +-0 and for normal values below 2^111 -- every value a block decodes to
// where F::decodes_normal(scale) holds -- with a cheaper rounding where one exists: bf16 Veltkamp's split
// (kernels/common.cuh, three FMA-pipe instructions instead of ~7 integer ones), fp16 the instructions
// without the NaN select. The decodes test the scale once per word and take it or the general code.

struct CqF32 {
    typedef cq_u32 storage;
    typedef CqF32 Whole;
    typedef CqF32 Normal;
    static CQ_HD float to_f(storage b) { return cq_u2f(b); }
    static CQ_HD storage from_f(float f) { return cq_f2u(f); }
    static CQ_HD float round(float f) { return f; }
};

struct CqBF16Normal {  // for +-0 and normal values below 2^111 only (see above)
    typedef cq_u16 storage;
    typedef CqBF16Normal Whole;
    typedef CqBF16Normal Normal;
    static CQ_HD float round(float f) { return ccoll_conv::f32_round_bf16_normal(f); }
    static CQ_HD float to_f(storage b) { return cq_u2f(ccoll_conv::bf16_to_f32(b)); }
    static CQ_HD storage from_f(float f) { return (storage)(cq_f2u(round(f)) >> 16); }
};

struct CqBF16 {
    typedef cq_u16 storage;
    typedef CqBF16 Whole;
    typedef CqBF16Normal Normal;
    static CQ_HD float to_f(storage b) { return cq_u2f(ccoll_conv::bf16_to_f32(b)); }
    static CQ_HD storage from_f(float f) { return ccoll_conv::f32_to_bf16(cq_f2u(f)); }
    static CQ_HD float round(float f) { return to_f(from_f(f)); }
};

struct CqF16Ieee {  // the conversion instructions without the NaN select: ~6 instructions per value less
    typedef cq_u16 storage;
    typedef CqF16Ieee Whole;
    typedef CqF16Ieee Normal;
    static CQ_HD float to_f(storage h) { return cq_u2f(ccoll_conv::f16_to_f32_ieee(h)); }
    static CQ_HD storage from_f(float f) { return ccoll_conv::f32_to_f16_ieee(cq_f2u(f)); }
    static CQ_HD float round(float f) { return to_f(from_f(f)); }
};

struct CqF16 {
    typedef cq_u16 storage;
    typedef CqF16Ieee Whole;
    typedef CqF16Ieee Normal;
    static CQ_HD float to_f(storage h) { return cq_u2f(ccoll_conv::f16_to_f32(h)); }
    static CQ_HD storage from_f(float f) { return ccoll_conv::f32_to_f16(cq_f2u(f)); }
    static CQ_HD float round(float f) { return to_f(from_f(f)); }
};

// ------------------------------------------------------------------------------------------------
// layout

CQ_HD cq_i64 cq_round16(cq_i64 n) { return (n + 15) & ~(cq_i64)15; }
CQ_HD cq_i64 cq_nblocks(cq_i64 numel, cq_i64 block) { return (numel + block - 1) / block; }
template <class F>
CQ_HD cq_i64 cq_scale_nbytes(cq_i64 numel, cq_i64 block) { return cq_round16(F::SCALE_BYTES * cq_nblocks(numel, block)); }
template <class F>
CQ_HD cq_i64 cq_q_nbytes(cq_i64 numel) { return cq_round16((numel * F::BITS + 7) / 8); }

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

// one key per (seed, 2^32-element segment)
CQ_HD cq_u32 cq_stream_key(cq_u32 seed, cq_u64 index) {
    return cq_mix32(seed ^ cq_mix32((cq_u32)(index >> 32) + 0x9e3779b9u));
}

// u in [0, 1): 24 random bits, exact in fp32
CQ_HD float cq_uniform(cq_u32 key, cq_u64 index) {
    const cq_u32 h = cq_mix32(cq_mix32((cq_u32)index ^ key) + key);
    return cq_mul((float)(h >> 8), 5.9604644775390625e-08f);
}

// ------------------------------------------------------------------------------------------------
// per-block and per-word logic (shared by the GPU kernels and the host entry points)

// |x| as a bit pattern: ordered like |x| for every x, NaN above +Inf, so the max over a block is exact,
// needs no fp32 operation and "absmax is not finite" is one comparison
CQ_HD cq_u32 cq_abs_bits(float x) { return cq_f2u(x) & 0x7fffffffu; }

struct CqBlock {
    float scale;  // decode multiplier: y = value(q) * scale (NaN for a non-finite block)
    float enc;    // what x is multiplied by: int fl(1 / scale) (0 for an all-zero block), fp8 2^-e (exact)
    cq_u32 code;  // the stored scale: fp32 bits (int) or the E8M0 byte (fp8)
    bool finite;
};

// Element formats: the one algorithm above is written against these traits (BITS, G values per 32-bit q
// word, SCALE_BYTES per block, params / quantize / value, scale load / store).

// "int8" / "int4": symmetric absmax, one fp32 scale per block, q in [-qmax, qmax] two's complement
template <int BITS_>
struct CqInt {
    static constexpr int BITS = BITS_;
    static constexpr int G = 32 / BITS;                 // values per 32-bit q word
    static constexpr int QMAX = (1 << (BITS - 1)) - 1;  // 127 or 7
    static constexpr int SCALE_BYTES = 4;

    // a / qmax correctly rounded (= cq_div(a, qmax)) for every finite a >= 0 in 3 instructions instead of
    // div.rn's ~30 with its slow-path CALL: y = a fl(1 / qmax), then one Markstein correction
    // y + (a - qmax y) / qmax in fused multiply-adds. Checked against division on every finite float a >= 0
    // for both qmax (a C loop over 2^31 floats, ~20 s each; not in the suite, where test_simt.py checks
    // the subnormals and the binades [2^-126, 2^-125), [1, 2) and [2^127, 2^128)).
    static CQ_HD float div_qmax(float a) {
        constexpr float INV_QMAX = 1.0f / (float)QMAX;  // IEEE division at compile time: correctly rounded
        const float y = cq_mul(a, INV_QMAX);
        return cq_fma(cq_fma(-(float)QMAX, y, a), INV_QMAX, y);
    }
    static CQ_HD CqBlock params(cq_u32 absmax_bits) {
        const float qmax = (float)QMAX;
        CqBlock b;
        b.finite = absmax_bits <= CQ_FLT_MAX_BITS;
        if (!b.finite) {
            b.scale = cq_u2f(CQ_NAN_BITS);
            b.enc = 0.0f;
        } else {
            b.scale = div_qmax(cq_u2f(absmax_bits));
            // absmax within ~1 ulp of FLT_MAX: qmax * scale would decode to Inf; take the next smaller scale
            // (the clamp then maps absmax to qmax)
            if (cq_f2u(cq_mul(b.scale, qmax)) > CQ_FLT_MAX_BITS) b.scale = cq_u2f(cq_f2u(b.scale) - 1u);
            // a tiny block (absmax < qmax 2^-126): the smallest normal scale, so 1 / scale is finite (<= 2^126)
            if (absmax_bits != 0u && cq_f2u(b.scale) < CQ_FLT_MIN_NORMAL_BITS) b.scale = cq_u2f(CQ_FLT_MIN_NORMAL_BITS);
            // one correctly rounded reciprocal per block; an all-zero block multiplies by 0
            b.enc = absmax_bits != 0u ? cq_recip_normal(b.scale) : 0.0f;  // scale in [2^-126, 2^126)
        }
        b.code = cq_f2u(b.scale);
        return b;
    }
    // the BITS-bit field of x
    static CQ_HD cq_u32 quantize(float x, const CqBlock& b, bool stochastic, float u) {
        if (!b.finite) return 0u;
        float v = cq_mul(x, b.enc);
        v = stochastic ? cq_floor(cq_add(v, u)) : cq_rint(v);
        return (cq_u32)cq_f2i(cq_clamp(v, (float)QMAX)) & ((1u << BITS) - 1u);
    }
    // the G values of q word w: (float)q * scale. (float)q without a conversion instruction: a GPU's I2F
    // runs on its conversion pipe at a quarter of the FMA rate, which bounded decode_sum (one per value and
    // payload row). One XOR per word makes every field q + 2^(BITS-1) in [0, 2^BITS); that field ORed into
    // the bits of 1.5 * 2^23 is the float 1.5 * 2^23 + q + 2^(BITS-1) (one unit per mantissa step), and one
    // FADD takes the constant off: q exactly. Per value one byte permute (int4: after two masks and a
    // shift per word), one FADD and the FMUL.
    static CQ_HD void decode_word(cq_u32 w, float scale, float* v) {
        constexpr cq_u32 MASK = (1u << BITS) - 1u;
        const cq_u32 biased = w ^ (0xFFFFFFFFu / MASK << (BITS - 1));  // every field + 2^(BITS-1)
#pragma unroll
        for (int k = 0; k < G; ++k) {
            // int8: byte k; int4: byte k / 2 of the low (k even) or high nibbles, spread to bytes once per word
            const cq_u32 bits = BITS == 8 ? ccoll_conv::byte_perm(biased, 0x4B400000u, 0x7650u | k)
                                          : ccoll_conv::byte_perm(0x4B400000u, k % 2 ? (biased >> 4) & 0x0F0F0F0Fu
                                                                                          : biased & 0x0F0F0F0Fu,
                                                                  0x3214u + k / 2);
            v[k] = cq_mul(cq_sub(cq_u2f(bits), 12582912.0f + (float)(1u << (BITS - 1))), scale);
        }
    }
    // every value a block with this scale decodes to is +-0 or normal below 2^111 (|q| <= 2^(BITS-1), so
    // |q| * scale lies in [scale, 2^(BITS-1+104))), so its decodes may round with Tr::Normal; false for a
    // NaN (non-finite block), negative or huge scale, and for a subnormal one (a tiny block)
    static CQ_HD bool decodes_normal(float scale) {
        return cq_f2u(scale) - 0x00800000u < 0x73800000u - 0x00800000u;  // 2^-126 <= scale < 2^104
    }
    static CQ_HD float load_scale(const cq_u8* payload, cq_i64 b) { return reinterpret_cast<const float*>(payload)[b]; }
    static CQ_HD void store_scale(cq_u8* payload, cq_i64 b, const CqBlock& p) {
        reinterpret_cast<cq_u32*>(payload)[b] = p.code;
    }
};

// "fp8": MX-style block scaling (OCP Microscaling): one E8M0 byte per block (the scale 2^e, e = byte - 127,
// byte 255 = NaN) and one fp8 element per value, E4M3 ("fn": no Inf, max 448 = 1.75 * 2^8) or E5M2 (max
// 57344 = 1.75 * 2^15). e is the smallest exponent with absmax <= fmax * 2^e (the "round up" scale of the
// hardware MX conversions), clamped to [-127, 127 - EMAX], so no element of the block saturates (unless
// absmax > 1.75 * 2^127); x * 2^-e is exact (2^-e is a normal fp32 for e in [-127, 119]), then clamped to [-fmax, fmax] (saturating) and rounded
// to the element format, to nearest even, subnormals included -- by integer operations on the fp32 bits.
template <int EBITS, int MBITS, int EMAX>
struct CqFp8 {
    static constexpr int BITS = 8;
    static constexpr int G = 4;
    static constexpr int SCALE_BYTES = 1;
    static constexpr int BIAS = (1 << (EBITS - 1)) - 1;  // 7 (e4m3) or 15 (e5m2)
    static constexpr cq_u32 FMAX_BITS = ((cq_u32)(EMAX + 127) << 23) | 0x600000u;  // 1.75 * 2^EMAX

    static CQ_HD CqBlock params(cq_u32 absmax_bits) {
        CqBlock b;
        b.finite = absmax_bits <= CQ_FLT_MAX_BITS;
        if (!b.finite) {
            b.scale = cq_u2f(CQ_NAN_BITS);
            b.enc = 0.0f;
            b.code = 255u;
            return b;
        }
        const int field = (int)(absmax_bits >> 23);
        // absmax = m * 2^E with m in [1, 2) (normal) or [0, 1) with E = -126 (subnormal, zero);
        // m * 2^(E-e) <= 1.75 * 2^EMAX  <=>  e >= E - EMAX (+1 when m > 1.75)
        int e = (field == 0 ? -126 : field - 127) - EMAX + (field != 0 && (absmax_bits & 0x7fffffu) > 0x600000u ? 1 : 0);
        // e <= 127 - EMAX: fmax * 2^e <= 1.75 * 2^127 stays finite, so no value can round up to Inf (a block
        // with absmax above 1.75 * 2^127 ~ 2.98e38 saturates there instead)
        e = e < -127 ? -127 : e > 127 - EMAX ? 127 - EMAX : e;
        b.code = (cq_u32)(e + 127);
        b.scale = cq_u2f(e >= -126 ? (cq_u32)(e + 127) << 23 : 0x00400000u);  // 2^-127 is subnormal
        b.enc = cq_u2f((cq_u32)(127 - e) << 23);
        return b;
    }
    static CQ_HD cq_u32 quantize(float x, const CqBlock& b, bool stochastic, float u) {
        (void)stochastic;
        (void)u;
        if (!b.finite) return 0u;
        const cq_u32 bits = cq_f2u(cq_clamp(cq_mul(x, b.enc), cq_u2f(FMAX_BITS)));
        const cq_u32 sign = (bits >> 24) & 0x80u;
        cq_u32 a = bits & 0x7fffffffu;
        if (a < (cq_u32)(128 - BIAS) << 23) {  // below 2^(1-BIAS): an fp8 subnormal (or the smallest normal)
            // |v| * 2^(BIAS-1+MBITS) is exact; rint = ties to even; 2^MBITS encodes the smallest normal
            const float m = cq_rint(cq_mul(cq_u2f(a), cq_u2f((cq_u32)(127 + BIAS - 1 + MBITS) << 23)));
            return sign | (cq_u32)cq_f2i(m);
        }
        constexpr int SHIFT = 23 - MBITS;
        a -= (cq_u32)(127 - BIAS) << 23;                       // rebias the exponent
        a += (1u << (SHIFT - 1)) - 1u + ((a >> SHIFT) & 1u);  // round to nearest even
        return sign | (a >> SHIFT);
    }
    static CQ_HD float value(cq_u32 field, float scale) {
        const cq_u32 sign = (field & 0x80u) << 24;
        // codes the encoder never writes decode as torch's float8 types do: E4M3 S.1111.111 is NaN, E5M2
        // exponent 31 is Inf (mantissa 0) or NaN
        if ((EBITS == 4 && (field & 0x7fu) == 0x7fu) || (EBITS == 5 && (field & 0x7fu) > 0x7cu))
            return cq_u2f(CQ_NAN_BITS);
        if (EBITS == 5 && (field & 0x7fu) == 0x7cu) return cq_mul(cq_u2f(sign | CQ_INF_BITS), scale);
        // the code's exponent and mantissa bits placed at fp32's read as a float of exponent bias 127, not
        // BIAS: times 2^(127 - BIAS) it is the fp8 value, exactly -- an fp8 subnormal becomes an fp32
        // subnormal (no flush: -ftz=false) scaled up exactly. Two FMULs and no branch; the subnormal case
        // was a branch with an int -> float conversion (quarter-rate pipe) per value.
        const float v = cq_mul(cq_u2f(sign | (field & 0x7fu) << (23 - MBITS)), cq_u2f((cq_u32)(254 - BIAS) << 23));
        return cq_mul(v, scale);
    }
    static CQ_HD void decode_word(cq_u32 w, float scale, float* v) {
#pragma unroll
        for (int k = 0; k < G; ++k) v[k] = value((w >> (8 * k)) & 0xffu, scale);
    }
    // fp8 decodes keep the general rounding: E5M2's Inf codes decode to Inf, outside Tr::Normal's range
    // (and a normal fp8 decode is exact in bf16 and fp16's exponent range is not fp32's)
    static CQ_HD bool decodes_normal(float) { return false; }
    static CQ_HD float load_scale(const cq_u8* payload, cq_i64 b) {
        const cq_u32 code = payload[b];
        if (code == 255u) return cq_u2f(CQ_NAN_BITS);
        return cq_u2f(code >= 1u ? code << 23 : 0x00400000u);
    }
    static CQ_HD void store_scale(cq_u8* payload, cq_i64 b, const CqBlock& p) { payload[b] = (cq_u8)p.code; }
};

typedef CqInt<8> CqInt8;
typedef CqInt<4> CqInt4;
typedef CqFp8<4, 3, 8> CqE4M3;
typedef CqFp8<5, 2, 15> CqE5M2;

// the identity on a value to encode (cq_encode_word's default)
struct CqAsIs {
    CQ_HD float operator()(float v) const { return v; }
};

// G inputs starting at global element index i0 (count valid ones) -> one q word; each input is passed through
// `sent` right before it is quantized (one converted value live at a time)
template <class F, class Sent = CqAsIs>
CQ_HD cq_u32 cq_encode_word(const float* v, int count, const CqBlock& b, bool stochastic, cq_u32 seed, cq_i64 i0,
                            const Sent& sent = Sent()) {
    constexpr int G = F::G;
    cq_u32 key = stochastic ? cq_stream_key(seed, (cq_u64)i0) : 0u;
    cq_u32 w = 0;
#pragma unroll
    for (int k = 0; k < G; ++k) {
        if (k < count) {
            // a word of a row that is not word-aligned may straddle a 2^32-element segment (rare)
            if (stochastic && k > 0 && ((cq_u64)(i0 + k) >> 32) != ((cq_u64)i0 >> 32))
                key = cq_stream_key(seed, (cq_u64)(i0 + k));
            const float u = stochastic ? cq_uniform(key, (cq_u64)(i0 + k)) : 0.0f;
            w |= F::quantize(sent(v[k]), b, stochastic, u) << (F::BITS * k);
        }
    }
    return w;
}

template <class F>
CQ_HD void cq_decode_word(cq_u32 w, float scale, float* v) {
    F::decode_word(w, scale, v);
}

// load G values (count valid, the rest 0) as fp32; vec: 16-byte-aligned whole word, one vector access
struct alignas(16) CqV16 { cq_u32 w[4]; };
struct alignas(8) CqV8 { cq_u32 w[2]; };

template <class Tr, int G>
CQ_HD void cq_load_word(const typename Tr::storage* x, cq_i64 i0, int count, bool vec, float* v) {
    typedef typename Tr::storage S;
    constexpr int NBYTES = G * (int)sizeof(S);
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
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

// two values of a 16-bit type in one word, the first in the low half
template <class Tr>
CQ_HD cq_u32 cq_pack2(float a, float b) { return (cq_u32)Tr::from_f(a) | (cq_u32)Tr::from_f(b) << 16; }
template <>  // the split leaves the low halves zero: their high halves by one byte permute
CQ_HD cq_u32 cq_pack2<CqBF16Normal>(float a, float b) {
    return ccoll_conv::byte_perm(cq_f2u(CqBF16Normal::round(a)), cq_f2u(CqBF16Normal::round(b)), 0x7632u);
}

template <class Tr, int G>
CQ_HD void cq_store_word(typename Tr::storage* y, cq_i64 i0, int count, bool vec, const float* v) {
    typedef typename Tr::storage S;
    constexpr int NBYTES = G * (int)sizeof(S);
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
    if (vec && count == G) {
        cq_u32 words[NBYTES / 4];
#pragma unroll
        for (int j = 0; j < NBYTES / 4; ++j)
            words[j] = sizeof(S) == 4 ? (cq_u32)Tr::from_f(v[j]) : cq_pack2<Tr>(v[2 * j], v[2 * j + 1]);
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

// n / d without a 64-bit division per call: a shift when d is a power of two, else a 32-bit division
// while n fits (always, below 2^32 words or blocks)
struct CqDiv {
    cq_i64 d;
    int log2_d;  // -1 if d is not a power of two
    CQ_HD explicit CqDiv(cq_i64 divisor) : d(divisor), log2_d(-1) {
        if ((d & (d - 1)) == 0) {
            log2_d = 0;
            while (((cq_i64)1 << log2_d) < d) ++log2_d;
        }
    }
    CQ_HD cq_i64 operator()(cq_i64 n) const {
        if (log2_d >= 0) return n >> log2_d;
        if (n <= 0xffffffffll && d <= 0xffffffffll) return (cq_i64)((cq_u32)n / (cq_u32)d);
        return n / d;
    }
};

// ------------------------------------------------------------------------------------------------
// batches of rows: the per-block encode and the per-word decode, shared by the GPU and the host build

// `rows` rows of row_numel values read from a 1-D tensor of numel values (zero past its end)
template <class F>
struct CqRows {
    cq_i64 numel, rows, row_numel, block;
    cq_i64 blocks_per_row;  // the one derived size that needs a division
    CQ_HD CqRows(cq_i64 numel_, cq_i64 rows_, cq_i64 row_numel_, cq_i64 block_)
        : numel(numel_), rows(rows_), row_numel(row_numel_), block(block_),
          blocks_per_row(cq_nblocks(row_numel_, block_)) {}
    // shifts and adds from row_numel / blocks_per_row, derived on use: a kernel holds only what it uses
    CQ_HD cq_i64 scale_nbytes() const { return cq_round16(F::SCALE_BYTES * blocks_per_row); }
    CQ_HD cq_i64 row_nbytes() const { return scale_nbytes() + cq_q_nbytes<F>(row_numel); }
    // every row starts on a q word of the tensor: whole words are aligned vector accesses
    CQ_HD bool word_aligned() const { return row_numel % F::G == 0; }
    // the padding after the last scale and after the last q word of a payload row is zero (deterministic
    // bytes), written with the row's last block (b, values from start to start + len = row_numel): the
    // bounds come from that block's own values, so nothing about the padding is a loop invariant the
    // compiler would hoist and hold in registers across a kernel's grid-stride loop (it did: 3 spills).
    // At most 15 scale bytes and 3 q words; round16 of the q words' bytes is the q section's size.
    CQ_HD void zero_padding(cq_u8* payload, cq_u32* qwords, cq_i64 b, cq_i64 start, cq_i64 len) const {
        const cq_i64 scale_end = (b + 1) * F::SCALE_BYTES;
        for (int k = 0; k < (int)(cq_round16(scale_end) - scale_end); ++k) payload[scale_end + k] = 0;
        const cq_i64 words_end = (start + len + F::G - 1) / F::G;
        for (int k = 0; k < (int)(cq_round16(4 * words_end) / 4 - words_end); ++k) qwords[words_end + k] = 0;
    }
};

// quant block `unit` of a batch of rows (row = unit / blocks_per_row); a unit past `nunits` is invalid
// (len 0: its lanes only join the team's shuffles)
struct CqUnit {
    bool valid;
    cq_i64 row, b, start, len;  // row, block in the row, its first value in the row, its values
    template <class F>
    CQ_HD CqUnit(const CqRows<F>& g, const CqDiv& row_of_block, cq_i64 unit, cq_i64 nunits)
        : valid(unit < nunits), row(unit < nunits ? row_of_block(unit) : 0), b(unit - row * g.blocks_per_row),
          start(b * g.block), len(valid ? cq_min(g.block, g.row_numel - start) : 0) {}
};

CQ_HD bool cq_aligned16(const void* p) { return (reinterpret_cast<cq_u64>(p) & 15u) == 0; }

// 16-byte payload groups: the plain decodes give each thread a group of CQ_GROUP_WORDS consecutive q words,
// read as one 16-byte vector load, so a warp's q load is 512 contiguous bytes per instruction (4 full
// 128-byte lines) and each thread has 16 payload bytes in flight per load instead of 4. A group starts on
// a 16-byte boundary of a row's q section (q word index a multiple of 4; the section starts and ends on
// 16 bytes), so a group load never leaves the section -- its tail words are the zero padding.
#define CQ_GROUP_WORDS 4

// the GW (4 or 2) q words at word w0 (a multiple of GW) of a q section; vec: the section is 16-byte aligned
// (one 16- or 8-byte vector load), else word loads (the host build always)
template <int GW = CQ_GROUP_WORDS>
CQ_HD void cq_load_group(const cq_u32* qwords, cq_i64 w0, bool vec, cq_u32* q) {
    static_assert(GW == 4 || GW == 2, "a group is 16 or 8 bytes");
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
    if (vec) {
        if constexpr (GW == 4) {
            const CqV16 r = *reinterpret_cast<const CqV16*>(qwords + w0);
#pragma unroll
            for (int j = 0; j < GW; ++j) q[j] = r.w[j];
        } else {
            const CqV8 r = *reinterpret_cast<const CqV8*>(qwords + w0);
            q[0] = r.w[0];
            q[1] = r.w[1];
        }
        return;
    }
#else
    (void)vec;
#endif
#pragma unroll
    for (int j = 0; j < GW; ++j) q[j] = qwords[w0 + j];
}

// the lanes that encode one quant block: a serial "team" of one on the host, T lanes of a warp on the GPU
struct CqTeam {
    int lane, size;
    // max over the team's lanes (every lane of the warp must call it)
    CQ_HD cq_u32 max(cq_u32 v) const {
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
        // unrolled: a step is a shuffle and a max under a warp-uniform guard, not a loop turn
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            if (off < size) {
                const cq_u32 o = __shfl_xor_sync(0xffffffffu, v, off);
                v = o > v ? o : v;
            }
        }
#endif
        return v;
    }
    // Hadamard butterfly with the lane `off` away (off < size; every lane of the warp must call it): the
    // lower lane gets a + b, the upper a - b; unchanged when `on` is false (the shuffle still happens)
    CQ_HD float butterfly(float v, int off, bool on) const {
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
        const float other = __shfl_xor_sync(0xffffffffu, v, off);
        if (on) v = (lane & off) ? cq_sub(other, v) : cq_add(v, other);
#else
        (void)off;
        (void)on;
#endif
        return v;
    }
};

// ------------------------------------------------------------------------------------------------
// rotate=hadamard: a randomized Walsh-Hadamard transform of each whole block of B = 2^k values,
// y = H D x (H unnormalised, entries +-1; D = diag(+-1) from the codec's rotate_seed, the same for every
// block and every rank), quantized in place of x; decode x' = D H (y' * 2^-k) (H H = B I).
// A team holds its block in registers: lane l of a team of T holds words l, l + T, l + 2T, ... (value j*G + k
// of its array is element (l + j*T)*G + k of the block). The butterflies run over the element index bits in
// ascending order -- within a word, across lanes (shuffles), across the lane's words -- which for the host's
// team of one is simply bit 0, 1, 2, ...: the same fp32 operations in the same order on every backend.
// A partial last block of a row (row_numel % B != 0) is quantized without rotation.
#define CQ_ROT_MAX_BLOCK 1024
#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)
#define CQ_ROT_MAXV 32  // values per lane: B <= 1024 with teams of 32 (B / G words >= 32 for B >= 256)
#else
#define CQ_ROT_MAXV CQ_ROT_MAX_BLOCK  // the host's team of one holds a whole block
#endif

CQ_HD void cq_butterfly(float& a, float& b) {
    const float s = cq_add(a, b);
    b = cq_sub(a, b);
    a = s;
}

struct CqRot {
    cq_u32 key;       // sign key: element i of every block is negated when mix32(i + key) is odd
    float inv_block;  // 2^-k
    CQ_HD CqRot(cq_u32 seed, cq_i64 block) : key(cq_mix32(seed ^ 0x5bd1e995u)), inv_block(1.0f) {
        int k = 0;
        while (((cq_i64)1 << k) < block) ++k;
        inv_block = cq_u2f((cq_u32)(127 - k) << 23);
    }
    // D on a lane's values (nw words)
    template <int G>
    CQ_HD void signs(float* v, int nw, const CqTeam& t) const {
#pragma unroll
        for (int i = 0; i < CQ_ROT_MAXV; ++i) {
            if (i >= nw * G) break;
            const cq_u32 index = (cq_u32)((t.lane + (i / G) * t.size) * G + i % G);
            if (cq_mix32(index + key) & 1u) v[i] = cq_u2f(cq_f2u(v[i]) ^ 0x80000000u);
        }
    }
    // H (unnormalised) on a lane's values; `on` false: only joins the team's shuffles
    template <int G>
    CQ_HD void hadamard(float* v, int nw, const CqTeam& t, bool on) const {
        if (on) {
#pragma unroll
            for (int s = 1; s < G; s <<= 1) {
#pragma unroll
                for (int i = 0; i < CQ_ROT_MAXV; ++i)
                    if (i < nw * G && !(i & s)) cq_butterfly(v[i], v[i + s]);
            }
        }
        for (int off = 1; off < t.size; off <<= 1) {
#pragma unroll
            for (int i = 0; i < CQ_ROT_MAXV; ++i)
                if (i < nw * G) v[i] = t.butterfly(v[i], off, on);
        }
        if (on) {
#pragma unroll
            for (int s = 1; s < CQ_ROT_MAXV / G; s <<= 1) {
                if (s >= nw) break;
#pragma unroll
                for (int j = 0; j < CQ_ROT_MAXV / G; ++j) {
                    if (j < nw && !(j & s)) {
#pragma unroll
                        for (int k = 0; k < G; ++k) cq_butterfly(v[j * G + k], v[(j + s) * G + k]);
                    }
                }
            }
        }
    }
    template <int G>
    CQ_HD void forward(float* v, int nw, const CqTeam& t, bool on) const {
        if (on) signs<G>(v, nw, t);
        hadamard<G>(v, nw, t, on);
    }
    template <int G>
    CQ_HD void inverse(float* v, int nw, const CqTeam& t, bool on) const {
        if (on) {
#pragma unroll
            for (int i = 0; i < CQ_ROT_MAXV; ++i)
                if (i < nw * G) v[i] = cq_mul(v[i], inv_block);
        }
        hadamard<G>(v, nw, t, on);
        if (on) signs<G>(v, nw, t);
    }
};

// The rotate=hadamard path of a quant op with NW words per lane (block / (G * team)) fixed at compile time:
// the GPU kernels exist per NW (1: blocks of <= 32 q words, one word per lane; 2, 4, 8: a team of 32;
// ccoll/codecs/quant_kernels.py _rot_words picks one), so every loop over a lane's words unrolls and every
// index into its arrays is a constant: the block stays in registers. With a runtime count (one kernel for
// every NW) the arrays were a 128..256-byte stack frame, each butterfly stage a round trip through local
// memory; and one kernel switching over NW would take NW = 8's registers for every block size. The host's
// team of one holds a whole block (up to 256 words) and runs NW = 0, the runtime form (Op::team_block).
template <class Op, int NW>
struct CqRotated {
    Op op;
    CQ_HD cq_i64 nunits() const { return op.nunits(); }
    CQ_HD void team_block(cq_i64 unit, const CqTeam& t) const { op.template block_rotated<NW>(unit, t); }
};

// ROT: rotate=hadamard (a separate instantiation, so the plain kernels carry no rotation code)
template <class Tr, class F, bool ROT>
struct CqEncodeRows {
    typedef typename Tr::storage S;
    static constexpr int G = F::G;
    const S* x;
    float* feedback;  // rows * row_numel fp32 residuals, or null
    cq_u8* out;       // [rows, row_nbytes]
    CqRows<F> g;
    CqDiv row_of_block;
    bool stochastic;
    cq_u32 seed;
    bool vec_x, vec_fb;
    CqRot rot;

    CQ_HD CqEncodeRows(const S* x_, cq_i64 numel, cq_i64 rows, cq_i64 row_numel, cq_i64 block, int stochastic_,
                       cq_u32 seed_, float* feedback_, cq_u8* out_, cq_u32 rot_seed)
        : x(x_), feedback(feedback_), out(out_), g(numel, rows, row_numel, block),
          row_of_block(cq_nblocks(row_numel, block)), stochastic(stochastic_ != 0), seed(seed_),
          vec_x(cq_aligned16(x_) && g.word_aligned()), vec_fb(cq_aligned16(feedback_) && g.word_aligned()),
          rot(rot_seed, block) {}

    CQ_HD cq_i64 nunits() const { return g.rows * g.blocks_per_row; }

    // how many of the `count` values at padded index e are the tensor's (the rest is padding): one 64-bit
    // test per word, not one per value (int4's 8 indices e + k held 16 registers and spilled at the
    // 64-register cap in store_residual)
    CQ_HD int in_tensor(cq_i64 e, int count) const {
        const cq_i64 have = g.numel - e;
        return have <= 0 ? 0 : (int)cq_min(count, have);
    }

    // the `count` values at padded index e: c = x (+ residual) in fp32 and sent = c rounded to the input type
    CQ_HD void load(cq_i64 e, int count, float* c, float* sent) const {
        cq_load_word<Tr, G>(x, e, in_tensor(e, count), vec_x, c);
        if (feedback == nullptr) {
#pragma unroll
            for (int k = 0; k < G; ++k) sent[k] = c[k];
            return;
        }
        float r[G];
        cq_load_word<CqF32, G>(reinterpret_cast<const cq_u32*>(feedback), e, count, vec_fb, r);
#pragma unroll
        for (int k = 0; k < G; ++k) {
            c[k] = cq_add(c[k], r[k]);
            sent[k] = Tr::round(c[k]);
        }
    }

    // residuals of the `count` values at padded index e: c - what the receivers decode (rounded to the
    // input type); non-finite -> 0, padding -> 0
    CQ_HD void store_residual(cq_i64 e, int count, const float* c, const float* decoded) const {
        const int valid = in_tensor(e, count);  // the values past it are not stored or are padding
        float r[G];
#pragma unroll
        for (int k = 0; k < G; ++k) {
            r[k] = cq_sub(c[k], Tr::round(decoded[k]));
            if (cq_abs_bits(r[k]) >= CQ_INF_BITS || k >= valid) r[k] = 0.0f;
        }
        cq_store_word<CqF32, G>(reinterpret_cast<cq_u32*>(feedback), e, count, vec_fb, r);
    }

    CQ_HD void team_block(cq_i64 unit, const CqTeam& t) const {
        if constexpr (ROT)
            block_rotated<0>(unit, t);  // the host's team of one; GPU kernels: CqRotated
        else
            block(unit, t);
    }

    // what is encoded from c (x, or x + residual in fp32): c itself, or c rounded to the input type
    struct Sent {
        bool round;
        CQ_HD float operator()(float c) const { return round ? Tr::round(c) : c; }
    };

    // q word w of the block at padded index e0 (count values c, see load): quantize, store, and the residuals
    CQ_HD void encode_word(cq_i64 e0, cq_i64 w, int count, const CqBlock& bp, cq_u32* qwords, cq_i64 start,
                           const float* c) const {
        const cq_i64 e = e0 + w * G;
        const cq_u32 word = cq_encode_word<F>(c, count, bp, stochastic, seed, e, Sent{feedback != nullptr});
        qwords[start / G + w] = word;
        if (feedback != nullptr) {
            float r[G];
            cq_decode_word<F>(word, bp.scale, r);
            store_residual(e, count, c, r);
        }
    }

    // q words per lane held in registers at a time: NREG * G = 8 values
    static constexpr int NREG = 8 / G > 0 ? 8 / G : 1;

    // the q words of chunk `chunk` of a lane (words lane + (chunk * NREG + j) * T, j < NREG) into c (x, or
    // x + residual in fp32; see load); the absmax of what is encoded from them joins `absmax`
    CQ_HD void load_chunk(cq_i64 e0, cq_i64 len, int chunk, const CqTeam& t, float* c, cq_u32& absmax) const {
#pragma unroll
        for (int j = 0; j < NREG; ++j) {
            const int w = t.lane + (chunk * NREG + j) * t.size;  // < 2^18: block <= 2^20
            const int count = (int)cq_min(G, len - w * G);
            if (count > 0) {
                float sent[G];
                load(e0 + w * G, count, c + j * G, sent);
#pragma unroll
                for (int k = 0; k < G; ++k) {
                    const cq_u32 a = cq_abs_bits(sent[k]);
                    absmax = a > absmax ? a : absmax;
                }
            }
        }
    }

    // ---- whole blocks: the common case, written without the general path's per-word and per-value tests
    // (the word count, the padding, the alignment fallback, a non-finite block) and with feedback as a
    // template parameter instead of per-value branches. A block is whole when it is block values long, lies
    // before numel and its input and its residuals take vector accesses (and 16-byte ones where V = 2).
    // The unit of a lane is a chunk of V words read by one 16-byte load: V = 2 where a word is 8 bytes
    // (int8 / fp8 of bf16 / f16 input), else 1 (a word of 16 or 32 bytes). Lane l of a team of T handles
    // chunks l, l + T, ...: the team's T lanes read T consecutive chunks per instruction.
    static constexpr int V = G * (int)sizeof(S) == 8 ? 2 : 1;  // mirrored by quant_kernels._encode_team
    static constexpr int GV = G * V;                             // values per chunk

    CQ_HD bool whole(cq_i64 e0, cq_i64 len) const {
        return len == g.block && e0 + len <= g.numel && vec_x && (feedback == nullptr || vec_fb) &&
               (V == 1 || e0 % GV == 0);  // vec_x: x is 16-byte aligned and e0 a multiple of G
    }

    // the GV values of the whole chunk at padded index e: c = x (+ residual in fp32) and what is encoded
    // from them (c, or with feedback c rounded to the input type)
    template <bool FB>
    CQ_HD void load_whole(cq_i64 e, float* c, float* sent) const {
        typedef typename Tr::Whole W;  // exact for finite values; pass 1 runs on finite blocks only
        cq_load_word<W, GV>(reinterpret_cast<const typename W::storage*>(x), e, GV, true, c);
        if constexpr (FB) {
            float r[GV];
            cq_load_word<CqF32, GV>(reinterpret_cast<const cq_u32*>(feedback), e, GV, true, r);
#pragma unroll
            for (int k = 0; k < GV; ++k) {
                c[k] = cq_add(c[k], r[k]);
                sent[k] = W::round(c[k]);
            }
        } else {
#pragma unroll
            for (int k = 0; k < GV; ++k) sent[k] = c[k];
        }
    }

    // pass 0 of a whole block: this lane's share of the absmax, with >= 32 bytes of loads in flight per
    // lane (two chunks where a chunk and its residuals are less; more would not fit 64 registers). The
    // pair's loads are issued before either is used: an unrolled `c < nchunks` loop would put its bound test
    // between them and the compiler keeps each load next to its use (one 16-byte load in flight per lane).
    template <bool FB>
    CQ_HD cq_u32 absmax_whole(cq_i64 e0, const CqTeam& t) const {
        constexpr int PAIR = GV * (int)sizeof(S) * (FB ? 2 : 1) < 32;
        const int nchunks = (int)(g.block / GV);  // block % 8 == 0: whole chunks
        cq_u32 absmax = 0;
        int ch = t.lane;
        if constexpr (PAIR) {
            for (; ch + t.size < nchunks; ch += 2 * t.size) {
                float c[2][GV], sent[2][GV];
                load_whole<FB>(e0 + (cq_i64)ch * GV, c[0], sent[0]);
                load_whole<FB>(e0 + (cq_i64)(ch + t.size) * GV, c[1], sent[1]);
#pragma unroll
                for (int k = 0; k < 2 * GV; ++k) {
                    const cq_u32 a = cq_abs_bits(sent[k / GV][k % GV]);
                    absmax = a > absmax ? a : absmax;
                }
            }
        }
        for (; ch < nchunks; ch += t.size) {
            float c[GV], sent[GV];
            load_whole<FB>(e0 + (cq_i64)ch * GV, c, sent);
#pragma unroll
            for (int k = 0; k < GV; ++k) {
                const cq_u32 a = cq_abs_bits(sent[k]);
                absmax = a > absmax ? a : absmax;
            }
        }
        return absmax;
    }

    // pass 1 of a whole block with finite values (bp.finite): reload each chunk (an L1/L2 hit), quantize
    // its V words, store them and the residuals
    template <bool FB>
    CQ_HD void encode_whole(cq_i64 e0, const CqBlock& bp, cq_u32* qwords, cq_i64 start, const CqTeam& t) const {
        typedef typename Tr::Whole W;  // the block is finite: so are its decoded values
        const int nchunks = (int)(g.block / GV);
        cq_u32* q = qwords + start / G;
        for (int ch = t.lane; ch < nchunks; ch += t.size) {
            const cq_i64 e = e0 + (cq_i64)ch * GV;
            float c[GV], sent[GV];
            load_whole<FB>(e, c, sent);
            cq_u32 words[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                words[v] = cq_encode_word<F>(c + v * G, G, bp, stochastic, seed, e + v * G, Sent{FB});
                q[ch * V + v] = words[v];
            }
            if constexpr (FB) {
                float r[GV];
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    float d[G];
                    cq_decode_word<F>(words[v], bp.scale, d);
#pragma unroll
                    for (int k = 0; k < G; ++k) {
                        float& rk = r[v * G + k];
                        rk = cq_sub(c[v * G + k], W::round(d[k]));
                        if (cq_abs_bits(rk) >= CQ_INF_BITS) rk = 0.0f;
                    }
                }
                cq_store_word<CqF32, GV>(reinterpret_cast<cq_u32*>(feedback), e, GV, true, r);
            }
        }
    }

    // quant block `unit` (row unit / blocks_per_row) by team t; units past the end only join the team max.
    // A whole block (see `whole`) takes the paths above; any other one (a row's partial last block, the
    // tensor's end, unaligned input, a non-finite block) the general one: lane l handles words l, l + T,
    // l + 2T, ... in chunks of NREG words, read twice (absmax, then quantize). The choice is per team; the
    // one team max below is reached by every lane of the warp whatever its team chose.
    CQ_HD void block(cq_i64 unit, const CqTeam& t) const {
        const CqUnit u(g, row_of_block, unit, nunits());
        const cq_i64 row = u.row, b = u.b, start = u.start, len = u.len;
        const cq_i64 e0 = row * g.row_numel + start;
        const bool is_whole = whole(e0, len);
        cq_u32 absmax = 0;
        if (is_whole) {
            if (feedback != nullptr) absmax = absmax_whole<true>(e0, t);
            else absmax = absmax_whole<false>(e0, t);
        } else {
            for (int chunk = 0; chunk < chunks(t); ++chunk) {
                float c[NREG * G];
                load_chunk(e0, len, chunk, t, c, absmax);
            }
        }
        absmax = t.max(absmax);  // every lane of the warp
        if (len == 0) return;
        const CqBlock bp = F::params(absmax);
        cq_u8* payload = out + row * g.row_nbytes();
        cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + g.scale_nbytes());
        if (t.lane == 0) {
            F::store_scale(payload, b, bp);
            if (b == g.blocks_per_row - 1) g.zero_padding(payload, qwords, b, start, len);
        }
        if (is_whole && bp.finite) {
            if (feedback != nullptr) encode_whole<true>(e0, bp, qwords, start, t);
            else encode_whole<false>(e0, bp, qwords, start, t);
            return;
        }
        // the general pass 1 reads its chunks again (an L1/L2 hit): holding one across the team max would
        // cost registers on every path for the rare one
        for (int chunk = 0; chunk < chunks(t); ++chunk) {
            float c[NREG * G];
            cq_u32 ignored = 0;
            load_chunk(e0, len, chunk, t, c, ignored);
#pragma unroll
            for (int j = 0; j < NREG; ++j) {
                const int w = t.lane + (chunk * NREG + j) * t.size;
                const int count = (int)cq_min(G, len - w * G);
                if (count > 0) encode_word(e0, w, count, bp, qwords, start, c + j * G);
            }
        }
    }

    // the general path's chunks of NREG words per lane (depends on the block and the team only)
    CQ_HD int chunks(const CqTeam& t) const {
        return (int)((g.block / G + (cq_i64)NREG * t.size - 1) / ((cq_i64)NREG * t.size));
    }

    // the same with rotate=hadamard: the team holds the block in registers (see CqRot); every lane of the
    // warp runs the same shuffles whatever its unit (past the end, partial block)
    // (NW: the lane's words, a constant in the GPU kernels, 0 = block / (G * team) at run time: CqRotated)
    template <int NW>
    CQ_HD void block_rotated(cq_i64 unit, const CqTeam& t) const {
        const CqUnit u(g, row_of_block, unit, nunits());
        const cq_i64 row = u.row, b = u.b, start = u.start, len = u.len;
        const cq_i64 e0 = row * g.row_numel + start;
        const bool on = len == g.block;
        const int nw = NW ? NW : (int)(g.block / (G * t.size));
        float c[NW ? NW * G : CQ_ROT_MAXV], v[NW ? NW * G : CQ_ROT_MAXV];
        cq_u32 absmax = 0;
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            const int count = (int)cq_min(G, len - w * G);
            if (count > 0) {
                load(e0 + w * G, count, c + j * G, v + j * G);
            } else {
#pragma unroll
                for (int k = 0; k < G; ++k) c[j * G + k] = v[j * G + k] = 0.0f;
            }
        }
        rot.forward<G>(v, nw, t, on);
#pragma unroll
        for (int i = 0; i < nw * G; ++i) {
            const cq_u32 a = cq_abs_bits(v[i]);
            absmax = a > absmax ? a : absmax;
        }
        absmax = t.max(absmax);
        const CqBlock bp = F::params(absmax);
        cq_u8* payload = out + row * g.row_nbytes();
        cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + g.scale_nbytes());
        if (len > 0 && t.lane == 0) {
            F::store_scale(payload, b, bp);
            if (b == g.blocks_per_row - 1) g.zero_padding(payload, qwords, b, start, len);
        }
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            const int count = (int)cq_min(G, len - w * G);
            if (count <= 0) continue;
            const cq_u32 word = cq_encode_word<F>(v + j * G, count, bp, stochastic, seed, e0 + w * G);
            qwords[start / G + w] = word;
            if (feedback != nullptr) cq_decode_word<F>(word, bp.scale, v + j * G);
        }
        if (feedback == nullptr) return;  // uniform over the launch
        rot.inverse<G>(v, nw, t, on);
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            const int count = (int)cq_min(G, len - w * G);
            if (count > 0) store_residual(e0 + w * G, count, c + j * G, v + j * G);
        }
    }
};

template <class Tr, class F>
struct CqDecodeRows {
    typedef typename Tr::storage S;
    static constexpr int G = F::G;
    static constexpr int GW = CQ_GROUP_WORDS;
    static constexpr int GV = GW * G;
    const cq_u8* payloads;  // [rows, row_nbytes]
    S* y;                   // numel values
    CqRows<F> g;
    cq_i64 groups_per_row;  // 16-byte q groups per payload row
    CqDiv row_of_group, block_of_word, row_of_block;
    bool vec, vec_q, one_scale;
    CqRot rot;

    CQ_HD CqDecodeRows(const cq_u8* payloads_, cq_i64 rows, cq_i64 row_numel, cq_i64 numel, cq_i64 block, S* y_,
                       cq_u32 rot_seed)
        : payloads(payloads_), y(y_), g(numel, rows, row_numel, block),
          groups_per_row(((row_numel + G - 1) / G + GW - 1) / GW), row_of_group(groups_per_row),
          block_of_word(block / G), row_of_block(cq_nblocks(row_numel, block)),
          vec(cq_aligned16(y_) && g.word_aligned()), vec_q(cq_aligned16(payloads_)), one_scale(block % GV == 0),
          rot(rot_seed, block) {}

    // rows whose values lie (at least partly) below numel
    CQ_HD cq_i64 nrows() const { return cq_min(g.rows, (g.numel + g.row_numel - 1) / g.row_numel); }
    CQ_HD cq_i64 ngroups() const { return nrows() * groups_per_row; }
    CQ_HD cq_i64 nunits() const { return nrows() * g.blocks_per_row; }

    CQ_HD void group(cq_i64 group_index) const {
        const cq_i64 row = g.rows == 1 ? 0 : row_of_group(group_index);  // no division per group for one row
        group_of_row(row, group_index - row * groups_per_row);
    }

    // 16-byte q group gq of payload row `row`: one vector load, then per word decode and store. The scale is
    // loaded once when a group cannot straddle blocks (block a multiple of GV values), else per word.
    CQ_HD void group_of_row(cq_i64 row, cq_i64 gq) const {
        const cq_i64 w0 = gq * GW;
        const cq_i64 e0 = row * g.row_numel + w0 * G;
        const cq_i64 have = cq_min(g.row_numel - w0 * G, g.numel - e0);  // values of the group to write
        if (have <= 0) return;
        const cq_u8* payload = payloads + row * g.row_nbytes();
        const cq_u32* qwords = reinterpret_cast<const cq_u32*>(payload + g.scale_nbytes());
        cq_u32 q[GW];
        cq_load_group(qwords, w0, vec_q, q);
        const float scale0 = F::load_scale(payload, block_of_word(w0));
        if (one_scale && have >= GV && F::decodes_normal(scale0)) {  // the common case: no per-word tests
#pragma unroll
            for (int j = 0; j < GW; ++j) {
                float v[G];
                cq_decode_word<F>(q[j], scale0, v);
                cq_store_word<typename Tr::Normal, G>(y, e0 + j * G, G, vec, v);
            }
            return;
        }
#pragma unroll
        for (int j = 0; j < GW; ++j) {
            const int count = (int)cq_min(G, have - j * G);
            if (count <= 0) break;
            const float scale = one_scale || j == 0 ? scale0 : F::load_scale(payload, block_of_word(w0 + j));
            float v[G];
            cq_decode_word<F>(q[j], scale, v);
            cq_store_word<Tr, G>(y, e0 + j * G, count, vec, v);
        }
    }

    // rotate=hadamard: block `unit` of any row by team t (the whole block is decoded and rotated back, then
    // stored up to numel)
    CQ_HD void team_block(cq_i64 unit, const CqTeam& t) const {
        block_rotated<0>(unit, t);  // the host's team of one; GPU kernels: CqRotated
    }
    template <int NW>  // the lane's words, a constant in the GPU kernels (CqRotated), 0 at run time
    CQ_HD void block_rotated(cq_i64 unit, const CqTeam& t) const {
        const CqUnit u(g, row_of_block, unit, nunits());
        const cq_i64 row = u.row, start = u.start, len = u.len;
        const int nw = NW ? NW : (int)(g.block / (G * t.size));
        const cq_u8* payload = payloads + row * g.row_nbytes();
        const cq_u32* qwords = reinterpret_cast<const cq_u32*>(payload + g.scale_nbytes());
        const float scale = u.valid ? F::load_scale(payload, u.b) : 0.0f;
        float v[NW ? NW * G : CQ_ROT_MAXV];
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            if (w * G < len) cq_decode_word<F>(qwords[start / G + w], scale, v + j * G);
            else for (int k = 0; k < G; ++k) v[j * G + k] = 0.0f;
        }
        rot.inverse<G>(v, nw, t, len == g.block);
        // a NaN block's values went through the butterflies' adds, subtracts and sign flips: one NaN pattern
        // again (x86 keeps an operand's sign, PTX returns its canonical NaN), as the plain decode stores
#pragma unroll
        for (int i = 0; i < nw * G; ++i) v[i] = cq_canonical_nan(v[i]);
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            const cq_i64 e = row * g.row_numel + start + w * G;
            const cq_i64 count = cq_min(cq_min(G, len - w * G), g.numel - e);
            if (count > 0) cq_store_word<Tr, G>(y, e, (int)count, vec, v + j * G);
        }
    }
};

// fp32 row-order sum of the decodes of p payloads of numel values each, per q group of 16 values: 16 bytes
// (int8, fp8) or 8 bytes (int4: a 16-byte group's 32 accumulators left room for one row's loads in flight
// at 64 registers, two spilled 52 B; mirrored by ccoll/codecs/quant_kernels.py SUM_GROUP_WORDS)
template <class Tr, class F>
struct CqDecodeSum {
    static constexpr int G = F::G;
    static constexpr int GW = F::BITS == 4 ? 2 : CQ_GROUP_WORDS;
    static constexpr int GV = GW * G;
    // rows whose group loads are in flight together: 32 bytes of q per thread (Little's law, see the header)
    static constexpr int ROWS_IN_FLIGHT = 32 / (4 * GW);
    const cq_u8* payloads;
    cq_i64 p, row_nbytes, numel, block, scale_nbytes;
    CqDiv block_of_word;
    float* out;
    bool vec, vec_q, one_scale;
    CqRot rot;

    CQ_HD CqDecodeSum(const cq_u8* payloads_, cq_i64 p_, cq_i64 row_nbytes_, cq_i64 numel_, cq_i64 block_,
                      float* out_, cq_u32 rot_seed)
        : payloads(payloads_), p(p_), row_nbytes(row_nbytes_), numel(numel_), block(block_),
          scale_nbytes(cq_scale_nbytes<F>(numel_, block_)), block_of_word(block_ / G), out(out_),
          vec(cq_aligned16(out_)), vec_q(cq_aligned16(payloads_) && row_nbytes_ % 16 == 0),
          one_scale(block_ % GV == 0), rot(rot_seed, block_) {}

    CQ_HD cq_i64 ngroups() const { return ((numel + G - 1) / G + GW - 1) / GW; }
    CQ_HD cq_i64 nunits() const { return cq_nblocks(numel, block); }

    // a word's G decoded values, each rounded to the input type by R, added to the sums
    template <class R>
    static CQ_HD void add_rounded(float* acc, const float* v) {
#pragma unroll
        for (int k = 0; k < G; ++k) acc[k] = cq_add(acc[k], R::round(v[k]));
    }

    // row r's q group at word w0 (`have` values of it in the output) with scale0, the scale of its first
    // word, decoded, each value rounded to the input type and added to the sums
    CQ_HD void add_row(cq_i64 r, cq_i64 w0, cq_i64 have, const cq_u32* q, float scale0, float* acc) const {
        typedef typename Tr::Whole W;  // a NaN's bits do not matter: the sum is NaN and stored canonical
        if (one_scale && have >= GV && F::decodes_normal(scale0)) {  // the common case: no per-word tests
#pragma unroll
            for (int j = 0; j < GW; ++j) {
                float v[G];
                cq_decode_word<F>(q[j], scale0, v);
                add_rounded<typename Tr::Normal>(acc + j * G, v);
            }
            return;
        }
#pragma unroll
        for (int j = 0; j < GW; ++j) {
            if (j * G >= have) break;
            const float scale = one_scale || j == 0 ? scale0 : F::load_scale(payloads + r * row_nbytes, block_of_word(w0 + j));
            float v[G];
            cq_decode_word<F>(q[j], scale, v);
            add_rounded<W>(acc + j * G, v);
        }
    }

    CQ_HD void load_row(cq_i64 r, cq_i64 w0, cq_i64 b0, cq_u32* q, float& scale0) const {
        const cq_u8* row = payloads + r * row_nbytes;
        cq_load_group<GW>(reinterpret_cast<const cq_u32*>(row + scale_nbytes), w0, vec_q, q);
        scale0 = F::load_scale(row, b0);
    }

    CQ_HD void group(cq_i64 gi) const {
        const cq_i64 w0 = gi * GW;
        const cq_i64 have = numel - w0 * G;  // > 0: values of the group in the output
        float acc[GV];
#pragma unroll
        for (int k = 0; k < GV; ++k) acc[k] = 0.0f;
        const cq_i64 b0 = block_of_word(w0);
        // the group loads of ROWS_IN_FLIGHT rows are issued before any of them is used (a loop unrolled by the
        // compiler issues each row's loads after the previous row's branches); the adds stay in row order
        constexpr int R = ROWS_IN_FLIGHT;
        cq_i64 r = 0;
        for (; r + R <= p; r += R) {
            cq_u32 q[R][GW];
            float scale0[R];
#pragma unroll
            for (int i = 0; i < R; ++i) load_row(r + i, w0, b0, q[i], scale0[i]);
#pragma unroll
            for (int i = 0; i < R; ++i) add_row(r + i, w0, have, q[i], scale0[i], acc);
        }
        if constexpr (R > 1) {
            for (; r < p; ++r) {
                cq_u32 q[GW];
                float scale0;
                load_row(r, w0, b0, q, scale0);
                add_row(r, w0, have, q, scale0, acc);
            }
        }
#pragma unroll
        for (int j = 0; j < GW; ++j) {
            if (j * G >= have) break;
#pragma unroll
            for (int k = 0; k < G; ++k) acc[j * G + k] = cq_canonical_nan(acc[j * G + k]);
            cq_store_word<CqF32, G>(reinterpret_cast<cq_u32*>(out), (w0 + j) * G, (int)cq_min(G, have - j * G), vec,
                                    acc + j * G);
        }
    }

    // rotate=hadamard: block b by team t; each payload's block is rotated back and rounded to the input type
    // before it is added (the sum of the decodes, as decode_sum is defined), in row order
    CQ_HD void team_block(cq_i64 b, const CqTeam& t) const {
        block_rotated<0>(b, t);  // the host's team of one; GPU kernels: CqRotated
    }
    template <int NW>  // the lane's words, a constant in the GPU kernels (CqRotated), 0 at run time
    CQ_HD void block_rotated(cq_i64 b, const CqTeam& t) const {
        typedef typename Tr::Whole W;  // as in group
        const bool valid = b < nunits();
        const cq_i64 start = b * block;
        const cq_i64 len = valid ? cq_min(block, numel - start) : 0;
        const int nw = NW ? NW : (int)(block / (G * t.size));
        float acc[NW ? NW * G : CQ_ROT_MAXV], v[NW ? NW * G : CQ_ROT_MAXV];
#pragma unroll
        for (int i = 0; i < nw * G; ++i) acc[i] = 0.0f;
        for (cq_i64 r = 0; r < p; ++r) {
            const cq_u8* row = payloads + r * row_nbytes;
            const cq_u32* qwords = reinterpret_cast<const cq_u32*>(row + scale_nbytes);
            const float scale = valid ? F::load_scale(row, b) : 0.0f;
#pragma unroll
            for (int j = 0; j < nw; ++j) {
                const cq_i64 w = t.lane + (cq_i64)j * t.size;
                if (w * G < len) cq_decode_word<F>(qwords[start / G + w], scale, v + j * G);
                else for (int k = 0; k < G; ++k) v[j * G + k] = 0.0f;
            }
            rot.inverse<G>(v, nw, t, len == block);
#pragma unroll
            for (int i = 0; i < nw * G; ++i) acc[i] = cq_add(acc[i], W::round(v[i]));
        }
#pragma unroll
        for (int i = 0; i < nw * G; ++i) acc[i] = cq_canonical_nan(acc[i]);
#pragma unroll
        for (int j = 0; j < nw; ++j) {
            const cq_i64 w = t.lane + (cq_i64)j * t.size;
            const int count = (int)cq_min(G, len - w * G);
            if (count > 0) cq_store_word<CqF32, G>(reinterpret_cast<cq_u32*>(out), start + w * G, count, vec, acc + j * G);
        }
    }
};

// ------------------------------------------------------------------------------------------------
// GPU kernels: only the thread -> block/word mapping lives here

// a team of `team` lanes (a power of two <= 32) per unit (quant block of any row): op.team_block(unit, team)
template <class Op>
__device__ void cq_teams_kernel(const Op& op, int team) {
    const int lane = threadIdx.x & 31;
    const CqTeam t = {lane & (team - 1), team};
    // team is a power of two: shifts, not divisions; the team index is unsigned so that its 64-bit widening
    // needs no sign word held live across the loop (at the 64-register cap every invariant counts)
#ifdef __CUDA_ARCH__
    const int log2_team = __ffs(team) - 1;
#else
    const int log2_team = __builtin_ctz((unsigned)team);  // the simt build runs this on the host
#endif
    const cq_u32 team_of_lane = (cq_u32)lane >> log2_team;
    const int log2_teams_per_warp = 5 - log2_team;
    const cq_i64 warp = ((cq_i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const cq_i64 stride = (((cq_i64)gridDim.x * blockDim.x) >> 5) << log2_teams_per_warp;
    const cq_i64 units = op.nunits();
    // the loop bound is warp-uniform, so every lane reaches the team's shuffles
    for (cq_i64 base = warp << log2_teams_per_warp; base < units; base += stride)
        op.team_block(base + team_of_lane, t);
}

// one thread per 16-byte q group (decode_rows, decode_sum)
template <class Op>
__device__ void cq_groups_kernel(const Op& op) {
    const cq_i64 n = op.ngroups();
    for (cq_i64 i = (cq_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (cq_i64)gridDim.x * blockDim.x)
        op.group(i);
}

// extern "C" entry points: ccoll_{int8,int4,fp8e4m3,fp8e5m2}_{encode_rows,decode_rows,decode_sum}[_rot_w<W>]_{f32,bf16,f16}
// (ccoll/kernels/call.py FAMILIES / SIGNATURES / ROT_WORDS list them). Plain kernels contain no rotation code: the
// decodes run one thread per 16-byte q group. The _rot_w<W> kernels are rotate=hadamard with signs from rot_seed,
// one team of `team` lanes per block for every op, W q words per lane; their host twins are one _rot function
// each (a team of one).
// ptxas keeps a plain kernel within 64 registers at the launch's 256 threads per CTA (ccoll/kernels/call.py
// FAMILIES["quant"].threads): 4 CTAs, 32 warps per SM
#define CQ_THREADS 256
#define CQ_STREAMING __launch_bounds__(CQ_THREADS, 4)
#define CQ_GLOBALS(FMT, F, NAME, TR)                                                                      \
    extern "C" __global__ void CQ_STREAMING ccoll_##FMT##_encode_rows_##NAME(                             \
        const TR::storage* x, cq_i64 numel, cq_i64 rows, cq_i64 row_numel, cq_i64 block, int team,        \
        int stochastic, cq_u32 seed, float* feedback, cq_u8* out) {                                       \
        cq_teams_kernel(CqEncodeRows<TR, F, false>(x, numel, rows, row_numel, block, stochastic, seed,    \
                                                   feedback, out, 0u), team);                             \
    }                                                                                                     \
    extern "C" __global__ void ccoll_##FMT##_decode_rows_##NAME(                                          \
        const cq_u8* payloads, cq_i64 rows, cq_i64 row_numel, cq_i64 numel, cq_i64 block, TR::storage* y) { \
        cq_groups_kernel(CqDecodeRows<TR, F>(payloads, rows, row_numel, numel, block, y, 0u));             \
    }                                                                                                     \
    extern "C" __global__ void CQ_STREAMING ccoll_##FMT##_decode_sum_##NAME(                                           \
        const cq_u8* payloads, cq_i64 p, cq_i64 row_nbytes, cq_i64 numel, cq_i64 block, float* out) {     \
        cq_groups_kernel(CqDecodeSum<TR, F>(payloads, p, row_nbytes, numel, block, out, 0u));              \
    }

// rotate=hadamard, per words per lane W (CqRotated); no register cap: ptxas gives a lane's block all it needs
// (a cap of 128 spilled up to 1.7 KB)
#define CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, W)                                                             \
    extern "C" __global__ void ccoll_##FMT##_encode_rows_rot_w##W##_##NAME(                               \
        const TR::storage* x, cq_i64 numel, cq_i64 rows, cq_i64 row_numel, cq_i64 block, int team,        \
        int stochastic, cq_u32 seed, float* feedback, cq_u8* out, cq_u32 rot_seed) {                      \
        cq_teams_kernel(CqRotated<CqEncodeRows<TR, F, true>, W>{CqEncodeRows<TR, F, true>(                \
                            x, numel, rows, row_numel, block, stochastic, seed, feedback, out, rot_seed)}, \
                        team);                                                                            \
    }                                                                                                     \
    extern "C" __global__ void ccoll_##FMT##_decode_rows_rot_w##W##_##NAME(                               \
        const cq_u8* payloads, cq_i64 rows, cq_i64 row_numel, cq_i64 numel, cq_i64 block, TR::storage* y, \
        int team, cq_u32 rot_seed) {                                                                      \
        cq_teams_kernel(CqRotated<CqDecodeRows<TR, F>, W>{CqDecodeRows<TR, F>(payloads, rows, row_numel,   \
                                                                             numel, block, y, rot_seed)}, \
                        team);                                                                            \
    }                                                                                                     \
    extern "C" __global__ void ccoll_##FMT##_decode_sum_rot_w##W##_##NAME(                                \
        const cq_u8* payloads, cq_i64 p, cq_i64 row_nbytes, cq_i64 numel, cq_i64 block, float* out,       \
        int team, cq_u32 rot_seed) {                                                                      \
        cq_teams_kernel(CqRotated<CqDecodeSum<TR, F>, W>{CqDecodeSum<TR, F>(payloads, p, row_nbytes, numel, \
                                                                           block, out, rot_seed)},        \
                        team);                                                                            \
    }
// W per format (ccoll/kernels/call.py ROT_WORDS): blocks of <= 1024 values, a lane of a team of 32 holds at
// most 32 of them (CQ_ROT_MAXV), so 8 words for the 8-bit formats and 4 for int4
#define CQ_GLOBALS_ROT(FMT, F, NAME, TR)  \
    CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 1) \
    CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 2) \
    CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 4) \
    CQ_GLOBALS_ROT8_##FMT(FMT, F, NAME, TR)
#define CQ_GLOBALS_ROT8_int8(FMT, F, NAME, TR) CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 8)
#define CQ_GLOBALS_ROT8_fp8e4m3(FMT, F, NAME, TR) CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 8)
#define CQ_GLOBALS_ROT8_fp8e5m2(FMT, F, NAME, TR) CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 8)
#define CQ_GLOBALS_ROT8_int4(FMT, F, NAME, TR)

#define CQ_FORMAT(MACRO, FMT, F) \
    MACRO(FMT, F, f32, CqF32)    \
    MACRO(FMT, F, bf16, CqBF16)  \
    MACRO(FMT, F, f16, CqF16)
#define CQ_ALL_FORMATS(MACRO)             \
    CQ_FORMAT(MACRO, int8, CqInt8)        \
    CQ_FORMAT(MACRO, int4, CqInt4)        \
    CQ_FORMAT(MACRO, fp8e4m3, CqE4M3)     \
    CQ_FORMAT(MACRO, fp8e5m2, CqE5M2)

// CCOLL_QUANT_KERNELS selects which entry points an NVRTC build of this file defines (ccoll/kernels
// MODULE_PARTS): 1 the plain kernels only ("quant"), 2 the rotate=hadamard ones only ("quant_rot"), unset both
// (nvcc's compile check, the host build, simt). Split so that a run without rotate never pays NVRTC for the
// _rot_w<W> instantiations (their teams hold whole blocks in registers).
#if !defined(CCOLL_QUANT_KERNELS) || CCOLL_QUANT_KERNELS == 1
CQ_ALL_FORMATS(CQ_GLOBALS)
#endif
#if !defined(CCOLL_QUANT_KERNELS) || CCOLL_QUANT_KERNELS == 2
CQ_ALL_FORMATS(CQ_GLOBALS_ROT)
#endif

// ------------------------------------------------------------------------------------------------
// host build: the "emulated" backend (OpenMP over the same blocks / words; teams of one)

#ifdef CCOLL_HOST
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// work below this many values runs on the calling thread: a parallel region costs more than it saves
#define CQ_HOST_PARALLEL_MIN (1 << 15)

template <class Op>
static void cq_host_teams(const Op& op) {
    const cq_i64 units = op.nunits();
    const CqTeam t = {0, 1};
#pragma omp parallel for schedule(static)
    for (cq_i64 u = 0; u < units; ++u) op.team_block(u, t);
}

template <class Op>
static void cq_host_groups(const Op& op) {
    const cq_i64 n = op.ngroups();
#pragma omp parallel for schedule(static)
    for (cq_i64 i = 0; i < n; ++i) op.group(i);
}

template <class Tr, class F>
static void cq_host_groups(const CqDecodeRows<Tr, F>& op) {  // row by row: no division per group
    const cq_i64 rows = op.nrows();
    for (cq_i64 row = 0; row < rows; ++row) {
#pragma omp parallel for schedule(static)
        for (cq_i64 i = 0; i < op.groups_per_row; ++i) op.group_of_row(row, i);
    }
}

// ---- the CPU's streaming paths (host build only; the GPU kernels above are not involved) -------------
// The per-block / per-word functions above are written for a GPU lane: a value at a time with its tests. On
// a CPU core that is ~10x slower than memory. The int formats' plain (unrotated) ops are restated here as
// loops over a block's values with no per-value branch, which the compiler vectorises, in ONE pass per
// phase: encode_rows reads x (and the residuals) for the absmax, then again from L1 to quantize, store the
// q bytes and the new residuals; decode_sum adds each payload row into an L1-sized tile of the output. The
// fp32 operations are the same ones in the same order as CqEncodeRows / CqDecodeRows / CqDecodeSum (round
// to nearest by adding 1.5 * 2^23, exact for |v| < 2^22, as the torch backend does), so the bytes are the
// same: tests/unit/test_quant_rows.py compares them. Blocks these loops do not take --
// a block cut by the end of a row or of the tensor (or, stochastic, by a 2^32-element segment of indices) --
// run the general per-block code above.

// an input type's conversions written without branches (selects), so that loops over them vectorise; the
// same bits as the Tr functions (kernels/common.cuh)
template <class Tr>
struct CqCpu {
    static constexpr bool OK = false;
};
template <>
struct CqCpu<CqF32> {
    static constexpr bool OK = true;
    static inline float to_f(cq_u32 b) { return cq_u2f(b); }
    static inline float round(float f) { return f; }
    static inline cq_u32 from_f(float f) { return cq_f2u(f); }
};
template <>
struct CqCpu<CqBF16> {
    static constexpr bool OK = true;
    static inline float to_f(cq_u16 b) { return cq_u2f((cq_u32)b << 16); }
    static inline cq_u32 bits16(float f) {  // ccoll_conv::f32_to_bf16
        const cq_u32 u = cq_f2u(f);
        const cq_u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        return (u & 0x7fffffffu) > 0x7f800000u ? (cq_u32)ccoll_conv::BF16_NAN : r;
    }
    static inline float round(float f) { return cq_u2f(bits16(f) << 16); }
    static inline cq_u16 from_f(float f) { return (cq_u16)bits16(f); }
};

template <>
struct CqCpu<CqF16> {
    static constexpr bool OK = true;
    static inline float to_f(cq_u16 h) {  // ccoll_conv::f16_to_f32_int
        const cq_u32 sign = ((cq_u32)h & 0x8000u) << 16, a = (cq_u32)h & 0x7fffu;
        // a normal half's exponent and mantissa moved to fp32's places read as 2^-112 of its value: times
        // 2^112, exact; a subnormal one is m * 2^-24, exact (the value selected never comes from an fp32
        // subnormal operand, so a denormals-are-zero setting cannot change it); Inf / NaN (exponent 31) keep
        // their payload bits
        const cq_u32 normal = cq_f2u(cq_mul(cq_u2f(a << 13), 5.192296858534828e+33f));  // 2^112
        const cq_u32 sub = cq_f2u(cq_mul((float)(int)a, 5.9604644775390625e-08f));     // 2^-24
        return cq_u2f(sign | (a >= 0x7c00u ? 0x7f800000u | (a & 0x3ffu) << 13 : a >= 0x400u ? normal : sub));
    }
    static inline cq_u16 from_f(float f) {  // ccoll_conv::f32_to_f16_int
        const cq_u32 u = cq_f2u(f), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
        // subnormal halves (|f| < 2^-14): f + 0.5 rounds |f| to a multiple of 2^-24 (the fp32 spacing on
        // [0.5, 1)), to nearest even, and that multiple is the low bits of the sum
        const cq_u32 sub = cq_f2u(cq_add(cq_u2f(a), 0.5f)) - 0x3f000000u;
        const cq_u32 r = a - (112u << 23);
        const cq_u32 normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
        const cq_u32 h = a > 0x7f800000u   ? 0x7e00u | ((a >> 13) & 0x3ffu)
                         : a >= 0x477ff000u ? 0x7c00u
                         : a >= 0x38800000u ? normal
                                            : sub;
        return (cq_u16)(sign | h);
    }
    static inline float round(float f) { return to_f(from_f(f)); }
};

#define CQ_ROUND_MAGIC 12582912.0f  // 1.5 * 2^23: v + it rounds v to an integer, ties to even (|v| < 2^22)
#define CQ_ROUND_MAGIC_BITS 0x4B400000

// values per inner loop: q codes of a chunk are held in a small array, then packed (int4) and stored
#define CQ_CPU_CHUNK 64

template <class Tr, int BITS>
struct CqCpuEncode {
    typedef CqEncodeRows<Tr, CqInt<BITS>, false> Op;
    typedef typename Tr::storage S;
    typedef CqCpu<Tr> C;
    static constexpr int QMAX = CqInt<BITS>::QMAX;

    // block b of row `row`, whole and inside the tensor. FB: with error feedback; ST: stochastic rounding (the
    // block inside one 2^32-element segment of stochastic indices: one stream key)
    template <bool FB, bool ST>
    static void block(const Op& op, cq_i64 row, cq_i64 b) {
        const cq_i64 B = op.g.block, start = b * B, e0 = row * op.g.row_numel + start;
        const S* x = op.x + e0;
        float* r = FB ? op.feedback + e0 : nullptr;
        // pass 0: absmax of what is encoded (c = x + r rounded to the input type, or x), on the bit patterns
        cq_u32 amax = 0;
        for (cq_i64 k = 0; k < B; ++k) {
            const float s = FB ? C::round(cq_add(C::to_f(x[k]), r[k])) : C::to_f(x[k]);
            const cq_u32 a = cq_abs_bits(s);
            amax = a > amax ? a : amax;
        }
        const CqBlock bp = CqInt<BITS>::params(amax);
        cq_u8* payload = op.out + row * op.g.row_nbytes();
        cq_u32* qwords = reinterpret_cast<cq_u32*>(payload + op.g.scale_nbytes());
        CqInt<BITS>::store_scale(payload, b, bp);
        if (b == op.g.blocks_per_row - 1) op.g.zero_padding(payload, qwords, b, start, B);
        cq_u8* q = reinterpret_cast<cq_u8*>(qwords) + start * BITS / 8;
        if (!bp.finite) {  // a NaN / Inf block: q = 0, and its residuals (c - NaN) are not finite: 0
            memset(q, 0, (size_t)(B * BITS / 8));
            if (FB) memset(r, 0, (size_t)B * sizeof(float));
            return;
        }
        // pass 1 (the block is in L1): q = clamp(rint(s * enc)) (stochastic: clamp(floor(s * enc + u)), u from
        // the element's index as cq_uniform draws it), then r = c - decode rounded to the input type
        const float enc = bp.enc, scale = bp.scale;
        const cq_u32 key = ST ? cq_stream_key(op.seed, (cq_u64)e0) : 0u;
        for (cq_i64 k0 = 0; k0 < B; k0 += CQ_CPU_CHUNK) {
            const int n = (int)cq_min(CQ_CPU_CHUNK, B - k0);  // a multiple of 8
            int qi[CQ_CPU_CHUNK];
            for (int k = 0; k < n; ++k) {
                const float c = FB ? cq_add(C::to_f(x[k0 + k]), r[k0 + k]) : C::to_f(x[k0 + k]);
                const float s = FB ? C::round(c) : c;
                int v;
                if (ST) {  // |s * enc + u| <= qmax + 1: floor and the int conversion are exact
                    const cq_u32 h = cq_mix32(cq_mix32((cq_u32)(e0 + k0 + k) ^ key) + key);
                    const float u = cq_mul((float)(int)(h >> 8), 5.9604644775390625e-08f);  // 2^-24
                    v = (int)cq_floor(cq_add(cq_mul(s, enc), u));
                } else {
                    v = (int)cq_f2u(cq_add(cq_mul(s, enc), CQ_ROUND_MAGIC)) - CQ_ROUND_MAGIC_BITS;
                }
                v = v < -QMAX ? -QMAX : v > QMAX ? QMAX : v;
                qi[k] = v;
                if (FB) {
                    const float d = C::round(cq_mul((float)v, scale));
                    const float rr = cq_sub(c, d);
                    r[k0 + k] = cq_abs_bits(rr) >= CQ_INF_BITS ? 0.0f : rr;
                }
            }
            if (BITS == 8) {
                for (int k = 0; k < n; ++k) q[k0 + k] = (cq_u8)qi[k];
            } else {
                for (int j = 0; j < n / 2; ++j)
                    q[k0 / 2 + j] = (cq_u8)((qi[2 * j] & 0xf) | (qi[2 * j + 1] & 0xf) << 4);
            }
        }
    }

    static void run(const Op& op) {
        const cq_i64 units = op.nunits(), bpr = op.g.blocks_per_row;
        const CqTeam t = {0, 1};
        const bool fb = op.feedback != nullptr;
#pragma omp parallel for schedule(static) if (units * op.g.block >= CQ_HOST_PARALLEL_MIN)
        for (cq_i64 u = 0; u < units; ++u) {
            const cq_i64 row = u / bpr, b = u - row * bpr;
            const cq_i64 start = b * op.g.block;
            const cq_i64 e0 = row * op.g.row_numel + start;
            const bool whole = start + op.g.block <= op.g.row_numel && e0 + op.g.block <= op.g.numel;
            if (!whole || (op.stochastic && (e0 >> 32) != ((e0 + op.g.block - 1) >> 32))) op.team_block(u, t);
            else if (op.stochastic) fb ? block<true, true>(op, row, b) : block<false, true>(op, row, b);
            else fb ? block<true, false>(op, row, b) : block<false, false>(op, row, b);
        }
    }
};

// the `n` values of one block at q value index i0 (even for int4) decoded (q * scale) and passed to
// put(k, value): one loop without a temporary array, vectorised with what put does
template <int BITS, class Put>
static inline void cq_cpu_decode(const cq_u8* qbytes, cq_i64 i0, cq_i64 n, float scale, const Put& put) {
    if (BITS == 8) {
        const signed char* q = reinterpret_cast<const signed char*>(qbytes) + i0;
        for (cq_i64 k = 0; k < n; ++k) put(k, cq_mul((float)q[k], scale));
    } else {
        const cq_u8* q = qbytes + i0 / 2;
        for (cq_i64 j = 0; j < n / 2; ++j) {  // a byte: the even value in the low nibble
            put(2 * j, cq_mul((float)(((int)(q[j] & 0xf) ^ 8) - 8), scale));
            put(2 * j + 1, cq_mul((float)(((int)(q[j] >> 4) ^ 8) - 8), scale));
        }
        if (n % 2) put(n - 1, cq_mul((float)(((int)(q[n / 2] & 0xf) ^ 8) - 8), scale));
    }
}

// outputs of at least this many bytes are written with streaming (non-temporal) stores: they cannot stay in
// cache anyway, and a plain store first reads each line it writes (its cost is that of a copy's read)
#define CQ_CPU_STREAM_MIN_BYTES (8 << 20)

// o[k] = v[k] for k < n (n a multiple of 4, o and v 16-byte aligned): streaming stores where the host has them
static inline void cq_cpu_stream(float* o, const float* v, cq_i64 n) {
#if defined(__SSE2__)
    for (cq_i64 k = 0; k < n; k += 4) _mm_stream_ps(o + k, _mm_load_ps(v + k));
#else
    for (cq_i64 k = 0; k < n; ++k) o[k] = v[k];
#endif
}

// the streaming stores of this thread ordered before whatever the caller does next (another thread reads them)
static inline void cq_cpu_stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

// values of an fp32 piece held in L1 (decode_sum's tile of the output, decode_rows' streamed piece)
#define CQ_CPU_SUM_TILE 2048

// decode_rows: each block of each row decoded straight into the output, rounded to its type
template <class Tr, int BITS>
static void cq_cpu_decode_rows(const CqDecodeRows<Tr, CqInt<BITS>>& op) {
    typedef CqCpu<Tr> C;
    typedef typename Tr::storage S;
    const cq_i64 rows = op.nrows(), bpr = op.g.blocks_per_row, B = op.g.block;
    const cq_i64 units = rows * bpr;
    // fp32 output of a large tensor: streaming stores (the int4 start index of a piece stays even: B is)
    const bool stream = sizeof(S) == 4 && op.g.numel * 4 >= CQ_CPU_STREAM_MIN_BYTES;
#pragma omp parallel if (units * B >= CQ_HOST_PARALLEL_MIN)
    {
#pragma omp for schedule(static)
    for (cq_i64 u = 0; u < units; ++u) {
        const cq_i64 row = u / bpr, b = u - row * bpr, start = b * B, e0 = row * op.g.row_numel + start;
        const cq_i64 len = cq_min(cq_min(B, op.g.row_numel - start), op.g.numel - e0);
        if (len <= 0) continue;
        const cq_u8* payload = op.payloads + row * op.g.row_nbytes();
        const cq_u8* q = payload + op.g.scale_nbytes();
        const float scale = CqInt<BITS>::load_scale(payload, b);
        S* y = op.y + e0;
        if (!stream || (reinterpret_cast<cq_u64>(y) & 15u) != 0) {
            cq_cpu_decode<BITS>(q, start, len, scale, [y](cq_i64 k, float v) { y[k] = C::from_f(v); });
            continue;
        }
        for (cq_i64 k0 = 0; k0 < len; k0 += CQ_CPU_SUM_TILE) {  // fp32 output: through an L1 piece, streamed
            const cq_i64 n = cq_min(CQ_CPU_SUM_TILE, len - k0), whole = n / 4 * 4;
            alignas(64) float v[CQ_CPU_SUM_TILE];
            cq_cpu_decode<BITS>(q, start + k0, n, scale, [&v](cq_i64 k, float x) { v[k] = x; });
            float* o = reinterpret_cast<float*>(y + k0);
            cq_cpu_stream(o, v, whole);
            for (cq_i64 k = whole; k < n; ++k) o[k] = v[k];
        }
    }
    if (stream) cq_cpu_stream_fence();  // (the loop's implicit barrier waits for every thread after this)
    }
}

// decode_sum: the output in tiles of CQ_CPU_SUM_TILE values (L1-resident); each row's decode of the tile,
// rounded to the input type, added in row order from +0.0 (row 0: 0.0 + its decode, so -0.0 becomes +0.0 as
// in the general code); NaN sums stored canonical
template <class Tr, int BITS>
static void cq_cpu_decode_sum(const CqDecodeSum<Tr, CqInt<BITS>>& op) {
    typedef CqCpu<Tr> C;
    const cq_i64 numel = op.numel, B = op.block;
    const cq_i64 tiles = (numel + CQ_CPU_SUM_TILE - 1) / CQ_CPU_SUM_TILE;
    const bool stream = numel * 4 >= CQ_CPU_STREAM_MIN_BYTES && (reinterpret_cast<cq_u64>(op.out) & 15u) == 0;
#pragma omp parallel if (numel * op.p >= CQ_HOST_PARALLEL_MIN)
    {
#pragma omp for schedule(static)
        for (cq_i64 ti = 0; ti < tiles; ++ti) {
            const cq_i64 j0 = ti * CQ_CPU_SUM_TILE, j1 = cq_min(numel, j0 + CQ_CPU_SUM_TILE);
            alignas(64) float acc[CQ_CPU_SUM_TILE];
            if (op.p == 0)
                for (cq_i64 k = 0; k < j1 - j0; ++k) acc[k] = 0.0f;
            for (cq_i64 r = 0; r < op.p; ++r) {
                const cq_u8* row = op.payloads + r * op.row_nbytes;
                for (cq_i64 s0 = j0; s0 < j1;) {  // the tile's pieces of one block each (s0 even: B and the tile are)
                    const cq_i64 b = s0 / B, s1 = cq_min(j1, (b + 1) * B);
                    float* a = acc + (s0 - j0);
                    const cq_u8* q = row + op.scale_nbytes;
                    const float scale = CqInt<BITS>::load_scale(row, b);
                    if (r == 0)
                        cq_cpu_decode<BITS>(q, s0, s1 - s0, scale, [a](cq_i64 k, float v) { a[k] = cq_add(0.0f, C::round(v)); });
                    else
                        cq_cpu_decode<BITS>(q, s0, s1 - s0, scale, [a](cq_i64 k, float v) { a[k] = cq_add(a[k], C::round(v)); });
                    s0 = s1;
                }
            }
            for (cq_i64 k = 0; k < j1 - j0; ++k) acc[k] = cq_canonical_nan(acc[k]);
            float* o = op.out + j0;
            const cq_i64 whole = stream ? (j1 - j0) / 4 * 4 : 0;
            cq_cpu_stream(o, acc, whole);
            for (cq_i64 k = whole; k < j1 - j0; ++k) o[k] = acc[k];
        }
        if (stream) cq_cpu_stream_fence();
    }
}

// the entry points' dispatch: the CPU paths where they exist (int formats, f32 / bf16), else the general code
template <class Tr, class F>
static void cq_host_encode_rows(const CqEncodeRows<Tr, F, false>& op) {
    if constexpr (CqCpu<Tr>::OK && (F::BITS == 8 || F::BITS == 4) && F::SCALE_BYTES == 4)
        CqCpuEncode<Tr, F::BITS>::run(op);
    else
        cq_host_teams(op);
}
template <class Tr, class F>
static void cq_host_decode_rows(const CqDecodeRows<Tr, F>& op) {
    if constexpr (CqCpu<Tr>::OK && (F::BITS == 8 || F::BITS == 4) && F::SCALE_BYTES == 4)
        cq_cpu_decode_rows<Tr, F::BITS>(op);
    else
        cq_host_groups(op);
}
template <class Tr, class F>
static void cq_host_decode_sum(const CqDecodeSum<Tr, F>& op) {
    if constexpr (CqCpu<Tr>::OK && (F::BITS == 8 || F::BITS == 4) && F::SCALE_BYTES == 4)
        cq_cpu_decode_sum<Tr, F::BITS>(op);
    else
        cq_host_groups(op);
}

// the calling thread's OpenMP team size for the entry points below (ccoll/codecs/quant_kernels.py passes
// torch.get_num_threads(): the caller's own budget of cores)
extern "C" void ccoll_host_quant_set_threads(int n) { omp_set_num_threads(n > 0 ? n : 1); }

#define CQ_HOST(FMT, F, NAME, TR)                                                                         \
    extern "C" void ccoll_host_##FMT##_encode_rows_##NAME(const void* x, cq_i64 numel, cq_i64 rows,       \
                                                          cq_i64 row_numel, cq_i64 block, int stochastic, \
                                                          cq_u32 seed, void* feedback, void* out) {       \
        cq_host_encode_rows(CqEncodeRows<TR, F, false>(static_cast<const TR::storage*>(x), numel, rows,   \
                                                       row_numel, block, stochastic, seed,                \
                                                       static_cast<float*>(feedback),                     \
                                                       static_cast<cq_u8*>(out), 0u));                    \
    }                                                                                                     \
    extern "C" void ccoll_host_##FMT##_encode_rows_rot_##NAME(const void* x, cq_i64 numel, cq_i64 rows,   \
                                                              cq_i64 row_numel, cq_i64 block,             \
                                                              int stochastic, cq_u32 seed, void* feedback, \
                                                              void* out, cq_u32 rot_seed) {               \
        cq_host_teams(CqEncodeRows<TR, F, true>(static_cast<const TR::storage*>(x), numel, rows, row_numel, \
                                                block, stochastic, seed, static_cast<float*>(feedback),   \
                                                static_cast<cq_u8*>(out), rot_seed));                     \
    }                                                                                                     \
    extern "C" void ccoll_host_##FMT##_decode_rows_##NAME(const void* payloads, cq_i64 rows,              \
                                                          cq_i64 row_numel, cq_i64 numel, cq_i64 block,   \
                                                          void* y) {                                      \
        cq_host_decode_rows(CqDecodeRows<TR, F>(static_cast<const cq_u8*>(payloads), rows, row_numel,      \
                                               numel, block, static_cast<TR::storage*>(y), 0u));          \
    }                                                                                                     \
    extern "C" void ccoll_host_##FMT##_decode_rows_rot_##NAME(const void* payloads, cq_i64 rows,          \
                                                              cq_i64 row_numel, cq_i64 numel,             \
                                                              cq_i64 block, void* y, cq_u32 rot_seed) {   \
        cq_host_teams(CqDecodeRows<TR, F>(static_cast<const cq_u8*>(payloads), rows, row_numel, numel,    \
                                          block, static_cast<TR::storage*>(y), rot_seed));                \
    }                                                                                                     \
    extern "C" void ccoll_host_##FMT##_decode_sum_##NAME(const void* payloads, cq_i64 p,                  \
                                                         cq_i64 row_nbytes, cq_i64 numel, cq_i64 block,   \
                                                         void* out) {                                     \
        cq_host_decode_sum(CqDecodeSum<TR, F>(static_cast<const cq_u8*>(payloads), p, row_nbytes, numel,   \
                                             block, static_cast<float*>(out), 0u));                       \
    }                                                                                                     \
    extern "C" void ccoll_host_##FMT##_decode_sum_rot_##NAME(const void* payloads, cq_i64 p,              \
                                                             cq_i64 row_nbytes, cq_i64 numel,             \
                                                             cq_i64 block, void* out, cq_u32 rot_seed) {  \
        cq_host_teams(CqDecodeSum<TR, F>(static_cast<const cq_u8*>(payloads), p, row_nbytes, numel,       \
                                         block, static_cast<float*>(out), rot_seed));                     \
    }

CQ_ALL_FORMATS(CQ_HOST)
#endif  // CCOLL_HOST
