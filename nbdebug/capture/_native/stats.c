/* nbdebug's fused statistics kernel (see nbdebug/capture/native.py, which compiles and loads it).
 *
 * One pass over a float32 tensor gives the sum and the sum of squares (each value converted to
 * double and summed, squared in double, in double lanes: no float32 rounding, overflow or
 * underflow), min, max (NaN-ignoring compares; NaN is reported by the second pass), the count of
 * zeros (x == 0: -0.0 is zero, NaN is not), optionally the saturation count (x <= lo, x >= hi, in
 * float32 like numpy/torch comparisons with a Python float) and optionally the per-unit alive mask
 * (unit = dim 1 of an outer x C x inner memory layout). A second pass runs only when the first
 * one's sums are not finite (a NaN or an Inf is present): exact NaN/Inf counts, and the sums per
 * element in double (the order of the float64 reference).
 *
 * The loops are written over fixed lane arrays so that gcc/clang vectorise them without any
 * fast-math flag (x < m ? x : m is exactly MINPS/MAXPS, NaN-safe); see nbd.h for the clones.
 * Large tensors can be split across POSIX threads (a thread per part, created per call; the parts
 * start on chunk boundaries so the lane grouping, and the sums, do not depend on the units mode).
 * The norms for parameter gradients and the optimizer watch are in norms.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nbd.h"

#define NBD_ABI 3
#define W 32           /* lanes (4 AVX-512 / 8 AVX2 registers of doubles per sum) */
#define CHUNK 4096     /* elements per step of the column-mask mode (L1-resident) */
#define MAX_THREADS 64

typedef struct {
    double sum, sumsq;
    float mn, mx;
    int64_t zeros, sat;
} acc_t;

/* Lane accumulators kept across the calls of one part (a tensor's segments): no horizontal
 * reduction per segment but the zero count's. */
typedef struct {
    double S[W], SS[W];
    float mn[W], mx[W];
    double s, ss;  /* tails */
    float m, M;
    int64_t sat;
} lanes_t;

static void lanes_init(lanes_t *l) {
    for (int j = 0; j < W; j++) {
        l->S[j] = l->SS[j] = 0.0;
        l->mn[j] = INFINITY;
        l->mx[j] = -INFINITY;
    }
    l->s = l->ss = 0.0;
    l->m = INFINITY;
    l->M = -INFINITY;
    l->sat = 0;
}

static void lanes_reduce(const lanes_t *l, acc_t *a, int64_t zeros) {
    double s = l->s, ss = l->ss;
    float m = l->m, M = l->M;
    for (int j = 0; j < W; j++) {
        s += l->S[j];
        ss += l->SS[j];
        m = l->mn[j] < m ? l->mn[j] : m;
        M = l->mx[j] > M ? l->mx[j] : M;
    }
    a->sum = s;
    a->sumsq = ss;
    a->mn = m;
    a->mx = M;
    a->zeros = zeros;
    a->sat = l->sat;
}

static void acc_merge(acc_t *a, const acc_t *b) {
    a->sum += b->sum;
    a->sumsq += b->sumsq;
    a->mn = b->mn < a->mn ? b->mn : a->mn;
    a->mx = b->mx > a->mx ? b->mx : a->mx;
    a->zeros += b->zeros;
    a->sat += b->sat;
}

/* The one pass over n contiguous floats (n < 2^31 so int32 lane counts cannot overflow); returns
 * the number of zeros among them. */
NBD_INLINE int64_t pass(const float *restrict x, int64_t n, lanes_t *restrict l, const int sat, float lo, float hi) {
    double S[W], SS[W];
    float mn[W], mx[W];
    int32_t z[W], e[W];
    for (int j = 0; j < W; j++) {
        S[j] = l->S[j];
        SS[j] = l->SS[j];
        mn[j] = l->mn[j];
        mx[j] = l->mx[j];
        z[j] = e[j] = 0;
    }
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        for (int j = 0; j < W; j++) {
            float v = x[i + j];
            double d = v;
            S[j] += d;
            SS[j] += d * d;
            mn[j] = v < mn[j] ? v : mn[j];
            mx[j] = v > mx[j] ? v : mx[j];
            z[j] += (v == 0.0f);
            if (sat) e[j] += (v <= lo) + (v >= hi);
        }
    }
    int64_t zz = 0, ee = 0;
    for (int j = 0; j < W; j++) {
        l->S[j] = S[j];
        l->SS[j] = SS[j];
        l->mn[j] = mn[j];
        l->mx[j] = mx[j];
        zz += z[j];
        ee += e[j];
    }
    double s = 0.0, ss = 0.0;
    float m = l->m, M = l->M;
    for (; i < n; i++) {
        float v = x[i];
        double d = v;
        s += d;
        ss += d * d;
        m = v < m ? v : m;
        M = v > M ? v : M;
        zz += (v == 0.0f);
        if (sat) ee += (v <= lo) + (v >= hi);
    }
    l->s += s;
    l->ss += ss;
    l->m = m;
    l->M = M;
    l->sat += ee;
    return zz;
}

