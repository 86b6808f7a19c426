/* Hybrid readout of the causal SV layer (models/sv_hybrid_readout.py), forward and backward, for
 * one floating type: included by sv_core/_batchfast.c after _batchfast_body.h with the same T /
 * NAME / VT / VL, and EXP (expf / exp) and TINY (the type's smallest normal). Reference:
 * ``hybrid_weights(q, k, gate, chunk) @ v`` (no deletion mask); see _batchfast.c for the formulas.
 *
 * One problem (b, h) of length n_t, query t in chunk c = t / chunk starting at s = c * chunk:
 *   score_j = (q_t * scale) . k_j over the visible keys j <= t only (the future is never formed),
 *   p_j = exp(score_j - max), m_j = gate[c, j] (j < s) or 1 (s <= j <= t),
 *   Z = max(sum_j p_j m_j, TINY), pz_j = p_j * (1 / Z), w_j = pz_j * m_j, y_t = sum_j w_j v_j (wsum_rows).
 * Backward with g_j = gy_t . v_j, r = sum_j w_j g_j, u_j = g_j - r:
 *   dgate[c, j] += pz_j u_j (j < s; queries of a chunk in ascending t), ds_j = w_j u_j,
 *   dq_t = scale sum_j ds_j k_j (wsum_rows), dk_j += ds_j (q_t * scale), dv_j += w_j gy_t (ascending t).
 * Sums over keys use sum8 / dot8 (8 fixed partial accumulators); the score and g products run over
 * keys with k and v transposed once per problem (element-wise over j, vectorisable); the d-long
 * updates are element-wise (explicit vectors when the length is a multiple of the lanes). A problem's loop is the same whatever the thread split.
 * The float exponentials go through sv_expf_shifted (_expf_body.h) where its self-check at import found it
 * equal to expf (then the same bits), else expf itself. */
#include "_expf_body.h"

/* x[0:n] . (rows of a transposed (D, ld) block) for one query: out[j] = sum_l a[l] bT[l, j], j < n,
 * l in ascending order (element-wise over j: out[j] = a[0] bT[0, j], then += a[l] bT[l, j] for l = 1, 2, ...).
 * Blocks of 4 vectors of j are accumulated in registers over all l (then stored once), then single
 * vectors, then the scalar tail: the same operations per element in the same order. */
static ALWAYS_INLINE void NAME(rowdots)(const T *restrict a, const T *restrict bT, Py_ssize_t ld, Py_ssize_t D,
                                        Py_ssize_t n, T *restrict out)
{
    Py_ssize_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) {
        VT acc[4];
        for (int b = 0; b < 4; b++) {
            VT x;
            memcpy(&x, bT + j + b * VL, sizeof x);
            acc[b] = a[0] * x;
        }
        for (Py_ssize_t l = 1; l < D; l++) {
            const T al = a[l];
            const T *restrict row = bT + l * ld + j;
            for (int b = 0; b < 4; b++) {
                VT x;
                memcpy(&x, row + b * VL, sizeof x);
                acc[b] += al * x;
            }
        }
        memcpy(out + j, acc, sizeof acc);
    }
    for (; j + VL <= n; j += VL) {
        VT x, acc;
        memcpy(&x, bT + j, sizeof x);
        acc = a[0] * x;
        for (Py_ssize_t l = 1; l < D; l++) {
            memcpy(&x, bT + l * ld + j, sizeof x);
            acc += a[l] * x;
        }
        memcpy(out + j, &acc, sizeof acc);
    }
    for (; j < n; j++) {
        T acc = a[0] * bT[j];
        for (Py_ssize_t l = 1; l < D; l++) acc += a[l] * bT[l * ld + j];
        out[j] = acc;
    }
}

/* maximum of x[0:n], n >= 1, in 8 lanes (lane i mod 8 for the first floor(n / 8) * 8, lane 0 the
 * rest, lanes combined in order): exact, the same for every split */
static ALWAYS_INLINE T NAME(max8)(const T *restrict x, Py_ssize_t n)
{
    T mx[8];
    for (int l = 0; l < 8; l++) mx[l] = x[0];
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) mx[l] = x[i + l] > mx[l] ? x[i + l] : mx[l];
    for (; i < n; i++) mx[0] = x[i] > mx[0] ? x[i] : mx[0];
    T m = mx[0];
    for (int l = 1; l < 8; l++) m = mx[l] > m ? mx[l] : m;
    return m;
}

