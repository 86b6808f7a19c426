/* Compiled loops of the batched SVDD gate (sv_core/batched*.py): the FISTA partition finder
 * (reference: sv_core.batched_fista.fista_svdd(..., backend="torch")) and the ridged bordered
 * KKT solve with its backward (reference: sv_core.batched_kkt.ridged_kkt_solve, solver
 * "cholesky" / "lu").
 *
 * FISTA.
 * Problem (p, j) is the SVDD dual on the keys mask[p, j] of Gram matrix K[p]:
 *
 *     min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C,  a = 0 off the mask
 *
 * From a = mask / |mask|, with the step 1/L of the caller (L = 2 lambda_max bound) and the seed's
 * fixed momentum schedule, every iteration is
 *
 *     z = y - (2 K y - diag K) / L,   a' = P(z)   (capped-simplex projection on the mask)
 *     t' = (1 + sqrt(1 + 4 t^2)) / 2,  beta = (t - 1) / t'
 *     y = a' + beta (a' - a),          K y = K a' + beta (K a' - K a)
 *
 * in the element order and precision of the torch reference (sums: see _batchfast_body.h). What
 * the reference cannot skip: each problem works on its own valid keys only (a prefix mask reads
 * its block of K in place, any other is copied once), and K a' is accumulated over the non-zero
 * entries of a' only (many keys of an SVDD solution are zero), so an iteration costs
 * O(m |a' > 0|) instead of O(n^2) per problem. The projection is the reference's safeguarded
 * Newton-bisection on the shift tau, warm-started from the previous iteration's tau, per
 * problem (the reference stops a row at the same tests). A problem whose iterate and shift come
 * out of two consecutive iterations unchanged bit for bit is left there: every later iteration
 * would repeat the last one exactly (y = a, K y = K a), so the result is the same.
 *
 * KKT. Problem (p, j) with margin set S (m keys, ascending) and right-hand side h:
 *
 *     A = 2 K_SS + ridge I = L L^T (Cholesky),  x1 = A^-1 1,  x2 = A^-1 h_S,
 *     rho = (1^T x2 - c0) / 1^T x1,              alpha_S = x2 - rho x1
 *
 * (the Schur complement of the bordered system [[0, 1^T], [1, A]] [rho; alpha_S] = [c0; h_S]);
 * a problem without margin keys has rho = c0, alpha = 0. The factor and x1 are kept for the
 * backward, which solves the same system for the upstream gradients (g_c0, g_h_S) and adds
 * dL/dK_SS = -2 g_h_S alpha_S^T into dL/dK (exactly what autograd of the reference's gather
 * gives). A factorisation that fails (A not numerically positive definite) is reported and the
 * caller falls back to the reference solve for the whole batch.
 *
 * The loops for float and double are _batchfast_body.h, included twice. Only the buffer protocol
 * is used (no NumPy C API); the GIL is released during the loops. Built with -ffp-contract=off
 * like _cpfast.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* the Gram products are element-wise multiply-adds (no reassociation, no contraction), so every
 * instruction set gives the same bits; on x86-64 Linux with GCC an AVX2 clone is dispatched at
 * load time when the CPU has it */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

#define T float
#define NAME(x) x##_f32
#define EPS FLT_EPSILON
#include "_batchfast_body.h"
#undef T
#undef NAME
#undef EPS
#define T double
#define NAME(x) x##_f64
#define EPS DBL_EPSILON
#include "_batchfast_body.h"
#undef T
#undef NAME
#undef EPS

static PyObject *kkt_forward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    double ridge;
    int dbl;
    Py_buffer bK, bS, bh, bc, ba, br, bL, bx, bd, bo;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*w*y*nnndp", &bK, &bS, &bh, &bc, &ba, &br, &bL, &bx, &bd, &bo,
                          &P, &J, &n, &ridge, &dbl))
        return NULL;
    PyObject *res = NULL;
    void *x2 = NULL;
    Py_ssize_t *idx = NULL;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (P < 0 || J < 0 || n < 0 || bK.len < P * n * n * sz || bS.len < P * J * n || bh.len < P * J * n * sz
        || bc.len < P * J * sz || ba.len < P * J * n * sz || br.len < P * J * sz || bd.len < P * J * sz
        || bo.len < 2 * P * J * (Py_ssize_t)sizeof(Py_ssize_t)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.kkt_forward: inconsistent sizes");
        goto done;
    }
    x2 = PyMem_RawMalloc((size_t)(n + 1) * (size_t)sz);
    idx = PyMem_RawMalloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    if (!x2 || !idx) { PyErr_NoMemory(); goto done; }
    int code;
    Py_BEGIN_ALLOW_THREADS
    if (dbl)
        code = kkt_fwd_f64(bK.buf, bS.buf, bh.buf, bc.buf, ba.buf, br.buf, bL.buf, bx.buf, bd.buf, bo.buf, P, J, n,
                           ridge, idx, x2);
    else
        code = kkt_fwd_f32(bK.buf, bS.buf, bh.buf, bc.buf, ba.buf, br.buf, bL.buf, bx.buf, bd.buf, bo.buf, P, J, n,
                           ridge, idx, x2);
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(code);
done:
    PyMem_RawFree(x2);
    PyMem_RawFree(idx);
    PyBuffer_Release(&bK); PyBuffer_Release(&bS); PyBuffer_Release(&bh); PyBuffer_Release(&bc);
    PyBuffer_Release(&ba); PyBuffer_Release(&br); PyBuffer_Release(&bL); PyBuffer_Release(&bx);
    PyBuffer_Release(&bd); PyBuffer_Release(&bo);
    return res;
}

