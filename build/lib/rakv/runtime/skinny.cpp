// y = x W^T (+ b) for a few rows of x: the CPU GEMM path of rakv.runtime.kernels.linear for 1-16 rows, with fp32
// weights or int8 weights and one scale per output (the compact int8 draft).
//
// Why: a decode step or a verify of k + 1 is a pass over every weight with a handful of rows, so it
// should run at the memory's streaming bandwidth. MKL's sgemv / sgemm for 1-16 rows reach about half of
// it on the 2-core machine this artifact is measured on (rakv.runtime.kernels documents the numbers), llama.cpp
// close to all of it. Here each thread streams a contiguous block of W's rows exactly once and, while a
// row is in L1, takes its dot product with every row of x (x itself stays in L1/L2).
//
// Numerics: fp32 products and sums, sixteen partial sums per dot product (another order than MKL's, so
// the last bits differ; the tests hold it to F.linear within fp32 tolerance).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kMaxRows = 16;

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const int8_t* w) {  // 8 int8 weights widened to 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// Dot products of one W row with R (1 or 2) rows of x, row stride K. Four independent accumulators per
// row, so that FMA latency does not bound the stream. Every row of x is summed in exactly the same order
// whatever R and m are: a row's result does not depend on the other rows in the call, so a request's
// logits are bit-identical alone, in a verify of k + 1 or inside a batch.
template <int R, typename T>
inline void dots_r(const T* w, const float* x, int64_t K, float* out) {
  __m256 a[R][4];
  for (int j = 0; j < R; ++j)
    for (int l = 0; l < 4; ++l) a[j][l] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256 w0 = load8(w + k), w1 = load8(w + k + 8), w2 = load8(w + k + 16), w3 = load8(w + k + 24);
    for (int j = 0; j < R; ++j) {
      const float* xr = x + j * K + k;
      a[j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a[j][0]);
      a[j][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a[j][1]);
      a[j][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), a[j][2]);
      a[j][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), a[j][3]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 w0 = load8(w + k);
    for (int j = 0; j < R; ++j) a[j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + j * K + k), a[j][0]);
  }
  for (int j = 0; j < R; ++j) {
    float total = hsum(_mm256_add_ps(_mm256_add_ps(a[j][0], a[j][1]), _mm256_add_ps(a[j][2], a[j][3])));
    for (int64_t t = k; t < K; ++t) total += static_cast<float>(w[t]) * x[j * K + t];
    out[j] = total;
  }
}

template <typename T>
inline void dots(const T* w, const float* x, int64_t m, int64_t K, float* out) {
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) dots_r<2>(w, x + i * K, K, out + i);  // the W row stays in L1 between pairs
  if (i < m) dots_r<1>(w, x + i * K, K, out + i);
}
#else
template <typename T>
inline void dots(const T* w, const float* x, int64_t m, int64_t K, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float* xr = x + i * K;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
      for (int l = 0; l < 8; ++l) acc[l] += static_cast<float>(w[k + l]) * xr[k + l];
    float total = 0;
    for (; k < K; ++k) total += static_cast<float>(w[k]) * xr[k];
    for (int l = 0; l < 8; ++l) total += acc[l];
    out[i] = total;
  }
}
#endif

}  // namespace

// y [m, N] = (x [m, K] @ w [N, K]^T) * scale [N] (int8 w; scale undefined for fp32 w) + bias [N]
template <typename T>
torch::Tensor run(const torch::Tensor& x_in, const torch::Tensor& w, const torch::Tensor& scale,
                  const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(x_in.dim() == 2 && w.dim() == 2 && x_in.size(1) == w.size(1), "skinny: x [m, K], w [N, K]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "skinny: fp32 activations only");
  TORCH_CHECK(w.is_contiguous() && x_in.size(0) <= kMaxRows, "skinny: contiguous w, at most 16 rows");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  torch::Tensor y = torch::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const T* W = w.data_ptr<T>();
  float* Y = y.data_ptr<float>();
  const torch::Tensor bias = (b.has_value() && b->defined()) ? b->contiguous() : torch::Tensor();
  const float* B = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const float* S = scale.defined() ? scale.data_ptr<float>() : nullptr;
  // grain: rows per task; each thread gets one contiguous block, which the hardware prefetcher streams
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    float out[kMaxRows];
    for (int64_t n = begin; n < end; ++n) {
      dots(W + n * K, X, M, K, out);
      const float s = S ? S[n] : 1.0f, add = B ? B[n] : 0.0f;
      for (int64_t i = 0; i < M; ++i) Y[i * N + n] = S ? out[i] * s + add : out[i] + add;
    }
  });
  return y;
}

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(w.scalar_type() == at::kFloat, "skinny_linear: fp32 weights");
  return run<float>(x, w, torch::Tensor(), b);
}

torch::Tensor skinny_linear_int8(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale,
                                 const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(w.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
              scale.numel() == w.size(0), "skinny_linear_int8: int8 weights [N, K], fp32 scales [N]");
  return run<int8_t>(x, w, scale, b);
}

