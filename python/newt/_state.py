"""The program's training state as newt holds it: tensors and arrays newt reads and writes in
place (a module's parameters and buffers, an optimizer's state), and extras, picklable
values newt carries as opaque bytes (an optimizer's hyperparameters, a scheduler's or a data
loader's position, an RNG). Declared once, before the first step; at every generation this
package declares the same memory again and lets libnewt restore it (newt.h's
newt_state_tensor, newt_state_bytes, newt_state_restore)."""

import ctypes
import pickle
import struct
import sys

from . import _capi as C
from ._errors import Error, UsageError
from ._tensor import View, is_numpy, is_torch

DEFAULT_CAPACITY = 64 * 1024  # bytes of an extra's pickle, the same on every rank


def _check_name(name, limit, what):
    if not isinstance(name, str) or not name:
        raise UsageError(f"{what}: a name must be a non-empty string, not {name!r}")
    raw = name.encode("utf-8")
    if len(raw) > limit:
        raise UsageError(f"{what} {name!r}: {len(raw)} bytes, at most {limit} (a shorter name or prefix)")
    if any(not (0x20 <= b < 0x7F) or b in (0x22, 0x5C) for b in raw):
        raise UsageError(f"{what} {name!r}: only printable ASCII without quotes or backslashes")
    if name.startswith("newt."):
        raise UsageError(f"{what} {name!r}: names beginning with 'newt.' are newt's own")


class _TensorItem:
    """A tensor of the state: where it is (get() finds it again, so a replaced parameter or
    optimizer slot is noticed) and the memory it had when declared."""

    __slots__ = ("name", "get", "view", "shape")

    def __init__(self, name, get):
        self.name = name
        self.get = get
        self.view = View(get(), f"state tensor {name!r}")
        self.shape = self.view.shape or (1,)  # a 0-dim tensor is one element
        if len(self.shape) > C.MAX_DIMS:
            raise UsageError(f"state tensor {name!r}: {len(self.shape)} dimensions, at most {C.MAX_DIMS}")
        if self.view.numel == 0:
            raise UsageError(f"state tensor {name!r}: it has no elements")

    def check(self):
        try:
            cur = self.get()
        except (KeyError, AttributeError, IndexError) as e:
            raise UsageError(f"state tensor {self.name!r} is gone behind newt's back ({e!r}); keep the state "
                             "newt was given for the whole job") from None
        if cur is not self.view.obj or not self.view.same_memory():
            raise UsageError(f"state tensor {self.name!r} was replaced, moved or freed behind newt's back "
                             "(newt reads and writes the memory it was given: update it in place, "
                             "e.g. p.data.copy_(x), never p.data = x or a new optimizer state)")


class _ExtraItem:
    """An extra: get() gives a picklable value, set(value) takes one back; carried in a
    buffer of `capacity` bytes: a length (8 bytes) and the pickle."""

    __slots__ = ("name", "get", "set", "scope", "capacity", "buf")

    def __init__(self, name, get, set_, per_rank, capacity):
        if not callable(get) or not callable(set_):
            raise UsageError(f"state extra {name!r}: get and set must be callables")
        if not isinstance(capacity, int) or capacity < 16:
            raise UsageError(f"state extra {name!r}: capacity {capacity!r} (bytes, at least 16)")
        self.name, self.get, self.set = name, get, set_
        self.scope = C.PER_RANK if per_rank else C.PER_JOB
        self.capacity = capacity
        self.buf = ctypes.create_string_buffer(capacity)

    def write(self):
        data = pickle.dumps(self.get(), protocol=4)
        if len(data) + 8 > self.capacity:
            raise UsageError(f"state extra {self.name!r}: its pickle is {len(data)} bytes, more than its capacity "
                             f"of {self.capacity - 8}; give a larger capacity= (the same on every rank)")
        ctypes.memmove(self.buf, struct.pack("<Q", len(data)) + data, len(data) + 8)

    def read(self):
        (n,) = struct.unpack_from("<Q", self.buf.raw, 0)
        if n == 0:
            return  # nothing was ever written (a state of a program that lacked this extra)
        if n + 8 > self.capacity:
            raise Error(f"state extra {self.name!r}: a restored length of {n} bytes exceeds its capacity",
                        C.ERR_CORRUPT, "corrupt")
        self.set(pickle.loads(self.buf.raw[8:8 + n]))


