/* Compiled SMO for the fixed-C SVDD dual (see sv_core/smo.py, whose smo_reference() is the NumPy
 * reference of exactly this loop, and sv_core/certified.py, which certifies what it returns).
 *
 *     min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C
 *
 * with the RBF kernel K_ij = exp(-||x_i - x_j||^2 / sigma^2) (diag K = 1). In the form
 * 1/2 a^T Q a + p^T a with Q = 2K, p = -diag K, the gradient is G = 2 K a - diag K. One iteration
 * (Fan, Chen and Lin 2005, second-order working-set selection; all labels +1):
 *
 *   i = argmin { G_t : a_t < C }                  (may increase; first index on ties)
 *   stop when  max { G_t : a_t > 0 } - G_i <= tol
 *   j = argmax { b_t^2 / q_t : a_t > 0, G_t > G_i },  b_t = G_t - G_i,
 *       q_t = 2 (K_ii + K_tt - 2 K_it)  (TAU when <= 0)
 *   move delta = min(b_j / q_j, C - a_i, a_j) from a_j to a_i (a bound reached is set exactly),
 *   G += 2 delta (K[:, i] - K[:, j]).
 *
 * Kernel columns are computed on demand (direct differences, d multiply-adds and one exp per
 * entry) into an LRU cache of at most `cache_bytes` (at least two columns); the n x n matrix is
 * never formed. A caller that already holds the Gram matrix (the maintained gate stores it)
 * passes it instead and its rows are read directly.
 *
 * Only the buffer protocol is used (no NumPy C API); the GIL is released during the loop.
 * Built with -ffp-contract=off like _cpfast.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

enum { SMO_CONVERGED = 0, SMO_MAX_ITER = 1, SMO_STALLED = 2 };
#define SMO_TAU 1e-12

typedef struct {
    Py_ssize_t n, d;
    const double *X;
    double s2;               /* sigma^2 */
    const double *K;         /* full Gram matrix (rows of length >= n, leading dimension ldk) or NULL */
    Py_ssize_t ldk;
    double *store;           /* ncols x n column storage */
    Py_ssize_t ncols, used;
    Py_ssize_t *slot_of;     /* n: cache slot of column j, -1 when absent */
    Py_ssize_t *col_of;      /* ncols: column held by a slot */
    Py_ssize_t *prev, *next; /* ncols: LRU list, head = most recent */
    Py_ssize_t head, tail;
    long long hits, misses;
} col_cache;

static void lru_unlink(col_cache *c, Py_ssize_t s)
{
    if (c->prev[s] >= 0) c->next[c->prev[s]] = c->next[s]; else c->head = c->next[s];
    if (c->next[s] >= 0) c->prev[c->next[s]] = c->prev[s]; else c->tail = c->prev[s];
    c->prev[s] = c->next[s] = -1;
}

static void lru_push_front(col_cache *c, Py_ssize_t s)
{
    c->prev[s] = -1;
    c->next[s] = c->head;
    if (c->head >= 0) c->prev[c->head] = s;
    c->head = s;
    if (c->tail < 0) c->tail = s;
}

static void compute_column(const col_cache *c, Py_ssize_t j, double *out)
{
    const Py_ssize_t n = c->n, d = c->d;
    const double *xj = c->X + j * d;
    for (Py_ssize_t t = 0; t < n; t++) {
        const double *xt = c->X + t * d;
        double d2 = 0.0;
        for (Py_ssize_t k = 0; k < d; k++) {
            double u = xt[k] - xj[k];
            d2 += u * u;
        }
        out[t] = exp(-d2 / c->s2);
    }
}

/* Column j of K. The returned pointer stays valid until the next call that misses with every
 * slot in use and j's slot is the least recently used one (never the column fetched just before,
 * since there are at least two slots). */
static const double *get_column(col_cache *c, Py_ssize_t j)
{
    if (c->K) return c->K + j * c->ldk;
    Py_ssize_t s = c->slot_of[j];
    if (s >= 0) {
        c->hits++;
        if (c->head != s) { lru_unlink(c, s); lru_push_front(c, s); }
        return c->store + s * c->n;
    }
    c->misses++;
    if (c->used < c->ncols) {
        s = c->used++;
    } else {
        s = c->tail;
        lru_unlink(c, s);
        c->slot_of[c->col_of[s]] = -1;
    }
    c->slot_of[j] = s;
    c->col_of[s] = j;
    lru_push_front(c, s);
    double *col = c->store + s * c->n;
    compute_column(c, j, col);
    return col;
}

