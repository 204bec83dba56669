"""Picking objects of given types off the whole heap, without owning anybody's last reference.

``gc.get_objects()`` returns a list that holds every object of the process. While the
census holds it, another thread (the GUI's, in the window) may drop what was its last
reference to an object; the object then dies when the list is released, in the census
thread. For a Qt object that is a deadlock in PySide6 (a CI run hung on exactly this: a
QMenu destroyed from the script thread). So the list lives only inside one C call
(``_heap.c``, an optional extension) during which no other thread runs; where it was not
built, inside a short section that other threads rarely interrupt: the interpreter's
switch interval is raised for its length, and the section is a handful of C-level passes
that never release the GIL. What is returned holds only the objects of the wanted types
(tensors, modules, optimizers), whose deaths in any thread are harmless.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import compress
from typing import Any

#: Switch interval (s) while the heap list is alive (the Python section, used where the C
#: helper was not built): longer than the passes over a heap of a million objects (about
#: 0.07 s here). It is also how long the census may wait, before the section, for a thread
#: that keeps the GIL busy (a busy GUI thread, a Python data thread). A loaded machine can
#: outlast it (a full CI run once saw another thread run mid-section): the C helper has no
#: such window.
SECTION_INTERVAL_S = 0.25
#: One section at a time: two censuses at once (two threads) would each restore the
#: interval in the middle of the other's section.
_SECTION = threading.RLock()

try:  # the one-call C helper (core/tensors/_heap.c), an optional extension
    from torchmem.tensors import _heap
except ImportError:  # an install without a compiler: the Python section
    _heap = None


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Keep other Python threads from running for the length of the block.

    A thread already waiting for the GIL when the interval is raised still times out on
    the old one and would ask for a switch in the middle; a short sleep first lets every
    waiter run and wait again under the new interval.
    """
    with _SECTION:
        old = sys.getswitchinterval()
        sys.setswitchinterval(SECTION_INTERVAL_S)
        try:
            time.sleep(min(2 * old, 0.1))
            yield
        finally:
            sys.setswitchinterval(old)


def objects_of_types(bases: Sequence[type]) -> tuple[list[list[Any]], set[type]]:
    """The live objects that are instances of each of ``bases``, and the types seen.

    One pass over ``gc.get_objects()``: each object's type is looked up once in C
    (``map``), the few distinct types are classified in Python, and ``compress`` picks the
    objects of the wanted ones. Returns one list per base, and every type that matched
    the first base. In one C call where the helper was built (no other thread can run
    while the list is alive), else in a Python section (:func:`uninterrupted`).
    """
    if _heap is not None:
        return _heap.objects_of_types(tuple(bases))
    with uninterrupted():
        objects = gc.get_objects()
        types_ = list(map(type, objects))
        distinct = set(types_)
        found: list[list[Any]] = []
        first: set[type] = set()
        for base in bases:
            wanted = {tp for tp in distinct if issubclass(tp, base)}
            if not found:
                first = wanted
            picked = compress(objects, map(wanted.__contains__, types_)) if wanted else ()
            found.append(list(picked))
        del objects, types_, distinct
    return found, first
