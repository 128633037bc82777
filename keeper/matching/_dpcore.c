/* The alignment's dynamic programs, compiled: keeper.matching.kernels calls these when the extension is built and
 * falls back to the same kernels under numba otherwise. Every function computes exactly what its numba twin in
 * keeper/matching/kernels.py computes (integer recurrences; pass 1 of the score in float64, exact for element
 * counts below 2**53), and tests/test_matching_kernels.py holds the two against each other.
 *
 * Arrays arrive through the buffer protocol (numpy arrays, C-contiguous, dtypes checked), so the extension needs no
 * numpy headers to build. The GIL is released while a DP runs: matcher threads score in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TIE_K (((int64_t)1) << 20)
#define GAP_OPEN 4
#define CONTEXT 2
#define NEG (-(((int64_t)1) << 62))

typedef struct {
    Py_buffer view;
    int held;
} Arr;

static int is_int_format(const Py_buffer *v, Py_ssize_t itemsize) {
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (v->itemsize != itemsize) return 0;
    return (*f == 'i' || *f == 'l' || *f == 'q');
}

/* A C-contiguous integer array of ``itemsize`` bytes per item and ``ndim`` dimensions (the last of width ``cols``
 * when ndim is 2). */
static int get_arr(PyObject *obj, Arr *a, Py_ssize_t itemsize, int ndim, Py_ssize_t cols, int writable,
                   const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    a->held = 0;
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0) return -1;
    a->held = 1;
    if (!is_int_format(&a->view, itemsize) || a->view.ndim != ndim || (ndim == 2 && a->view.shape[1] != cols)) {
        PyErr_Format(PyExc_TypeError, "keeper.matching._dpcore: array %s must be a C-contiguous int%d array of %d "
                     "dimension(s)", name, (int)(itemsize * 8), ndim);
        return -1;
    }
    return 0;
}

static void release(Arr *arrs, int n) {
    for (int i = 0; i < n; i++)
        if (arrs[i].held) PyBuffer_Release(&arrs[i].view);
}

static inline Py_ssize_t len0(const Arr *a) { return a->view.shape[0]; }

static inline double dmin(double a, double b) { return a < b ? a : b; }

/* Most child elements any order-preserving one-to-one matching of equal classes inherits (_dp_rows). */
static int64_t dp_rows(const int32_t *cls_c, const int64_t *shp_c, const int64_t *vec_c, Py_ssize_t m,
                       const int32_t *cls_p, const int64_t *shp_p, const int64_t *vec_p, Py_ssize_t n,
                       int64_t *row, double *cols, double *gains) {
    double *p0 = cols, *p1 = cols + n, *p2 = cols + 2 * n, *p3 = cols + 3 * n, *p4 = cols + 4 * n,
           *pv = cols + 5 * n;
    for (Py_ssize_t j = 0; j < n; j++) {
        p0[j] = (double)shp_p[5 * j];
        p1[j] = (double)shp_p[5 * j + 1];
        p2[j] = (double)shp_p[5 * j + 2];
        p3[j] = (double)shp_p[5 * j + 3];
        p4[j] = (double)shp_p[5 * j + 4];
        pv[j] = (double)vec_p[j];
    }
    for (Py_ssize_t j = 0; j <= n; j++) row[j] = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        int32_t ci = cls_c[i];
        double c0 = (double)shp_c[5 * i], c1 = (double)shp_c[5 * i + 1], c2 = (double)shp_c[5 * i + 2],
               c3 = (double)shp_c[5 * i + 3], c4 = (double)shp_c[5 * i + 4], cv = (double)vec_c[i];
        for (Py_ssize_t j = 0; j < n; j++) {
            double a0 = dmin(c0, p0[j]);
            double g = a0 * dmin(c1, p1[j]) * dmin(c2, p2[j]) * dmin(c3, p3[j]) * dmin(c4, p4[j])
                       + dmin(cv, pv[j]) * a0;
            gains[j] = cls_p[j] == ci ? g : 0.0;
        }
        int64_t diag = 0, left = 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t up = row[j + 1];
            int64_t cand = diag + (int64_t)gains[j];
            int64_t best = up > left ? up : left;
            best = cand > best ? cand : best;
            diag = up;
            row[j + 1] = best;
            left = best;
        }
    }
    return row[n];
}