static int run(col_cache *cc, double C, double *alpha, double *G, double tol, long long max_iter,
               long long *iters_out)
{
    const Py_ssize_t n = cc->n;
    long long it;
    int code = SMO_MAX_ITER;
    for (it = 0; it < max_iter; it++) {
        Py_ssize_t i = -1;
        double gmin = INFINITY, gmax = -INFINITY;
        for (Py_ssize_t t = 0; t < n; t++) {
            double gt = G[t];
            if (alpha[t] < C && gt < gmin) { gmin = gt; i = t; }
            if (alpha[t] > 0.0 && gt > gmax) gmax = gt;
        }
        if (i < 0 || !(gmax - gmin > tol)) { code = SMO_CONVERGED; break; }
        const double *Ki = get_column(cc, i);
        const double kii = Ki[i];
        Py_ssize_t j = -1;
        double best = -INFINITY;
        for (Py_ssize_t t = 0; t < n; t++) {
            if (!(alpha[t] > 0.0)) continue;
            double b = G[t] - gmin;
            if (!(b > 0.0)) continue;
            double q = 2.0 * (kii + 1.0 - 2.0 * Ki[t]);
            if (!(q > 0.0)) q = SMO_TAU;
            double v = b * b / q;
            if (v > best) { best = v; j = t; }
        }
        if (j < 0) { code = SMO_STALLED; break; }
        const double *Kj = get_column(cc, j);
        double q = 2.0 * (kii + Kj[j] - 2.0 * Ki[j]);
        if (!(q > 0.0)) q = SMO_TAU;
        double delta = (G[j] - gmin) / q;
        double lim_i = C - alpha[i], lim_j = alpha[j];
        int hit_i = 0, hit_j = 0;
        if (delta >= lim_i) { delta = lim_i; hit_i = 1; }
        if (delta >= lim_j) { delta = lim_j; hit_j = 1; hit_i = lim_i == lim_j; }
        if (!(delta > 0.0)) { code = SMO_STALLED; break; }
        alpha[i] = hit_i ? C : alpha[i] + delta;
        alpha[j] = hit_j ? 0.0 : alpha[j] - delta;
        double w = 2.0 * delta;
        for (Py_ssize_t t = 0; t < n; t++) G[t] += w * (Ki[t] - Kj[t]);
    }
    *iters_out = it;
    return code;
}

static int need(Py_buffer *b, Py_ssize_t count, const char *name)
{
    if (count < 0 || b->len < count * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "_smo.smo: buffer %s is too small", name);
        return 0;
    }
    return 1;
}

static PyObject *smo(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t n, d, ldk;
    double sigma, C, tol, cache_bytes;
    long long max_iter;
    PyObject *Kobj;
    Py_buffer bX, ba, bG, bK;
    memset(&bK, 0, sizeof bK);
    if (!PyArg_ParseTuple(args, "y*nnddw*w*dLdOn", &bX, &n, &d, &sigma, &C, &ba, &bG, &tol, &max_iter,
                          &cache_bytes, &Kobj, &ldk))
        return NULL;
    PyObject *res = NULL;
    col_cache cc;
    memset(&cc, 0, sizeof cc);
    int haveK = Kobj != Py_None;
    if (haveK && PyObject_GetBuffer(Kobj, &bK, PyBUF_SIMPLE) < 0) {
        haveK = 0;
        goto done;
    }
    if (n < 1 || d < 1 || !(sigma > 0.0) || !(C > 0.0) || max_iter < 0 || (haveK && ldk < n)) {
        PyErr_SetString(PyExc_ValueError, "_smo.smo: inconsistent sizes or parameters");
        goto done;
    }
    if (!need(&bX, n * d, "X") || !need(&ba, n, "alpha") || !need(&bG, n, "G")
        || (haveK && !need(&bK, (n - 1) * ldk + n, "K")))
        goto done;
    cc.n = n; cc.d = d; cc.X = bX.buf; cc.s2 = sigma * sigma; cc.head = cc.tail = -1;
    if (haveK) {
        cc.K = bK.buf;
        cc.ldk = ldk;
    } else {
        double per = (double)n * (double)sizeof(double);
        double fit = floor(cache_bytes / per);
        Py_ssize_t ncols = fit > (double)n ? n : (Py_ssize_t)(fit < 2.0 ? 2.0 : fit);
        if (ncols > n) ncols = n < 2 ? 2 : n;
        cc.ncols = ncols;
        cc.store = PyMem_RawMalloc((size_t)ncols * (size_t)n * sizeof(double));
        cc.slot_of = PyMem_RawMalloc((size_t)n * sizeof(Py_ssize_t));
        cc.col_of = PyMem_RawMalloc((size_t)ncols * 3 * sizeof(Py_ssize_t));
        if (!cc.store || !cc.slot_of || !cc.col_of) { PyErr_NoMemory(); goto done; }
        cc.prev = cc.col_of + ncols;
        cc.next = cc.col_of + 2 * ncols;
        for (Py_ssize_t j = 0; j < n; j++) cc.slot_of[j] = -1;
        for (Py_ssize_t s = 0; s < ncols; s++) cc.col_of[s] = cc.prev[s] = cc.next[s] = -1;
    }
    long long iters = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = run(&cc, C, (double *)ba.buf, (double *)bG.buf, tol, max_iter, &iters);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("iLLLn", code, iters, cc.hits, cc.misses, cc.ncols);
done:
    PyMem_RawFree(cc.store);
    PyMem_RawFree(cc.slot_of);
    PyMem_RawFree(cc.col_of);
    PyBuffer_Release(&bX); PyBuffer_Release(&ba); PyBuffer_Release(&bG);
    if (haveK) PyBuffer_Release(&bK);
    return res;
}

static PyMethodDef methods[] = {
    {"smo", smo, METH_VARARGS,
     "smo(X, n, d, sigma, C, alpha, G, tol, max_iter, cache_bytes, K_or_None, ldk) -> "
     "(code, iterations, cache_hits, cache_misses, cache_columns). alpha and G (n float64 each) are "
     "updated in place. See sv_core/smo.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_smo",
                                    "Compiled SMO of the fixed-C SVDD dual (on-demand kernel columns).",
                                    -1, methods, NULL, NULL, NULL, NULL};

/* bumped whenever smo()'s arguments or return value change: a stale build is not used */
#define SMO_ABI 1

PyMODINIT_FUNC PyInit__smo(void)
{
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "ABI", SMO_ABI) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
