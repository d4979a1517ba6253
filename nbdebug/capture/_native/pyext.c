/* CPython entry points of the kernel (see nbdebug/capture/native.py): the module _nbdext, built by
 * native_build.py next to the ctypes library from the same sources (this file + stats.c + norms.c)
 * when Python's and numpy's headers are there.
 *
 * A ctypes call costs ~1 µs and the results went through a scratch buffer copied out; here one
 * METH_FASTCALL call reads the tensor's attributes, runs the same C code and returns fresh numpy
 * arrays. Whatever this file does not decide itself (a non-contiguous tensor, data_ptr() 0 with
 * elements (a ZeroTensor), a tensor large enough to release the GIL or split over threads, saturation
 * bounds or sat_eps that are not floats) it hands back as the SLOW sentinel and native.py takes its
 * ctypes path: the same answers as before, bit for bit, with the same None cases. Nothing here is shared between calls but constants, so
 * threads need no scratch of their own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nbd.h"

#define STACK_UNITS 4096 /* unit-mask bytes on the stack; more units: malloc */
#define STACK_TENSORS 64

/* set once by setup(): torch.Tensor, torch.nn.Parameter, torch.float32, torch.strided, native.py's
 * SLOW sentinel; tensors of fewer elements than small_max are done here with the GIL held */
static PyObject *T_tensor, *T_param, *F32, *STRIDED, *SLOW;
static int64_t small_max;
static PyObject *s_dtype, *s_is_cpu, *s_layout, *s_shape, *s_is_contiguous, *s_data_ptr, *s_numel, *s_is_zero;

static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "setup(Tensor, Parameter, float32, strided, slow, small_max)");
        return NULL;
    }
    long long m = PyLong_AsLongLong(args[5]);
    if (m == -1 && PyErr_Occurred()) return NULL;
    PyObject **slots[5] = {&T_tensor, &T_param, &F32, &STRIDED, &SLOW};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    small_max = m;
    Py_RETURN_NONE;
}

/* 1: a call of a method of no arguments that returned True; 0: anything else; -1: an error. */
static int call_true(PyObject *t, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(t, name);
    if (!r) return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* 1: is attribute ``name`` of t the object ``want``; 0: not; -1: an error. */
static int attr_is(PyObject *t, PyObject *name, PyObject *want) {
    PyObject *v = PyObject_GetAttr(t, name);
    if (!v) return -1;
    Py_DECREF(v);
    return v == want;
}

/* 1: a plain float32 strided CPU tensor (torch.Tensor or Parameter, not a subclass); 0: not. */
static int plain_f32(PyObject *t) {
    if (Py_TYPE(t) != (PyTypeObject *)T_tensor && Py_TYPE(t) != (PyTypeObject *)T_param) return 0;
    int ok = attr_is(t, s_dtype, F32);
    if (ok == 1) ok = attr_is(t, s_is_cpu, Py_True);
    if (ok == 1) ok = attr_is(t, s_layout, STRIDED);
    return ok;
}

/* t.data_ptr() into *ptr: 1, or 0 when the tensor has no storage to give (RuntimeError,
 * NotImplementedError: functorch wrappers and the like), -1 on any other error. */
static int data_ptr(PyObject *t, void **ptr) {
    PyObject *r = PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (!r) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError) || PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    *ptr = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return (*ptr == NULL && PyErr_Occurred()) ? -1 : 1;
}

/* (row, alive or None) from the kernel's output: a fresh float64 [9] and, with the unit flag and some
 * value zero, a fresh bool [C]; None when the kernel failed (rc != 0). */
static PyObject *result(int rc, const double *scratch, int64_t flags, int64_t c) {
    if (rc) Py_RETURN_NONE;
    npy_intp nine = 9;
    PyObject *row = PyArray_SimpleNew(1, &nine, NPY_FLOAT64);
    if (!row) return NULL;
    memcpy(PyArray_DATA((PyArrayObject *)row), scratch, 9 * sizeof(double));
    PyObject *alive = Py_None;
    if ((flags & 2) && scratch[5] < scratch[0]) {
        npy_intp dims = (npy_intp)c;
        alive = PyArray_SimpleNew(1, &dims, NPY_BOOL);
        if (!alive) {
            Py_DECREF(row);
            return NULL;
        }
        memcpy(PyArray_DATA((PyArrayObject *)alive), scratch + 9, (size_t)c); /* bytes 0/1 */
    } else {
        Py_INCREF(alive);
    }
    PyObject *tup = PyTuple_New(2);
    if (!tup) {
        Py_DECREF(row);
        Py_DECREF(alive);
        return NULL;
    }
    PyTuple_SET_ITEM(tup, 0, row);
    PyTuple_SET_ITEM(tup, 1, alive);
    return tup;
}

