/* The Spark decoder's log scan in one pass of C (see loghub/spark/_decode.py).

scan_groups(groups) walks the Log messages (field 1) of a sequence of serialized LogGroups
(bytes), skipping the groups' other fields, under exactly the fast path's assumptions:

    log       08 <varint Time, < 2**32>  (12 <varint length> <Content>)*  [25 <fixed32 Time_ns>]
    Content   0A <varint key length> <key>  12 <varint value length> <value>

with every length varint at most 3 bytes. It returns None as soon as a log breaks any of
that (the caller then takes the protobuf path, which defines the result), else the tuple

    (time_us int64[count], content_offsets int32[count + 1],
     key_offsets int32[pairs + 1], key_bytes, value_offsets int32[pairs + 1], value_bytes,
     uniform, logs_per_group int32[groups])

as bytes objects, ready to be Arrow buffers: keys and values come out as the offsets and data
of two binary arrays (UTF-8 is checked by the caller, with Arrow). `uniform` is True when
every log has the first log's keys in the same order, which spares the caller its check
for a key repeated in a log (it need only look at the first log). The pure-Python twin is
the Arrow-kernel path in _decode.py; tests/unit/test_spark_decode_native.py holds the two to
the same answers. Thread-safe: no state; the GIL is held (the scan is short and allocates
Python objects).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TAG_TIME 0x08
#define TAG_CONTENT 0x12
#define TAG_TIME_NS 0x25
#define TAG_KEY 0x0A
#define TIME_VARINT_BYTES_MAX 5
#define LENGTH_VARINT_BYTES_MAX 3

/* A varint of at most bytes_max bytes that ends before `end`; 0 when there is none. */
static int read_varint(const uint8_t **p, const uint8_t *end, int bytes_max, uint64_t *out) {
    uint64_t value = 0;
    for (int i = 0; i < bytes_max; i++) {
        if (*p >= end) return 0;
        uint8_t byte = *(*p)++;
        value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = value;
            return 1;
        }
    }
    return 0;
}

typedef struct {
    const uint8_t *key;
    Py_ssize_t key_length;
    const uint8_t *value;
    Py_ssize_t value_length;
} Pair;

/* Reads one Content at *p (its tag already checked) into `pair`; 0 when it breaks the rules. */
static int read_content(const uint8_t **p, const uint8_t *end, Pair *pair) {
    uint64_t length, key_length, value_length;
    const uint8_t *q = *p + 1;
    if (!read_varint(&q, end, LENGTH_VARINT_BYTES_MAX, &length)) return 0;
    if (length > (uint64_t)(end - q)) return 0;
    const uint8_t *content_end = q + length;
    if (q >= content_end || *q != TAG_KEY) return 0;
    q++;
    if (!read_varint(&q, content_end, LENGTH_VARINT_BYTES_MAX, &key_length)) return 0;
    if (key_length >= (uint64_t)(content_end - q)) return 0; /* the value's tag must follow */
    pair->key = q;
    pair->key_length = (Py_ssize_t)key_length;
    q += key_length;
    if (*q != TAG_CONTENT) return 0;
    q++;
    if (!read_varint(&q, content_end, LENGTH_VARINT_BYTES_MAX, &value_length)) return 0;
    if (value_length != (uint64_t)(content_end - q)) return 0;
    pair->value = q;
    pair->value_length = (Py_ssize_t)value_length;
    *p = content_end;
    return 1;
}

/* Walks one log. With `pairs` NULL only counts; else fills pairs[0..]. Returns the number of
   pairs, or -1 when the log breaks the rules. */
static Py_ssize_t read_log(const uint8_t *p, const uint8_t *end, int64_t *time_us, Pair *pairs,
                           Py_ssize_t *key_bytes, Py_ssize_t *value_bytes) {
    uint64_t time_s, nanos = 0;
    Py_ssize_t count = 0;
    Pair pair;
    if (p >= end || *p != TAG_TIME) return -1;
    p++;
    if (!read_varint(&p, end, TIME_VARINT_BYTES_MAX, &time_s) || time_s > 0xFFFFFFFFu) return -1;
    while (p < end && *p == TAG_CONTENT) {
        if (!read_content(&p, end, &pair)) return -1;
        if (pairs != NULL) pairs[count] = pair;
        *key_bytes += pair.key_length;
        *value_bytes += pair.value_length;
        count++;
    }
    if (p < end && *p == TAG_TIME_NS && end - p >= 5) {
        nanos = (uint64_t)p[1] | (uint64_t)p[2] << 8 | (uint64_t)p[3] << 16 | (uint64_t)p[4] << 24;
        p += 5;
    }
    if (p != end) return -1;
    *time_us = (int64_t)(time_s * 1000000u + nanos / 1000u);
    return count;
}

