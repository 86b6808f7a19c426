/* Compiled loops of the batched SVDD gate (sv_core/batched*.py): the FISTA partition finder
 * (reference: sv_core.batched.fista.fista_svdd(..., backend="torch")) and the ridged bordered
 * KKT solve with its backward (reference: sv_core.batched.kkt.ridged_kkt_solve, solver
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
 * its block of K in place, any other is copied once), so an iteration costs O(m^2) instead of
 * O(n^2) per problem; K a' is accumulated in registers over the non-zero entries of a' only when the
 * block is finite (O(m nnz); see kmul in _batchfast_body.h); the projection's passes and the
 * min / max run in explicit 8-lane vectors, lane by lane the scalar loop; the momentum schedule
 * (the same for every problem) is computed once per call. The
 * step 1/L is the caller's, or L comes from the reference's bound computed here per problem
 * (one power step, Collatz-Wielandt ratio; only for an entry-wise non-negative K, checked
 * first). The projection is the reference's safeguarded
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
 * gives). In E mode the right-hand side h_S = diag(K)_S - 2 C K_SE 1, c0 = 1 - C |E| is formed
 * here from the bound masks and the backward adds its part of dL/dK too. A factorisation that
 * fails (A not numerically positive definite) is reported and the caller falls back to the
 * reference solve for the whole batch.
 *
 * Readout. The hybrid readout of the causal SV layer without a deletion mask (reference:
 * models.sv_hybrid_readout.hybrid_weights(q, k, gate, chunk) @ v), forward and backward, one
 * problem per (batch, head): query t of chunk c = t / chunk (start s = c chunk) forms its scores
 * (q_t / sqrt(d)) . k_j for the visible keys j <= t only (the future is never formed), p_j =
 * exp(score_j - max), the multiplier m_j = gate[c, j] on the prefix j < s and 1 on the chunk,
 * Z = max(sum p m, tiny), w = p m / Z, y_t = sum_j w_j v_j. The backward, with g_j = gy_t . v_j and
 * r = sum_j w_j g_j: dscore_j = w_j (g_j - r), dgate[c, j] = sum over the chunk's queries of
 * (p_j / Z)(g_j - r) on the prefix, dq, dk, dv from dscore and w (_readout_body.h). The forward
 * stores w (and p / Z on the prefix when the gate needs a gradient) for the backward.
 *
 * Gram backward. The gradient of the batch's RBF Gram matrices K = exp(-max(D, 0) / sigma^2)
 * (reference: the torch backward of sv_core.batched.common.rbf_gram; the forward stays torch's):
 * G = a + a^T with a = dL/dK K (-1 / sigma^2) where D >= 0, dL/dX = 2 (rowsum(G) X - G X), one
 * pass over each row (_gram_body.h).
 *
 * Threads. Problems of different Grams are independent: a batch's Grams are claimed one at a time
 * by up to the caller's thread count (torch's) of threads, each problem computed by the same loop,
 * so the result does not depend on the count (see run_split). Built with OpenMP (setup.py, when the
 * compiler has it) the threads are the process's OpenMP team - torch's own runtime, so torch's
 * intra-op workers run the problems instead of spin-waiting beside other threads; else POSIX
 * helper threads.
 *
 * FISTA with early exit (fista_segment). The same loop in segments k0 <= k < k1, each problem's
 * state (a, K a, the next z, tau, the fixed-point count) kept by the caller between segments, and
 * after each segment the reference's residual check max_i |P(a - (2 K a - diag K) / L) - a|
 * (projection warm-started from tau); the caller stops once every residual is below tol, at the
 * reference's lockstep checkpoint. A segment boundary changes no bit of any iterate.
 *
 * The loops for float and double are _batchfast_body.h, _readout_body.h and _gram_body.h, included twice
 * (exp: expf / exp of libm; the float readout's expf eight lanes at a time where an import-time
 * self-check found that replica equal to expf, _expf_body.h). Only the buffer protocol
 * is used (no NumPy C API); the GIL is released during the loops. Built with -ffp-contract=off
 * like _cpfast.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* the Gram products are element-wise multiply-adds (no reassociation, no contraction), so every
 * instruction set gives the same bits; on x86-64 Linux with GCC an AVX2 clone is dispatched at
 * load time when the CPU has it */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif
/* the FISTA loop (fista_run) also has an AVX-512 clone: K a' in 64-byte vectors (the same operations
 * entry by entry); FISTA_ISA tells the loop the instruction set of the clone the resolver picked,
 * the best one the CPU has (2: AVX-512F, 1: AVX2, 0: other). BATCHFAST_NO_AVX512 leaves that clone
 * out (tests compare the AVX2 and AVX-512 clones' bits on a machine that has both) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#ifdef BATCHFAST_NO_AVX512
#define MULTIVERSION_FISTA MULTIVERSION
#define FISTA_ISA (__builtin_cpu_supports("avx2") ? 1 : 0)
#else
#define MULTIVERSION_FISTA __attribute__((target_clones("avx512f", "avx2", "default")))
#define FISTA_ISA (__builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0)
#endif
#else
#define MULTIVERSION_FISTA MULTIVERSION
#define FISTA_ISA 0
#endif
/* the per-iteration helpers are inlined into each instruction-set clone of their caller */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* 32-byte vectors of GCC / Clang's vector extension: element-wise IEEE operations, so the same
 * bits as the scalar loop they replace (lowered to two 16-byte halves without AVX) */
