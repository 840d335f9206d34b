/* The Spark decoder's log scan in one pass of C (see loghub/spark/_decode.py).

scan_list(data, start, end) walks the LogGroup entries of a serialized LogGroupList in
data[start:end] (group_bounds(data) tells where each entry starts) and the Log messages
(field 1) of each group, skipping the groups' other fields, under exactly the fast path's
assumptions:

    list      (0A <varint length> <LogGroup>)*
    log       08 <varint Time, < 2**32>  (12 <varint length> <Content>)*  [25 <fixed32 Time_ns>]
    Content   0A <varint key length> <key>  12 <varint value length> <value>

with every length varint at most 3 bytes. It returns None as soon as anything breaks that
(the caller then takes the protobuf path, which defines the result), else the tuple

    (time_us int64[count], content_offsets int32[count + 1],
     key_offsets int32[pairs + 1], key_bytes, value_offsets int32[pairs + 1], value_bytes,
     uniform, ascii, logs_per_group int32[groups], group_fields)

as bytes objects, ready to be Arrow buffers: keys and values come out as the offsets and data
of two binary arrays. `uniform` is True when every log has the first log's keys in the same
order, which spares the caller its check for a key repeated in a log (it need only look at
the first log). `ascii` is True when every key and value is ASCII, hence valid UTF-8: the
caller then makes string arrays of them as they are, and has Arrow check the UTF-8 only
otherwise. `group_fields` has (topic, source, (tag key, tag value, ...)) as bytes for each
group, so that the caller needs no protobuf parse of the list at all. It reads the groups
where they are, in the pulled bytes: no copy of a group or a log is made, only of the keys
and values, with the short copies that most of them need done inline (copy_string).

The pure-Python twin is the Arrow-kernel path in _decode.py;
tests/unit/test_spark_decode_native.py holds the two to the same answers. Thread-safe: no
state; both passes over the logs run without the GIL (they touch no Python object), so the
worker's other thread hands the previous record batch to Spark meanwhile.
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
#define PREFETCH_AHEAD 1024 /* bytes: about four logs of an access log */

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

#define HIGH_BITS 0x8080808080808080ull

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Copies n bytes and returns them OR-ed together in 64-bit words (only the high bits
   matter: any set means a byte outside ASCII). Keys and values are mostly a few bytes long,
   where a call of memcpy per string cost more than the copy itself: up to 16 bytes are moved
   with two loads and two stores that may overlap but never reach outside the n bytes. */
static inline uint64_t copy_string(uint8_t *dst, const uint8_t *src, Py_ssize_t n) {
    if (n >= 8) {
        if (n <= 16) {
            uint64_t a = load64(src), b = load64(src + n - 8);
            memcpy(dst, &a, 8);
            memcpy(dst + n - 8, &b, 8);
            return a | b;
        }
        memcpy(dst, src, (size_t)n);
        uint64_t bits = 0;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) bits |= load64(src + i);
        return bits | load64(src + n - 8);
    }
    if (n >= 4) {
        uint32_t a = load32(src), b = load32(src + n - 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
        return (uint64_t)(a | b);
    }
    uint64_t bits = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        dst[i] = src[i];
        bits |= src[i];
    }
    return bits;
}

/* a[0..n) == b[0..n), without a call for the short keys of most logs. */
static inline int same_bytes(const uint8_t *a, const uint8_t *b, Py_ssize_t n) {
    if (n >= 8 && n <= 16) {
        return load64(a) == load64(b) && load64(a + n - 8) == load64(b + n - 8);
    }
    if (n >= 4 && n < 8) {
        return load32(a) == load32(b) && load32(a + n - 4) == load32(b + n - 4);
    }
    return memcmp(a, b, (size_t)n) == 0;
}

/* The outputs of one scan, allocated with the GIL held and filled without it. */
typedef struct {
    int64_t *times;
    int32_t *content_offsets, *key_offsets, *value_offsets;
    uint8_t *keys, *values;
} Outputs;