static PyObject *kkt_backward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    int dbl;
    PyObject *gKobj;
    Py_buffer bS, ba, bg, bgr, bL, bx, bd, bo, bgh, bgc, bgK;
    memset(&bgK, 0, sizeof bgK);
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*w*w*Onnnp", &bS, &ba, &bg, &bgr, &bL, &bx, &bd, &bo, &bgh, &bgc,
                          &gKobj, &P, &J, &n, &dbl))
        return NULL;
    PyObject *res = NULL;
    void *y = NULL;
    Py_ssize_t *idx = NULL;
    int haveK = gKobj != Py_None;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (haveK && PyObject_GetBuffer(gKobj, &bgK, PyBUF_WRITABLE) < 0) { haveK = 0; goto done; }
    if (P < 0 || J < 0 || n < 0 || bS.len < P * J * n || ba.len < P * J * n * sz || bg.len < P * J * n * sz
        || bgr.len < P * J * sz || bd.len < P * J * sz || bgh.len < P * J * n * sz || bgc.len < P * J * sz
        || bo.len < 2 * P * J * (Py_ssize_t)sizeof(Py_ssize_t) || (haveK && bgK.len < P * n * n * sz)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.kkt_backward: inconsistent sizes");
        goto done;
    }
    y = PyMem_RawMalloc((size_t)(n + 1) * (size_t)sz);
    idx = PyMem_RawMalloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    if (!y || !idx) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    if (dbl)
        kkt_bwd_f64(bS.buf, ba.buf, bg.buf, bgr.buf, bL.buf, bx.buf, bd.buf, bo.buf, bgh.buf, bgc.buf,
                    haveK ? bgK.buf : NULL, P, J, n, idx, y);
    else
        kkt_bwd_f32(bS.buf, ba.buf, bg.buf, bgr.buf, bL.buf, bx.buf, bd.buf, bo.buf, bgh.buf, bgc.buf,
                    haveK ? bgK.buf : NULL, P, J, n, idx, y);
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_RawFree(y);
    PyMem_RawFree(idx);
    PyBuffer_Release(&bS); PyBuffer_Release(&ba); PyBuffer_Release(&bg); PyBuffer_Release(&bgr);
    PyBuffer_Release(&bL); PyBuffer_Release(&bx); PyBuffer_Release(&bd); PyBuffer_Release(&bo);
    PyBuffer_Release(&bgh); PyBuffer_Release(&bgc);
    if (haveK) PyBuffer_Release(&bgK);
    return res;
}

static PyObject *fista(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    double C;
    long iters;
    int dbl, stop;
    Py_buffer bK, bm, bL, bo;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nnndlpp", &bK, &bm, &bL, &bo, &P, &J, &n, &C, &iters, &dbl, &stop))
        return NULL;
    PyObject *res = NULL;
    void *work = NULL;
    Py_ssize_t *idx = NULL;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (P < 0 || J < 0 || n < 0 || !(C > 0.0) || iters < 0 || bK.len < P * n * n * sz || bm.len < P * J * n
        || bL.len < P * J * sz || bo.len < P * J * n * sz) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.fista: inconsistent sizes or parameters");
        goto done;
    }
    work = PyMem_RawMalloc((size_t)(n * n + 8 * n + 1) * (size_t)sz);
    idx = PyMem_RawMalloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    if (!work || !idx) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    if (dbl)
        fista_run_f64(bK.buf, bm.buf, bL.buf, bo.buf, P, J, n, C, iters, stop, work, idx);
    else
        fista_run_f32(bK.buf, bm.buf, bL.buf, bo.buf, P, J, n, (float)C, iters, stop, work, idx);
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_RawFree(work);
    PyMem_RawFree(idx);
    PyBuffer_Release(&bK); PyBuffer_Release(&bm); PyBuffer_Release(&bL); PyBuffer_Release(&bo);
    return res;
}

static PyMethodDef methods[] = {
    {"fista", fista, METH_VARARGS,
     "fista(K, mask, invL, out, P, J, n, C, iters, is_double, stop_when_fixed) -> None. K (P, n, n), invL (P, J) "
     "and out (P, J, n) float32 or float64 (is_double), mask (P, J, n) uint8, all C-contiguous; out is "
     "overwritten with the FISTA estimate; stop_when_fixed: leave a problem once its iterate is a fixed point "
     "bit for bit (the result is the same). See sv_core/batched_fista.py."},
    {"kkt_forward", kkt_forward, METH_VARARGS,
     "kkt_forward(K, S, h, c0, alpha, rho, Lstore, x1store, dstore, offsets, P, J, n, ridge, is_double) -> 0 or "
     "1 (a factorisation failed). See sv_core/batched_kkt.py."},
    {"kkt_backward", kkt_backward, METH_VARARGS,
     "kkt_backward(S, alpha, g_alpha, g_rho, Lstore, x1store, dstore, offsets, g_h, g_c0, g_K_or_None, P, J, n, "
     "is_double) -> None. See sv_core/batched_kkt.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchfast",
                                    "Compiled loops of the batched SVDD gate (FISTA, ridged KKT solve).",
                                    -1, methods, NULL, NULL, NULL, NULL};

/* bumped whenever a function's arguments or return value change: a stale build is not used */
#define BATCHFAST_ABI 1

PyMODINIT_FUNC PyInit__batchfast(void)
{
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "ABI", BATCHFAST_ABI) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