/* y[0:D] += a * x[0:D] in explicit vectors of VL lanes when D is a multiple of VL (element-wise: the
 * same bits as the scalar loop), else the scalar loop */
static ALWAYS_INLINE void NAME(axpy)(T a, const T *restrict x, T *restrict y, Py_ssize_t D)
{
    if (D % VL == 0) {
        for (Py_ssize_t l = 0; l < D; l += VL) {
            VT xv, yv;
            memcpy(&xv, x + l, sizeof xv);
            memcpy(&yv, y + l, sizeof yv);
            yv += a * xv;
            memcpy(y + l, &yv, sizeof yv);
        }
    } else {
        for (Py_ssize_t l = 0; l < D; l++) y[l] += a * x[l];
    }
}

/* out[0:D] = sum_j a[j] x[j, 0:D] over j < n (rows of length D): for D = 16 in registers, two
 * sets of vector partial sums (even and odd j, each in ascending j) added at the end; otherwise
 * accumulated in out over ascending j. Fixed order either way. */
static ALWAYS_INLINE void NAME(wsum_rows)(const T *restrict a, const T *restrict x, Py_ssize_t n, Py_ssize_t D,
                                          T *restrict out)
{
    if (D == 16) {
        enum { NV = 16 / VL };
        VT e[NV], o[NV];
        for (int b = 0; b < NV; b++) e[b] = o[b] = (VT){0};
        Py_ssize_t j = 0;
        for (; j + 2 <= n; j += 2) {
            const T a0 = a[j], a1 = a[j + 1];
            for (int b = 0; b < NV; b++) {
                VT x0, x1;
                memcpy(&x0, x + j * 16 + b * VL, sizeof x0);
                memcpy(&x1, x + (j + 1) * 16 + b * VL, sizeof x1);
                e[b] += a0 * x0;
                o[b] += a1 * x1;
            }
        }
        if (j < n)
            for (int b = 0; b < NV; b++) {
                VT x0;
                memcpy(&x0, x + j * 16 + b * VL, sizeof x0);
                e[b] += a[j] * x0;
            }
        for (int b = 0; b < NV; b++) {
            const VT r = e[b] + o[b];
            memcpy(out + b * VL, &r, sizeof r);
        }
    } else {
        for (Py_ssize_t l = 0; l < D; l++) out[l] = 0;
        for (Py_ssize_t j = 0; j < n; j++) NAME(axpy)(a[j], x + j * D, out, D);
    }
}

static void NAME(transpose)(const T *restrict a, Py_ssize_t rows, Py_ssize_t cols, T *restrict aT)
{
    for (Py_ssize_t j = 0; j < rows; j++)
        for (Py_ssize_t l = 0; l < cols; l++) aT[l * rows + j] = a[j * cols + l];
}

/* one row of the forward: w[0:n] (and pz[0:s]) of query t, y_t; sc: scratch (n) */
static ALWAYS_INLINE void NAME(fwd_row)(const T *restrict qs, const T *restrict kT, const T *restrict v,
                                        const T *restrict g, Py_ssize_t nt, Py_ssize_t d, Py_ssize_t dv,
                                        Py_ssize_t n, Py_ssize_t s, T *restrict sc, T *restrict wr,
                                        T *restrict zr, T *restrict yr)
{
    NAME(rowdots)(qs, kT, nt, d, n, sc);
    const T mx = NAME(max8)(sc, n);
#ifdef SV_HAVE_VEXPF
    if (sizeof(T) == sizeof(float) && sv_expf_ok) /* expf's bits, eight at a time (_expf_body.h) */
        sv_expf_shifted((float *)(void *)sc, (float)mx, n);
    else
#endif
        for (Py_ssize_t j = 0; j < n; j++) sc[j] = EXP(sc[j] - mx);
    T Z = NAME(dot8)(sc, g, s) + NAME(sum8)(sc + s, n - s);
    Z = Z < TINY ? TINY : Z; /* torch's clamp_min: NaN stays NaN */
    const T iz = (T)1 / Z;
    if (zr) {
        for (Py_ssize_t j = 0; j < s; j++) {
            const T a = sc[j] * iz;
            zr[j] = a;
            wr[j] = a * g[j];
        }
    } else {
        for (Py_ssize_t j = 0; j < s; j++) wr[j] = (sc[j] * iz) * g[j];
    }
    for (Py_ssize_t j = s; j < n; j++) wr[j] = sc[j] * iz;
    NAME(wsum_rows)(wr, v, n, dv, yr);
}

