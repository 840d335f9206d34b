/* The read path's inner loop in C: read a run of framed records from a segment file into a
 * caller's buffer with pread, check each record's header and CRC32C, and move the payloads
 * (or whole records) down over the headers in place. The contract, the statuses and the
 * pure-Python twin are in loghub/storage/_gather.py; this file follows that walk step for
 * step, so that both return the same tuple, and tests/unit/test_gather.py holds them to it.
 *
 *   gather(fd, out, out_offset, position, limit, sequence, start_seq, stop_seq, count_max,
 *          bytes_max, take_first, raw, payload_bytes_max)
 *       -> (status, position, sequence, out_end, count, taken_bytes, loaded_end)
 *
 * The buffer is borrowed writable (Py_buffer), so a bytearray being read into cannot be
 * resized meanwhile. The whole call (pread, checks, CRC32C, moves) touches no Python object
 * and releases the GIL. CRC32C uses the SSE 4.2 instruction when the CPU has it, else a
 * table (slicing by 8); both give what the crc32c package gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

enum {
    DONE = 0,
    LIMIT = 1,
    NEED_ROOM = 2,
    INCOMPLETE_HEADER = 3,
    BAD_HEADER = 4,
    INCOMPLETE_RECORD = 5,
    CRC_MISMATCH = 6,
};

#define HEADER_BYTES 30
#define CRC_COVERED_BYTES 26
#define FORMAT_VERSION 1
/* An lz4 entry of loghub/wire/stored.py counts as the framed entry it expands to. */
#define LZ4_ENTRY_MARK 0xFF
#define LZ4_ENTRY_HEAD_BYTES 13

/* What a payload counts against bytes_max: an lz4 entry its expanded size (a pull's byte
 * limit is in raw bytes), any other its length. As _payload_cost in _gather.py. */
static Py_ssize_t payload_cost(const uint8_t *payload, uint32_t length) {
    if (payload[0] != LZ4_ENTRY_MARK) return (Py_ssize_t)length;
    uint64_t raw_size = (uint64_t)payload[1] | (uint64_t)payload[2] << 8 |
                        (uint64_t)payload[3] << 16 | (uint64_t)payload[4] << 24;
    Py_ssize_t varint_bytes = 1;
    while (raw_size >> (7 * varint_bytes)) varint_bytes++;
    return (Py_ssize_t)(1 + varint_bytes + raw_size);
}

/* --- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ----------------------------- */

static uint32_t crc_table[8][256];

static void crc_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        crc_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            crc = crc_table[0][crc & 0xff] ^ (crc >> 8);
            crc_table[k][n] = crc;
        }
    }
}

/* The running (already inverted) CRC over p[0..n), slicing by 8. */
static uint32_t crc_update_table(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        crc = crc_table[7][low & 0xff] ^ crc_table[6][(low >> 8) & 0xff] ^
              crc_table[5][(low >> 16) & 0xff] ^ crc_table[4][low >> 24] ^
              crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
              crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc_update_sse42(uint32_t crc,
                                                                  const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

static int have_sse42 = 0;

static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef HAVE_SSE42_PATH
    if (have_sse42) return crc_update_sse42(crc, p, n);
#endif
    return crc_update_table(crc, p, n);
}

/* --- the walk ------------------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

typedef struct {
    /* in */
    int fd;
    uint8_t *out;
    Py_ssize_t out_len;
    Py_ssize_t out_offset;
    long long position, limit, sequence, start_seq, stop_seq, count_max, bytes_max;
    int take_first, raw;
    long long payload_bytes_max;
    long long read_max; /* bytes to read at most (the buffer may be larger: it is reused) */
    /* out */
    int status;
    int error; /* errno of a failed pread, or 0 */
    Py_ssize_t out_end, loaded_end;
    long long count, taken;
} Walk;

/* Reads up to size bytes at position into out; fewer only at the end of the file. */
static Py_ssize_t pread_into(Walk *w, uint8_t *dest, Py_ssize_t size, long long position) {
    Py_ssize_t got = 0;
    while (got < size) {
        ssize_t n = pread(w->fd, dest + got, (size_t)(size - got), (off_t)(position + got));
        if (n < 0) {
            if (errno == EINTR) continue;
            w->error = errno;
            return -1;
        }
        if (n == 0) break;
        got += n;
    }
    return got;
}