def _module_items(prefix, module):
    """A module's parameters and buffers, each found again through the submodule that owns it
    (a Parameter or buffer assigned anew is noticed, at half a microsecond a tensor)."""
    items = []
    for name, _ in [*module.named_parameters(), *module.named_buffers()]:
        path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(path) if path else module
        items.append(_TensorItem(f"{prefix}.{name}", lambda o=owner, a=leaf: getattr(o, a)))
    return items


def _optimizer_params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def _optimizer_items(prefix, opt):
    """The optimizer's tensors in place, and an extra with the rest: its hyperparameters (as
    a scheduler changes them) and the state entries that are not tensors."""
    items = []
    params = _optimizer_params(opt)
    for i, p in enumerate(params):
        st = opt.state.get(p)
        if not st:
            raise UsageError(f"state {prefix!r}: the optimizer has no state for its parameter {i} yet; allocate it "
                             "before declaring it (newt.init_optimizer_state(opt), or one step of the optimizer)")
        for k, v in st.items():
            if is_torch(v):
                items.append(_TensorItem(f"{prefix}.{i}.{k}", lambda p=p, k=k: opt.state[p][k]))

    def get():
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        rest = [{k: v for k, v in opt.state[p].items() if not is_torch(v)} for p in params]
        return {"groups": groups, "state": rest}

    def put(value):
        for g, saved in zip(opt.param_groups, value["groups"]):
            g.update(saved)
        for p, saved in zip(params, value["state"]):
            opt.state[p].update(saved)

    return items, get, put


class Part:
    """A part of a tensor that a layout cuts (newt.torch's ZeRO shards): `tensor` holds the
    elements [begin, begin + tensor.numel()) of a flat tensor of `whole` elements named
    `name` (whole None: the tensor is the whole, the same on every rank). A provider gives
    them anew for each generation: their memory and their slice follow the layout, and newt
    moves the elements between the old parts and the new ones."""

    __slots__ = ("name", "tensor", "whole", "begin")

    def __init__(self, name, tensor, whole=None, begin=0):
        self.name, self.tensor, self.whole, self.begin = name, tensor, whole, begin


