/*
 * torchmem.snapshots._scan: read a memory snapshot pickle without building its objects.
 *
 * Why this exists: a 1 GiB snapshot holds some 25 million Python objects (an event dict,
 * its frames list, frame dicts, strings). pickle.load builds them all (about 50 s and
 * 10 GiB), only for the indexer to fold them into a few numpy columns. This module runs
 * the pickle machine itself over the file's bytes (mapped, never copied) and keeps what
 * the index needs:
 *
 *   - every trace event (a dict with an "action") appended to a list: one row of columns
 *     (list, time, action code, address, size, stack id), in append order;
 *   - frames ({name, filename, line}) and stacks (lists of frames) interned as ids, as
 *     the events name them;
 *   - everything else (segments and their blocks, allocator settings) rebuilt as Python
 *     objects at the end: it is small next to the trace.
 *
 * It accepts only plain data (the opcodes pickle writes for dicts, lists, tuples, sets,
 * strings, bytes, numbers, None and booleans, protocols 2 to 5): anything else raises
 * ValueError, and the Python reader, which says what the file is, takes over. Every read
 * is bounds-checked; a truncated or damaged file raises ValueError, never reads past the
 * buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- values on the pickle machine's stack and in its memo ---- */

enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_OBJ, V_MARK };

typedef struct {
    uint8_t kind;
    uint32_t len; /* V_STR / V_BYTES: length in bytes */
    union {
        int64_t i;
        double f;
        const char *s;
        int32_t obj;
    } u;
} Val;

/* Containers. A dict or list that the trace uses is summarised (role) and its items
 * freed: a frame dict becomes a frame id, a frames list a stack id, an event dict a row. */
enum { O_LIST, O_DICT, O_TUPLE, O_SET, O_FROZENSET };
enum { R_PLAIN, R_FRAME, R_STACK, R_EVENT, R_EVENTS };

typedef struct {
    uint8_t type;
    uint8_t role;
    int32_t n, cap; /* items (a dict holds key, value, key, value ...) */
    int32_t summary; /* frame id, stack id or event row */
    Val *items;
} Obj;

typedef struct {
    const char *name, *file;
    uint32_t name_len, file_len;
    int64_t line;
} Frame;

/* A growable array of fixed-size elements. */
typedef struct {
    char *data;
    size_t n, cap, size;
} Vec;

static int vec_reserve(Vec *v, size_t want) {
    if (want <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < want) cap *= 2;
    char *data = realloc(v->data, cap * v->size);
    if (!data) return -1;
    v->data = data;
    v->cap = cap;
    return 0;
}

static void *vec_push(Vec *v) {
    if (vec_reserve(v, v->n + 1) < 0) return NULL;
    return v->data + (v->n++) * v->size;
}

#define VEC(type) {NULL, 0, 0, sizeof(type)}
#define AT(vec, type, i) (((type *)(vec).data)[i])

/* An open-addressing hash set of int32 ids, keyed by a caller's hash and equality. */
typedef struct {
    int32_t *slots;
    uint64_t *hashes;
    size_t cap, n;
} IdSet;

typedef struct {
    /* input */
    const unsigned char *buf;
    size_t size, pos;
    PyObject *progress;
    size_t next_report;
    const char **action_names;
    Py_ssize_t *action_lens;
    Py_ssize_t n_actions;
    /* machine */
    Vec stack, marks, memo, objs;
    /* interned */
    Vec frames;      /* Frame */
    IdSet frame_set;
    Vec stack_items; /* int32 frame ids, stacks back to back */
    Vec stack_start; /* int64 offset of each stack in stack_items, plus the end */
    IdSet stack_set;
    /* the event columns */
    Vec ev_list, ev_time, ev_action, ev_addr, ev_size, ev_stack;
    char error[200];
    int foreign; /* the error is a kind of pickle this reader leaves to pickle itself */
} Scan;

#define FAIL(sc, ...) (snprintf((sc)->error, sizeof((sc)->error), __VA_ARGS__), -1)