typedef float vec_f32 __attribute__((vector_size(32)));
typedef double vec_f64 __attribute__((vector_size(32)));
/* their comparison results: all-ones / zero lanes of the same width */
typedef int vec_i32 __attribute__((vector_size(32)));
typedef long long vec_i64 __attribute__((vector_size(32)));
/* lane permutation of two vectors a, b (indices into their concatenation; moves lanes only) */
#if defined(__clang__)
#define KKT_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define KKT_SHUF(a, b, ...) __builtin_shuffle(a, b, (VIT){__VA_ARGS__})
#endif

#define T float
#define NAME(x) x##_f32
#define EPS FLT_EPSILON
#define VT vec_f32
#define VIT vec_i32
#define VL 8
#define EXP expf
#define TINY FLT_MIN
#include "_batchfast_body.h"
#include "_readout_body.h"
#include "_gram_body.h"
#undef EXP
#undef TINY
#undef T
#undef NAME
#undef EPS
#undef VT
#undef VIT
#undef VL
#define T double
#define NAME(x) x##_f64
#define EPS DBL_EPSILON
#define VT vec_f64
#define VIT vec_i64
#define VL 4
#define EXP exp
#define TINY DBL_MIN
#include "_batchfast_body.h"
#include "_readout_body.h"
#include "_gram_body.h"
#undef EXP
#undef TINY
#undef T
#undef NAME
#undef EPS
#undef VT
#undef VIT
#undef VL

/* ---- splitting a batch over threads -------------------------------------------------------
 * Problems of different Grams (readout: of different (batch, head)) are independent and each is
 * computed by the same loop whichever thread runs it (a thread's scratch holds nothing across
 * problems), so the result is the same bits with 1 or 16 threads. The calling thread and up to
 * nthreads - 1 helpers (POSIX threads, detached) claim problems one at a time from a shared
 * counter; the caller returns once every claimed problem is finished. A helper that starts late
 * (its core busy, e.g. with torch's spinning OpenMP workers right after a parallel torch operation)
 * finds nothing left and only drops its reference to the job, so a call is never slower than the
 * calling thread alone by more than the thread starts. Elsewhere (or when no thread can be
 * started) the calling thread runs every problem. Built with OpenMP, the team of the process's
 * OpenMP runtime claims the problems instead (run_split). */
#if !defined(_WIN32) && (defined(__GNUC__) || defined(__clang__))
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#define HAVE_PTHREADS 1
#endif
#define MAX_THREADS 64
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    int (*fn)(void *ctx, Py_ssize_t p0, Py_ssize_t p1, int tid);
    void *ctx;
    Py_ssize_t P;
    Py_ssize_t next;  /* atomic: the next unclaimed problem */
    Py_ssize_t done;  /* atomic: problems finished */
    int refs;         /* atomic: the caller and the helpers still holding the job */
    int code;         /* atomic: OR of the problems' codes */
    int tids[MAX_THREADS];
} claim_job;

static void claim_loop(claim_job *j, int tid)
{
#ifdef HAVE_PTHREADS
    for (;;) {
        const Py_ssize_t p = __atomic_fetch_add(&j->next, 1, __ATOMIC_ACQ_REL);
        if (p >= j->P) break;
        const int c = j->fn(j->ctx, p, p + 1, tid);
        if (c) __atomic_fetch_or(&j->code, c, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&j->done, 1, __ATOMIC_RELEASE);
    }
#else
    for (Py_ssize_t p = 0; p < j->P; p++) j->code |= j->fn(j->ctx, p, p + 1, tid);
    j->done = j->P;
#endif
}

#ifdef HAVE_PTHREADS
static void *claim_main(void *arg)
{
    int *tidp = (int *)arg;
    claim_job *j = (claim_job *)(void *)((char *)(tidp - *tidp) - offsetof(claim_job, tids));
    claim_loop(j, *tidp);
    if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) == 0) free(j);
    return NULL;
}
#endif

/* nthreads clamped to [1, min(P, MAX_THREADS)] */
static int clamp_threads(long nthreads, Py_ssize_t P)
{
    if (nthreads > P) nthreads = (long)P;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    return nthreads < 1 ? 1 : (int)nthreads;
}

/* runs fn(ctx, p, p + 1, tid) for every problem p in [0, P) on up to nt threads (tid < nt picks the
 * scratch); returns the OR of the codes */