/* What the outputs of a scan need, summed over the logs measured so far. */
typedef struct {
    Py_ssize_t pairs, width_max, key_bytes, value_bytes;
} Sizes;

/* First pass, no Python objects touched: checks `count` logs and adds what they need to
   `sizes`; 0 when a log is off the fast path. */
static int measure(const Span *logs, Py_ssize_t count, Sizes *sizes) {
    int64_t ignored;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n = read_log(logs[i].start, logs[i].end, &ignored, NULL, &sizes->key_bytes,
                                &sizes->value_bytes);
        if (n < 0) return 0;
        sizes->pairs += n;
        if (n > sizes->width_max) sizes->width_max = n;
    }
    return 1;
}

/* Second pass, no Python objects touched: fills `out`. Returns the bits of every key and
   value OR-ed together (see copy_string) in *ascii_bits and whether the logs are uniform. */
static int fill(const Span *logs, Py_ssize_t count, Pair *pairs, const Outputs *out,
                uint64_t *ascii_bits) {
    /* locals, not out->: stores through the byte pointers could alias the struct, which
       would make the compiler reload every pointer after each copy */
    int64_t *times = out->times;
    int32_t *content_offsets = out->content_offsets, *key_offsets = out->key_offsets;
    int32_t *value_offsets = out->value_offsets;
    uint8_t *keys = out->keys, *values = out->values;
    Py_ssize_t pair_index = 0, key_at = 0, value_at = 0, unused_keys = 0, unused_values = 0;
    Py_ssize_t width = 0; /* the first log's pairs, at the start of the key outputs */
    int uniform = 1;
    uint64_t bits = 0;
    content_offsets[0] = 0;
    key_offsets[0] = 0;
    value_offsets[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n = read_log(logs[i].start, logs[i].end, &times[i], pairs, &unused_keys,
                                &unused_values);
        assert(n >= 0);
        if (i == 0) {
            width = n;
        } else if (uniform && n != width) {
            uniform = 0;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            Py_ssize_t key_length = pairs[j].key_length, value_length = pairs[j].value_length;
            if (uniform && i > 0) {
                Py_ssize_t first_start = key_offsets[j];
                uniform = key_offsets[j + 1] - first_start == key_length &&
                          same_bytes(keys + first_start, pairs[j].key, key_length);
            }
            bits |= copy_string(keys + key_at, pairs[j].key, key_length);
            key_at += key_length;
            bits |= copy_string(values + value_at, pairs[j].value, value_length);
            value_at += value_length;
            pair_index++;
            key_offsets[pair_index] = (int32_t)key_at;
            value_offsets[pair_index] = (int32_t)value_at;
        }
        content_offsets[i + 1] = (int32_t)pair_index;
    }
    *ascii_bits = bits;
    return uniform;
}

/* The second pass over `count` logs, measured into `sizes`: the tuple described at the top
   (without the last item), NULL with an exception set on failure. The pass runs without the
   GIL: the executor's other thread hands record batches to Spark meanwhile. */
static PyObject *scan_spans(const Span *logs, Py_ssize_t count, const Sizes *sizes) {
    PyObject *result = NULL;
    PyObject *times = NULL, *content_offsets = NULL, *key_offsets = NULL, *keys = NULL;
    PyObject *value_offsets = NULL, *values = NULL;
    Pair *pairs = NULL;
    Py_ssize_t pair_count = sizes->pairs, width_max = sizes->width_max;
    Py_ssize_t key_bytes = sizes->key_bytes, value_bytes = sizes->value_bytes;
    Outputs out = {0};
    times = new_bytes(count * (Py_ssize_t)sizeof(int64_t), (char **)&out.times);
    content_offsets = new_bytes((count + 1) * (Py_ssize_t)sizeof(int32_t),
                                (char **)&out.content_offsets);
    key_offsets = new_bytes((pair_count + 1) * (Py_ssize_t)sizeof(int32_t),
                            (char **)&out.key_offsets);
    keys = new_bytes(key_bytes, (char **)&out.keys);
    value_offsets = new_bytes((pair_count + 1) * (Py_ssize_t)sizeof(int32_t),
                              (char **)&out.value_offsets);
    values = new_bytes(value_bytes, (char **)&out.values);
    /* pairs holds one log's pairs at a time */
    pairs = PyMem_RawMalloc(sizeof(Pair) * (size_t)(width_max > 0 ? width_max : 1));
    if (!times || !content_offsets || !key_offsets || !keys || !value_offsets || !values || !pairs) {
        if (pairs == NULL) PyErr_NoMemory();
        goto done;
    }
    uint64_t bits;
    int uniform;
    Py_BEGIN_ALLOW_THREADS
    uniform = fill(logs, count, pairs, &out, &bits);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OOOOOONN)", times, content_offsets, key_offsets, keys, value_offsets,
                           values, PyBool_FromLong(uniform),
                           PyBool_FromLong((bits & HIGH_BITS) == 0));
