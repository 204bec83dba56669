"""The census: exact storage sizes, views counted once, real names for every tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchmem
from torchmem.tensors.referrers import referrer_chain
from torchmem.tensors.walk import take_census


def storage_of(census, tensor):
    key = (str(tensor.device), tensor.untyped_storage().data_ptr())
    return census.storages[key]


def names_in(storage):
    return sorted(n for t in storage.tensors for n in (t.names or (t.name,)))


def test_seed_cases_are_exact():
    original = torch.ones(1000, 1000)
    flat = original.view(1_000_000)
    copy = original.clone()
    c = torchmem.census()
    s = storage_of(c, original)
    assert s.nbytes == 4_000_000
    assert sorted(t.name for t in s.tensors) == ["flat", "original"]
    assert storage_of(c, copy) is not s and storage_of(c, copy).nbytes == 4_000_000
    info = {t.name: t for t in s.tensors}
    assert info["flat"].is_view and not info["original"].is_view
    assert info["original"].shape == (1000, 1000) and info["original"].stride == (1000, 1)
    assert info["original"].span_bytes == 4_000_000 and info["original"].dtype == "float32"
    # Views counted once in the total, twice in the naive sum.
    assert c.naive_bytes("cpu") - c.total_bytes("cpu") >= 4_000_000
    del flat


def test_views_offsets_and_dtypes():
    x = torch.arange(100, dtype=torch.float32).reshape(10, 10)
    xt = x.t()  # noqa: F841 - named by the census from this frame
    every_other = x[::2]  # noqa: F841
    tail = x[5:]  # noqa: F841
    c = torchmem.census()
    s = storage_of(c, x)
    assert s.nbytes == 400
    info = {t.name: t for t in s.tensors}
    assert set(info) >= {"x", "xt", "every_other", "tail"}
    assert info["xt"].stride == (1, 10) and not info["xt"].is_contiguous
    assert info["every_other"].shape == (5, 10) and info["every_other"].span_bytes == 360
    assert info["tail"].storage_offset == 50 and info["tail"].span_bytes == 200
    others = {
        "bf": torch.zeros(3, dtype=torch.bfloat16),
        "i8": torch.zeros(5, dtype=torch.int8),
        "flags": torch.zeros(7, dtype=torch.bool),
        "z": torch.zeros(2, dtype=torch.complex64),
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0),
    }
    expected = {"bf": 6, "i8": 5, "flags": 7, "z": 16, "scalar": 4, "empty": 0}
    c = take_census([("", others)])
    for name, t in others.items():
        s = storage_of(c, t)
        assert s.nbytes == expected[name], name
        assert name in names_in(s)
    scalar = next(t for t in storage_of(c, others["scalar"]).tensors if t.name == "scalar")
    assert scalar.shape == () and scalar.numel == 1


def test_modules_grads_and_adam_state_are_named():
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 8))
    model[2].weight = nn.Parameter(torch.randn(8, 16))
    opt = torch.optim.Adam(model.parameters())
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    c = torchmem.census()
    w = storage_of(c, model[0].weight)
    assert w.kind == "parameter" and "model.0.weight" in names_in(w)
    assert "model.0.weight.grad" in names_in(storage_of(c, model[0].weight.grad))
    exp_avg = opt.state[model[0].weight]["exp_avg"]
    assert "Adam.state[model.0.weight].exp_avg" in names_in(storage_of(c, exp_avg))
    assert storage_of(c, exp_avg).kind == "optimizer_state"
    assert "model.1.running_mean" in names_in(storage_of(c, model[1].running_mean))
    # Adam keeps two moments per parameter (of this model: other tests' modules may live on).
    own = sum(p.numel() * p.element_size() for p in model.parameters())
    assert c.bytes_by_kind("cpu")["optimizer_state"] >= 2 * own


def test_tied_weights_are_counted_once_with_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.embed.weight

    net = Tied()
    c = torchmem.census()
    s = storage_of(c, net.embed.weight)
    assert {"net.embed.weight", "net.head.weight"} <= set(names_in(s))
    assert s.nbytes == 50 * 8 * 4
    assert sum(1 for st in c.storages.values() if st is s) == 1


class Holder:
    kept = torch.full((3,), 7.0)


def test_what_keeps_a_parameter_its_grad_and_adam_state_alive_reads_as_code():
    """The chain once stopped at "item 0 of a list of 2", "a closure cell" (the optimizer's
    parameter group first, then a cell of nobody's) for every parameter of a model."""
    script = {"__name__": "__main__"}
    exec(
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "model(torch.randn(2, 4)).sum().backward()\n"
        "opt.step()\n",
        script,
    )
    weight = script["model"][0].weight
    path = [
        "Linear._parameters['weight']",
        "Sequential._modules['0']",
        "global model of the script",
    ]
    assert referrer_chain(weight) == path
    assert referrer_chain(weight.grad) == ["the .grad of a parameter", *path]
    assert referrer_chain(script["opt"].state[weight]["exp_avg"]) == [
        "value of key 'exp_avg' in a dict of 3",
        "Adam.state[<Parameter [4, 4]>]",
        "global opt of the script",
    ]


def test_tensors_in_containers_closures_and_classes_are_named():
    in_list = [torch.zeros(11), torch.zeros(12)]
    in_dict = {"cache": torch.zeros(13)}

    def make():
        captured = torch.zeros(14)
        return lambda: captured

    fn = make()
    c = torchmem.census()
    assert "in_list[1]" in names_in(storage_of(c, in_list[1]))
    assert "in_dict['cache']" in names_in(storage_of(c, in_dict["cache"]))
    captured = fn.__closure__[0].cell_contents
    closure_storage = storage_of(c, captured)
    assert closure_storage.named, closure_storage.tensors[0].name
    assert referrer_chain(captured)[0].endswith("make.<locals>.<lambda>()")
    assert referrer_chain(captured)[0].startswith("captured by closure")
    klass = storage_of(c, Holder.kept)
    assert klass.name.startswith("class attribute Holder.kept"), klass.name


class _Cache:
    def __init__(self):
        self.batches = [torch.full((8,), float(i)) for i in range(3000)]
        self.by_key = {f"k{i}": torch.full((3,), float(i)) for i in range(500)}
        self.by_key["k0"] = torch.zeros(100)  # the largest: its dict is among those looked up


class _Pair:
    def __init__(self):
        self.items = [torch.zeros(200), torch.zeros(200)]


def test_every_tensor_of_a_big_container_the_script_does_not_name_gets_its_own_place():
    """Tensors found only by what holds them (no script variable reaches them): each item
    of a 3,000-tensor list is named by its own index, each dict value by its own key, once
    one of its tensors is among the largest unnamed (those whose holders are looked up);
    an attribute's list is named as a path, a loose list by the item's place in it."""
    holder = _Cache()
    loose = [torch.zeros(300) for _ in range(2)]  # held by this frame only
    vars(holder)  # made, as the census's walk of a script's variables makes it
    pair = _Pair()  # its __dict__ never asked for
    c = take_census([])  # no namespaces: only referrers can name them
    for i in (0, 1, 1234, 2999):
        assert names_in(storage_of(c, holder.batches[i])) == [f"_Cache.batches[{i}]"]
    for i in (0, 499):
        assert names_in(storage_of(c, holder.by_key[f"k{i}"])) == [f"_Cache.by_key['k{i}']"]
    listed = [t for t in c.tensors() if t.name.startswith("_Cache.batches[")]
    assert len(listed) == 3000
    assert names_in(storage_of(c, loose[1])) == ["item 1 of a list of 2: float32 [300]"]
    assert names_in(storage_of(c, pair.items[1])) == ["_Pair.items[1]"]


def test_saved_tensors_of_an_mlp_are_attributed_to_its_loss():
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    loss = mlp(torch.randn(16, 32)).pow(2).mean()
    c = torchmem.census()
    saved = [s for s in c.storages.values() if s.name == "saved by the graph of loss"]
    assert saved, "the graph's saved activations must be found"
    assert all(s.kind == "activation" for s in saved)
    # the ReLU output (16 x 64 float32) is among them
    assert any(s.nbytes == 16 * 64 * 4 for s in saved)
    loss.backward()  # frees the saved tensors
    after = torchmem.census()
    assert not [s for s in after.storages.values() if s.name == "saved by the graph of loss"]


def test_sparse_meta_and_unnamed_tensors():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    sp = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0, 5.0]), (2, 3))
    csr = sp.to_sparse_csr()
    meta = torch.empty(1000, 1000, device="meta")
    c = take_census([("", {"sp": sp, "csr": csr, "meta": meta})])
    names = {t.name for t in c.tensors()}
    assert {"sp.indices", "sp.values", "csr.crow_indices", "csr.col_indices", "csr.values"} <= names
    assert any(s.label == "meta" and "meta tensor" in s.reason for s in c.skipped)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_a_compiled_model_keeps_its_names_and_its_tracing_tensors_cost_nothing():
    """torch.compile: the wrapper's ``_orig_mod`` is left out of every name, and the fake
    tensors that compiled graphs keep (shapes over a meta storage, whose data pointer
    raises) are listed as skipped, once per type, instead of failing the census (which,
    at a step boundary, ended the user's script)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    compiled = torch.compile(model)  # compiles at its first call: none here
    with FakeTensorMode():
        traced = [torch.empty(1000, 1000) for _ in range(3)]
    c = take_census([("", {"compiled": compiled, "traced": traced})])
    names = {t.name for t in c.tensors()}
    assert {"compiled.0.weight", "compiled.2.bias"} <= names
    assert not any("_orig_mod" in n for n in names)
    assert [(s.label, "tracing" in s.reason) for s in c.skipped] == [("3 FakeTensors", True)]
    assert c.total_bytes("cpu") < 4_000_000  # their 12 MB are not counted
    del traced


class _Unsizable(torch.Tensor):
    """A subclass that will not tell its layout in memory (as some wrapper subclasses)."""

    def stride(self, *args):
        raise RuntimeError("this subclass has no strides to show")


def test_a_tensor_that_cannot_be_sized_is_listed_and_the_rest_counted():
    odd = torch.zeros(300).as_subclass(_Unsizable)
    plain = torch.zeros(1000)
    c = take_census([("", {"odd": odd, "plain": plain})])
    assert storage_of(c, plain).nbytes == 4000
    (skip,) = [s for s in c.skipped if s.label == "odd"]
    assert "_Unsizable could not be sized: this subclass has no strides" in skip.reason


def test_diff_reports_new_freed_and_named_share():
    keep = torch.zeros(100)
    before = torchmem.census()
    grown = [torch.zeros(256) for _ in range(3)]
    del keep
    after = torchmem.census()
    d = after.diff(before)
    assert len([s for s in d.new if s.nbytes == 1024]) == 3
    assert any(s.nbytes == 400 for s in d.freed)
    assert d.new_bytes >= 3 * 1024
    assert after.named_share() > 0.95
    del grown


def test_a_census_leaves_the_scripts_garbage_collection_as_it_was():
    import gc

    assert gc.isenabled()
    take_census()
    assert gc.isenabled(), "a census must not leave automatic collection off"
    gc.disable()
    try:
        take_census()
        assert not gc.isenabled(), "a script that turned collection off keeps it off"
    finally:
        gc.enable()


def test_pinned_host_memory_is_asked_once_per_storage_and_only_with_an_accelerator(
    monkeypatch,
):
    from torchmem.tensors import walker as tensor_census

    base = torch.zeros(64)
    views = [base[i:] for i in range(5)]
    asked = []

    def is_pinned(t):
        asked.append(t)
        return True

    monkeypatch.setattr(tensor_census, "_is_pinned", is_pinned)
    monkeypatch.setattr(tensor_census, "_pinning_possible", lambda torch: False)
    c = take_census([("", {"base": base, "views": views})])
    assert not asked and not any(t.pinned for t in storage_of(c, base).tensors)

    monkeypatch.setattr(tensor_census, "_pinning_possible", lambda torch: True)
    c = take_census([("", {"base": base, "views": views})])
    infos = storage_of(c, base).tensors
    assert len(infos) == 6 and all(t.pinned for t in infos)
    assert sum(1 for t in asked if t.untyped_storage().data_ptr() == base.data_ptr()) == 1
    del views


def test_an_object_another_thread_lets_go_of_during_a_census_dies_in_that_thread():
    """The census's list of the whole heap must never own anybody's last reference: in
    the window, the GUI thread's objects dying in the script thread deadlock PySide6."""
    import threading

    deaths: list[int] = []

    class Mortal:
        def __del__(self) -> None:
            deaths.append(threading.get_ident())

    ballast = [[] for _ in range(300_000)]  # a heap big enough for the census to take a while
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            batch = [Mortal() for _ in range(2000)]
            del batch

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(6):
            take_census(referrers=False)
    finally:
        stop.set()
        churner.join()
    del ballast
    assert deaths, "the other thread made and dropped objects during the censuses"
    assert set(deaths) == {churner.ident}