static int run_split(int (*fn)(void *, Py_ssize_t, Py_ssize_t, int), void *ctx, Py_ssize_t P, int nt)
{
#ifdef _OPENMP
    /* built with OpenMP: the team of the process's OpenMP runtime - torch's own libgomp (the same
     * soname, loaded first by `import torch`), so its intra-op workers run these problems instead
     * of spinning beside helper threads; problems are claimed one at a time as below */
    if (nt > 1) {
        int code = 0;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(| : code)
        for (Py_ssize_t p = 0; p < P; p++) code |= fn(ctx, p, p + 1, omp_get_thread_num());
        return code;
    }
#endif
    claim_job local, *j = &local;
#ifdef HAVE_PTHREADS
    if (nt > 1) {
        j = (claim_job *)malloc(sizeof *j);
        if (!j) { j = &local; nt = 1; }
    }
#else
    nt = 1;
#endif
    j->fn = fn;
    j->ctx = ctx;
    j->P = P;
    j->next = 0;
    j->done = 0;
    j->code = 0;
    j->refs = 1;
    for (int t = 0; t < MAX_THREADS; t++) j->tids[t] = t;
#ifdef HAVE_PTHREADS
    if (nt > 1) {
        pthread_attr_t attr;
        int attr_ok = pthread_attr_init(&attr) == 0 && pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0;
        for (int t = 1; attr_ok && t < nt; t++) {
            pthread_t th;
            __atomic_add_fetch(&j->refs, 1, __ATOMIC_ACQ_REL);
            if (pthread_create(&th, &attr, claim_main, &j->tids[t]) != 0) {
                __atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL);
                break;
            }
        }
        if (attr_ok) pthread_attr_destroy(&attr);
    }
#endif
    claim_loop(j, 0);
#ifdef HAVE_PTHREADS
    while (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < P) sched_yield(); /* problems claimed by helpers */
    const int code = __atomic_load_n(&j->code, __ATOMIC_ACQUIRE);
    if (j != &local && __atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) == 0) free(j);
    return code;
#else
    return j->code;
#endif
}

/* per-thread scratch of wn entries of sz bytes into *work (the caller frees it), then fn over the
 * problems [0, P) on nt threads with the GIL released; -1 with MemoryError set when the scratch
 * cannot be allocated */
static int run_with_scratch(int (*fn)(void *, Py_ssize_t, Py_ssize_t, int), void *ctx, char **work, Py_ssize_t P,
                            int nt, Py_ssize_t wn, Py_ssize_t sz)
{
    *work = PyMem_RawMalloc((size_t)nt * (size_t)wn * (size_t)sz);
    if (!*work) {
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    run_split(fn, ctx, P, nt);
    Py_END_ALLOW_THREADS
    return 0;
}

/* ---- kkt_forward ------------------------------------------------------------------------- */
typedef struct {
    const void *K, *S, *E, *h, *c0, *off;
    void *alpha, *rho, *Lst, *x1st, *dst;
    Py_ssize_t J, n;
    double ridge, C;
    int dbl;
    Py_ssize_t *idx; /* (2 n + 1) per thread */
    char *x2;        /* KKT_FWD_SCRATCH(n) entries per thread */
} kfwd_ctx;

/* per-thread scratch of kkt_fwd (two right-hand sides of n + 8, the Cholesky panels: VL^2 np (np + 1) / 2
 * <= (n + 8) (n + 16) / 2 with np = ceil(m / VL), m <= n, VL <= 8) and of kkt_bwd (y: n + 1, alpha_S or the
 * margin mask: n + 8), in entries */
#define KKT_FWD_SCRATCH(n) (2 * ((size_t)(n) + 8) + ((size_t)(n) + 8) * ((size_t)(n) + 16) / 2 + 8)
#define KKT_BWD_SCRATCH(n) (2 * (size_t)(n) + 9)

static int kfwd_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    kfwd_ctx *k = (kfwd_ctx *)c;
    Py_ssize_t *idx = k->idx + (size_t)tid * (size_t)(2 * k->n + 1);
    if (k->dbl)
        return kkt_fwd_f64(k->K, k->S, k->E, k->C, k->h, k->c0, k->alpha, k->rho, k->Lst, k->x1st, k->dst, k->off,
                           p0, p1, k->J, k->n, k->ridge, idx, (double *)k->x2 + (size_t)tid * KKT_FWD_SCRATCH(k->n));
    return kkt_fwd_f32(k->K, k->S, k->E, k->C, k->h, k->c0, k->alpha, k->rho, k->Lst, k->x1st, k->dst, k->off,
                       p0, p1, k->J, k->n, k->ridge, idx, (float *)k->x2 + (size_t)tid * KKT_FWD_SCRATCH(k->n));
}