done:
    PyMem_RawFree(pairs);
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

/* A growing array of spans. */
typedef struct {
    Span *items;
    Py_ssize_t count, capacity;
} Spans;

static int push_span(Spans *spans, const uint8_t *start, const uint8_t *end) {
    if (spans->count == spans->capacity) {
        Py_ssize_t capacity = spans->capacity ? 2 * spans->capacity : 1024;
        Span *items = PyMem_RawRealloc(spans->items, sizeof(Span) * (size_t)capacity);
        if (items == NULL) return 0;
        spans->items = items;
        spans->capacity = capacity;
    }
    spans->items[spans->count].start = start;
    spans->items[spans->count].end = end;
    spans->count++;
    return 1;
}

/* A group's fields other than its logs, as spans of the pulled bytes (the tags' keys and
   values alternate in `tags`, from tag_first on). A field that is not there is empty. */
typedef struct {
    Span topic, source;
    Py_ssize_t tag_first, tag_count;
} GroupFields;

/* One LogTag message in [p, end): its Key (1) and then its Value (2), each length-delimited
   and both required, and nothing else, which is what every serializer writes; 0 otherwise
   (the protobuf path then decides, and refuses a tag that lacks either). */
static int read_tag(const uint8_t *p, const uint8_t *end, Span *key, Span *value) {
    uint64_t length;
    Span *spans[2] = {key, value};
    for (int i = 0; i < 2; i++) {
        if (p >= end || *p != ((i + 1) << 3 | 2)) return 0;
        p++;
        if (!read_varint(&p, end, 5, &length) || length > (uint64_t)(end - p)) return 0;
        spans[i]->start = p;
        spans[i]->end = p += length;
    }
    return p == end;
}

/* Adds every Logs field (1, length-delimited) of one serialized LogGroup to `logs`, and its
   Topic (3), Source (4) and LogTags (6) to `fields` and `tags`; the last Topic or Source
   wins, as in protobuf. Returns the logs found, -1 when the group is not plain, -2 when out
   of memory. */
static Py_ssize_t walk_group(const uint8_t *p, const uint8_t *end, Spans *logs,
                             GroupFields *fields, Spans *tags) {
    Py_ssize_t count = 0;
    fields->topic.start = fields->topic.end = p;
    fields->source = fields->topic;
    fields->tag_first = tags->count;
    fields->tag_count = 0;
    while (p < end) {
        uint64_t key, length;
        if (!read_varint(&p, end, 5, &key) || (key >> 3) == 0) return -1;
        uint64_t number = key >> 3;
        if (number == 1 || number == 3 || number == 4 || number == 6) {
            if ((key & 7) != 2) return -1;
            if (!read_varint(&p, end, 5, &length) || length > (uint64_t)(end - p)) return -1;
            const uint8_t *field_end = p + length;
            if (number == 1) {
                /* each step's address depends on the last one's load: ask for the bytes a
                   few logs ahead now, so that those misses overlap instead of queueing */
                __builtin_prefetch(p + PREFETCH_AHEAD);
                if (!push_span(logs, p, field_end)) return -2;
                count++;
            } else if (number == 3) {
                fields->topic.start = p;
                fields->topic.end = field_end;
            } else if (number == 4) {
                fields->source.start = p;
                fields->source.end = field_end;
            } else {
                Span tag_key, tag_value;
                if (!read_tag(p, field_end, &tag_key, &tag_value)) return -1;
                if (!push_span(tags, tag_key.start, tag_key.end) ||
                    !push_span(tags, tag_value.start, tag_value.end))
                    return -2;
                fields->tag_count++;
            }
            p = field_end;
        } else if (!skip_field(&p, end, (unsigned)(key & 7))) {
            return -1;
        }
    }
    return count;
}

