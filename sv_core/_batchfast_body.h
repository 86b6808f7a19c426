/* Body of sv_core/_batchfast.c for one floating type: included once with T = float and
 * NAME(x) = x##_f32, once with T = double and NAME(x) = x##_f64 (EPS: the type's epsilon).
 *
 * Sums and dot products use 8 independent partial accumulators in a fixed order (vectorisable
 * without reassociating anything the compiler does not see; the same result on every machine);
 * the Gram products are element-wise multiply-adds. See _batchfast.c for the algorithms. */

#ifndef BATCHFAST_FISTA_ONCE
#define BATCHFAST_FISTA_ONCE
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <emmintrin.h>
#define BATCHFAST_SSE2 1
#else
#define BATCHFAST_SSE2 0
#endif
#endif

/* sum of x[0:n] */
static ALWAYS_INLINE T NAME(sum8)(const T *restrict x, Py_ssize_t n)
{
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* dot product of a[0:n] and b[0:n] */
static ALWAYS_INLINE T NAME(dot8)(const T *restrict a, const T *restrict b, Py_ssize_t n)
{
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* One FISTA problem works on m <= n keys; every loop below keeps the element order and the
 * roundings of the plain loops it replaces (the torch reference's order: see _batchfast.c), so the
 * fused and blocked forms give the same bits:
 *   - min / max in 8 lanes (lane i mod 8 for the first floor(m / 8) * 8 entries, lane 0 for the
 *     rest, lanes combined in order 1..7): exact operations, the lanes only fix which of two
 *     equal-comparing values comes out;
 *   - sums in the 8 fixed accumulators of sum8;
 *   - K a' accumulated per entry over the non-zero a'_j in ascending j, from 0. */

/* lane-wise select of GCC's vector extension (C has no vector ?:): mask lanes all ones -> x, else y */
#define VSEL(mask, x, y) ((VT)(((VIT)(x) & (mask)) | ((VIT)(y) & ~(mask))))
#define NVL (8 / VL) /* vectors per 8 lanes */

/* the end of NAME(minmax): entries z[i0:m] into lane 0, then the lanes combined in order 1..7 */
static ALWAYS_INLINE void NAME(minmax_tail)(const T *restrict z, Py_ssize_t i0, Py_ssize_t m, T *restrict mx,
                                           T *restrict mn, T *zmin, T *zmax)
{
    for (Py_ssize_t i = i0; i < m; i++) {
        mx[0] = z[i] > mx[0] ? z[i] : mx[0];
        mn[0] = z[i] < mn[0] ? z[i] : mn[0];
    }
    T hi = mx[0], lo = mn[0];
    for (int l = 1; l < 8; l++) {
        hi = mx[l] > hi ? mx[l] : hi;
        lo = mn[l] < lo ? mn[l] : lo;
    }
    *zmin = lo;
    *zmax = hi;
}

/* minimum and maximum of z[0:m], m >= 1: lane l (< 8) holds entries i = l mod 8 of the first
 * floor(m / 8) * 8, lane 0 the rest, lanes combined in order 1..7 (the 8 lanes held in 8 / VL
 * vectors; the comparisons and selects are those of the scalar loop, lane by lane) */
static ALWAYS_INLINE void NAME(minmax)(const T *restrict z, Py_ssize_t m, T *zmin, T *zmax)
{
    T mx[8], mn[8];
    Py_ssize_t i = 0;
    if (m >= 8) {
        VT vx[NVL], vn[NVL];
        for (int b = 0; b < NVL; b++)
            for (int l = 0; l < VL; l++) vx[b][l] = vn[b][l] = z[0];
        for (; i + 8 <= m; i += 8)
            for (int b = 0; b < NVL; b++) {
                VT c;
                memcpy(&c, z + i + b * VL, sizeof c);
                vx[b] = VSEL(c > vx[b], c, vx[b]);
                vn[b] = VSEL(c < vn[b], c, vn[b]);
            }
        memcpy(mx, vx, sizeof mx);
        memcpy(mn, vn, sizeof mn);
    } else {
        for (int l = 0; l < 8; l++) mx[l] = mn[l] = z[0];
    }
    NAME(minmax_tail)(z, i, m, mx, mn, zmin, zmax);
}

/* the steps of one projection pass (NAME(proj_pass)), also run inside NAME(momentum_step): one
 * VL-lane vector d = z - tau of a full block of 8 (a, its lane sums va and free counts vc) */
static ALWAYS_INLINE void NAME(pp_vec)(VT d, VT vC, T *restrict a, VT *va, VIT *vc)
{
    const VT vzero = (VT){0};
    const VIT neg = d < vzero, over = d > vC;
    const VT v = VSEL(neg, vzero, VSEL(over, vC, d));
    memcpy(a, &v, sizeof v);
    *va += v;
    *vc -= (d > vzero) & (d < vC); /* a true comparison is -1: +1 per free lane */
}

/* one entry past the full blocks, into lane acc */
static ALWAYS_INLINE void NAME(pp_one)(T zi, T tau, T C, T *restrict a, T *acc, Py_ssize_t *cnt)
{
    const T d = zi - tau;
    const T v = d < (T)0 ? (T)0 : (d > C ? C : d);
    *a = v;
    *acc += v;
    *cnt += (d > (T)0) & (d < C);
}

/* the lane sums of the full blocks into acc (8) and their free count */
static ALWAYS_INLINE Py_ssize_t NAME(pp_lanes)(const VT *va, const VIT *vc, T *acc)
{
    memcpy(acc, va, 8 * sizeof(T));
    Py_ssize_t cnt = 0;
    for (int b = 0; b < NVL; b++)
        for (int l = 0; l < VL; l++) cnt += (Py_ssize_t)vc[b][l];
    return cnt;
}

static ALWAYS_INLINE T NAME(pp_err)(const T *acc)
{
    return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) - (T)1;
}

/* splat of x, lane by lane (a sum with 0 would turn -0 into +0) */
static ALWAYS_INLINE void NAME(splat)(VT *v, T x)
{
    for (int l = 0; l < VL; l++) (*v)[l] = x;
}

/* one pass of the projection at shift tau: a = clip(z - tau, 0, C); returns sum(a) - 1 (sum8's
 * order: lane l accumulates the entries i = l mod 8 of the first floor(m / 8) * 8, then the rest go
 * to lanes 0, 1, ... in turn) and the number of free entries (0 < z - tau < C) in *nf; the 8 lanes
 * in 8 / VL vectors, lane by lane the operations of the scalar loop */
static ALWAYS_INLINE T NAME(proj_pass)(const T *restrict z, Py_ssize_t m, T C, T tau, T *restrict a, Py_ssize_t *nf)
{
    T acc[8];
    VIT vc[NVL];
    VT va[NVL];
    VT vtau, vC;
    NAME(splat)(&vtau, tau);
    NAME(splat)(&vC, C);
    for (int b = 0; b < NVL; b++) {
        va[b] = (VT){0};
        vc[b] = (VIT){0};
    }
    Py_ssize_t i = 0;
    for (; i + 8 <= m; i += 8)
        for (int b = 0; b < NVL; b++) {
            VT d;
            memcpy(&d, z + i + b * VL, sizeof d);
            NAME(pp_vec)(d - vtau, vC, a + i + b * VL, &va[b], &vc[b]);
        }
    Py_ssize_t cnt = NAME(pp_lanes)(va, vc, acc);
    for (int l = 0; i < m; i++, l++) NAME(pp_one)(z[i], tau, C, a + i, &acc[l], &cnt);
    *nf = cnt;
    return NAME(pp_err)(acc);
}

/* projection of z (m) onto {sum a = 1, 0 <= a <= C}: the reference's safeguarded Newton-bisection
 * on the shift tau (same bracket, start, steps and stopping tests); tau in/out (NAN: none); zmin, zmax:
 * NAME(minmax) of z (fista_run has them from the loop that wrote z, and often the first pass too) */
static ALWAYS_INLINE void NAME(project_mm)(const T *restrict z, Py_ssize_t m, T C, T zmin, T zmax, T *tau_io,
                                          T *restrict a, int pre, T pre_err, Py_ssize_t pre_nf)
{
    const T eps = (T)(16.0 * EPS);
    T lo = zmin - C, hi = zmax, tau = *tau_io;
    /* pre: the pass at the incoming tau is done (a written, its err and nf given): the first one when
     * tau is inside the bracket */
    if (!(tau > lo && tau < hi)) {
        tau = (T)0.5 * (lo + hi);
        pre = 0;
    }
    for (int it = 0; it < 60; it++) {
        Py_ssize_t nf = pre_nf;
        const T err = it == 0 && pre ? pre_err : NAME(proj_pass)(z, m, C, tau, a, &nf);
        const T scale = eps * ((T)1 + (tau < (T)0 ? -tau : tau));
        if ((err < (T)0 ? -err : err) <= eps || (hi - lo) <= scale) break;
        const T step = err / (T)(nf > 0 ? nf : 1);
        if (nf > 0 && (step < (T)0 ? -step : step) <= scale) break;
        if (err > (T)0) lo = tau; else hi = tau;
        T nxt = (T)0.5 * (lo + hi);
        const T tn = tau + step;
        if (nf > 0 && tn > lo && tn < hi) nxt = tn;
        tau = nxt;
    }
    *tau_io = tau;
}

static ALWAYS_INLINE void NAME(project)(const T *restrict z, Py_ssize_t m, T C, T *tau_io, T *restrict a)
{
    T zmin, zmax;
    NAME(minmax)(z, m, &zmin, &zmax);
    NAME(project_mm)(z, m, C, zmin, zmax, tau_io, a, 0, (T)0, 0);
}

/* BODY for every column j of kmul in ascending order: j < m (nzb NULL), else the set bits of nzb */
#define KMUL_COLUMNS(BODY)                                                                              \
    do {                                                                                                \
        if (!nzb) {                                                                                     \
            for (Py_ssize_t j = 0; j < m; j++) BODY                                                     \
        } else {                                                                                        \
            for (Py_ssize_t w = 0; w * 64 < m; w++)                                                     \
                for (uint64_t bm = nzb[w]; bm; bm &= bm - 1) {                                          \
                    const Py_ssize_t j = w * 64 + (Py_ssize_t)__builtin_ctzll(bm);                      \
                    BODY                                                                                \
                }                                                                                       \
        }                                                                                               \
    } while (0)

/* NB vectors of Ka starting at off[0..NB-1], accumulated in registers over the columns j of a */
#define KMUL_PASS(NB)                                                                                   \
    do {                                                                                                \
        VT s[NB];                                                                                       \
        for (int b = 0; b < NB; b++) s[b] = (VT){0};                                                    \
        KMUL_COLUMNS({                                                                                  \
            const T aj = a[j];                                                                          \
            const T *col = Kb + j * ld;                                                                 \
            for (int b = 0; b < NB; b++) {                                                              \
                VT c;                                                                                   \
                memcpy(&c, col + off[b], sizeof c);                                                     \
                s[b] += c * aj;                                                                         \
            }                                                                                           \
        });                                                                                             \
        for (int b = 0; b < NB; b++) memcpy(Ka + off[b], &s[b], sizeof s[b]);                           \
    } while (0)
/* the same for NB consecutive vectors from Ka + o0 (m a multiple of VL: fixed displacements) */
#define KMUL_PASS_C(NB)                                                                                 \
    do {                                                                                                \
        VT s[NB];                                                                                       \
        for (int b = 0; b < NB; b++) s[b] = (VT){0};                                                    \
        const T *K0 = Kb + o0;                                                                          \
        KMUL_COLUMNS({                                                                                  \
            const T aj = a[j];                                                                          \
            const T *col = K0 + j * ld;                                                                 \
            for (int b = 0; b < NB; b++) {                                                              \
                VT c;                                                                                   \
                memcpy(&c, col + b * VL, sizeof c);                                                     \
                s[b] += c * aj;                                                                         \
            }                                                                                           \
        });                                                                                             \
        for (int b = 0; b < NB; b++) memcpy(Ka + o0 + b * VL, &s[b], sizeof s[b]);                      \
    } while (0)

/* 2 VL-lane vectors in one (64 bytes: one AVX-512 register) */
typedef T NAME(vw) __attribute__((vector_size(2 * sizeof(VT))));
/* NW such double vectors of Ka from Ka + o0, and when NN one VL-lane vector after them */
#define KMUL_PASS_W(NW, NN)                                                                             \
    do {                                                                                                \
        NAME(vw) s[(NW) > 0 ? (NW) : 1];                                                                \
        VT r = (VT){0};                                                                                 \
        for (int b = 0; b < (NW); b++) s[b] = (NAME(vw)){0};                                            \
        const T *K0 = Kb + o0;                                                                          \
        KMUL_COLUMNS({                                                                                  \
            const T aj = a[j];                                                                          \
            const T *col = K0 + j * ld;                                                                 \
            for (int b = 0; b < (NW); b++) {                                                            \
                NAME(vw) c;                                                                             \
                memcpy(&c, col + b * 2 * VL, sizeof c);                                                 \
                s[b] += c * aj;                                                                         \
            }                                                                                           \
            if (NN) {                                                                                   \
                VT c;                                                                                   \
                memcpy(&c, col + (NW) * 2 * VL, sizeof c);                                              \
                r += c * aj;                                                                            \
            }                                                                                           \
        });                                                                                             \
        for (int b = 0; b < (NW); b++) memcpy(Ka + o0 + b * 2 * VL, &s[b], sizeof s[b]);                \
        if (NN) memcpy(Ka + o0 + (NW) * 2 * VL, &r, sizeof r);                                          \
    } while (0)

/* Ka = Kb a (Kb: m x m, symmetric, rows ld apart): Ka[i] accumulated from 0 over the columns j in
 * ascending order, in vectors held in registers, several at a time (when m is not a multiple of VL,
 * VL-lane vectors, up to 8 at a time, the last one the one ending at m, its first lanes recomputed to
 * the same values). nz == NULL: every column j < m is read; else only the nnz columns nz[0..nnz)
 * (ascending), which gives the same bits when every other a_j is +-0 and Kb is finite: a product
 * c * (+-0) is +-0, and adding +-0 leaves a sum that starts at +0 as it is (a sum of finite terms from
 * +0 is never -0) - the FISTA iterate is sparse (about a third of its entries are 0 on the demo).
 * isa (the instruction set of the running clone: 2 AVX-512, 1 AVX2, 0 other) only picks the vector
 * widths and how many are held at a time (m a multiple of VL): each entry's operations are the same. */
static ALWAYS_INLINE void NAME(kmul)(const T *restrict Kb, Py_ssize_t ld, const T *restrict a, Py_ssize_t m,
                                     T *restrict Ka, const uint64_t *restrict nzb, int isa)
{
    if (m < VL) {
        for (Py_ssize_t i = 0; i < m; i++) Ka[i] = (T)0;
        KMUL_COLUMNS({
            const T aj = a[j];
            for (Py_ssize_t i = 0; i < m; i++) Ka[i] += Kb[j * ld + i] * aj;
        });
        return;
    }
    const Py_ssize_t nv = (m + VL - 1) / VL;
    if (m % VL == 0 && isa == 2) { /* 2 VL-lane vectors in passes of up to 8, the odd one in the last */
        const Py_ssize_t nw = nv / 2, np = nw > 0 ? (nw + 7) / 8 : 1;
        Py_ssize_t w0 = 0;
        for (Py_ssize_t q = 0; q < np; q++) {
            const Py_ssize_t w1 = nw * (q + 1) / np;
            const Py_ssize_t o0 = w0 * 2 * VL;
            const int nn = q == np - 1 ? (int)(nv % 2) : 0;
            switch ((w1 - w0) * 2 + nn) {
            case 1: KMUL_PASS_W(0, 1); break;
            case 2: KMUL_PASS_W(1, 0); break;
            case 3: KMUL_PASS_W(1, 1); break;
            case 4: KMUL_PASS_W(2, 0); break;
            case 5: KMUL_PASS_W(2, 1); break;
            case 6: KMUL_PASS_W(3, 0); break;
            case 7: KMUL_PASS_W(3, 1); break;
            case 8: KMUL_PASS_W(4, 0); break;
            case 9: KMUL_PASS_W(4, 1); break;
            case 10: KMUL_PASS_W(5, 0); break;
            case 11: KMUL_PASS_W(5, 1); break;
            case 12: KMUL_PASS_W(6, 0); break;
            case 13: KMUL_PASS_W(6, 1); break;
            case 14: KMUL_PASS_W(7, 0); break;
            case 15: KMUL_PASS_W(7, 1); break;
            case 16: KMUL_PASS_W(8, 0); break;
            default: KMUL_PASS_W(8, 1); break;
            }
            w0 = w1;
        }
        return;
    }
    if (m % VL == 0) { /* the vectors in ceil(nv / max) passes of (nearly) equal size */
        const Py_ssize_t mx = isa ? 12 : 8, np = (nv + mx - 1) / mx;
        Py_ssize_t v0 = 0;
        for (Py_ssize_t q = 0; q < np; q++) {
            const Py_ssize_t v1 = nv * (q + 1) / np;
            const Py_ssize_t o0 = v0 * VL;
            switch (v1 - v0) {
            case 1: KMUL_PASS_C(1); break;
            case 2: KMUL_PASS_C(2); break;
            case 3: KMUL_PASS_C(3); break;
            case 4: KMUL_PASS_C(4); break;
            case 5: KMUL_PASS_C(5); break;
            case 6: KMUL_PASS_C(6); break;
            case 7: KMUL_PASS_C(7); break;
            case 8: KMUL_PASS_C(8); break;
            case 9: KMUL_PASS_C(9); break;
            case 10: KMUL_PASS_C(10); break;
            case 11: KMUL_PASS_C(11); break;
            default: KMUL_PASS_C(12); break;
            }
            v0 = v1;
        }
        return;
    }
    for (Py_ssize_t v0 = 0; v0 < nv; v0 += 8) {
        const int nb = nv - v0 < 8 ? (int)(nv - v0) : 8;
        Py_ssize_t off[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int b = 0; b < nb; b++) off[b] = (v0 + b) * VL < m - VL ? (v0 + b) * VL : m - VL;
        switch (nb) {
        case 1: KMUL_PASS(1); break;
        case 2: KMUL_PASS(2); break;
        case 3: KMUL_PASS(3); break;
        case 4: KMUL_PASS(4); break;
        case 5: KMUL_PASS(5); break;
        case 6: KMUL_PASS(6); break;
        case 7: KMUL_PASS(7); break;
        default: KMUL_PASS(8); break;
        }
    }
}
#undef KMUL_PASS
#undef KMUL_PASS_C
#undef KMUL_PASS_W
#undef KMUL_COLUMNS

/* problems [p0, p1) of the batch; work: n * n + 8 n + 1 entries of T, idx: 2 n + 1 */
/* whether every entry of K[p0:p1] (n x n each) is >= 0 (NaN: no) */
static int NAME(nonnegative)(const T *K, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t n)
{
    int ok = 1;
    for (Py_ssize_t i = p0 * n * n; i < p1 * n * n; i++) ok &= K[i] >= (T)0;
    return ok;
}

/* FISTA's Lipschitz constant L = 2 lambda for the block Kb (m keys, entry-wise non-negative): the
 * reference's bound (sv_core.batched.fista.lambda_max_upper, one power step): v = 1, w = Kb v,
 * v = w / max(|w|, 1e-30), lambda = max over v_i > 1e-12 of (Kb v)_i / v_i (0 when none), at least
 * 1e-12 (the Collatz-Wielandt ratio: an upper bound of the largest eigenvalue); v, w: scratch */
static ALWAYS_INLINE T NAME(lipschitz)(const T *restrict Kb, Py_ssize_t ld, Py_ssize_t m, T *restrict v,
                                       T *restrict w, int isa)
{
    for (Py_ssize_t i = 0; i < m; i++) v[i] = (T)1;
    NAME(kmul)(Kb, ld, v, m, w, NULL, isa);
    T nrm = (T)sqrt((double)NAME(dot8)(w, w, m));
    if (!(nrm > (T)1e-30)) nrm = (T)1e-30;
    for (Py_ssize_t i = 0; i < m; i++) v[i] = w[i] / nrm;
    NAME(kmul)(Kb, ld, v, m, w, NULL, isa);
    T lam = (T)0;
    for (Py_ssize_t i = 0; i < m; i++)
        if (v[i] > (T)1e-12) {
            const T r = w[i] / v[i];
            lam = r > lam ? r : lam;
        }
    return (T)2 * (lam > (T)1e-12 ? lam : (T)1e-12);
}

/* the momentum beta_k = (t_k - 1) / t_{k+1} of iteration k (t_0 = 1, t_{k+1} = (1 + sqrt(1 + 4 t_k^2)) / 2
 * in double): the same for every problem, so fista_run computes the schedule once per call */
static T NAME(momentum)(long k)
{
    double t = 1.0, tn = 1.0;
    for (long i = 0; i <= k; i++) {
        tn = 0.5 * (1.0 + sqrt(1.0 + 4.0 * t * t));
        if (i < k) t = tn;
    }
    return (T)((t - 1.0) / tn);
}

/* whether an[0:m] and a[0:m] are equal bit for bit (memcmp), and with nzb given the entries with
 * an[i] != 0 (NaN too) as bits: bit i % 64 of nzb[i / 64] (nzb: ceil(m / 64) words); on x86-64 four
 * entries at a time (SSE2: compare, movemask) */
static ALWAYS_INLINE int NAME(scan)(const T *restrict an, const T *restrict a, Py_ssize_t m, uint64_t *restrict nzb)
{
    Py_ssize_t i = 0;
    int eq = 1;
    uint64_t wv = 0; /* the bits of the word of entry i */
#if BATCHFAST_SSE2
    __m128i eqv = _mm_set1_epi32(-1);
    for (; i + 4 <= m; i += 4) {
        int mk;
        if (sizeof(T) == 4) {
            const __m128 v = _mm_loadu_ps((const float *)an + i);
            eqv = _mm_and_si128(eqv, _mm_cmpeq_epi32(_mm_castps_si128(v),
                                                     _mm_loadu_si128((const __m128i *)(const void *)(a + i))));
            mk = _mm_movemask_ps(_mm_cmpneq_ps(v, _mm_setzero_ps()));
        } else {
            const __m128d v0 = _mm_loadu_pd((const double *)an + i), v1 = _mm_loadu_pd((const double *)an + i + 2);
            eqv = _mm_and_si128(eqv, _mm_cmpeq_epi32(_mm_castpd_si128(v0),
                                                     _mm_loadu_si128((const __m128i *)(const void *)(a + i))));
            eqv = _mm_and_si128(eqv, _mm_cmpeq_epi32(_mm_castpd_si128(v1),
                                                     _mm_loadu_si128((const __m128i *)(const void *)(a + i + 2))));
            mk = _mm_movemask_pd(_mm_cmpneq_pd(v0, _mm_setzero_pd()))
                 | (_mm_movemask_pd(_mm_cmpneq_pd(v1, _mm_setzero_pd())) << 2);
        }
        if (nzb) {
            wv |= (uint64_t)mk << (i & 63);
            if ((i & 63) == 60) { /* a group of 4 never straddles two words */
                nzb[i >> 6] = wv;
                wv = 0;
            }
        }
    }
    eq = _mm_movemask_epi8(eqv) == 0xFFFF;
#endif
    if (eq) eq = memcmp(an + i, a + i, (size_t)(m - i) * sizeof(T)) == 0;
    if (nzb) {
        for (; i < m; i++) {
            wv |= (uint64_t)(an[i] != (T)0) << (i & 63);
            if ((i & 63) == 63) {
                nzb[i >> 6] = wv;
                wv = 0;
            }
        }
        if (m & 63) nzb[m >> 6] = wv;
    }
    return eq;
}

/* the momentum step, fused: y = a' + beta (a' - a), K y = K a' + beta (K a' - K a) and the next
 * step's z = y - (2 K y - diag K) il (y and K y are not kept), entry by entry; NAME(minmax) of the
 * new z in *zmin, *zmax (the same lanes, entries and order, from the vectors just written); with
 * spec, also the first pass of the next projection at the shift tau (NAME(proj_pass), the same
 * operations), its result written over a (each entry after it is read) and err, nf returned: the
 * next NAME(project_mm) starts there when tau is inside its bracket, else it redoes a */
static ALWAYS_INLINE void NAME(momentum_step_)(const T *restrict an, T *restrict a, const T *restrict Kan,
                                               const T *restrict Ka, const T *restrict dg, Py_ssize_t m, T beta,
                                               T il, T *restrict z, T *zmin, T *zmax, const int spec, T tau, T C,
                                               T *err, Py_ssize_t *nf)
{
    T mx[8] = {0}, mn[8] = {0}, acc[8] = {0}; /* (set below) */
    Py_ssize_t i = 0, cnt = 0;
    if (m >= 8) {
        VT vb, vil, two, vtau, vC;
        NAME(splat)(&vb, beta);
        NAME(splat)(&vil, il);
        NAME(splat)(&two, (T)2);
        NAME(splat)(&vtau, tau);
        NAME(splat)(&vC, C);
        VT vx[NVL], vn[NVL], va[NVL];
        VIT vc[NVL];
        for (int b = 0; b < NVL; b++) {
            vx[b] = vn[b] = va[b] = (VT){0};
            vc[b] = (VIT){0};
        }
        for (; i + 8 <= m; i += 8) {
            VT zb[NVL];
            for (int b = 0; b < NVL; b++) {
                VT x, xo, kx, kxo, d;
                memcpy(&x, an + i + b * VL, sizeof x);
                memcpy(&xo, a + i + b * VL, sizeof xo);
                memcpy(&kx, Kan + i + b * VL, sizeof kx);
                memcpy(&kxo, Ka + i + b * VL, sizeof kxo);
                memcpy(&d, dg + i + b * VL, sizeof d);
                const VT y = x + vb * (x - xo);
                const VT ky = kx + vb * (kx - kxo);
                zb[b] = y - ((two * ky) - d) * vil;
                memcpy(z + i + b * VL, &zb[b], sizeof zb[b]);
                if (spec) NAME(pp_vec)(zb[b] - vtau, vC, a + i + b * VL, &va[b], &vc[b]);
            }
            if (i == 0) /* the lanes start at z[0] */
                for (int b = 0; b < NVL; b++)
                    for (int l = 0; l < VL; l++) vx[b][l] = vn[b][l] = zb[0][0];
            for (int b = 0; b < NVL; b++) {
                vx[b] = VSEL(zb[b] > vx[b], zb[b], vx[b]);
                vn[b] = VSEL(zb[b] < vn[b], zb[b], vn[b]);
            }
        }
        memcpy(mx, vx, sizeof mx);
        memcpy(mn, vn, sizeof mn);
        if (spec) cnt = NAME(pp_lanes)(va, vc, acc);
    }
    const Py_ssize_t i0 = i;
    for (int l = 0; i < m; i++, l++) {
        const T yi = an[i] + beta * (an[i] - a[i]);
        const T kyi = Kan[i] + beta * (Kan[i] - Ka[i]);
        z[i] = yi - (((T)2 * kyi) - dg[i]) * il;
        if (spec) NAME(pp_one)(z[i], tau, C, a + i, &acc[l], &cnt);
    }
    if (m < 8)
        for (int l = 0; l < 8; l++) mx[l] = mn[l] = z[0];
    NAME(minmax_tail)(z, i0, m, mx, mn, zmin, zmax);
    if (spec) {
        *nf = cnt;
        *err = NAME(pp_err)(acc);
    }
}

static ALWAYS_INLINE void NAME(momentum_step)(const T *restrict an, T *restrict a, const T *restrict Kan,
                                              const T *restrict Ka, const T *restrict dg, Py_ssize_t m, T beta,
                                              T il, T *restrict z, T *zmin, T *zmax, int spec, T tau, T C, T *err,
                                              Py_ssize_t *nf)
{
    if (spec)
        NAME(momentum_step_)(an, a, Kan, Ka, dg, m, beta, il, z, zmin, zmax, 1, tau, C, err, nf);
    else
        NAME(momentum_step_)(an, a, Kan, Ka, dg, m, beta, il, z, zmin, zmax, 0, tau, C, err, nf);
}

/* the state of segmented runs (sv_core.batched.fista, early exit): per problem (p, j) the iterate a,
 * K a and the next step's z on its m keys (at (p J + j) n, compact), the shift tau, the fixed-point
 * count and whether the block is finite (i: 2 ints), and the projected-gradient residual written
 * after each segment; NULL: a one-shot run */
typedef struct {
    T *a, *Ka, *z, *tau, *res;
    int *i;
} NAME(fista_state);

/* max_i |P(a - (2 K a - diag K) / L) - a| over the m keys, the projection warm-started from tau (the
 * reference's residual check; NaN when any entry is NaN); z, step: scratch */
static ALWAYS_INLINE T NAME(fista_residual)(const T *restrict a, const T *restrict Ka, const T *restrict dg,
                                           Py_ssize_t m, T il, T C, T tau, T *restrict z, T *restrict step)
{
    for (Py_ssize_t i = 0; i < m; i++) z[i] = a[i] - (((T)2 * Ka[i]) - dg[i]) * il;
    NAME(project)(z, m, C, &tau, step);
    T r = (T)0;
    for (Py_ssize_t i = 0; i < m; i++) {
        const T d = step[i] - a[i];
        const T ad = d < (T)0 ? -d : d;
        if (ad != ad) return (T)NAN;
        r = ad > r ? ad : r;
    }
    return r;
}

/* problems of the Grams [p0, p1), iterations k0 <= k < k1. One-shot (st NULL, k0 = 0): from the
 * start, the estimate written to out. Segmented (st given): from the state (k0 = 0: the start),
 * the state and the residual written back, and the current estimate to out. With Lout, the step
 * 1/L comes from NAME(lipschitz) at k0 = 0 and L is written to Lout (P, J); a later segment reads L
 * back from Lout; else the steps are invL (P, J) */
MULTIVERSION_FISTA static void NAME(fista_run)(const T *K, const unsigned char *mask, const T *invL, T *Lout, T *out,
                                         Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t J, Py_ssize_t n, T C, long k0,
                                         long k1, int stop_when_fixed, int sparse, T *work, Py_ssize_t *idx,
                                         const NAME(fista_state) *st)
{
    uint64_t *nzb = (uint64_t *)(void *)(idx + n); /* the non-zero entries of the iterate, as bits */
    const int isa = FISTA_ISA; /* that of the clone running (see MULTIVERSION_FISTA) */
    /* the momentum schedule, the same double recurrence for every problem (NULL: per step) */
    T momb[128];
    T *mom = k1 <= 128 ? momb : (T *)malloc((size_t)k1 * sizeof(T));
    if (mom) {
        double t = 1.0;
        for (long k = 0; k < k1; k++) {
            const double tn = 0.5 * (1.0 + sqrt(1.0 + 4.0 * t * t));
            mom[k] = (T)((t - 1.0) / tn);
            t = tn;
        }
    }
    T *Ks = work, *a = Ks + n * n, *an = a + n, *Ka = an + n, *Kan = Ka + n, *z = Kan + n, *dg = z + n;
    for (Py_ssize_t p = p0; p < p1; p++) {
        const T *Kp = K + p * n * n;
        /* whether every entry of K[p] is finite (-1: not known yet): then so is every problem's block,
         * a set of its entries; else each block is checked */
        int gram_finite = -1;
        for (Py_ssize_t j = 0; j < J; j++) {
            const Py_ssize_t pj = p * J + j;
            const unsigned char *mk = mask + pj * n;
            T *o = out + pj * n;
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                o[i] = (T)0;
                if (mk[i]) idx[m++] = i;
            }
            if (m == 0) {
                if (Lout && k0 == 0) Lout[pj] = (T)2e-12;
                if (st) st->res[pj] = (T)0;
                continue;
            }
            /* a prefix mask reads its block in place; any other is copied once */
            const T *Kb = Kp;
            Py_ssize_t ld = n;
            if (idx[m - 1] != m - 1) {
                for (Py_ssize_t r = 0; r < m; r++) {
                    const T *row = Kp + idx[r] * n;
                    for (Py_ssize_t c = 0; c < m; c++) Ks[r * m + c] = row[idx[c]];
                }
                Kb = Ks;
                ld = m;
            }
            for (Py_ssize_t r = 0; r < m; r++) dg[r] = Kb[r * ld + r];
            T *sa = st ? st->a + pj * n : NULL, *sKa = st ? st->Ka + pj * n : NULL, *sz = st ? st->z + pj * n : NULL;
            int finite;
            T il, tau;
            int still; /* consecutive iterations that left a and tau bit-for-bit unchanged */
            if (k0 == 0) {
                finite = sparse; /* the sparse product K a' is exact for a finite block (see kmul) */
                if (finite && J > 1 && gram_finite < 0) { /* the J blocks of K[p]: one pass over it */
                    int f = 1;
                    for (Py_ssize_t e = 0; e < n * n; e++) f &= (Kp[e] - Kp[e]) == (T)0; /* inf, NaN: no */
                    gram_finite = f;
                }
                if (finite && gram_finite != 1)
                    for (Py_ssize_t r = 0; r < m; r++) {
                        const T *row = Kb + r * ld;
                        for (Py_ssize_t c = 0; c < m; c++) finite &= (row[c] - row[c]) == (T)0; /* inf, NaN: no */
                    }
                if (Lout) {
                    const T L = NAME(lipschitz)(Kb, ld, m, a, Ka, isa);
                    Lout[pj] = L;
                    il = (T)1 / L;
                } else {
                    il = invL[pj];
                }
                const T a0 = (T)1 / (T)m;
                for (Py_ssize_t i = 0; i < m; i++) a[i] = a0;
                NAME(kmul)(Kb, ld, a, m, Ka, NULL, isa);
                /* y = a, K y = K a at the start */
                for (Py_ssize_t i = 0; i < m; i++) z[i] = a[i] - (((T)2 * Ka[i]) - dg[i]) * il;
                tau = (T)NAN;
                still = 0;
            } else { /* a later segment: the state of the last one */
                finite = st->i[2 * pj + 1];
                il = Lout ? (T)1 / Lout[pj] : invL[pj];
                memcpy(a, sa, (size_t)m * sizeof(T));
                memcpy(Ka, sKa, (size_t)m * sizeof(T));
                memcpy(z, sz, (size_t)m * sizeof(T));
                tau = st->tau[pj];
                still = st->i[2 * pj];
            }
            T zmin = (T)0, zmax = (T)0, pre_err = (T)0;
            Py_ssize_t pre_nf = 0;
            int have_mm = 0; /* zmin, zmax are those of z (from the step that wrote it) */
            int have_pre = 0; /* an holds the projection pass at tau, with pre_err, pre_nf */
            for (long k = k0; k < k1 && !(stop_when_fixed && still >= 2); k++) {
                const T tau_before = tau;
                if (!have_mm) NAME(minmax)(z, m, &zmin, &zmax);
                NAME(project_mm)(z, m, C, zmin, zmax, &tau, an, have_pre, pre_err, pre_nf);
                const int same = NAME(scan)(an, a, m, finite ? nzb : NULL);
                /* a' = a and tau unchanged twice in a row: y = a, K y = K a and the next z, tau and
                 * a' are those of this iteration, so every later iteration repeats it exactly */
                still = (same && memcmp(&tau, &tau_before, sizeof(T)) == 0) ? still + 1 : 0;
                if (stop_when_fixed && still >= 2) break;
                NAME(kmul)(Kb, ld, an, m, Kan, finite ? nzb : NULL, isa);
                const T beta = mom ? mom[k] : NAME(momentum)(k);
                /* the next projection's first pass, written over a (the next an); not in the last
                 * iteration, or when tau is NaN (never inside a bracket) */
                const int spec = k + 1 < k1 && tau == tau;
                NAME(momentum_step)(an, a, Kan, Ka, dg, m, beta, il, z, &zmin, &zmax, spec, tau, C, &pre_err,
                                    &pre_nf);
                have_mm = 1;
                have_pre = spec;
                T *sw = a; a = an; an = sw;
                sw = Ka; Ka = Kan; Kan = sw;
            }
            for (Py_ssize_t r = 0; r < m; r++) o[idx[r]] = a[r];
            if (st) {
                memcpy(sa, a, (size_t)m * sizeof(T));
                memcpy(sKa, Ka, (size_t)m * sizeof(T));
                memcpy(sz, z, (size_t)m * sizeof(T));
                st->tau[pj] = tau;
                st->i[2 * pj] = still;
                st->i[2 * pj + 1] = finite;
                /* an, Kan: free scratch here */
                st->res[pj] = NAME(fista_residual)(a, Ka, dg, m, il, C, tau, an, Kan);
            }
        }
    }
    if (mom != momb) free(mom);
}

/* ---- ridged KKT solve ----------------------------------------------------------------------
 * Every element of the factor L (A = L L^T, m x m, lower triangle, row-major in Lst) is computed
 * by the operation sequence of the plain right-looking Cholesky:
 *     v = A_rc,  v = v - L_rk * L_ck  for k = 0, 1, ..., c - 1 (product rounded, then subtracted),
 *     L_rc = v / L_cc (r > c),  L_cc = sqrt(v) (in double, rounded to T; fails unless v > 0),
 * with L_rk, L_ck the stored (divided) values; only the loop order differs. The rows go in panels
 * of VL (one vector lane per row; panel b holds rows [b VL, b VL + VL) column by column, columns
 * [0, b VL + VL), in the scratch W) and the columns in blocks of VL: for each column block b, the
 * panel b's own triangle first (its diagonals in ascending order, so a factorisation fails at the
 * same diagonal as the plain loop), then block b of every later panel, each accumulated in
 * registers over k in ascending order (the later panels' blocks are independent of one another, so
 * their division chains overlap). The forward substitution of both right-hand sides runs panel by
 * panel as soon as a panel is done, in chol_solve's order (dot8's 8 accumulators: k mod 8). */

/* panel of rows [r0, r0 + VL) (lane l: row r0 + l; rows past m are zero), columns [0, r0 + VL):
 * A_rc = 2 K_{idx r, idx c} (+ ridge on the diagonal), c <= r; zero above the diagonal */
static ALWAYS_INLINE void NAME(chol_fill)(T *restrict Wp, const T *restrict Kp, Py_ssize_t n,
                                          const Py_ssize_t *restrict idx, Py_ssize_t m, Py_ssize_t r0, T ridge)
{
    const T *rows[VL];
    for (int l = 0; l < VL; l++) rows[l] = Kp + idx[r0 + l < m ? r0 + l : 0] * n;
    if (r0 + VL <= m) {
        for (Py_ssize_t c = 0; c < r0; c++) {
            const Py_ssize_t ic = idx[c];
            VT v;
#pragma GCC unroll 8
            for (int l = 0; l < VL; l++) v[l] = rows[l][ic];
            v = (T)2 * v;
            memcpy(Wp + c * VL, &v, sizeof v);
        }
    } else {
        for (Py_ssize_t c = 0; c < r0; c++) {
            const Py_ssize_t ic = idx[c];
            for (int l = 0; l < VL; l++) Wp[c * VL + l] = r0 + l < m ? (T)2 * rows[l][ic] : (T)0;
        }
    }
    for (int l = 0; l < VL; l++) {
        const Py_ssize_t r = r0 + l;
        for (Py_ssize_t c = r0; c < r0 + VL; c++)
            Wp[c * VL + l] = r < m && c <= r ? (T)2 * rows[l][idx[c]] : (T)0;
        if (r < m) Wp[r * VL + l] += ridge;
    }
}

/* block [c0, c0 + VL) of panel Wp, given panel Wb of rows [c0, c0 + VL): the terms k in [k0, k1)
 * (an element's partial value kept in Wp between calls), then, when tri (Wb done through its
 * triangle, k1 = c0), the block's own triangle: the division by L_cc and the terms k in [c0, c) */
static ALWAYS_INLINE void NAME(chol_offblk)(T *restrict Wp, const T *restrict Wb, Py_ssize_t c0, Py_ssize_t k0,
                                            Py_ssize_t k1, const int tri)
{
    VT acc[VL];
    for (int j = 0; j < VL; j++) memcpy(&acc[j], Wp + (c0 + j) * VL, sizeof(VT));
    for (Py_ssize_t k = k0; k < k1; k++) {
        VT p;
        memcpy(&p, Wp + k * VL, sizeof p);
        const T *lk = Wb + k * VL; /* lane j: L_{c0 + j, k} */
#pragma GCC unroll 8
        for (int j = 0; j < VL; j++) acc[j] = acc[j] - p * lk[j];
    }
    if (!tri) {
        for (int j = 0; j < VL; j++) memcpy(Wp + (c0 + j) * VL, &acc[j], sizeof(VT));
        return;
    }
#pragma GCC unroll 8
    for (int kk = 0; kk < VL; kk++) {
        const T *lc = Wb + (c0 + kk) * VL; /* lane j: L_{c0 + j, c0 + kk} (j = kk: the diagonal) */
        acc[kk] = acc[kk] / lc[kk];
        memcpy(Wp + (c0 + kk) * VL, &acc[kk], sizeof(VT));
#pragma GCC unroll 8
        for (int j = kk + 1; j < VL; j++) acc[j] = acc[j] - acc[kk] * lc[j];
    }
}

/* panel Wb's own block [c0, c0 + VL): the terms k in [k0, k1), then, when tri (k1 = c0), its
 * triangle, columns [c0, c0 + nr) (nr <= VL rows; lanes of rows past m are left over); returns 1
 * when a diagonal is not positive */
static ALWAYS_INLINE int NAME(chol_diagblk)(T *restrict Wb, Py_ssize_t c0, Py_ssize_t k0, Py_ssize_t k1, int nr,
                                            const int tri)
{
    VT acc[VL];
    for (int j = 0; j < VL; j++) memcpy(&acc[j], Wb + (c0 + j) * VL, sizeof(VT));
    for (Py_ssize_t k = k0; k < k1; k++) {
        VT p;
        memcpy(&p, Wb + k * VL, sizeof p);
        const T *lk = Wb + k * VL; /* lane j: L_{c0 + j, k} */
#pragma GCC unroll 8
        for (int j = 0; j < VL; j++) acc[j] = acc[j] - p * lk[j];
    }
    if (tri) {
#pragma GCC unroll 8
        for (int kk = 0; kk < VL; kk++) {
            if (kk >= nr) break;
            const T v = acc[kk][kk];
            if (!(v > (T)0)) return 1;
            const T dk = (T)sqrt((double)v);
            acc[kk] = acc[kk] / dk;
            acc[kk][kk] = dk;
#pragma GCC unroll 8
            for (int j = kk + 1; j < VL; j++) acc[j] = acc[j] - acc[kk] * acc[kk][j];
        }
    }
    for (int j = 0; j < VL; j++) memcpy(Wb + (c0 + j) * VL, &acc[j], sizeof(VT));
    return 0;
}

/* forward substitution of the rows [c0, c0 + nr) of panel Wb (f: right-hand side in, L^-1 b out,
 * rows < c0 already done): row i gets (f_i - dot8(L_i, f, i)) / L_ii, dot8's accumulator a holding
 * the products L_ik f_k of k = a mod 8 in ascending k, from +0, summed in dot8's tree; a lane per
 * row */
static ALWAYS_INLINE void NAME(chol_fwdsub)(const T *restrict Wb, Py_ssize_t c0, int nr, T *restrict f)
{
    VT A[8];
    for (int a = 0; a < 8; a++) A[a] = (VT){0};
    Py_ssize_t k = 0;
    for (; k + 8 <= c0; k += 8)
#pragma GCC unroll 8
        for (int a = 0; a < 8; a++) {
            VT p;
            memcpy(&p, Wb + (k + a) * VL, sizeof p);
            A[a] += p * f[k + a];
        }
    for (int a = 0; k < c0; k++, a++) {
        VT p;
        memcpy(&p, Wb + k * VL, sizeof p);
        A[a] += p * f[k];
    }
    /* row i = c0 + kk goes to accumulator i mod 8 = (a0 + kk) mod 8 (a0 = c0 mod 8: 0, or 4 when VL = 4) */
#define FWDSUB_TRI(a0)                                                                                  \
    do {                                                                                                \
        _Pragma("GCC unroll 8") for (int kk = 0; kk < VL; kk++)                                         \
        {                                                                                               \
            if (kk >= nr) break;                                                                        \
            const Py_ssize_t i = c0 + kk;                                                               \
            const VT s = ((A[0] + A[4]) + (A[1] + A[5])) + ((A[2] + A[6]) + (A[3] + A[7]));            \
            VT p;                                                                                       \
            memcpy(&p, Wb + i * VL, sizeof p); /* lane kk: the diagonal */                              \
            const T fi = (f[i] - s[kk]) / p[kk];                                                        \
            f[i] = fi;                                                                                  \
            A[((a0) + kk) & 7] += p * fi;                                                               \
        }                                                                                               \
    } while (0)
    if ((c0 & 7) == 0)
        FWDSUB_TRI(0);
    else
        FWDSUB_TRI(4);
#undef FWDSUB_TRI
}

/* panel Wb (rows [c0, c0 + nr)) into the row-major lower triangle L: the blocks left of the
 * diagonal as VL x VL transposes in registers (lane moves only), the diagonal block element-wise */
static ALWAYS_INLINE void NAME(chol_store_rows)(const T *restrict Wb, Py_ssize_t c0, int nr, T *restrict L,
                                                Py_ssize_t m)
{
    for (Py_ssize_t k0 = 0; k0 < c0; k0 += VL) {
        VT r[VL], o[VL];
        for (int j = 0; j < VL; j++) memcpy(&r[j], Wb + (k0 + j) * VL, sizeof(VT));
#if VL == 8
        const VT t0 = KKT_SHUF(r[0], r[1], 0, 8, 1, 9, 4, 12, 5, 13), t1 = KKT_SHUF(r[0], r[1], 2, 10, 3, 11, 6, 14, 7, 15);
        const VT t2 = KKT_SHUF(r[2], r[3], 0, 8, 1, 9, 4, 12, 5, 13), t3 = KKT_SHUF(r[2], r[3], 2, 10, 3, 11, 6, 14, 7, 15);
        const VT t4 = KKT_SHUF(r[4], r[5], 0, 8, 1, 9, 4, 12, 5, 13), t5 = KKT_SHUF(r[4], r[5], 2, 10, 3, 11, 6, 14, 7, 15);
        const VT t6 = KKT_SHUF(r[6], r[7], 0, 8, 1, 9, 4, 12, 5, 13), t7 = KKT_SHUF(r[6], r[7], 2, 10, 3, 11, 6, 14, 7, 15);
        const VT u0 = KKT_SHUF(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = KKT_SHUF(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
        const VT u2 = KKT_SHUF(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = KKT_SHUF(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
        const VT u4 = KKT_SHUF(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = KKT_SHUF(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
        const VT u6 = KKT_SHUF(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = KKT_SHUF(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
        o[0] = KKT_SHUF(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);
        o[4] = KKT_SHUF(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);
        o[1] = KKT_SHUF(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);
        o[5] = KKT_SHUF(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);
        o[2] = KKT_SHUF(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);
        o[6] = KKT_SHUF(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);
        o[3] = KKT_SHUF(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);
        o[7] = KKT_SHUF(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);
#else
        const VT t0 = KKT_SHUF(r[0], r[1], 0, 4, 2, 6), t1 = KKT_SHUF(r[0], r[1], 1, 5, 3, 7);
        const VT t2 = KKT_SHUF(r[2], r[3], 0, 4, 2, 6), t3 = KKT_SHUF(r[2], r[3], 1, 5, 3, 7);
        o[0] = KKT_SHUF(t0, t2, 0, 1, 4, 5);
        o[2] = KKT_SHUF(t0, t2, 2, 3, 6, 7);
        o[1] = KKT_SHUF(t1, t3, 0, 1, 4, 5);
        o[3] = KKT_SHUF(t1, t3, 2, 3, 6, 7);
#endif
        for (int l = 0; l < nr; l++) memcpy(L + (c0 + l) * m + k0, &o[l], sizeof(VT));
    }
    for (int l = 0; l < nr; l++) {
        T *Lr = L + (c0 + l) * m;
        for (Py_ssize_t c = c0; c <= c0 + l; c++) Lr[c] = Wb[c * VL + l];
    }
}

/* L (m x m, row-major lower triangle) of A = 2 K_SS + ridge I (S: idx[0..m)), with the forward
 * substitution of f1 and f2; W: VL^2 np (np + 1) / 2 entries (np = ceil(m / VL)); returns 1 when
 * the factorisation fails */
static ALWAYS_INLINE int NAME(chol_factor)(const T *restrict Kp, Py_ssize_t n, const Py_ssize_t *restrict idx,
                                           Py_ssize_t m, T ridge, T *restrict L, T *restrict W, T *restrict f1,
                                           T *restrict f2)
{
    const Py_ssize_t np = (m + VL - 1) / VL;
#define PANEL(P) (W + VL * VL * ((P) * ((P) + 1) / 2))
#define NROWS(b) (m - (b) * VL < VL ? (int)(m - (b) * VL) : VL)
    NAME(chol_fill)(PANEL(0), Kp, n, idx, m, 0, ridge);
    if (np > 1) NAME(chol_fill)(PANEL(1), Kp, n, idx, m, VL, ridge);
    if (NAME(chol_diagblk)(PANEL(0), 0, 0, 0, NROWS(0), 1)) return 1;
    for (Py_ssize_t b = 0; b < np; b++) {
        /* the chain to the next panel's triangle (its terms that do not wait for this panel's
         * triangle first), then the work that does not wait for it */
        const Py_ssize_t c0 = b * VL;
        T *Wb = PANEL(b);
        if (b + 1 < np) {
            T *Wn = PANEL(b + 1);
            NAME(chol_offblk)(Wn, Wb, c0, 0, c0, 0);
            NAME(chol_diagblk)(Wn, c0 + VL, 0, c0, VL, 0);
            NAME(chol_offblk)(Wn, Wb, c0, c0, c0, 1);
            if (NAME(chol_diagblk)(Wn, c0 + VL, c0, c0 + VL, NROWS(b + 1), 1)) return 1;
        }
        const int nr = NROWS(b);
        NAME(chol_store_rows)(Wb, c0, nr, L, m);
        NAME(chol_fwdsub)(Wb, c0, nr, f1);
        NAME(chol_fwdsub)(Wb, c0, nr, f2);
        for (Py_ssize_t P = b + 2; P < np; P++) {
            if (b == 0) NAME(chol_fill)(PANEL(P), Kp, n, idx, m, P * VL, ridge);
            NAME(chol_offblk)(PANEL(P), Wb, c0, 0, c0, 1);
        }
    }
#undef PANEL
#undef NROWS
    return 0;
}

/* back substitution of chol_solve for two right-hand sides at once (L^-T x, each x in place) */
static ALWAYS_INLINE void NAME(chol_back2)(const T *restrict L, Py_ssize_t m, T *restrict x, T *restrict y)
{
    for (Py_ssize_t i = m - 1; i >= 0; i--) {
        const T *restrict row = L + i * m;
        const T xi = x[i] / row[i], yi = y[i] / row[i];
        x[i] = xi;
        y[i] = yi;
        for (Py_ssize_t k = 0; k < i; k++) {
            x[k] -= row[k] * xi;
            y[k] -= row[k] * yi;
        }
    }
}

/* solve L L^T x = b in place (L: m x m lower triangle, row-major): forward substitution by row
 * dot products, back substitution by row updates (both contiguous) */
static ALWAYS_INLINE void NAME(chol_solve)(const T *restrict L, Py_ssize_t m, T *restrict x)
{
    for (Py_ssize_t i = 0; i < m; i++) x[i] = (x[i] - NAME(dot8)(L + i * m, x, i)) / L[i * m + i];
    for (Py_ssize_t i = m - 1; i >= 0; i--) {
        const T xi = x[i] / L[i * m + i];
        x[i] = xi;
        const T *restrict row = L + i * m;
        for (Py_ssize_t k = 0; k < i; k++) x[k] -= row[k] * xi;
    }
}

/* forward of the problems of Grams [p0, p1); returns 0, or 1 when a factorisation failed */
/* E mode (E given, h and c0 not): the right-hand side is formed here from the bound set E of each
 * problem, as the reference does (sv_core.batched.kkt.ridged_kkt_solve):
 *     h_i = K_ii - 2 C sum_{e in E} K_ie (e ascending),  c0 = 1 - C |E|,  alpha_E = C,
 * and a problem without margin keys has rho = 0 (the caller sends only those without any valid key:
 * no KKT interval); idx: 2 n + 1 entries; x2: scratch of KKT_FWD_SCRATCH(n) entries (_batchfast.c):
 * the two right-hand sides (n + 8 each), then the panels W */
MULTIVERSION static int NAME(kkt_fwd)(const T *K, const unsigned char *S, const unsigned char *E, double Cbox,
                                      const T *h, const T *c0, T *alpha, T *rho, T *Lst, T *x1st, T *dst,
                                      const Py_ssize_t *off, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t J, Py_ssize_t n,
                                      double ridge, Py_ssize_t *idx, T *x2)
{
    Py_ssize_t *eidx = idx + n;
    T *f1 = x2 + n + 8, *W = x2 + 2 * (n + 8);
    const T C = (T)Cbox, twoC = (T)(2.0 * Cbox);
    for (Py_ssize_t p = p0; p < p1; p++) {
        const T *Kp = K + p * n * n;
        for (Py_ssize_t j = 0; j < J; j++) {
            const Py_ssize_t q = p * J + j;
            const unsigned char *sk = S + q * n;
            T *al = alpha + q * n;
            /* (branch-free: idx[m] / eidx[ne] written for every i, kept when the mask is set) */
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                idx[m] = i;
                m += sk[i] != 0;
            }
            Py_ssize_t ne = 0;
            T cq;
            if (E) {
                const unsigned char *ek = E + q * n;
                for (Py_ssize_t i = 0; i < n; i++) {
                    al[i] = ek[i] ? C : (T)0;
                    eidx[ne] = i;
                    ne += ek[i] != 0;
                }
                cq = (T)1 - C * (T)ne;
            } else {
                for (Py_ssize_t i = 0; i < n; i++) al[i] = (T)0;
                cq = c0[q];
            }
            if (m == 0) {
                rho[q] = E ? (T)0 : cq;
                dst[q] = (T)0;
                continue;
            }
            T *L = Lst + off[2 * q], *x1 = x1st + off[2 * q + 1];
            for (Py_ssize_t r = 0; r < m; r++) {
                f1[r] = (T)1;
                if (E) {
                    const T *row = Kp + idx[r] * n;
                    T se = (T)0;
                    for (Py_ssize_t c = 0; c < ne; c++) se += row[eidx[c]];
                    x2[r] = row[idx[r]] - twoC * se;
                } else {
                    x2[r] = h[q * n + idx[r]];
                }
            }
            if (NAME(chol_factor)(Kp, n, idx, m, (T)ridge, L, W, f1, x2)) return 1;
            NAME(chol_back2)(L, m, f1, x2);
            for (Py_ssize_t r = 0; r < m; r++) x1[r] = f1[r];
            const T d = NAME(sum8)(x1, m);
            const T rq = (NAME(sum8)(x2, m) - cq) / d;
            rho[q] = rq;
            dst[q] = d;
            for (Py_ssize_t r = 0; r < m; r++) al[idx[r]] = x2[r] - rq * x1[r];
        }
    }
    return 0;
}

/* backward of the problems of Grams [p0, p1): g_h (P, J, n) and g_c0 (P, J) written (when given),
 * g_K (P, n, n) accumulated (when given); E mode (E given): g_K also takes the right-hand side's
 * part, dL/dK_ii += g_h_i and dL/dK_ie -= 2 C g_h_i (e in E); idx: 2 n + 1 entries; y: scratch of
 * KKT_BWD_SCRATCH(n) entries (_batchfast.c). The margin block of g_K, row idx[r]: element idx[c] += (-2 y_r) alpha_idx[c]
 * - for a large margin set over the whole row in vectors, the other elements stored back unchanged
 * (selected by the margin mask), else element by element */
MULTIVERSION static void NAME(kkt_bwd)(const unsigned char *S, const unsigned char *E, double Cbox, const T *alpha,
                                       const T *ga, const T *grho, const T *Lst, const T *x1st, const T *dst,
                                       const Py_ssize_t *off, T *gh, T *gc0, T *gK, Py_ssize_t p0, Py_ssize_t p1,
                                       Py_ssize_t J, Py_ssize_t n, Py_ssize_t *idx, T *y)
{
    Py_ssize_t *eidx = idx + n;
    const T twoC = (T)(2.0 * Cbox);
    T *aS = y + n + 1; /* alpha on the margin keys, packed; or the margin mask's lanes */
    for (Py_ssize_t p = p0; p < p1; p++) {
        for (Py_ssize_t j = 0; j < J; j++) {
            const Py_ssize_t q = p * J + j;
            const unsigned char *sk = S + q * n;
            T *g = gh ? gh + q * n : NULL;
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                idx[m] = i;
                m += sk[i] != 0;
            }
            if (g)
                for (Py_ssize_t i = 0; i < n; i++) g[i] = (T)0;
            if (m == 0) {
                if (gc0) gc0[q] = grho[q];
                continue;
            }
            const T *L = Lst + off[2 * q], *x1 = x1st + off[2 * q + 1];
            for (Py_ssize_t r = 0; r < m; r++) y[r] = ga[q * n + idx[r]];
            NAME(chol_solve)(L, m, y);
            const T r0 = (NAME(sum8)(y, m) - grho[q]) / dst[q];
            if (gc0) gc0[q] = r0;
            for (Py_ssize_t r = 0; r < m; r++) y[r] = y[r] - r0 * x1[r];
            if (g)
                for (Py_ssize_t r = 0; r < m; r++) g[idx[r]] = y[r];
            if (!gK) continue;
            T *gKp = gK + p * n * n;
            const T *al = alpha + q * n;
            if (4 * m >= n && n >= VL) {
                const Py_ssize_t nv = n / VL * VL;
                for (Py_ssize_t c = 0; c < nv; c += VL) {
                    VIT sel;
                    for (int l = 0; l < VL; l++) sel[l] = sk[c + l] ? -1 : 0;
                    memcpy(aS + c, &sel, sizeof sel);
                }
                for (Py_ssize_t r = 0; r < m; r++) {
                    const T yr = (T)(-2) * y[r];
                    T *row = gKp + idx[r] * n;
                    Py_ssize_t c = 0;
                    for (; c < nv; c += VL) {
                        VT a, gv;
                        VIT sel;
                        memcpy(&a, al + c, sizeof a);
                        memcpy(&gv, row + c, sizeof gv);
                        memcpy(&sel, aS + c, sizeof sel);
                        const VT nw = gv + yr * a;
                        gv = VSEL(sel, nw, gv);
                        memcpy(row + c, &gv, sizeof gv);
                    }
                    for (; c < n; c++)
                        if (sk[c]) row[c] += yr * al[c];
                }
            } else {
                for (Py_ssize_t c = 0; c < m; c++) aS[c] = al[idx[c]];
                for (Py_ssize_t r = 0; r < m; r++) {
                    const T yr = (T)(-2) * y[r];
                    T *row = gKp + idx[r] * n;
                    for (Py_ssize_t c = 0; c < m; c++) row[idx[c]] += yr * aS[c];
                }
            }
            if (!E) continue;
            Py_ssize_t ne = 0;
            const unsigned char *ek = E + q * n;
            for (Py_ssize_t i = 0; i < n; i++) {
                eidx[ne] = i;
                ne += ek[i] != 0;
            }
            for (Py_ssize_t r = 0; r < m; r++) {
                T *row = gKp + idx[r] * n;
                row[idx[r]] += y[r];
                const T ye = twoC * y[r];
                for (Py_ssize_t c = 0; c < ne; c++) row[eidx[c]] -= ye;
            }
        }
    }
}
#undef VSEL
#undef NVL
