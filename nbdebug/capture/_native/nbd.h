/* Shared by the kernel's sources (stats.c, norms.c, and pyext.c for the CPython module): built by native_build.py.
 *
 * On x86-64 Linux with gcc the hot functions are cloned for x86-64-v4 (AVX-512), v3 (AVX2, FMA)
 * and the baseline, picked at load time (never -march=native into a shared cache); gcc < 11 (no
 * level names) builds with -DNBD_AVX2_ONLY, a toolchain without ifunc with -DNBD_NO_CLONES.
 */
#ifndef NBD_H
#define NBD_H

#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(NBD_NO_CLONES)
#if defined(NBD_AVX2_ONLY)
#define NBD_CLONES __attribute__((target_clones("avx2", "default")))
#define NBD_VARIANT "clones avx2/default"
#else
#define NBD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define NBD_VARIANT "clones x86-64-v4/v3/default"
#endif
#else
#define NBD_CLONES
#define NBD_VARIANT "no clones"
#endif
#define NBD_INLINE static inline __attribute__((always_inline))
#define NBD_API __attribute__((visibility("default")))

/* the entry points (stats.c, norms.c), for pyext.c's CPython module */
NBD_API int nbd_abi(void);
NBD_API int nbd_stats(const float *x, int64_t n, int64_t C, int64_t inner, int64_t flags, double *scratch);
NBD_API int nbd_stats_sat(const float *x, int64_t n, int64_t C, int64_t inner, int64_t flags, double lo, double hi,
                          double *scratch);
NBD_API void nbd_sq_norms(const int64_t *ptrs, const int64_t *sizes, int64_t k, double *out);
NBD_API void nbd_seg_norms(const float *before, const int64_t *ptrs, const int64_t *sizes, int64_t k,
                           double *sq_before, double *sq_diffs);

#endif
