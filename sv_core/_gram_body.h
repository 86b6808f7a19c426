/* Backward of the batch's RBF Gram matrices (sv_core.batched.common.rbf_gram; the forward stays the
 * batched torch operations) for one floating type: included by sv_core/_batchfast.c after
 * _readout_body.h (uses its wsum_rows and _batchfast_body.h's sum8).
 *
 * Key set p (n keys x_i of dimension d), K and keep = (D >= 0) of the forward, upstream gK:
 *   a_ij = keep_ij ? (gK_ij K_ij) * (-1 / sigma^2) : 0,   G_ij = a_ij + a_ji
 *   dX_i = 2 (sum_j G_ij x_i - sum_j G_ij x_j)
 * (the reference's G with the same roundings; its 2 (rowsum(G) X - G X) with the row sum in
 * sum8's order and sum_j G_ij x_j in wsum_rows's). The same loop for every problem whatever the
 * split. */

/* problems [p0, p1): X (P, n, d), K (P, n, n), keep (P, n, n) bytes, gK (P, n, n) -> dX (P, n, d);
 * work: n * n + n + d */
MULTIVERSION static void NAME(gram_bwd)(const T *X, const T *K, const unsigned char *keep, const T *gK, T *dX,
                                        Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t n, Py_ssize_t d, T nis2, T *work)
{
    T *restrict A = work, *restrict G = work + n * n, *restrict acc = G + n;
    for (Py_ssize_t p = p0; p < p1; p++) {
        const T *restrict x = X + p * n * d, *restrict Kp = K + p * n * n, *restrict gp = gK + p * n * n;
        const unsigned char *restrict kp = keep + p * n * n;
        T *restrict dx = dX + p * n * d;
        const Py_ssize_t nn = n * n;
        Py_ssize_t e = 0;
        for (; e + VL <= nn; e += VL) { /* lane-wise the scalar loop below */
            VT gv, kv;
            VIT m;
            memcpy(&gv, gp + e, sizeof gv);
            memcpy(&kv, Kp + e, sizeof kv);
            for (int l = 0; l < VL; l++) m[l] = kp[e + l] ? -1 : 0;
            const VT a = (gv * kv) * nis2;
            const VT r = (VT)((VIT)a & m); /* a where kept, +0 elsewhere */
            memcpy(A + e, &r, sizeof r);
        }
        for (; e < nn; e++) {
            const T a = (gp[e] * Kp[e]) * nis2;
            A[e] = kp[e] ? a : (T)0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            for (Py_ssize_t j = 0; j < n; j++) G[j] = A[i * n + j] + A[j * n + i];
            const T s = NAME(sum8)(G, n);
            NAME(wsum_rows)(G, x, n, d, acc);
            for (Py_ssize_t l = 0; l < d; l++) dx[i * d + l] = (T)2 * (s * x[i * d + l] - acc[l]);
        }
    }
}
