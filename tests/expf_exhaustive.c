/* Exhaustive check of sv_core/_expf_body.h against the platform's expf: every one of the 2^32 float
 * bit patterns, eight lanes at a time through sv_expf8 (and the shifted row form on all of them with
 * m = 0), compared bit for bit. Build and run (x86-64, GCC or Clang; about a minute):
 *
 *     cc -O2 -ffp-contract=off -fopenmp tests/expf_exhaustive.c -o /tmp/expf_exhaustive -lm && /tmp/expf_exhaustive
 *
 * Prints the number of differing inputs (0 expected) and exits 1 on any. */
#include <stdio.h>
#include "../sv_core/_expf_body.h"

#ifdef SV_HAVE_VEXPF
/* out[i] = sv_expf8 of in's eight-lane blocks, n a multiple of 8 */
__attribute__((target("avx2,fma"))) static void lanes(const float *in, float *out, int n)
{
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, sv_expf8(_mm256_loadu_ps(in + i)));
}
#endif

int main(void)
{
#ifdef SV_HAVE_VEXPF
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("no AVX2 + FMA on this CPU: nothing to check\n");
        return 0;
    }
    unsigned long long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (long long blk = 0; blk < (1LL << 32) / 4096; blk++) {
        float in[4096], a[4096], b[4096];
        for (int i = 0; i < 4096; i++) {
            const uint32_t u = (uint32_t)(blk * 4096 + i);
            memcpy(&in[i], &u, 4);
        }
        lanes(in, a, 4096);
        memcpy(b, in, sizeof b);
        sv_expf_shifted(b, 0.0f, 4096 - (int)(blk % 8)); /* and a tail of 0..7 lanes */
        for (int i = 0; i < 4096; i++) {
            const float e = expf(in[i]);
            if (memcmp(&e, &a[i], 4) != 0) {
                bad++;
                if (bad < 10) printf("differs at 0x%08x: %a vs %a\n", (unsigned)(blk * 4096 + i), e, a[i]);
            }
            if (i < 4096 - (int)(blk % 8)) {
                const float e0 = expf(in[i] - 0.0f);
                if (memcmp(&e0, &b[i], 4) != 0) bad++;
            }
        }
    }
    printf("selfcheck %d; inputs differing from expf: %llu of 2^32\n", sv_expf_selfcheck(), bad);
    return bad != 0;
#else
    printf("not x86-64 GCC/Clang: nothing to check\n");
    return 0;
#endif
}
