// Streaming YAAPT-style F0 tracker (Zahorian & Hu 2008), one stream per object.
//
// The same algorithm, operation for operation, as src/rtanon/f0/numba_kernel.py (and its
// per-frame searches, numba_candidates.py; the parity test holds them together); every constant comes from
// rtanon.f0.config.derive() through the iparams/fparams vectors, whose layout
// is mirrored in the enums below. See numba_kernel.py for the description of
// the steps. Nothing allocates after construction.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

// On x86-64 Linux with GCC or Clang, the hot member functions are compiled twice, for AVX2 and
// for the baseline (SSE2), and the loader picks the one the CPU runs (function multi-versioning):
// the wheel stays portable and the loops vectorise eight floats wide where AVX2 exists. The AVX2
// target does not include FMA, so neither version fuses multiply-adds and both give the same
// results (the Numba kernel's, within rounding of the twiddle tables).
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define RTANON_F0_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RTANON_F0_CLONES
#endif
// Inlined into the (cloned) caller, so it is compiled for the caller's target.
#if defined(__GNUC__) || defined(__clang__)
#define RTANON_F0_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define RTANON_F0_INLINE __forceinline
#else
#define RTANON_F0_INLINE inline
#endif

namespace rtanon {

class F0Kernel {
 public:
  // Layout of the integer parameters (rtanon/f0/config.py I_*).
  enum IParam {
    I_H8, I_LAG, I_NFFT, I_KB0, I_KB1, I_SHC_MIN, I_SHC_MAX, I_SHC_HALF, I_SHC_NH, I_PK_MIN, I_PK_MAX,
    I_PK_CENTER, I_LAG_MIN, I_LAG_MAX, I_NCCF_N, I_NBQ, I_TAU_E, I_TAU_P, I_B8, I_SW4, N_IPARAMS
  };
  // Layout of the float parameters (F_*).
  enum FParam {
    F_F0MIN, F_F0MAX, F_NLFER1, F_NLFER2, F_SHC_T1, F_SHC_T2, F_K1, F_NCCF_T1, F_NCCF_T2, F_BOOST,
    F_PIVOT, F_W1, F_W2, F_W3, F_W4, F_PRIOR_F0, F_PRIOR_N, F_SEARCH_STD, F_E_FLOOR, F_DELTA4,
    F_E_PRIOR, F_E_PRIOR_N, F_FH_MIN, F_HBC, F_HB1, F_HB3, F_SKIP2, N_FPARAMS
  };
  static constexpr int kHop = 160;  // 10 ms at 16 kHz
  static constexpr int kNC = 6;     // DP candidates: 3 NCCF, spectral, best, unvoiced
  static constexpr int kNccfPerSignal = 3;
  static constexpr int kNccfCenter = 2;
  static constexpr int kSpecCands = 4;
  static constexpr int kHbHist = 3;                 // half-band history per phase (7 taps)
  static constexpr int kHbLen = kHbHist + kHop / 2;  // history + one hop per phase

