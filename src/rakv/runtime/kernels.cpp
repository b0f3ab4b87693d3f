// The CPU kernels of the compact forward (rakv.runtime.compact): one GEMM for every row count, attention per query
// row, and the row-wise RMSNorm / LayerNorm / RoPE / SiLU*up / GELU. Compiled on first use for the machine it runs on
// (rakv.runtime.kernels.native); AVX2 + FMA + F16C are required, AVX-512 and VNNI used where the build's -march has
// them.
//
// Why hand-written: every row of every batched forward must come out bit-identical to the same row computed alone
// (a decode step alone, inside a verify of k + 1 rows, beside other requests' rows, or as one row of a prefill chunk
// of any size). BLAS libraries pick code paths by the matrix shape, so a row's sum depends on how many rows are
// computed with it (MKL's sgemm takes other paths for 1-3, 5-7 and 9-11 rows); torch's vectorised elementwise loops
// treat the tail of a buffer with scalar code, so an element's result can depend on where it falls in the batch.
// No library offers a CPU GEMM that is both batch-invariant and at the machine's price, so:
//
// GEMM, y = x W^T. W is packed once into panels of 32 outputs, [ceil(N / 32)][K][32], so that the weights a thread
// needs are one contiguous stream. A micro-kernel keeps 32 outputs x R rows of accumulators in registers (with
// AVX2's sixteen 8-lane registers, four vectors per row and R = 2; with AVX-512's thirty-two 16-lane registers, two
// vectors per row and R = 6, or 12 when there are more than 16 rows) and walks k in order; K is cut into blocks
// that stay in L1 (16 KB of weights), the partial sums going through memory between blocks, which does not change
// their order. Each output is therefore one chain of fused multiply-adds over k = 0 .. K - 1, starting from zero,
// whatever the other rows are, however rows are grouped and whatever the vector width (a lane never sees another):
// batch invariance by construction, and the same bits from an AVX2 build as from an AVX-512 one. Threads split the
// output panels, never k. With few rows a pass streams the weights once (the memory's price); with many, each
// 16 KB block is reused from L1 by every row (the FMA units' price).
//
// Measured on a 2-core Sapphire Rapids guest (2 threads, SmolLM2's projections; issue 40): with AVX-512, 16-lane
// FMAs took 512 rows from ~207 to ~300 GFLOPS (the FMA peak fma_peak_gflops measures is ~490 with 16 lanes, ~262
// with 8) and 16 rows from 1.21x to 1.1x one row. Tried and not kept: for more than 16 rows, a thread's panels
// eight at a time with k outermost, the prefetches out of the micro-kernel (300-380 GFLOPS at 512 rows with the
// weights in cache, but slower from 32 rows up with them streaming from memory, prefill of 64 tokens 57 -> 71 ms:
// jumping between panels defeats the hardware's stream prefetch), 32 KB K blocks (5 % faster at 512 rows here,
// but they would not stay in the 32 KB L1 of many AVX2 and AVX-512 CPUs), 14 rows per call with AVX-512 (slower:
// 294 GFLOPS), 8 rows per call up to 16 rows (8 rows 1.05x one row, against 0.95x six at a time); 6 x 16 tiles over
// rows copied side by side, K blocks of 192, the classic AVX2 register tile (12 chains instead of 8): with 2
// threads 512 rows were no faster and 4-16 rows slower (the extra pass copying the rows, and two half-panel tiles
// per block where one full-panel tile reads each weight once).
//
// int8 GEMM (the draft): weights int8 with one scale per output, packed [G][K / 4][32][4]; each row of x quantised
// to int8 on its own (scale max |x| / 127); products summed as exact int32s (VNNI's dpbusd where the CPU has it,
// 16-bit multiply-adds otherwise: the same integers), then scaled. Integer sums are exact, so no order can change a
// row's result; the draft's numerics are free (its proposals are verified) and it costs a quarter of the target's
// bytes and, with VNNI, a quarter of its arithmetic (a draft prefill is compute-bound).
//
// Block-quantised GEMM (a target at precision q4_1: the GGUF's Q4_1 / Q8_0 blocks, fp32 activations): each 32 x 32
// block dequantised exactly (gemm_blocks says how; in registers for few rows) with the fp32 micro-kernels' FMA
// chains, so a row's result is bitwise the fp32 GEMM's over the dequantised weights, batch-invariant by the same
// argument.
//
// Attention: per (query row, head) a fixed order over the keys 0 .. position (scores in groups of four keys, one
// reduction tree per key; softmax sums in eight lanes, then one tree), so a chunked prefill's rows equal a whole
// prefill's, and a request's rows are the same alone or in any batch. One call per layer handles every segment of a
// batched forward and writes its new K/V first.
//
// Elementwise functions (exp, SiLU, GELU) use one vectorised exp for every element (tails are padded, never computed
// by other code), and each row's reductions (norms) have one fixed order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "rakv's compact kernels need AVX2, FMA and F16C (use kernels=stock on this machine)"
#endif

namespace {

constexpr int64_t kPanel = 32;           // outputs per packed panel (four vectors of eight)
constexpr int64_t kBlockBytes = 16384;  // weights per K block: stays in L1 while every row uses it

// ---------------------------------------------------------------------------------------------------------------
// vector math

inline float hsum8(__m256 v) {  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): one fixed tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x, Cephes' single-precision polynomial (relative error ~2e-7); inputs clamped to [-87.3, 88.3]
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// a / (1 + e^-a) * b: SiLU(a) * b (b = 1: SiLU)
inline __m256 silu8(__m256 a) {
  return _mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), a))));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
inline __m256 gelu8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// the first n (< 8) lanes of p; the rest zero
inline __m256 load_partial(const float* p, int64_t n) {
  alignas(32) float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(tmp, p, n * sizeof(float));
  return _mm256_load_ps(tmp);
}
inline void store_partial(float* p, __m256 v, int64_t n) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  std::memcpy(p, tmp, n * sizeof(float));
}

// f(x) for every element of a row of n floats, eight at a time; the tail through the same vector code
template <typename F>
inline void map_row(const float* x, float* y, int64_t n, F f) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(y + c, f(_mm256_loadu_ps(x + c)));
  if (c < n) store_partial(y + c, f(load_partial(x + c, n - c)), n - c);
}

// rows [0, rows) in parallel when there is enough work; each row is computed by the same code either way
template <typename F>
inline void for_rows(int64_t rows, int64_t work_per_row, F f) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_row, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// GEMM

// four vectors of eight weights at one k of a panel
inline void weights_at(const float* p, __m256& w0, __m256& w1, __m256& w2, __m256& w3) {
  w0 = _mm256_loadu_ps(p); w1 = _mm256_loadu_ps(p + 8); w2 = _mm256_loadu_ps(p + 16); w3 = _mm256_loadu_ps(p + 24);
}

// acc[r][0..32) += sum over k in [0, kn) of x[r][k] * panel[k][0..32), for R rows; acc starts at zero when `zero`.
// The FMA order per output is k ascending, whatever R is. The loops over rows and vectors are unrolled so that the
// accumulators stay in registers; the empty asm keeps the four weight vectors in registers too (GCC would otherwise
// fold them into every FMA as memory operands: R times the loads, which halved the throughput).
// `prefetch`: lines of the weights two blocks ahead to bring into L2 while this call computes, spread evenly over
// its k (gemm_packed deals each row group of a block its share of the block two ahead, so that the memory keeps
// streaming however many row groups a block has: when only the first group prefetched its whole share, the
// others computed with no line in flight, and 16 rows cost 1.65-1.84x one row (issue 40); without any prefetch,
// 8 rows cost 1.4-1.7x one row, with it 1.03x, measured on SmolLM2's shapes).
struct Prefetch {
  const char* lines = nullptr;
  int64_t count = 0;
};