static PyObject *py_dp_batch(PyObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    Arr a[8];
    memset(a, 0, sizeof(a));
    static const char *names[8] = {"cls_c", "shp_c", "vec_c", "cls_p", "shp_p", "vec_p", "offsets", "out"};
    const Py_ssize_t sizes[8] = {4, 8, 8, 4, 8, 8, 8, 8};
    const int dims[8] = {1, 2, 1, 1, 2, 1, 1, 1};
    for (int k = 0; k < 8; k++)
        if (get_arr(o[k], &a[k], sizes[k], dims[k], 5, k == 7, names[k]) < 0) { release(a, 8); return NULL; }
    Py_ssize_t m = len0(&a[0]), parents = len0(&a[6]) - 1;
    const int64_t *off = (const int64_t *)a[6].view.buf;
    if (len0(&a[1]) != m || len0(&a[2]) != m || len0(&a[4]) != len0(&a[3]) || len0(&a[5]) != len0(&a[3])
        || parents < 0 || len0(&a[7]) < parents) {
        release(a, 8);
        PyErr_SetString(PyExc_ValueError, "keeper.matching._dpcore.dp_batch: array lengths disagree");
        return NULL;
    }
    Py_ssize_t maxn = 0;
    for (Py_ssize_t k = 0; k < parents; k++) {
        if (off[k] < 0 || off[k + 1] < off[k] || off[k + 1] > len0(&a[3])) {
            release(a, 8);
            PyErr_SetString(PyExc_ValueError, "keeper.matching._dpcore.dp_batch: offsets out of range");
            return NULL;
        }
        if (off[k + 1] - off[k] > maxn) maxn = off[k + 1] - off[k];
    }
    int64_t *row = malloc(sizeof(int64_t) * (maxn + 1));
    double *cols = malloc(sizeof(double) * 6 * (maxn + 1));
    double *gains = malloc(sizeof(double) * (maxn + 1));
    if (!row || !cols || !gains) {
        free(row), free(cols), free(gains);
        release(a, 8);
        return PyErr_NoMemory();
    }
    const int32_t *cls_c = a[0].view.buf, *cls_p = a[3].view.buf;
    const int64_t *shp_c = a[1].view.buf, *vec_c = a[2].view.buf, *shp_p = a[4].view.buf, *vec_p = a[5].view.buf;
    int64_t *out = a[7].view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < parents; k++) {
        Py_ssize_t s = off[k], n = off[k + 1] - off[k];
        out[k] = dp_rows(cls_c, shp_c, vec_c, m, cls_p + s, shp_p + 5 * s, vec_p + s, n, row, cols, gains);
    }
    Py_END_ALLOW_THREADS
    free(row), free(cols), free(gains);
    release(a, 8);
    Py_RETURN_NONE;
}

static inline int64_t gain(const int64_t *shp_c, const int64_t *vec_c, Py_ssize_t i, const int64_t *shp_p,
                           const int64_t *vec_p, Py_ssize_t j) {
    int64_t g = 1;
    for (int d = 0; d < 5; d++) {
        int64_t a = shp_c[5 * i + d], b = shp_p[5 * j + d];
        g *= a < b ? a : b;
    }
    int64_t v = vec_c[i] < vec_p[j] ? vec_c[i] : vec_p[j];
    int64_t u = shp_c[5 * i] < shp_p[5 * j] ? shp_c[5 * i] : shp_p[5 * j];
    return g + v * u;
}

static inline int64_t bonus(const int64_t *shp_c, const int64_t *ctx_c, const int64_t *out_c, Py_ssize_t i,
                            const int64_t *shp_p, const int64_t *ctx_p, const int64_t *out_p, Py_ssize_t j) {
    int64_t b = ctx_c[i] == ctx_p[j] ? CONTEXT + 1 : 1;
    if (out_c[i] == out_p[j]) b += CONTEXT;
    if (shp_c[5 * i] == shp_p[5 * j]) b += 1;
    if (shp_c[5 * i + 1] == shp_p[5 * j + 1]) b += 1;
    int same = 1;
    for (int d = 2; d < 5; d++)
        if (shp_c[5 * i + d] != shp_p[5 * j + d]) same = 0;
    if (same) b += 1;
    return b;
}