  F0Kernel(std::vector<std::int64_t> iparams, std::vector<double> fparams, std::vector<double> sos,
           std::vector<double> hann, std::vector<double> kaiser)
      : ip_(std::move(iparams)), fp_(std::move(fparams)), sos_(std::move(sos)), hann_(std::move(hann)),
        kais_(std::move(kaiser)) {
    if (ip_.size() != N_IPARAMS || fp_.size() != N_FPARAMS)
      throw std::invalid_argument("F0Kernel: parameter vectors do not match this build; rebuild rtanon._core");
    nfft_ = static_cast<int>(ip_[I_NFFT]);
    h8_ = static_cast<int>(ip_[I_H8]);
    b8_ = static_cast<int>(ip_[I_B8]);
    sw4_ = static_cast<int>(ip_[I_SW4]);
    nbq_ = static_cast<int>(ip_[I_NBQ]);
    lag_ = static_cast<int>(ip_[I_LAG]);
    if (sos_.size() != static_cast<std::size_t>(nbq_) * 6 || hann_.size() != static_cast<std::size_t>(h8_) ||
        kais_.size() != static_cast<std::size_t>(sw4_) || (nfft_ & (nfft_ - 1)) != 0)
      throw std::invalid_argument("F0Kernel: window or filter sizes do not match the parameters");
    if (nbq_ < 1 || nbq_ > 16 || ip_[I_SHC_MIN] < ip_[I_SHC_HALF] || ip_[I_NCCF_N] % 16 != 0)
      throw std::invalid_argument("F0Kernel: parameters out of range; rebuild them with rtanon.f0.config.derive");
    twc_.resize(nfft_ / 2);
    tws_.resize(nfft_ / 2);
    const double pi = 3.14159265358979323846;
    for (int k = 0; k < nfft_ / 2; ++k) {
      twc_[k] = std::cos(2.0 * pi * k / nfft_);
      tws_[k] = -std::sin(2.0 * pi * k / nfft_);
    }
    twr_.assign(nfft_, 0.0f);
    twi_.assign(nfft_, 0.0f);
    for (int h = 1; h < nfft_; h *= 2)
      for (int k = 0; k < h; ++k) {
        twr_[h + k] = static_cast<float>(twc_[k * (nfft_ / (2 * h))]);
        twi_[h + k] = static_cast<float>(tws_[k * (nfft_ / (2 * h))]);
      }
    brev_.resize(nfft_);
    int bits = 0;
    while ((1 << bits) < nfft_) ++bits;
    for (int i = 0; i < nfft_; ++i) {
      int r = 0;
      for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
      brev_[i] = r;
    }
    zst_.assign(2 * nbq_ * 2, 0.0);
    hb_.assign(4 * kHbLen, 0.0);
    dec_.assign(kHop, 0.0);
    buf_[0].assign(b8_, 0.0f);
    buf_[1].assign(b8_, 0.0f);
    re_.assign(nfft_, 0.0f);
    im_.assign(nfft_, 0.0f);
    ren_.assign(nfft_ + 1, 0.0f);
    imn_.assign(nfft_ + 1, 0.0f);
    hannf_.assign(hann_.begin(), hann_.end());
    kaisf_.assign(kais_.begin(), kais_.end());
    mag_a_.assign(nfft_ / 2 + 1, 0.0);
    pow_a_.assign(nfft_ / 2 + 1, 0.0);
    mag_b_.assign(std::max<std::int64_t>(nfft_ / 2 + 1, ip_[I_SHC_NH] * ip_[I_SHC_MAX] + ip_[I_SHC_HALF] + 1), 0.0);
    shc_len_ = static_cast<int>(std::max(ip_[I_SHC_MAX], ip_[I_PK_MAX] + ip_[I_PK_CENTER])) + 2;
    shc_.assign(shc_len_, 0.0);
    cs_.assign(b8_ + 1, 0.0);
    phi_.assign(ip_[I_LAG_MAX] + 2, 0.0);
    ringp_.assign((lag_ + 1) * kNC, 0.0);
    ringb_.assign((lag_ + 1) * kNC, 0);
    reset();
  }

  void reset() {
    std::fill(zst_.begin(), zst_.end(), 0.0);
    std::fill(hb_.begin(), hb_.end(), 0.0);
    std::fill(buf_[0].begin(), buf_[0].end(), 0.0f);
    std::fill(buf_[1].begin(), buf_[1].end(), 0.0f);
    std::fill(spv_p_, spv_p_ + kSpecCands, 0.0);
    std::fill(spv_a_, spv_a_ + kSpecCands, 0.0);
    std::fill(dpacc_, dpacc_ + kNC, 0.0);
    std::fill(ringp_.begin(), ringp_.end(), 0.0);
    std::fill(ringb_.begin(), ringb_.end(), 0);
    fill_ = b8_ - h8_;
    t_ = 0;
    spec_prev_ = false;
    const double prior = fp_[F_PRIOR_F0];
    spec_avg_ = prior;
    h0_ = h1_ = h2_ = held_ = prior;
    meanp_ = prior;
    nspec_ = fp_[F_PRIOR_N];
    np_ = fp_[F_PRIOR_N];
    meane_ = fp_[F_E_PRIOR];
    ne_ = fp_[F_E_PRIOR_N];
    prev_e_ = 0.0;
  }

