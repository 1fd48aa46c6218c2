"""libnewt's C API (include/newt.h) through ctypes: the structs, the functions, the library.

ctypes rather than cffi: it is in the standard library, so `import newt` needs no compiler,
no build step per Python version and no package beyond libnewt.so itself -- it works with
any CPython 3.8+ as it comes, Debian's or the one a PyTorch image ships. Every call into
the library releases the GIL (ctypes.CDLL does), so a blocking collective or a wait for a
plan does not stop the program's other threads. Nothing here decides anything: it is the
header, spelled in Python. The structs start with `size`, so the library reads no more
than this file declares (newt.h's ABI rules).
"""

import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint, c_uint64, c_void_p

HEADER_VERSION = (0, 1)  # the newt.h this file spells (NEWT_VERSION_MAJOR, _MINOR)

# newt_result_t
OK = 0
ERR_INVALID = 1
ERR_SYS = 2
ERR_NOMEM = 3
ERR_TIMEOUT = 4
ERR_ABORTED = 5
ERR_PEER = 6
ERR_NOTFOUND = 7
ERR_CONFLICT = 8
ERR_UNAVAILABLE = 9
ERR_AUTH = 10
ERR_CORRUPT = 11
ERR_NOSPACE = 12
ERR_CUDA = 13
ERR_NCCL = 14
ERR_INTERNAL = 15
ERR_UNSUPPORTED = 16

# newt_dtype, newt_op, newt_scope, newt_source, newt_next
F32, BF16, F16, I32, I64, U8 = range(6)
DTYPE_SIZE = {F32: 4, BF16: 2, F16: 2, I32: 4, I64: 8, U8: 1}
SUM, AVG, MAX = range(3)
PER_JOB, PER_RANK = range(2)
FROM_MEMORY, FROM_PEERS, FROM_CHECKPOINT, FROM_NOTHING = range(4)
NEXT_STEP, NEXT_GENERATION, NEXT_DONE, NEXT_LEFT, NEXT_FAILED, NEXT_LEFT_OUT = range(6)
FROM_ENV = -2
TENSOR_DEVICE = 1
TENSOR_DERIVED = 2
MAX_DIMS = 8
NAME_MAX = 71


class JoinOpts(ctypes.Structure):
    _fields_ = [("size", c_size_t),
                ("etcd", c_char_p), ("etcd_user", c_char_p), ("etcd_password_file", c_char_p),
                ("etcd_ca", c_char_p), ("etcd_cert", c_char_p), ("etcd_key", c_char_p),
                ("job", c_char_p), ("worker_id", c_char_p), ("host", c_char_p), ("addr", c_char_p),
                ("port", c_int), ("device", c_int), ("cuda_stream", c_void_p), ("share_device", c_int),
                ("memory", c_void_p), ("job_secret_file", c_char_p), ("step_log", c_char_p),
                ("metrics_addr", c_char_p), ("metrics_port", c_int), ("termination_log", c_char_p),
                ("handle_signals", c_int), ("spec_wait_ms", c_int64), ("domain", c_char_p)]


class JobInfo(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("job", c_char_p), ("worker_id", c_char_p), ("steps", c_int64),
                ("global_batch", c_int64), ("micro_batch", c_int64), ("zero", c_int), ("device", c_int),
                ("spec_json", c_char_p)]


class Layout(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("generation", c_uint64), ("rank", c_int), ("world", c_int),
                ("dp", c_int), ("tp", c_int), ("pp", c_int), ("dp_rank", c_int), ("tp_rank", c_int),
                ("pp_rank", c_int), ("accum", c_int64), ("world_comm", c_void_p), ("dp_comm", c_void_p),
                ("tp_comm", c_void_p), ("pp_comm", c_void_p), ("accum_max", c_int64)]


class Tensor(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("dtype", c_int), ("ndim", c_int),
                ("shape", POINTER(c_int64)), ("offset", POINTER(c_int64)), ("extent", POINTER(c_int64)),
                ("begin", c_int64), ("end", c_int64), ("data", c_void_p), ("bytes", c_size_t),
                ("flags", c_uint)]


class RestoreInfo(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("step", c_int64), ("source", c_int), ("bytes_received", c_int64),
                ("bytes_missing", c_int)]