/* problems [p0, p1): q, k (P, nt, d), v (P, nt, dv), gate (P, nc, nt) -> y (P, nt, dv), w (P, nt, nt)
 * (rows written on j <= t only), pz (P, nt, nt) on j < s_c(t) only, or NULL; work: d * nt + nt + d */
MULTIVERSION static void NAME(readout_fwd)(const T *q, const T *k, const T *v, const T *gate, T *y, T *w, T *pz,
                                           Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t nt, Py_ssize_t d,
                                           Py_ssize_t dv, Py_ssize_t nc, Py_ssize_t chunk, T scale, T *work)
{
    T *kT = work, *sc = work + d * nt, *qs = sc + nt;
    for (Py_ssize_t p = p0; p < p1; p++) {
        const T *qp = q + p * nt * d, *vp = v + p * nt * dv, *gp = gate + p * nc * nt;
        T *wp = w + p * nt * nt, *zp = pz ? pz + p * nt * nt : NULL, *yp = y + p * nt * dv;
        NAME(transpose)(k + p * nt * d, nt, d, kT);
        for (Py_ssize_t t = 0; t < nt; t++) {
            const Py_ssize_t c = t / chunk, s = c * chunk;
            for (Py_ssize_t l = 0; l < d; l++) qs[l] = qp[t * d + l] * scale;
            /* d = dv = 16 (the study's head) with constant loop bounds: unrolled vector code */
            if (d == 16 && dv == 16)
                NAME(fwd_row)(qs, kT, vp, gp + c * nt, nt, 16, 16, t + 1, s, sc, wp + t * nt,
                              zp ? zp + t * nt : NULL, yp + t * 16);
            else
                NAME(fwd_row)(qs, kT, vp, gp + c * nt, nt, d, dv, t + 1, s, sc, wp + t * nt,
                              zp ? zp + t * nt : NULL, yp + t * dv);
        }
    }
}

/* one row of the backward (query t): dgate row c += pz u on j < s (dg NULL: skipped), dq_t, and
 * gg[0:n] = ds_t (for the key sweep of key_grads); qs = q_t * scale */
static ALWAYS_INLINE void NAME(bwd_row)(const T *restrict vT, const T *restrict gyr, const T *restrict wr,
                                        const T *restrict zr, const T *restrict k, Py_ssize_t nt, Py_ssize_t d,
                                        Py_ssize_t dv, Py_ssize_t n, Py_ssize_t s, T scale, T *restrict gg,
                                        T *restrict dg, T *restrict dqr)
{
    NAME(rowdots)(gyr, vT, nt, dv, n, gg);
    const T r = NAME(dot8)(wr, gg, n);
    for (Py_ssize_t j = 0; j < n; j++) gg[j] -= r;
    if (dg)
        for (Py_ssize_t j = 0; j < s; j++) dg[j] += zr[j] * gg[j];
    for (Py_ssize_t j = 0; j < n; j++) gg[j] *= wr[j];
    NAME(wsum_rows)(gg, k, n, d, dqr);
    for (Py_ssize_t l = 0; l < d; l++) dqr[l] *= scale;
}

/* dk_j = sum_{t >= j} ds[t, j] qs_t and dv_j = sum_{t >= j} w[t, j] gy_t, each from +0 in ascending t
 * (exactly the row-by-row updates dk_j += ds_tj qs_t, dv_j += w_tj gy_t of queries t = 0, 1, ...
 * on zeroed rows): for d = dv = 16 two keys at a time in registers, else each key's rows in memory */