template <int R, typename T>
inline void micro(const T* panel, int64_t kn, const float* x, int64_t ldx, float* acc, bool zero, Prefetch prefetch) {
  __m256 a[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) a[r][v] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kPanel + v * 8);
  const char* line = prefetch.lines;  // the spread counted by addition (micro_half says why)
  int64_t owed = 0;
  for (int64_t k = 0; k < kn; ++k) {
    __m256 w0, w1, w2, w3;
    weights_at(panel + k * kPanel, w0, w1, w2, w3);
    asm("" : "+x"(w0), "+x"(w1), "+x"(w2), "+x"(w3));
    for (owed += prefetch.count; owed >= kn; owed -= kn, line += 64) _mm_prefetch(line, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      a[r][0] = _mm256_fmadd_ps(xv, w0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(xv, w1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(xv, w2, a[r][2]);
      a[r][3] = _mm256_fmadd_ps(xv, w3, a[r][3]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(acc + r * kPanel + v * 8, a[r][v]);
}

#if defined(__AVX512F__)
// The same micro-kernel with AVX-512's 16-lane vectors: a panel's 32 outputs are two vectors instead of four. A lane
// never sees another lane, so each output is the same chain of fused multiply-adds over k as with eight lanes (the
// bits do not depend on the build's vector width: tests/test_kernels.py), at twice the work per instruction; on a
// CPU with two 512-bit FMA units (Sapphire Rapids) that is twice the arithmetic per cycle, where a GEMM of 16 or more
// rows is bound.
template <int R>
inline void micro16(const float* panel, int64_t kn, const float* x, int64_t ldx, float* acc, bool zero,
                    Prefetch prefetch) {
  __m512 a[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) a[r][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * kPanel + v * 16);
  const char* line = prefetch.lines;  // the spread counted by addition (micro_half says why)
  int64_t owed = 0;
  for (int64_t k = 0; k < kn; ++k) {
    __m512 w0 = _mm512_loadu_ps(panel + k * kPanel), w1 = _mm512_loadu_ps(panel + k * kPanel + 16);
    asm("" : "+v"(w0), "+v"(w1));
    for (owed += prefetch.count; owed >= kn; owed -= kn, line += 64) _mm_prefetch(line, _MM_HINT_T1);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      a[r][0] = _mm512_fmadd_ps(xv, w0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(xv, w1, a[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(acc + r * kPanel + v * 16, a[r][v]);
}
#endif

#if !defined(__AVX512F__)
// With AVX2's sixteen vector registers a full panel (four vectors per row) fits only two rows, whose eight chains of
// FMAs (each waiting four cycles for the last) keep two FMA units barely fed and load a weight vector per two FMAs.
// From three rows on, a panel is computed as two halves of 16 outputs each, six rows at a time: twelve accumulators
// + two weight vectors + one broadcast, twelve FMAs per two weight loads. A half is one of the two cache lines of
// each k of the panel, so the block in L1 is read once per half. Each output is still one chain over k in order
// from its starting value: the same bits as the full-panel kernel (tests/test_kernels.py).
template <int R>
inline void micro_half(const float* panel, int64_t kn, const float* x, int64_t ldx, float* acc, bool zero,
                       Prefetch prefetch) {
  __m256 a[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) a[r][v] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kPanel + v * 8);
  // the block's share spread evenly over k, counted by addition (Bresenham). It was counted by
  // `issued * kn < (k + 1) * count`, two multiplies and two compares per k beside the FMAs; by addition, SmolLM2's
  // projections with their weights streaming (AVX2, 2 threads) went 64 rows 144 -> 84 ms, 512 rows 826 -> 727 ms,
  // 16 rows 36 -> 25-31 ms (one row 17-20 ms), with this kernel's halves; the same bits.
  const char* line = prefetch.lines;
  int64_t owed = 0;
  for (int64_t k = 0; k < kn; ++k) {
    __m256 w0 = _mm256_loadu_ps(panel + k * kPanel), w1 = _mm256_loadu_ps(panel + k * kPanel + 8);
    asm("" : "+x"(w0), "+x"(w1));
    for (owed += prefetch.count; owed >= kn; owed -= kn, line += 64) _mm_prefetch(line, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      a[r][0] = _mm256_fmadd_ps(xv, w0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(xv, w1, a[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) _mm256_storeu_ps(acc + r * kPanel + v * 8, a[r][v]);
}

// both halves of a panel for R rows, the block's prefetch share split between them
template <int R>
inline void micro_halves(const float* panel, int64_t kn, const float* x, int64_t ldx, float* acc, bool zero,
                         Prefetch prefetch) {
  const int64_t first = prefetch.count / 2;
  micro_half<R>(panel, kn, x, ldx, acc, zero, Prefetch{prefetch.lines, first});
  micro_half<R>(panel + 16, kn, x, ldx, acc + 16, zero, Prefetch{prefetch.lines + first * 64, prefetch.count - first});
}
#endif

// rows per micro-kernel call: the accumulators + the weights + 1 broadcast must fit the vector registers. With
// AVX-512 (32 registers, two 16-lane vectors per row of a panel), up to 16 rows go six at a time and more rows twelve
// at a time (measured on SmolLM2's projections, 2 threads: 8 rows cost 0.95x one row six at a time and 1.05x eight
// at a time; 512 rows ran at ~300 GFLOPS twelve at a time, ~280 six or eight at a time). With AVX2 (16 registers),
// one or two rows go through the full panel, more six at a time through its halves (micro_half). Which rows share a
// call never changes a row's sums.
#if defined(__AVX512F__)
constexpr int kRowsFew = 6, kRowsMany = 12;
inline int64_t rows_per_call(int64_t M) { return M > 16 ? kRowsMany : kRowsFew; }
#else
constexpr int kRowsFew = 2, kRowsMany = 6;
inline int64_t rows_per_call(int64_t M) { return M > 2 ? kRowsMany : kRowsFew; }
#endif
constexpr int kRowsI8 = kRowsFew;  // the int8 kernel's eight-lane integer tiles: 4 R + 4 + 1 registers
// Up to kRowsFew rows (one full-panel micro-kernel call per block) a GEMM streams its weights with the hardware's
// prefetch alone: the software prefetch two blocks ahead, which more rows need (micro says why), slowed these down.
// Measured on SmolLM2's projections, 2 threads, interleaved (issue 40): AVX-512 EPYC, without it one row 0.93x (fp32)
// and 0.76x (int8) of the time with it, 3, 5 and 6 rows 0.85-0.93x, 8 rows unchanged; its AVX2 build (x86-64-v3),
// 1 and 2 rows 0.88x and 0.93x, while 3 and 5 rows, computed as two half panels, took 1.3-1.4x without it.
constexpr int64_t kFewRowsStream = kRowsFew;

template <typename T>
inline void micro_rows(int64_t rows, const T* panel, int64_t kn, const float* x, int64_t ldx, float* acc, bool zero,
                       Prefetch prefetch) {
#if defined(__AVX512F__)
  switch (rows) {
    case 1: micro16<1>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 2: micro16<2>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 3: micro16<3>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 4: micro16<4>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 5: micro16<5>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 6: micro16<6>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 7: micro16<7>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 8: micro16<8>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 9: micro16<9>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 10: micro16<10>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 11: micro16<11>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 12: micro16<12>(panel, kn, x, ldx, acc, zero, prefetch); break;
  }
#else
  if (rows <= kRowsFew) {  // one or two rows (a large GEMM's last call too): the full panel
    if (rows == 1) micro<1>(panel, kn, x, ldx, acc, zero, prefetch);
    else micro<2>(panel, kn, x, ldx, acc, zero, prefetch);
    return;
  }
  switch (rows) {
    case 1: micro_halves<1>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 2: micro_halves<2>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 3: micro_halves<3>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 4: micro_halves<4>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 5: micro_halves<5>(panel, kn, x, ldx, acc, zero, prefetch); break;
    case 6: micro_halves<6>(panel, kn, x, ldx, acc, zero, prefetch); break;
  }
#endif
}

// y[M, N] = ((x[M, K] @ W^T) * scale + bias) + residual, W packed [G][K][32]
// y[r][n0 .. n0 + 32) for every row r from a panel's sums: ((sum * row_scale[r]) * scale[n] + bias[n]) + residual,
// each factor only where given. Integer sums (acc_int) are converted to float first, exactly as written.
inline void epilogue(const float* acc, int64_t M, int64_t n0, int64_t N, const float* row_scale, const float* scale,
                     const float* bias, const float* residual, float* Y, const int32_t* acc_int = nullptr) {
  const int64_t width = std::min(kPanel, N - n0);
  for (int64_t r = 0; r < M; ++r) {
    float* y = Y + r * N + n0;
    const float* res = residual ? residual + r * N + n0 : nullptr;
    if (width == kPanel) {  // the same IEEE operations as below, eight at a time
      for (int64_t c = 0; c < kPanel; c += 8) {
        __m256 v = acc_int ? _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                 acc_int + r * kPanel + c)))
                           : _mm256_loadu_ps(acc + r * kPanel + c);
        if (row_scale) v = _mm256_mul_ps(v, _mm256_set1_ps(row_scale[r]));
        if (scale) v = _mm256_mul_ps(v, _mm256_loadu_ps(scale + n0 + c));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0 + c));
        if (res) v = _mm256_add_ps(v, _mm256_loadu_ps(res + c));
        _mm256_storeu_ps(y + c, v);
      }
      continue;
    }
    for (int64_t c = 0; c < width; ++c) {
      float v = acc_int ? static_cast<float>(acc_int[r * kPanel + c]) : acc[r * kPanel + c];
      if (row_scale) v = v * row_scale[r];
      if (scale) v = v * scale[n0 + c];
      if (bias) v = v + bias[n0 + c];
      if (res) v = v + res[c];
      y[c] = v;
    }
  }
}

void gemm_packed(const float* X, const float* P, int64_t M, int64_t K, int64_t N, const float* bias,
                 const float* residual, float* Y) {
  const int64_t groups = (N + kPanel - 1) / kPanel;
  const int64_t kc = kBlockBytes / (kPanel * static_cast<int64_t>(sizeof(float)));  // a block fills 16 KB
  const int64_t ahead = 2 * kBlockBytes / static_cast<int64_t>(sizeof(float));  // prefetch distance, in weights
  const int64_t kRows = rows_per_call(M), row_groups = (M + kRows - 1) / kRows;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc_buffer(static_cast<size_t>(M) * kPanel);  // this panel's partial sums, all rows
    float* acc = acc_buffer.data();
    for (int64_t g = g0; g < g1; ++g) {
      const float* panel = P + g * K * kPanel;
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t kn = std::min(kc, K - k0);
        // the block two ahead (the next panel's first blocks at a panel's end), a share per row group
        const char* next = reinterpret_cast<const char*>(panel + k0 * kPanel + ahead);
        const int64_t lines = kn * kPanel * static_cast<int64_t>(sizeof(float)) / 64;
        for (int64_t r = 0, group = 0; r < M; r += kRows, ++group) {
          const int64_t first = group * lines / row_groups, last = (group + 1) * lines / row_groups;
          micro_rows(std::min<int64_t>(kRows, M - r), panel + k0 * kPanel, kn, X + r * K + k0, K, acc + r * kPanel,
                     k0 == 0, M > kFewRowsStream ? Prefetch{next + first * 64, last - first} : Prefetch{});
        }
      }
      epilogue(acc, M, g * kPanel, N, nullptr, nullptr, bias, residual, Y);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// int8 GEMM of the draft: int8 weights (one scale per output) and int8 activations (one scale per row), integer sums

// Which integers the int8 GEMM sums. With VNNI, dpbusd multiplies unsigned by signed bytes, so each row of x is
// stored + 128 as unsigned bytes and the 128 per element comes back out through the weights' row sums (colsum).
// Without VNNI (AVX2), x's bytes are read back as signed (x ^ 0x80) and multiplied with maddubs (unsigned |x| by
// sign(x) * w: two products of at most 127 * 128 per 16-bit lane, which cannot saturate), then madd by ones to
// int32: the signed products directly, no row-sum correction. Both give sum_k x_q[k] W_q[k] exactly: the same bits.
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
constexpr bool kBiasedX = true;
#else
constexpr bool kBiasedX = false;
#endif

// acc[i] += sum of the four products x[4i..4i+3] * w[4i..4i+3] (w signed bytes). x given twice: `xa` what the dot
// multiplies (VNNI: x + 128 unsigned; AVX2: |x|), `xs` x as signed bytes (AVX2: its signs).
inline __m256i dot4(__m256i acc, __m256i xa, __m256i xs, __m256i w) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)xs;
  return _mm256_dpbusd_epi32(acc, xa, w);
#elif defined(__AVXVNNI__)
  (void)xs;
  return _mm256_dpbusd_avx_epi32(acc, xa, w);
#else
  const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xs));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// acc[r][0..32) += sum over groups q in [0, qn) of four k's: x[r] (4 bytes per group, + 128 unsigned) . panel[q] (32
// outputs x 4 signed bytes). panel: [qn][32][4].
template <int R>
inline void micro_i8(const int8_t* panel, int64_t qn, const uint8_t* x, int64_t ldx, int32_t* acc, bool zero,
                     int64_t ahead) {
  __m256i a[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      a[r][v] = zero ? _mm256_setzero_si256()
                     : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + r * kPanel + v * 8));
  for (int64_t q = 0; q < qn; ++q) {
    const int8_t* w = panel + q * kPanel * 4;
    __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
    __m256i w2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64));
    __m256i w3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 96));
    if (kBiasedX) asm("" : "+x"(w0), "+x"(w1), "+x"(w2), "+x"(w3));  // (AVX2 has no registers to spare for them)
    if (ahead) {
      _mm_prefetch(reinterpret_cast<const char*>(w + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w + ahead + 64), _MM_HINT_T1);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      uint32_t four;
      std::memcpy(&four, x + r * ldx + q * 4, 4);
      const __m256i xs = _mm256_set1_epi32(static_cast<int32_t>(four ^ 0x80808080u));  // x as signed bytes
      const __m256i xa = kBiasedX ? _mm256_set1_epi32(static_cast<int32_t>(four)) : _mm256_abs_epi8(xs);
      a[r][0] = dot4(a[r][0], xa, xs, w0);
      a[r][1] = dot4(a[r][1], xa, xs, w1);
      a[r][2] = dot4(a[r][2], xa, xs, w2);
      a[r][3] = dot4(a[r][3], xa, xs, w3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * kPanel + v * 8), a[r][v]);
}

