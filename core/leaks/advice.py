"""What torchmem tells the user to do about each kind of alert, in one place.

An alert names what grows; its suggestion says how to fix it, in terms of the pattern
found (a kept autograd graph, a container that is never emptied, a hook's closure, the
allocator's cache, a DataLoader worker's copied pages). Kept apart from the detection so
that the advice can be read, and reviewed, as a whole.
"""

SUGGEST_GRAPH = (
    "Each kept tensor keeps its autograd graph, and every activation the graph saved, alive. "
    "Keep a number instead: loss.item(), or a tensor without its graph: out.detach()."
)
SUGGEST_CONTAINER = (
    "{holder} gains an entry every step and is never emptied: keep only what you need "
    "(collections.deque(maxlen=N)), store .item() / .detach().cpu() values, or clear it."
)
SUGGEST_CLOSURE = (
    "Tensors captured by a hook or a closure live as long as it does: remove the hook "
    "(handle.remove()) or keep detached copies that you release."
)
SUGGEST_NOT_TENSORS = (
    "Tensor bytes are not growing: the growth is outside tensors (Python objects, a "
    "DataLoader's workers or prefetching, a C library). tracemalloc or memray can tell which."
)
SUGGEST_CACHE = (
    "Allocated memory is flat while the allocator's reserve grows: this is the caching "
    "allocator keeping freed blocks (fragmentation), not a leak. empty_cache() returns them; "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
)
SUGGEST_CAPACITY = (
    "Close to the device's capacity: an OOM is near. Reduce the batch size, use mixed "
    "precision or activation checkpointing, or free what the Tensors panel shows."
)
SUGGEST_RETRIES = (
    "The allocator had to free its cache and retry cudaMalloc: memory is nearly exhausted "
    "and steps slow down. Reduce the batch size or set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
)

SUGGEST_WORKERS = (
    "A DataLoader worker is a fork of the training process: it shares its parent's pages "
    "until it writes to them, and Python writes to every object it reads (its reference "
    "count). Each page of a dataset kept as Python objects (a list of paths, captions, "
    "dicts) that a worker touches becomes that worker's own copy, so the workers' memory "
    "grows toward num_workers times the dataset. Keep the samples in numpy arrays or "
    "tensors (a few objects, no per-item counts), e.g. np.array(paths) instead of a list; "
    "call gc.freeze() before the DataLoader starts its workers; or use fewer workers. "
    "Ranks started by mp.spawn grow here too: attach to one (torchmem attach PID) to see "
    "its tensors."
)
