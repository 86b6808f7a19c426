/* Body of sv_core/_batchfast.c for one floating type: included once with T = float and
 * NAME(x) = x##_f32, once with T = double and NAME(x) = x##_f64 (EPS: the type's epsilon).
 *
 * Sums and dot products use 8 independent partial accumulators in a fixed order (vectorisable
 * without reassociating anything the compiler does not see; the same result on every machine);
 * the Gram products are element-wise multiply-adds. See _batchfast.c for the algorithms. */

/* sum of x[0:n] */
static inline T NAME(sum8)(const T *restrict x, Py_ssize_t n)
{
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* dot product of a[0:n] and b[0:n] */
static inline T NAME(dot8)(const T *restrict a, const T *restrict b, Py_ssize_t n)
{
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* projection of z (m) onto {sum a = 1, 0 <= a <= C}: the reference's safeguarded Newton-bisection
 * on the shift tau (same bracket, start, steps and stopping tests); tau in/out (NAN: none) */
static void NAME(project)(const T *restrict z, Py_ssize_t m, T C, T *tau_io, T *restrict a)
{
    const T eps = (T)(16.0 * EPS);
    T mx[8], mn[8];
    for (int l = 0; l < 8; l++) mx[l] = mn[l] = z[0];
    Py_ssize_t i = 0;
    for (; i + 8 <= m; i += 8)
        for (int l = 0; l < 8; l++) {
            mx[l] = z[i + l] > mx[l] ? z[i + l] : mx[l];
            mn[l] = z[i + l] < mn[l] ? z[i + l] : mn[l];
        }
    for (; i < m; i++) {
        mx[0] = z[i] > mx[0] ? z[i] : mx[0];
        mn[0] = z[i] < mn[0] ? z[i] : mn[0];
    }
    T zmax = mx[0], zmin = mn[0];
    for (int l = 1; l < 8; l++) {
        zmax = mx[l] > zmax ? mx[l] : zmax;
        zmin = mn[l] < zmin ? mn[l] : zmin;
    }
    T lo = zmin - C, hi = zmax, tau = *tau_io;
    if (!(tau > lo && tau < hi)) tau = (T)0.5 * (lo + hi);
    for (int it = 0; it < 60; it++) {
        Py_ssize_t nf = 0;
        for (i = 0; i < m; i++) {
            const T d = z[i] - tau;
            a[i] = d < (T)0 ? (T)0 : (d > C ? C : d);
            nf += (d > (T)0) & (d < C);
        }
        const T err = NAME(sum8)(a, m) - (T)1;
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

/* Ka = Kb a over the non-zero entries of a (Kb: m x m, symmetric, rows ld apart) */
MULTIVERSION static void NAME(kmul)(const T *restrict Kb, Py_ssize_t ld, const T *restrict a, Py_ssize_t m,
                                    T *restrict Ka)
{
    for (Py_ssize_t i = 0; i < m; i++) Ka[i] = (T)0;
    for (Py_ssize_t j = 0; j < m; j++) {
        const T aj = a[j];
        if (aj == (T)0) continue;
        const T *restrict col = Kb + j * ld;
        for (Py_ssize_t i = 0; i < m; i++) Ka[i] += col[i] * aj;
    }
}

static void NAME(fista_run)(const T *K, const unsigned char *mask, const T *invL, T *out, Py_ssize_t P,
                            Py_ssize_t J, Py_ssize_t n, T C, long iters, int stop_when_fixed, T *work,
                            Py_ssize_t *idx)
{
    T *Ks = work, *a = Ks + n * n, *an = a + n, *Ka = an + n, *Kan = Ka + n, *y = Kan + n;
    T *Ky = y + n, *z = Ky + n, *dg = z + n;
    for (Py_ssize_t p = 0; p < P; p++) {
        const T *Kp = K + p * n * n;
        for (Py_ssize_t j = 0; j < J; j++) {
            const unsigned char *mk = mask + (p * J + j) * n;
            T *o = out + (p * J + j) * n;
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                o[i] = (T)0;
                if (mk[i]) idx[m++] = i;
            }
            if (m == 0) continue;
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
            const T il = invL[p * J + j];
            const T a0 = (T)1 / (T)m;
            for (Py_ssize_t i = 0; i < m; i++) a[i] = a0;
            NAME(kmul)(Kb, ld, a, m, Ka);
            memcpy(y, a, (size_t)m * sizeof(T));
            memcpy(Ky, Ka, (size_t)m * sizeof(T));
            double t = 1.0;
            T tau = (T)NAN;
            int still = 0; /* consecutive iterations that left a and tau bit-for-bit unchanged */
            for (long k = 0; k < iters; k++) {
                for (Py_ssize_t i = 0; i < m; i++) z[i] = y[i] - (((T)2 * Ky[i]) - dg[i]) * il;
                const T tau_before = tau;
                NAME(project)(z, m, C, &tau, an);
                /* a' = a and tau unchanged twice in a row: y = a, K y = K a and the next z, tau and
                 * a' are those of this iteration, so every later iteration repeats it exactly */
                still = (memcmp(an, a, (size_t)m * sizeof(T)) == 0 && memcmp(&tau, &tau_before, sizeof(T)) == 0)
                        ? still + 1 : 0;
                if (stop_when_fixed && still >= 2) break;
                NAME(kmul)(Kb, ld, an, m, Kan);
                const double tn = 0.5 * (1.0 + sqrt(1.0 + 4.0 * t * t));
                const T beta = (T)((t - 1.0) / tn);
                for (Py_ssize_t i = 0; i < m; i++) {
                    y[i] = an[i] + beta * (an[i] - a[i]);
                    Ky[i] = Kan[i] + beta * (Kan[i] - Ka[i]);
                }
                T *sw = a; a = an; an = sw;
                sw = Ka; Ka = Kan; Kan = sw;
                t = tn;
            }
            for (Py_ssize_t r = 0; r < m; r++) o[idx[r]] = a[r];
        }
    }
}

/* solve L L^T x = b in place (L: m x m lower triangle, row-major): forward substitution by row
 * dot products, back substitution by row updates (both contiguous) */
static void NAME(chol_solve)(const T *restrict L, Py_ssize_t m, T *restrict x)
{
    for (Py_ssize_t i = 0; i < m; i++) x[i] = (x[i] - NAME(dot8)(L + i * m, x, i)) / L[i * m + i];
    for (Py_ssize_t i = m - 1; i >= 0; i--) {
        const T xi = x[i] / L[i * m + i];
        x[i] = xi;
        const T *restrict row = L + i * m;
        for (Py_ssize_t k = 0; k < i; k++) x[k] -= row[k] * xi;
    }
}

/* forward of every problem; returns 0, or 1 when a factorisation failed */
static int NAME(kkt_fwd)(const T *K, const unsigned char *S, const T *h, const T *c0, T *alpha, T *rho, T *Lst,
                         T *x1st, T *dst, const Py_ssize_t *off, Py_ssize_t P, Py_ssize_t J, Py_ssize_t n,
                         double ridge, Py_ssize_t *idx, T *x2)
{
    for (Py_ssize_t p = 0; p < P; p++) {
        const T *Kp = K + p * n * n;
        for (Py_ssize_t j = 0; j < J; j++) {
            const Py_ssize_t q = p * J + j;
            const unsigned char *sk = S + q * n;
            T *al = alpha + q * n;
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                al[i] = (T)0;
                if (sk[i]) idx[m++] = i;
            }
            if (m == 0) {
                rho[q] = c0[q];
                dst[q] = (T)0;
                continue;
            }
            T *L = Lst + off[2 * q], *x1 = x1st + off[2 * q + 1];
            for (Py_ssize_t r = 0; r < m; r++) {
                const T *row = Kp + idx[r] * n;
                for (Py_ssize_t c = 0; c <= r; c++) L[r * m + c] = (T)2 * row[idx[c]];
                L[r * m + r] += (T)ridge;
            }
            /* left-looking Cholesky: row c of L from the rows above it (dot products of rows) */
            for (Py_ssize_t c = 0; c < m; c++) {
                T *Lc = L + c * m;
                const T v = Lc[c] - NAME(dot8)(Lc, Lc, c);
                if (!(v > (T)0)) return 1;
                Lc[c] = (T)sqrt((double)v);
                for (Py_ssize_t r = c + 1; r < m; r++) {
                    T *Lr = L + r * m;
                    Lr[c] = (Lr[c] - NAME(dot8)(Lr, Lc, c)) / Lc[c];
                }
            }
            for (Py_ssize_t r = 0; r < m; r++) {
                x1[r] = (T)1;
                x2[r] = h[q * n + idx[r]];
            }
            NAME(chol_solve)(L, m, x1);
            NAME(chol_solve)(L, m, x2);
            const T d = NAME(sum8)(x1, m);
            const T rq = (NAME(sum8)(x2, m) - c0[q]) / d;
            rho[q] = rq;
            dst[q] = d;
            for (Py_ssize_t r = 0; r < m; r++) al[idx[r]] = x2[r] - rq * x1[r];
        }
    }
    return 0;
}

/* backward: g_h (P, J, n) and g_c0 (P, J) written, g_K (P, n, n) accumulated (when given) */
static void NAME(kkt_bwd)(const unsigned char *S, const T *alpha, const T *ga, const T *grho, const T *Lst,
                          const T *x1st, const T *dst, const Py_ssize_t *off, T *gh, T *gc0, T *gK, Py_ssize_t P,
                          Py_ssize_t J, Py_ssize_t n, Py_ssize_t *idx, T *y)
{
    for (Py_ssize_t p = 0; p < P; p++) {
        for (Py_ssize_t j = 0; j < J; j++) {
            const Py_ssize_t q = p * J + j;
            const unsigned char *sk = S + q * n;
            T *g = gh + q * n;
            Py_ssize_t m = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                g[i] = (T)0;
                if (sk[i]) idx[m++] = i;
            }
            if (m == 0) {
                gc0[q] = grho[q];
                continue;
            }
            const T *L = Lst + off[2 * q], *x1 = x1st + off[2 * q + 1];
            for (Py_ssize_t r = 0; r < m; r++) y[r] = ga[q * n + idx[r]];
            NAME(chol_solve)(L, m, y);
            const T r0 = (NAME(sum8)(y, m) - grho[q]) / dst[q];
            gc0[q] = r0;
            for (Py_ssize_t r = 0; r < m; r++) {
                y[r] = y[r] - r0 * x1[r];
                g[idx[r]] = y[r];
            }
            if (!gK) continue;
            T *gKp = gK + p * n * n;
            const T *al = alpha + q * n;
            for (Py_ssize_t r = 0; r < m; r++) {
                const T yr = (T)(-2) * y[r];
                T *row = gKp + idx[r] * n;
                for (Py_ssize_t c = 0; c < m; c++) row[idx[c]] += yr * al[idx[c]];
            }
        }
    }
}