/* The kernel over n floats at x (outer x C x inner) with the GIL held, results as result(). */
static PyObject *run_stats(const float *x, int64_t n, int64_t c, int64_t inner, int64_t flags, int sat, double lo, double hi) {
    double local[9 + STACK_UNITS / sizeof(double)];
    double *scratch = local;
    if ((flags & 2) && c > STACK_UNITS && n) { /* no elements: no mask written (nor read), whatever C */
        scratch = (double *)malloc(9 * sizeof(double) + (size_t)c);
        if (!scratch) return PyErr_NoMemory();
    }
    int rc = sat ? nbd_stats_sat(x, n, c, inner, flags | 1, lo, hi, scratch) : nbd_stats(x, n, c, inner, flags, scratch);
    PyObject *r = result(rc, scratch, flags, c);
    if (scratch != local) free(scratch);
    return r;
}

/* stats(t, saturation, sat_eps, units) -> (row, alive) | None | SLOW: native.stats for a contiguous
 * plain float32 CPU tensor of fewer than small_max elements; SLOW for what native.py decides. */
static PyObject *stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stats(t, saturation, sat_eps, units)");
        return NULL;
    }
    PyObject *t = args[0], *saturation = args[1];
    int ok = plain_f32(t);
    if (ok <= 0) {
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *shape = PyObject_GetAttr(t, s_shape);
    if (!shape) return NULL;
    if (!PyTuple_Check(shape)) {
        Py_DECREF(shape);
        return Py_NewRef(SLOW);
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    int64_t n = 1, d0 = 1, c = 1;
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (s == -1 && PyErr_Occurred()) {
            Py_DECREF(shape);
            return NULL;
        }
        n *= s;
        if (i == 0) d0 = s;
        if (i == 1) c = s;
    }
    Py_DECREF(shape);
    if (n >= small_max) return Py_NewRef(SLOW); /* large: native.py releases the GIL (and may split) */
    ok = call_true(t, s_is_contiguous);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(SLOW); /* dense or not: native.py */
    int64_t inner = n;
    if (nd >= 2) inner = n ? n / (d0 * c) : 0;
    else c = 1;
    int units = PyObject_IsTrue(args[3]);
    if (units < 0) return NULL;
    int64_t flags = units && nd >= 2 ? 2 : 0;
    void *ptr = NULL;
    ok = data_ptr(t, &ptr); /* the last call into Python before the kernel reads the memory */
    if (ok <= 0) {
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (!ptr && n) return Py_NewRef(SLOW); /* a ZeroTensor or not ours: native.py */
    if (saturation == Py_None) return run_stats((const float *)ptr, n, c, inner, flags, 0, 0.0, 0.0);
    PyObject *eps = args[2];
    if (!PyTuple_CheckExact(saturation) || PyTuple_GET_SIZE(saturation) != 2 || !PyFloat_CheckExact(eps)
        || !PyFloat_CheckExact(PyTuple_GET_ITEM(saturation, 0)) || !PyFloat_CheckExact(PyTuple_GET_ITEM(saturation, 1)))
        return Py_NewRef(SLOW);
    /* (lo + sat_eps, hi - sat_eps) rounded to float32 and back, as native._bounds does through np.float32 */
    double e = PyFloat_AS_DOUBLE(eps);
    double lo = (double)(float)(PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(saturation, 0)) + e);
    double hi = (double)(float)(PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(saturation, 1)) - e);
    return run_stats((const float *)ptr, n, c, inner, flags, 1, lo, hi);
}

/* raw_stats(addr, n, C, inner, flags, lo, hi) -> (row, alive) | None: the kernel on memory given by
 * address (flags & 1: saturation), results built as stats() builds them (native_build's self-test). */
static PyObject *raw_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "raw_stats(addr, n, C, inner, flags, lo, hi)");
        return NULL;
    }
    void *x = PyLong_AsVoidPtr(args[0]);
    long long v[4];
    for (int i = 0; i < 4; i++) v[i] = PyLong_AsLongLong(args[i + 1]);
    double lo = PyFloat_AsDouble(args[5]), hi = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    return run_stats((const float *)x, v[0], v[1], v[2], v[3] & ~(int64_t)1, (int)(v[3] & 1), lo, hi);
}

/* sq_norms(tensors) -> float64 [k] | None: native.sq_norms (None when one tensor is not a plain
 * float32 contiguous CPU tensor with memory; a ZeroTensor counts as empty). */