  // x: n float32 samples at 16 kHz, n a multiple of 160. out: n / 160 values,
  // the F0 (Hz, 0 = unvoiced) of the frame finalized by each 10 ms hop.
  RTANON_F0_CLONES void process(const float* x, std::size_t n, double* out) {
    const std::size_t nhops = n / kHop;
    const int hop8 = kHop / 2;
    for (std::size_t h = 0; h < nhops; ++h) {
      // the signal (row 0) and its square (row 1), split into even and odd samples after
      // kHbHist samples of history per phase
      double* __restrict ev0 = hb_.data();
      double* __restrict od0 = ev0 + kHbLen;
      double* __restrict ev1 = od0 + kHbLen;
      double* __restrict od1 = ev1 + kHbLen;
      const float* xh = x + h * kHop;
      for (int m = 0; m < hop8; ++m) {
        const double a = static_cast<double>(xh[2 * m]);
        const double b = static_cast<double>(xh[2 * m + 1]);
        ev0[kHbHist + m] = a;
        od0[kHbHist + m] = b;
        ev1[kHbHist + m] = a * a;
        od1[kHbHist + m] = b * b;
      }
      // half-band low-pass and decimation to 8 kHz: output m is the input at 16 kHz sample 2m
      // (this hop) through the 7-tap half-band filter (h3, 0, h1, hc, h1, 0, h3)
      const double h3 = fp_[F_HB3], h1 = fp_[F_HB1], hc = fp_[F_HBC];
      double* __restrict d0 = dec_.data();
      double* __restrict d1 = d0 + hop8;
      for (int m = 0; m < hop8; ++m) {
        d0[m] = h3 * (ev0[m + 3] + ev0[m]) + h1 * (ev0[m + 2] + ev0[m + 1]) + hc * od0[m + 1];
        d1[m] = h3 * (ev1[m + 3] + ev1[m]) + h1 * (ev1[m + 2] + ev1[m + 1]) + hc * od1[m + 1];
      }
      for (int j = 0; j < kHbHist; ++j) {
        ev0[j] = ev0[hop8 + j];
        od0[j] = od0[hop8 + j];
        ev1[j] = ev1[hop8 + j];
        od1[j] = od1[hop8 + j];
      }
      // band-pass at 8 kHz, both signals through the same sections side by side
      if (nbq_ == 4)
        bandpass<4>(d0, d1, hop8);
      else
        bandpass<0>(d0, d1, hop8);
      double val = 0.0;
      if (fill_ == b8_) {
        const double r = analyse_frame();
        if (r > 0.0) val = r;
        for (int i = 0; i < b8_ - hop8; ++i) {
          buf_[0][i] = buf_[0][i + hop8];
          buf_[1][i] = buf_[1][i + hop8];
        }
        fill_ = b8_ - hop8;
      }
      out[h] = val;
    }
  }

 private:
  // Transposed direct form II sections on the signal (d0) and its square (d1), n samples, into
  // buf_ at fill_; NBQ > 0: that many sections, state held in registers for the block.
  // State z[section][0..1][signal]; z0 <- (b1 v + z1) - a1 y, z1 <- b2 v - a2 y.
  template <int NBQ>
  RTANON_F0_INLINE void bandpass(const double* d0, const double* d1, int n) {
    const int nbq = NBQ > 0 ? NBQ : nbq_;
    constexpr int kMax = NBQ > 0 ? NBQ : 16;
    double z[kMax][4];
    for (int s = 0; s < nbq; ++s)
      for (int j = 0; j < 4; ++j) z[s][j] = zst_[s * 4 + j];
    const double* c = sos_.data();
    float* o0 = buf_[0].data() + fill_;
    float* o1 = buf_[1].data() + fill_;
    for (int m = 0; m < n; ++m) {
      double v[2] = {d0[m], d1[m]};
      for (int s = 0; s < nbq; ++s) {
        const double* cs = c + s * 6;
        double y[2];
        for (int ch = 0; ch < 2; ++ch) y[ch] = cs[0] * v[ch] + z[s][ch];
        for (int ch = 0; ch < 2; ++ch) z[s][ch] = (cs[1] * v[ch] + z[s][2 + ch]) - cs[4] * y[ch];
        for (int ch = 0; ch < 2; ++ch) z[s][2 + ch] = cs[2] * v[ch] - cs[5] * y[ch];
        v[0] = y[0];
        v[1] = y[1];
      }
      o0[m] = static_cast<float>(v[0]);
      o1[m] = static_cast<float>(v[1]);
    }
    fill_ += n;
    for (int s = 0; s < nbq; ++s)
      for (int j = 0; j < 4; ++j) zst_[s * 4 + j] = z[s][j];
  }

  static void running_mean(double& mean, double& count, double value, double tau) {
    count += 1.0;
    const double n_eff = count < tau ? count : tau;
    mean = mean + (value - mean) / n_eff;
  }

  // One DIF stage on one block: (u, v) -> (u + v, (u - v) w), k < half.
  static RTANON_F0_INLINE void butterflies(
      float* __restrict r0, float* __restrict i0, float* __restrict r1, float* __restrict i1,
      const float* __restrict wr, const float* __restrict wi, int half) {
    for (int k = 0; k < half; ++k) {
      const float ur = r0[k], ui = i0[k], vr = r1[k], vi = i1[k];
      r0[k] = ur + vr;
      i0[k] = ui + vi;
      const float dr = ur - vr, di = ui - vi;
      r1[k] = dr * wr[k] - di * wi[k];
      i1[k] = dr * wi[k] + di * wr[k];
    }
  }

