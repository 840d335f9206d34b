/* Proving bytes a complete LogGroup in one pass, without building messages: the server's
 * check of every PutLogs body, in C. The rules (what upb accepts, which fields are required)
 * and the pure-Python twin are in loghub/wire/logcheck.py; this file follows that walk step
 * for step, so that both return the same tuple, and a test holds them to it.
 *
 *   scan(data: bytes-like) -> (status, log_count, where, index)
 *
 * The buffer is borrowed (Py_buffer), not copied. The walk touches no Python object, so it
 * releases the GIL for large bodies; small ones keep it, since handing the GIL over and
 * waiting to get it back can cost more than the walk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Keep in step with logcheck.py. */
enum {
    OK = 0,
    MALFORMED_TRUNCATED = 1,
    MALFORMED_VARINT = 2,
    MALFORMED_TAG = 3,
    MALFORMED_GROUP = 4,
    MALFORMED_DEPTH = 5,
    MISSING_LOG_TIME = 6,
    MISSING_CONTENT_KEY = 7,
    MISSING_CONTENT_VALUE = 8,
    MISSING_TAG_KEY = 9,
    MISSING_TAG_VALUE = 10,
};

#define DEPTH_MAX 100
#define WIRE_VARINT 0
#define WIRE_FIXED64 1
#define WIRE_LENGTH 2
#define WIRE_START_GROUP 3
#define WIRE_END_GROUP 4
#define WIRE_FIXED32 5
#define TAG_GROUP_LOG 0x0A   /* LogGroup.Logs */
#define TAG_GROUP_TAGS 0x32  /* LogGroup.LogTags */
#define TAG_LOG_TIME 0x08    /* Log.Time */
#define TAG_LOG_CONTENT 0x12 /* Log.Contents */
#define TAG_KEY 0x0A         /* Content.Key, LogTag.Key */
#define TAG_VALUE 0x12       /* Content.Value, LogTag.Value */
#define GIL_RELEASE_BYTES (64 * 1024)

typedef struct {
    const uint8_t *data;
    long long log_count;
    long long tag_count;
    int status; /* the first malformation, then nothing else counts */
    long long where;
    int missing_status; /* the first missing required field */
    long long missing_where;
    long long missing_index;
} Walk;

static void malformed(Walk *walk, int status, Py_ssize_t where) {
    walk->status = status;
    walk->where = (long long)where;
}

static void note_missing(Walk *walk, int status, long long where, long long index) {
    if (walk->missing_status == OK) {
        walk->missing_status = status;
        walk->missing_where = where;
        walk->missing_index = index;
    }
}

#define INLINE static inline __attribute__((always_inline))
#define NOINLINE static __attribute__((noinline))

/* Reads a varint of at most 10 bytes (bits past the 64th dropped); returns the position after
 * it, or -1 after noting the malformation. */
NOINLINE Py_ssize_t read_varint_slow(Walk *walk, Py_ssize_t pos, Py_ssize_t end,
                                     Py_ssize_t field_start, uint64_t *value) {
    const uint8_t *data = walk->data;
    uint64_t result = 0;
    int shift = 0;
    for (int i = 0; i < 10; i++) {
        if (pos >= end) {
            malformed(walk, MALFORMED_TRUNCATED, field_start);
            return -1;
        }
        uint8_t byte = data[pos++];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *value = result;
            return pos;
        }
        shift += 7;
    }
    malformed(walk, MALFORMED_VARINT, field_start);
    return -1;
}

INLINE Py_ssize_t read_varint(Walk *walk, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t field_start,
                              uint64_t *value) {
    if (pos < end && walk->data[pos] < 0x80) {
        *value = walk->data[pos];
        return pos + 1;
    }
    return read_varint_slow(walk, pos, end, field_start, value);
}