static ALWAYS_INLINE void NAME(key_grads)(const T *restrict ds, const T *restrict wp, const T *restrict qs,
                                          const T *restrict gyp, Py_ssize_t nt, Py_ssize_t d, Py_ssize_t dv,
                                          T *restrict dkp, T *restrict dvp)
{
    if (d == 16 && dv == 16) {
        enum { NV = 16 / VL };
        Py_ssize_t j = 0;
        for (; j + 2 <= nt; j += 2) {
            VT k0[NV], k1[NV], v0[NV], v1[NV];
            for (int b = 0; b < NV; b++) k0[b] = k1[b] = v0[b] = v1[b] = (VT){0};
            for (Py_ssize_t t = j; t < nt; t++) {
                const T a0 = ds[t * nt + j], w0 = wp[t * nt + j];
                for (int b = 0; b < NV; b++) {
                    VT x, g;
                    memcpy(&x, qs + t * 16 + b * VL, sizeof x);
                    memcpy(&g, gyp + t * 16 + b * VL, sizeof g);
                    k0[b] += a0 * x;
                    v0[b] += w0 * g;
                    if (t > j) {
                        k1[b] += ds[t * nt + j + 1] * x;
                        v1[b] += wp[t * nt + j + 1] * g;
                    }
                }
            }
            memcpy(dkp + j * 16, k0, sizeof k0);
            memcpy(dkp + (j + 1) * 16, k1, sizeof k1);
            memcpy(dvp + j * 16, v0, sizeof v0);
            memcpy(dvp + (j + 1) * 16, v1, sizeof v1);
        }
        for (; j < nt; j++) {
            VT k0[NV], v0[NV];
            for (int b = 0; b < NV; b++) k0[b] = v0[b] = (VT){0};
            for (Py_ssize_t t = j; t < nt; t++) {
                const T a0 = ds[t * nt + j], w0 = wp[t * nt + j];
                for (int b = 0; b < NV; b++) {
                    VT x, g;
                    memcpy(&x, qs + t * 16 + b * VL, sizeof x);
                    memcpy(&g, gyp + t * 16 + b * VL, sizeof g);
                    k0[b] += a0 * x;
                    v0[b] += w0 * g;
                }
            }
            memcpy(dkp + j * 16, k0, sizeof k0);
            memcpy(dvp + j * 16, v0, sizeof v0);
        }
    } else {
        memset(dkp, 0, (size_t)(nt * d) * sizeof(T));
        memset(dvp, 0, (size_t)(nt * dv) * sizeof(T));
        for (Py_ssize_t j = 0; j < nt; j++)
            for (Py_ssize_t t = j; t < nt; t++) {
                NAME(axpy)(ds[t * nt + j], qs + t * d, dkp + j * d, d);
                NAME(axpy)(wp[t * nt + j], gyp + t * dv, dvp + j * dv, dv);
            }
    }
}

/* problems [p0, p1): gy (P, nt, dv), the forward's w and pz (NULL: no gate gradient) ->
 * dq, dk (P, nt, d), dv (P, nt, dv), dgate (P, nc, nt) or NULL, all overwritten; work: dv * nt + nt * nt + nt * d.
 * Per problem: the rows t (ds_t kept in work, dq_t and dgate), then the key sweep (dk, dv). */
MULTIVERSION static void NAME(readout_bwd)(const T *q, const T *k, const T *v, const T *w, const T *pz,
                                           const T *gy, T *dq, T *dk, T *dv_, T *dgate, Py_ssize_t p0,
                                           Py_ssize_t p1, Py_ssize_t nt, Py_ssize_t d, Py_ssize_t dv,
                                           Py_ssize_t nc, Py_ssize_t chunk, T scale, T *work)
{
    T *vT = work, *ds = work + dv * nt, *qs = ds + nt * nt;
    for (Py_ssize_t p = p0; p < p1; p++) {
        const T *qp = q + p * nt * d, *kp = k + p * nt * d, *wp = w + p * nt * nt, *gyp = gy + p * nt * dv;
        const T *zp = pz ? pz + p * nt * nt : NULL;
        T *dqp = dq + p * nt * d, *dkp = dk + p * nt * d, *dvp = dv_ + p * nt * dv;
        T *dgp = dgate ? dgate + p * nc * nt : NULL;
        NAME(transpose)(v + p * nt * dv, nt, dv, vT);
        for (Py_ssize_t i = 0; i < nt * d; i++) qs[i] = qp[i] * scale;
        if (dgp) memset(dgp, 0, (size_t)(nc * nt) * sizeof(T));
        for (Py_ssize_t t = 0; t < nt; t++) {
            const Py_ssize_t c = t / chunk, s = c * chunk;
            const T *zr = zp ? zp + t * nt : NULL;
            T *dg = dgp ? dgp + c * nt : NULL;
            if (d == 16 && dv == 16)
                NAME(bwd_row)(vT, gyp + t * 16, wp + t * nt, zr, kp, nt, 16, 16, t + 1, s, scale, ds + t * nt, dg,
                              dqp + t * 16);
            else
                NAME(bwd_row)(vT, gyp + t * dv, wp + t * nt, zr, kp, nt, d, dv, t + 1, s, scale, ds + t * nt, dg,
                              dqp + t * d);
        }
        NAME(key_grads)(ds, wp, qs, gyp, nt, d, dv, dkp, dvp);
    }
}