inline void micro_i8_rows(int64_t rows, const int8_t* panel, int64_t qn, const uint8_t* x, int64_t ldx, int32_t* acc,
                          bool zero, int64_t ahead) {
  switch (rows) {
    case 1: micro_i8<1>(panel, qn, x, ldx, acc, zero, ahead); break;
    case 2: micro_i8<2>(panel, qn, x, ldx, acc, zero, ahead); break;
#if defined(__AVX512F__)
    case 3: micro_i8<3>(panel, qn, x, ldx, acc, zero, ahead); break;
    case 4: micro_i8<4>(panel, qn, x, ldx, acc, zero, ahead); break;
    case 5: micro_i8<5>(panel, qn, x, ldx, acc, zero, ahead); break;
    case 6: micro_i8<6>(panel, qn, x, ldx, acc, zero, ahead); break;
#endif
  }
}

// y = (((x_q W_q^T - 128 colsum) * row_scale) * scale + bias) + residual. Each row of x is quantised on its own:
// row_scale = max |x| / 127, x_q = round(x / row_scale), stored + 128 as unsigned bytes (dpbusd multiplies unsigned
// by signed; the 128 per element comes back out through colsum[n] = sum_k W_q[n][k]). Every sum is an exact int32,
// so no order of any kind can change a row's result.
void gemm_int8(const float* X, const int8_t* P, const int32_t* colsum, int64_t M, int64_t K, int64_t N,
               const float* scale, const float* bias, const float* residual, float* Y) {
  const int64_t groups = (N + kPanel - 1) / kPanel, K4 = (K + 3) / 4, ldx = K4 * 4;
  std::vector<uint8_t> xq(static_cast<size_t>(M * ldx), 128);
  std::vector<float> row_scale(M);
  for_rows(M, K, [&](int64_t r) {
    const float* x = X + r * K;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 top8 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) top8 = _mm256_max_ps(top8, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    float top = hmax8(top8);  // a maximum: the same whatever the order
    for (; k < K; ++k) top = std::max(top, std::fabs(x[k]));
    const float inv = top > 0 ? 127.0f / top : 1.0f;
    row_scale[r] = top > 0 ? top / 127.0f : 1.0f;
    // round half to even (cvtps under the default rounding mode, as nearbyint), then + 128 as unsigned bytes
    const __m256 iv = _mm256_set1_ps(inv);
    uint8_t* out = xq.data() + r * ldx;
    for (k = 0; k + 8 <= K; k += 8) {
      const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), iv)),
                                         _mm256_set1_epi32(128));
      const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + k), _mm_packus_epi16(words, words));
    }
    for (; k < K; ++k) out[k] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(x[k] * inv)) + 128);
  });
  const int64_t qc = kBlockBytes / (kPanel * 4);  // groups of four k per 16 KB block
  const int64_t ahead = 2 * kBlockBytes;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<int32_t> acc(static_cast<size_t>(M) * kPanel);
    for (int64_t g = g0; g < g1; ++g) {
      const int8_t* panel = P + g * K4 * kPanel * 4;
      for (int64_t q0 = 0; q0 < K4; q0 += qc) {
        const int64_t qn = std::min(qc, K4 - q0);
        for (int64_t r = 0; r < M; r += kRowsI8)
          micro_i8_rows(std::min<int64_t>(kRowsI8, M - r), panel + q0 * kPanel * 4, qn, xq.data() + r * ldx + q0 * 4,
                        ldx, acc.data() + r * kPanel, q0 == 0, r == 0 && M > kFewRowsStream ? ahead : 0);
      }
      if (kBiasedX)
        for (int64_t r = 0; r < M; ++r)
          for (int64_t c = 0; c < kPanel; ++c) acc[r * kPanel + c] -= 128 * colsum[g * kPanel + c];
      epilogue(nullptr, M, g * kPanel, N, row_scale.data(), scale, bias, residual, Y, acc.data());
    }
  });
}