def test_the_heap_helper_was_built_and_picks_what_the_python_section_picks(monkeypatch):
    # Optional, so that an install without a compiler works; here, where setup has gcc,
    # its absence would leave the census's list of the heap open to other threads.
    from torchmem.tensors import heap

    helper = heap._heap
    assert helper is not None
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plain, view = torch.ones(3), model[0].weight[0]
    bases = (torch.Tensor, nn.Module, torch.optim.Optimizer)
    in_c, first_c = heap.objects_of_types(bases)
    monkeypatch.setattr(heap, "_heap", None)
    in_python, first_python = heap.objects_of_types(bases)
    assert [set(map(id, found)) for found in in_c] == [set(map(id, f)) for f in in_python]
    assert first_c == first_python and {nn.Parameter, torch.Tensor} <= first_c
    for obj, found in ((plain, 0), (view, 0), (model, 1), (model[1], 1), (opt, 2)):
        assert any(o is obj for o in in_c[found])
    with pytest.raises(TypeError, match="bases must be types"):
        helper.objects_of_types((torch.Tensor, "not a type"))


def test_naming_from_the_scripts_own_thread_keeps_no_frame_alive():
    # A census at a step boundary runs in the script's thread, inside the step. Its frame
    # walk must not outlive it: a cycle through the walk's own frame kept the step's
    # activations alive until the next cyclic collection (a step function's peak doubled).
    import gc
    import threading
    import weakref

    from torchmem.tensors.namespaces import script_namespaces

    def step():
        activations = torch.ones(1024)
        namespaces = script_namespaces(threading.get_ident(), __file__)
        assert any("activations" in ns[1] for ns in namespaces)
        namespaces.clear()
        return weakref.ref(activations)

    collecting = gc.isenabled()
    gc.disable()  # only reference counting may free it, as between two steps
    try:
        assert step()() is None, "the step's tensor outlived its frame"
    finally:
        if collecting:
            gc.enable()