static PyObject *kkt_forward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    double ridge;
    int dbl;
    long nthreads;
    double Cbox;
    Py_buffer bK, bS, bE, bh, bc, ba, br, bL, bx, bd, bo;
    if (!PyArg_ParseTuple(args, "y*y*y*dy*y*w*w*w*w*w*y*nnndpl", &bK, &bS, &bE, &Cbox, &bh, &bc, &ba, &br, &bL, &bx,
                          &bd, &bo, &P, &J, &n, &ridge, &dbl, &nthreads))
        return NULL;
    PyObject *res = NULL;
    kfwd_ctx k = {0};
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    const int emode = bE.len > 0; /* E given: h and c0 are formed in the loop (empty buffers) */
    if (P < 0 || J < 0 || n < 0 || bK.len < P * n * n * sz || bS.len < P * J * n
        || (emode ? bE.len < P * J * n || !(Cbox > 0.0) : bh.len < P * J * n * sz || bc.len < P * J * sz)
        || ba.len < P * J * n * sz || br.len < P * J * sz || bd.len < P * J * sz
        || bo.len < 2 * P * J * (Py_ssize_t)sizeof(Py_ssize_t)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.kkt_forward: inconsistent sizes");
        goto done;
    }
    const int nt = clamp_threads(nthreads, P);
    k = (kfwd_ctx){bK.buf, bS.buf, emode ? bE.buf : NULL, emode ? NULL : bh.buf, emode ? NULL : bc.buf, bo.buf,
                   ba.buf, br.buf, bL.buf, bx.buf, bd.buf, J, n, ridge, Cbox, dbl, NULL, NULL};
    k.x2 = PyMem_RawMalloc((size_t)nt * KKT_FWD_SCRATCH(n) * (size_t)sz);
    k.idx = PyMem_RawMalloc((size_t)nt * (size_t)(2 * n + 1) * sizeof(Py_ssize_t));
    if (!k.x2 || !k.idx) { PyErr_NoMemory(); goto done; }
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = run_split(kfwd_range, &k, P, nt);
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(code);
done:
    PyMem_RawFree(k.x2);
    PyMem_RawFree(k.idx);
    PyBuffer_Release(&bK); PyBuffer_Release(&bS); PyBuffer_Release(&bE); PyBuffer_Release(&bh);
    PyBuffer_Release(&bc); PyBuffer_Release(&ba); PyBuffer_Release(&br); PyBuffer_Release(&bL);
    PyBuffer_Release(&bx); PyBuffer_Release(&bd); PyBuffer_Release(&bo);
    return res;
}

/* ---- kkt_backward ------------------------------------------------------------------------ */
typedef struct {
    const void *S, *E, *alpha, *ga, *grho, *Lst, *x1st, *dst, *off;
    void *gh, *gc0, *gK;
    Py_ssize_t J, n;
    double C;
    int dbl;
    Py_ssize_t *idx;
    char *y;         /* KKT_BWD_SCRATCH(n) entries per thread */
} kbwd_ctx;

static int kbwd_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    kbwd_ctx *k = (kbwd_ctx *)c;
    Py_ssize_t *idx = k->idx + (size_t)tid * (size_t)(2 * k->n + 1);
    if (k->dbl)
        kkt_bwd_f64(k->S, k->E, k->C, k->alpha, k->ga, k->grho, k->Lst, k->x1st, k->dst, k->off, k->gh, k->gc0, k->gK,
                    p0, p1, k->J, k->n, idx, (double *)k->y + (size_t)tid * KKT_BWD_SCRATCH(k->n));
    else
        kkt_bwd_f32(k->S, k->E, k->C, k->alpha, k->ga, k->grho, k->Lst, k->x1st, k->dst, k->off, k->gh, k->gc0, k->gK,
                    p0, p1, k->J, k->n, idx, (float *)k->y + (size_t)tid * KKT_BWD_SCRATCH(k->n));
    return 0;
}

static PyObject *kkt_backward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    int dbl;
    long nthreads;
    PyObject *gKobj;
    double Cbox;
    Py_buffer bS, bE, ba, bg, bgr, bL, bx, bd, bo, bgh, bgc, bgK;
    memset(&bgK, 0, sizeof bgK);
    if (!PyArg_ParseTuple(args, "y*y*dy*y*y*y*y*y*y*w*w*Onnnpl", &bS, &bE, &Cbox, &ba, &bg, &bgr, &bL, &bx, &bd, &bo,
                          &bgh, &bgc, &gKobj, &P, &J, &n, &dbl, &nthreads))
        return NULL;
    PyObject *res = NULL;
    kbwd_ctx k = {0};
    int haveK = gKobj != Py_None;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (haveK && PyObject_GetBuffer(gKobj, &bgK, PyBUF_WRITABLE) < 0) { haveK = 0; goto done; }
    const int emode = bE.len > 0; /* E given: g_K takes the right-hand side's part; g_h, g_c0 not written */
    if (P < 0 || J < 0 || n < 0 || bS.len < P * J * n || ba.len < P * J * n * sz || bg.len < P * J * n * sz
        || bgr.len < P * J * sz || bd.len < P * J * sz
        || (emode ? bE.len < P * J * n || !haveK : bgh.len < P * J * n * sz || bgc.len < P * J * sz)
        || bo.len < 2 * P * J * (Py_ssize_t)sizeof(Py_ssize_t) || (haveK && bgK.len < P * n * n * sz)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.kkt_backward: inconsistent sizes");
        goto done;
    }
    const int nt = clamp_threads(nthreads, P);
    k = (kbwd_ctx){bS.buf, emode ? bE.buf : NULL, ba.buf, bg.buf, bgr.buf, bL.buf, bx.buf, bd.buf, bo.buf,
                   emode ? NULL : bgh.buf, emode ? NULL : bgc.buf, haveK ? bgK.buf : NULL, J, n, Cbox, dbl, NULL, NULL};
    k.y = PyMem_RawMalloc((size_t)nt * KKT_BWD_SCRATCH(n) * (size_t)sz);
    k.idx = PyMem_RawMalloc((size_t)nt * (size_t)(2 * n + 1) * sizeof(Py_ssize_t));
    if (!k.y || !k.idx) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    run_split(kbwd_range, &k, P, nt);
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_RawFree(k.y);
    PyMem_RawFree(k.idx);
    PyBuffer_Release(&bS); PyBuffer_Release(&bE); PyBuffer_Release(&ba); PyBuffer_Release(&bg);
    PyBuffer_Release(&bgr); PyBuffer_Release(&bL); PyBuffer_Release(&bx); PyBuffer_Release(&bd);
    PyBuffer_Release(&bo); PyBuffer_Release(&bgh); PyBuffer_Release(&bgc);
    if (haveK) PyBuffer_Release(&bgK);
    return res;
}

