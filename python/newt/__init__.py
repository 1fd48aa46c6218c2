"""newt for Python: a PyTorch or NumPy training script becomes one elastic worker of a newt
job, through libnewt (include/newt.h; docs/python.md is the whole surface).

    import sys, newt, torch
    with newt.join() as job:                      # the job, from `newt run`'s environment
        model = Net(); opt = torch.optim.AdamW(model.parameters())
        newt.init_optimizer_state(opt)
        job.state.add("model", model)             # newt restores these in place
        job.state.add("opt", opt)
        for step in job.steps():                  # a step, or a recovery when a peer is lost
            with step:                            # a lost peer ends the step: newt recovers
                loss = sum(loss_of(model, step.samples)) / step.global_batch
                loss.backward()
                job.reduce_gradients(model)       # summed over the data-parallel group
                total = step.commit(loss.item())  # every rank agrees the step happened
                opt.step(); opt.zero_grad()
                step.end(loss=total)
    sys.exit(job.exit_code)

Every decision -- who trains, which samples, where the state comes from, when a generation
ends -- is libnewt's; this package only turns its calls into Python's.
"""

import ctypes
import json
import math
import sys
import traceback

from . import _capi as C
from ._errors import Error, PeerError, UnavailableError, UsageError, raise_for as _raise_for
from ._state import State
from ._tensor import View, is_torch

__all__ = ["join", "Job", "Step", "Layout", "Group", "Work", "State", "Error", "PeerError", "UnavailableError",
           "UsageError", "init_optimizer_state", "library_version", "SUM", "AVG", "MAX"]

_lib, library_path = C.load()

SUM, AVG, MAX = C.SUM, C.AVG, C.MAX
_OPS = {"sum": C.SUM, "avg": C.AVG, "mean": C.AVG, "max": C.MAX, C.SUM: C.SUM, C.AVG: C.AVG, C.MAX: C.MAX}
_SOURCES = {C.FROM_MEMORY: "memory", C.FROM_PEERS: "peers", C.FROM_CHECKPOINT: "checkpoint",
            C.FROM_NOTHING: "nothing"}


