/* Compiled fast path of the C&P event loop (see sv_core/_fastpath.py and sv_core/solver.py).
 *
 * One function, sweep(), runs the *simple* events of MaintainedSVDD._sweep_events for a top-level
 * "remove" or "settle" sweep, in place on the solver's own arrays: the event search (margin rates
 * beta = -Rinv B[:, c], gradient rates gamma = 2 K[c, :] - beta^T B, the ratio tests), the step,
 * and the rank-one border update / Schur downdate of Rinv with the cached bordered rows.
 * Anything that is not simple is left to the NumPy reference loop, which resumes from a state
 * that is exactly the one it would have had itself:
 *
 *   CP_DONE    remove: alpha_c reached 0 (the sweep is complete);
 *   CP_RESUME  an event's step was applied (alpha, rho, g moved; g_S = 0) and its post-step
 *              handling is left to the reference loop: c reaching its bound or g_c = 0, a margin
 *              key leaving when the downdate needs a refactorisation, a key entering that is a
 *              (near-)duplicate of a margin key, has a small Schur complement, or needs a
 *              refactorisation or more buffer room;
 *   CP_BAIL    nothing was applied in the current event (empty margin set, an ill-conditioned
 *              margin system, a zero-length or non-finite step, too many events, settle with
 *              nothing to move): the reference loop searches afresh.
 *
 * Only the buffer protocol is used (no NumPy C API). Bounds are checked against buffer sizes.
 * Built with -ffp-contract=off so the arithmetic is the reference loop's, operation by
 * operation (sums may be ordered differently from BLAS: agreement is to rounding, tested).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

enum { CP_DONE = 0, CP_RESUME = 1, CP_BAIL = 2 };
enum { K_C_BOUND = 0, K_C_G = 1, K_S_TO_R = 2, K_S_TO_E = 3, K_E_TO_S = 4, K_R_TO_S = 5 };
enum { ST_RESERVE = 0, ST_MARGIN = 1, ST_ERROR = 2 };
enum { MODE_REMOVE = 0, MODE_SETTLE = 1 };

typedef struct {
    Py_ssize_t n, m, ldk, ldr, ldR, rows_cap, s_cap, r_cap, c, updates, refactor_every;
    const double *K, *kd;
    double *alpha, *g, *rows, *R, *nb, *gam, *tmp, *colx;
    signed char *status;
    long long *S;
    double C, eps, risky_rate, dup_screen, rho;
    int risky;
} cp_state;

/* nb = Rinv @ B[:, col] over the (m+1) x (m+1) inverse. The column is gathered once (its entries
 * lie a bordered row apart) and four rows are summed side by side, each still in j order from
 * 0.0 (the same operations, so the same bits, as one row at a time): the four independent sums
 * keep the core busy where one sum waits on its previous add at every step. */
static void rinv_times_col(cp_state *st, Py_ssize_t col, double *out)
{
    Py_ssize_t m1 = st->m + 1, i = 0, ld = st->ldR;
    double *x = st->colx;
    for (Py_ssize_t j = 0; j < m1; j++) x[j] = st->rows[j * st->ldr + col];
    for (; i + 4 <= m1; i += 4) {
        const double *R0 = st->R + i * ld, *R1 = R0 + ld, *R2 = R1 + ld, *R3 = R2 + ld;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        for (Py_ssize_t j = 0; j < m1; j++) {
            double xj = x[j];
            a0 += R0[j] * xj;
            a1 += R1[j] * xj;
            a2 += R2[j] * xj;
            a3 += R3[j] * xj;
        }
        out[i] = a0; out[i + 1] = a1; out[i + 2] = a2; out[i + 3] = a3;
    }
    for (; i < m1; i++) {
        const double *Ri = st->R + i * ld;
        double acc = 0.0;
        for (Py_ssize_t j = 0; j < m1; j++) acc += Ri[j] * x[j];
        out[i] = acc;
    }
}

/* Simple Schur downdate: margin key at position p leaves S. Returns 0 if it must be left to the
 * reference loop (a refactorisation is due), 1 when done. */