static void walk(Walk *w) {
    w->status = DONE;
    w->out_end = w->loaded_end = w->out_offset;
    w->count = w->taken = 0;
    if (w->sequence >= w->stop_seq || w->count_max <= 0) return;
    long long wanted = w->limit - w->position;
    Py_ssize_t room = w->out_len - w->out_offset;
    if (w->read_max < room) room = (Py_ssize_t)w->read_max;
    Py_ssize_t to_read = room < wanted ? room : (Py_ssize_t)wanted;
    Py_ssize_t got = pread_into(w, w->out + w->out_offset, to_read, w->position);
    if (got < 0) return;
    w->loaded_end = w->out_offset + got;
    int room_limited = got == to_read && room < wanted;
    Py_ssize_t index = w->out_offset;
    Py_ssize_t out_end = w->out_offset;
    while (w->sequence < w->stop_seq && w->count < w->count_max) {
        if (index + HEADER_BYTES > w->loaded_end) {
            w->status = room_limited ? NEED_ROOM : INCOMPLETE_HEADER;
            break;
        }
        const uint8_t *header = w->out + index;
        uint64_t record_seq = be64(header + 6);
        uint32_t length = be32(header + 22);
        if (header[0] != FORMAT_VERSION || header[1] != 0 ||
            record_seq != (uint64_t)w->sequence || (long long)length > w->payload_bytes_max) {
            w->status = BAD_HEADER;
            break;
        }
        Py_ssize_t record_bytes = HEADER_BYTES + (Py_ssize_t)length;
        if (w->sequence >= w->start_seq) {
            Py_ssize_t cost = w->raw ? record_bytes : (Py_ssize_t)length;
            if (!w->raw && length >= LZ4_ENTRY_HEAD_BYTES) {
                if (index + HEADER_BYTES + 5 > w->loaded_end) {
                    w->status = room_limited ? NEED_ROOM : INCOMPLETE_RECORD;
                    break;
                }
                cost = payload_cost(header + HEADER_BYTES, length);
            }
            if ((w->count || !w->take_first) && w->taken + cost > w->bytes_max) {
                w->status = LIMIT;
                break;
            }
            if (index + record_bytes > w->loaded_end) {
                w->status = room_limited ? NEED_ROOM : INCOMPLETE_RECORD;
                break;
            }
            uint32_t crc = crc_update(0xFFFFFFFFu, header, CRC_COVERED_BYTES);
            crc = crc_update(crc, header + HEADER_BYTES, length) ^ 0xFFFFFFFFu;
            if (crc != be32(header + CRC_COVERED_BYTES)) {
                w->status = CRC_MISMATCH;
                break;
            }
            const uint8_t *source = w->raw ? header : header + HEADER_BYTES;
            Py_ssize_t moved = w->raw ? record_bytes : (Py_ssize_t)length;
            if (w->out + out_end != source) memmove(w->out + out_end, source, (size_t)moved);
            out_end += moved;
            w->taken += cost;
            w->count += 1;
        }
        index += record_bytes;
        w->position += record_bytes;
        w->sequence += 1;
    }
    w->out_end = out_end;
}

static PyObject *gather(PyObject *module, PyObject *args) {
    (void)module;
    Walk w;
    memset(&w, 0, sizeof w);
    PyObject *out;
    if (!PyArg_ParseTuple(args, "iOnLLLLLLLppLL", &w.fd, &out, &w.out_offset, &w.position,
                          &w.limit, &w.sequence, &w.start_seq, &w.stop_seq, &w.count_max,
                          &w.bytes_max, &w.take_first, &w.raw, &w.payload_bytes_max,
                          &w.read_max))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (w.out_offset < 0 || w.out_offset > view.len || w.position < 0 ||
        w.position > w.limit || w.read_max < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "gather: offset, position or read_max out of range");
        return NULL;
    }
    w.out = (uint8_t *)view.buf;
    w.out_len = view.len;
    Py_BEGIN_ALLOW_THREADS
    walk(&w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (w.error) {
        errno = w.error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(iLLnLLn)", w.status, w.position, w.sequence, w.out_end, w.count,
                         w.taken, w.loaded_end);
}

/* crc32c(data, value, table) -> int: the CRC32C the walk computes, continued from value as
 * the crc32c package does; table=True takes the table path even where the instruction is
 * there, so that a test can check both. */
static PyObject *crc32c_(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    unsigned int value;
    int table;
    if (!PyArg_ParseTuple(args, "y*Ip", &view, &value, &table)) return NULL;
    uint32_t crc = value ^ 0xFFFFFFFFu;
    const uint8_t *data = (const uint8_t *)view.buf;
    crc = table ? crc_update_table(crc, data, (size_t)view.len)
                : crc_update(crc, data, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc ^ 0xFFFFFFFFu);
}

static PyMethodDef methods[] = {
    {"crc32c", crc32c_, METH_VARARGS,
     "crc32c(data, value, table) -> int: the walk's CRC32C (table=True: the table path)"},
    {"gather", gather, METH_VARARGS,
     "gather(fd, out, out_offset, position, limit, sequence, start_seq, stop_seq, count_max, "
     "bytes_max, take_first, raw, payload_bytes_max, read_max) -> (status, position, sequence, "
     "out_end, count, taken_bytes, loaded_end)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gather_c", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gather_c(void) {
    crc_table_init();
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