static inline int64_t max3(int64_t a, int64_t b, int64_t c) {
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* The alignment with its tie-breaks and traceback (_dp_pairs); returns the inherited elements, pairs written. */
static int64_t dp_pairs(const int32_t *cls_c, const int64_t *shp_c, const int64_t *vec_c, const int64_t *skip_c,
                        const int64_t *edge_c, const int64_t *ctx_c, const int64_t *out_c, Py_ssize_t m,
                        const int32_t *cls_p, const int64_t *shp_p, const int64_t *vec_p, const int64_t *skip_p,
                        const int64_t *edge_p, const int64_t *ctx_p, const int64_t *out_p, Py_ssize_t n,
                        int64_t *M, int64_t *X, int64_t *Y, int64_t *pairs) {
    Py_ssize_t w = n + 1;
#define AT(T, i, j) T[(i) * w + (j)]
    for (Py_ssize_t k = 0; k < (m + 1) * w; k++) M[k] = X[k] = Y[k] = NEG;
    AT(M, 0, 0) = 0;
    for (Py_ssize_t i = 0; i <= m; i++) {
        for (Py_ssize_t j = 0; j <= n; j++) {
            if (i > 0 && j > 0 && cls_p[j - 1] == cls_c[i - 1]) {
                int64_t g = gain(shp_c, vec_c, i - 1, shp_p, vec_p, j - 1);
                if (g > 0)
                    AT(M, i, j) = max3(AT(M, i - 1, j - 1), AT(X, i - 1, j - 1) - edge_c[i - 1],
                                       AT(Y, i - 1, j - 1) - edge_p[j - 1])
                                  + g * TIE_K + bonus(shp_c, ctx_c, out_c, i - 1, shp_p, ctx_p, out_p, j - 1);
            }
            if (i > 0)
                AT(X, i, j) = max3(AT(M, i - 1, j) - GAP_OPEN - edge_c[i - 1], AT(X, i - 1, j),
                                   AT(Y, i - 1, j) - GAP_OPEN - edge_c[i - 1]) - skip_c[i - 1];
            if (j > 0)
                AT(Y, i, j) = max3(AT(M, i, j - 1) - GAP_OPEN - edge_p[j - 1], AT(X, i, j - 1) - GAP_OPEN - edge_p[j - 1],
                                   AT(Y, i, j - 1)) - skip_p[j - 1];
        }
    }
    for (Py_ssize_t k = 0; k < m; k++) pairs[k] = -1;
    int64_t inherited = 0;
    Py_ssize_t i = m, j = n;
    int64_t v = max3(AT(M, i, j), AT(X, i, j), AT(Y, i, j));
    int state = AT(Y, i, j) == v ? 2 : (AT(X, i, j) == v ? 1 : 0);
    while (i > 0 || j > 0) {
        if (state == 0) {
            int64_t g = gain(shp_c, vec_c, i - 1, shp_p, vec_p, j - 1);
            pairs[i - 1] = j - 1;
            inherited += g;
            v = AT(M, i, j) - g * TIE_K - bonus(shp_c, ctx_c, out_c, i - 1, shp_p, ctx_p, out_p, j - 1);
            i -= 1;
            j -= 1;
            state = (j > 0 && AT(Y, i, j) - edge_p[j] == v) ? 2 : ((i > 0 && AT(X, i, j) - edge_c[i] == v) ? 1 : 0);
        } else if (state == 1) {
            v = AT(X, i, j) + skip_c[i - 1];
            i -= 1;
            state = AT(X, i, j) == v ? 1 : (AT(Y, i, j) - GAP_OPEN - edge_c[i] == v ? 2 : 0);
        } else {
            v = AT(Y, i, j) + skip_p[j - 1];
            j -= 1;
            state = AT(Y, i, j) == v ? 2 : (AT(X, i, j) - GAP_OPEN - edge_p[j] == v ? 1 : 0);
        }
    }
#undef AT
    return inherited;
}

static PyObject *py_dp_pairs(PyObject *self, PyObject *args) {
    PyObject *o[15];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12], &o[13], &o[14]))
        return NULL;
    Arr a[15];
    memset(a, 0, sizeof(a));
    static const char *names[15] = {"cls_c", "shp_c", "vec_c", "skip_c", "edge_c", "ctx_c", "out_c", "cls_p",
                                    "shp_p", "vec_p", "skip_p", "edge_p", "ctx_p", "out_p", "pairs"};
    for (int k = 0; k < 15; k++) {
        Py_ssize_t size = (k == 0 || k == 7) ? 4 : 8;
        int dims = (k == 1 || k == 8) ? 2 : 1;
        if (get_arr(o[k], &a[k], size, dims, 5, k == 14, names[k]) < 0) { release(a, 15); return NULL; }
    }
    Py_ssize_t m = len0(&a[0]), n = len0(&a[7]);
    for (int k = 1; k < 7; k++)
        if (len0(&a[k]) != m) goto bad;
    for (int k = 8; k < 14; k++)
        if (len0(&a[k]) != n) goto bad;
    if (len0(&a[14]) != m) goto bad;
    size_t cells = (size_t)(m + 1) * (size_t)(n + 1);
    int64_t *M = malloc(sizeof(int64_t) * cells), *X = malloc(sizeof(int64_t) * cells),
            *Y = malloc(sizeof(int64_t) * cells);
    if (!M || !X || !Y) {
        free(M), free(X), free(Y);
        release(a, 15);
        return PyErr_NoMemory();
    }
    int64_t inherited;
    Py_BEGIN_ALLOW_THREADS
    inherited = dp_pairs(a[0].view.buf, a[1].view.buf, a[2].view.buf, a[3].view.buf, a[4].view.buf, a[5].view.buf,
                         a[6].view.buf, m, a[7].view.buf, a[8].view.buf, a[9].view.buf, a[10].view.buf,
                         a[11].view.buf, a[12].view.buf, a[13].view.buf, n, M, X, Y, a[14].view.buf);
    Py_END_ALLOW_THREADS
    free(M), free(X), free(Y);
    release(a, 15);
    return PyLong_FromLongLong((long long)inherited);
bad:
    release(a, 15);
    PyErr_SetString(PyExc_ValueError, "keeper.matching._dpcore.dp_pairs: array lengths disagree");
    return NULL;
}

static PyMethodDef methods[] = {
    {"dp_batch", py_dp_batch, METH_VARARGS,
     "dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out): inherited elements per packed parent"},
    {"dp_pairs", py_dp_pairs, METH_VARARGS,
     "dp_pairs(child arrays x7, parent arrays x7, pairs) -> inherited elements; pairs written"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dpcore",
                                    "keeper's alignment DPs in C (see keeper/matching/kernels.py)", -1, methods};

PyMODINIT_FUNC PyInit__dpcore(void) { return PyModule_Create(&module); }
