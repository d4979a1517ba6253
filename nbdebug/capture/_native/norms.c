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

/* Sum of squares of a - b (diff) or of a, over n floats. */
NBD_INLINE double sq_impl(const float *restrict a, const float *restrict b, int64_t n, const int diff) {
    double S[NW];
    for (int j = 0; j < NW; j++) S[j] = 0.0;
    int64_t i = 0;
    for (; i + NW <= n; i += NW) {
        for (int j = 0; j < NW; j++) {
            double d = diff ? (double)(a[i + j] - b[i + j]) : (double)a[i + j];
            S[j] += d * d;
        }
    }
    double r = 0.0;
    for (int j = 0; j < NW; j++) r += S[j];
    for (; i < n; i++) {
        double d = diff ? (double)(a[i] - b[i]) : (double)a[i];
        r += d * d;
    }
    return r;
}

NBD_CLONES static double sq_sum(const float *a, int64_t n) { return sq_impl(a, NULL, n, 0); }
NBD_CLONES static double sq_diff(const float *a, const float *b, int64_t n) { return sq_impl(a, b, n, 1); }

/* out[i] = sum of squares (double) of the float32 array at ptrs[i] with sizes[i] elements. */
NBD_API void nbd_sq_norms(const int64_t *ptrs, const int64_t *sizes, int64_t k, double *out) {
    for (int64_t i = 0; i < k; i++) out[i] = sq_sum((const float *)(intptr_t)ptrs[i], sizes[i]);
}

/* Parameters i = 0..k-1 of sizes[i] elements at ptrs[i], their "before" values consecutive in
 * before[]: sq_before[i] = sum of before_i^2, sq_diff[i] = sum of (before_i - param_i)^2. */
NBD_API void nbd_seg_norms(const float *before, const int64_t *ptrs, const int64_t *sizes, int64_t k,
                           double *sq_before, double *sq_diffs) {
    for (int64_t i = 0; i < k; i++) {
        sq_before[i] = sq_sum(before, sizes[i]);
        sq_diffs[i] = sq_diff(before, (const float *)(intptr_t)ptrs[i], sizes[i]);
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