/* Reads a tag: at most 5 bytes, a value that fits 32 bits, field > 0, wire type < 6. */
NOINLINE Py_ssize_t read_tag_slow(Walk *walk, Py_ssize_t pos, Py_ssize_t end, uint64_t *tag_out) {
    const uint8_t *data = walk->data;
    Py_ssize_t start = pos;
    uint64_t tag = data[pos++];
    if (tag >= 0x80) {
        tag &= 0x7F;
        int shift = 7;
        for (;;) {
            if (pos >= end) {
                malformed(walk, MALFORMED_TRUNCATED, start);
                return -1;
            }
            if (pos - start == 5) {
                malformed(walk, MALFORMED_TAG, start);
                return -1;
            }
            uint8_t byte = data[pos++];
            tag |= (uint64_t)(byte & 0x7F) << shift;
            shift += 7;
            if (byte < 0x80) break;
        }
        if (tag > 0xFFFFFFFFull) {
            malformed(walk, MALFORMED_TAG, start);
            return -1;
        }
    }
    if (tag < 8 || (tag & 7) > WIRE_FIXED32) {
        malformed(walk, MALFORMED_TAG, start);
        return -1;
    }
    *tag_out = tag;
    return pos;
}

INLINE Py_ssize_t read_tag(Walk *walk, Py_ssize_t pos, Py_ssize_t end, uint64_t *tag_out) {
    uint8_t byte = walk->data[pos];
    if (byte >= 8 && byte < 0x80 && (byte & 7) <= WIRE_FIXED32) {
        *tag_out = byte;
        return pos + 1;
    }
    return read_tag_slow(walk, pos, end, tag_out);
}

/* Reads a length and checks that many bytes fit before end; returns the start of the bytes
 * (their end in *value_end). */
INLINE Py_ssize_t read_delimited(Walk *walk, Py_ssize_t pos, Py_ssize_t end,
                                 Py_ssize_t field_start, Py_ssize_t *value_end) {
    uint64_t length;
    pos = read_varint(walk, pos, end, field_start, &length);
    if (pos < 0) return -1;
    if (length > (uint64_t)(end - pos)) {
        malformed(walk, MALFORMED_TRUNCATED, field_start);
        return -1;
    }
    *value_end = pos + (Py_ssize_t)length;
    return pos;
}

static Py_ssize_t unknown_group(Walk *walk, uint64_t field, Py_ssize_t pos, Py_ssize_t end,
                                int depth);

/* The position after an unknown field (or a known one read past). */
static Py_ssize_t skip(Walk *walk, uint64_t tag, Py_ssize_t pos, Py_ssize_t end, int depth,
                       Py_ssize_t field_start) {
    uint64_t ignored;
    Py_ssize_t value_end;
    switch (tag & 7) {
    case WIRE_LENGTH:
        if (read_delimited(walk, pos, end, field_start, &value_end) < 0) return -1;
        return value_end;
    case WIRE_VARINT:
        return read_varint(walk, pos, end, field_start, &ignored);
    case WIRE_FIXED32:
    case WIRE_FIXED64:
        pos += (tag & 7) == WIRE_FIXED32 ? 4 : 8;
        if (pos > end) {
            malformed(walk, MALFORMED_TRUNCATED, field_start);
            return -1;
        }
        return pos;
    case WIRE_START_GROUP:
        if (depth <= 0) {
            malformed(walk, MALFORMED_DEPTH, field_start);
            return -1;
        }
        return unknown_group(walk, tag >> 3, pos, end, depth - 1);
    default: /* an end-group tag outside its group */
        malformed(walk, MALFORMED_GROUP, field_start);
        return -1;
    }
}

/* The position after an unknown group's end-group tag. */
static Py_ssize_t unknown_group(Walk *walk, uint64_t field, Py_ssize_t pos, Py_ssize_t end,
                                int depth) {
    while (pos < end) {
        Py_ssize_t field_start = pos;
        uint64_t tag;
        pos = read_tag(walk, pos, end, &tag);
        if (pos < 0) return -1;
        if ((tag & 7) == WIRE_END_GROUP) {
            if ((tag >> 3) != field) {
                malformed(walk, MALFORMED_GROUP, field_start);
                return -1;
            }
            return pos;
        }
        pos = skip(walk, tag, pos, end, depth, field_start);
        if (pos < 0) return -1;
    }
    malformed(walk, MALFORMED_GROUP, end); /* the group never ended */
    return -1;
}

/* A length of one or two bytes at *pos that fits before end, or -1 (then the general walk
 * decides). */
INLINE Py_ssize_t short_length(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end) {
    Py_ssize_t at = *pos, length;
    if (at < end && data[at] < 0x80) {
        length = data[at];
        at += 1;
    } else if (at + 1 < end && data[at + 1] < 0x80) {
        length = (data[at] & 0x7F) | (Py_ssize_t)data[at + 1] << 7;
        at += 2;
    } else {
        return -1;
    }
    if (length > end - at) return -1;
    *pos = at;
    return length;
}

