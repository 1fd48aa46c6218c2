"""Memory that newt reads and writes in place: a torch tensor or a NumPy array, seen as a
pointer, a byte count, a dtype of newt.h and a device. Neither torch nor NumPy is imported
here unless the program already did (a NumPy-only program never loads torch)."""

import sys

from . import _capi as C
from ._errors import UsageError

_CARRIED = "float32, bfloat16, float16, int32, int64, uint8 (and bool as uint8)"


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def is_numpy(x):
    np = _numpy()
    return np is not None and isinstance(x, np.ndarray)


def _torch_dtype(t, dt, what):
    torch = _torch()
    table = {torch.float32: C.F32, torch.bfloat16: C.BF16, torch.float16: C.F16, torch.int32: C.I32,
             torch.int64: C.I64, torch.uint8: C.U8, torch.bool: C.U8}
    if dt not in table:
        raise UsageError(f"{what}: dtype {dt} is not one newt carries ({_CARRIED})")
    return table[dt]


def _numpy_dtype(np, dt, what):
    table = {np.dtype(np.float32): C.F32, np.dtype(np.float16): C.F16, np.dtype(np.int32): C.I32,
             np.dtype(np.int64): C.I64, np.dtype(np.uint8): C.U8, np.dtype(np.bool_): C.U8}
    if dt not in table:
        raise UsageError(f"{what}: dtype {dt} is not one newt carries ({_CARRIED})")
    return table[dt]


def storage_bytes(t):
    """The bytes a torch tensor's storage holds now (0 once it was freed by resize_(0))."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().nbytes()


class View:
    """One buffer as newt sees it: ptr, nbytes, dtype (newt.h's), shape, device (-1: host)."""

    __slots__ = ("obj", "ptr", "nbytes", "dtype", "shape", "device", "numel")

    def __init__(self, obj, what, writable=True):
        self.obj = obj
        if is_torch(obj):
            if obj.is_sparse or getattr(obj, "is_quantized", False):
                raise UsageError(f"{what}: a sparse or quantized tensor; newt carries dense tensors")
            if not obj.is_contiguous():
                raise UsageError(f"{what}: the tensor is not contiguous (strides {tuple(obj.stride())}); "
                                 "pass t.contiguous() and keep that tensor")
            self.dtype = _torch_dtype(obj, obj.dtype, what)
            self.ptr = obj.data_ptr()
            self.numel = obj.numel()
            self.nbytes = self.numel * obj.element_size()
            self.shape = tuple(obj.shape)
            self.device = obj.device.index if obj.device.type == "cuda" else -1
            if obj.device.type not in ("cpu", "cuda"):
                raise UsageError(f"{what}: a tensor on {obj.device}; newt carries CPU and CUDA tensors")
            if obj.device.type == "cuda" and self.device is None:
                self.device = _torch().cuda.current_device()
            if self.nbytes and storage_bytes(obj) == 0:
                raise UsageError(f"{what}: the tensor's storage was freed (resized to 0 bytes)")
        elif is_numpy(obj):
            np = _numpy()
            if not obj.flags.c_contiguous:
                raise UsageError(f"{what}: the array is not C-contiguous; pass np.ascontiguousarray(a) and keep it")
            if writable and not obj.flags.writeable:
                raise UsageError(f"{what}: the array is read-only; newt writes it in place")
            self.dtype = _numpy_dtype(np, obj.dtype, what)
            self.ptr = obj.ctypes.data
            self.numel = int(obj.size)
            self.nbytes = int(obj.nbytes)
            self.shape = tuple(obj.shape)
            self.device = -1
        else:
            raise UsageError(f"{what}: a {type(obj).__name__}; newt reads and writes torch tensors and NumPy arrays")

    def same_memory(self):
        """Whether the object still has the memory it had: not moved (p.data = x, a resize) and
        not freed (a storage resized to 0 bytes leaves a null data pointer)."""
        o = self.obj
        if is_torch(o):
            return o.data_ptr() == self.ptr and o.numel() == self.numel
        return o.ctypes.data == self.ptr and o.size == self.numel