static PyObject *new_bytes(Py_ssize_t size, char **data) {
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes != NULL) *data = PyBytes_AS_STRING(bytes);
    return bytes;
}

typedef struct {
    const uint8_t *start;
    const uint8_t *end;
} Span;

/* The two passes over `count` logs: the 7-tuple described at the top, None when a log is off
   the fast path, NULL with an exception set on failure. */
static PyObject *scan_spans(const Span *logs, Py_ssize_t count) {
    PyObject *result = NULL;
    PyObject *times = NULL, *content_offsets = NULL, *key_offsets = NULL, *keys = NULL;
    PyObject *value_offsets = NULL, *values = NULL;
    Pair *pairs = NULL;
    /* First pass: check every log and size the outputs. */
    Py_ssize_t pair_count = 0, key_bytes = 0, value_bytes = 0;
    int64_t ignored;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n = read_log(logs[i].start, logs[i].end, &ignored, NULL, &key_bytes,
                                &value_bytes);
        if (n < 0) return Py_NewRef(Py_None);
        pair_count += n;
    }
    if (key_bytes > INT32_MAX || value_bytes > INT32_MAX) return Py_NewRef(Py_None);
    char *time_data = NULL, *content_data = NULL, *key_offset_data = NULL, *key_data = NULL;
    char *value_offset_data = NULL, *value_data = NULL;
    times = new_bytes(count * (Py_ssize_t)sizeof(int64_t), &time_data);
    content_offsets = new_bytes((count + 1) * (Py_ssize_t)sizeof(int32_t), &content_data);
    key_offsets = new_bytes((pair_count + 1) * (Py_ssize_t)sizeof(int32_t), &key_offset_data);
    keys = new_bytes(key_bytes, &key_data);
    value_offsets = new_bytes((pair_count + 1) * (Py_ssize_t)sizeof(int32_t), &value_offset_data);
    values = new_bytes(value_bytes, &value_data);
    pairs = PyMem_Malloc(sizeof(Pair) * (pair_count > 0 ? pair_count : 1));
    if (!times || !content_offsets || !key_offsets || !keys || !value_offsets || !values || !pairs) {
        if (pairs == NULL) PyErr_NoMemory();
        goto done;
    }
    /* Second pass: fill them. */
    int64_t *time_out = (int64_t *)time_data;
    int32_t *content_out = (int32_t *)content_data;
    int32_t *key_offset_out = (int32_t *)key_offset_data;
    int32_t *value_offset_out = (int32_t *)value_offset_data;
    Py_ssize_t pair_index = 0, key_at = 0, value_at = 0, unused_keys = 0, unused_values = 0;
    Py_ssize_t width = 0; /* the first log's pairs, at the start of the key outputs */
    int uniform = 1;
    content_out[0] = 0;
    key_offset_out[0] = 0;
    value_offset_out[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n = read_log(logs[i].start, logs[i].end, &time_out[i], pairs, &unused_keys,
                                &unused_values);
        assert(n >= 0);
        if (i == 0) {
            width = n;
        } else if (uniform && n != width) {
            uniform = 0;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            if (uniform && i > 0) {
                Py_ssize_t first_start = key_offset_out[j];
                Py_ssize_t first_length = key_offset_out[j + 1] - first_start;
                uniform = first_length == pairs[j].key_length &&
                          memcmp(key_data + first_start, pairs[j].key, (size_t)first_length) == 0;
            }
            memcpy(key_data + key_at, pairs[j].key, (size_t)pairs[j].key_length);
            key_at += pairs[j].key_length;
            memcpy(value_data + value_at, pairs[j].value, (size_t)pairs[j].value_length);
            value_at += pairs[j].value_length;
            pair_index++;
            key_offset_out[pair_index] = (int32_t)key_at;
            value_offset_out[pair_index] = (int32_t)value_at;
        }
        content_out[i + 1] = (int32_t)pair_index;
    }
    result = Py_BuildValue("(OOOOOON)", times, content_offsets, key_offsets, keys, value_offsets,
                           values, PyBool_FromLong(uniform));