  // Radix-2 FFT, decimation in frequency, of re_ + i im_ (overwritten); the spectrum goes to
  // ren_, imn_ in natural order (N + 1 bins, bin N = bin 0). Stage with half-size h
  // reads its twiddles exp(-2 pi i k / 2h), k < h, contiguously at twr_[h + k], twi_[h + k], so
  // the inner loop runs over contiguous memory and vectorises.
  RTANON_F0_CLONES void fft() {
    const int n = nfft_;
    float* __restrict re = re_.data();
    float* __restrict im = im_.data();
    for (int half = n / 2; half >= 4; half /= 2) {
      const float* __restrict wr = twr_.data() + half;
      const float* __restrict wi = twi_.data() + half;
      for (int start = 0; start < n; start += 2 * half)
        butterflies(re + start, im + start, re + start + half, im + start + half, wr, wi, half);
    }
    // last two stages (h = 2: twiddles 1 and -i; h = 1: twiddle 1) as one radix-4 pass
    float* __restrict ren = ren_.data();
    float* __restrict imn = imn_.data();
    const int* brev = brev_.data();
    for (int s = 0; s < n; s += 4) {
      const float r0 = re[s], r1 = re[s + 1], r2 = re[s + 2], r3 = re[s + 3];
      const float i0 = im[s], i1 = im[s + 1], i2 = im[s + 2], i3 = im[s + 3];
      const float ar = r0 + r2, ai = i0 + i2, br = r1 + r3, bi = i1 + i3;
      const float cr = r0 - r2, ci = i0 - i2, dr = i1 - i3, di = -(r1 - r3);  // (r1 - r3) * -i
      // out of place, into natural order
      const int* b = brev + s;
      ren[b[0]] = ar + br;
      imn[b[0]] = ai + bi;
      ren[b[1]] = ar - br;
      imn[b[1]] = ai - bi;
      ren[b[2]] = cr + dr;
      imn[b[2]] = ci + di;
      ren[b[3]] = cr - dr;
      imn[b[3]] = ci - di;
    }
    ren[n] = ren[0];  // bin N = bin 0, so bin N - k reads without a wrap for k = 0
    imn[n] = imn[0];
  }

  // Largest local maximum of mag among bins n-1..n+1 (0 if none): the spectrum has a
  // component at the candidate frequency itself, not only the leakage skirt of a neighbour.
  static double harmonic_peak(const double* mag, int n) {
    double best = 0.0;
    for (int q = n - 1; q < n + 2; ++q)
      if (mag[q] >= mag[q - 1] && mag[q] >= mag[q + 1] && mag[q] > best) best = mag[q];
    return best;
  }

  // YAAPT ``peaks``: up to 4 SHC peaks (Hz, merit); returns how many. The merit of a peak is its
  // normalised SHC times min(1, fh / shc_first_harmonic_min)^2, fh = the larger of the filtered
  // and squared spectra (each over its maximum) at a spectral peak within one bin of the
  // candidate: the SHC of the squared signal
  // alone favours sub-harmonics when it has few components (a pure tone squared has only 2f, and
  // the products over 4 harmonics peak at 2f/3 or f/2 through window leakage); a true F0 has its
  // first harmonic in the filtered spectrum or, as the difference tone, in the squared one.
  // The voicing tests (peak threshold, best over mean) use the plain SHC as in YAAPT.
  int spectral_peaks(double* out_p, double* out_m) const {
    const int pk_min = static_cast<int>(ip_[I_PK_MIN]);
    const int pk_max = static_cast<int>(ip_[I_PK_MAX]);
    const int center = static_cast<int>(ip_[I_PK_CENTER]);
    const double delta = fp_[F_DELTA4];
    const double* shc = shc_.data();
    double maxd = 0.0;
    for (int n = pk_min; n <= pk_max; ++n)
      if (shc[n] > maxd) maxd = shc[n];
    const double scale = maxd > 1e-14 ? 1.0 / maxd : 1.0;
    double s = 0.0;
    for (int n = pk_min; n <= pk_max; ++n) s += shc[n] * scale;
    const double avg = s / (pk_max - pk_min + 1);
    if (avg > 1.0 / fp_[F_SHC_T1] || avg <= 0.0) return 0;
    // first-harmonic check: a peak of the filtered (A) or squared (B) spectrum at the candidate
    const int nh = nfft_ / 2;
    const double* pow_a = pow_a_.data();
    const double* mag_b = mag_b_.data();
    double amax = 0.0, bmax = 0.0;
    for (int k = 0; k < nh + 1; ++k) {
      if (pow_a[k] > amax) amax = pow_a[k];
      if (mag_b[k] > bmax) bmax = mag_b[k];
    }
    const double inva = amax > 1e-60 ? 1.0 / amax : 0.0;
    const double invb = bmax > 1e-30 ? 1.0 / bmax : 0.0;
    int num = 0;
    double bestm = 0.0;
    for (int n = pk_min + center + 1; n < pk_max - center + 1; ++n) {
      const double v = shc[n] * scale;
      if (v > shc[n - 1] * scale && v > shc[n + 1] * scale && v > fp_[F_SHC_T2] * avg) {
        bool ok = true;
        for (int q = n - center; q < n + center + 1; ++q) {
          const double w = shc[q] * scale;
          if ((q < n && w >= v) || (q > n && w > v)) {
            ok = false;
            break;
          }
        }
        if (ok) {
          const double fh_a = std::sqrt(harmonic_peak(pow_a, n) * inva);
          const double fh_b = harmonic_peak(mag_b, n) * invb;
          const double fh = fh_a > fh_b ? fh_a : fh_b;
          const double g = fh < fp_[F_FH_MIN] ? fh / fp_[F_FH_MIN] : 1.0;
          const double ve = v * (g * g);
          int pos = num < kSpecCands ? num : kSpecCands;
          while (pos > 0 && out_m[pos - 1] < ve) {
            if (pos < kSpecCands) {
              out_m[pos] = out_m[pos - 1];
              out_p[pos] = out_p[pos - 1];
            }
            --pos;
          }
          if (pos < kSpecCands) {
            out_m[pos] = ve;
            out_p[pos] = n * delta;
          }
          ++num;
          if (v > bestm) bestm = v;
        }
      }
    }
    if (num == 0 || bestm / avg < fp_[F_SHC_T1]) return 0;
    if (num > kSpecCands) num = kSpecCands;
    for (int q = num; q < kSpecCands; ++q) {
      out_p[q] = out_p[0];
      out_m[q] = out_m[0];
    }
    return num;
  }

