/*
 * collector._hotpath: an optional C version of the exporter's per-step context manager.
 *
 *     scope = StepScope(steps.append, itertools.count().__next__)
 *     with scope.arm(n):        # step = n, t0 = now
 *         ...                   # on a clean exit: append((index(), step, t0, now))
 *
 * "now" is the clock of time.perf_counter(), in seconds as a double, so rows recorded here
 * and rows recorded by the pure-Python fallback are interchangeable. On Linux that is
 * clock_gettime(CLOCK_MONOTONIC) converted exactly as CPython does (nanoseconds as a 64-bit
 * integer, then divided by 1e9); elsewhere CPython's own perf-counter functions are used.
 *
 * Nothing here swallows errors: an exception raised by append() or index() propagates out
 * of __exit__ and the step is not recorded. An exception raised inside the with-block makes
 * __exit__ record nothing and return None, so the exception propagates.
 *
 * Two shortcuts keep a step near the cost of its two clock reads:
 *  - `s.__enter__` and `s.__exit__` are getters returning `s` itself, and calling `s` with
 *    no argument enters while calling it with (exc_type, exc, tb) exits. The with statement
 *    therefore allocates no bound-method objects (on 3.11-3.13 it binds both per `with`).
 *    A side effect: instances are callable.
 *  - when index is exactly `itertools.count().__next__`, the count's tp_iternext is called
 *    directly (same values, same StopIteration semantics); any other callable is called.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030C0000
#define HP_T_DOUBLE Py_T_DOUBLE
#else
#include <structmember.h>
#define HP_T_DOUBLE T_DOUBLE
#endif

/* ------------------------------------------------------------------ clock */

static inline double
hp_now(void)
{
#if defined(__linux__)
    /* CPython on Linux: perf_counter() == monotonic() == clock_gettime(CLOCK_MONOTONIC),
       read as int64 nanoseconds and converted with (double)ns / 1e9. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
    return (double)ns / 1e9;
#elif PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    return PyTime_AsSecondsDouble(t);
#else
    return _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());
#endif
}

/* ------------------------------------------------------------------ type */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* the instance is its own bound __enter__ and __exit__ */
    PyObject *append;          /* callable(row) -> ignored; a bound deque.append */
    PyObject *index;           /* callable() -> int; a bound itertools.count().__next__ */
    PyObject *counter;         /* index.__self__ when index is count().__next__, else NULL */
    PyObject *step;            /* the step being timed; any object */
    double t0;                 /* start of the step, perf_counter seconds */
} StepScope;

static PyTypeObject StepScope_Type;
static PyTypeObject *count_type;          /* itertools.count */
static PyTypeObject *method_wrapper_type; /* type(count().__next__) */

static PyObject *StepScope_vectorcall(PyObject *, PyObject *const *, size_t, PyObject *);

/* index.__self__ (new reference) when index is exactly itertools.count().__next__, whose
   tp_iternext can then be called directly: same result, minus a method-wrapper call. */
static PyObject *
exact_count_of(PyObject *index)
{
    if (count_type == NULL || !Py_IS_TYPE(index, method_wrapper_type)) {
        return NULL;
    }
    PyObject *name = PyObject_GetAttrString(index, "__name__");
    PyObject *owner = PyObject_GetAttrString(index, "__self__");
    PyObject *found = NULL;
    if (name != NULL && owner != NULL && PyUnicode_Check(name)
            && PyUnicode_CompareWithASCIIString(name, "__next__") == 0
            && Py_IS_TYPE(owner, count_type) && count_type->tp_iternext != NULL) {
        found = Py_NewRef(owner);
    }
    PyErr_Clear();
    Py_XDECREF(name);
    Py_XDECREF(owner);
    return found;
}