static int border_remove(cp_state *st, Py_ssize_t p)
{
    Py_ssize_t m1 = st->m + 1, r = p + 1, ld = st->ldR;
    double *R = st->R;
    double piv = R[r * ld + r];
    if (fabs(piv) < 1e-14 || st->updates + 1 >= st->refactor_every || st->m - 1 == 0)
        return 0;
    double *col = st->tmp, *row = st->tmp + m1;
    for (Py_ssize_t i = 0; i < m1; i++) {
        col[i] = R[i * ld + r];
        row[i] = R[r * ld + i] / piv;
    }
    for (Py_ssize_t i = 0; i < m1; i++) {
        if (i == r) continue;
        double ci = col[i];
        double *Ri = R + i * ld;
        /* column r is skipped: two branch-free runs the compiler can vectorise (same operations) */
        for (Py_ssize_t j = 0; j < r; j++) Ri[j] = Ri[j] - ci * row[j];
        for (Py_ssize_t j = r + 1; j < m1; j++) Ri[j] = Ri[j] - ci * row[j];
    }
    /* drop row and column r: per row, the columns after r move one left (memmove: they overlap
     * within the row) and the rows after r move one up (rows lie ld >= m1 apart: no overlap) */
    for (Py_ssize_t i = 0; i < m1 - 1; i++) {
        Py_ssize_t si = i < r ? i : i + 1;
        double *dst = R + i * ld;
        const double *src = R + si * ld;
        if (si != i) memmove(dst, src, (size_t)r * sizeof(double));
        memmove(dst + r, src + r + 1, (size_t)(m1 - 1 - r) * sizeof(double));
    }
    /* bordered rows and S: delete row p + 1 and entry p */
    Py_ssize_t after = st->m - p - 1;
    if (after > 0) {
        memmove(st->rows + (p + 1) * st->ldr, st->rows + (p + 2) * st->ldr,
                (size_t)(after * st->ldr) * sizeof(double));
        memmove(st->S + p, st->S + p + 1, (size_t)after * sizeof(long long));
    }
    st->m -= 1;
    st->updates += 1;
    return 1;
}

/* Simple rank-one border update: slot k enters S. Returns 0 if it must be left to the reference
 * loop (a (near-)duplicate, a small Schur complement, a refactorisation due, no buffer room). */
static int border_add(cp_state *st, Py_ssize_t k)
{
    Py_ssize_t m = st->m, m1 = m + 1, ld = st->ldR;
    if (m == 0 || m + 2 > st->rows_cap || m + 1 > st->s_cap || m + 2 > st->r_cap
        || st->updates + 1 >= st->refactor_every)
        return 0;
    double *v = st->tmp, *b = st->tmp + m1;
    for (Py_ssize_t i = 0; i < m1; i++) v[i] = st->rows[i * st->ldr + k];
    double kkk = st->K[k * st->ldk + k];
    double dmin = INFINITY;
    for (Py_ssize_t j = 0; j < m; j++) {
        double d2 = st->kd[st->S[j]] + kkk - v[j + 1];
        if (d2 < dmin) dmin = d2;
    }
    if (!(dmin > st->dup_screen)) return 0;
    rinv_times_col(st, k, b);
    double vb = 0.0;
    for (Py_ssize_t i = 0; i < m1; i++) {
        b[i] = -b[i];
        vb += v[i] * b[i];
    }
    double kappa = 2.0 * kkk + vb;
    double scale = 2.0 * kkk > 1.0 ? 2.0 * kkk : 1.0;
    if (!(kappa > 1e-6 * scale)) return 0;
    double *R = st->R;
    for (Py_ssize_t i = 0; i < m1; i++) {
        double *Ri = R + i * ld;
        for (Py_ssize_t j = 0; j < m1; j++)
            Ri[j] = Ri[j] + (b[i] * b[j]) / kappa;
        Ri[m1] = b[i] / kappa;
    }
    for (Py_ssize_t j = 0; j < m1; j++) R[m1 * ld + j] = b[j] / kappa;
    R[m1 * ld + m1] = 1.0 / kappa;
    double *row = st->rows + m1 * st->ldr;
    const double *Kk = st->K + k * st->ldk;
    for (Py_ssize_t j = 0; j < st->n; j++) row[j] = Kk[j] * 2.0;
    st->S[m] = (long long)k;
    st->m += 1;
    st->updates += 1;
    return 1;
}