  RTANON_F0_CLONES int nccf_candidates(int row, int off, int w8, int lag_lo, int lag_hi, double* out_p,
                                       double* out_m, int k0) {
    const float* buf = buf_[row].data();
    const int nccf_n = static_cast<int>(ip_[I_NCCF_N]);
    const int lag_max_g = static_cast<int>(ip_[I_LAG_MAX]);
    double* cs = cs_.data();
    double* phi = phi_.data();
    // prefix sums of squares as four independent running sums over quarters (w8 % 4 == 0),
    // each quarter then offset by the total before it
    const int qn = w8 / 4;
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    cs[0] = 0.0;
    for (int i = 0; i < qn; ++i)
      for (int c = 0; c < 4; ++c) {
        const double v = buf[off + c * qn + i];
        part[c] += v * v;
        cs[c * qn + i + 1] = part[c];
      }
    for (int c = 1; c < 4; ++c) {
      const double base = cs[c * qn];
      for (int i = 1; i <= qn; ++i) cs[c * qn + i] += base;
    }
    double maxphi = 0.0;
    for (int lag = lag_lo; lag <= lag_hi; ++lag) {
      const int s0 = (lag_max_g - lag) / 2;
      const float* xa = buf + off + s0;
      const float* xb = buf + off + s0 + lag;
      // sixteen partial sums in float (independent add chains; they vectorise), nccf_n % 16 == 0
      float a[16] = {};
      for (int i = 0; i < nccf_n; i += 16)
        for (int j = 0; j < 16; ++j) a[j] += xa[i + j] * xb[i + j];
      for (int j = 0; j < 8; ++j) a[j] += a[j + 8];
      const double acc = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      const double ex = cs[s0 + nccf_n] - cs[s0];
      const double ey = cs[s0 + lag + nccf_n] - cs[s0 + lag];
      const double den = ex * ey;
      const double v = den > 1e-30 ? acc / std::sqrt(den) : 0.0;
      phi[lag] = v;
      if (v > maxphi) maxphi = v;
    }
    const int c = kNccfCenter;
    const double t1 = fp_[F_NCCF_T1];
    int num = 0;
    int best_n = -1;
    double best_v = -1.0;
    for (int n = lag_lo + c; n < lag_hi - c + 1; ++n) {
      const double v = phi[n];
      if (v > phi[n - 1] && v > phi[n + 1] && v > t1) {
        if (v > best_v) {
          best_v = v;
          best_n = n;
        }
      }
    }
    if (best_n < 0) return 0;
    const bool single = maxphi > fp_[F_NCCF_T2];
    for (int n = lag_lo + c; n < lag_hi - c + 1; ++n) {
      const double v = phi[n];
      if (!(v > phi[n - 1] && v > phi[n + 1] && v > t1)) continue;
      if (single && n != best_n) continue;
      if (!single) {
        bool ok = true;
        for (int q = n - c; q < n + c + 1; ++q) {
          if ((q < n && phi[q] >= v) || (q > n && phi[q] > v)) {
            ok = false;
            break;
          }
        }
        if (!ok) continue;
      }
      const double a = phi[n - 1];
      const double b = phi[n + 1];
      const double den = a - 2.0 * v + b;
      const double d = den < 0.0 ? 0.5 * (a - b) / den : 0.0;
      const double pitch = 8000.0 / (n + d);
      int pos = num < kNccfPerSignal ? num : kNccfPerSignal;
      while (pos > 0 && out_m[k0 + pos - 1] < v) {
        if (pos < kNccfPerSignal) {
          out_m[k0 + pos] = out_m[k0 + pos - 1];
          out_p[k0 + pos] = out_p[k0 + pos - 1];
        }
        --pos;
      }
      if (pos < kNccfPerSignal) {
        out_m[k0 + pos] = v;
        out_p[k0 + pos] = pitch;
      }
      ++num;
    }
    return num < kNccfPerSignal ? num : kNccfPerSignal;
  }

