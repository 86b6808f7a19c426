/* Eight-lane expf for the float readout (sv_core/_readout_body.h), returning the platform's expf bit for
 * bit where it is used - and it is used only where that has been checked (sv_expf_ok, set by
 * sv_expf_selfcheck at import, see _batchfast.c).
 *
 * What it reproduces: the expf of glibc (2.28 and later; the routine of ARM's optimized-routines) as
 * dispatched on x86-64 CPUs with FMA (__expf_fma, the same C built with FMA contraction). Its
 * algorithm, evaluated in double precision: for x = float, with N = 32,
 *   z = x * (N / ln 2), k = nearest integer of z (by adding and removing 0x1.8p52), r = z - k,
 *   exp(x) = 2^(k / N) * 2^(r / N) ~= s * (C0 r^3 + C1 r^2 + C2 r + 1),
 *   s = 2^((k mod N) / N) (a 32-entry table) with k div N added to its exponent field,
 * rounded once to float at the end. Facts of that build (its disassembly): k + shift and r are
 * single fused multiply-adds of x (kd = fma(x, N/ln2, shift), r = fma(x, N/ln2, -(kd - shift))),
 * so are C0 r + C1, C2 r + 1 and (C0 r + C1) r^2 + (C2 r + 1); r^2 and the final product by s are
 * plain multiplies. Inputs with |x| >= 88 (biased exponent of the float's top 12 bits >= 0x42b), NaN
 * and the infinities take glibc's special path there, so any vector holding one is computed here
 * lane by lane by expf itself.
 *
 * Proof of equality: tests/expf_exhaustive.c compares these lanes with the platform's expf on all
 * 2^32 float bit patterns (it passed on the build machine, glibc 2.36 with __expf_fma). On another
 * platform the import-time self-check (sv_expf_selfcheck) leaves expf in use: it requires glibc 2.36 (the
 * version proven; another needs the exhaustive test first), a CPU with AVX2 and FMA (else glibc runs
 * its non-FMA build, whose results differ on a few inputs), and agreement on ~24k inputs (bit patterns
 * spread over the whole range, a dense sweep of [-30, 0], magnitudes near the special-path bound, and
 * two inputs where an unfused r changes the result). Either way the readout's bits are those of the
 * platform's expf. */
#ifndef SV_EXPF_BODY_H
#define SV_EXPF_BODY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SV_HAVE_VEXPF 1
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

/* 2^(i/32), i = 0..31, rounded to nearest double (computed with 200-bit arithmetic) */
static const double sv_exp2_tab32[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};

/* four lanes of the double-precision core: x (floats widened exactly) -> s * poly(r) */
__attribute__((target("avx2,fma"))) static inline __m256d sv_expf_core4(__m256d xd)
{
    const __m256d invln2n = _mm256_set1_pd(0x1.71547652b82fep+5); /* 32 / ln 2 */
    const __m256d shift = _mm256_set1_pd(0x1.8p52);
    const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-20); /* (ln 2)^3 / 6 / 32^3, fitted */
    const __m256d c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-13); /* (ln 2)^2 / 2 / 32^2, fitted */
    const __m256d c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-6);  /* ln 2 / 32, fitted */
    __m256d kd = _mm256_fmadd_pd(invln2n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
    /* s = 2^(i/32) with (k - i) / 32 added to its exponent, i = k mod 32: bits + ((ki & ~31) << 47) */
    const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    const __m256i tb = _mm256_i64gather_epi64((const long long *)(const void *)sv_exp2_tab32, idx, 8);
    const __m256i hi = _mm256_slli_epi64(_mm256_andnot_si256(_mm256_set1_epi64x(31), ki), 47);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(tb, hi));
    const __m256d z = _mm256_fmadd_pd(c0, r, c1);
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_mul_pd(y, s);
}

/* expf of the eight lanes of x (any values: a vector with a special lane goes through expf) */
__attribute__((target("avx2,fma"))) static inline __m256 sv_expf8(__m256 x)
{
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    const __m256i sp = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a));
    if (__builtin_expect(!_mm256_testz_si256(sp, sp), 0)) {
        float b[8];
        _mm256_storeu_ps(b, x);
        for (int l = 0; l < 8; l++) b[l] = expf(b[l]);
        return _mm256_loadu_ps(b);
    }
    const __m256d lo = sv_expf_core4(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    const __m256d hi = sv_expf_core4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

/* x[j] = expf(x[j] - m) for j < n (the subtraction in float, as the scalar loop) */
__attribute__((target("avx2,fma"))) static void sv_expf_shifted(float *x, float m, ptrdiff_t n)
{
    const __m256 mv = _mm256_set1_ps(m);
    ptrdiff_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, sv_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    if (j < n) {
        float b[8] = {0};
        memcpy(b, x + j, (size_t)(n - j) * sizeof(float));
        _mm256_storeu_ps(b, sv_expf8(_mm256_sub_ps(_mm256_loadu_ps(b), mv)));
        memcpy(x + j, b, (size_t)(n - j) * sizeof(float));
    }
}
#endif

/* 1 once the self-check has passed: the readout's float exponentials then go through sv_expf_shifted */
static int sv_expf_ok = 0;

/* compares sv_expf_shifted with expf(x - m) on a spread of inputs; 1 when every bit agrees (and the
 * CPU has AVX2 and FMA), else 0 */
static int sv_expf_selfcheck(void)
{
#if defined(SV_HAVE_VEXPF) && defined(__GLIBC__)
    /* proven exhaustively on glibc 2.36 only (Debian 12): run tests/expf_exhaustive.c before adding one */
    if (strcmp(gnu_get_libc_version(), "2.36") != 0) return 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    /* two inputs where a non-fused r = z - k (instead of glibc's fused one) changes the float result */
    const uint32_t sensitive[2] = {0x4202422fu, 0xc27c65d9u};
    for (int i = 0; i < 2; i++) {
        float x, o[8] = {0};
        memcpy(&x, &sensitive[i], sizeof x);
        o[0] = x;
        sv_expf_shifted(o, 0.0f, 1);
        const float e = expf(x - 0.0f);
        if (memcmp(&e, &o[0], sizeof e) != 0) return 0;
    }
    enum { NB = 4096 };
    float in[NB], out[NB];
    const float ms[2] = {0.0f, 1.5f};
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < NB; i++) {
            if (pass == 0) { /* bit patterns spread over the whole float range, NaN and inf included */
                const uint32_t u = (uint32_t)i * 1048573u + 12345u;
                memcpy(&in[i], &u, sizeof u);
            } else if (pass == 1) { /* dense in the readout's range (scores minus their maximum) */
                in[i] = -30.0f * (float)i / (float)NB;
            } else { /* around the special-path bounds and tiny magnitudes */
                in[i] = (i & 1 ? -1.0f : 1.0f) * ldexpf((float)(i % 97) / 97.0f + 1.0f, (i % 17) - 10)
                        + (i % 3 == 0 ? -88.0f : 0.0f);
            }
        }
        for (int mi = 0; mi < 2; mi++) {
            memcpy(out, in, sizeof in);
            sv_expf_shifted(out, ms[mi], NB - 3); /* a tail too */
            for (int i = 0; i < NB - 3; i++) {
                const float e = expf(in[i] - ms[mi]);
                if (memcmp(&e, &out[i], sizeof e) != 0) return 0;
            }
        }
    }
    return 1;
#else
    return 0;
#endif
}

#endif
