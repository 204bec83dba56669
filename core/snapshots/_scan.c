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
 * The trace's containers never outlive their pickle opcodes: when a frame dict's items
 * (name, filename, line), a frames list's frames or an event dict's fields arrive, they are
 * read from the machine's stack into a frame id, a stack id or a row, and the container's
 * record is reused for the next one. Its memo entry then holds that id: the memo is 8
 * bytes an entry (a literal is re-read from its opcode when the pickle refers to it), and
 * a 2 GiB trace of 10 million events needs neither its 60 million containers nor their
 * item arrays. A container the pickle refers to in any other way (DUP, a memo read while
 * it is open, an item of another container) keeps its record and is read when used.
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

enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_OBJ, V_MARK,
       V_FRAME, V_STACK, V_EVENT /* a container already read: u.obj is its id or row */ };

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
    uint8_t pinned;  /* referred to from elsewhere than its memo entry: never reused */
    int32_t n, cap;  /* items (a dict holds key, value, key, value ...) */
    int32_t summary; /* frame id, stack id or event row */
    int64_t memo;    /* its memo index; -1 none, -2 more than one */
    Val *items;
} Obj;

/* A memo entry: a tag in the low 3 bits, its payload above. M_LIT: the position of the
 * opcode that pushed a literal (read again when the pickle refers to it); M_SPILL: an
 * index into the spill (a value with no opcode of its own); else an object's id, a frame
 * id, a stack id or an event row. 0 is an entry never written. */
enum { M_EMPTY, M_LIT, M_OBJ, M_SPILL, M_FRAME, M_STACK, M_EVENT };
/* A read container's entry: M_FRAME, M_STACK and M_EVENT follow V_FRAME, V_STACK and
 * V_EVENT, in order. */
#define READ_ENTRY(v) MEMO(M_FRAME + ((v).kind - V_FRAME), (uint32_t)(v).u.obj)
#define MEMO(tag, x) (((uint64_t)(x) << 3) | (uint64_t)(tag))
#define NO_LIT SIZE_MAX

/* A dict key, matched by address once seen: a key the pickler memoized once (every
 * event's "action") comes back at the same address in the mapped file. */
typedef struct {
    const char *text;
    uint32_t len;
    const char *seen;
} Key;

enum { K_NAME, K_FILENAME, K_LINE, K_ACTION, K_TIME, K_ADDR, K_SIZE, K_FRAMES, N_KEYS };
static const char *KEY_TEXT[N_KEYS] = {"name", "filename", "line", "action", "time_us",
                                       "addr", "size", "frames"};

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

static inline void *vec_push(Vec *v) {
    if (v->n == v->cap && vec_reserve(v, v->n + 1) < 0) return NULL;
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
    Vec spill;     /* Val: memo values with no opcode of their own */
    Vec free_objs; /* int32: records to reuse */
    size_t lit_pos; /* the opcode that pushed the top of the stack, if the last one did */
    Key keys[N_KEYS];
    /* interned */
    Vec frames;      /* Frame */
    IdSet frame_set;
    Vec stack_items; /* int32 frame ids, stacks back to back */
    Vec stack_start; /* int64 offset of each stack in stack_items, plus the end */
    IdSet stack_set;
    /* the event columns */
    Vec ev_list, ev_time, ev_action, ev_addr, ev_size, ev_stack;
    int64_t last_placed; /* the newest row given a list: rows stay in append order */
    char error[200];
    int foreign; /* the error is a kind of pickle this reader leaves to pickle itself */
} Scan;

#define FAIL(sc, ...) (snprintf((sc)->error, sizeof((sc)->error), __VA_ARGS__), -1)

static inline uint64_t load64(const char *p) {
    uint64_t w;
    memcpy(&w, p, 8); /* one unaligned load */
    return w;
}

static inline uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* Of a string of 16 bytes or more, its length and its first and last 16 bytes (equal
 * hashes are compared whole); of a shorter one, every byte. Frame names and file names
 * are hashed once per frame dict of the file (tens of millions): byte by byte, this was a
 * tenth of the scan. Read straight from the file: no copy to stall on. */
static uint64_t hash_bytes(uint64_t h, const char *s, size_t n) {
    if (n >= 16)
        return mix(mix(mix(mix(mix(h, n), load64(s)), load64(s + 8)), load64(s + n - 16)),
                   load64(s + n - 8));
    if (n >= 8) return mix(mix(mix(h, n), load64(s)), load64(s + n - 8));
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return mix(h, n);
}

/* Every word of a stack's frame ids: stacks often differ only in their middle frames. */
static uint64_t hash_words(uint64_t h, const int32_t *ids, size_t n) {
    size_t i = 0;
    for (; i + 2 <= n; i += 2) h = mix(h, load64((const char *)(ids + i)));
    return i < n ? mix(h, (uint32_t)ids[i]) : mix(h, n);
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
    int32_t id;
    if (sc->free_objs.n) {
        id = AT(sc->free_objs, int32_t, --sc->free_objs.n);
    } else {
        if (sc->objs.n >= INT32_MAX) return FAIL(sc, "too many containers");
        if (!vec_push(&sc->objs)) return FAIL(sc, "out of memory");
        id = (int32_t)(sc->objs.n - 1);
    }
    Obj *o = &AT(sc->objs, Obj, id);
    memset(o, 0, sizeof *o);
    o->type = type;
    o->summary = -1;
    o->memo = -1;
    out->kind = V_OBJ;
    out->len = 0;
    out->u.obj = id;
    return 0;
}