done:
    PyMem_Free(pairs);
    Py_XDECREF(times);
    Py_XDECREF(content_offsets);
    Py_XDECREF(key_offsets);
    Py_XDECREF(keys);
    Py_XDECREF(value_offsets);
    Py_XDECREF(values);
    return result;
}

/* Steps over one field of wire type `wire_type` at *p; 0 for a group (never in a LogGroup)
   or a field running past `end`. */
static int skip_field(const uint8_t **p, const uint8_t *end, unsigned wire_type) {
    uint64_t length;
    switch (wire_type) {
    case 0:
        return read_varint(p, end, 10, &length);
    case 1:
        length = 8;
        break;
    case 2:
        if (!read_varint(p, end, 5, &length)) return 0;
        break;
    case 5:
        length = 4;
        break;
    default:
        return 0;
    }
    if (length > (uint64_t)(end - *p)) return 0;
    *p += length;
    return 1;
}

/* Calls back for every Logs field (1, length-delimited) of one serialized LogGroup: with
   `spans` NULL only counts. Returns the logs found, or -1 when the group is not plain. */
static Py_ssize_t walk_group(const uint8_t *p, const uint8_t *end, Span *spans) {
    Py_ssize_t count = 0;
    while (p < end) {
        uint64_t key, length;
        if (!read_varint(&p, end, 5, &key) || (key >> 3) == 0) return -1;
        if (key == (1 << 3 | 2)) {
            if (!read_varint(&p, end, 5, &length) || length > (uint64_t)(end - p)) return -1;
            if (spans != NULL) {
                spans[count].start = p;
                spans[count].end = p + length;
            }
            p += length;
            count++;
        } else if ((key >> 3) == 1 || !skip_field(&p, end, (unsigned)(key & 7))) {
            return -1;
        }
    }
    return count;
}

static PyObject *scan_groups(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *groups = PySequence_Fast(arg, "scan_groups takes a sequence of bytes");
    if (groups == NULL) return NULL;
    Py_ssize_t group_count = PySequence_Fast_GET_SIZE(groups);
    PyObject **items = PySequence_Fast_ITEMS(groups);
    PyObject *result = NULL, *scanned = NULL, *per_group = NULL;
    Span *spans = NULL;
    char *per_group_data = NULL;
    Py_ssize_t log_count = 0;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        if (!PyBytes_Check(items[g])) {
            PyErr_SetString(PyExc_TypeError, "scan_groups takes a sequence of bytes");
            goto done;
        }
        const uint8_t *start = (const uint8_t *)PyBytes_AS_STRING(items[g]);
        Py_ssize_t n = walk_group(start, start + PyBytes_GET_SIZE(items[g]), NULL);
        if (n < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        log_count += n;
    }
    spans = PyMem_Malloc(sizeof(Span) * (log_count > 0 ? log_count : 1));
    per_group = new_bytes(group_count * (Py_ssize_t)sizeof(int32_t), &per_group_data);
    if (spans == NULL || per_group == NULL) {
        if (spans == NULL) PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        const uint8_t *start = (const uint8_t *)PyBytes_AS_STRING(items[g]);
        Py_ssize_t n = walk_group(start, start + PyBytes_GET_SIZE(items[g]), spans + at);
        ((int32_t *)per_group_data)[g] = (int32_t)n;
        at += n;
    }
    scanned = scan_spans(spans, log_count);
    if (scanned == NULL || scanned == Py_None) {
        result = scanned;
        scanned = NULL;
        goto done;
    }
    PyObject *tail = PyTuple_Pack(1, per_group);
    if (tail != NULL) {
        result = PySequence_Concat(scanned, tail);
        Py_DECREF(tail);
    }
done:
    PyMem_Free(spans);
    Py_XDECREF(scanned);
    Py_XDECREF(per_group);
    Py_DECREF(groups);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_groups", scan_groups, METH_O,
     "scan_groups(groups) -> (time_us, content_offsets, key_offsets, keys, value_offsets, "
     "values, uniform, logs_per_group), or None when a log is off the fast path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
