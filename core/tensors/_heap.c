/*
 * torchmem.tensors._heap: pick the objects of given types off the whole heap in one C call.
 *
 * Why this exists: gc.get_objects() returns a list that holds every object of the process.
 * If another thread drops its last reference to one of them while the census holds that
 * list, the object dies when the list is released, in the census's thread; for a Qt object
 * that deadlocks PySide6. heap.py's Python section keeps other threads out by raising the
 * interpreter's switch interval, which a loaded machine can outlast (a full CI run once
 * saw a thread run in the middle). Here nothing between taking the list and releasing it
 * runs Python code or checks for a thread switch: no other thread runs meanwhile, so
 * every object still has another owner when the list lets go of it.
 *
 * Types are matched with PyType_IsSubtype (the MRO), never a metaclass's
 * __subclasscheck__, which would run Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *get_objects; /* gc.get_objects, looked up once at import */

PyDoc_STRVAR(objects_of_types_doc,
"objects_of_types(bases: tuple[type, ...]) -> tuple[list[list[object]], set[type]]\n\n"
"The live objects that are instances of each of ``bases`` (one list per base), and\n"
"every type that matched the first base: one pass over gc.get_objects() that no other\n"
"thread can interrupt.");

static PyObject *objects_of_types(PyObject *self, PyObject *args) {
    PyObject *bases;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &bases)) return NULL;
    Py_ssize_t nb = PyTuple_GET_SIZE(bases);
    if (nb < 1 || nb > 31) {
        PyErr_SetString(PyExc_ValueError, "between 1 and 31 base types");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(bases, i))) {
            PyErr_SetString(PyExc_TypeError, "bases must be types");
            return NULL;
        }
    }
    PyObject *found = PyList_New(nb), *first = PySet_New(NULL), *masks = PyDict_New();
    PyObject *objects = NULL, *result = NULL;
    int collecting = 0;
    if (!found || !first || !masks) goto done;
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *list = PyList_New(0);
        if (!list) goto done;
        PyList_SET_ITEM(found, i, list);
    }
    /* A collection set off by this function's own allocations could run finalizers
     * (Python code, a thread switch): none while the list is held. */
    collecting = PyGC_Disable();
    objects = PyObject_CallNoArgs(get_objects);
    if (!objects || !PyList_Check(objects)) goto done;
    Py_ssize_t n = PyList_GET_SIZE(objects);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *obj = PyList_GET_ITEM(objects, k);
        PyObject *tp = (PyObject *)Py_TYPE(obj);
        /* Which bases the type is a subtype of, as a bit mask, once per distinct type.
         * A type's hash and equality are its identity: no Python code runs here. */
        long mask;
        PyObject *cached = PyDict_GetItemWithError(masks, tp);
        if (cached) {
            mask = PyLong_AsLong(cached);
        } else {
            if (PyErr_Occurred()) goto done;
            mask = 0;
            for (Py_ssize_t i = 0; i < nb; i++) {
                if (PyType_IsSubtype((PyTypeObject *)tp,
                                     (PyTypeObject *)PyTuple_GET_ITEM(bases, i)))
                    mask |= 1L << i;
            }
            PyObject *value = PyLong_FromLong(mask);
            if (!value || PyDict_SetItem(masks, tp, value) < 0) {
                Py_XDECREF(value);
                goto done;
            }
            Py_DECREF(value);
            if ((mask & 1) && PySet_Add(first, tp) < 0) goto done;
        }
        for (Py_ssize_t i = 0; mask; i++, mask >>= 1) {
            if ((mask & 1) && PyList_Append(PyList_GET_ITEM(found, i), obj) < 0) goto done;
        }
    }
    result = PyTuple_Pack(2, found, first);
done:
    Py_XDECREF(objects); /* every object in it still has another owner: none dies here */
    if (collecting) PyGC_Enable();
    Py_XDECREF(masks);
    Py_XDECREF(found);
    Py_XDECREF(first);
    return result;
}

static PyMethodDef methods[] = {
    {"objects_of_types", objects_of_types, METH_VARARGS, objects_of_types_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_heap",
    "Objects of given types off the whole heap, in one uninterruptible C call.", -1, methods,
};

PyMODINIT_FUNC PyInit__heap(void) {
    PyObject *gc = PyImport_ImportModule("gc");
    if (!gc) return NULL;
    get_objects = PyObject_GetAttrString(gc, "get_objects");
    Py_DECREF(gc);
    if (!get_objects) return NULL;
    return PyModule_Create(&module);
}