// ---------------------------------------------------------------------------------------------------------------
// Block-quantised GEMM of a target at `precision: q4_1` (weight-only: fp32 activations, fp32 FMA chains)
//
// The weights are the GGUF's own blocks of 32 along k, as shipped: Q4_1 (w = d q + m, q in 0..15, d and m fp16) for
// the projections and Q8_0 (w = d q, q int8, d fp16) for SmolLM2's output head / embedding, repacked (the same
// values, rakv.runtime.kernels.pack_blocks) per panel of 32 outputs and block of 32 k:
//   Q4_1: d [32 outputs] fp16 | m [32] fp16 | [32 k][16 bytes], byte j = q of output j (low nibble), j + 16 (high)
//   Q8_0: d [32] fp16 | [32 k][32 outputs] int8
// 640 and 1088 bytes per 32 x 32 weights: the file's 5 and 8.5 bits per weight. A thread dequantises 128 k of a
// panel (four blocks) into a 16 KB fp32 buffer in L1, exactly the fp32 panel gemm_packed would read for the same
// values, and runs the very same micro-kernels over it: each output is one chain of fused multiply-adds over
// k = 0 .. K - 1 from zero, whatever the row count and the grouping of rows, so a row's result is bitwise that of the
// fp32 GEMM over the dequantised weights (tests/test_kernels.py), batch-invariant by the fp32 GEMM's argument. The
// dequantised values are exact: d q needs at most 11 + 8 significant bits, so it is exact in fp32 and d q + m rounds
// once, as the GGUF reader's (d * q) + m does. Not chosen: int8 activations with VNNI dot products (llama.cpp's way
// for Q4_1 x Q8_1): they would change every result from the fp32 model's values and tie a row's numerics to a
// quantisation of its activations; here q4_1 changes only the weights' bytes streamed per step.
constexpr int kQ4_1 = 0, kQ8_0 = 1;  // rakv.runtime.kernels.BLOCK_FORMATS
constexpr int64_t kQBlock = 32;      // k per quantised block
inline int64_t block_bytes(int format) { return format == kQ4_1 ? 640 : 1088; }

// one quantised block (32 k x 32 outputs) into out[32 k][32 outputs] fp32
inline void dequant_block(int format, const uint8_t* block, float* out) {
  const __m128i* h = reinterpret_cast<const __m128i*>(block);
#if defined(__AVX512F__)
  const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
  const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
  if (format == kQ4_1) {
    const __m512 m0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
    const __m512 m1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 96)));
    const uint8_t* q = block + 128;
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t t = 0; t < kQBlock; ++t) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + t * 16)));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, low)), hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
      _mm512_storeu_ps(out + t * kPanel, _mm512_add_ps(_mm512_mul_ps(lo, d0), m0));
      _mm512_storeu_ps(out + t * kPanel + 16, _mm512_add_ps(_mm512_mul_ps(hi, d1), m1));
    }
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 64);
    for (int64_t t = 0; t < kQBlock; ++t) {
      const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + t * 32))));
      const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + t * 32 + 16))));
      _mm512_storeu_ps(out + t * kPanel, _mm512_mul_ps(q0, d0));
      _mm512_storeu_ps(out + t * kPanel + 16, _mm512_mul_ps(q1, d1));
    }
  }
#else
  __m256 d[4];
  for (int v = 0; v < 4; ++v) d[v] = _mm256_cvtph_ps(_mm_loadu_si128(h + v));
  if (format == kQ4_1) {
    __m256 m[4];
    for (int v = 0; v < 4; ++v) m[v] = _mm256_cvtph_ps(_mm_loadu_si128(h + 4 + v));
    const uint8_t* q = block + 128;
    const __m256i low = _mm256_set1_epi32(15);
    for (int64_t t = 0; t < kQBlock; ++t) {
      for (int half = 0; half < 2; ++half) {  // bytes 0-7: outputs 0-7 and 16-23; bytes 8-15: 8-15 and 24-31
        const __m256i b =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + t * 16 + half * 8)));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
        _mm256_storeu_ps(out + t * kPanel + half * 8, _mm256_add_ps(_mm256_mul_ps(lo, d[half]), m[half]));
        _mm256_storeu_ps(out + t * kPanel + 16 + half * 8, _mm256_add_ps(_mm256_mul_ps(hi, d[2 + half]), m[2 + half]));
      }
    }
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 64);
    for (int64_t t = 0; t < kQBlock; ++t)
      for (int v = 0; v < 4; ++v) {
        const __m256 qv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(q + t * 32 + v * 8))));
        _mm256_storeu_ps(out + t * kPanel + v * 8, _mm256_mul_ps(qv, d[v]));
      }
  }
#endif
  (void)h;
}

#if defined(__AVX512F__)
// Few rows (a decode step, a verify of k + 1 <= 6) with AVX-512: each weight vector is dequantised in registers, as
// dequant_block computes it, and used at once by every row: no round trip through the L1 buffer. The same values and
// the same chain of FMAs over k per output as micro16 over dequant_block's buffer: the same bits
// (tests/test_kernels.py: any row count, any slice of rows). acc[r][0..32) = sum over k < 32 nb of x[r][k] w[k].
template <int R>
inline void micro_blocks16(int format, const uint8_t* blocks, int64_t nb, int64_t bytes, const float* x,
                           int64_t ldx, float* acc) {
  __m512 a[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(15);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = blocks + b * bytes;
    const float* xb = x + b * kQBlock;
    const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
    if (format == kQ4_1) {
      const __m512 m0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
      const __m512 m1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 96)));
      const uint8_t* q = block + 128;
      for (int64_t t = 0; t < kQBlock; ++t) {
        const __m512i bq = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + t * 16)));
        const __m512 w0 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bq, low)), d0), m0);
        const __m512 w1 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bq, 4)), d1), m1);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(xb[r * ldx + t]);
          a[r][0] = _mm512_fmadd_ps(xv, w0, a[r][0]);
          a[r][1] = _mm512_fmadd_ps(xv, w1, a[r][1]);
        }
      }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(block + 64);
      for (int64_t t = 0; t < kQBlock; ++t) {
        const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(q + t * 32)))), d0);
        const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(q + t * 32 + 16)))), d1);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(xb[r * ldx + t]);
          a[r][0] = _mm512_fmadd_ps(xv, w0, a[r][0]);
          a[r][1] = _mm512_fmadd_ps(xv, w1, a[r][1]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(acc + r * kPanel, a[r][0]);
    _mm512_storeu_ps(acc + r * kPanel + 16, a[r][1]);
  }
}

inline void micro_blocks16_rows(int64_t rows, int format, const uint8_t* blocks, int64_t nb, int64_t bytes,
                                const float* x, int64_t ldx, float* acc) {
  switch (rows) {
    case 1: micro_blocks16<1>(format, blocks, nb, bytes, x, ldx, acc); break;
    case 2: micro_blocks16<2>(format, blocks, nb, bytes, x, ldx, acc); break;
    case 3: micro_blocks16<3>(format, blocks, nb, bytes, x, ldx, acc); break;
    case 4: micro_blocks16<4>(format, blocks, nb, bytes, x, ldx, acc); break;
    case 5: micro_blocks16<5>(format, blocks, nb, bytes, x, ldx, acc); break;
    case 6: micro_blocks16<6>(format, blocks, nb, bytes, x, ldx, acc); break;
  }
}
#else
// One or two rows (a decode step, a verify of k = 1) with AVX2: the same in-register dequantisation with eight-lane
// vectors, the scales read from the block (sixteen registers hold the accumulators and a vector's work, not the
// scales as well). Each output's values and chain of FMAs are dequant_block's and micro's: the same bits.
template <int R>
inline void micro_blocks8(int format, const uint8_t* blocks, int64_t nb, int64_t bytes, const float* x, int64_t ldx,
                          float* acc) {
  __m256 a[R][4];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) a[r][v] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi32(15);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = blocks + b * bytes;
    const __m128i* h = reinterpret_cast<const __m128i*>(block);
    const float* xb = x + b * kQBlock;
    if (format == kQ4_1) {
      const uint8_t* q = block + 128;
      for (int64_t t = 0; t < kQBlock; ++t) {
        __m256 w[4];
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {  // bytes 0-7: outputs 0-7 and 16-23; bytes 8-15: 8-15 and 24-31
          const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
              q + t * 16 + half * 8)));
          w[half] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bq, low)),
                                                _mm256_cvtph_ps(_mm_loadu_si128(h + half))),
                                  _mm256_cvtph_ps(_mm_loadu_si128(h + 4 + half)));
          w[2 + half] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bq, 4)),
                                                    _mm256_cvtph_ps(_mm_loadu_si128(h + 2 + half))),
                                      _mm256_cvtph_ps(_mm_loadu_si128(h + 6 + half)));
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_broadcast_ss(xb + r * ldx + t);
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v) a[r][v] = _mm256_fmadd_ps(xv, w[v], a[r][v]);
        }
      }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(block + 64);
      for (int64_t t = 0; t < kQBlock; ++t) {
        __m256 w[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v)
          w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                   reinterpret_cast<const __m128i*>(q + t * 32 + v * 8)))),
                               _mm256_cvtph_ps(_mm_loadu_si128(h + v)));
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_broadcast_ss(xb + r * ldx + t);
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v) a[r][v] = _mm256_fmadd_ps(xv, w[v], a[r][v]);
        }
      }
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(acc + r * kPanel + v * 8, a[r][v]);
}
#endif