static Obj *obj_of(Scan *sc, Val v) {
    return v.kind == V_OBJ ? &AT(sc->objs, Obj, v.u.obj) : NULL;
}

static void pin(Scan *sc, Val v) {
    if (v.kind == V_OBJ) AT(sc->objs, Obj, v.u.obj).pinned = 1;
}

/* Whether the container `v` (open, empty, referred to only by its stack slot and its
 * memo entry) may be read into an id and its record reused. */
static int fresh(Scan *sc, Val v) {
    Obj *o = obj_of(sc, v);
    return o && !o->pinned && o->n == 0 && o->role == 0 && o->memo != -2;
}

/* The container in stack slot `slot` was read as `v` (V_FRAME, V_STACK or V_EVENT): the
 * slot and its memo entry hold `v`, and its record is reused. */
static int settle(Scan *sc, Val *slot, Val v) {
    int32_t id = slot->u.obj;
    Obj *o = &AT(sc->objs, Obj, id);
    if (o->memo >= 0 && AT(sc->memo, uint64_t, o->memo) == MEMO(M_OBJ, id))
        AT(sc->memo, uint64_t, o->memo) = READ_ENTRY(v);
    *slot = v;
    int32_t *free_slot = vec_push(&sc->free_objs);
    if (!free_slot) return FAIL(sc, "out of memory");
    *free_slot = id;
    return 0;
}