/* Whether [pos, end) is a Key and a Value and nothing else, with short lengths: what every
 * writer sends, and what the general walk would accept with both fields found. */
INLINE int canonical_pair(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end) {
    if (pos >= end || data[pos] != TAG_KEY) return 0;
    pos++;
    Py_ssize_t length = short_length(data, &pos, end);
    if (length < 0) return 0;
    pos += length;
    if (pos >= end || data[pos] != TAG_VALUE) return 0;
    pos++;
    length = short_length(data, &pos, end);
    return length >= 0 && pos + length == end;
}

/* Walks a Content or a LogTag; sets bit 1 of *found for its Key, bit 2 for its Value. */
static int pair(Walk *walk, Py_ssize_t pos, Py_ssize_t end, int depth, int *found) {
    if (canonical_pair(walk->data, pos, end)) {
        *found = 3;
        return 0;
    }
    *found = 0;
    while (pos < end) {
        Py_ssize_t field_start = pos;
        uint64_t tag;
        Py_ssize_t value_end;
        pos = read_tag(walk, pos, end, &tag);
        if (pos < 0) return -1;
        if (tag == TAG_KEY || tag == TAG_VALUE) {
            if (read_delimited(walk, pos, end, field_start, &value_end) < 0) return -1;
            pos = value_end;
            *found |= tag == TAG_KEY ? 1 : 2;
        } else {
            pos = skip(walk, tag, pos, end, depth, field_start);
            if (pos < 0) return -1;
        }
    }
    return 0;
}

static int log_message(Walk *walk, Py_ssize_t pos, Py_ssize_t end, int depth) {
    long long log_index = walk->log_count - 1;
    long long content_count = 0;
    int has_time = 0;
    while (pos < end) {
        Py_ssize_t field_start = pos;
        uint64_t tag, ignored;
        Py_ssize_t value_end;
        pos = read_tag(walk, pos, end, &tag);
        if (pos < 0) return -1;
        if (tag == TAG_LOG_TIME) {
            pos = read_varint(walk, pos, end, field_start, &ignored);
            if (pos < 0) return -1;
            has_time = 1;
        } else if (tag == TAG_LOG_CONTENT) {
            Py_ssize_t start = read_delimited(walk, pos, end, field_start, &value_end);
            if (start < 0) return -1;
            int found;
            if (pair(walk, start, value_end, depth - 1, &found) < 0) return -1;
            if (!(found & 1))
                note_missing(walk, MISSING_CONTENT_KEY, log_index, content_count);
            else if (!(found & 2))
                note_missing(walk, MISSING_CONTENT_VALUE, log_index, content_count);
            content_count++;
            pos = value_end;
        } else {
            pos = skip(walk, tag, pos, end, depth, field_start);
            if (pos < 0) return -1;
        }
    }
    if (!has_time) note_missing(walk, MISSING_LOG_TIME, log_index, 0);
    return 0;
}

static int log_group(Walk *walk, Py_ssize_t pos, Py_ssize_t end) {
    int depth = DEPTH_MAX;
    while (pos < end) {
        Py_ssize_t field_start = pos;
        uint64_t tag;
        Py_ssize_t value_end;
        pos = read_tag(walk, pos, end, &tag);
        if (pos < 0) return -1;
        if (tag == TAG_GROUP_LOG) {
            Py_ssize_t start = read_delimited(walk, pos, end, field_start, &value_end);
            if (start < 0) return -1;
            walk->log_count++;
            if (log_message(walk, start, value_end, depth - 1) < 0) return -1;
            pos = value_end;
        } else if (tag == TAG_GROUP_TAGS) {
            Py_ssize_t start = read_delimited(walk, pos, end, field_start, &value_end);
            if (start < 0) return -1;
            walk->tag_count++;
            int found;
            if (pair(walk, start, value_end, depth - 1, &found) < 0) return -1;
            if (!(found & 1))
                note_missing(walk, MISSING_TAG_KEY, walk->tag_count - 1, 0);
            else if (!(found & 2))
                note_missing(walk, MISSING_TAG_VALUE, walk->tag_count - 1, 0);
            pos = value_end;
        } else {
            pos = skip(walk, tag, pos, end, depth, field_start);
            if (pos < 0) return -1;
        }
    }
    return 0;
}