static uint64_t hash_bytes(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t hash_u64(uint64_t h, uint64_t x) {
    return hash_bytes(h, (const char *)&x, sizeof x);
}

typedef int (*EqFn)(Scan *, int32_t, const void *);

/* The id in `set` equal to `key` (by `eq`), or -1 with *slot set to where it goes. */
static int32_t idset_find(Scan *sc, IdSet *set, uint64_t h, const void *key, EqFn eq,
                          size_t *slot) {
    size_t mask = set->cap - 1, i = h & mask;
    while (set->slots[i] >= 0) {
        if (set->hashes[i] == h && eq(sc, set->slots[i], key)) return set->slots[i];
        i = (i + 1) & mask;
    }
    *slot = i;
    return -1;
}

static int idset_init(IdSet *set, size_t cap) {
    set->slots = malloc(cap * sizeof(int32_t));
    set->hashes = malloc(cap * sizeof(uint64_t));
    if (!set->slots || !set->hashes) return -1;
    memset(set->slots, 0xff, cap * sizeof(int32_t));
    set->cap = cap;
    set->n = 0;
    return 0;
}

static int idset_add(IdSet *set, size_t slot, uint64_t h, int32_t id) {
    set->slots[slot] = id;
    set->hashes[slot] = h;
    if (++set->n * 2 <= set->cap) return 0;
    IdSet bigger;
    if (idset_init(&bigger, set->cap * 2) < 0) return -1;
    for (size_t i = 0; i < set->cap; i++) {
        if (set->slots[i] < 0) continue;
        size_t j = set->hashes[i] & (bigger.cap - 1);
        while (bigger.slots[j] >= 0) j = (j + 1) & (bigger.cap - 1);
        bigger.slots[j] = set->slots[i];
        bigger.hashes[j] = set->hashes[i];
    }
    bigger.n = set->n;
    free(set->slots);
    free(set->hashes);
    *set = bigger;
    return 0;
}

/* ---- reading the buffer ---- */

static int need(Scan *sc, size_t n) {
    if (sc->size - sc->pos < n)
        return FAIL(sc, "the file ends inside an opcode at byte %zu", sc->pos);
    return 0;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

/* ---- the machine's stack ---- */

static int push(Scan *sc, Val v) {
    Val *slot = vec_push(&sc->stack);
    if (!slot) return FAIL(sc, "out of memory");
    *slot = v;
    return 0;
}

static int pop(Scan *sc, Val *out) {
    size_t floor = sc->marks.n ? (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) : 0;
    if (sc->stack.n <= floor) return FAIL(sc, "the pickle pops an empty stack");
    *out = AT(sc->stack, Val, --sc->stack.n);
    return 0;
}

static int top(Scan *sc, Val **out) {
    size_t floor = sc->marks.n ? (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) : 0;
    if (sc->stack.n <= floor) return FAIL(sc, "the pickle reads an empty stack");
    *out = &AT(sc->stack, Val, sc->stack.n - 1);
    return 0;
}

/* The position of the last mark, which is removed. */
static int pop_mark(Scan *sc, size_t *at) {
    if (!sc->marks.n) return FAIL(sc, "the pickle closes a mark it never opened");
    *at = (size_t)AT(sc->marks, int64_t, --sc->marks.n);
    return 0;
}

static int new_obj(Scan *sc, uint8_t type, Val *out) {
    if (sc->objs.n >= INT32_MAX) return FAIL(sc, "too many containers");
    Obj *o = vec_push(&sc->objs);
    if (!o) return FAIL(sc, "out of memory");
    memset(o, 0, sizeof *o);
    o->type = type;
    o->summary = -1;
    out->kind = V_OBJ;
    out->len = 0;
    out->u.obj = (int32_t)(sc->objs.n - 1);
    return 0;
}

static Obj *obj_of(Scan *sc, Val v) {
    return v.kind == V_OBJ ? &AT(sc->objs, Obj, v.u.obj) : NULL;
}

static int obj_add(Scan *sc, Obj *o, const Val *items, size_t n) {
    if ((size_t)o->n + n > INT32_MAX) return FAIL(sc, "a container too large");
    if ((size_t)o->n + n > (size_t)o->cap) {
        size_t cap = o->cap ? (size_t)o->cap : 4;
        while (cap < (size_t)o->n + n) cap *= 2;
        if (cap > INT32_MAX) cap = INT32_MAX;
        Val *items2 = realloc(o->items, cap * sizeof(Val));
        if (!items2) return FAIL(sc, "out of memory");
        o->items = items2;
        o->cap = (int32_t)cap;
    }
    memcpy(o->items + o->n, items, n * sizeof(Val));
    o->n += (int32_t)n;
    return 0;
}

static void obj_drop_items(Obj *o) {
    free(o->items);
    o->items = NULL;
    o->n = o->cap = 0;
}

/* ---- summaries: frames, stacks, events ---- */

static int is_str(Val v, const char *s) {
    size_t n = strlen(s);
    return v.kind == V_STR && v.len == n && memcmp(v.u.s, s, n) == 0;
}

static const Val *dict_get(Obj *o, const char *key) {
    for (int32_t i = 0; i + 1 < o->n; i += 2)
        if (is_str(o->items[i], key)) return &o->items[i + 1];
    return NULL;
}

static int frame_eq(Scan *sc, int32_t id, const void *key) {
    const Frame *a = &AT(sc->frames, Frame, id), *b = key;
    return a->line == b->line && a->name_len == b->name_len && a->file_len == b->file_len &&
           memcmp(a->name, b->name, a->name_len) == 0 &&
           memcmp(a->file, b->file, a->file_len) == 0;
}

/* The frame id of a frame dict ({name, filename, line}); -1 if `v` is not one. */
static int32_t frame_id(Scan *sc, Val v) {
    Obj *o = obj_of(sc, v);
    if (!o || o->type != O_DICT) return -1;
    if (o->role == R_FRAME) return o->summary;
    if (o->role != R_PLAIN) return -1;
    const Val *name = dict_get(o, "name"), *file = dict_get(o, "filename"),
              *line = dict_get(o, "line");
    if (!name || !file || name->kind != V_STR || file->kind != V_STR) return -1;
    Frame f = {name->u.s, file->u.s, name->len, file->len,
               line && line->kind == V_INT ? line->u.i : -1};
    uint64_t h = hash_u64(hash_bytes(hash_bytes(0xcbf29ce484222325ULL, f.name, f.name_len),
                                     f.file, f.file_len), (uint64_t)f.line);
    size_t slot;
    int32_t id = idset_find(sc, &sc->frame_set, h, &f, frame_eq, &slot);
    if (id < 0) {
        Frame *added = vec_push(&sc->frames);
        if (!added || idset_add(&sc->frame_set, slot, h, (int32_t)(sc->frames.n - 1)) < 0)
            return -2;
        *added = f;
        id = (int32_t)(sc->frames.n - 1);
    }
    /* Keep the items when the dict has more than a frame's three keys: nothing else
     * reads them, but a plain dict elsewhere in the tree should come back whole. */
    if (o->n == 6) obj_drop_items(o);
    o->role = R_FRAME;
    o->summary = id;
    return id;
}

typedef struct {
    const int32_t *ids;
    size_t n;
} StackKey;

static int stack_eq(Scan *sc, int32_t id, const void *key) {
    const StackKey *k = key;
    int64_t a = AT(sc->stack_start, int64_t, id), b = AT(sc->stack_start, int64_t, id + 1);
    return (size_t)(b - a) == k->n &&
           memcmp(&AT(sc->stack_items, int32_t, a), k->ids, k->n * sizeof(int32_t)) == 0;
}

/* The stack id of a frames list; -1 for none (no list, empty, or not frames); -2 when
 * out of memory. */
static int32_t stack_id(Scan *sc, Val v) {
    Obj *o = obj_of(sc, v);
    if (!o || o->type != O_LIST) return -1;
    if (o->role == R_STACK) return o->summary;
    if (o->role != R_PLAIN || o->n == 0) return -1;
    size_t base = sc->stack_items.n;
    if (vec_reserve(&sc->stack_items, base + (size_t)o->n) < 0) return -2;
    for (int32_t i = 0; i < o->n; i++) {
        int32_t f = frame_id(sc, o->items[i]);
        if (f == -2) return -2;
        if (f < 0) {
            sc->stack_items.n = base;
            return -1;
        }
        AT(sc->stack_items, int32_t, sc->stack_items.n++) = f;
    }
    StackKey key = {&AT(sc->stack_items, int32_t, base), (size_t)o->n};
    uint64_t h = hash_bytes(0xcbf29ce484222325ULL, (const char *)key.ids,
                            key.n * sizeof(int32_t));
    size_t slot;
    int32_t id = idset_find(sc, &sc->stack_set, h, &key, stack_eq, &slot);
    if (id >= 0) {
        sc->stack_items.n = base; /* already interned: forget the copy */
    } else {
        id = (int32_t)(sc->stack_start.n - 1);
        int64_t *end = vec_push(&sc->stack_start);
        if (!end || idset_add(&sc->stack_set, slot, h, id) < 0) return -2;
        *end = (int64_t)sc->stack_items.n;
    }
    obj_drop_items(o);
    o->role = R_STACK;
    o->summary = id;
    return id;
}

static int64_t int_or(const Val *v, int64_t otherwise) {
    return v && v->kind == V_INT ? v->u.i : otherwise;
}

/* Add the event dict `o` as a row of list `list`. */
static int emit_event(Scan *sc, Obj *o, int32_t list) {
    int64_t time, addr, size;
    int32_t stack;
    int8_t action;
    if (o->role == R_EVENT) { /* appended again: copy its row */
        size_t r = (size_t)o->summary;
        time = AT(sc->ev_time, int64_t, r);
        addr = AT(sc->ev_addr, int64_t, r);
        size = AT(sc->ev_size, int64_t, r);
        stack = AT(sc->ev_stack, int32_t, r);
        action = AT(sc->ev_action, int8_t, r);
    } else {
        const Val *a = dict_get(o, "action");
        action = 127;
        for (Py_ssize_t k = 0; k < sc->n_actions; k++)
            if (a->len == (size_t)sc->action_lens[k] &&
                memcmp(a->u.s, sc->action_names[k], a->len) == 0) {
                action = (int8_t)k;
                break;
            }
        time = int_or(dict_get(o, "time_us"), INT64_MIN);
        addr = int_or(dict_get(o, "addr"), 0);
        size = int_or(dict_get(o, "size"), 0);
        const Val *frames = dict_get(o, "frames");
        stack = frames ? stack_id(sc, *frames) : -1;
        if (stack == -2) return FAIL(sc, "out of memory");
    }
    if (sc->ev_list.n >= INT32_MAX) return FAIL(sc, "too many events");
    int32_t *l = vec_push(&sc->ev_list);
    int64_t *t = vec_push(&sc->ev_time), *ad = vec_push(&sc->ev_addr),
            *sz = vec_push(&sc->ev_size);
    int8_t *ac = vec_push(&sc->ev_action);
    int32_t *st = vec_push(&sc->ev_stack);
    if (!l || !t || !ad || !sz || !ac || !st) return FAIL(sc, "out of memory");
    *l = list, *t = time, *ad = addr, *sz = size, *ac = action, *st = stack;
    if (o->role != R_EVENT) {
        obj_drop_items(o);
        o->role = R_EVENT;
        o->summary = (int32_t)(sc->ev_list.n - 1);
    }
    return 0;
}

/* Append items to a list: events become rows, anything else is kept. */
static int list_append(Scan *sc, Val target, const Val *items, size_t n) {
    Obj *list = obj_of(sc, target);
    if (!list || list->type != O_LIST) return FAIL(sc, "the pickle appends to a non-list");
    for (size_t i = 0; i < n; i++) {
        Obj *o = obj_of(sc, items[i]);
        const Val *action = o && o->type == O_DICT && o->role == R_PLAIN
                                ? dict_get(o, "action") : NULL;
        if (o && o->type == O_DICT &&
            (o->role == R_EVENT || (action && action->kind == V_STR))) {
            if (emit_event(sc, o, target.u.obj) < 0) return -1;
            list->role = R_EVENTS;
        } else if (obj_add(sc, list, &items[i], 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- the machine ---- */

static int memo_put(Scan *sc, uint64_t index, Val v) {
    /* pickle numbers its memo entries in order: a far jump is a damaged file, not a
     * reason to allocate gigabytes */
    if (index > sc->memo.n + 65536) return FAIL(sc, "a memo index out of range");
    if (index >= sc->memo.n) {
        if (vec_reserve(&sc->memo, index + 1) < 0) return FAIL(sc, "out of memory");
        for (size_t i = sc->memo.n; i <= index; i++) AT(sc->memo, Val, i).kind = V_MARK;
        sc->memo.n = index + 1;
    }
    AT(sc->memo, Val, index) = v;
    return 0;
}

static int memo_get(Scan *sc, uint64_t index) {
    if (index >= sc->memo.n || AT(sc->memo, Val, index).kind == V_MARK)
        return FAIL(sc, "the pickle reads a memo entry it never wrote");
    return push(sc, AT(sc->memo, Val, index));
}

static int push_int(Scan *sc, int64_t i) {
    Val v = {V_INT, 0, {.i = i}};
    return push(sc, v);
}

static int push_str(Scan *sc, int kind, uint64_t n) {
    if (n > UINT32_MAX) return FAIL(sc, "a string over 4 GiB");
    if (need(sc, (size_t)n) < 0) return -1;
    Val v = {(uint8_t)kind, (uint32_t)n, {.s = (const char *)sc->buf + sc->pos}};
    sc->pos += (size_t)n;
    return push(sc, v);
}

/* A container from the items above the last mark. */
static int from_mark(Scan *sc, uint8_t type) {
    size_t at;
    if (pop_mark(sc, &at) < 0) return -1;
    Val v;
    if (new_obj(sc, type, &v) < 0) return -1;
    size_t n = sc->stack.n - at;
    if (type == O_DICT && n % 2) return FAIL(sc, "a dict with a key and no value");
    if (obj_add(sc, obj_of(sc, v), &AT(sc->stack, Val, at), n) < 0) return -1;
    sc->stack.n = at;
    return push(sc, v);
}

static int tuple_of(Scan *sc, size_t n) {
    size_t floor = sc->marks.n ? (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) : 0;
    if (sc->stack.n < floor + n) return FAIL(sc, "a tuple of missing items");
    Val v;
    if (new_obj(sc, O_TUPLE, &v) < 0) return -1;
    size_t at = sc->stack.n - n;
    if (obj_add(sc, obj_of(sc, v), &AT(sc->stack, Val, at), n) < 0) return -1;
    sc->stack.n = at;
    return push(sc, v);
}

/* Items above the last mark into the container below it (APPENDS, SETITEMS, ADDITEMS). */
static int add_from_mark(Scan *sc, uint8_t type) {
    size_t at;
    if (pop_mark(sc, &at) < 0) return -1;
    if (at == 0 || at > sc->stack.n) return FAIL(sc, "items with no container");
    size_t floor = sc->marks.n ? (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) : 0;
    if (at - 1 < floor) return FAIL(sc, "items with no container");
    Val target = AT(sc->stack, Val, at - 1);
    Obj *o = obj_of(sc, target);
    size_t n = sc->stack.n - at;
    if (!o || o->type != type) return FAIL(sc, "items added to the wrong kind of object");
    if (type == O_DICT && n % 2) return FAIL(sc, "a dict with a key and no value");
    int rc = type == O_LIST ? list_append(sc, target, &AT(sc->stack, Val, at), n)
                            : obj_add(sc, o, &AT(sc->stack, Val, at), n);
    sc->stack.n = at;
    return rc;
}

static int report(Scan *sc) {
    if (!sc->progress || sc->pos < sc->next_report) return 0;
    sc->next_report = sc->pos + sc->size / 100 + 1;
    PyObject *r = PyObject_CallFunction(sc->progress, "d", (double)sc->pos / (double)sc->size);
    if (!r) return -2;
    Py_DECREF(r);
    return 0;
}

/* Run the machine to STOP; the result is left on the stack. 0, -1 (sc->error) or -2
 * (a Python exception is set). */
static int run(Scan *sc) {
    for (;;) {
        if (sc->pos >= sc->size) return FAIL(sc, "the file ends before the pickle's STOP");
        int rc = report(sc);
        if (rc) return rc;
        unsigned char op = sc->buf[sc->pos++];
        Val v, w;
        Val *t;
        switch (op) {
        case 0x80: /* PROTO */
            if (need(sc, 1) < 0) return -1;
            if (sc->buf[sc->pos] < 2 || sc->buf[sc->pos] > 5) {
                sc->foreign = 1;
                return FAIL(sc, "pickle protocol %d", sc->buf[sc->pos]);
            }
            sc->pos += 1;
            break;
        case 0x95: /* FRAME: a length; the frames' content follows inline */
            if (need(sc, 8) < 0) return -1;
            sc->pos += 8;
            break;
        case '.': /* STOP */
            return 0;
        case '(': /* MARK */
        {
            int64_t *m = vec_push(&sc->marks);
            if (!m) return FAIL(sc, "out of memory");
            *m = (int64_t)sc->stack.n;
            break;
        }
        case '0': /* POP */
            if (sc->stack.n == 0 ||
                (sc->marks.n &&
                 (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) == sc->stack.n)) {
                size_t at;
                if (pop_mark(sc, &at) < 0) return -1;
            } else if (pop(sc, &v) < 0) {
                return -1;
            }
            break;
        case '1': /* POP_MARK */
        {
            size_t at;
            if (pop_mark(sc, &at) < 0) return -1;
            sc->stack.n = at;
            break;
        }
        case '2': /* DUP */
            if (top(sc, &t) < 0) return -1;
            v = *t;
            if (push(sc, v) < 0) return -1;
            break;
        case 'N': /* NONE */
            v.kind = V_NONE;
            if (push(sc, v) < 0) return -1;
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            v.kind = V_BOOL;
            v.u.i = op == 0x88;
            if (push(sc, v) < 0) return -1;
            break;
        case 'K': /* BININT1 */
            if (need(sc, 1) < 0 || push_int(sc, sc->buf[sc->pos]) < 0) return -1;
            sc->pos += 1;
            break;
        case 'M': /* BININT2 */
            if (need(sc, 2) < 0 || push_int(sc, (int64_t)le(sc->buf + sc->pos, 2)) < 0)
                return -1;
            sc->pos += 2;
            break;
        case 'J': /* BININT: signed 32 bits */
            if (need(sc, 4) < 0 ||
                push_int(sc, (int32_t)(uint32_t)le(sc->buf + sc->pos, 4)) < 0)
                return -1;
            sc->pos += 4;
            break;
        case 0x8a: /* LONG1 */
        case 0x8b: /* LONG4 */
        {
            uint64_t n;
            if (op == 0x8a) {
                if (need(sc, 1) < 0) return -1;
                n = sc->buf[sc->pos++];
            } else {
                if (need(sc, 4) < 0) return -1;
                n = le(sc->buf + sc->pos, 4);
                sc->pos += 4;
            }
            if (need(sc, (size_t)n) < 0) return -1;
            const unsigned char *p = sc->buf + sc->pos;
            /* Longer than 8 bytes is fine while it is a sign extension. */
            int64_t x = 0;
            if (n > 0) {
                size_t k = n > 8 ? 8 : (size_t)n;
                uint64_t u = le(p, (int)k);
                if (k < 8 && (p[k - 1] & 0x80)) u |= ~0ULL << (8 * k);
                x = (int64_t)u;
                unsigned char fill = x < 0 ? 0xff : 0;
                for (size_t i = 8; i < n; i++)
                    if (p[i] != fill) return FAIL(sc, "an integer over 64 bits");
            }
            sc->pos += (size_t)n;
            if (push_int(sc, x) < 0) return -1;
            break;
        }
        case 'G': /* BINFLOAT: big-endian double */
        {
            if (need(sc, 8) < 0) return -1;
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = (u << 8) | sc->buf[sc->pos + i];
            sc->pos += 8;
            v.kind = V_FLOAT;
            memcpy(&v.u.f, &u, 8);
            if (push(sc, v) < 0) return -1;
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE */
        case 'C':  /* SHORT_BINBYTES */
            if (need(sc, 1) < 0) return -1;
            sc->pos += 1;
            if (push_str(sc, op == 'C' ? V_BYTES : V_STR, sc->buf[sc->pos - 1]) < 0) return -1;
            break;
        case 'X': /* BINUNICODE */
        case 'B': /* BINBYTES */
            if (need(sc, 4) < 0) return -1;
            sc->pos += 4;
            if (push_str(sc, op == 'B' ? V_BYTES : V_STR, le(sc->buf + sc->pos - 4, 4)) < 0)
                return -1;
            break;
        case 0x8d: /* BINUNICODE8 */
        case 0x8e: /* BINBYTES8 */
        case 0x96: /* BYTEARRAY8 */
            if (need(sc, 8) < 0) return -1;
            sc->pos += 8;
            if (push_str(sc, op == 0x8d ? V_STR : V_BYTES, le(sc->buf + sc->pos - 8, 8)) < 0)
                return -1;
            break;
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
        case ')': /* EMPTY_TUPLE */
        case 0x8f: /* EMPTY_SET */
            if (new_obj(sc, op == '}' ? O_DICT : op == ']' ? O_LIST : op == ')' ? O_TUPLE : O_SET,
                        &v) < 0 ||
                push(sc, v) < 0)
                return -1;
            break;
        case 'd': /* DICT */
            if (from_mark(sc, O_DICT) < 0) return -1;
            break;
        case 'l': /* LIST */
            if (from_mark(sc, O_LIST) < 0) return -1;
            break;
        case 't': /* TUPLE */
            if (from_mark(sc, O_TUPLE) < 0) return -1;
            break;
        case 0x91: /* FROZENSET */
            if (from_mark(sc, O_FROZENSET) < 0) return -1;
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
            if (tuple_of(sc, (size_t)(op - 0x84)) < 0) return -1;
            break;
        case 'a': /* APPEND */
            if (pop(sc, &w) < 0 || top(sc, &t) < 0) return -1;
            v = *t;
            if (list_append(sc, v, &w, 1) < 0) return -1;
            break;
        case 'e': /* APPENDS */
            if (add_from_mark(sc, O_LIST) < 0) return -1;
            break;
        case 's': /* SETITEM */
        {
            Val kv[2];
            if (pop(sc, &kv[1]) < 0 || pop(sc, &kv[0]) < 0 || top(sc, &t) < 0) return -1;
            Obj *o = obj_of(sc, *t);
            if (!o || o->type != O_DICT) return FAIL(sc, "an item set on a non-dict");
            if (obj_add(sc, o, kv, 2) < 0) return -1;
            break;
        }
        case 'u': /* SETITEMS */
            if (add_from_mark(sc, O_DICT) < 0) return -1;
            break;
        case 0x90: /* ADDITEMS */
            if (add_from_mark(sc, O_SET) < 0) return -1;
            break;
        case 0x94: /* MEMOIZE */
            if (top(sc, &t) < 0 || memo_put(sc, sc->memo.n, *t) < 0) return -1;
            break;
        case 'q': /* BINPUT */
            if (need(sc, 1) < 0 || top(sc, &t) < 0 || memo_put(sc, sc->buf[sc->pos], *t) < 0)
                return -1;
            sc->pos += 1;
            break;
        case 'r': /* LONG_BINPUT */
            if (need(sc, 4) < 0 || top(sc, &t) < 0 ||
                memo_put(sc, le(sc->buf + sc->pos, 4), *t) < 0)
                return -1;
            sc->pos += 4;
            break;
        case 'h': /* BINGET */
            if (need(sc, 1) < 0 || memo_get(sc, sc->buf[sc->pos]) < 0) return -1;
            sc->pos += 1;
            break;
        case 'j': /* LONG_BINGET */
            if (need(sc, 4) < 0 || memo_get(sc, le(sc->buf + sc->pos, 4)) < 0) return -1;
            sc->pos += 4;
            break;
        default:
            sc->foreign = 1;
            return FAIL(sc, "opcode 0x%02x at byte %zu is not plain data", op, sc->pos - 1);
        }
    }
}

/* ---- the rest of the tree, as Python objects ---- */

static PyObject *to_python(Scan *sc, Val v, PyObject *events_marker, int depth);

static PyObject *frame_dict(Scan *sc, int32_t id) {
    const Frame *f = &AT(sc->frames, Frame, id);
    return Py_BuildValue("{s:s#,s:s#,s:L}", "name", f->name, (Py_ssize_t)f->name_len,
                         "filename", f->file, (Py_ssize_t)f->file_len, "line",
                         (long long)f->line);
}

static PyObject *items_to(Scan *sc, Obj *o, PyObject *container, PyObject *marker, int depth) {
    for (int32_t i = 0; i < o->n; i++) {
        int is_dict = o->type == O_DICT;
        PyObject *a = to_python(sc, o->items[i], marker, depth + 1);
        if (!a) goto fail;
        int rc;
        if (is_dict) {
            PyObject *b = to_python(sc, o->items[++i], marker, depth + 1);
            if (!b) {
                Py_DECREF(a);
                goto fail;
            }
            rc = PyDict_SetItem(container, a, b);
            Py_DECREF(b);
            Py_DECREF(a);
        } else if (o->type == O_LIST) {
            rc = PyList_Append(container, a);
            Py_DECREF(a);
        } else if (o->type == O_TUPLE) {
            PyTuple_SET_ITEM(container, i, a);
            rc = 0;
        } else {
            rc = PySet_Add(container, a);
            Py_DECREF(a);
        }
        if (rc < 0) goto fail;
    }
    return container;
fail:
    Py_DECREF(container);
    return NULL;
}

static PyObject *to_python(Scan *sc, Val v, PyObject *marker, int depth) {
    if (depth > 200) {
        PyErr_SetString(PyExc_ValueError, "the pickle nests more than 200 deep");
        return NULL;
    }
    switch (v.kind) {
    case V_NONE:
        Py_RETURN_NONE;
    case V_BOOL:
        return PyBool_FromLong((long)v.u.i);
    case V_INT:
        return PyLong_FromLongLong(v.u.i);
    case V_FLOAT:
        return PyFloat_FromDouble(v.u.f);
    case V_STR:
        return PyUnicode_DecodeUTF8(v.u.s, (Py_ssize_t)v.len, "surrogatepass");
    case V_BYTES:
        return PyBytes_FromStringAndSize(v.u.s, (Py_ssize_t)v.len);
    case V_OBJ:
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "a mark left in the result");
        return NULL;
    }
    Obj *o = obj_of(sc, v);
    if (o->role == R_EVENTS) return PyObject_CallFunction(marker, "i", v.u.obj);
    if (o->role == R_FRAME && o->items == NULL) return frame_dict(sc, o->summary);
    if (o->role == R_EVENT) Py_RETURN_NONE;
    if (o->role == R_STACK) {
        int64_t a = AT(sc->stack_start, int64_t, o->summary);
        int64_t b = AT(sc->stack_start, int64_t, o->summary + 1);
        PyObject *list = PyList_New(0);
        for (int64_t k = a; list && k < b; k++) {
            PyObject *f = frame_dict(sc, AT(sc->stack_items, int32_t, k));
            if (!f || PyList_Append(list, f) < 0) {
                Py_XDECREF(f);
                Py_CLEAR(list);
                break;
            }
            Py_DECREF(f);
        }
        return list;
    }
    PyObject *c;
    switch (o->type) {
    case O_DICT:
        c = PyDict_New();
        break;
    case O_LIST:
        c = PyList_New(0);
        break;
    case O_TUPLE:
        c = PyTuple_New(o->n);
        break;
    case O_FROZENSET:
        c = PyFrozenSet_New(NULL);
        break;
    default:
        c = PySet_New(NULL);
    }
    return c ? items_to(sc, o, c, marker, depth) : NULL;
}

/* ---- the module ---- */

static PyObject *column(Vec *v) {
    return PyBytes_FromStringAndSize(v->data ? v->data : "", (Py_ssize_t)(v->n * v->size));
}

static void scan_free(Scan *sc) {
    if (sc->objs.data)
        for (size_t i = 0; i < sc->objs.n; i++) free(AT(sc->objs, Obj, i).items);
    Vec *vecs[] = {&sc->stack, &sc->marks, &sc->memo, &sc->objs, &sc->frames,
                   &sc->stack_items, &sc->stack_start, &sc->ev_list, &sc->ev_time,
                   &sc->ev_action, &sc->ev_addr, &sc->ev_size, &sc->ev_stack};
    for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++) free(vecs[i]->data);
    free(sc->frame_set.slots);
    free(sc->frame_set.hashes);
    free(sc->stack_set.slots);
    free(sc->stack_set.hashes);
    free(sc->action_names);
    free(sc->action_lens);
}

PyDoc_STRVAR(scan_doc,
"scan(buffer, actions, events_marker, progress=None) -> dict\n\n"
"Read a snapshot pickle from `buffer` (bytes-like, e.g. an mmap). `actions` names the\n"
"action codes (a tuple of str; an unknown action is 127). Returns a dict: 'tree' (the\n"
"unpickled value, every list of events replaced by events_marker(list_id)), the event\n"
"columns as bytes ('list' int32, 'time' int64 with INT64_MIN for none, 'action' int8,\n"
"'addr' uint64, 'size' int64, 'stack' int32, -1 for none), 'frames' (a list of\n"
"(name, filename, line)) and 'stacks' (a list of tuples of frame ids).\n"
"NotImplementedError for a pickle that is not plain data (objects, text protocols);\n"
"ValueError for a truncated or damaged one.");

static PyObject *scan(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"buffer", "actions", "events_marker", "progress", NULL};
    Py_buffer view;
    PyObject *actions, *marker, *progress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*O!O|O", kw, &view, &PyTuple_Type,
                                     &actions, &marker, &progress))
        return NULL;
    (void)self;
    Scan sc;
    memset(&sc, 0, sizeof sc);
    Vec proto_val = VEC(Val), proto_i64 = VEC(int64_t), proto_obj = VEC(Obj),
        proto_frame = VEC(Frame), proto_i32 = VEC(int32_t), proto_i8 = VEC(int8_t);
    sc.stack = sc.memo = proto_val;
    sc.marks = sc.stack_start = sc.ev_time = sc.ev_addr = sc.ev_size = proto_i64;
    sc.objs = proto_obj;
    sc.frames = proto_frame;
    sc.stack_items = sc.ev_list = sc.ev_stack = proto_i32;
    sc.ev_action = proto_i8;
    sc.buf = view.buf;
    sc.size = (size_t)view.len;
    sc.progress = progress == Py_None ? NULL : progress;
    PyObject *result = NULL, *tree = NULL;
    sc.n_actions = PyTuple_GET_SIZE(actions);
    sc.action_names = calloc((size_t)sc.n_actions + 1, sizeof(char *));
    sc.action_lens = calloc((size_t)sc.n_actions + 1, sizeof(Py_ssize_t));
    if (!sc.action_names || !sc.action_lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < sc.n_actions; k++) {
        sc.action_names[k] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(actions, k),
                                                     &sc.action_lens[k]);
        if (!sc.action_names[k]) goto done;
    }
    int64_t *first = NULL;
    if (idset_init(&sc.frame_set, 1024) < 0 || idset_init(&sc.stack_set, 1024) < 0 ||
        !(first = vec_push(&sc.stack_start))) {
        PyErr_NoMemory();
        goto done;
    }
    *first = 0;
    int rc = run(&sc);
    if (rc == -2) goto done;
    Val *top_val = NULL;
    if (rc == 0 && (sc.marks.n || sc.stack.n != 1))
        rc = FAIL(&sc, "the pickle stops with %zu values and %zu marks", sc.stack.n,
                  sc.marks.n);
    if (rc == 0 && top(&sc, &top_val) < 0) rc = -1;
    if (rc < 0) {
        PyErr_SetString(sc.foreign ? PyExc_NotImplementedError : PyExc_ValueError, sc.error);
        goto done;
    }
    tree = to_python(&sc, *top_val, marker, 0);
    if (!tree) goto done;
    PyObject *frames = PyList_New((Py_ssize_t)sc.frames.n);
    if (!frames) goto done;
    for (size_t i = 0; i < sc.frames.n; i++) {
        const Frame *f = &AT(sc.frames, Frame, i);
        PyObject *item = Py_BuildValue("(s#s#L)", f->name, (Py_ssize_t)f->name_len, f->file,
                                       (Py_ssize_t)f->file_len, (long long)f->line);
        if (!item) {
            Py_DECREF(frames);
            goto done;
        }
        PyList_SET_ITEM(frames, (Py_ssize_t)i, item);
    }
    size_t n_stacks = sc.stack_start.n - 1;
    PyObject *stacks = PyList_New((Py_ssize_t)n_stacks);
    if (!stacks) {
        Py_DECREF(frames);
        goto done;
    }
    for (size_t s = 0; s < n_stacks; s++) {
        int64_t a = AT(sc.stack_start, int64_t, s), b = AT(sc.stack_start, int64_t, s + 1);
        PyObject *ids = PyTuple_New((Py_ssize_t)(b - a));
        if (!ids) {
            Py_DECREF(frames);
            Py_DECREF(stacks);
            goto done;
        }
        for (int64_t k = a; k < b; k++)
            PyTuple_SET_ITEM(ids, (Py_ssize_t)(k - a),
                             PyLong_FromLong(AT(sc.stack_items, int32_t, k)));
        PyList_SET_ITEM(stacks, (Py_ssize_t)s, ids);
    }
    result = Py_BuildValue("{s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}", "tree", tree, "list",
                           column(&sc.ev_list), "time", column(&sc.ev_time), "action",
                           column(&sc.ev_action), "addr", column(&sc.ev_addr), "size",
                           column(&sc.ev_size), "stack", column(&sc.ev_stack), "frames",
                           frames, "stacks", stacks);
done:
    Py_XDECREF(tree);
    scan_free(&sc);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan",
    "Read a memory snapshot pickle into event columns without building its objects.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