// y[M, N] = (x[M, K] @ W^T + bias) + residual, W in quantised panels [G][K / 32][block_bytes(format)]
void gemm_blocks(const float* X, const uint8_t* P, int format, int64_t M, int64_t K, int64_t N, const float* bias,
                 const float* residual, float* Y) {
  const int64_t groups = (N + kPanel - 1) / kPanel, blocks = K / kQBlock, bytes = block_bytes(format);
  const int64_t kc = kBlockBytes / (kPanel * static_cast<int64_t>(sizeof(float)));  // 128 k: 16 KB dequantised
  const int64_t kRows = rows_per_call(M);
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc_buffer(static_cast<size_t>(M) * kPanel);
    alignas(64) float weights[kBlockBytes / sizeof(float)];  // the fp32 panel block the micro-kernels read
    float* acc = acc_buffer.data();
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* panel = P + g * blocks * bytes;
      if (M <= kRowsFew) {  // one pass over the panel's blocks, dequantised in registers
#if defined(__AVX512F__)
        micro_blocks16_rows(M, format, panel, blocks, bytes, X, K, acc);
#else
        if (M == 1) micro_blocks8<1>(format, panel, blocks, bytes, X, K, acc);
        else micro_blocks8<2>(format, panel, blocks, bytes, X, K, acc);
#endif
        epilogue(acc, M, g * kPanel, N, nullptr, nullptr, bias, residual, Y);
        continue;
      }
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t kn = std::min(kc, K - k0);
        for (int64_t b = 0; b < kn / kQBlock; ++b)
          dequant_block(format, panel + (k0 / kQBlock + b) * bytes, weights + b * kQBlock * kPanel);
        for (int64_t r = 0; r < M; r += kRows)
          micro_rows(std::min<int64_t>(kRows, M - r), weights, kn, X + r * K + k0, K, acc + r * kPanel, k0 == 0,
                     Prefetch{});
      }
      epilogue(acc, M, g * kPanel, N, nullptr, nullptr, bias, residual, Y);
    }
  });
}
}  // namespace

// y [M, N] = x [M, K] @ W^T (+ bias) (+ residual); W packed [G, K, 32] fp32
torch::Tensor gemm(const torch::Tensor& x_in, const torch::Tensor& packed, int64_t N,
                   const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "gemm: x [M, K] fp32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous() &&
              packed.scalar_type() == at::kFloat, "gemm: packed fp32 [G, K, 32]");
  TORCH_CHECK(packed.size(1) == x_in.size(1) && packed.size(0) * kPanel >= N && (packed.size(0) - 1) * kPanel < N,
              "gemm: shapes of x, packed weights and N disagree");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const torch::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : torch::Tensor();
  const torch::Tensor res = residual.has_value() && residual->defined() ? residual->contiguous() : torch::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() >= N, "gemm: bias shorter than N");
  TORCH_CHECK(!res.defined() || (res.size(0) == M && res.size(1) == N), "gemm: residual [M, N]");
  gemm_packed(x.data_ptr<float>(), packed.data_ptr<float>(), M, K, N, b.defined() ? b.data_ptr<float>() : nullptr,
              res.defined() ? res.data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

// y [M, N] = x [M, K] @ (W_q * scale)^T (+ bias) (+ residual), activations quantised per row (gemm_int8);
// W_q packed [G, ceil(K / 4), 32, 4] int8 (pack_int8), colsum [G * 32] its integer row sums
torch::Tensor gemm_i8(const torch::Tensor& x_in, const torch::Tensor& packed, const torch::Tensor& colsum, int64_t N,
                      const torch::Tensor& scale, const c10::optional<torch::Tensor>& bias,
                      const c10::optional<torch::Tensor>& residual) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "gemm_i8: x [M, K] fp32");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kPanel && packed.size(3) == 4 && packed.is_contiguous() &&
              packed.scalar_type() == at::kChar, "gemm_i8: packed int8 [G, K / 4, 32, 4]");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = packed.size(0);
  TORCH_CHECK(packed.size(1) == (K + 3) / 4 && G * kPanel >= N && (G - 1) * kPanel < N,
              "gemm_i8: shapes of x, packed weights and N disagree");
  TORCH_CHECK(colsum.scalar_type() == at::kInt && colsum.numel() == G * kPanel && colsum.is_contiguous() &&
              scale.scalar_type() == at::kFloat && scale.numel() >= N && scale.is_contiguous(),
              "gemm_i8: int32 colsum [G * 32] and fp32 scale [N]");
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const torch::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : torch::Tensor();
  const torch::Tensor res = residual.has_value() && residual->defined() ? residual->contiguous() : torch::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() >= N, "gemm_i8: bias shorter than N");
  TORCH_CHECK(!res.defined() || (res.size(0) == M && res.size(1) == N), "gemm_i8: residual [M, N]");
  gemm_int8(x.data_ptr<float>(), packed.data_ptr<int8_t>(), colsum.data_ptr<int32_t>(), M, K, N,
            scale.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
            res.defined() ? res.data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

// y [M, N] = x [M, K] @ W^T (+ bias) (+ residual); W in quantised panels [G, K / 32, bytes] (gemm_blocks), format
// 0 = Q4_1, 1 = Q8_0
torch::Tensor gemm_q(const torch::Tensor& x_in, const torch::Tensor& packed, int64_t format, int64_t N,
                     const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& residual) {
  TORCH_CHECK(format == kQ4_1 || format == kQ8_0, "gemm_q: format 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "gemm_q: x [M, K] fp32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == block_bytes(static_cast<int>(format)) && packed.is_contiguous() &&
              packed.scalar_type() == at::kByte, "gemm_q: packed uint8 [G, K / 32, block bytes]");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = packed.size(0);
  TORCH_CHECK(K % kQBlock == 0 && packed.size(1) * kQBlock == K && G * kPanel >= N && (G - 1) * kPanel < N,
              "gemm_q: shapes of x, packed weights and N disagree");
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const torch::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : torch::Tensor();
  const torch::Tensor res = residual.has_value() && residual->defined() ? residual->contiguous() : torch::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() >= N, "gemm_q: bias shorter than N");
  TORCH_CHECK(!res.defined() || (res.size(0) == M && res.size(1) == N), "gemm_q: residual [M, N]");
  gemm_blocks(x.data_ptr<float>(), packed.data_ptr<uint8_t>(), static_cast<int>(format), M, K, N,
              b.defined() ? b.data_ptr<float>() : nullptr, res.defined() ? res.data_ptr<float>() : nullptr,
              y.data_ptr<float>());
  return y;
}

// which int8 dot product this build uses (they give the same integers): for the kernels' identity
std::string int8_dot() {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512-vnni";
#elif defined(__AVXVNNI__)
  return "avx-vnni";
#else
  return "avx2";
#endif
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// attention

// the dot products of q with four keys, one fixed reduction tree per key (the same in every slot)
inline __m128 dots4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3, int64_t D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + c), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + c), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + c), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + c), a3);
  }
  // per key: lanes (0+1), (2+3), (4+5), (6+7), then ((0+1) + (2+3)) and ((4+5) + (6+7)), then low + high half
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

constexpr int64_t kAhead = 16;  // keys and values stream from memory: prefetched this many positions ahead

inline void prefetch_row(const float* row, int64_t D) {
  for (int64_t c = 0; c < D; c += 16) _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
}

// p[0..visible) = exp(p - max p) in place; returns 1 / their sum (the first half of a query's softmax)
inline float softmax_numerators(float* p, int64_t visible) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= visible; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(p + j));
  float m = hmax8(top);
  for (; j < visible; ++j) m = std::max(m, p[j]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 total = _mm256_setzero_ps();
  for (j = 0; j + 8 <= visible; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
    _mm256_storeu_ps(p + j, e);
    total = _mm256_add_ps(total, e);
  }
  if (j < visible) {
    const int64_t n = visible - j;
    const __m256 e = exp8(_mm256_sub_ps(load_partial(p + j, n), mv));
    const __m256 keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(static_cast<float>(n)),
                                      _CMP_LT_OQ);
    const __m256 masked = _mm256_and_ps(e, keep);
    store_partial(p + j, masked, n);
    total = _mm256_add_ps(total, masked);
  }
  return 1.0f / hsum8(total);
}

// p[0..visible) = softmax(p[0..visible)); out[D] = p @ values[0..visible) (one query's second half)
template <int ND>
void softmax_values(float* p, const float* values, int64_t value_stride, int64_t visible, int64_t D, float* out) {
  const __m256 inv = _mm256_set1_ps(softmax_numerators(p, visible));
  const int64_t nd = ND > 0 ? ND : D / 8;
  __m256 acc[ND > 0 ? ND : 32];
  for (int64_t c = 0; c < nd; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < visible; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    const float* v = values + j * value_stride;
    if (j + kAhead < visible) prefetch_row(v + kAhead * value_stride, D);
    for (int64_t c = 0; c < nd; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + c * 8), acc[c]);
  }
  for (int64_t c = 0; c < nd; ++c) _mm256_storeu_ps(out + c * 8, _mm256_mul_ps(acc[c], inv));
}