static int run(cp_state *st, int mode, Py_ssize_t max_events, Py_ssize_t *events_out,
               int *kind_out, Py_ssize_t *k_out, double *t_out, double *s_out)
{
    const Py_ssize_t n = st->n, c = st->c;
    const double C = st->C, eps = st->eps;
    double *alpha = st->alpha, *g = st->g, *nb = st->nb, *gam = st->gam;
    signed char *status = st->status;
    const double *K2 = st->K + c * st->ldk;
    Py_ssize_t events = 0;
    for (;;) {
        double s;
        *events_out = events;
        if (events > max_events) return CP_BAIL;
        if (mode == MODE_REMOVE) {
            s = -1.0;
            if (alpha[c] <= 0.0) { alpha[c] = 0.0; return CP_DONE; }
        } else {
            double gc = g[c];
            if (gc < 0.0 && alpha[c] < C) s = 1.0;
            else if (gc > 0.0 && alpha[c] > 0.0) s = -1.0;
            else return CP_BAIL;
        }
        Py_ssize_t m = st->m;
        if (m == 0) return CP_BAIL;
        rinv_times_col(st, c, nb);
        /* an ill-conditioned margin system (|beta| > RISKY_RATE) is not simple: the reference
         * loop takes the rest of the sweep with its own (BLAS) arithmetic */
        for (Py_ssize_t i = 0; i <= m; i++)
            if (!(nb[i] <= st->risky_rate && nb[i] >= -st->risky_rate)) { st->risky = 1; return CP_BAIL; }
        for (Py_ssize_t j = 0; j < n; j++) gam[j] = 0.0;
        for (Py_ssize_t i = 0; i <= m; i++) {
            const double *Bi = st->rows + i * st->ldr;
            double w = nb[i];
            for (Py_ssize_t j = 0; j < n; j++) gam[j] += w * Bi[j];
        }
        for (Py_ssize_t j = 0; j < n; j++) gam[j] = K2[j] * 2.0 - gam[j];
        double ac = alpha[c];
        double best_t = s > 0 ? C - ac : ac;
        int kind = K_C_BOUND;
        Py_ssize_t k = c;
        if (mode == MODE_SETTLE) {
            double rate = gam[c] * s, gc = g[c];
            if ((gc < 0 && rate > eps) || (gc > 0 && rate < -eps)) {
                double t = -gc / rate;
                if (t < best_t) { best_t = t; kind = K_C_G; }
            }
        }
        /* margin keys reach 0 or C */
        double bt = INFINITY, ns = -s, rbj = 0.0;
        Py_ssize_t bj = -1;
        for (Py_ssize_t j = 0; j < m; j++) {
            double r = nb[j + 1] * ns, t, a = alpha[st->S[j]];
            if (r < -eps) t = a / -r;
            else if (r > eps) t = (C - a) / r;
            else continue;
            if (t < bt) { bt = t; bj = j; rbj = r; }
        }
        if (bt < best_t) {
            best_t = bt > 0.0 ? bt : 0.0;
            kind = rbj < 0 ? K_S_TO_R : K_S_TO_E;
            k = (Py_ssize_t)st->S[bj];
        }
        /* error / reserve gradients reach 0 */
        double tj = INFINITY;
        Py_ssize_t jbest = -1;
        for (Py_ssize_t j = 0; j < n; j++) {
            int code = status[j];
            double sg;
            if (code == ST_ERROR) sg = 1.0;
            else if (code == ST_RESERVE) sg = -1.0;
            else continue;
            if (j == c) continue;
            double den = gam[j] * (s * sg);
            if (!(den > eps)) continue;
            double num = g[j] * -sg;
            if (num < 0.0) num = 0.0;
            double t = num / den;
            if (t < tj) { tj = t; jbest = j; }
        }
        if (tj < best_t) {
            best_t = tj;
            kind = status[jbest] == ST_ERROR ? K_E_TO_S : K_R_TO_S;
            k = jbest;
        }
        if (!isfinite(best_t) || best_t == 0.0) return CP_BAIL;
        double t = best_t, d = s * t;
        alpha[c] += d;
        for (Py_ssize_t j = 0; j < m; j++) alpha[st->S[j]] -= nb[j + 1] * d;
        st->rho -= nb[0] * d;
        for (Py_ssize_t j = 0; j < n; j++) g[j] += gam[j] * d;
        for (Py_ssize_t j = 0; j < m; j++) g[st->S[j]] = 0.0;
        events += 1;
        *events_out = events;
        *kind_out = kind; *k_out = k; *t_out = t; *s_out = s;
        if (kind == K_C_BOUND) {
            alpha[c] = s > 0 ? C : 0.0;
            return mode == MODE_REMOVE ? CP_DONE : CP_RESUME;
        }
        if (kind == K_C_G) return CP_RESUME;
        if (kind == K_S_TO_R || kind == K_S_TO_E) {
            int to_e = kind == K_S_TO_E;
            double a_old = alpha[k];
            alpha[k] = to_e ? C : 0.0;
            if (!border_remove(st, bj)) { alpha[k] = a_old; return CP_RESUME; }
            g[k] = 0.0;
            status[k] = (signed char)(to_e ? ST_ERROR : ST_RESERVE);
            continue;
        }
        /* E_to_S / R_to_S */
        if (!border_add(st, k)) return CP_RESUME;
        g[k] = 0.0;
        status[k] = ST_MARGIN;
    }
}

static int need(Py_buffer *b, Py_ssize_t count, Py_ssize_t item, const char *name)
{
    if (count < 0 || b->len < count * item) {
        PyErr_Format(PyExc_ValueError, "_cpfast.sweep: buffer %s is too small", name);
        return 0;
    }
    return 1;
}