/* ---- fista / fista_segment ---------------------------------------------------------------- */
typedef struct {
    const void *K, *mask, *invL;
    void *Lout, *out;
    Py_ssize_t J, n;
    double C;
    long k0, k1;
    int dbl, stop, sparse;
    char *work;      /* (n * n + 8 n + 1) entries per thread */
    Py_ssize_t *idx; /* (2 n + 1) per thread */
    void *sa, *sKa, *sz, *stau, *sres; /* the state of a segmented run (NULL: one-shot) */
    int *sint;
} fista_ctx;

static int fista_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    fista_ctx *f = (fista_ctx *)c;
    const size_t wn = (size_t)(f->n * f->n + 8 * f->n + 1);
    Py_ssize_t *idx = f->idx + (size_t)tid * (size_t)(2 * f->n + 1);
    if (f->dbl) {
        const fista_state_f64 st = {f->sa, f->sKa, f->sz, f->stau, f->sres, f->sint};
        fista_run_f64(f->K, f->mask, f->invL, f->Lout, f->out, p0, p1, f->J, f->n, f->C, f->k0, f->k1, f->stop,
                      f->sparse, (double *)f->work + (size_t)tid * wn, idx, f->sa ? &st : NULL);
    } else {
        const fista_state_f32 st = {f->sa, f->sKa, f->sz, f->stau, f->sres, f->sint};
        fista_run_f32(f->K, f->mask, f->invL, f->Lout, f->out, p0, p1, f->J, f->n, (float)f->C, f->k0, f->k1,
                      f->stop, f->sparse, (float *)f->work + (size_t)tid * wn, idx, f->sa ? &st : NULL);
    }
    return 0;
}

static int nonneg_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    (void)tid;
    fista_ctx *f = (fista_ctx *)c;
    return f->dbl ? !nonnegative_f64(f->K, p0, p1, f->n) : !nonnegative_f32(f->K, p0, p1, f->n);
}

/* runs f over the batch (the non-negativity check first when L is computed here at the start);
 * returns the code (1: K has a negative entry, nothing done) or -1 with an exception set */
static int fista_call(fista_ctx *f, Py_ssize_t P, long nthreads, int own_L, Py_ssize_t sz)
{
    const Py_ssize_t n = f->n;
    const int nt = clamp_threads(nthreads, P);
    f->work = PyMem_RawMalloc((size_t)nt * (size_t)(n * n + 8 * n + 1) * (size_t)sz);
    f->idx = PyMem_RawMalloc((size_t)nt * (size_t)(2 * n + 1) * sizeof(Py_ssize_t));
    int code = 0;
    if (!f->work || !f->idx) {
        PyErr_NoMemory();
        code = -1;
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (own_L && f->k0 == 0) code = run_split(nonneg_range, f, P, nt);
        if (!code) run_split(fista_range, f, P, nt);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(f->work);
    PyMem_RawFree(f->idx);
    return code;
}

static PyObject *fista(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    double C;
    long iters, nthreads;
    int dbl, stop;
    int own_L, sparse = 1;
    Py_buffer bK, bm, bL, bo;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nnndlpplp|p", &bK, &bm, &bL, &bo, &P, &J, &n, &C, &iters, &dbl, &stop,
                          &nthreads, &own_L, &sparse))
        return NULL;
    PyObject *res = NULL;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (P < 0 || J < 0 || n < 0 || !(C > 0.0) || iters < 0 || bK.len < P * n * n * sz || bm.len < P * J * n
        || bL.len < P * J * sz || bo.len < P * J * n * sz) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.fista: inconsistent sizes or parameters");
        goto done;
    }
    fista_ctx f = {bK.buf, bm.buf, own_L ? NULL : bL.buf, own_L ? bL.buf : NULL, bo.buf, J, n, C, 0, iters, dbl, stop,
                   sparse, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const int code = fista_call(&f, P, nthreads, own_L, sz);
    if (code >= 0) res = PyLong_FromLong(code);
done:
    PyBuffer_Release(&bK); PyBuffer_Release(&bm); PyBuffer_Release(&bL); PyBuffer_Release(&bo);
    return res;
}