/* The LogGroup entries (field 1, length-delimited) of a serialized LogGroupList in
   [p, end), as spans; 0 when anything else is there (the caller then takes the protobuf
   path), -1 when out of memory. */
static int walk_list(const uint8_t *p, const uint8_t *end, Spans *groups) {
    while (p < end) {
        uint64_t length;
        if (*p++ != (1 << 3 | 2)) return 0;
        if (!read_varint(&p, end, 5, &length) || length > (uint64_t)(end - p)) return 0;
        if (!push_span(groups, p, p + length)) return -1;
        p += length;
    }
    return 1;
}

/* group_bounds(data) -> int64 offsets of every LogGroup entry of the serialized
   LogGroupList `data` and of its end (one more than the groups), or None when the list has
   anything but LogGroup entries. */
static PyObject *group_bounds(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *base = view.buf, *end = base + view.len;
    Spans groups = {NULL, 0, 0};
    PyObject *result = NULL;
    int walked = walk_list(base, end, &groups);
    if (walked < 0) {
        PyErr_NoMemory();
    } else if (walked == 0) {
        result = Py_NewRef(Py_None);
    } else {
        char *data;
        result = new_bytes((groups.count + 1) * (Py_ssize_t)sizeof(int64_t), &data);
        if (result != NULL) {
            int64_t *offsets = (int64_t *)data;
            for (Py_ssize_t g = 0; g < groups.count; g++) {
                offsets[g] = g == 0 ? 0 : (int64_t)(groups.items[g - 1].end - base);
            }
            offsets[groups.count] = (int64_t)view.len;
        }
    }
    PyMem_RawFree(groups.items);
    PyBuffer_Release(&view);
    return result;
}

/* Walks the groups of [p, end) and measures each group's logs right after finding them,
   while the group's bytes are still in the cache (a group is a few hundred KB; a chunk is
   megabytes, and the first touch of each log was the scan's largest cost). 1, 0 when
   something is off the fast path, -1 when out of memory. */
static int walk_and_measure(const uint8_t *p, const uint8_t *end, Spans *groups, Spans *logs,
                            int32_t **per_group, GroupFields **fields, Spans *tags,
                            Sizes *sizes) {
    int walked = walk_list(p, end, groups);
    if (walked <= 0) return walked;
    size_t slots = (size_t)(groups->count > 0 ? groups->count : 1);
    *per_group = PyMem_RawMalloc(sizeof(int32_t) * slots);
    *fields = PyMem_RawMalloc(sizeof(GroupFields) * slots);
    if (*per_group == NULL || *fields == NULL) return -1;
    for (Py_ssize_t g = 0; g < groups->count; g++) {
        Py_ssize_t before = logs->count;
        Py_ssize_t n = walk_group(groups->items[g].start, groups->items[g].end, logs,
                                  &(*fields)[g], tags);
        if (n < 0) return n == -2 ? -1 : 0;
        if (!measure(logs->items + before, n, sizes)) return 0;
        (*per_group)[g] = (int32_t)n;
    }
    return 1;
}

static PyObject *span_bytes(Span span) {
    return PyBytes_FromStringAndSize((const char *)span.start, span.end - span.start);
}