  RTANON_F0_CLONES double analyse_frame() {
    const int nfft = nfft_, h8 = h8_, w4 = h8_, nh = nfft_ / 2;
    float* re = re_.data();
    float* im = im_.data();
    double* mag_a = mag_a_.data();
    double* mag_b = mag_b_.data();
    double* shc = shc_.data();
    double cp[2 * kNccfPerSignal], cm[2 * kNccfPerSignal], sp[kSpecCands] = {0}, sm[kSpecCands] = {0};
    double dp_p[kNC], dp_m[kNC], newacc[kNC];

    // spectrum at 4 kHz
    const int off_a = b8_ - 2 * h8;
    const int off_b = b8_ - 2 * sw4_;
    for (int i = 0; i < nfft; ++i) {
      re[i] = 0.0f;
      im[i] = 0.0f;
    }
    for (int i = 0; i < w4; ++i) re[i] = buf_[0][off_a + 2 * i] * hannf_[i];
    float mb[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // eight partial sums (sw4 % 8 == 0)
    for (int i = 0; i < sw4_; ++i) im[i] = buf_[1][off_b + 2 * i] * kaisf_[i];
    for (int i = 0; i < sw4_; i += 8)
      for (int j = 0; j < 8; ++j) mb[j] += im[i + j];
    const float mean_b = (((mb[0] + mb[1]) + (mb[2] + mb[3])) + ((mb[4] + mb[5]) + (mb[6] + mb[7]))) /
                         static_cast<float>(sw4_);
    for (int i = 0; i < sw4_; ++i) im[i] -= mean_b;
    fft();
    const float* ren = ren_.data();
    const float* imn = imn_.data();
    // |A| in the energy band here (the rest below, only where the spectral peaks need it)
    const int kb0 = static_cast<int>(ip_[I_KB0]), kb1 = static_cast<int>(ip_[I_KB1]);
    for (int k = kb0; k < kb1; ++k) {
      const double ar = ren[k] + ren[nfft - k];
      const double ai = imn[k] - imn[nfft - k];
      mag_a[k] = 0.5 * std::sqrt(ar * ar + ai * ai);
    }

    // NLFER
    double e = 0.0;
    for (int k = static_cast<int>(ip_[I_KB0]); k < ip_[I_KB1]; ++k) e += mag_a[k];
    running_mean(meane_, ne_, e, static_cast<double>(ip_[I_TAU_E]));
    const double norm = meane_ > fp_[F_E_FLOOR] ? meane_ : fp_[F_E_FLOOR];
    const double en = e / norm;
    const std::int64_t t = t_;
    const double prev_e = t > 0 ? prev_e_ : en;

    // spectral track
    const double avg = spec_avg_;
    const double std_hz = fp_[F_SEARCH_STD] * avg;
    int nspec = 0;
    if (en > fp_[F_NLFER1]) {
      // |2A|^2 on every bin, for the first-harmonic check of the spectral peaks (which compares
      // and scales by the maximum, so the power does without the square roots)
      double* pow_a = pow_a_.data();
      for (int k = 0; k < nh + 1; ++k) {
        const double ar = ren[k] + ren[nfft - k];
        const double ai = imn[k] - imn[nfft - k];
        pow_a[k] = ar * ar + ai * ai;
      }
      // |B| on every bin (the SHC reads up to Nyquist)
      for (int k = 0; k < nh + 1; ++k) {
        const double br = ren[k] - ren[nfft - k];
        const double bi = imn[k] + imn[nfft - k];
        mag_b[k] = 0.5 * std::sqrt(br * br + bi * bi);
      }
      for (int f = 0; f < shc_len_; ++f) shc[f] = 0.0;
      const int half = static_cast<int>(ip_[I_SHC_HALF]);
      const int nharm = static_cast<int>(ip_[I_SHC_NH]);
      // (mag_b_ holds zeros beyond Nyquist up to the highest harmonic read)
      for (int f = static_cast<int>(ip_[I_SHC_MIN]); f <= ip_[I_SHC_MAX]; ++f) {
        double s = 0.0;
        for (int w = -half; w <= half; ++w) {
          double prod = 1.0;
          for (int r = 1; r <= nharm; ++r) prod *= mag_b[r * f + w];
          s += prod;
        }
        shc[f] = s;
      }
      nspec = spectral_peaks(sp, sm);
    }
    if (nspec > 0) {
      const double k1w = fp_[F_K1] * std_hz / avg;
      const double f0min = fp_[F_F0MIN];
      for (int j = 0; j < kSpecCands; ++j) {
        const double local = 1.0 - sm[j];
        if (!spec_prev_) {
          newacc[j] = local;
        } else {
          double best = 1e300;
          for (int i = 0; i < kSpecCands; ++i) {
            const double d = std::fabs(spv_p_[i] - sp[j]) / f0min;
            const double c = spv_a_[i] + k1w * (0.05 * d + d * d);
            if (c < best) best = c;
          }
          newacc[j] = best + local;
        }
      }
      int jbest = 0;
      for (int j = 0; j < kSpecCands; ++j)
        if (newacc[j] <= newacc[jbest]) jbest = j;
      const double base = newacc[jbest];
      for (int j = 0; j < kSpecCands; ++j) {
        spv_p_[j] = sp[j];
        spv_a_[j] = newacc[j] - base;
      }
      spec_prev_ = true;
      const double raw = sp[jbest];
      running_mean(spec_avg_, nspec_, raw, static_cast<double>(ip_[I_TAU_P]));
      held_ = raw;
    }
    h0_ = h1_;
    h1_ = h2_;
    h2_ = held_;
    const double spec = (h0_ + h1_ + h2_) / 3.0;

    // NCCF candidates
    const double f0min = fp_[F_F0MIN];
    const double f0max = fp_[F_F0MAX];
    double lo_hz = spec - 2.0 * std_hz;
    if (lo_hz < f0min) lo_hz = f0min;
    double hi_hz = spec + 2.0 * std_hz;
    if (hi_hz > f0max) hi_hz = f0max;
    if (lo_hz >= hi_hz) lo_hz = 0.5 * hi_hz;
    int lag_lo = static_cast<int>(std::floor(8000.0 / hi_hz)) - kNccfCenter;
    int lag_hi = static_cast<int>(std::floor(8000.0 / lo_hz)) + kNccfCenter;
    if (lag_lo < ip_[I_LAG_MIN]) lag_lo = static_cast<int>(ip_[I_LAG_MIN]);
    if (lag_hi > ip_[I_LAG_MAX] - 1) lag_hi = static_cast<int>(ip_[I_LAG_MAX] - 1);
    for (int q = 0; q < 2 * kNccfPerSignal; ++q) {
      cp[q] = 0.0;
      cm[q] = 0.0;
    }
    // definitely unvoiced frames (en <= nlfer_thresh2) discard the NCCF: skip it
    if (lag_hi - lag_lo >= 2 * kNccfCenter + 1 && en > fp_[F_NLFER2]) {
      std::fill(phi_.begin(), phi_.end(), 0.0);
      nccf_candidates(0, off_a, 2 * h8, lag_lo, lag_hi, cp, cm, 0);
      if (!(cm[0] > fp_[F_SKIP2])) {
        std::fill(phi_.begin(), phi_.end(), 0.0);
        nccf_candidates(1, off_a, 2 * h8, lag_lo, lag_hi, cp, cm, kNccfPerSignal);
      }
    }
    const double fth = 5.0 * std_hz;
    for (int q = 0; q < 2 * kNccfPerSignal; ++q) {
      const double diff = std::fabs(cp[q] - spec);
      cm[q] = diff < fth ? (1.0 + fp_[F_BOOST]) * cm[q] * (1.0 - diff / fth) : 0.0;
    }
    for (int q = 1; q < 2 * kNccfPerSignal; ++q) {
      const double mq = cm[q], pq = cp[q];
      int r = q;
      while (r > 0 && cm[r - 1] < mq) {
        cm[r] = cm[r - 1];
        cp[r] = cp[r - 1];
        --r;
      }
      cm[r] = mq;
      cp[r] = pq;
    }

    // refine
    for (int q = 0; q < 3; ++q) {
      dp_p[q] = cp[q];
      dp_m[q] = cm[q];
    }
    for (int q = 3; q < kNC; ++q) {
      dp_p[q] = 0.0;
      dp_m[q] = 0.0;
    }
    if (en <= fp_[F_NLFER2]) {
      for (int q = 0; q < kNC; ++q) {
        dp_p[q] = 0.0;
        dp_m[q] = fp_[F_PIVOT];
      }
    } else if (dp_p[0] > 0.0) {
      dp_m[5] = 1.0 - dp_m[0];
      for (int q = 1; q < 3; ++q)
        if (dp_p[q] == 0.0) dp_m[q] = 0.0;
    } else {
      // no NCCF peak: the spectral track, only if this frame has spectral harmonic peaks
      dp_p[0] = spec;
      dp_m[0] = nspec > 0 ? (en < 2.0 ? en / 2.0 : 1.0) : 0.0;
      for (int q = 1; q < kNC; ++q) {
        dp_p[q] = 0.0;
        dp_m[q] = 1.0 - dp_m[0];
      }
    }
    if (en > fp_[F_NLFER1] && cp[0] > 0.0) {
      dp_p[4] = cp[0];
      dp_m[4] = dp_m[0];
    } else {
      dp_p[4] = 0.0;
      dp_m[4] = 1.0 - (en < 2.0 ? en / 2.0 : 1.0);
    }
    dp_p[3] = spec;
    dp_m[3] = en / 5.0;
    if (en > fp_[F_NLFER1] && cp[0] > 0.0 && cm[0] > 0.0)
      running_mean(meanp_, np_, cp[0], static_cast<double>(ip_[I_TAU_P]));

    // fixed-lag Viterbi
    const int ring = lag_ + 1;
    const int slot = static_cast<int>(t % ring);
    const int pslot = static_cast<int>(((t - 1) % ring + ring) % ring);
    const double w4c = fp_[F_W4];
    double benefit = std::fabs(en - prev_e);
    if (benefit > 1.0) benefit = 1.0;
    const double c_vu = fp_[F_W2] * (1.0 - benefit) / w4c;
    const double c_uu = fp_[F_W3] / w4c;
    const double c_vv = fp_[F_W1] / meanp_ / w4c;
    for (int j = 0; j < kNC; ++j) {
      const double local = 1.0 - dp_m[j];
      if (t == 0) {
        newacc[j] = local;
        ringb_[slot * kNC + j] = j;
        continue;
      }
      const double pj = dp_p[j];
      double best = 1e300;
      int bi = 0;
      for (int i = 0; i < kNC; ++i) {
        const double pi = ringp_[pslot * kNC + i];
        double c;
        if (pi > 0.0 && pj > 0.0)
          c = dpacc_[i] + c_vv * std::fabs(pi - pj);
        else if (pi > 0.0 || pj > 0.0)
          c = dpacc_[i] + c_vu;
        else
          c = dpacc_[i] + c_uu;
        if (c <= best) {
          best = c;
          bi = i;
        }
      }
      newacc[j] = best + local;
      ringb_[slot * kNC + j] = bi;
    }
    int jbest = 0;
    for (int j = 0; j < kNC; ++j)
      if (newacc[j] <= newacc[jbest]) jbest = j;
    const double base = newacc[jbest];
    for (int j = 0; j < kNC; ++j) {
      dpacc_[j] = newacc[j] - base;
      ringp_[slot * kNC + j] = dp_p[j];
    }
    prev_e_ = en;
    t_ = t + 1;
    if (t < lag_) return -1.0;
    int s = jbest;
    for (int d = 0; d < lag_; ++d) s = ringb_[((t - d) % ring) * kNC + s];
    return ringp_[((t - lag_) % ring) * kNC + s];
  }

  std::vector<std::int64_t> ip_;
  std::vector<double> fp_, sos_, hann_, kais_;
  int nfft_, h8_, b8_, sw4_, nbq_, lag_, shc_len_;
  std::vector<double> twc_, tws_;
  std::vector<float> twr_, twi_, hannf_, kaisf_;
  std::vector<int> brev_;
  std::vector<double> zst_, hb_, dec_;
  std::vector<float> buf_[2], re_, im_, ren_, imn_;
  std::vector<double> mag_a_, pow_a_, mag_b_, shc_, cs_, phi_;
  std::vector<double> ringp_;
  std::vector<int> ringb_;
  double spv_p_[kSpecCands], spv_a_[kSpecCands], dpacc_[kNC];
  int fill_;
  std::int64_t t_;
  bool spec_prev_;
  double spec_avg_, h0_, h1_, h2_, held_, meanp_, nspec_, np_, meane_, ne_, prev_e_;
};

}  // namespace rtanon
