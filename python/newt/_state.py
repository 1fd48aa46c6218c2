"""The program's training state as newt holds it: tensors and arrays newt reads and writes in
place (a module's parameters and buffers, an optimizer's state), and extras, plain values newt
carries as opaque bytes (an optimizer's hyperparameters, a scheduler's or a data loader's
position, an RNG). Declared once, before the first step; at every generation this package
declares the same memory again and lets libnewt restore it (newt.h's newt_state_tensor,
newt_state_bytes, newt_state_restore).

An extra's bytes come back from a checkpoint, which whoever can write the checkpoint volume
can change, so they are data, never code: JSON with a tag for each type JSON lacks (_encode):
None, bools, ints, floats, strings, bytes, lists, tuples, dicts (any keys of these kinds),
torch tensors and NumPy arrays of numeric dtypes. The reader builds those types and nothing
else; an unknown tag is refused, naming the extra. A checkpoint of the previous release holds
pickles: those are read by an unpickler that resolves no global at all (plain containers and
numbers only), so a pickle naming any function or class -- the only way a pickle runs code --
is refused, never loaded (docs/python.md, "Extras are data")."""

import base64
import ctypes
import io
import json
import math
import pickle
import struct
import sys

from . import _capi as C
from ._errors import Error, UsageError
from ._tensor import View, is_numpy, is_torch

DEFAULT_CAPACITY = 64 * 1024  # bytes of an extra's encoding, the same on every rank
_MAGIC = b"NEWTX1\n"  # an extra's encoding: this, then its JSON (a pickle of the previous release starts b"\x80")
_TAG = "$newt"
_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")
_PLAIN = "None, bool, int, float, str, bytes, list, tuple, dict, torch tensors and NumPy arrays"


class _Refused(ValueError):
    """Restored bytes that are not an extra's plain data."""


def _encode(v, what, depth=0):
    """v as JSON-ready plain data, tagged where JSON has no type of its own."""
    if depth > 100:
        raise UsageError(f"{what}: nested more than 100 deep")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else {_TAG: "float", "v": repr(float(v))}
    if isinstance(v, (bytes, bytearray)):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, list):
        return [_encode(x, what, depth + 1) for x in v]
    if isinstance(v, tuple):
        return {_TAG: "tuple", "v": [_encode(x, what, depth + 1) for x in v]}
    if isinstance(v, dict):
        return {_TAG: "dict", "v": [[_encode(k, what, depth + 1), _encode(x, what, depth + 1)] for k, x in v.items()]}
    if is_torch(v):
        dt = str(v.dtype).replace("torch.", "")
        if dt not in _TORCH_DTYPES or v.is_sparse:
            raise UsageError(f"{what}: a tensor of {v.dtype} is not plain data newt carries in an extra")
        t = v.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(sys.modules["torch"].uint8).numpy().tobytes() if t.numel() else b""
        return {_TAG: "tensor", "dtype": dt, "shape": list(t.shape), "v": base64.b64encode(raw).decode()}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray):
        if v.dtype.kind not in "biufc" or v.dtype.hasobject:
            raise UsageError(f"{what}: an array of {v.dtype} is not plain data newt carries in an extra")
        a = np.ascontiguousarray(v)
        return {_TAG: "ndarray", "dtype": a.dtype.str, "shape": list(a.shape), "v": base64.b64encode(a.tobytes()).decode()}
    if np is not None and isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return _encode(v.item(), what, depth)
    raise UsageError(f"{what}: a {type(v).__module__}.{type(v).__qualname__} is not plain data newt carries in an "
                     f"extra ({_PLAIN}); give get() and set() that turn it into such data and back")


def _shape(obj, n_bytes, itemsize):
    shape = obj.get("shape")
    if not isinstance(shape, list) or len(shape) > 64 or not all(type(d) is int and 0 <= d for d in shape):
        raise _Refused("a tensor's shape is not a list of sizes")
    count = 1
    for d in shape:
        count *= d
    if count * itemsize != n_bytes:
        raise _Refused(f"a tensor of shape {shape} does not hold {n_bytes} bytes")
    return shape