static PyObject *
StepScope_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"append", "index", NULL};
    PyObject *append, *index;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:StepScope", kwlist, &append, &index)) {
        return NULL;
    }
    if (!PyCallable_Check(append) || !PyCallable_Check(index)) {
        PyErr_SetString(PyExc_TypeError, "StepScope(append, index): both must be callable");
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return NULL;
    }
    StepScope *self = (StepScope *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(zero);
        return NULL;
    }
    self->vectorcall = StepScope_vectorcall;
    self->append = Py_NewRef(append);
    self->index = Py_NewRef(index);
    self->counter = exact_count_of(index);
    self->step = zero;
    self->t0 = 0.0;
    return (PyObject *)self;
}

static int
StepScope_traverse(StepScope *self, visitproc visit, void *arg)
{
    Py_VISIT(self->append);
    Py_VISIT(self->index);
    Py_VISIT(self->counter);
    Py_VISIT(self->step);
    return 0;
}

static int
StepScope_clear(StepScope *self)
{
    Py_CLEAR(self->append);
    Py_CLEAR(self->index);
    Py_CLEAR(self->counter);
    Py_CLEAR(self->step);
    return 0;
}

static void
StepScope_dealloc(StepScope *self)
{
    PyObject_GC_UnTrack(self);
    (void)StepScope_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* arm(n): step = n, t0 = now; returns self (the with-statement's context manager). */
static PyObject *
StepScope_arm(StepScope *self, PyObject *n)
{
    Py_XSETREF(self->step, Py_NewRef(n));
    self->t0 = hp_now();
    return Py_NewRef((PyObject *)self);
}

/* On a clean exit append((index(), step, t0, now)); return None (so exceptions propagate). */
static PyObject *
StepScope_exit(StepScope *self, PyObject *exc_type)
{
    if (exc_type != Py_None) {
        Py_RETURN_NONE; /* the step failed: record nothing, let the exception propagate */
    }
    const double t1 = hp_now();
    const double t0 = self->t0;
    if (self->append == NULL || self->index == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StepScope was cleared");
        return NULL;
    }
    /* Own everything used across calls into Python code, which may re-arm this scope. */
    PyObject *append = Py_NewRef(self->append);
    PyObject *step = Py_NewRef(self->step != NULL ? self->step : Py_None);
    PyObject *idx, *f0, *f1, *row = NULL, *res = NULL;

    if (self->counter != NULL) {
        idx = Py_TYPE(self->counter)->tp_iternext(self->counter);
        if (idx == NULL && !PyErr_Occurred()) {
            PyErr_SetNone(PyExc_StopIteration); /* what count().__next__() would raise */
        }
    }
    else {
        idx = PyObject_CallNoArgs(self->index);
    }
    if (idx == NULL) {
        goto done;
    }
    f0 = PyFloat_FromDouble(t0);
    if (f0 == NULL) {
        Py_DECREF(idx);
        goto done;
    }
    f1 = PyFloat_FromDouble(t1);
    if (f1 == NULL) {
        Py_DECREF(idx);
        Py_DECREF(f0);
        goto done;
    }
    row = PyTuple_New(4);
    if (row == NULL) {
        Py_DECREF(idx);
        Py_DECREF(f0);
        Py_DECREF(f1);
        goto done;
    }
    PyTuple_SET_ITEM(row, 0, idx);       /* steals */
    PyTuple_SET_ITEM(row, 1, step);      /* steals */
    step = NULL;
    PyTuple_SET_ITEM(row, 2, f0);        /* steals */
    PyTuple_SET_ITEM(row, 3, f1);        /* steals */

    res = PyObject_CallOneArg(append, row);
    if (res != NULL) {
        Py_DECREF(res);
        res = Py_NewRef(Py_None);
    }
done:
    Py_XDECREF(row);
    Py_XDECREF(step);
    Py_DECREF(append);
    return res;
}

/* Calling the instance: () is __enter__ (returns self), (exc_type, exc, tb) is __exit__.
   `with` looks __enter__/__exit__ up on the type and binds them; here both "bind" to the
   instance itself (see StepScope_self), so a step allocates no bound-method objects. */
static PyObject *
StepScope_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "StepScope takes no keyword arguments");
        return NULL;
    }
    if (nargs == 3) {
        return StepScope_exit((StepScope *)callable, args[0]);
    }
    if (nargs == 0) {
        return Py_NewRef(callable);
    }
    PyErr_Format(PyExc_TypeError,
                 "StepScope takes 0 arguments (__enter__) or 3 (__exit__), got %zd", nargs);
    return NULL;
}