class Batch(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("step", c_int64), ("first", c_int64), ("count", c_int64),
                ("micro_batch", c_int64), ("accum", c_int64), ("global_batch", c_int64)]


class StepResult(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("loss", c_double), ("lr", c_double), ("tokens", c_int64),
                ("after", c_int), ("grad_norm", c_double)]


def sized(struct):
    """A struct of this file, its size set as newt.h's ABI rules ask."""
    s = struct()
    s.size = ctypes.sizeof(struct)
    return s


_PROTOS = {
    "newt_version": (c_int, []),
    "newt_errmsg": (c_char_p, []),
    "newt_result_name": (c_char_p, [c_int]),
    "newt_join_opts_init_size": (None, [POINTER(JoinOpts), ctypes.c_size_t]),
    "newt_join": (c_int, [POINTER(JoinOpts), POINTER(c_void_p)]),
    "newt_use_device": (c_int, [c_void_p, c_void_p, c_void_p]),
    "newt_job_get": (c_int, [c_void_p, POINTER(JobInfo)]),
    "newt_layout_get": (c_int, [c_void_p, POINTER(Layout)]),
    "newt_comm_rank": (c_int, [c_void_p]),
    "newt_comm_size": (c_int, [c_void_p]),
    "newt_comm_host": (c_void_p, [c_void_p]),
    "newt_comm_split": (c_int, [c_void_p, c_int, c_int, POINTER(c_void_p)]),
    "newt_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "newt_reduce_scatter": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "newt_allgather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int]),
    "newt_broadcast": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "newt_send": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "newt_recv": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "newt_barrier": (c_int, [c_void_p]),
    "newt_allreduce_async": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, POINTER(c_void_p)]),
    "newt_wait": (c_int, [c_void_p]),
    "newt_tensor_init": (None, [POINTER(Tensor)]),
    "newt_state_tensor": (c_int, [c_void_p, POINTER(Tensor)]),
    "newt_state_bytes": (c_int, [c_void_p, c_char_p, c_int, c_void_p, c_size_t]),
    "newt_state_restore": (c_int, [c_void_p, POINTER(RestoreInfo)]),
    "newt_step_begin": (c_int, [c_void_p, POINTER(Batch), POINTER(c_int)]),
    "newt_step_commit": (c_int, [c_void_p, POINTER(c_double), POINTER(c_double), c_int]),
    "newt_step_result_init": (None, [POINTER(StepResult)]),
    "newt_step_end": (c_int, [c_void_p, POINTER(StepResult)]),
    "newt_leave": (None, [c_void_p]),
    "newt_finish": (c_int, [c_void_p, c_int]),
}


def _candidates():
    """Where libnewt.so may be, in order: NEWT_LIBRARY; beside this package in the build tree
    (build/python/newt -> build/lib) or in an install (PREFIX/lib/python3/dist-packages/newt
    -> PREFIX/lib); then the loader's own search (LD_LIBRARY_PATH, ld.so.cache)."""
    env = os.environ.get("NEWT_LIBRARY")
    if env:
        return [env]
    pkg = os.path.dirname(os.path.abspath(__file__))
    up2 = os.path.dirname(os.path.dirname(pkg))
    out = [os.path.join(up2, "lib", "libnewt.so.0"), os.path.join(os.path.dirname(up2), "libnewt.so.0")]
    out.append("libnewt.so.0")
    return out


def load():
    """libnewt, its functions typed; ImportError naming every place looked in when none loads."""
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, (res, args) in _PROTOS.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise ImportError(f"newt: {path} has no {name}: a libnewt older than this package") from None
            fn.restype = res
            fn.argtypes = args
        have = lib.newt_version()
        major, minor = have // 10000, have // 100 % 100
        if major != HEADER_VERSION[0] or minor < HEADER_VERSION[1]:
            raise ImportError(f"newt: {path} is libnewt {major}.{minor}, this package needs "
                              f"{HEADER_VERSION[0]}.{HEADER_VERSION[1]} or a newer minor")
        return lib, path
    raise ImportError("newt: libnewt.so not found; set NEWT_LIBRARY to its path. Looked in: " + "; ".join(tried))