def _b64(obj):
    v = obj.get("v")
    if not isinstance(v, str):
        raise _Refused("bytes that are not base64")
    try:
        return base64.b64decode(v.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise _Refused("bytes that are not base64") from None


def _decode(v, depth=0):
    """Plain data from what json.loads made of an extra: the tags' types, nothing else."""
    if depth > 200:
        raise _Refused("nested too deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_decode(x, depth + 1) for x in v]
    if not isinstance(v, dict) or not isinstance(v.get(_TAG), str):
        raise _Refused("a JSON object that is not one of newt's tags")
    tag = v[_TAG]
    if tag == "float" and v.get("v") in ("inf", "-inf", "nan"):
        return float(v["v"])
    if tag == "bytes":
        return _b64(v)
    if tag == "tuple" and isinstance(v.get("v"), list):
        return tuple(_decode(x, depth + 1) for x in v["v"])
    if tag == "dict" and isinstance(v.get("v"), list):
        out = {}
        for pair in v["v"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise _Refused("a dict entry that is not a [key, value] pair")
            k = _decode(pair[0], depth + 1)
            try:
                out[k] = _decode(pair[1], depth + 1)
            except TypeError:
                raise _Refused(f"a dict key of {type(k).__name__}") from None
        return out
    if tag == "tensor":
        torch = sys.modules.get("torch")
        dt = v.get("dtype")
        if torch is None or dt not in _TORCH_DTYPES:
            raise _Refused(f"a tensor of dtype {dt!r}")
        raw = _b64(v)
        dtype = getattr(torch, dt)
        shape = _shape(v, len(raw), torch.empty((), dtype=dtype).element_size())
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()
    if tag == "ndarray":
        np = sys.modules.get("numpy")
        if np is None:
            raise _Refused("an array, and this program has not loaded NumPy")
        dts = v.get("dtype")
        try:
            dt = np.dtype(dts) if isinstance(dts, str) and len(dts) <= 8 else None
        except TypeError:
            dt = None
        if dt is None or dt.kind not in "biufc" or dt.hasobject:
            raise _Refused(f"an array of dtype {dts!r}")
        raw = _b64(v)
        return np.frombuffer(raw, dtype=dt).reshape(_shape(v, len(raw), dt.itemsize)).copy()
    raise _Refused(f"an unknown tag {tag!r}")


class _NoGlobals(pickle.Unpickler):
    """The previous release's extras, pickled: plain containers and numbers only. A pickle runs
    code only through a global it names (a function to call, a class to build): none is
    resolved here."""

    def find_class(self, module, name):
        raise _Refused(f"a pickle of the previous release that names {module}.{name}: newt loads no pickle "
                       "that names code")


def _decode_bytes(data):
    """An extra's value from its restored bytes (_MAGIC and JSON, or an old plain pickle)."""
    if data.startswith(_MAGIC):
        try:
            text = data[len(_MAGIC):].decode("utf-8")
            return _decode(json.loads(text))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise _Refused(f"not an extra's JSON ({type(e).__name__})") from None
    if data[:1] == b"\x80":
        try:
            return _NoGlobals(io.BytesIO(data)).load()
        except _Refused:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
                RecursionError, MemoryError) as e:
            raise _Refused(f"not a plain pickle ({type(e).__name__}: {e})") from None
    raise _Refused("neither newt's encoding of an extra nor a pickle of the previous release")


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
    """An extra: get() gives a value of plain data, set(value) takes one back; carried in a
    buffer of `capacity` bytes: a length (8 bytes) and its encoding (_MAGIC, then JSON)."""

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
        value = _encode(self.get(), f"state extra {self.name!r}")
        data = _MAGIC + json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
        if len(data) + 8 > self.capacity:
            raise UsageError(f"state extra {self.name!r}: its encoding is {len(data)} bytes, more than its capacity "
                             f"of {self.capacity - 8}; give a larger capacity= (the same on every rank)")
        ctypes.memmove(self.buf, struct.pack("<Q", len(data)) + data, len(data) + 8)

    def read(self):
        (n,) = struct.unpack_from("<Q", self.buf.raw, 0)
        if n == 0:
            return  # nothing was ever written (a state of a program that lacked this extra)
        if n + 8 > self.capacity:
            raise Error(f"state extra {self.name!r}: a restored length of {n} bytes exceeds its capacity",
                        C.ERR_CORRUPT, "corrupt")
        try:
            value = _decode_bytes(self.buf.raw[8:8 + n])
        except _Refused as e:
            raise Error(f"state extra {self.name!r}: the restored bytes are refused: {e} (an extra is plain data, "
                        "never code: docs/python.md)", C.ERR_INVALID, "invalid") from None
        self.set(value)


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
        position: an extra, its state_dict as plain data). Returns obj."""
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
        """Declares an extra: get() gives its value (plain data: None, bool, int, float, str,
        bytes, lists, tuples, dicts, torch tensors, NumPy arrays), set(value) takes a restored
        one. per_rank: this rank's own (an RNG's state), else the same on every rank. capacity:
        the most bytes its encoding may take, the same on every rank."""
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