static PyObject *scan(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Walk walk = {(const uint8_t *)view.buf, 0, 0, OK, 0, OK, 0, 0};
    if (view.len >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        log_group(&walk, 0, view.len);
        Py_END_ALLOW_THREADS
    } else {
        log_group(&walk, 0, view.len);
    }
    PyBuffer_Release(&view);
    if (walk.status != OK)
        return Py_BuildValue("(iLLi)", walk.status, walk.log_count, walk.where, 0);
    if (walk.missing_status != OK)
        return Py_BuildValue("(iLLL)", walk.missing_status, walk.log_count, walk.missing_where,
                             walk.missing_index);
    return Py_BuildValue("(iLii)", OK, walk.log_count, 0, 0);
}

/* Adds to `length` the extension bytes at block[*at] (255 means another follows) and moves
 * *at past them: 0, or -1 when the block ends first. */
static int extend_length(const uint8_t *block, size_t size, size_t *at, size_t *length) {
    unsigned extra;
    do {
        if (*at >= size) return -1;
        extra = block[(*at)++];
        *length += extra;
    } while (extra == 255);
    return 0;
}

/* The literal run of the token at `at`: its length, where its bytes start, the match nibble;
 * -1 when it does not fit the block. As _literal_run in stored.py. */
static int literal_run(const uint8_t *block, size_t size, size_t at, size_t *literals,
                       size_t *literals_at, unsigned *nibble) {
    if (at >= size) return -1;
    unsigned token = block[at++];
    size_t length = token >> 4;
    if (length == 15 && extend_length(block, size, &at, &length) < 0) return -1;
    if (length > size - at) return -1;
    *literals = length;
    *literals_at = at;
    *nibble = token & 15;
    return 0;
}

/* Where the last sequence (literals only) of an LZ4 block starts, or -1 when the block's
 * sequences do not end exactly at its end. The twin of lz4_last_sequence_python in
 * loghub/wire/stored.py, step for step. */
static long long lz4_last(const uint8_t *block, Py_ssize_t size) {
    size_t at = 0, literals, literals_at;
    unsigned nibble;
    for (;;) {
        size_t start = at;
        if (literal_run(block, (size_t)size, at, &literals, &literals_at, &nibble) < 0) return -1;
        at = literals_at + literals;
        if (at == (size_t)size) return (long long)start;
        if (at + 2 > (size_t)size) return -1;
        if (block[at] == 0 && block[at + 1] == 0) return -1; /* offset 0 is invalid */
        at += 2;
        size_t length = nibble;
        if (nibble == 15 && extend_length(block, (size_t)size, &at, &length) < 0) return -1;
    }
}