static PyObject *fista_segment(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, J, n;
    double C;
    long k0, k1, nthreads;
    int dbl, stop, own_L, sparse;
    Py_buffer bK, bm, bL, bo, ba, bKa, bz, bt, br, bi;
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*w*w*w*w*w*nnndllpplpp", &bK, &bm, &bL, &bo, &ba, &bKa, &bz, &bt, &br, &bi,
                          &P, &J, &n, &C, &k0, &k1, &dbl, &stop, &nthreads, &own_L, &sparse))
        return NULL;
    PyObject *res = NULL;
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    const Py_ssize_t pjn = P * J * n * sz, pj = P * J * sz;
    if (P < 0 || J < 0 || n < 0 || !(C > 0.0) || k0 < 0 || k1 < k0 || bK.len < P * n * n * sz || bm.len < P * J * n
        || bL.len < pj || bo.len < pjn || ba.len < pjn || bKa.len < pjn || bz.len < pjn || bt.len < pj
        || br.len < pj || bi.len < P * J * 2 * (Py_ssize_t)sizeof(int)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.fista_segment: inconsistent sizes or parameters");
        goto done;
    }
    fista_ctx f = {bK.buf, bm.buf, own_L ? NULL : bL.buf, own_L ? bL.buf : NULL, bo.buf, J, n, C, k0, k1, dbl, stop,
                   sparse, NULL, NULL, ba.buf, bKa.buf, bz.buf, bt.buf, br.buf, (int *)bi.buf};
    const int code = fista_call(&f, P, nthreads, own_L, sz);
    if (code >= 0) res = PyLong_FromLong(code);
done:
    PyBuffer_Release(&bK); PyBuffer_Release(&bm); PyBuffer_Release(&bL); PyBuffer_Release(&bo);
    PyBuffer_Release(&ba); PyBuffer_Release(&bKa); PyBuffer_Release(&bz); PyBuffer_Release(&bt);
    PyBuffer_Release(&br); PyBuffer_Release(&bi);
    return res;
}

/* ---- readout_forward / readout_backward ------------------------------------------------ */
typedef struct {
    const void *q, *k, *v, *gate, *w, *pz, *gy;
    void *y, *wout, *pzout, *dq, *dk, *dv, *dgate;
    Py_ssize_t nt, d, dv_, nc, chunk, wn;
    double scale;
    int dbl;
    char *work; /* wn entries per thread */
} rd_ctx;

static void rd_sizes(rd_ctx *r, Py_ssize_t nt, Py_ssize_t d, Py_ssize_t dv, Py_ssize_t nc, Py_ssize_t chunk,
                     double scale, int dbl)
{
    r->nt = nt; r->d = d; r->dv_ = dv; r->nc = nc; r->chunk = chunk; r->scale = scale; r->dbl = dbl;
}

static int rfwd_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    rd_ctx *r = (rd_ctx *)c;
    if (r->dbl)
        readout_fwd_f64(r->q, r->k, r->v, r->gate, r->y, r->wout, r->pzout, p0, p1, r->nt, r->d, r->dv_, r->nc,
                        r->chunk, r->scale, (double *)r->work + (size_t)tid * (size_t)r->wn);
    else
        readout_fwd_f32(r->q, r->k, r->v, r->gate, r->y, r->wout, r->pzout, p0, p1, r->nt, r->d, r->dv_, r->nc,
                        r->chunk, (float)r->scale, (float *)r->work + (size_t)tid * (size_t)r->wn);
    return 0;
}

static int rbwd_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    rd_ctx *r = (rd_ctx *)c;
    if (r->dbl)
        readout_bwd_f64(r->q, r->k, r->v, r->w, r->pz, r->gy, r->dq, r->dk, r->dv, r->dgate, p0, p1, r->nt, r->d,
                        r->dv_, r->nc, r->chunk, r->scale, (double *)r->work + (size_t)tid * (size_t)r->wn);
    else
        readout_bwd_f32(r->q, r->k, r->v, r->w, r->pz, r->gy, r->dq, r->dk, r->dv, r->dgate, p0, p1, r->nt, r->d,
                        r->dv_, r->nc, r->chunk, (float)r->scale, (float *)r->work + (size_t)tid * (size_t)r->wn);
    return 0;
}

/* shapes shared by both directions; 0 when consistent */
static int readout_sizes_bad(Py_ssize_t P, Py_ssize_t nt, Py_ssize_t d, Py_ssize_t dv, Py_ssize_t nc,
                             Py_ssize_t chunk, double scale)
{
    return P < 0 || nt < 0 || d < 1 || dv < 1 || chunk < 1 || nc != (nt + chunk - 1) / chunk || !(scale > 0.0);
}

static PyObject *readout_forward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, nt, d, dv, nc, chunk;
    double scale;
    int dbl;
    long nthreads;
    Py_buffer bq, bk, bv, bg, by, bw, bz;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*nnnnnndpl", &bq, &bk, &bv, &bg, &by, &bw, &bz, &P, &nt, &d, &dv,
                          &nc, &chunk, &scale, &dbl, &nthreads))
        return NULL;
    PyObject *res = NULL;
    rd_ctx r = {0};
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    const int gz = bz.len > 0; /* pz wanted (the gate needs a gradient) */
    if (readout_sizes_bad(P, nt, d, dv, nc, chunk, scale) || bq.len < P * nt * d * sz || bk.len < P * nt * d * sz
        || bv.len < P * nt * dv * sz || bg.len < P * nc * nt * sz || by.len < P * nt * dv * sz
        || bw.len < P * nt * nt * sz || (gz && bz.len < P * nt * nt * sz)) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.readout_forward: inconsistent sizes");
        goto done;
    }
    const int nt_ = clamp_threads(nthreads, P);
    r.q = bq.buf; r.k = bk.buf; r.v = bv.buf; r.gate = bg.buf; r.y = by.buf; r.wout = bw.buf;
    r.pzout = gz ? bz.buf : NULL;
    rd_sizes(&r, nt, d, dv, nc, chunk, scale, dbl);
    r.wn = d * nt + nt + d;
    if (P > 0 && run_with_scratch(rfwd_range, &r, &r.work, P, nt_, r.wn, sz)) goto done;
    res = Py_NewRef(Py_None);