static PyObject *sq_norms(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "sq_norms(tensors)");
        return NULL;
    }
    /* a tuple of our own (a list's copy): the attribute reads below can run Python code (a
     * __torch_function__ mode, a finaliser) that empties the caller's list and frees its tensors */
    PyObject *seq = PySequence_Tuple(args[0]);
    if (!seq) return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    int64_t stack[2 * STACK_TENSORS];
    int64_t *ptrs = stack, *sizes = stack + STACK_TENSORS;
    PyObject *out = NULL;
    if (k > STACK_TENSORS) {
        ptrs = (int64_t *)malloc(2 * (size_t)k * sizeof(int64_t));
        if (!ptrs) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        sizes = ptrs + k;
    }
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *t = items[i];
        int ok = plain_f32(t);
        if (ok == 1) ok = call_true(t, s_is_contiguous);
        void *ptr = NULL;
        if (ok == 1) ok = data_ptr(t, &ptr);
        long long n = 0;
        if (ok == 1) {
            PyObject *r = PyObject_CallMethodNoArgs(t, s_numel);
            if (!r) goto done;
            n = PyLong_AsLongLong(r);
            Py_DECREF(r);
            if (n == -1 && PyErr_Occurred()) goto done;
            if (!ptr && n) { /* no memory: a ZeroTensor is empty (its sum of squares is 0), else not ours */
                ok = call_true(t, s_is_zero);
                n = 0;
            }
        }
        if (ok < 0) goto done;
        if (ok == 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        ptrs[i] = (int64_t)(intptr_t)ptr;
        sizes[i] = n;
        total += n;
    }
    npy_intp dims = (npy_intp)k;
    out = PyArray_SimpleNew(1, &dims, NPY_FLOAT64);
    if (out && k) {
        double *o = (double *)PyArray_DATA((PyArrayObject *)out);
        if (total < small_max) {
            nbd_sq_norms(ptrs, sizes, k, o);
        } else {
            Py_BEGIN_ALLOW_THREADS
            nbd_sq_norms(ptrs, sizes, k, o);
            Py_END_ALLOW_THREADS
        }
    }
done:
    if (ptrs != stack) free(ptrs);
    Py_DECREF(seq);
    return out;
}

/* seg_run(before_addr, ptrs_addr, sizes_addr, k, total) -> (sumsq_before, sumsq_diff): nbd_seg_norms
 * into two fresh float64 [k] arrays (native.seg_plan's packed call; total = the elements). */
static PyObject *seg_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "seg_run(before_addr, ptrs_addr, sizes_addr, k, total)");
        return NULL;
    }
    void *before = PyLong_AsVoidPtr(args[0]), *ptrs = PyLong_AsVoidPtr(args[1]), *sizes = PyLong_AsVoidPtr(args[2]);
    long long k = PyLong_AsLongLong(args[3]), total = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    npy_intp dims = (npy_intp)k;
    PyObject *b = PyArray_SimpleNew(1, &dims, NPY_FLOAT64);
    PyObject *d = b ? PyArray_SimpleNew(1, &dims, NPY_FLOAT64) : NULL;
    PyObject *tup = d ? PyTuple_New(2) : NULL;
    if (!tup) {
        Py_XDECREF(b);
        Py_XDECREF(d);
        return NULL;
    }
    double *bo = (double *)PyArray_DATA((PyArrayObject *)b), *dout = (double *)PyArray_DATA((PyArrayObject *)d);
    if (total < small_max) {
        nbd_seg_norms((const float *)before, (const int64_t *)ptrs, (const int64_t *)sizes, k, bo, dout);
    } else {
        Py_BEGIN_ALLOW_THREADS
        nbd_seg_norms((const float *)before, (const int64_t *)ptrs, (const int64_t *)sizes, k, bo, dout);
        Py_END_ALLOW_THREADS
    }
    PyTuple_SET_ITEM(tup, 0, b);
    PyTuple_SET_ITEM(tup, 1, d);
    return tup;
}

static PyObject *abi(PyObject *self, PyObject *unused) { return PyLong_FromLong(nbd_abi()); }

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "setup(Tensor, Parameter, float32, strided, slow, small_max)"},
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL, "stats(t, saturation, sat_eps, units)"},
    {"raw_stats", (PyCFunction)(void (*)(void))raw_stats, METH_FASTCALL, "raw_stats(addr, n, C, inner, flags, lo, hi)"},
    {"sq_norms", (PyCFunction)(void (*)(void))sq_norms, METH_FASTCALL, "sq_norms(tensors)"},
    {"seg_run", (PyCFunction)(void (*)(void))seg_run, METH_FASTCALL, "seg_run(before_addr, ptrs_addr, sizes_addr, k, total)"},
    {"abi", abi, METH_NOARGS, "the kernel's ABI number"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nbdext", "nbdebug's native kernel, CPython entry points", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nbdext(void) {
    import_array();
    const char *names[] = {"dtype", "is_cpu", "layout", "shape", "is_contiguous", "data_ptr", "numel", "_is_zerotensor"};
    PyObject **slots[] = {&s_dtype, &s_is_cpu, &s_layout, &s_shape, &s_is_contiguous, &s_data_ptr, &s_numel, &s_is_zero};
    for (int i = 0; i < 8; i++) {
        if (!*slots[i] && !(*slots[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    }
    return PyModule_Create(&module);
}