static PyObject *lz4_last_sequence(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    long long found;
    if (view.len >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        found = lz4_last((const uint8_t *)view.buf, view.len);
        Py_END_ALLOW_THREADS
    } else {
        found = lz4_last((const uint8_t *)view.buf, view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(found);
}

/* A safe LZ4 block decoder: `block` must decode to exactly `dst_size` bytes, every match
 * within what this block wrote. 0, or -1 for anything else. Used on blocks that the server
 * decompressed with the reference decoder before it stored them; the bounds are checked all
 * the same, so that no input can write or read outside the buffers. */
static int lz4_decode(const uint8_t *block, Py_ssize_t size, uint8_t *dst, Py_ssize_t dst_size) {
    size_t at = 0, literals, literals_at;
    unsigned nibble;
    uint8_t *op = dst;
    uint8_t *oend = dst + dst_size;
    for (;;) {
        if (literal_run(block, (size_t)size, at, &literals, &literals_at, &nibble) < 0) return -1;
        if (literals > (size_t)(oend - op)) return -1;
        memcpy(op, block + literals_at, literals);
        op += literals;
        at = literals_at + literals;
        if (at == (size_t)size) break; /* the last sequence: literals only */
        if ((size_t)size - at < 2) return -1;
        size_t offset = (size_t)block[at] | (size_t)block[at + 1] << 8;
        at += 2;
        if (offset == 0 || offset > (size_t)(op - dst)) return -1;
        size_t length = nibble;
        if (nibble == 15 && extend_length(block, (size_t)size, &at, &length) < 0) return -1;
        length += 4;
        if (length > (size_t)(oend - op)) return -1;
        const uint8_t *match = op - offset;
        if (offset >= length) {
            memcpy(op, match, length);
        } else {
            for (size_t i = 0; i < length; i++) op[i] = match[i]; /* overlapping: a repeat */
        }
        op += length;
    }
    return op == oend ? 0 : -1;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The LogGroupList framing of a group of `raw` bytes (0x0A, then its length as a varint)
 * into `framing` (6 bytes of room); returns its length. */
static size_t put_framing(uint8_t framing[6], uint32_t raw) {
    size_t size = 0;
    framing[size++] = 0x0A;
    while (raw > 0x7F) {
        framing[size++] = (uint8_t)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    framing[size++] = (uint8_t)raw;
    return size;
}

/* The head of the lz4 entry at `in[at]` (see stored.py): 0, or -1 when it does not fit. */
static int entry_head(const uint8_t *in, Py_ssize_t size, Py_ssize_t at, uint32_t *raw,
                      uint32_t *block_size, uint32_t *last) {
    if (size - at < 13) return -1;
    *raw = le32(in + at + 1);
    *block_size = le32(in + at + 5);
    *last = le32(in + at + 9);
    if ((Py_ssize_t)*block_size > size - at - 13 || *last >= *block_size) return -1;
    return 0;
}

/* The twin of expand_python in loghub/wire/stored.py: stored entries to the serialized
 * LogGroupList, in one new bytes object of `expanded_size` bytes. -1 on a malformed entry
 * or a size that is not the entries'. */
static int expand_into(const uint8_t *in, Py_ssize_t size, uint8_t *out, Py_ssize_t out_size) {
    Py_ssize_t at = 0, produced = 0;
    while (at < size) {
        if (in[at] == 0xFF) {
            uint32_t raw, block_size, last;
            if (entry_head(in, size, at, &raw, &block_size, &last) < 0) return -1;
            Py_ssize_t start = at + 13;
            uint8_t framing[6];
            Py_ssize_t framing_size = (Py_ssize_t)put_framing(framing, raw);
            if (framing_size + (Py_ssize_t)raw > out_size - produced) return -1;
            memcpy(out + produced, framing, (size_t)framing_size);
            produced += framing_size;
            if (lz4_decode(in + start, block_size, out + produced, raw) < 0) return -1;
            produced += raw;
            at = start + block_size;
        } else if (in[at] == 0x0A) {
            Py_ssize_t cursor = at + 1;
            uint64_t length = 0;
            int shift = 0;
            for (;;) {
                if (cursor >= size || shift > 35) return -1;
                uint8_t byte = in[cursor++];
                length |= (uint64_t)(byte & 0x7F) << shift;
                shift += 7;
                if (byte < 0x80) break;
            }
            if (length > (uint64_t)(size - cursor)) return -1;
            Py_ssize_t entry = cursor + (Py_ssize_t)length - at;
            if (entry > out_size - produced) return -1;
            memcpy(out + produced, in + at, (size_t)entry);
            produced += entry;
            at += entry;
        } else {
            return -1;
        }
    }
    return produced == out_size ? 0 : -1;
}

static PyObject *expand(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    Py_ssize_t expanded_size;
    if (!PyArg_ParseTuple(args, "y*n", &view, &expanded_size)) return NULL;
    if (expanded_size < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "a negative size");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, expanded_size);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = expand_into((const uint8_t *)view.buf, view.len,
                         (uint8_t *)PyBytes_AS_STRING(out), expanded_size);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status < 0) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "not stored entries of that expanded size");
        return NULL;
    }
    return out;
}

/* --- joining stored LZ4 blocks into one (the twin of lz4_reply in stored.py) -------------- */

typedef struct {
    uint8_t *data;
    size_t size, room;
} Bytes;

static int bytes_put(Bytes *b, const uint8_t *p, size_t n) {
    if (b->size + n > b->room) {
        size_t room = b->room ? b->room : 4096;
        while (room < b->size + n) room *= 2;
        uint8_t *grown = realloc(b->data, room);
        if (grown == NULL) return -1;
        b->data = grown;
        b->room = room;
    }
    memcpy(b->data + b->size, p, n);
    b->size += n;
    return 0;
}