static PyObject *sweep(PyObject *self, PyObject *args)
{
    (void)self;
    int mode;
    cp_state st;
    memset(&st, 0, sizeof st);
    Py_ssize_t max_events;
    Py_buffer bK, bkd, ba, bg, bst, brows, bS, bR;
    if (!PyArg_ParseTuple(args, "inny*y*w*w*w*w*nnw*nw*nndddddnnn", &mode, &st.c, &st.n, &bK, &bkd,
                          &ba, &bg, &bst, &brows, &st.ldr, &st.rows_cap, &bS, &st.s_cap, &bR,
                          &st.ldR, &st.r_cap, &st.C, &st.eps, &st.risky_rate, &st.dup_screen,
                          &st.rho, &st.m, &st.updates, &st.refactor_every))
        return NULL;
    PyObject *res = NULL;
    double *scratch = NULL;
    st.K = bK.buf; st.kd = bkd.buf; st.alpha = ba.buf; st.g = bg.buf; st.status = bst.buf;
    st.rows = brows.buf; st.S = bS.buf; st.R = bR.buf;
    /* K is square: ldk from its size */
    {
        Py_ssize_t cells = bK.len / (Py_ssize_t)sizeof(double);
        Py_ssize_t ld = (Py_ssize_t)floor(sqrt((double)cells) + 0.5);
        if (ld * ld != cells) { PyErr_SetString(PyExc_ValueError, "_cpfast.sweep: K is not square"); goto done; }
        st.ldk = ld;
    }
    max_events = 20 * (st.n > 1 ? st.n : 1) + 200;
    if (mode != MODE_REMOVE && mode != MODE_SETTLE) {
        PyErr_SetString(PyExc_ValueError, "_cpfast.sweep: unknown mode"); goto done;
    }
    if (st.n < 1 || st.n > st.ldk || st.c < 0 || st.c >= st.n || st.m < 0 || st.ldr < st.n
        || st.m + 1 > st.rows_cap || st.m > st.s_cap || st.m + 1 > st.r_cap || st.ldR < st.r_cap) {
        PyErr_SetString(PyExc_ValueError, "_cpfast.sweep: inconsistent sizes"); goto done;
    }
    if (!need(&bkd, st.n, 8, "kd") || !need(&ba, st.n, 8, "alpha") || !need(&bg, st.n, 8, "g")
        || !need(&bst, st.n, 1, "status") || !need(&brows, st.rows_cap * st.ldr, 8, "rows")
        || !need(&bS, st.s_cap, 8, "S") || !need(&bR, st.r_cap * st.ldR, 8, "Rinv"))
        goto done;
    for (Py_ssize_t j = 0; j < st.m; j++)
        if (st.S[j] < 0 || st.S[j] >= st.n) {
            PyErr_SetString(PyExc_ValueError, "_cpfast.sweep: margin slot out of range"); goto done;
        }
    Py_ssize_t cap = st.r_cap + 1;
    scratch = PyMem_Malloc((size_t)(cap + st.n + 2 * cap + cap) * sizeof(double));
    if (!scratch) { PyErr_NoMemory(); goto done; }
    st.nb = scratch; st.gam = scratch + cap; st.tmp = scratch + cap + st.n; st.colx = st.tmp + 2 * cap;
    Py_ssize_t events = 0, k = -1;
    int kind = -1;
    double t = 0.0, s = 0.0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = run(&st, mode, max_events, &events, &kind, &k, &t, &s);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("iinddnnndi", code, kind, k, t, s, events, st.m, st.updates, st.rho, st.risky);
done:
    PyMem_Free(scratch);
    PyBuffer_Release(&bK); PyBuffer_Release(&bkd); PyBuffer_Release(&ba); PyBuffer_Release(&bg);
    PyBuffer_Release(&bst); PyBuffer_Release(&brows); PyBuffer_Release(&bS); PyBuffer_Release(&bR);
    return res;
}

static PyMethodDef methods[] = {
    {"sweep", sweep, METH_VARARGS,
     "sweep(mode, c, n, K, kd, alpha, g, status, rows, ldr, rows_cap, S, s_cap, R, ldR, r_cap, C, "
     "eps, risky_rate, dup_screen, rho, m, updates, refactor_every) -> "
     "(code, kind, k, t, s, events, m, updates, rho, risky). See sv_core/_fastpath.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpfast",
                                    "Compiled simple-event fast path of the C&P loop.", -1, methods,
                                    NULL, NULL, NULL, NULL};

/* bumped whenever sweep()'s arguments or hand-over codes change: a stale build is not used */
#define CP_ABI 1

PyMODINIT_FUNC PyInit__cpfast(void)
{
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "ABI", CP_ABI) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