/* ((topic, source, (tag key, tag value, ...)), ...) as bytes, one entry a group. */
static PyObject *group_fields(const GroupFields *fields, Py_ssize_t count, const Spans *tags) {
    PyObject *result = PyTuple_New(count);
    if (result == NULL) return NULL;
    for (Py_ssize_t g = 0; g < count; g++) {
        const GroupFields *f = &fields[g];
        PyObject *tag_tuple = PyTuple_New(2 * f->tag_count);
        if (tag_tuple == NULL) goto fail;
        for (Py_ssize_t t = 0; t < 2 * f->tag_count; t++) {
            PyObject *item = span_bytes(tags->items[f->tag_first + t]);
            if (item == NULL) {
                Py_DECREF(tag_tuple);
                goto fail;
            }
            PyTuple_SET_ITEM(tag_tuple, t, item);
        }
        PyObject *entry = Py_BuildValue("(NNN)", span_bytes(f->topic), span_bytes(f->source),
                                        tag_tuple);
        if (entry == NULL) goto fail;
        PyTuple_SET_ITEM(result, g, entry);
    }
    return result;
fail:
    Py_DECREF(result);
    return NULL;
}

/* scan_list(data, start, end): the logs of the LogGroup entries in data[start:end]. */
static PyObject *scan_list(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &start, &end)) return NULL;
    PyObject *result = NULL, *scanned = NULL, *per_group = NULL, *per_group_fields = NULL;
    Spans groups = {NULL, 0, 0}, logs = {NULL, 0, 0}, tags = {NULL, 0, 0};
    int32_t *counts = NULL;
    GroupFields *fields = NULL;
    Sizes sizes = {0, 0, 0, 0};
    int walked;
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "scan_list: the range is outside the data");
        goto done;
    }
    const uint8_t *base = view.buf;
    Py_BEGIN_ALLOW_THREADS
    walked = walk_and_measure(base + start, base + end, &groups, &logs, &counts, &fields, &tags,
                              &sizes);
    Py_END_ALLOW_THREADS
    if (walked <= 0) {
        if (walked < 0) PyErr_NoMemory();
        else result = Py_NewRef(Py_None);
        goto done;
    }
    if (sizes.key_bytes > INT32_MAX || sizes.value_bytes > INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    char *per_group_data = NULL;
    per_group = new_bytes(groups.count * (Py_ssize_t)sizeof(int32_t), &per_group_data);
    if (per_group == NULL) goto done;
    if (groups.count > 0) memcpy(per_group_data, counts, sizeof(int32_t) * (size_t)groups.count);
    per_group_fields = group_fields(fields, groups.count, &tags);
    if (per_group_fields == NULL) goto done;
    scanned = scan_spans(logs.items, logs.count, &sizes);
    if (scanned == NULL) goto done;
    PyObject *tail = PyTuple_Pack(2, per_group, per_group_fields);
    if (tail != NULL) {
        result = PySequence_Concat(scanned, tail);
        Py_DECREF(tail);
    }
done:
    PyMem_RawFree(counts);
    PyMem_RawFree(fields);
    PyMem_RawFree(groups.items);
    PyMem_RawFree(logs.items);
    PyMem_RawFree(tags.items);
    Py_XDECREF(scanned);
    Py_XDECREF(per_group);
    Py_XDECREF(per_group_fields);
    PyBuffer_Release(&view);
    return result;
}

/* repeat(groups, counts): the per-log column of a per-group value. groups[g] is a sequence
   of str (one for a string column, a group's tag keys or values for the tags map), repeated
   counts[g] times (counts: int32 a group, as scan_list gives them). Returns the bytes
   (list_offsets int32[logs + 1], offsets int32[items + 1], data): each log's items as a list
   of the string array (offsets, data), or None when the strings would pass 2 GiB, the most
   one Arrow string array holds. Spares Arrow's take of a whole record batch for values that
   change once a group. */