#if defined(__AVX512F__)
// The weighted values of NH query heads that share one K/V head (head size 64), each value row loaded once for all
// of them: NH x 4 sixteen-lane accumulators. Each lane is the chain softmax_values computes with eight lanes (the
// FMAs over j ascending from zero, then * inv): the same bits.
template <int NH>
void weighted_values_64(const float* p, int64_t p_stride, const float* values, int64_t value_stride, int64_t visible,
                        const float* inv, float* out, int64_t o_head) {
  __m512 acc[NH][4];
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[h][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < visible; ++j) {
    const float* v = values + j * value_stride;
    if (j + kAhead < visible) prefetch_row(v + kAhead * value_stride, 64);
    const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), v2 = _mm512_loadu_ps(v + 32),
                 v3 = _mm512_loadu_ps(v + 48);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      const __m512 pj = _mm512_set1_ps(p[h * p_stride + j]);
      acc[h][0] = _mm512_fmadd_ps(pj, v0, acc[h][0]);
      acc[h][1] = _mm512_fmadd_ps(pj, v1, acc[h][1]);
      acc[h][2] = _mm512_fmadd_ps(pj, v2, acc[h][2]);
      acc[h][3] = _mm512_fmadd_ps(pj, v3, acc[h][3]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c)
      _mm512_storeu_ps(out + h * o_head + c * 16, _mm512_mul_ps(acc[h][c], _mm512_set1_ps(inv[h])));
}
#endif

// whether attend_rows weighs the values of a task's query heads in one pass (weighted_values_64)
inline bool shared_values_pass(int64_t D, int64_t heads) {
#if defined(__AVX512F__)
  return D == 64 && heads >= 2 && heads <= 4;
#else
  (void)D; (void)heads;
  return false;
#endif
}

// One task: `rows` consecutive rows of one segment (the first sees positions 0 .. first_visible - 1, each next one
// position more) and the query heads h0 .. h0 + heads - 1 that share one K/V head. Each group of four keys is loaded
// once for all these queries (from memory for the first, from L1 for the rest); then each query's softmax and
// values, the values of a row's query heads in one pass where shared_values_pass says so (each value row loaded once
// for them). Every query's arithmetic is that of the query alone: its scores are dots4 of its own q, its softmax
// numerators the same function, and each lane of its weighted values the same chain of FMAs over the positions in
// order (weighted_values_64 and softmax_values give the same bits), whatever the other queries of the task are.
template <int ND>
void attend_rows(const float* Q, int64_t q_stride, int64_t rows, int64_t heads, const float* keys,
                 const float* values, int64_t stride, int64_t first_visible, int64_t D, float scale, float* p,
                 int64_t p_stride, float* O, int64_t o_stride) {
  const int64_t last_visible = first_visible + rows - 1;
  for (int64_t j = 0; j < last_visible; j += 4) {
    const float* k[4];
    for (int s = 0; s < 4; ++s) k[s] = keys + (j + s < last_visible ? j + s : 0) * stride;  // past the end: key 0
    if (j + kAhead < last_visible)
      for (int s = 0; s < 4; ++s) prefetch_row(keys + (j + kAhead + s) * stride, D);
    for (int64_t i = std::max<int64_t>(0, j - first_visible + 1); i < rows; ++i)  // the rows that see key j
      for (int64_t h = 0; h < heads; ++h) {
        const __m128 d = _mm_mul_ps(dots4(Q + i * q_stride + h * D, k[0], k[1], k[2], k[3], D), _mm_set1_ps(scale));
        _mm_storeu_ps(p + (i * heads + h) * p_stride + j, d);
      }
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* pi = p + i * heads * p_stride;
#if defined(__AVX512F__)
    if (shared_values_pass(D, heads)) {
      float inv[4];
      for (int64_t h = 0; h < heads; ++h) inv[h] = softmax_numerators(pi + h * p_stride, first_visible + i);
      float* o = O + i * o_stride;
      if (heads == 2) weighted_values_64<2>(pi, p_stride, values, stride, first_visible + i, inv, o, D);
      else if (heads == 3) weighted_values_64<3>(pi, p_stride, values, stride, first_visible + i, inv, o, D);
      else weighted_values_64<4>(pi, p_stride, values, stride, first_visible + i, inv, o, D);
      continue;
    }
#endif
    for (int64_t h = 0; h < heads; ++h)
      softmax_values<ND>(pi + h * p_stride, values, stride, first_visible + i, D, O + i * o_stride + h * D);
  }
}

}  // namespace

// rotary embedding of the first `heads` heads of each row in place: x [T, width], head h at columns h D .. h D + D;
// cos and sin_signed [T, D] (sin with its first half negated): x * cos + roll(x, D / 2) * sin_signed
void rope_(torch::Tensor x, const torch::Tensor& cos_in, const torch::Tensor& sin_in, int64_t heads) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat, "rope_: x [T, width]");
  const torch::Tensor c = cos_in.contiguous(), sn = sin_in.contiguous();
  const int64_t T = x.size(0), D = c.size(1), half = D / 2, st = x.stride(0);
  TORCH_CHECK(c.size(0) == T && sn.sizes() == c.sizes() && heads * D <= x.size(1), "rope_: cos / sin [T, D]");
  float* X = x.data_ptr<float>();
  const float* C = c.data_ptr<float>();
  const float* S = sn.data_ptr<float>();
  TORCH_CHECK(D % 2 == 0 && D <= 256, "rope_: head size even, at most 256");
  for_rows(T, heads * D, [&](int64_t t) {
    float row[256];
    for (int64_t h = 0; h < heads; ++h) {
      float* v = X + t * st + h * D;
      std::memcpy(row, v, D * sizeof(float));
      for (int64_t d = 0; d < D; ++d) v[d] = row[d] * C[t * D + d] + row[(d + half) % D] * S[t * D + d];
    }
  });
}

// Causal grouped-query attention for every segment of a batched forward, one call per layer.
// qkv [T, (H + 2 KV) D]: each row's query, key and value, segment after segment (with cos / sin_signed [T, D],
// queries and keys are rotated in place first: rope_); keys[s] / values[s] the
// segment's K/V buffers [1, KV, capacity, D] (unit stride on D), holding its first starts[s] positions; its
// lengths[s] new rows are written at starts[s] .. starts[s] + lengths[s] first. Row i of segment s is at position
// starts[s] + i and attends to positions 0 .. starts[s] + i. Returns [T, H D].
torch::Tensor attention(torch::Tensor qkv, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lengths, int64_t H, int64_t KV, double scale,
                        const c10::optional<torch::Tensor>& cos, const c10::optional<torch::Tensor>& sin_signed) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(),
              "attention: qkv [T, (H + 2 KV) D] fp32, contiguous");
  const int64_t segments = static_cast<int64_t>(keys.size());
  TORCH_CHECK(segments > 0 && static_cast<int64_t>(values.size()) == segments &&
              static_cast<int64_t>(starts.size()) == segments && static_cast<int64_t>(lengths.size()) == segments,
              "attention: one key buffer, value buffer, start and length per segment");
  TORCH_CHECK(H % KV == 0 && qkv.size(1) % (H + 2 * KV) == 0, "attention: heads");
  const int64_t D = qkv.size(1) / (H + 2 * KV), group = H / KV;
  TORCH_CHECK(D % 8 == 0 && D <= 256, "attention: head size a multiple of 8, at most 256");
  const int64_t T = qkv.size(0), width = qkv.size(1);
  if (cos.has_value() && cos->defined()) rope_(qkv, *cos, *sin_signed, H + KV);  // queries and keys, in place
  std::vector<int64_t> first_row(segments + 1, 0);
  for (int64_t s = 0; s < segments; ++s) {
    const auto& kb = keys[s];
    const auto& vb = values[s];
    TORCH_CHECK(kb.dim() == 4 && kb.size(0) == 1 && kb.size(1) == KV && kb.size(3) == D && kb.stride(3) == 1 &&
                kb.scalar_type() == at::kFloat && vb.sizes() == kb.sizes() && vb.strides() == kb.strides() &&
                vb.scalar_type() == at::kFloat, "attention: K/V buffers [1, KV, capacity, D] fp32, alike");
    TORCH_CHECK(lengths[s] > 0 && starts[s] >= 0 && starts[s] + lengths[s] <= kb.size(2),
                "attention: a segment's new rows must fit its K/V buffer");
    first_row[s + 1] = first_row[s] + lengths[s];
  }
  TORCH_CHECK(first_row[segments] == T, "attention: segment lengths must add up to the rows of qkv");
  const float* Q = qkv.data_ptr<float>();
  // K/V writes first, every segment, so that every query sees its own segment's new keys
  for (int64_t s = 0; s < segments; ++s) {
    float* K = keys[s].data_ptr<float>();
    float* V = values[s].data_ptr<float>();
    const int64_t sh = keys[s].stride(1), sl = keys[s].stride(2);
    for (int64_t i = 0; i < lengths[s]; ++i) {
      const float* row = Q + (first_row[s] + i) * width;
      for (int64_t h = 0; h < KV; ++h) {
        std::memcpy(K + h * sh + (starts[s] + i) * sl, row + (H + h) * D, D * sizeof(float));
        std::memcpy(V + h * sh + (starts[s] + i) * sl, row + (H + KV + h) * D, D * sizeof(float));
      }
    }
  }
  torch::Tensor out = torch::empty({T, H * D}, qkv.options());
  float* O = out.data_ptr<float>();
  int64_t longest = 0;
  for (int64_t s = 0; s < segments; ++s) longest = std::max(longest, starts[s] + lengths[s]);
  std::vector<const float*> kptr(segments), vptr(segments);
  std::vector<int64_t> head_stride(segments), position_stride(segments);
  for (int64_t s = 0; s < segments; ++s) {
    kptr[s] = keys[s].data_ptr<float>();
    vptr[s] = values[s].data_ptr<float>();
    head_stride[s] = keys[s].stride(1);
    position_stride[s] = keys[s].stride(2);
  }
  const float sc = static_cast<float>(scale);
  // tasks: blocks of up to kRowBlock rows of one segment x one K/V head (its query heads together: the keys, and
  // with the shared values pass the values, come from memory once for all of them), or x one query head when that
  // leaves too few tasks to keep every thread busy and the task is compute-bound: without the shared values pass
  // (AVX2, or another head size), several rows of one segment (a verify, a prefill chunk) balance 2 threads better
  // as 9 query heads than as 3 K/V heads (AVX2 build, 5 rows x 256 positions: 1.10x grouped). A decode row's task
  // is memory-bound, so it is grouped whatever the build: measured interleaved (issue 40), 30 layers of SmolLM2's
  // attention at 256 positions, AVX-512 build, grouped / per query head: one decode 0.80x, two 0.56x, one at 1024
  // positions 0.60x, a verify of 3-32 rows 0.89-0.94x; AVX2 build one and two decodes 0.91x and 0.71x. Dealt to
  // the threads in turn: a row's work grows with its position, so contiguous shares of a prefill's rows would
  // leave one thread most of the work. Which task computes a query never changes its arithmetic.
  constexpr int64_t kRowBlock = 16;
  const int64_t threads = at::get_num_threads();
  int64_t blocks = 0;
  for (int64_t s = 0; s < segments; ++s) blocks += (lengths[s] + kRowBlock - 1) / kRowBlock;
  const bool decodes_only = T == segments;
  const int64_t heads_per_task =
      shared_values_pass(D, group) || decodes_only || blocks * KV >= 4 * threads ? group : 1;
  std::vector<std::array<int64_t, 3>> tasks;  // (segment, first row in it, first query head)
  for (int64_t s = 0; s < segments; ++s)
    for (int64_t i = 0; i < lengths[s]; i += kRowBlock)
      for (int64_t h = 0; h < H; h += heads_per_task) tasks.push_back({s, i, h});
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, n_tasks));
  const int64_t p_stride = (longest + 11) / 8 * 8;
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> p;  // scores, reused across calls (no allocation per layer)
    if (static_cast<int64_t>(p.size()) < kRowBlock * heads_per_task * p_stride)
      p.resize(kRowBlock * heads_per_task * p_stride);
    for (int64_t worker = begin; worker < end; ++worker)
      for (int64_t t = worker; t < n_tasks; t += workers) {
        const int64_t s = tasks[t][0], i = tasks[t][1], h = tasks[t][2], kv = h / group;
        const int64_t rows = std::min(kRowBlock, lengths[s] - i), r = first_row[s] + i, sl = position_stride[s];
        const float* kbase = kptr[s] + kv * head_stride[s];
        const float* vbase = vptr[s] + kv * head_stride[s];
        const float* q = Q + r * width + h * D;
        float* o = O + r * H * D + h * D;
        const int64_t first_visible = starts[s] + i + 1, n = heads_per_task;
        if (D == 64)
          attend_rows<8>(q, width, rows, n, kbase, vbase, sl, first_visible, D, sc, p.data(), p_stride, o, H * D);
        else if (D == 32)
          attend_rows<4>(q, width, rows, n, kbase, vbase, sl, first_visible, D, sc, p.data(), p_stride, o, H * D);
        else
          attend_rows<0>(q, width, rows, n, kbase, vbase, sl, first_visible, D, sc, p.data(), p_stride, o, H * D);
      }
  });
  return out;
}

