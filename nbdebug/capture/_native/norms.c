/* Sums of squares for the parameter-gradient norms and the optimizer watch's update ratios, and the
 * parameter snapshot copy (see nbdebug/capture/native.py: sq_norms, seg_norms, gather).
 *
 * Squares are taken and summed in double lanes (a float32 value squared in double is exact: no
 * overflow of finite values, no underflow of tiny ones), so the only non-finite sums come from
 * NaN/Inf values. A difference a - b is taken in float32, like numpy's subtract of two float32
 * arrays.
 */
#include <stddef.h>
#include <string.h>

#include "nbd.h"

#define NW 32 /* double lanes (4 AVX-512 / 8 AVX2 registers) */

/* Sum of squares of n floats, squared and summed in double lanes. */
NBD_CLONES static double sq_sum(const float *restrict a, int64_t n) {
    double S[NW];
    for (int j = 0; j < NW; j++) S[j] = 0.0;
    int64_t i = 0;
    for (; i + NW <= n; i += NW) {
        for (int j = 0; j < NW; j++) {
            double d = (double)a[i + j];
            S[j] += d * d;
        }
    }
    double r = 0.0;
    for (int j = 0; j < NW; j++) r += S[j];
    for (; i < n; i++) {
        double d = (double)a[i];
        r += d * d;
    }
    return r;
}

/* sq_sum(a) into *sa and the sum of squares of a - b into *sd in one pass over a and b (sq_sum's lanes
 * and order for both sums: the same bits as two separate passes). */
NBD_CLONES static void sq_both(const float *restrict a, const float *restrict b, int64_t n, double *sa, double *sd) {
    double S[NW], D[NW];
    for (int j = 0; j < NW; j++) S[j] = D[j] = 0.0;
    int64_t i = 0;
    for (; i + NW <= n; i += NW) {
        for (int j = 0; j < NW; j++) {
            double x = (double)a[i + j], d = (double)(a[i + j] - b[i + j]);
            S[j] += x * x;
            D[j] += d * d;
        }
    }
    double r = 0.0, q = 0.0;
    for (int j = 0; j < NW; j++) {
        r += S[j];
        q += D[j];
    }
    for (; i < n; i++) {
        double x = (double)a[i], d = (double)(a[i] - b[i]);
        r += x * x;
        q += d * d;
    }
    *sa = r;
    *sd = q;
}

/* out[i] = sum of squares (double) of the float32 array at ptrs[i] with sizes[i] elements. */
NBD_API void nbd_sq_norms(const int64_t *ptrs, const int64_t *sizes, int64_t k, double *out) {
    for (int64_t i = 0; i < k; i++) out[i] = sq_sum((const float *)(intptr_t)ptrs[i], sizes[i]);
}

/* Parameters i = 0..k-1 of sizes[i] elements at ptrs[i], their "before" values consecutive in
 * before[]: sq_before[i] = sum of before_i^2, sq_diff[i] = sum of (before_i - param_i)^2. */
NBD_API void nbd_seg_norms(const float *before, const int64_t *ptrs, const int64_t *sizes, int64_t k,
                           double *sq_before, double *sq_diffs) {
    for (int64_t i = 0; i < k; i++) {
        sq_both(before, (const float *)(intptr_t)ptrs[i], sizes[i], &sq_before[i], &sq_diffs[i]);
        before += sizes[i];
    }
}

/* Copies k float32 arrays (ptrs[i], sizes[i] elements) one after the other into out. */
NBD_API void nbd_gather(const int64_t *ptrs, const int64_t *sizes, int64_t k, float *out) {
    for (int64_t i = 0; i < k; i++) {
        memcpy(out, (const void *)(intptr_t)ptrs[i], (size_t)sizes[i] * sizeof(float));
        out += sizes[i];
    }
}