NBD_CLONES static int64_t pass_plain(const float *x, int64_t n, lanes_t *l) { return pass(x, n, l, 0, 0.0f, 0.0f); }
NBD_CLONES static int64_t pass_sat(const float *x, int64_t n, lanes_t *l, float lo, float hi) { return pass(x, n, l, 1, lo, hi); }

static int64_t run_pass(const float *x, int64_t n, lanes_t *l, int sat, float lo, float hi) {
    const int64_t big = (int64_t)1 << 30;  /* keeps every int32 lane count in range */
    int64_t zeros = 0;
    while (n > 0) {
        int64_t k = n < big ? n : big;
        zeros += sat ? pass_sat(x, k, l, lo, hi) : pass_plain(x, k, l);
        x += k;
        n -= k;
    }
    return zeros;
}

/* mask[pos + j] |= |bits(x[j])| for n elements, wrapping at L (the row length C * inner). */
NBD_CLONES static void or_columns(const float *restrict x, int64_t n, int64_t pos, uint32_t *restrict mask, int64_t L) {
    const uint32_t *b = (const uint32_t *)x;
    while (n > 0) {
        int64_t k = L - pos < n ? L - pos : n;
        uint32_t *m = mask + pos;
        for (int64_t j = 0; j < k; j++) m[j] |= b[j] & 0x7fffffffu;
        b += k;
        n -= k;
        pos = 0;
    }
}

typedef struct {
    const float *x;
    int64_t C, inner, begin, end;  /* elements [begin, end) of this part */
    int mode;                      /* 0 no units, 1 runs of inner elements, 2 column mask */
    int sat;
    float lo, hi;
    uint8_t *alive;                /* mode 1: written as units are found alive (zeroed first) */
    uint32_t *mask;                /* column mode: C * inner words of this part */
    acc_t acc;
} job_t;

/* Whether every word of the column mask is non-zero (then every unit is alive). */
NBD_CLONES static int all_set(const uint32_t *m, int64_t L) {
    uint32_t zero = 0;
    for (int64_t i = 0; i < L; i++) zero |= (m[i] == 0);
    return !zero;
}

/* Whether any of n floats is != 0 (NaN included), stopping at the first block that has one. */
NBD_CLONES static int any_nonzero(const float *x, int64_t n) {
    const uint32_t *b = (const uint32_t *)x;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint32_t any = 0;
        for (int j = 0; j < 64; j++) any |= b[i + j] & 0x7fffffffu;
        if (any) return 1;
    }
    for (; i < n; i++)
        if (b[i] & 0x7fffffffu) return 1;
    return 0;
}

/* One part of the tensor, elements [begin, end): the stats pass chunk by chunk (the same lane
 * grouping whatever the mode, so the sums never depend on whether units were asked for), then
 * per chunk the unit mask: mode 1 scans the runs of units not yet known alive (stopping at their
 * first non-zero), mode 2 ORs the chunk into the column mask (short runs: inner < 16). */
static void *run_job(void *arg) {
    job_t *j = (job_t *)arg;
    lanes_t l;
    lanes_init(&l);
    int64_t zeros = 0;
    if (j->mode == 0) {
        zeros = run_pass(j->x + j->begin, j->end - j->begin, &l, j->sat, j->lo, j->hi);
        lanes_reduce(&l, &j->acc, zeros);
        return NULL;
    }
    const int64_t inner = j->inner, C = j->C, L = C * inner;
    int64_t seen = 0;
    int full = 0;
    for (int64_t p = j->begin; p < j->end; p += CHUNK) {
        int64_t k = j->end - p < CHUNK ? j->end - p : CHUNK;
        int64_t z = run_pass(j->x + p, k, &l, j->sat, j->lo, j->hi);
        zeros += z;
        if (j->mode == 1) {
            int64_t s = p / inner, c = s % C;  /* segment s is unit c = s % C (one division a chunk) */
            for (; s * inner < p + k; s++, c = c + 1 == C ? 0 : c + 1) {
                if (__atomic_load_n(&j->alive[c], __ATOMIC_RELAXED)) continue;
                int64_t a = s * inner > p ? s * inner : p, e = (s + 1) * inner < p + k ? (s + 1) * inner : p + k;
                if (z == 0 || any_nonzero(j->x + a, e - a)) __atomic_store_n(&j->alive[c], 1, __ATOMIC_RELAXED);
            }
        } else if (!full) {
            if (z == 0 && k >= L) {  /* a whole row without a zero: every unit alive */
                for (int64_t i = 0; i < L; i++) j->mask[i] = 1;
                full = 1;
                continue;
            }
            or_columns(j->x + p, k, p % L, j->mask, L);
            seen += k;
            if (seen >= L) {  /* every position seen non-zero: nothing more to learn */
                full = all_set(j->mask, L);
                seen = 0;
            }
        }
    }
    lanes_reduce(&l, &j->acc, zeros);
    return NULL;
}