// weight * (x * 1 / sqrt(mean(x^2) + eps)) per row (LlamaRMSNorm's order)
torch::Tensor rms_norm(const torch::Tensor& x_in, const torch::Tensor& weight_in, double eps) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && weight_in.numel() == x_in.size(1), "rms_norm");
  const torch::Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  const int64_t T = x.size(0), d = x.size(1);
  torch::Tensor y = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for_rows(T, d, [&](int64_t t) {
    const float* xr = X + t * d;
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= d; c += 8) { const __m256 v = _mm256_loadu_ps(xr + c); acc = _mm256_fmadd_ps(v, v, acc); }
    if (c < d) { const __m256 v = load_partial(xr + c, d - c); acc = _mm256_fmadd_ps(v, v, acc); }
    const float inv = 1.0f / std::sqrt(hsum8(acc) / static_cast<float>(d) + static_cast<float>(eps));
    const __m256 iv = _mm256_set1_ps(inv);
    float* yr = Y + t * d;
    for (c = 0; c + 8 <= d; c += 8)
      _mm256_storeu_ps(yr + c, _mm256_mul_ps(_mm256_loadu_ps(W + c), _mm256_mul_ps(_mm256_loadu_ps(xr + c), iv)));
    if (c < d)
      store_partial(yr + c, _mm256_mul_ps(load_partial(W + c, d - c), _mm256_mul_ps(load_partial(xr + c, d - c), iv)),
                    d - c);
  });
  return y;
}

// (x - mean) / sqrt(var + eps) * weight + bias per row (GPT-2's LayerNorm), two passes over the row
torch::Tensor layer_norm(const torch::Tensor& x_in, const torch::Tensor& weight_in, const torch::Tensor& bias_in,
                         double eps) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && weight_in.numel() == x_in.size(1) &&
              bias_in.numel() == x_in.size(1), "layer_norm");
  const torch::Tensor x = x_in.contiguous(), w = weight_in.contiguous(), b = bias_in.contiguous();
  const int64_t T = x.size(0), d = x.size(1);
  torch::Tensor y = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  const float* B = b.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for_rows(T, d, [&](int64_t t) {
    const float* xr = X + t * d;
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= d; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xr + c));
    if (c < d) acc = _mm256_add_ps(acc, load_partial(xr + c, d - c));
    const float mean = hsum8(acc) / static_cast<float>(d);
    const __m256 mv = _mm256_set1_ps(mean);
    acc = _mm256_setzero_ps();
    for (c = 0; c + 8 <= d; c += 8) { const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(xr + c), mv); acc = _mm256_fmadd_ps(v, v, acc); }
    if (c < d) {
      const __m256 keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm256_set1_ps(static_cast<float>(d - c)), _CMP_LT_OQ);
      const __m256 v = _mm256_and_ps(_mm256_sub_ps(load_partial(xr + c, d - c), mv), keep);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    const __m256 iv = _mm256_set1_ps(1.0f / std::sqrt(hsum8(acc) / static_cast<float>(d) + static_cast<float>(eps)));
    float* yr = Y + t * d;
    auto norm = [&](__m256 v, __m256 wv, __m256 bv) { return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(v, mv), iv), wv, bv); };
    for (c = 0; c + 8 <= d; c += 8)
      _mm256_storeu_ps(yr + c, norm(_mm256_loadu_ps(xr + c), _mm256_loadu_ps(W + c), _mm256_loadu_ps(B + c)));
    if (c < d)
      store_partial(yr + c, norm(load_partial(xr + c, d - c), load_partial(W + c, d - c), load_partial(B + c, d - c)),
                    d - c);
  });
  return y;
}

// silu(gate) * up of a fused [T, 2I] gate/up projection (LlamaMLP's activation)
torch::Tensor silu_mul(const torch::Tensor& gate_up_in) {
  TORCH_CHECK(gate_up_in.dim() == 2 && gate_up_in.scalar_type() == at::kFloat && gate_up_in.size(1) % 2 == 0,
              "silu_mul: [T, 2I] fp32");
  const torch::Tensor g = gate_up_in.contiguous();
  const int64_t T = g.size(0), I = g.size(1) / 2;
  torch::Tensor y = torch::empty({T, I}, g.options());
  const float* G = g.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for_rows(T, 4 * I, [&](int64_t t) {
    const float* gate = G + t * 2 * I;
    const float* up = gate + I;
    float* yr = Y + t * I;
    int64_t c = 0;
    for (; c + 8 <= I; c += 8)
      _mm256_storeu_ps(yr + c, _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + c)), _mm256_loadu_ps(up + c)));
    if (c < I)
      store_partial(yr + c, _mm256_mul_ps(silu8(load_partial(gate + c, I - c)), load_partial(up + c, I - c)), I - c);
  });
  return y;
}

// GELU (tanh approximation) of every element, row by row
torch::Tensor gelu(const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "gelu: [T, n] fp32");
  const torch::Tensor x = x_in.contiguous();
  const int64_t T = x.size(0), n = x.size(1);
  torch::Tensor y = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for_rows(T, 4 * n, [&](int64_t t) { map_row(X + t * n, Y + t * n, n, gelu8); });
  return y;
}