// Attention of n new queries over a request's K/V, causal: query i sees keys 0 .. L - n + i.
// q [n, H, D]; keys / values [1, KV, L, D] views of the growing buffers (any strides on dims 0-2, unit on D);
// head h reads K/V head h / (H / KV) (grouped-query attention, as transformers' repeat_kv). Returns [n, H * D].
// Why: for a handful of queries, scaled_dot_product_attention costs ~100 us per layer on this machine, most of
// it fixed; this loop costs what its arithmetic costs.
torch::Tensor attend(const torch::Tensor& q_in, const torch::Tensor& keys, const torch::Tensor& values, double scale) {
  TORCH_CHECK(q_in.dim() == 3 && keys.dim() == 4 && values.dim() == 4 && keys.size(0) == 1, "attend: shapes");
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "attend: fp32 only");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1 && keys.sizes() == values.sizes(), "attend: K/V layout");
  const torch::Tensor q = q_in.contiguous();
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KV = keys.size(1), L = keys.size(2);
  TORCH_CHECK(H % KV == 0 && keys.size(3) == D && L >= n, "attend: heads or lengths");
  const int64_t group = H / KV, ks_h = keys.stride(1), ks_l = keys.stride(2);
  const int64_t vs_h = values.stride(1), vs_l = values.stride(2);
  torch::Tensor out = torch::empty({n, H * D}, q.options());
  const float* Q = q.data_ptr<float>();
  const float* K = keys.data_ptr<float>();
  const float* V = values.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, n * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(L);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / H, h = task % H, kv = h / group, visible = L - n + i + 1;
      const float* qv = Q + (i * H + h) * D;
      float top = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kr = K + kv * ks_h + j * ks_l;
        float dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qv[d] * kr[d];
        p[j] = dot * sc;
        top = std::max(top, p[j]);
      }
      float total = 0;
      for (int64_t j = 0; j < visible; ++j) { p[j] = std::exp(p[j] - top); total += p[j]; }
      float* o = O + i * H * D + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0;
      for (int64_t j = 0; j < visible; ++j) {
        const float* vr = V + kv * vs_h + j * vs_l;
        const float w = p[j] / total;
        for (int64_t d = 0; d < D; ++d) o[d] += w * vr[d];
      }
    }
  });
  return out;
}

// weight * x * rsqrt(mean(x^2) + eps) per row (LlamaRMSNorm), x [T, d]; one call instead of six small ops
torch::Tensor rms_norm(const torch::Tensor& x_in, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && weight.numel() == x_in.size(1), "rms_norm");
  const torch::Tensor x = x_in.contiguous(), w = weight.contiguous();
  const int64_t T = x.size(0), d = x.size(1);
  torch::Tensor y = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = X + t * d;
    float total = 0;
    for (int64_t c = 0; c < d; ++c) total += xr[c] * xr[c];
    const float inv = 1.0f / std::sqrt(total / static_cast<float>(d) + static_cast<float>(eps));
    for (int64_t c = 0; c < d; ++c) Y[t * d + c] = W[c] * (xr[c] * inv);
  }
  return y;
}

// silu(gate) * up of a fused [T, 2I] gate/up projection (LlamaMLP's activation), one call instead of four ops
torch::Tensor silu_mul(const torch::Tensor& gate_up_in) {
  TORCH_CHECK(gate_up_in.dim() == 2 && gate_up_in.scalar_type() == at::kFloat && gate_up_in.size(1) % 2 == 0,
              "silu_mul: [T, 2I] fp32");
  const torch::Tensor g = gate_up_in.contiguous();
  const int64_t T = g.size(0), I = g.size(1) / 2;
  torch::Tensor y = torch::empty({T, I}, g.options());
  const float* G = g.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < I; ++c) {
      const float a = G[t * 2 * I + c];
      Y[t * I + c] = (a / (1.0f + std::exp(-a))) * G[t * 2 * I + I + c];
    }
  return y;
}

// rotary embedding of queries and keys in place: x [T, heads, D] (rows of a fused QKV output), cos and
// sin_signed [T, D] (sin with its first half negated): x * cos + roll(x, D / 2) * sin_signed
void rope_(torch::Tensor x, const torch::Tensor& cos_in, const torch::Tensor& sin_in) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.scalar_type() == at::kFloat, "rope_: x [T, heads, D]");
  const torch::Tensor c = cos_in.contiguous(), sn = sin_in.contiguous();
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2), half = D / 2;
  const int64_t st = x.stride(0), sh = x.stride(1);
  float* X = x.data_ptr<float>();
  const float* C = c.data_ptr<float>();
  const float* S = sn.data_ptr<float>();
  std::vector<float> row(D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = X + t * st + h * sh;
      for (int64_t d = 0; d < D; ++d) row[d] = v[d];
      for (int64_t d = 0; d < D; ++d) v[d] = row[d] * C[t * D + d] + row[(d + half) % D] * S[t * D + d];
    }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skinny_linear", &skinny_linear, "y = x w^T (+ b) for 1-16 rows of x, fp32, CPU");
  m.def("attend", &attend, "causal grouped-query attention of n new queries over one request's K/V, CPU");
  m.def("rms_norm", &rms_norm, "LlamaRMSNorm of each row, CPU");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate/up output, CPU");
  m.def("rope_", &rope_, "rotary embedding of queries and keys in place, CPU");
  m.def("skinny_linear_int8", &skinny_linear_int8, "y = (x w^T) * scale (+ b), int8 w, 1-16 rows, CPU");
}