static int put_token(Bytes *out, size_t literals, unsigned match_nibble) {
    uint8_t head[1 + 64];
    if (literals < 15) {
        head[0] = (uint8_t)(literals << 4 | match_nibble);
        return bytes_put(out, head, 1);
    }
    head[0] = (uint8_t)(0xF0 | match_nibble);
    if (bytes_put(out, head, 1) < 0) return -1;
    size_t rest = literals - 15;
    memset(head, 255, sizeof head);
    while (rest >= 255) {
        size_t run = rest / 255 < sizeof head ? rest / 255 : sizeof head;
        if (bytes_put(out, head, run) < 0) return -1;
        rest -= run * 255;
    }
    uint8_t last = (uint8_t)rest;
    return bytes_put(out, &last, 1);
}

/* 0: joined; 1: a framed entry is there (the caller joins in Python, compressing such runs);
 * -1: malformed entries; -2: out of memory. */
static int join_blocks(const uint8_t *in, Py_ssize_t size, Bytes *out, Bytes *pending,
                       unsigned long long *raw_total) {
    Py_ssize_t at = 0;
    while (at < size) {
        if (in[at] != 0xFF) return 1;
        uint32_t raw, block_size, last;
        if (entry_head(in, size, at, &raw, &block_size, &last) < 0) return -1;
        const uint8_t *block = in + at + 13;
        uint8_t framing[6];
        size_t framing_size = put_framing(framing, raw);
        if (bytes_put(pending, framing, framing_size) < 0) return -2;
        size_t literals, literals_at, tail, tail_at;
        unsigned nibble, tail_nibble;
        if (literal_run(block, block_size, 0, &literals, &literals_at, &nibble) < 0) return -1;
        if (last == 0) {
            if (bytes_put(pending, block + literals_at, literals) < 0) return -2;
        } else {
            if (literals_at + literals > last) return -1;
            if (put_token(out, pending->size + literals, nibble) < 0) return -2;
            if (bytes_put(out, pending->data, pending->size) < 0) return -2;
            pending->size = 0;
            if (bytes_put(out, block + literals_at, last - literals_at) < 0) return -2;
            if (literal_run(block, block_size, last, &tail, &tail_at, &tail_nibble) < 0) return -1;
            if (bytes_put(pending, block + tail_at, tail) < 0) return -2;
        }
        *raw_total += 1 + (framing_size - 1) + raw;
        at += 13 + (Py_ssize_t)block_size;
    }
    if (put_token(out, pending->size, 0) < 0) return -2;
    if (bytes_put(out, pending->data, pending->size) < 0) return -2;
    return 0;
}

static PyObject *lz4_join(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Bytes out = {NULL, 0, 0}, pending = {NULL, 0, 0};
    unsigned long long raw_total = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    /* room for the blocks and a few bytes per entry at once: no regrowth in the common case */
    size_t room = (size_t)view.len + (size_t)view.len / 64 + 64;
    out.data = malloc(room);
    out.room = out.data == NULL ? 0 : room;
    status = out.data == NULL
                 ? -2
                 : join_blocks((const uint8_t *)view.buf, view.len, &out, &pending, &raw_total);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    free(pending.data);
    PyObject *result = NULL;
    if (status == 0) {
        result = Py_BuildValue("(y#K)", (const char *)out.data, (Py_ssize_t)out.size, raw_total);
    } else if (status == 1) {
        result = Py_NewRef(Py_None);
    } else if (status == -1) {
        PyErr_SetString(PyExc_ValueError, "malformed stored entries");
    } else {
        PyErr_NoMemory();
    }
    free(out.data);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(data) -> (status, log_count, where, index): one pass over a serialized LogGroup"},
    {"lz4_join", lz4_join, METH_O,
     "lz4_join(entries) -> (block, raw size), or None when a framed entry is among them"},
    {"expand", expand, METH_VARARGS,
     "expand(entries, expanded_size) -> the serialized LogGroupList of stored entries"},
    {"lz4_last_sequence", lz4_last_sequence, METH_O,
     "lz4_last_sequence(block) -> where its last sequence starts, or -1: not a block"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_logcheck", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__logcheck(void) { return PyModule_Create(&module); }