class State:
    """job.state: what newt keeps, restores and checkpoints for the program."""

    def __init__(self):
        self._tensors = []
        self._extras = []
        self._providers = []  # (prefix, parts(prefix) -> [Part]): cut anew for each layout
        self._names = set()
        self._sealed = False

    def _refuse_if_sealed(self, name):
        if self._sealed:
            raise UsageError(f"state {name!r} declared after the first step: declare the whole state before "
                             "iterating job.steps() (newt restores it at every generation from then on)")

    def _claim(self, name, limit, what):
        self._refuse_if_sealed(name)
        _check_name(name, limit, what)
        if name in self._names:
            raise UsageError(f"state {name!r} is declared twice")
        self._names.add(name)

    def _add_tensors(self, items):
        for it in items:
            self._claim(it.name, C.NAME_MAX, "state tensor")
        self._tensors.extend(items)

    def add(self, name, obj, *, per_rank=False, capacity=DEFAULT_CAPACITY):
        """Declares `obj` as state named `name`: a torch tensor or NumPy array (in place), a
        torch.nn.Module (its parameters and buffers, in place), a torch.optim.Optimizer (its
        state tensors in place, its hyperparameters as an extra; allocate its state first),
        or any object with state_dict() and load_state_dict() (an LR scheduler, a data loader's
        position: an extra, pickled). Returns obj."""
        self._refuse_if_sealed(name)
        torch = sys.modules.get("torch")
        if is_torch(obj) or is_numpy(obj):
            self._add_tensors([_TensorItem(name, lambda: obj)])
        elif callable(getattr(obj, "_newt_parts", None)):  # newt.torch's ZeroRedundancyOptimizer: parts that
            self._claim(name, C.NAME_MAX, "state")        # each layout cuts anew
            self._providers.append((name, obj._newt_parts))
            get, put = obj._newt_extra()
            self.extra(name + ".rest", get, put, capacity=capacity)
        elif torch is not None and isinstance(obj, torch.nn.Module):
            self._add_tensors(_module_items(name, obj))
        elif torch is not None and isinstance(obj, torch.optim.Optimizer):
            items, get, put = _optimizer_items(name, obj)
            self._add_tensors(items)
            self.extra(name, get, put, per_rank=per_rank, capacity=capacity)
        elif callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            self.extra(name, obj.state_dict, obj.load_state_dict, per_rank=per_rank, capacity=capacity)
        else:
            raise UsageError(f"state {name!r}: a {type(obj).__name__} is not a tensor, an array, a module, an "
                             "optimizer or an object with state_dict()/load_state_dict(); wrap it with "
                             "job.state.extra(name, get, set)")
        return obj

    def extra(self, name, get, set, *, per_rank=False, capacity=DEFAULT_CAPACITY):  # noqa: A002 (set: as a setter)
        """Declares a picklable extra: get() gives its value, set(value) takes a restored one.
        per_rank: this rank's own (an RNG's state), else the same on every rank. capacity:
        the most bytes its pickle may take, the same on every rank."""
        self._claim(name, 48, "state extra")
        self._extras.append(_ExtraItem(name, get, set, per_rank, capacity))

    # --- what the job does with it ---------------------------------------------------------

    def check(self):
        for t in self._tensors:
            t.check()

    def declare(self, lib, ctx, raise_for):
        """Declares every part for the generation about to be restored."""
        self._sealed = True
        self.check()
        for t in self._tensors:
            d = C.sized(C.Tensor)
            lib.newt_tensor_init(ctypes.byref(d))
            shape = (ctypes.c_int64 * len(t.shape))(*t.shape)
            d.name = t.name.encode()
            d.dtype = t.view.dtype
            d.ndim = len(t.shape)
            d.shape = shape
            d.data = t.view.ptr
            d.bytes = t.view.nbytes
            d.flags = C.TENSOR_DEVICE if t.view.device >= 0 else 0
            raise_for(lib, lib.newt_state_tensor(ctx, ctypes.byref(d)), f"declaring state tensor {t.name!r}")
        for prefix, parts in self._providers:
            for p in parts(prefix):
                if p.tensor.numel() == 0:
                    continue  # this rank holds none of it (more ranks than elements)
                v = View(p.tensor, f"state tensor {p.name!r}")
                d = C.sized(C.Tensor)
                lib.newt_tensor_init(ctypes.byref(d))
                whole = p.whole if p.whole is not None else v.numel
                shape = (ctypes.c_int64 * 1)(whole)
                d.name = p.name.encode()
                d.dtype = v.dtype
                d.ndim = 1
                d.shape = shape
                d.begin, d.end = p.begin, p.begin + v.numel
                d.data = v.ptr
                d.bytes = v.nbytes
                d.flags = C.TENSOR_DEVICE if v.device >= 0 else 0
                raise_for(lib, lib.newt_state_tensor(ctx, ctypes.byref(d)), f"declaring state tensor {p.name!r}")
        for e in self._extras:
            raise_for(lib, lib.newt_state_bytes(ctx, e.name.encode(), e.scope, e.buf, e.capacity),
                      f"declaring state extra {e.name!r}")

    def restored(self, source):
        """After a restore: the extras newt filled go back into the program's objects (a new
        job's are taken from them instead)."""
        for e in self._extras:
            if source == C.FROM_NOTHING:
                e.write()
            else:
                e.read()
                e.write()  # as the program's object now has it (what a per-rank extra missing kept)

    def write_extras(self):
        """The extras as they are after an update: the state of the step just ended."""
        for e in self._extras:
            e.write()