done:
    PyMem_RawFree(r.work);
    PyBuffer_Release(&bq); PyBuffer_Release(&bk); PyBuffer_Release(&bv); PyBuffer_Release(&bg);
    PyBuffer_Release(&by); PyBuffer_Release(&bw); PyBuffer_Release(&bz);
    return res;
}

static PyObject *readout_backward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, nt, d, dv, nc, chunk;
    double scale;
    int dbl;
    long nthreads;
    Py_buffer bq, bk, bv, bw, bz, bgy, bdq, bdk, bdv, bdg;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*w*w*w*w*nnnnnndpl", &bq, &bk, &bv, &bw, &bz, &bgy, &bdq, &bdk, &bdv,
                          &bdg, &P, &nt, &d, &dv, &nc, &chunk, &scale, &dbl, &nthreads))
        return NULL;
    PyObject *res = NULL;
    rd_ctx r = {0};
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    const int gz = bdg.len > 0; /* dgate wanted: pz given */
    if (readout_sizes_bad(P, nt, d, dv, nc, chunk, scale) || bq.len < P * nt * d * sz || bk.len < P * nt * d * sz
        || bv.len < P * nt * dv * sz || bw.len < P * nt * nt * sz || bgy.len < P * nt * dv * sz
        || bdq.len < P * nt * d * sz || bdk.len < P * nt * d * sz || bdv.len < P * nt * dv * sz
        || (gz && (bz.len < P * nt * nt * sz || bdg.len < P * nc * nt * sz))) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.readout_backward: inconsistent sizes");
        goto done;
    }
    const int nt_ = clamp_threads(nthreads, P);
    r.q = bq.buf; r.k = bk.buf; r.v = bv.buf; r.w = bw.buf; r.pz = gz ? bz.buf : NULL; r.gy = bgy.buf;
    r.dq = bdq.buf; r.dk = bdk.buf; r.dv = bdv.buf; r.dgate = gz ? bdg.buf : NULL;
    rd_sizes(&r, nt, d, dv, nc, chunk, scale, dbl);
    r.wn = dv * nt + nt * nt + nt * d;
    if (P > 0 && run_with_scratch(rbwd_range, &r, &r.work, P, nt_, r.wn, sz)) goto done;
    res = Py_NewRef(Py_None);
done:
    PyMem_RawFree(r.work);
    PyBuffer_Release(&bq); PyBuffer_Release(&bk); PyBuffer_Release(&bv); PyBuffer_Release(&bw);
    PyBuffer_Release(&bz); PyBuffer_Release(&bgy); PyBuffer_Release(&bdq); PyBuffer_Release(&bdk);
    PyBuffer_Release(&bdv); PyBuffer_Release(&bdg);
    return res;
}

/* ---- gram_backward ------------------------------------------------------------------------ */
typedef struct {
    const void *X, *K, *keep, *gK;
    void *dX;
    Py_ssize_t n, d, wn;
    double nis2;
    int dbl;
    char *work;
} gr_ctx;

static int gbwd_range(void *c, Py_ssize_t p0, Py_ssize_t p1, int tid)
{
    gr_ctx *g = (gr_ctx *)c;
    if (g->dbl)
        gram_bwd_f64(g->X, g->K, g->keep, g->gK, g->dX, p0, p1, g->n, g->d, g->nis2,
                     (double *)g->work + (size_t)tid * (size_t)g->wn);
    else
        gram_bwd_f32(g->X, g->K, g->keep, g->gK, g->dX, p0, p1, g->n, g->d, (float)g->nis2,
                     (float *)g->work + (size_t)tid * (size_t)g->wn);
    return 0;
}

