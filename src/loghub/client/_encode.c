/* The Logs of a LogGroup as protobuf wire bytes, from decoded JSON lines: the producer's hot
 * loop in C. A pure-Python twin (loghub.client.producer._encode_logs_py) gives the same bytes;
 * a test holds the two to it.
 *
 *   encode_logs(values: list[dict[str, str]], times: list[int]) -> bytes
 *
 * Each log is LogGroup field 1 (0x0A, length, Log); a Log is Time (0x08 varint) followed by
 * its contents in dict order, each Content being field 2 (0x12, length, 0x0A key 0x12 value).
 * A value that is not a str raises TypeError: the caller then takes the general path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
} Buffer;

static int reserve(Buffer *buffer, Py_ssize_t more) {
    if (buffer->size + more <= buffer->capacity) return 0;
    Py_ssize_t capacity = buffer->capacity * 2;
    if (capacity < buffer->size + more) capacity = buffer->size + more;
    char *data = PyMem_Realloc(buffer->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->data = data;
    buffer->capacity = capacity;
    return 0;
}

static int varint_size(unsigned long long value) {
    int size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static void put_varint(Buffer *buffer, unsigned long long value) {
    while (value >= 0x80) {
        buffer->data[buffer->size++] = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    buffer->data[buffer->size++] = (char)value;
}

/* Appends one Log (without its LogGroup tag and length) to buffer. */
static int put_log(Buffer *buffer, PyObject *contents, unsigned long long time_s) {
    if (reserve(buffer, 11) < 0) return -1;
    buffer->data[buffer->size++] = 0x08;
    put_varint(buffer, time_s);
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(contents, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value)) {
            PyErr_SetString(PyExc_TypeError, "a key or value is not a str");
            return -1;
        }
        Py_ssize_t key_size, value_size;
        const char *key_bytes = PyUnicode_AsUTF8AndSize(key, &key_size);
        if (key_bytes == NULL) return -1;
        const char *value_bytes = PyUnicode_AsUTF8AndSize(value, &value_size);
        if (value_bytes == NULL) return -1;
        unsigned long long content_size = 2 + (unsigned long long)varint_size(key_size) +
                                          key_size + varint_size(value_size) + value_size;
        if (reserve(buffer, 1 + 10 + (Py_ssize_t)content_size) < 0) return -1;
        buffer->data[buffer->size++] = 0x12;
        put_varint(buffer, content_size);
        buffer->data[buffer->size++] = 0x0A;
        put_varint(buffer, (unsigned long long)key_size);
        memcpy(buffer->data + buffer->size, key_bytes, (size_t)key_size);
        buffer->size += key_size;
        buffer->data[buffer->size++] = 0x12;
        put_varint(buffer, (unsigned long long)value_size);
        memcpy(buffer->data + buffer->size, value_bytes, (size_t)value_size);
        buffer->size += value_size;
    }
    return 0;
}

static PyObject *encode_logs(PyObject *self, PyObject *args) {
    PyObject *values, *times;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &values, &PyList_Type, &times)) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(times) != count) {
        PyErr_SetString(PyExc_ValueError, "values and times differ in length");
        return NULL;
    }
    Buffer out = {NULL, 0, 0};
    Buffer log = {NULL, 0, 0};
    if (reserve(&out, 64 + count * 256) < 0 || reserve(&log, 1024) < 0) goto failed;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *contents = PyList_GET_ITEM(values, index);
        if (!PyDict_CheckExact(contents)) {
            PyErr_SetString(PyExc_TypeError, "a log is not a dict");
            goto failed;
        }
        unsigned long long time_s = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(times, index));
        if (PyErr_Occurred()) goto failed;
        log.size = 0;
        if (put_log(&log, contents, time_s) < 0) goto failed;
        if (reserve(&out, 1 + 10 + log.size) < 0) goto failed;
        out.data[out.size++] = 0x0A;
        put_varint(&out, (unsigned long long)log.size);
        memcpy(out.data + out.size, log.data, (size_t)log.size);
        out.size += log.size;
    }
    PyObject *result = PyBytes_FromStringAndSize(out.data, out.size);
    PyMem_Free(out.data);
    PyMem_Free(log.data);
    return result;
failed:
    PyMem_Free(out.data);
    PyMem_Free(log.data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_logs", encode_logs, METH_VARARGS,
     "encode_logs(values, times) -> bytes: the Logs of a LogGroup, as wire bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode", NULL, -1, methods};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&module); }