// rows `ids` [T] of the fp32 matrix packed as [G, K, 32] (a tied output head serving as the embedding table)
torch::Tensor panel_rows(const torch::Tensor& packed, const torch::Tensor& ids_in) {
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous() &&
              packed.scalar_type() == at::kFloat, "panel_rows: packed [G, K, 32] fp32");
  const torch::Tensor ids = ids_in.to(at::kLong).contiguous();
  const int64_t T = ids.numel(), K = packed.size(1), rows = packed.size(0) * kPanel;
  torch::Tensor out = torch::empty({T, K}, packed.options());
  const int64_t* I = ids.data_ptr<int64_t>();
  const float* P = packed.data_ptr<float>();
  float* O = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(I[t] >= 0 && I[t] < rows, "panel_rows: token id out of range");
    const float* base = P + (I[t] / kPanel) * K * kPanel + I[t] % kPanel;
    for (int64_t k = 0; k < K; ++k) O[t * K + k] = base[k * kPanel];
  }
  return out;
}

// the FMA chains of fma_peak_gflops: twelve of vector type V, `iterations` each; returns their sum (kept)
template <typename V, typename Set, typename Fma, typename Add>
V fma_chains(int64_t iterations, Set set1, Fma fma, Add add) {
  // twelve different starting values: chains that start equal compute equal values, and GCC merged them into one
  // chain (one FMA per iteration, latency-bound), so this reported 12 x 8 x 2 flops per 4 cycles, 1.5x the
  // machine's peak (323 "GFLOPS" with 2 threads on a 2-core Sapphire Rapids guest, where 256-bit FMAs reach ~260)
  V a0 = set1(1.0f), a1 = set1(1.01f), a2 = set1(1.02f), a3 = set1(1.03f), a4 = set1(1.04f), a5 = set1(1.05f),
    a6 = set1(1.06f), a7 = set1(1.07f), a8 = set1(1.08f), a9 = set1(1.09f), a10 = set1(1.10f), a11 = set1(1.11f);
  const V m = set1(0.999999f), c = set1(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c); a4 = fma(a4, m, c);
    a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c); a8 = fma(a8, m, c); a9 = fma(a9, m, c);
    a10 = fma(a10, m, c); a11 = fma(a11, m, c);
  }
  return add(add(add(add(a0, a1), add(a2, a3)), add(add(a4, a5), add(a6, a7))), add(add(a8, a9), add(a10, a11)));
}

// fp32 FMA throughput of all threads, GFLOPS, with the vectors the GEMM uses (sixteen lanes where the build has
// AVX-512, eight otherwise): the peak prefill is measured against
double fma_peak_gflops(int64_t iterations) {
  const int threads = at::get_num_threads();
#if defined(__AVX512F__)
  constexpr int lanes = 16;
#else
  constexpr int lanes = 8;
#endif
  std::vector<float> sink(threads * lanes);
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
#if defined(__AVX512F__)
      const __m512 s = fma_chains<__m512>(
          iterations, [](float v) { return _mm512_set1_ps(v); },
          [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); },
          [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
      _mm512_storeu_ps(sink.data() + t * lanes, s);
#else
      const __m256 s = fma_chains<__m256>(
          iterations, [](float v) { return _mm256_set1_ps(v); },
          [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
          [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
      _mm256_storeu_ps(sink.data() + t * lanes, s);
#endif
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float keep = sink[0];
  (void)keep;
  return threads * static_cast<double>(iterations) * 12 * lanes * 2 / seconds / 1e9;
}

// ---------------------------------------------------------------------------------------------------------------
// The layers of the compact forward in one call per step (rakv.runtime.compact.CompactLM.forward_rows on the CPU).
// A step of a 30-layer model is otherwise ~240 calls from Python, each with its arguments parsed and its tensors
// wrapped, plus the Python between them; here a layer's weights are held once (`Block`), and `forward_blocks` runs
// every layer with the same functions in the same order as the Python loop does (norm, QKV, attention, output
// projection + residual, norm, up, activation, down + residual): the same bits.

// one projection: fp32 packed (gemm), int8 (gemm_i8: scale and colsum given) or block-quantised (gemm_q: format >= 0)
struct Projection {
  torch::Tensor weight;
  int64_t out = 0;
  c10::optional<torch::Tensor> bias, scale, colsum;
  int64_t format = -1;

  torch::Tensor operator()(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual = c10::nullopt) const {
    if (format >= 0) return ::gemm_q(x, weight, format, out, bias, residual);
    if (scale.has_value() && scale->defined()) return ::gemm_i8(x, weight, *colsum, out, *scale, bias, residual);
    return ::gemm(x, weight, out, bias, residual);
  }
};

// RMSNorm (no bias) or LayerNorm of each row
struct RowNorm {
  torch::Tensor weight;
  c10::optional<torch::Tensor> bias;
  double eps = 0;

  torch::Tensor operator()(const torch::Tensor& x) const {
    return bias.has_value() && bias->defined() ? ::layer_norm(x, weight, *bias, eps) : ::rms_norm(x, weight, eps);
  }
};

// one transformer layer's weights and shape, as rakv.runtime.compact.Block holds them
struct Block {
  RowNorm norm_in, norm_mlp;
  Projection qkv, out, up, down;
  bool gated = true;  // SiLU(gate) * up (Llama) or GELU (GPT-2)
  int64_t heads = 0, kv_heads = 0;
  double scale = 1;

  torch::Tensor forward(const torch::Tensor& x, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lengths, const c10::optional<torch::Tensor>& cos,
                        const c10::optional<torch::Tensor>& sin_signed) const {
    const torch::Tensor attended = ::attention(qkv(norm_in(x)), keys, values, starts, lengths, heads, kv_heads, scale,
                                             cos, sin_signed);
    const torch::Tensor h = out(attended, x);
    const torch::Tensor hidden = up(norm_mlp(h));
    return down(gated ? ::silu_mul(hidden) : ::gelu(hidden), h);
  }
};

Projection make_projection(torch::Tensor weight, int64_t out, c10::optional<torch::Tensor> bias,
                           c10::optional<torch::Tensor> scale, c10::optional<torch::Tensor> colsum, int64_t format) {
  return Projection{std::move(weight), out, std::move(bias), std::move(scale), std::move(colsum), format};
}

// x after every block; keys[i] / values[i]: block i's K/V buffer of each segment (already extended, as `attention`
// takes them)
torch::Tensor forward_blocks(const std::vector<std::shared_ptr<Block>>& blocks, torch::Tensor x,
                             const std::vector<std::vector<torch::Tensor>>& keys,
                             const std::vector<std::vector<torch::Tensor>>& values, const std::vector<int64_t>& starts,
                             const std::vector<int64_t>& lengths, const c10::optional<torch::Tensor>& cos,
                             const c10::optional<torch::Tensor>& sin_signed) {
  TORCH_CHECK(keys.size() == blocks.size() && values.size() == blocks.size(),
              "forward_blocks: one list of K/V buffers per block");
  for (size_t i = 0; i < blocks.size(); ++i)
    x = blocks[i]->forward(x, keys[i], values[i], starts, lengths, cos, sin_signed);
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", &gemm, "y = x W^T (+ bias) (+ residual), W packed in panels of 32 outputs, batch-invariant");
  m.def("gemm_q", &gemm_q,
        "y = x W^T (+ bias) (+ residual), W in Q4_1 / Q8_0 blocks, fp32 FMA chains, batch-invariant");
  m.def("gemm_i8", &gemm_i8, "y = x (W_q scale)^T (+ bias) (+ residual), int8 weights and per-row int8 activations");
  m.def("int8_dot", &int8_dot, "the int8 dot product instruction this build uses");
  m.def("attention", &attention, "causal grouped-query attention of every segment of a batched forward, one layer "
        "(rotary embedding and K/V writes included)");
  m.def("rms_norm", &rms_norm, "LlamaRMSNorm of each row");
  m.def("layer_norm", &layer_norm, "LayerNorm of each row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate/up output");
  m.def("gelu", &gelu, "GELU, tanh approximation, of every element");
  m.def("panel_rows", &panel_rows, "rows of a packed fp32 matrix (an embedding lookup in a tied head)");
  py::class_<Projection>(m, "Projection");
  m.def("projection", &make_projection,
        "a projection for Block: fp32 packed, int8 with its scale and colsum, or Q4_1 / Q8_0 blocks (format >= 0)");
  py::class_<RowNorm>(m, "RowNorm")
      .def(py::init([](torch::Tensor weight, c10::optional<torch::Tensor> bias, double eps) {
        return RowNorm{std::move(weight), std::move(bias), eps};
      }));
  py::class_<Block, std::shared_ptr<Block>>(m, "Block")
      .def(py::init([](RowNorm norm_in, Projection qkv, Projection out, RowNorm norm_mlp, Projection up,
                       Projection down, bool gated, int64_t heads, int64_t kv_heads, double scale) {
        return std::make_shared<Block>(Block{std::move(norm_in), std::move(norm_mlp), std::move(qkv), std::move(out),
                                             std::move(up), std::move(down), gated, heads, kv_heads, scale});
      }));
  m.def("forward_blocks", &forward_blocks, "every layer of a compact forward step in one call (Block's forward)");
  m.def("fma_peak_gflops", &fma_peak_gflops, "fp32 FMA GFLOPS of all threads, twelve chains each");
}