static PyObject *gram_backward(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t P, n, d;
    double sigma;
    int dbl;
    long nthreads;
    Py_buffer bX, bK, bk, bg, bd;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnndpl", &bX, &bK, &bk, &bg, &bd, &P, &n, &d, &sigma, &dbl, &nthreads))
        return NULL;
    PyObject *res = NULL;
    gr_ctx g = {0};
    const Py_ssize_t sz = dbl ? (Py_ssize_t)sizeof(double) : (Py_ssize_t)sizeof(float);
    if (P < 0 || n < 0 || d < 1 || !(sigma > 0.0) || bX.len < P * n * d * sz || bK.len < P * n * n * sz
        || bk.len < P * n * n || bg.len < P * n * n * sz || bd.len < P * n * d * sz) {
        PyErr_SetString(PyExc_ValueError, "_batchfast.gram_backward: inconsistent sizes");
        goto done;
    }
    const int nt = clamp_threads(nthreads, P);
    g.X = bX.buf; g.K = bK.buf; g.keep = bk.buf; g.gK = bg.buf; g.dX = bd.buf; g.n = n; g.d = d;
    g.nis2 = -1.0 / (sigma * sigma); g.dbl = dbl;
    g.wn = n * n + n + d;
    if (P > 0 && n > 0) {
        if (run_with_scratch(gbwd_range, &g, &g.work, P, nt, g.wn, sz)) goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_RawFree(g.work);
    PyBuffer_Release(&bX); PyBuffer_Release(&bK); PyBuffer_Release(&bk); PyBuffer_Release(&bg); PyBuffer_Release(&bd);
    return res;
}

static PyMethodDef methods[] = {
    {"fista", fista, METH_VARARGS,
     "fista(K, mask, lip, out, P, J, n, C, iters, is_double, stop_when_fixed, nthreads, own_lipschitz[, sparse]) -> 0 or 1. "
     "K (P, n, n), lip (P, J) and out (P, J, n) float32 or float64 (is_double), mask (P, J, n) uint8, all "
     "C-contiguous; out is overwritten with the FISTA estimate; lip: the steps 1/L (in), or with own_lipschitz "
     "the bounds L computed here (out; returns 1 and does nothing when K has a negative entry); "
     "stop_when_fixed: leave a problem once its iterate is a fixed point bit for bit (the result is the same); "
     "nthreads: Grams split over this many threads (the same result); sparse (default true): K a' over the "
     "non-zero entries of the iterate only when the block is finite (the same result). "
     "See sv_core/batched/fista.py."},
    {"fista_segment", fista_segment, METH_VARARGS,
     "fista_segment(K, mask, lip, out, a, Ka, z, tau, residual, ints, P, J, n, C, k0, k1, is_double, "
     "stop_when_fixed, nthreads, own_lipschitz, sparse) -> 0 or 1. The iterations k0 <= k < k1 of fista, resumable: "
     "a, Ka, z (P, J, n), tau, residual (P, J) of K's dtype and ints (P, J, 2) int32 hold each problem's state "
     "(k0 = 0: started here); after the segment, out holds the estimate and residual the projected-gradient "
     "residual of the reference's check. own_lipschitz: lip (P, J) holds L (computed here when k0 = 0, else "
     "read back); else the steps 1/L. See sv_core/batched/fista.py."},
    {"kkt_forward", kkt_forward, METH_VARARGS,
     "kkt_forward(K, S, E, C, h, c0, alpha, rho, Lstore, x1store, dstore, offsets, P, J, n, ridge, is_double, "
     "nthreads) -> 0 or 1 (a factorisation failed). E empty: h and c0 given; E (P, J, n) uint8: h, c0 and alpha_E "
     "formed here (h, c0 empty). See sv_core/batched/kkt.py."},
    {"kkt_backward", kkt_backward, METH_VARARGS,
     "kkt_backward(S, E, C, alpha, g_alpha, g_rho, Lstore, x1store, dstore, offsets, g_h, g_c0, g_K_or_None, P, J, "
     "n, is_double, nthreads) -> None. E as in kkt_forward (then g_K is required, g_h and g_c0 are not written). "
     "See sv_core/batched/kkt.py."},
    {"readout_forward", readout_forward, METH_VARARGS,
     "readout_forward(q, k, v, gate, y, w, pz, P, T, d, dv, n_chunks, chunk, scale, is_double, nthreads) -> None. "
     "q, k (P, T, d), v (P, T, dv), gate (P, n_chunks, T) in; y (P, T, dv), w (P, T, T) (rows on j <= t) and pz "
     "(P, T, T) (prefix columns; empty: not formed) out; all C-contiguous. See sv_core/batched/readout.py."},
    {"readout_backward", readout_backward, METH_VARARGS,
     "readout_backward(q, k, v, w, pz, g_y, g_q, g_k, g_v, g_gate, P, T, d, dv, n_chunks, chunk, scale, is_double, "
     "nthreads) -> None. g_q, g_k, g_v and g_gate (P, n_chunks, T; empty: not formed, pz then unused) overwritten. "
     "See sv_core/batched/readout.py."},
    {"gram_backward", gram_backward, METH_VARARGS,
     "gram_backward(X, K, keep, g_K, g_X, P, n, d, sigma, is_double, nthreads) -> None. X (P, n, d), K and g_K "
     "(P, n, n), keep (P, n, n) bool / uint8 (D >= 0) of the forward; g_X (P, n, d) overwritten. See "
     "sv_core/batched/common.py (rbf_gram)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchfast",
                                    "Compiled loops of the batched SVDD gate (FISTA, ridged KKT solve) and the hybrid readout.",
                                    -1, methods, NULL, NULL, NULL, NULL};

/* bumped whenever a function's arguments or return value change: a stale build is not used */
#define BATCHFAST_ABI 5

PyMODINIT_FUNC PyInit__batchfast(void)
{
    PyObject *mod = PyModule_Create(&module);
#ifdef _OPENMP
    const int openmp = 1;
#else
    const int openmp = 0;
#endif
    sv_expf_ok = sv_expf_selfcheck(); /* the readout's eight-lane expf, where it equals expf (_expf_body.h) */
    if (mod && (PyModule_AddIntConstant(mod, "ABI", BATCHFAST_ABI) < 0
                || PyModule_AddIntConstant(mod, "OPENMP", openmp) < 0
                || PyModule_AddIntConstant(mod, "FAST_EXPF", sv_expf_ok) < 0)) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