static int obj_add(Scan *sc, Obj *o, const Val *items, size_t n) {
    if (n == 0) return 0; /* an empty APPENDS: no items array to copy into (UBSan) */
    if ((size_t)o->n + n > INT32_MAX) return FAIL(sc, "a container too large");
    for (size_t i = 0; i < n; i++) pin(sc, items[i]);
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

static int key_is(Scan *sc, Val v, int k) {
    Key *key = &sc->keys[k];
    if (v.kind != V_STR || v.len != key->len) return 0;
    if (v.u.s == key->seen) return 1;
    if (memcmp(v.u.s, key->text, key->len) != 0) return 0;
    key->seen = v.u.s;
    return 1;
}

/* The values of the keys the scanner reads, among dict items (key, value, key, value
 * ...), in one pass: f[k] is key k's value, or NULL. */
static void fields(Scan *sc, const Val *items, size_t n, const Val **f) {
    memset(f, 0, N_KEYS * sizeof *f);
    for (size_t i = 0; i + 1 < n; i += 2) {
        if (items[i].kind != V_STR) continue;
        int k = 0;
        while (k < N_KEYS && items[i].u.s != sc->keys[k].seen) k++;
        if (k == N_KEYS)
            for (k = 0; k < N_KEYS && !key_is(sc, items[i], k); k++) {
            }
        if (k < N_KEYS) f[k] = &items[i + 1];
    }
}

static int frame_eq(Scan *sc, int32_t id, const void *key) {
    const Frame *a = &AT(sc->frames, Frame, id), *b = key;
    return a->line == b->line && a->name_len == b->name_len && a->file_len == b->file_len &&
           memcmp(a->name, b->name, a->name_len) == 0 &&
           memcmp(a->file, b->file, a->file_len) == 0;
}

/* The id of the frame (name, file, line), interned; -2 when out of memory. */
static int32_t intern_frame(Scan *sc, const Val *name, const Val *file, int64_t line) {
    Frame f = {name->u.s, file->u.s, name->len, file->len, line};
    uint64_t h = mix(hash_bytes(hash_bytes(0xcbf29ce484222325ULL, f.name, f.name_len), f.file,
                                f.file_len), (uint64_t)f.line);
    size_t slot;
    int32_t id = idset_find(sc, &sc->frame_set, h, &f, frame_eq, &slot);
    if (id >= 0) return id;
    Frame *added = vec_push(&sc->frames);
    if (!added || idset_add(&sc->frame_set, slot, h, (int32_t)(sc->frames.n - 1)) < 0)
        return -2;
    *added = f;
    return (int32_t)(sc->frames.n - 1);
}

/* The frame id of dict fields `f`: name and filename strings, and line an int (when
 * `exact`) or an int or missing (-1); -1 if they are not a frame, -2 out of memory. */
static int32_t frame_of(Scan *sc, const Val **f, int exact) {
    const Val *name = f[K_NAME], *file = f[K_FILENAME], *line = f[K_LINE];
    if (!name || !file || name->kind != V_STR || file->kind != V_STR) return -1;
    if (exact && (!line || line->kind != V_INT)) return -1;
    return intern_frame(sc, name, file, line && line->kind == V_INT ? line->u.i : -1);
}

/* The container `v` when it is a plain `type` still to be read as `role`; else NULL, and
 * *id is what it reads as: its id when it was read already (as `kind`, or its record
 * as `role`), -1 when it cannot be one. */
static Obj *to_read(Scan *sc, Val v, int kind, int type, int role, int32_t *id) {
    Obj *o = obj_of(sc, v);
    *id = -1;
    if (v.kind == kind)
        *id = v.u.obj;
    else if (o && o->type == type && o->role == role)
        *id = o->summary;
    else if (o && o->type == type && o->role == R_PLAIN)
        return o;
    return NULL;
}

/* Record that container `o` reads as `id` (its `role`'s), freeing its items unless the
 * tree must get it back whole. */
static int32_t settle_obj(Obj *o, int role, int32_t id, int keep_items) {
    if (!keep_items) obj_drop_items(o);
    o->role = (uint8_t)role;
    o->summary = id;
    return id;
}

/* The frame id of a frame dict ({name, filename, line}); -1 if `v` is not one. */
static int32_t frame_id(Scan *sc, Val v) {
    int32_t id;
    Obj *o = to_read(sc, v, V_FRAME, O_DICT, R_FRAME, &id);
    if (!o) return id;
    const Val *f[N_KEYS];
    fields(sc, o->items, (size_t)o->n, f);
    id = frame_of(sc, f, 0);
    if (id < 0) return id;
    /* Keep the items when the dict has more than a frame's three keys: nothing else
     * reads them, but a plain dict elsewhere in the tree should come back whole. */
    return settle_obj(o, R_FRAME, id, o->n != 6);
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

/* The stack id of frames `items` (frame dicts or frames read already); -1 if one is not
 * a frame (or there are none); -2 when out of memory. */
static int32_t intern_stack(Scan *sc, const Val *items, size_t n) {
    if (n == 0) return -1;
    size_t base = sc->stack_items.n;
    if (vec_reserve(&sc->stack_items, base + n) < 0) return -2;
    for (size_t i = 0; i < n; i++) {
        int32_t f = frame_id(sc, items[i]);
        if (f == -2) return -2;
        if (f < 0) {
            sc->stack_items.n = base;
            return -1;
        }
        AT(sc->stack_items, int32_t, sc->stack_items.n++) = f;
    }
    StackKey key = {&AT(sc->stack_items, int32_t, base), n};
    uint64_t h = hash_words(0xcbf29ce484222325ULL, key.ids, n);
    size_t slot;
    int32_t id = idset_find(sc, &sc->stack_set, h, &key, stack_eq, &slot);
    if (id >= 0) {
        sc->stack_items.n = base; /* already interned: forget the copy */
        return id;
    }
    id = (int32_t)(sc->stack_start.n - 1);
    int64_t *end = vec_push(&sc->stack_start);
    if (!end || idset_add(&sc->stack_set, slot, h, id) < 0) return -2;
    *end = (int64_t)sc->stack_items.n;
    return id;
}

/* The stack id of a frames list; -1 for none (no list, empty, or not frames); -2 when
 * out of memory. */
static int32_t stack_id(Scan *sc, Val v) {
    int32_t id;
    Obj *o = to_read(sc, v, V_STACK, O_LIST, R_STACK, &id);
    if (!o) return id;
    id = intern_stack(sc, o->items, (size_t)o->n);
    if (id < 0) return id;
    /* Keep the items when a frame dict has more than a frame's keys: the list should
     * come back whole where the tree holds it too (a block's frames). */
    int whole = 1;
    for (int32_t i = 0; i < o->n && whole; i++) {
        Obj *f = obj_of(sc, o->items[i]);
        whole = !f || f->items == NULL;
    }
    return settle_obj(o, R_STACK, id, !whole);
}

static int64_t int_or(const Val *v, int64_t otherwise) {
    return v && v->kind == V_INT ? v->u.i : otherwise;
}

/* A row at the end of the event columns. */
static inline int push_row(Scan *sc, int32_t list, int64_t time, int64_t addr, int64_t size,
                           int8_t action, int32_t stack) {
    if (sc->ev_list.n >= INT32_MAX) return FAIL(sc, "too many events");
    int32_t *l = vec_push(&sc->ev_list);
    int64_t *t = vec_push(&sc->ev_time), *ad = vec_push(&sc->ev_addr),
            *sz = vec_push(&sc->ev_size);
    int8_t *ac = vec_push(&sc->ev_action);
    int32_t *st = vec_push(&sc->ev_stack);
    if (!l || !t || !ad || !sz || !ac || !st) return FAIL(sc, "out of memory");
    *l = list, *t = time, *ad = addr, *sz = size, *ac = action, *st = stack;
    return 0;
}

/* A new row for the event with fields `f` (its "action" a string), in `list` (-1: not yet
 * appended); its index in *row. */
static int add_row(Scan *sc, const Val **f, int32_t list, int32_t *row) {
    const Val *a = f[K_ACTION];
    int8_t action = 127;
    for (Py_ssize_t k = 0; k < sc->n_actions; k++)
        if (a->len == (size_t)sc->action_lens[k] &&
            memcmp(a->u.s, sc->action_names[k], a->len) == 0) {
            action = (int8_t)k;
            break;
        }
    const Val *frames = f[K_FRAMES];
    int32_t stack = frames ? stack_id(sc, *frames) : -1;
    if (stack == -2) return FAIL(sc, "out of memory");
    if (push_row(sc, list, int_or(f[K_TIME], INT64_MIN), int_or(f[K_ADDR], 0),
                 int_or(f[K_SIZE], 0), action, stack) < 0)
        return -1;
    *row = (int32_t)(sc->ev_list.n - 1);
    if (list >= 0) sc->last_placed = *row;
    return 0;
}

/* Row `row` appended to `list`: placed there, or copied to the end when it already has a
 * list or a newer row was placed first (the rows of a list stay in append order). */
static int place_row(Scan *sc, int32_t row, int32_t list) {
    if (AT(sc->ev_list, int32_t, row) < 0 && row > sc->last_placed) {
        AT(sc->ev_list, int32_t, row) = list;
        sc->last_placed = row;
        return 0;
    }
    size_t r = (size_t)row;
    if (push_row(sc, list, AT(sc->ev_time, int64_t, r), AT(sc->ev_addr, int64_t, r),
                 AT(sc->ev_size, int64_t, r), AT(sc->ev_action, int8_t, r),
                 AT(sc->ev_stack, int32_t, r)) < 0)
        return -1;
    sc->last_placed = (int64_t)(sc->ev_list.n - 1);
    return 0;
}

/* Add the event dict `o` (one the pickle kept referring to; its fields `f`) as a row of
 * list `list`. */
static int emit_event(Scan *sc, Obj *o, const Val **f, int32_t list) {
    if (o->role == R_EVENT) return place_row(sc, o->summary, list); /* appended again */
    int32_t row;
    if (add_row(sc, f, list, &row) < 0) return -1;
    settle_obj(o, R_EVENT, row, 0);
    return 0;
}

/* A read container cannot take more items: pickle's own output never adds to a dict or
 * list after its items were set; the pickle reader takes such a file. */
static int read_already(Scan *sc, Val v) {
    if (v.kind != V_FRAME && v.kind != V_STACK && v.kind != V_EVENT) return 0;
    sc->foreign = 1;
    return FAIL(sc, "the pickle adds items to a container after they were read");
}

/* Dict items about to be set on the dict in `slot`: a fresh dict whose items are exactly
 * a frame's, or an event's, becomes a frame id or a row at once. 1 if so, 0 if the items
 * go into the dict, -1 on error. */
static int read_dict(Scan *sc, Val *slot, const Val *items, size_t n) {
    if (!fresh(sc, *slot)) return 0;
    Val v = {V_FRAME, 0, {.obj = 0}};
    const Val *f[N_KEYS];
    fields(sc, items, n, f);
    if (f[K_ACTION] && f[K_ACTION]->kind == V_STR) {
        v.kind = V_EVENT;
        if (add_row(sc, f, -1, &v.u.obj) < 0) return -1;
    } else {
        v.u.obj = n == 6 ? frame_of(sc, f, 1) : -1; /* a frame's three keys, no more */
        if (v.u.obj == -1) return 0;
        if (v.u.obj == -2) return FAIL(sc, "out of memory");
    }
    return settle(sc, slot, v) < 0 ? -1 : 1;
}

/* Append items to the list in `slot`: a fresh list given only frames, fewer than a
 * pickler's batch (so no more can follow), becomes a stack id; events become rows;
 * anything else is kept. */
static int list_append(Scan *sc, Val *slot, const Val *items, size_t n) {
    if (read_already(sc, *slot) < 0) return -1;
    Obj *list = obj_of(sc, *slot);
    if (!list || list->type != O_LIST) return FAIL(sc, "the pickle appends to a non-list");
    if (n < 1000 && fresh(sc, *slot)) {
        size_t i = 0;
        while (i < n && items[i].kind == V_FRAME) i++;
        if (i == n) {
            Val v = {V_STACK, 0, {.obj = intern_stack(sc, items, n)}};
            if (v.u.obj == -2) return FAIL(sc, "out of memory");
            return settle(sc, slot, v);
        }
    }
    int32_t list_id = slot->u.obj;
    for (size_t i = 0; i < n; i++) {
        if (items[i].kind == V_EVENT) {
            if (place_row(sc, items[i].u.obj, list_id) < 0) return -1;
            list->role = R_EVENTS;
            continue;
        }
        Obj *o = obj_of(sc, items[i]);
        const Val *f[N_KEYS] = {NULL};
        if (o && o->type == O_DICT && o->role == R_PLAIN) fields(sc, o->items, (size_t)o->n, f);
        if (o && o->type == O_DICT &&
            (o->role == R_EVENT || (f[K_ACTION] && f[K_ACTION]->kind == V_STR))) {
            if (emit_event(sc, o, f, list_id) < 0) return -1;
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
        memset(&AT(sc->memo, uint64_t, sc->memo.n), 0, (index + 1 - sc->memo.n) * 8);
        sc->memo.n = index + 1;
    }
    uint64_t entry;
    if (v.kind == V_OBJ) {
        Obj *o = obj_of(sc, v);
        o->memo = o->memo == -1 ? (int64_t)index : -2;
        entry = MEMO(M_OBJ, (uint32_t)v.u.obj);
    } else if (v.kind == V_FRAME || v.kind == V_STACK || v.kind == V_EVENT) {
        entry = READ_ENTRY(v);
    } else if (sc->lit_pos != NO_LIT) {
        entry = MEMO(M_LIT, sc->lit_pos);
    } else {
        Val *spilled = vec_push(&sc->spill);
        if (!spilled) return FAIL(sc, "out of memory");
        *spilled = v;
        entry = MEMO(M_SPILL, sc->spill.n - 1);
    }
    AT(sc->memo, uint64_t, index) = entry;
    return 0;
}

static int read_literal(Scan *sc, unsigned char op, Val *v);

static int memo_get(Scan *sc, uint64_t index) {
    uint64_t entry = index < sc->memo.n ? AT(sc->memo, uint64_t, index) : M_EMPTY;
    uint64_t x = entry >> 3;
    Val v = {V_NONE, 0, {.i = 0}};
    switch (entry & 7) {
    case M_LIT: {
        if (sc->buf[x] == 0x8c) { /* SHORT_BINUNICODE, checked when first read: a key */
            Val *slot = vec_push(&sc->stack);
            if (!slot) return FAIL(sc, "out of memory");
            slot->kind = V_STR; /* in place: a Val built aside and copied stalled here */
            slot->len = sc->buf[x + 1];
            slot->u.s = (const char *)sc->buf + x + 2;
            sc->lit_pos = (size_t)x;
            return 0;
        }
        size_t saved = sc->pos;
        sc->pos = (size_t)x + 1;
        int rc = read_literal(sc, sc->buf[x], &v);
        sc->pos = saved;
        if (rc != 1) return FAIL(sc, "a memo entry lost its literal");
        if (push(sc, v) < 0) return -1;
        sc->lit_pos = (size_t)x; /* the top is that opcode's value again */
        return 0;
    }
    case M_OBJ:
        v.kind = V_OBJ;
        v.u.obj = (int32_t)x;
        pin(sc, v); /* read while its memo entry is not the only reference */
        return push(sc, v);
    case M_SPILL:
        return push(sc, AT(sc->spill, Val, x));
    case M_FRAME:
    case M_STACK:
    case M_EVENT:
        v.kind = (uint8_t)(V_FRAME + ((entry & 7) - M_FRAME));
        v.u.obj = (int32_t)x;
        return push(sc, v);
    default:
        return FAIL(sc, "the pickle reads a memo entry it never wrote");
    }
}

static int str_val(Scan *sc, int kind, uint64_t n, Val *v) {
    if (n > UINT32_MAX) return FAIL(sc, "a string over 4 GiB");
    if (need(sc, (size_t)n) < 0) return -1;
    v->kind = (uint8_t)kind;
    v->len = (uint32_t)n;
    v->u.s = (const char *)sc->buf + sc->pos;
    sc->pos += (size_t)n;
    return 0;
}

/* The value of literal opcode `op`, its operand at sc->pos (then passed): 1, or 0 if
 * `op` is not a literal, -1 on error. */
static int read_literal(Scan *sc, unsigned char op, Val *v) {
    v->len = 0;
    switch (op) {
    case 'N': /* NONE */
        v->kind = V_NONE;
        return 1;
    case 0x88: /* NEWTRUE */
    case 0x89: /* NEWFALSE */
        v->kind = V_BOOL;
        v->u.i = op == 0x88;
        return 1;
    case 'K': /* BININT1 */
        if (need(sc, 1) < 0) return -1;
        v->kind = V_INT;
        v->u.i = sc->buf[sc->pos];
        sc->pos += 1;
        return 1;
    case 'M': /* BININT2 */
        if (need(sc, 2) < 0) return -1;
        v->kind = V_INT;
        v->u.i = (int64_t)le(sc->buf + sc->pos, 2);
        sc->pos += 2;
        return 1;
    case 'J': /* BININT: signed 32 bits */
        if (need(sc, 4) < 0) return -1;
        v->kind = V_INT;
        v->u.i = (int32_t)(uint32_t)le(sc->buf + sc->pos, 4);
        sc->pos += 4;
        return 1;
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
        v->kind = V_INT;
        v->u.i = x;
        return 1;
    }
    case 'G': /* BINFLOAT: big-endian double */
    {
        if (need(sc, 8) < 0) return -1;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = (u << 8) | sc->buf[sc->pos + i];
        sc->pos += 8;
        v->kind = V_FLOAT;
        memcpy(&v->u.f, &u, 8);
        return 1;
    }
    case 0x8c: /* SHORT_BINUNICODE */
    case 'C':  /* SHORT_BINBYTES */
        if (need(sc, 1) < 0) return -1;
        sc->pos += 1;
        return str_val(sc, op == 'C' ? V_BYTES : V_STR, sc->buf[sc->pos - 1], v) < 0 ? -1 : 1;
    case 'X': /* BINUNICODE */
    case 'B': /* BINBYTES */
        if (need(sc, 4) < 0) return -1;
        sc->pos += 4;
        return str_val(sc, op == 'B' ? V_BYTES : V_STR, le(sc->buf + sc->pos - 4, 4), v) < 0
                   ? -1 : 1;
    case 0x8d: /* BINUNICODE8 */
    case 0x8e: /* BINBYTES8 */
    case 0x96: /* BYTEARRAY8 */
        if (need(sc, 8) < 0) return -1;
        sc->pos += 8;
        return str_val(sc, op == 0x8d ? V_STR : V_BYTES, le(sc->buf + sc->pos - 8, 8), v) < 0
                   ? -1 : 1;
    default:
        return 0;
    }
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

/* Dict items into the dict in `slot`: read at once (a frame, an event), or kept. */
static int dict_set(Scan *sc, Val *slot, const Val *items, size_t n) {
    if (read_already(sc, *slot) < 0) return -1;
    Obj *o = obj_of(sc, *slot);
    if (!o || o->type != O_DICT) return FAIL(sc, "an item set on a non-dict");
    int rc = read_dict(sc, slot, items, n);
    return rc < 0 ? -1 : rc ? 0 : obj_add(sc, o, items, n);
}

/* Items above the last mark into the container below it (APPENDS, SETITEMS, ADDITEMS). */
static int add_from_mark(Scan *sc, uint8_t type) {
    size_t at;
    if (pop_mark(sc, &at) < 0) return -1;
    if (at == 0 || at > sc->stack.n) return FAIL(sc, "items with no container");
    size_t floor = sc->marks.n ? (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) : 0;
    if (at - 1 < floor) return FAIL(sc, "items with no container");
    Val *target = &AT(sc->stack, Val, at - 1);
    size_t n = sc->stack.n - at;
    if (type == O_DICT && n % 2) return FAIL(sc, "a dict with a key and no value");
    const Val *items = &AT(sc->stack, Val, at);
    Obj *o = obj_of(sc, *target);
    /* a list and a dict check their target themselves (APPEND and SETITEM come there) */
    int rc = type == O_LIST ? list_append(sc, target, items, n)
             : type == O_DICT ? dict_set(sc, target, items, n)
             : !o || o->type != type ? FAIL(sc, "items added to the wrong kind of object")
                                     : obj_add(sc, o, items, n);
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

/* Dispatch. With GCC or clang each handler ends in a jump of its own to the next
 * opcode's handler (threaded code, as CPython's eval loop does). A pickle's opcodes come
 * in fixed patterns (every event dict is the same run of opcodes), which a jump per
 * handler learns; the switch's one shared jump mispredicted, and perf put 38% of the
 * scanner's own time on it. Elsewhere the switch dispatches. */
#if defined(__GNUC__) && !defined(SCAN_SWITCH) /* SCAN_SWITCH: to try the fallback */
#define THREADED
#define TARGET(name) op_##name:
#else
#define TARGET(name) /* a label only where it can be jumped to */
#endif

/* Run the machine to STOP; the result is left on the stack. 0, -1 (sc->error) or -2
 * (a Python exception is set). */
static int run(Scan *sc) {
    size_t op_pos, lit_pos;
    unsigned char op;
    Val v, w;
    Val *t;
    int rc;
#ifdef THREADED
    static const void *targets[256];
    if (!targets[0]) { /* once: every opcode that is not plain data is unknown */
        for (int i = 0; i < 256; i++) targets[i] = &&op_unknown;
        static const unsigned char literal_ops[] = {'N', 0x88, 0x89, 'K', 'M', 'J', 0x8a, 0x8b,
                                                    'G', 0x8c, 'C', 'X', 'B', 0x8d, 0x8e, 0x96};
        for (size_t i = 0; i < sizeof literal_ops; i++) targets[literal_ops[i]] = &&op_literal;
        targets[0x80] = &&op_proto;
        targets[0x95] = &&op_frame;
        targets['.'] = &&op_stop;
        targets['('] = &&op_mark;
        targets['0'] = &&op_pop;
        targets['1'] = &&op_pop_mark;
        targets['2'] = &&op_dup;
        static const unsigned char empty_ops[] = {'}', ']', ')', 0x8f};
        for (size_t i = 0; i < sizeof empty_ops; i++) targets[empty_ops[i]] = &&op_empty;
        targets['d'] = &&op_dict;
        targets['l'] = &&op_list;
        targets['t'] = &&op_tuple;
        targets[0x91] = &&op_frozenset;
        static const unsigned char tuple_n_ops[] = {0x85, 0x86, 0x87};
        for (size_t i = 0; i < sizeof tuple_n_ops; i++) targets[tuple_n_ops[i]] = &&op_tuple_n;
        targets['a'] = &&op_append;
        targets['e'] = &&op_appends;
        targets['s'] = &&op_setitem;
        targets['u'] = &&op_setitems;
        targets[0x90] = &&op_additems;
        targets[0x94] = &&op_memoize;
        targets['q'] = &&op_binput;
        targets['r'] = &&op_long_binput;
        targets['h'] = &&op_binget;
        targets['j'] = &&op_long_binget;
    }
#define NEXT() do { FETCH(); goto *targets[op]; } while (0)
#else
#define NEXT() continue
#endif
/* The next opcode, and what a literal leaves for MEMOIZE and the puts. */
#define FETCH()                                                                           \
    do {                                                                                  \
        if (sc->pos >= sc->size) return FAIL(sc, "the file ends before the pickle's STOP"); \
        if ((rc = report(sc)) != 0) return rc;                                            \
        op_pos = sc->pos;                                                                 \
        lit_pos = sc->lit_pos;                                                            \
        op = sc->buf[sc->pos++];                                                          \
        sc->lit_pos = NO_LIT; /* but for a literal, and the opcodes that leave the top */ \
    } while (0)
    for (;;) {
        FETCH();
        switch (op) {
        case 'N': case 0x88: case 0x89: case 'K': case 'M': case 'J': case 0x8a: case 0x8b:
        case 'G': case 0x8c: case 'C': case 'X': case 'B': case 0x8d: case 0x8e: case 0x96:
        TARGET(literal)
        {
            /* read into its stack slot: a Val built aside, field by field, then copied
             * whole, stalls on store forwarding (this and the memo's keys: 30% of a scan) */
            Val *slot = vec_push(&sc->stack);
            if (!slot) return FAIL(sc, "out of memory");
            if (read_literal(sc, op, slot) < 0) return -1;
            sc->lit_pos = op_pos;
            NEXT();
        }
        case 0x80: /* PROTO */
        TARGET(proto)
            if (need(sc, 1) < 0) return -1;
            if (sc->buf[sc->pos] < 2 || sc->buf[sc->pos] > 5) {
                sc->foreign = 1;
                return FAIL(sc, "pickle protocol %d", sc->buf[sc->pos]);
            }
            sc->pos += 1;
            sc->lit_pos = lit_pos;
            NEXT();
        case 0x95: /* FRAME: a length; the frames' content follows inline */
        TARGET(frame)
            if (need(sc, 8) < 0) return -1;
            sc->pos += 8;
            sc->lit_pos = lit_pos;
            NEXT();
        case '.': /* STOP */
        TARGET(stop)
            return 0;
        case '(': /* MARK */
        TARGET(mark)
        {
            int64_t *m = vec_push(&sc->marks);
            if (!m) return FAIL(sc, "out of memory");
            *m = (int64_t)sc->stack.n;
            NEXT();
        }
        case '0': /* POP */
        TARGET(pop)
            if (sc->stack.n == 0 ||
                (sc->marks.n &&
                 (size_t)AT(sc->marks, int64_t, sc->marks.n - 1) == sc->stack.n)) {
                size_t at;
                if (pop_mark(sc, &at) < 0) return -1;
            } else if (pop(sc, &v) < 0) {
                return -1;
            }
            NEXT();
        case '1': /* POP_MARK */
        TARGET(pop_mark)
        {
            size_t at;
            if (pop_mark(sc, &at) < 0) return -1;
            sc->stack.n = at;
            NEXT();
        }
        case '2': /* DUP */
        TARGET(dup)
            if (top(sc, &t) < 0) return -1;
            v = *t;
            pin(sc, v); /* two references now */
            if (push(sc, v) < 0) return -1;
            NEXT();
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
        case ')': /* EMPTY_TUPLE */
        case 0x8f: /* EMPTY_SET */
        TARGET(empty)
            if (new_obj(sc, op == '}' ? O_DICT : op == ']' ? O_LIST : op == ')' ? O_TUPLE : O_SET,
                        &v) < 0 ||
                push(sc, v) < 0)
                return -1;
            NEXT();
        case 'd': /* DICT */
        TARGET(dict)
            if (from_mark(sc, O_DICT) < 0) return -1;
            NEXT();
        case 'l': /* LIST */
        TARGET(list)
            if (from_mark(sc, O_LIST) < 0) return -1;
            NEXT();
        case 't': /* TUPLE */
        TARGET(tuple)
            if (from_mark(sc, O_TUPLE) < 0) return -1;
            NEXT();
        case 0x91: /* FROZENSET */
        TARGET(frozenset)
            if (from_mark(sc, O_FROZENSET) < 0) return -1;
            NEXT();
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
        TARGET(tuple_n)
            if (tuple_of(sc, (size_t)(op - 0x84)) < 0) return -1;
            NEXT();
        case 'a': /* APPEND */
        TARGET(append)
            if (pop(sc, &w) < 0 || top(sc, &t) < 0 || list_append(sc, t, &w, 1) < 0)
                return -1;
            NEXT();
        case 'e': /* APPENDS */
        TARGET(appends)
            if (add_from_mark(sc, O_LIST) < 0) return -1;
            NEXT();
        case 's': /* SETITEM */
        TARGET(setitem)
        {
            Val kv[2];
            if (pop(sc, &kv[1]) < 0 || pop(sc, &kv[0]) < 0 || top(sc, &t) < 0 ||
                dict_set(sc, t, kv, 2) < 0)
                return -1;
            NEXT();
        }
        case 'u': /* SETITEMS */
        TARGET(setitems)
            if (add_from_mark(sc, O_DICT) < 0) return -1;
            NEXT();
        case 0x90: /* ADDITEMS */
        TARGET(additems)
            if (add_from_mark(sc, O_SET) < 0) return -1;
            NEXT();
        case 0x94: /* MEMOIZE */
        TARGET(memoize)
            sc->lit_pos = lit_pos;
            if (top(sc, &t) < 0 || memo_put(sc, sc->memo.n, *t) < 0) return -1;
            NEXT();
        case 'q': /* BINPUT */
        TARGET(binput)
            sc->lit_pos = lit_pos;
            if (need(sc, 1) < 0 || top(sc, &t) < 0 || memo_put(sc, sc->buf[sc->pos], *t) < 0)
                return -1;
            sc->pos += 1;
            NEXT();
        case 'r': /* LONG_BINPUT */
        TARGET(long_binput)
            sc->lit_pos = lit_pos;
            if (need(sc, 4) < 0 || top(sc, &t) < 0 ||
                memo_put(sc, le(sc->buf + sc->pos, 4), *t) < 0)
                return -1;
            sc->pos += 4;
            NEXT();
        case 'h': /* BINGET */
        TARGET(binget)
            if (need(sc, 1) < 0 || memo_get(sc, sc->buf[sc->pos]) < 0) return -1;
            sc->pos += 1;
            NEXT();
        case 'j': /* LONG_BINGET */
        TARGET(long_binget)
            if (need(sc, 4) < 0 || memo_get(sc, le(sc->buf + sc->pos, 4)) < 0) return -1;
            sc->pos += 4;
            NEXT();
        default:
        TARGET(unknown)
            sc->foreign = 1;
            return FAIL(sc, "opcode 0x%02x at byte %zu is not plain data", op, sc->pos - 1);
        }
    }
#undef FETCH
#undef NEXT
}

/* ---- the rest of the tree, as Python objects ---- */

static PyObject *to_python(Scan *sc, Val v, PyObject *events_marker, int depth);

static PyObject *frame_dict(Scan *sc, int32_t id) {
    const Frame *f = &AT(sc->frames, Frame, id);
    return Py_BuildValue("{s:s#,s:s#,s:L}", "name", f->name, (Py_ssize_t)f->name_len,
                         "filename", f->file, (Py_ssize_t)f->file_len, "line",
                         (long long)f->line);
}

static PyObject *stack_list(Scan *sc, int32_t id) {
    int64_t a = AT(sc->stack_start, int64_t, id), b = AT(sc->stack_start, int64_t, id + 1);
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
    case V_FRAME:
        return frame_dict(sc, v.u.obj);
    case V_STACK:
        return stack_list(sc, v.u.obj);
    case V_EVENT: /* an event outside a trace list: the rows hold it */
        Py_RETURN_NONE;
    default:
        PyErr_SetString(PyExc_ValueError, "a mark left in the result");
        return NULL;
    }
    Obj *o = obj_of(sc, v);
    if (o->role == R_EVENTS) return PyObject_CallFunction(marker, "i", v.u.obj);
    if (o->role == R_FRAME && o->items == NULL) return frame_dict(sc, o->summary);
    if (o->role == R_EVENT) Py_RETURN_NONE;
    if (o->role == R_STACK && o->items == NULL) return stack_list(sc, o->summary);
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

/* Number the stacks as the pickle reader does: in the order the trace's events first
 * use them, then the others (a block's frames, read before the trace). The rows take the
 * new ids; the result maps each new id to the old one (NULL when out of memory). */
static int32_t *renumber_stacks(Scan *sc) {
    size_t n = sc->stack_start.n - 1, rows = sc->ev_list.n;
    int32_t *order = malloc((n ? n : 1) * sizeof(int32_t));
    int32_t *new_of = malloc((n ? n : 1) * sizeof(int32_t));
    if (!order || !new_of) {
        free(order);
        free(new_of);
        return NULL;
    }
    memset(new_of, 0xff, n * sizeof(int32_t));
    int32_t next = 0;
    for (size_t r = 0; r < rows; r++) {
        int32_t old = AT(sc->ev_stack, int32_t, r);
        if (old >= 0 && AT(sc->ev_list, int32_t, r) >= 0 && new_of[old] < 0) {
            new_of[old] = next;
            order[next++] = old;
        }
    }
    for (size_t old = 0; old < n; old++)
        if (new_of[old] < 0) {
            new_of[old] = next;
            order[next++] = (int32_t)old;
        }
    for (size_t r = 0; r < rows; r++) {
        int32_t old = AT(sc->ev_stack, int32_t, r);
        if (old >= 0) AT(sc->ev_stack, int32_t, r) = new_of[old];
    }
    free(new_of);
    return order;
}

/* A column handed to Python as it is: a read-only buffer over the scanner's own array,
 * freed with it. Copied into bytes, ten million rows took a third of a GiB more of fresh
 * pages and a copy. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Column;

static int column_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Column *c = (Column *)self;
    return PyBuffer_FillInfo(view, self, c->data, c->len, 1, flags);
}

static void column_dealloc(PyObject *self) {
    free(((Column *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs column_buffer = {column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchmem.snapshots._scan.Column",
    .tp_doc = "A column of the scan: a read-only buffer (numpy.frombuffer reads it).",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* The column of `v`, which gives up its array to it (NULL with an exception set). */
static PyObject *column(Vec *v) {
    if (!v->data && !(v->data = malloc(1))) return PyErr_NoMemory(); /* never NULL */
    Column *c = PyObject_New(Column, &ColumnType);
    if (!c) return NULL;
    c->data = v->data;
    c->len = (Py_ssize_t)(v->n * v->size);
    v->data = NULL;
    v->n = v->cap = 0;
    return (PyObject *)c;
}

static void scan_free(Scan *sc) {
    if (sc->objs.data)
        for (size_t i = 0; i < sc->objs.n; i++) free(AT(sc->objs, Obj, i).items);
    Vec *vecs[] = {&sc->stack, &sc->marks, &sc->memo, &sc->objs, &sc->spill,
                   &sc->free_objs, &sc->frames,
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
"columns as read-only buffers ('list' int32, 'time' int64 with INT64_MIN for none,\n"
"'action' int8, 'addr' uint64, 'size' int64, 'stack' int32, -1 for none), 'frames' (a list of\n"
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
    sc.stack = sc.spill = proto_val;
    sc.marks = sc.memo = sc.stack_start = sc.ev_time = sc.ev_addr = sc.ev_size = proto_i64;
    sc.objs = proto_obj;
    sc.frames = proto_frame;
    sc.stack_items = sc.ev_list = sc.ev_stack = sc.free_objs = proto_i32;
    sc.lit_pos = NO_LIT;
    sc.last_placed = -1;
    for (int k = 0; k < N_KEYS; k++) {
        sc.keys[k].text = KEY_TEXT[k];
        sc.keys[k].len = (uint32_t)strlen(KEY_TEXT[k]);
    }
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
    int32_t *order = renumber_stacks(&sc);
    PyObject *stacks = order ? PyList_New((Py_ssize_t)n_stacks) : PyErr_NoMemory();
    if (!stacks) {
        free(order);
        Py_DECREF(frames);
        goto done;
    }
    for (size_t s = 0; s < n_stacks; s++) {
        int64_t a = AT(sc.stack_start, int64_t, order[s]);
        int64_t b = AT(sc.stack_start, int64_t, order[s] + 1);
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
    free(order);
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

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    return PyModule_Create(&module);
}