def library_version():
    """libnewt's version as (major, minor, patch)."""
    v = _lib.newt_version()
    return (v // 10000, v // 100 % 100, v % 100)


def _check(r, what):
    _raise_for(_lib, r, what)


def _op(op):
    if op not in _OPS:
        raise UsageError(f"op {op!r}: one of 'sum', 'avg', 'max'")
    return _OPS[op]


# --- groups and collectives -------------------------------------------------------------------


class Work:
    """An asynchronous collective in flight; wait() once (it raises what the collective met).
    A Work dropped without wait() is safe: newt keeps it, and the buffers libnewt writes into,
    until the collective is done, and waits for it before the next step (job.steps()) or at
    the job's end; a wait() after that raises what the collective met, if anything."""

    # Every Work issued and not yet waited for, in issue order: a Work the program drops stays
    # here, so its buffers outlive the collective (freed, libnewt would write into freed memory).
    _in_flight = {}

    def __init__(self, req, keep):
        self._req = req
        self._keep = keep  # the buffers, alive until the collective is done
        self._error = None
        if req is not None:
            Work._in_flight[id(self)] = self

    def _complete(self):
        if self._req is None:
            return
        req, self._req = self._req, None
        Work._in_flight.pop(id(self), None)
        r = _lib.newt_wait(req)
        self._keep = None
        try:
            _check(r, "collective")
        except Error as e:
            self._error = e

    def wait(self):
        self._complete()
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    @classmethod
    def _wait_all(cls):
        """Waits for every collective not waited for yet (a dropped Work's included)."""
        for w in list(cls._in_flight.values()):
            w._complete()


class Group:
    """A group of ranks of one generation (the job's, the data-, tensor- or pipeline-parallel
    one). Collectives work in place on torch tensors or NumPy arrays, host memory in a CPU job,
    CUDA tensors (on NCCL, on the job's stream) in a GPU job. A peer that died, hung or left
    raises PeerError within the job's deadline; inside `with step:` newt then recovers."""

    def __init__(self, job, ptr, generation):
        self._job = job
        self._ptr = ptr
        self.generation = generation
        self.size = _lib.newt_comm_size(ptr) if ptr else 1
        self.rank = _lib.newt_comm_rank(ptr) if ptr else 0

    def __repr__(self):
        return f"<newt.Group rank {self.rank} of {self.size}, generation {self.generation}>"

    def _comm(self, view):
        return self._comm_on(view.device)

    def _comm_on(self, device):
        """The communicator for buffers on `device` (-1: host memory)."""
        if self._job.layout is None or self._job.layout.generation != self.generation:
            raise PeerError(f"a group of generation {self.generation}, which ended: take the groups of "
                            "job.layout after each new generation", C.ERR_ABORTED, "aborted")
        if device >= 0 and self._job.device < 0:
            raise UsageError("a CUDA tensor in a CPU job (the job's spec trains on the CPU)")
        if device >= 0 and device != self._job.device:
            raise UsageError(f"a tensor on cuda:{device}; this worker's device is cuda:{self._job.device}")
        if device < 0 and self._job.device >= 0:
            return _lib.newt_comm_host(self._ptr)  # host memory in a GPU job: the CPU companion
        return self._ptr

    def _views(self, send, recv, ratio, what):
        """Views of send and recv (recv None: in place), recv holding `ratio` times send (a
        negative ratio: send holds that many times recv)."""
        s = View(send, f"{what}: the input", writable=recv is None)
        r = View(recv, f"{what}: the output") if recv is not None else s
        if s.dtype != r.dtype or s.device != r.device:
            raise UsageError(f"{what}: the input and output differ in dtype or device")
        want = s.numel * ratio if ratio > 0 else s.numel // -ratio
        if (ratio < 0 and s.numel % -ratio) or r.numel != want:
            raise UsageError(f"{what}: the output has {r.numel} elements, {want} expected for an input of "
                             f"{s.numel} over {self.size} ranks")
        return s, r

    def allreduce(self, t, op="sum"):
        """Reduces t over the group, in place; returns t."""
        v, o = View(t, "allreduce"), _op(op)
        if self.size > 1:
            _check(_lib.newt_allreduce(self._comm(v), v.ptr, v.ptr, v.numel, v.dtype, o), "allreduce")
        return t

    def allreduce_async(self, t, op="sum"):
        """Starts an in-place allreduce of t; returns its Work."""
        v, o = View(t, "allreduce"), _op(op)
        if self.size == 1:
            return Work(None, None)
        req = ctypes.c_void_p()
        _check(_lib.newt_allreduce_async(self._comm(v), v.ptr, v.ptr, v.numel, v.dtype, o, ctypes.byref(req)),
               "allreduce")
        return Work(req, t)

    def allgather(self, t, out):
        """out (size times t's elements) gets every rank's t, in rank order; returns out."""
        s, r = self._views(t, out, self.size, "allgather")
        if self.size == 1:
            _copy(out, t)
        else:
            _check(_lib.newt_allgather(self._comm(s), s.ptr, r.ptr, s.numel, s.dtype), "allgather")
        return out

    def reduce_scatter(self, t, out, op="sum"):
        """out gets the reduced block of this rank (t holds size blocks of out's elements)."""
        s, r = self._views(t, out, -self.size, "reduce_scatter")
        o = _op(op)
        if self.size == 1:
            _copy(out, t)
        else:
            _check(_lib.newt_reduce_scatter(self._comm(s), s.ptr, r.ptr, r.numel, s.dtype, o), "reduce_scatter")
        return out

    def broadcast(self, t, root=0):
        """t of the group's rank `root` to every rank, in place; returns t."""
        v = View(t, "broadcast")
        if not 0 <= root < self.size:
            raise UsageError(f"broadcast: root {root}, the group has ranks 0 to {self.size - 1}")
        if self.size > 1:
            _check(_lib.newt_broadcast(self._comm(v), v.ptr, v.ptr, v.numel, v.dtype, root), "broadcast")
        return t

    def _peer(self, peer, what):
        if not 0 <= peer < self.size or peer == self.rank:
            raise UsageError(f"{what}: peer {peer}, the group's other ranks are 0 to {self.size - 1} but {self.rank}")

    def send(self, t, peer):
        self._peer(peer, "send")
        v = View(t, "send", writable=False)
        _check(_lib.newt_send(self._comm(v), v.ptr, v.numel, v.dtype, peer), "send")

    def recv(self, t, peer):
        self._peer(peer, "recv")
        v = View(t, "recv")
        _check(_lib.newt_recv(self._comm(v), v.ptr, v.numel, v.dtype, peer), "recv")
        return t

    def barrier(self):
        if self.size > 1:
            if self._job.layout is None or self._job.layout.generation != self.generation:
                raise PeerError(f"a group of generation {self.generation}, which ended", C.ERR_ABORTED, "aborted")
            _check(_lib.newt_barrier(self._ptr), "barrier")


def _copy(dst, src):
    if is_torch(dst):
        dst.copy_(src.reshape(dst.shape))
    else:
        dst[...] = src.reshape(dst.shape)


class Layout:
    """The layout of one generation: this rank, the world, the data- / tensor- / pipeline-
    parallel coordinates and groups (world, dp, tp, pp: Group), and accum, the micro-batches
    this data-parallel rank takes per step (the ranks split the global batch as evenly as it
    goes: the first ones may take a sample, so a micro-batch, more). Ranks are ordered (pp_rank * dp + dp_rank) * tp +
    tp_rank. Valid until the next generation: ask job.layout again after each."""

    def __init__(self, job, l):
        g = l.generation
        self.generation = g
        self.rank, self.world = l.rank, l.world
        self.dp_size, self.tp_size, self.pp_size = l.dp, l.tp, l.pp
        self.dp_rank, self.tp_rank, self.pp_rank = l.dp_rank, l.tp_rank, l.pp_rank
        self.accum = l.accum
        self.world_group = Group(job, l.world_comm, g)
        self.dp = Group(job, l.dp_comm, g)
        self.tp = Group(job, l.tp_comm, g)
        self.pp = Group(job, l.pp_comm, g)

    def __repr__(self):
        return (f"<newt.Layout generation {self.generation}: rank {self.rank} of {self.world}, dp {self.dp_rank}/"
                f"{self.dp_size} tp {self.tp_rank}/{self.tp_size} pp {self.pp_rank}/{self.pp_size}>")


# --- steps ----------------------------------------------------------------------------------------


class Step:
    """One step: its number, this rank's samples (global indices of the job's sample stream,
    the same at any world size), and the calls that make it one: commit (every rank agrees
    the step happened, before the update) and end (after the update). Use it as a context
    manager: a lost peer ends the step, and the next iteration of job.steps() recovers."""

    def __init__(self, job, b):
        self._job = job
        self.number = b.step
        self.first, self.count = b.first, b.count
        self.micro_batch, self.accum, self.global_batch = b.micro_batch, b.accum, b.global_batch
        self.samples = range(b.first, b.first + b.count)
        self.committed = False
        self.ended = False
        self.error = None  # the newt.Error that ended the step early, if one did

    def __repr__(self):
        return f"<newt.Step {self.number}: samples [{self.first}, {self.first + self.count})>"

    def micro_batches(self):
        """This rank's samples cut in micro-batches (ranges of micro_batch indices)."""
        mb = self.micro_batch
        return [range(a, min(a + mb, self.first + self.count)) for a in range(self.first, self.first + self.count, mb)]

    def commit(self, *values):
        """After the gradients are reduced, before the update: every rank agrees the step
        happened. values (up to 32 numbers, e.g. this rank's summed loss) are summed over the
        ranks in rank order, bitwise the same everywhere: returns the sum (one value), a tuple
        (several) or None. Raises PeerError when a peer is lost: do not update then."""
        if self.committed:
            raise UsageError(f"step {self.number}: committed twice")
        if len(values) > 32:
            raise UsageError(f"step {self.number}: {len(values)} values to commit, at most 32")
        if self._job._async_error is not None:  # a collective in another thread failed (newt.torch's buckets)
            raise self._job._async_error
        for f in self._job._before_commit:
            f()
        vals = (ctypes.c_double * max(1, len(values)))(*[float(v) for v in values])
        sums = (ctypes.c_double * max(1, len(values)))()
        _check(_lib.newt_step_commit(self._job._ctx, vals, sums, len(values)), f"step {self.number}: commit")
        self.committed = True
        for f in self._job._after_commit:  # local work only: nothing between the commit and the update may fail
            f()
        if not values:
            return None
        return sums[0] if len(values) == 1 else tuple(sums[:len(values)])

    def end(self, loss=math.nan, lr=0.0, tokens=0, after=None, grad_norm=0.0):
        """After the update: the step is done. loss: the step's mean loss (the step log, the
        summary); lr: the rate it used; tokens: tokens of the global batch (tokens/s; 0: count
        samples); after: the exception of collectives after the update, if one failed;
        grad_norm: the gradients' global norm before clipping (the step log, metrics; 0: not
        known)."""
        if not self.committed:
            raise UsageError(f"step {self.number}: ended before it was committed (step.commit() first)")
        if self.ended:
            raise UsageError(f"step {self.number}: ended twice")
        self._job.state.write_extras()
        res = C.sized(C.StepResult)
        _lib.newt_step_result_init(ctypes.byref(res))
        res.loss, res.lr, res.tokens, res.grad_norm = float(loss), float(lr), int(tokens), float(grad_norm)
        res.after = getattr(after, "code", C.ERR_INTERNAL) if after is not None else C.OK
        self.ended = True
        _check(_lib.newt_step_end(self._job._ctx, ctypes.byref(res)), f"step {self.number}: end")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None:
            if not self.ended:
                raise UsageError(f"step {self.number}: the block ended without step.commit() and step.end()")
            return False
        if isinstance(exc, Error) and not isinstance(exc, UsageError):
            self.error = exc  # a lost peer (or another failure of the generation): newt recovers
            return True
        failed = self._job._async_error
        if failed is not None and isinstance(exc, RuntimeError):
            # a collective in another thread (newt.torch's buckets) met it, and torch's backward
            # raised it as its own error
            self.error, self._job._async_error = failed, None
            return True
        return False


# --- the job ------------------------------------------------------------------------------------


class Job:
    """This process as one worker of a newt job (newt.join() makes one). A context manager:
    leaving it ends the worker's part (deregisters, says how it ended) and sets job.exit_code,
    the exit status newt's launcher, node agent and chart read (0 done, 3 left, 5 left out of a
    job done without it, 4 the job
    failed, 1 an error, 2 an error another try will not mend). When the worker left, the job
    failed or an exception escaped the block, leaving it also ends the process with that
    status (the exception's traceback printed first); newt.join(exit_on_end=False) leaves
    that to the program."""

    def __init__(self, ctx, exit_on_end=True):
        self._ctx = ctx
        self._exit_on_end = exit_on_end
        info = C.sized(C.JobInfo)
        _check(_lib.newt_job_get(ctx, ctypes.byref(info)), "newt_job_get")
        self.name = info.job.decode()
        self.worker_id = info.worker_id.decode()
        self.total_steps = info.steps
        self.global_batch, self.micro_batch = info.global_batch, info.micro_batch
        self.zero = info.zero
        self.device = info.device
        self.spec = json.loads(info.spec_json.decode()) if info.spec_json else {}
        self.state = State()
        self.layout = None
        self.restored_from = None  # where the last generation's state came from: "memory", "peers", ...
        self.restored_step = None
        self.outcome = None  # "done", "left" or "failed" once job.steps() ended
        self.exit_code = None
        self._started = False
        self._grad_buffers = {}
        self._step = None  # the step under way (newt.torch's hook scales by its share)
        self._async_error = None  # a collective that failed in another thread (newt.torch's buckets)
        self._before_commit = []  # called at each commit, before it (newt.torch: the buffers made equal)
        self._before_restore = []  # called at each new generation, before the state is declared (newt.torch)
        self._after_commit = []  # called at each commit that succeeded, before the update (newt.torch)

    def __repr__(self):
        return f"<newt.Job {self.name!r} worker {self.worker_id!r}>"

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        code = self.finish(exc)
        if not self._exit_on_end or isinstance(exc, SystemExit):
            return False
        if exc is not None:  # said as Python says it, then the status newt's tools read
            traceback.print_exception(kind, exc, tb)
            raise SystemExit(code)
        if self.outcome in ("left", "failed") or code:  # 5: left out of a job that is done
            raise SystemExit(code)
        return False

    @property
    def torch_device(self):
        """The torch.device this worker trains on: cuda:N, or cpu."""
        import torch
        return torch.device("cuda", self.device) if self.device >= 0 else torch.device("cpu")

    def leave(self):
        """Asks to leave at the next step boundary, handing this rank's state to the others
        (SIGTERM and Ctrl-C do the same); job.steps() then ends with outcome "left"."""
        if self._ctx:
            _lib.newt_leave(self._ctx)

    def finish(self, exc=None):
        """Ends this worker's part (the context manager does it); returns the exit status."""
        if self._ctx is None:
            return self.exit_code
        if exc is None:
            r = C.OK
        elif isinstance(exc, Error):
            r = exc.code
        elif isinstance(exc, MemoryError):
            r = C.ERR_NOMEM
        elif isinstance(exc, OSError):
            r = C.ERR_SYS
        else:
            r = C.ERR_INVALID  # the program's own error: another try would meet it again
        Work._wait_all()
        ctx, self._ctx = self._ctx, None
        self.exit_code = _lib.newt_finish(ctx, r)
        return self.exit_code

    def _set_async_error(self, e):
        if self._async_error is None:
            self._async_error = e

    def _start(self):
        """Before the first step: a GPU job's collectives and copies go on torch's stream."""
        self._started = True
        torch = sys.modules.get("torch")
        if self.device >= 0 and torch is not None and torch.cuda.is_available():
            torch.cuda.set_device(self.device)
            stream = torch.cuda.current_stream(self.device).cuda_stream
            _check(_lib.newt_use_device(self._ctx, ctypes.c_void_p(stream), None), "newt_use_device")

    def steps(self):
        """The job's steps for this rank, from wherever the job is: yields a Step to run, and
        between steps takes up each new generation (the layout, the state restored in place).
        Ends when the job is done, this worker left or the job failed (job.outcome)."""
        if self._ctx is None:
            raise UsageError("job.steps() after the job was finished")
        if self._started:
            raise UsageError("job.steps() is iterated once")
        self._start()
        step = None
        while True:
            if step is not None and not step.ended and step.error is None:
                raise UsageError(f"step {step.number} was not ended: in each step call step.commit() and "
                                 "step.end(), inside `with step:` (a lost peer then ends it for a recovery)")
            self.state.check()
            Work._wait_all()  # a Work dropped in the step: its buffers were kept until now
            b = C.sized(C.Batch)
            nxt = ctypes.c_int()
            r = _lib.newt_step_begin(self._ctx, ctypes.byref(b), ctypes.byref(nxt))
            if r == C.ERR_INVALID and step is not None and step.error is not None:
                # the step's error was no lost peer (the generation is healthy): it is the program's
                raise step.error
            _check(r, "newt_step_begin")
            if nxt.value == C.NEXT_STEP:
                step = Step(self, b)
                self._step, self._async_error = step, None
                yield step
            elif nxt.value == C.NEXT_GENERATION:
                step = None
                self._generation()
            else:
                self.outcome = {C.NEXT_DONE: "done", C.NEXT_LEFT: "left", C.NEXT_FAILED: "failed",
                                C.NEXT_LEFT_OUT: "left out"}.get(nxt.value, "done")
                return

    def _generation(self):
        """A new layout: the state declared on the same memory and restored into it."""
        l = C.sized(C.Layout)
        _check(_lib.newt_layout_get(self._ctx, ctypes.byref(l)), "newt_layout_get")
        self.layout = Layout(self, l)
        for f in self._before_restore:
            f()
        try:
            self.state.declare(_lib, self._ctx, _raise_for)
            ri = C.sized(C.RestoreInfo)
            _check(_lib.newt_state_restore(self._ctx, ctypes.byref(ri)), "newt_state_restore")
            if ri.source == C.FROM_NOTHING:
                self._same_start()
            self.state.restored(ri.source)
            self.restored_from, self.restored_step = _SOURCES.get(ri.source, "?"), ri.step
        except Error as e:
            if e.code == C.ERR_INVALID:
                raise  # the program's declarations are wrong: no other generation mends that
            # a peer lost meanwhile: newt_step_begin recovers

    def _same_start(self):
        """A new job: every data-parallel replica starts from rank 0's values, as DDP does,
        whatever each process initialised (the extras included)."""
        g = self.layout.dp
        if g.size == 1:
            return
        for t in self.state._tensors:
            g.broadcast(t.view.obj, 0)
        for e in self.state._extras:
            if e.scope == C.PER_JOB:
                e.write()
                _check(_lib.newt_broadcast(g._comm_on(-1), e.buf, e.buf, e.capacity, C.U8, 0), "broadcast")
                e.read()

    def reduce_gradients(self, params, bucket_mb=25.0):
        """Sums the gradients of params (a torch.nn.Module or an iterable of parameters) over
        the data-parallel group, in buckets of about bucket_mb MiB, each on the wire while the
        next is packed (as DDP does). A parameter without a gradient counts as zeros."""
        import torch
        g = self.layout.dp if self.layout else None
        if g is None or g.size == 1:
            return
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        limit = max(1, int(bucket_mb * (1 << 20)))
        buckets, cur, size, key = [], [], 0, None
        for p in params:
            k = (p.grad.dtype, p.grad.device)
            if cur and (k != key or size + p.grad.numel() * p.grad.element_size() > limit):
                buckets.append(cur)
                cur, size = [], 0
            cur.append(p.grad)
            key = k
            size += p.grad.numel() * p.grad.element_size()
        if cur:
            buckets.append(cur)
        works, flats = [], []
        try:
            for i, grads in enumerate(buckets):
                n = sum(x.numel() for x in grads)
                sig = (i, n, grads[0].dtype, grads[0].device)
                flat = self._grad_buffers.get(sig)
                if flat is None:
                    flat = self._grad_buffers[sig] = torch.empty(n, dtype=grads[0].dtype, device=grads[0].device)
                torch.cat([x.reshape(-1) for x in grads], out=flat)
                works.append(g.allreduce_async(flat))
                flats.append((flat, grads))
        finally:
            err = None
            for w in works:  # every request is waited for, also after a failure
                try:
                    w.wait()
                except Error as e:
                    err = err or e
            if err is not None:
                raise err
        for flat, grads in flats:
            at = 0
            for x in grads:
                x.copy_(flat[at:at + x.numel()].view_as(x))
                at += x.numel()


def join(*, etcd=None, job=None, worker_id=None, host=None, addr=None, port=None, device=None, share_device=None,
         job_secret_file=None, step_log=None, metrics_port=None, handle_signals=True, spec_wait_s=None,
         exit_on_end=True, domain=None):
    """Becomes a worker of a newt job: what is not given comes from the environment that
    `newt run`, `newt worker` and the chart set (NEWT_ETCD, NEWT_JOB, NEWT_WORKER_ID, ...).
    domain: the failure domain (NEWT_DOMAIN; default the host), what goes down as a unit:
    copies of a shard are kept in other domains.
    handle_signals: SIGTERM and Ctrl-C ask for a graceful leave at the next step boundary
    (this rank's state handed over). exit_on_end: leaving the Job's block after a leave, a
    failed job or an exception exits the process with newt's status. Returns the Job (a
    context manager)."""
    o = C.sized(C.JoinOpts)
    _lib.newt_join_opts_init_size(ctypes.byref(o), ctypes.sizeof(o))

    def s(v):
        return None if v is None else str(v).encode()

    o.etcd, o.job, o.worker_id, o.host, o.addr = s(etcd), s(job), s(worker_id), s(host), s(addr)
    o.job_secret_file, o.step_log, o.domain = s(job_secret_file), s(step_log), s(domain)
    if port is not None:
        o.port = int(port)
    if device is not None:
        o.device = int(device)
    if share_device is not None:
        o.share_device = int(bool(share_device))
    if metrics_port is not None:
        o.metrics_port = int(metrics_port)
    o.handle_signals = int(bool(handle_signals))
    if spec_wait_s is not None:
        o.spec_wait_ms = int(spec_wait_s * 1000)
    ctx = ctypes.c_void_p()
    _check(_lib.newt_join(ctypes.byref(o), ctypes.byref(ctx)), "newt.join")
    try:
        return Job(ctx, exit_on_end)
    except BaseException:
        _lib.newt_finish(ctx, C.ERR_INTERNAL)
        raise


def init_optimizer_state(opt):
    """Allocates a torch optimizer's state before the first step, as its first step would,
    and leaves the parameters and the state as a first step will find them (zeros, step 0):
    newt declares the state's memory before training. Returns opt."""
    import torch
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(opt.state.get(p) for p in params):
        return opt
    saved = [p.detach().clone() for p in params]
    before = {id(p): {k: (v.detach().clone() if is_torch(v) else v) for k, v in opt.state.get(p, {}).items()}
              for p in params}
    grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    with torch.no_grad():
        for p, s, g in zip(params, saved, grads):
            p.copy_(s)
            p.grad = g
            old = before[id(p)]
            for k, v in opt.state[p].items():
                if k in old:
                    if is_torch(v):
                        v.copy_(old[k])
                    else:
                        opt.state[p][k] = old[k]
                elif is_torch(v):
                    v.zero_()
                elif isinstance(v, (int, float)):
                    opt.state[p][k] = type(v)(0)
    return opt