/* Exact NaN and Inf counts, and the sums per element in double (second pass, only when needed). */
NBD_CLONES static void nonfinite_pass(const float *restrict x, int64_t n, int64_t *nan, int64_t *inf, double *sum, double *sumsq) {
    int64_t a = 0, b = 0;
    double s = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        a += (v != v);
        b += (v == INFINITY) + (v == -INFINITY);
        s += (double)v;
        ss += (double)v * (double)v;
    }
    *nan = a;
    *inf = b;
    *sum = s;
    *sumsq = ss;
}

NBD_API int nbd_abi(void) { return NBD_ABI; }

/* How the hot loops were compiled (native.status() names it). */
NBD_API const char *nbd_variant(void) { return NBD_VARIANT; }

/* Stats of a float32 tensor of n elements whose memory is outer x C x inner (dense), laid out as
 * nbdebug's FIELDS into scratch[0..8]: numel, sum, sumsq, min, max, nonzero, nan, inf, extra.
 * flags: 2 = unit mask: the bytes after those 9 doubles, alive[c] (c < C), are 1 when unit c holds a
 * value != 0 (NaN included), else 0 (meaningful only when some value is zero: out[5] < out[0]);
 * flags >> 8 = number of threads to split the pass across (the caller decides; 0 or 1: none).
 * nbd_stats_sat also counts into extra the values <= lo or >= hi (bounds already float32 values).
 * Returns 0, or -1 when memory for the column mask could not be allocated (scratch untouched). */
static int stats_impl(const float *x, int64_t n, int64_t C, int64_t inner, int64_t flags, int sat, double lo, double hi,
                      double *out) {
    uint8_t *alive = (uint8_t *)(out + 9);
    const int units = (flags & 2) && n > 0;
    int mode = 0;
    if (units) mode = (inner >= 16 || C * inner > ((int64_t)1 << 20)) ? 1 : 2;
    int64_t nt = flags >> 8;
    nt = nt < 1 ? 1 : (nt > MAX_THREADS ? MAX_THREADS : nt);
    const int64_t L = C * inner;
    job_t jobs[MAX_THREADS];
    uint32_t *masks = NULL;
    if (mode == 2) {
        masks = (uint32_t *)calloc((size_t)(nt * L), sizeof(uint32_t));
        if (!masks) return -1;
    } else if (mode == 1) {
        memset(alive, 0, (size_t)C);
    }
    for (int64_t t = 0; t < nt; t++) {
        job_t *j = &jobs[t];
        j->x = x;
        j->C = C;
        j->inner = inner;
        j->mode = mode;
        j->sat = sat;
        j->lo = (float)lo;
        j->hi = (float)hi;
        j->alive = alive;
        j->mask = masks ? masks + t * L : NULL;
        j->begin = n * t / nt / CHUNK * CHUNK;  /* parts on chunk boundaries, whatever the mode */
        j->end = t + 1 < nt ? n * (t + 1) / nt / CHUNK * CHUNK : n;
    }
    pthread_t th[MAX_THREADS];
    int on_thread[MAX_THREADS] = {0};
    for (int64_t t = 1; t < nt; t++) on_thread[t] = pthread_create(&th[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    acc_t a = jobs[0].acc;
    for (int64_t t = 1; t < nt; t++) {
        if (on_thread[t]) pthread_join(th[t], NULL);
        else run_job(&jobs[t]);  /* could not start a thread: this one does its part */
        acc_merge(&a, &jobs[t].acc);
    }
    if (mode == 2) {
        for (int64_t t = 1; t < nt; t++)
            for (int64_t i = 0; i < L; i++) masks[i] |= masks[t * L + i];
        if (inner == 1) {  /* a column per unit (N x C): one vectorisable loop */
            for (int64_t c = 0; c < C; c++) alive[c] = masks[c] != 0;
        } else {
            for (int64_t c = 0; c < C; c++) {
                uint32_t any = 0;
                for (int64_t i = 0; i < inner; i++) any |= masks[c * inner + i];
                alive[c] = any != 0;
            }
        }
        free(masks);
    }
    int64_t nan = 0, inf = 0;
    if (!isfinite(a.sum) || !isfinite(a.sumsq))  /* a NaN or an Inf: finite values cannot overflow a double sum */
        nonfinite_pass(x, n, &nan, &inf, &a.sum, &a.sumsq);
    out[0] = (double)n;
    out[1] = a.sum;
    out[2] = a.sumsq;
    out[3] = nan ? NAN : (n ? (double)a.mn : NAN);
    out[4] = nan ? NAN : (n ? (double)a.mx : NAN);
    out[5] = (double)(n - a.zeros);
    out[6] = (double)nan;
    out[7] = (double)inf;
    out[8] = (double)a.sat;
    return 0;
}

NBD_API int nbd_stats(const float *x, int64_t n, int64_t C, int64_t inner, int64_t flags, double *scratch) {
    return stats_impl(x, n, C, inner, flags, 0, 0.0, 0.0, scratch);
}

NBD_API int nbd_stats_sat(const float *x, int64_t n, int64_t C, int64_t inner, int64_t flags, double lo, double hi,
                          double *scratch) {
    return stats_impl(x, n, C, inner, flags, 1, lo, hi, scratch);
}