static PyObject *repeat(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *groups_arg, *result = NULL, *groups = NULL;
    PyObject *list_offsets = NULL, *offsets = NULL, *data = NULL;
    Py_buffer counts_view;
    if (!PyArg_ParseTuple(args, "Oy*", &groups_arg, &counts_view)) return NULL;
    const int32_t *counts = counts_view.buf;
    Py_ssize_t group_count = counts_view.len / (Py_ssize_t)sizeof(int32_t);
    groups = PySequence_Fast(groups_arg, "repeat: groups must be a sequence");
    if (groups == NULL) goto done;
    if (PySequence_Fast_GET_SIZE(groups) != group_count) {
        PyErr_SetString(PyExc_ValueError, "repeat: one count a group");
        goto done;
    }
    /* first pass: sizes, and every item's UTF-8 (cached in the str by CPython) */
    int64_t logs = 0, items = 0, bytes = 0;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *group = PySequence_Fast_GET_ITEM(groups, g);
        if (!PyTuple_Check(group) && !PyList_Check(group)) {
            PyErr_SetString(PyExc_TypeError, "repeat: each group must be a list or tuple");
            goto done;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(group), block = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t size;
            if (PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(group, i), &size) == NULL)
                goto done;
            block += size;
        }
        if (counts[g] < 0) {
            PyErr_SetString(PyExc_ValueError, "repeat: a negative count");
            goto done;
        }
        logs += counts[g];
        items += (int64_t)n * counts[g];
        bytes += (int64_t)block * counts[g];
    }
    if (bytes > INT32_MAX || items > INT32_MAX || logs > INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int32_t *list_out = NULL, *offsets_out = NULL;
    char *data_out = NULL;
    list_offsets = new_bytes((Py_ssize_t)(logs + 1) * (Py_ssize_t)sizeof(int32_t),
                             (char **)&list_out);
    offsets = new_bytes((Py_ssize_t)(items + 1) * (Py_ssize_t)sizeof(int32_t),
                        (char **)&offsets_out);
    data = new_bytes((Py_ssize_t)bytes, &data_out);
    if (list_offsets == NULL || offsets == NULL || data == NULL) goto done;
    /* second pass: the first copy of a group's block from its strings, the others from it */
    int32_t log_at = 0, item_at = 0, byte_at = 0;
    list_out[0] = 0;
    offsets_out[0] = 0;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *group = PySequence_Fast_GET_ITEM(groups, g);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(group);
        int32_t block_start = byte_at, first_item = item_at;
        for (int32_t r = 0; r < counts[g]; r++) {
            if (r == 0) {
                for (Py_ssize_t i = 0; i < n; i++) {
                    Py_ssize_t size;
                    const char *utf8 =
                        PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(group, i), &size);
                    memcpy(data_out + byte_at, utf8, (size_t)size);
                    byte_at += (int32_t)size;
                    offsets_out[++item_at] = byte_at;
                }
            } else {
                int32_t length = offsets_out[first_item + n] - block_start;
                memcpy(data_out + byte_at, data_out + block_start, (size_t)length);
                for (Py_ssize_t i = 1; i <= n; i++) {
                    offsets_out[++item_at] = byte_at + offsets_out[first_item + i] - block_start;
                }
                byte_at += length;
            }
            list_out[++log_at] = item_at;
        }
    }
    result = PyTuple_Pack(3, list_offsets, offsets, data);
done:
    Py_XDECREF(groups);
    Py_XDECREF(list_offsets);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    PyBuffer_Release(&counts_view);
    return result;
}

static PyMethodDef methods[] = {
    {"group_bounds", group_bounds, METH_O,
     "group_bounds(data) -> int64 offsets of each LogGroup entry and of the end, or None."},
    {"scan_list", scan_list, METH_VARARGS,
     "scan_list(data, start, end) -> (time_us, content_offsets, key_offsets, keys, "
     "value_offsets, values, uniform, ascii, logs_per_group, group_fields), or None when a "
     "log is off the fast path."},
    {"repeat", repeat, METH_VARARGS,
     "repeat(groups, counts) -> (list_offsets, offsets, data) of each group's strings "
     "repeated counts[g] times, or None past 2 GiB."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