static PyObject *
StepScope_self(StepScope *self, void *Py_UNUSED(closure))
{
    return Py_NewRef((PyObject *)self);
}

static PyObject *
StepScope_get_step(StepScope *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->step != NULL ? self->step : Py_None);
}

static int
StepScope_set_step(StepScope *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete attribute 'step'");
        return -1;
    }
    Py_XSETREF(self->step, Py_NewRef(value));
    return 0;
}

static PyMethodDef StepScope_methods[] = {
    {"arm", (PyCFunction)StepScope_arm, METH_O,
     PyDoc_STR("arm(n) -> self\n\nSet step = n and t0 = now (the perf_counter clock).")},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef StepScope_members[] = {
    {"t0", HP_T_DOUBLE, offsetof(StepScope, t0), 0,
     PyDoc_STR("Start of the step in perf_counter seconds.")},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef StepScope_getset[] = {
    {"step", (getter)StepScope_get_step, (setter)StepScope_set_step,
     PyDoc_STR("The step being timed (any object; default 0)."), NULL},
    /* Getters returning the instance: `s.__enter__()` and `s.__exit__(t, e, tb)` work as
       usual, but looking them up allocates nothing. */
    {"__enter__", (getter)StepScope_self, NULL,
     PyDoc_STR("__enter__() -> self (the instance; calling it with no argument)."), NULL},
    {"__exit__", (getter)StepScope_self, NULL,
     PyDoc_STR("__exit__(exc_type, exc, tb) -> None: on a clean exit append((index(), "
               "step, t0, now)); the instance called with 3 arguments."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(StepScope_doc,
"StepScope(append, index)\n"
"\n"
"Reusable context manager timing one training step at a time. ``arm(n)`` sets the\n"
"step and its start; a clean ``__exit__`` calls ``append((index(), step, t0, now))``\n"
"with ``now`` read from the clock of ``time.perf_counter()``.");

static PyTypeObject StepScope_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collector._hotpath.StepScope",
    .tp_basicsize = sizeof(StepScope),
    .tp_itemsize = 0,
    .tp_dealloc = (destructor)StepScope_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(StepScope, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_doc = StepScope_doc,
    .tp_traverse = (traverseproc)StepScope_traverse,
    .tp_clear = (inquiry)StepScope_clear,
    .tp_methods = StepScope_methods,
    .tp_members = StepScope_members,
    .tp_getset = StepScope_getset,
    .tp_new = StepScope_new,
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collector._hotpath",
    .m_doc = "Optional C hot path of collector.exporter (falls back to pure Python).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    if (PyType_Ready(&StepScope_Type) < 0) {
        return NULL;
    }
    if (count_type == NULL) { /* optional: without it index() is simply called */
        PyObject *itertools = PyImport_ImportModule("itertools");
        PyObject *count = itertools ? PyObject_GetAttrString(itertools, "count") : NULL;
        PyObject *counter = count ? PyObject_CallNoArgs(count) : NULL;
        PyObject *next = counter ? PyObject_GetAttrString(counter, "__next__") : NULL;
        if (next != NULL && PyType_Check(count)) {
            method_wrapper_type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(next));
            count_type = (PyTypeObject *)Py_NewRef(count);
        }
        PyErr_Clear();
        Py_XDECREF(next);
        Py_XDECREF(counter);
        Py_XDECREF(count);
        Py_XDECREF(itertools);
    }
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "StepScope", (PyObject *)&StepScope_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
