"""PyTorch's own DistributedDataParallel over newt (docs/python.md, "A DDP script").

    model = newt.torch.DistributedDataParallel(Net(), job)   # instead of torch's DDP
    for step in job.steps():
        with step:
            for i, mb in enumerate(step.micro_batches()):
                last = i == len(step.micro_batches()) - 1
                with model.no_sync() if not last else contextlib.nullcontext():
                    loss = F.cross_entropy(model(x_of(mb)), y_of(mb), reduction="sum") / step.count
                    loss.backward()                      # buckets go over newt as backward makes them
            total = step.commit(loss_sum)
            opt.step(); opt.zero_grad()
            step.end(loss=total / step.global_batch)

torch's DDP is kept whole -- its reducer, its buckets in reverse order of the parameters,
its hooks, no_sync(), find_unused_parameters -- over a process group of one process (gloo,
in this process alone: torch.distributed's default group, a world of one), so it never talks
to another process itself. What it would send,
it hands to a communication hook: each bucket, as backward fills it, is scaled and summed
over newt's data-parallel group asynchronously (newt's allreduce on the group of the
generation in force, looked up at every bucket: a new generation needs no new DDP), and a
thread of this module completes the bucket's future when newt's reduction is done, so the
reduction of one bucket overlaps the backward of the next. A reduction that fails (a peer
lost) still completes its future, so torch's reducer ends its backward as usual; the step's
commit then raises the failure (no update is applied) and `with step:` hands it to newt,
which recovers -- as torchft's DDP does.

The update is newt's: the same at any world size. A rank's loss is its samples' share of the
step: summed per sample and divided by step.count (or, as a stock DDP script computes it, a
mean per micro-batch divided by the number of micro-batches, when they are full); the hook
scales each bucket by step.count / global_batch before the sum, so the gradients are those
of the global batch's mean, whatever the ranks' shares.

broadcast_buffers keeps every replica's module buffers equal (BatchNorm's running statistics
change in the forward pass, from each rank's own samples): rank 0's are broadcast over the
data-parallel group at each commit (torch's DDP does it before each forward: between a commit
and the next forward nothing changes them), so the state newt checks, snapshots and saves is
the same on every rank. And the buffers a step makes are taken up only once the step is
committed (below, "_keep_buffers"): a step that fails leaves them as they were.
"""

import queue
import threading

import torch
import torch.distributed as dist

from ._errors import Error, UsageError

__all__ = ["DistributedDataParallel", "ZeroRedundancyOptimizer"]

_PG = None


def _one_process_group():
    """A process group of this process alone: torch's DDP runs over it and talks to no one.

    It is torch.distributed's default group, made a world of one (gloo over an in-memory
    store) when nothing made it yet: the one way of making a group that torch 1.13 and every
    torch 2.x take alike (a bare ProcessGroupGloo is a ProcessGroup in 1.13 but only a Backend
    in 2.x, which DDP refuses). A default group of more than one process is a torchrun world,
    whose ranks are not newt's: refused."""
    global _PG
    if _PG is None:
        if not dist.is_available() or not dist.is_gloo_available():
            raise UsageError("newt.torch.DistributedDataParallel needs torch.distributed with gloo")
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        elif dist.get_world_size() != 1:
            raise UsageError(f"newt.torch.DistributedDataParallel: torch.distributed is already initialized with "
                             f"{dist.get_world_size()} processes; newt's ranks are the job's, not torch.distributed's "
                             "(docs/python.md, \"What a script must not do\"): leave init_process_group out")
        _PG = dist.group.WORLD
    return _PG


class _Waiter:
    """Completes the futures of the buckets in flight, in the order they were handed over."""

    def __init__(self):
        self._q = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="newt-ddp", daemon=True)
        self._thread.start()

    def put(self, work, fut, buf, on_error):
        self._q.put((work, fut, buf, on_error))

    def _run(self):
        while True:
            work, fut, buf, on_error = self._q.get()
            try:
                work.wait()  # releases the GIL while newt reduces
            except BaseException as e:  # noqa: BLE001 (the future must complete, whatever happened)
                on_error(e if isinstance(e, Error) else Error(f"a bucket's reduction: {e}"))
            # completed either way, so that torch's reducer ends its backward as usual; a failed
            # reduction fails the step's commit (step.commit raises it: no update is applied)
            fut.set_result(buf)


def _copy_into(dst, src):
    """Copies of the tensors src, in dst's tensors when they fit; returns them."""
    if dst is None or len(dst) != len(src) or any(d.shape != t.shape or d.dtype != t.dtype for d, t in zip(dst, src)):
        return [t.detach().clone() for t in src]
    for d, t in zip(dst, src):
        d.copy_(t.detach())
    return dst


class DistributedDataParallel(torch.nn.Module):
    """torch.nn.parallel.DistributedDataParallel over newt's data-parallel group. Declare its
    state as the module's (job.state.add("model", ddp) or ddp.module); use ddp(x), ddp.no_sync()
    and ddp.module as with torch's."""

    def __init__(self, module, job, *, bucket_cap_mb=25, broadcast_buffers=True, find_unused_parameters=False,
                 gradient_as_bucket_view=False):
        super().__init__()
        self.module = module
        self._job = job
        self.broadcast_buffers = broadcast_buffers
        # find_unused_parameters is on whatever the caller says: torch's DDP rebuilds its buckets
        # after its first iteration (from the order the gradients were ready) unless it is, and a
        # joiner's first iteration would then pair its initial buckets with the survivors'
        # rebuilt ones: the buckets must be the same on every rank, so they are the initial ones,
        # in reverse order of the parameters, always. (A parameter a step does not use is
        # reduced as zeros, as the flag asks.)
        del find_unused_parameters
        kw = dict(process_group=_one_process_group(), bucket_cap_mb=bucket_cap_mb, broadcast_buffers=False,
                  find_unused_parameters=True, gradient_as_bucket_view=gradient_as_bucket_view)
        dev = next((p.device for p in module.parameters()), torch.device("cpu"))
        if dev.type == "cuda":
            kw["device_ids"] = [dev.index]
        # torch's DDP is kept out of the module tree: the parameters are named module.<name>,
        # as under torch's DDP, once
        object.__setattr__(self, "_ddp", torch.nn.parallel.DistributedDataParallel(module, **kw))
        self._ddp.register_comm_hook(None, self._hook)
        object.__setattr__(self, "_waiter", _Waiter())
        object.__setattr__(self, "_kept", None)  # the buffers as the step under way found them
        object.__setattr__(self, "_made", None)  # ... and as it made them, at its commit
        self._kept_step = None  # the step they were kept for (None: none under way)
        job._before_commit.append(self._before_commit)
        job._after_commit.append(self._after_commit)
        job._before_restore.append(self._restore_buffers)

    def forward(self, *args, **kwargs):
        self._keep_buffers()
        return self._ddp(*args, **kwargs)

    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the next one outside reduces."""
        return self._ddp.no_sync()

    # A forward pass changes the module's buffers (BatchNorm's running statistics) before the
    # step is committed, and on each rank from its own samples. newt's contract is that the
    # state changes after the commit only (its snapshot at the commit is the state before the
    # step; a step that fails before it must leave the state as it was). So the buffers as the
    # step found them are kept at its first forward; at the commit, the buffers the step made
    # are broadcast from rank 0 (broadcast_buffers) and set aside, the kept ones put back for
    # the commit's snapshot, and the step's taken up once the commit is done; a step that fails
    # before its commit gets the kept ones back before the next generation's restore.

    def _keep_buffers(self):
        step = self._job._step
        if step is None or self._kept_step == step.number:
            return
        self._kept = _copy_into(self._kept, list(self.module.buffers()))
        self._kept_step = step.number

    def _before_commit(self):
        bufs = list(self.module.buffers())
        if self._kept_step is None or not bufs:
            return
        layout = self._job.layout
        if self.broadcast_buffers and layout is not None and layout.dp.size > 1:
            for b in bufs:
                layout.dp.broadcast(b, 0)
        self._made = _copy_into(self._made, bufs)
        with torch.no_grad():
            for k, b in zip(self._kept, bufs):
                b.copy_(k)

    def _after_commit(self):
        if self._kept_step is None or self._made is None:
            return
        with torch.no_grad():
            for m, b in zip(self._made, self.module.buffers()):
                b.copy_(m)
        self._kept_step = None  # the next step keeps what this one made

    def _restore_buffers(self):
        if self._kept_step is None:
            return
        with torch.no_grad():
            for k, b in zip(self._kept, self.module.buffers()):
                b.copy_(k)
        self._kept_step = None

    def _hook(self, state, bucket):
        """A bucket of gradients, as backward filled it: its share of the global batch, summed
        over the data-parallel group in the background."""
        buf = bucket.buffer()
        # a future of CUDA tensors says its device: torch then orders its readers after the
        # streams it is completed on (newt's NCCL ran on torch's current stream, and newt_wait
        # returned once it was done)
        fut = torch.futures.Future(devices=[buf.device]) if buf.is_cuda else torch.futures.Future()
        job = self._job
        step = job._step
        if step is None:
            fut.set_exception(UsageError("newt.torch.DistributedDataParallel: backward outside a step of job.steps()"))
            return fut
        buf.mul_(step.count / job.global_batch)
        group = job.layout.dp
        if group.size == 1:
            fut.set_result(buf)
            return fut
        try:
            work = group.allreduce_async(buf)
        except Error as e:
            job._set_async_error(e)
            fut.set_result(buf)
            return fut
        self._waiter.put(work, fut, buf, job._set_async_error)
        return fut


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose state is sharded over newt's data-parallel group (ZeRO stage 1,
    as torch's ZeroRedundancyOptimizer): the parameters are one flat vector of N elements in
    the order given; data-parallel rank d of D keeps and updates its chunk [d*c, (d+1)*c) of it
    (c = ceil(N / D)) with an optimizer of optimizer_class over that chunk alone, so its
    optimizer state is about 1/D of the whole; after the update the ranks all-gather the chunks,
    and every rank has every parameter. Declared as state (job.state.add("opt", zero)), the
    shards are parts of flat tensors ("opt.exp_avg" of N elements, ...): at every resize newt
    cuts them anew and moves the elements between ranks in memory, and keeps the replicas of
    each shard as it does for any unique part. Gradients come whole (newt.torch's DDP, or
    job.reduce_gradients); param_groups is the inner optimizer's one group, for a scheduler.

        opt = newt.torch.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, job, lr=1e-3)
        job.state.add("model", model); job.state.add("opt", opt)   # before job.steps()
    """

    def __init__(self, params, optimizer_class, job, **defaults):  # pylint: disable=super-init-not-called
        # a torch Optimizer for whoever checks (a scheduler), whose groups and state are the
        # inner optimizer's of the shard in force: torch.optim.Optimizer.__init__ is not run
        self._params = [p for p in params if p.requires_grad]
        if not self._params:
            raise UsageError("ZeroRedundancyOptimizer: no parameter that requires a gradient")
        dt, dev = self._params[0].dtype, self._params[0].device
        if any(p.dtype != dt or p.device != dev for p in self._params):
            raise UsageError("ZeroRedundancyOptimizer: the parameters must share one dtype and device")
        self._job = job
        self._cls, self._defaults = optimizer_class, dict(defaults)
        self._sizes = [p.numel() for p in self._params]
        self.numel = sum(self._sizes)
        self._dtype, self._device = dt, dev
        self._layout = None  # (generation, rank, size) the shard is cut for
        self._old = None  # the last layout's optimizer, read by the restore that replaces it
        self._inner = None
        self._hyper = {}  # the group's hyperparameters as a scheduler last left them
        self._cut(0, 1)  # before the first generation: the whole vector (init_optimizer_state, declaring)
        job._before_restore.append(self._relayout)

    # --- the shard of the layout in force -----------------------------------------------------

    def _range(self, rank, size):
        c = -(-self.numel // size)
        lo = min(rank * c, self.numel)
        return lo, min(lo + c, self.numel)

    def _cut(self, rank, size):
        """A new shard and an optimizer over it for data-parallel rank `rank` of `size`; the
        last one's stays alive until the restore has read it."""
        self._old = self._inner
        if self._inner is not None:
            self._hyper = {k: v for k, v in self._inner.param_groups[0].items() if k != "params"}
        self._lo, self._hi = self._range(rank, size)
        self._size = size
        self._shard = torch.zeros(self._hi - self._lo, dtype=self._dtype, device=self._device, requires_grad=True)
        self._inner = self._cls([self._shard], **self._defaults)
        self._inner.param_groups[0].update(self._hyper)  # as a scheduler left them (initial_lr too)
        _init_state(self._inner)

    def _relayout(self):
        layout = self._job.layout
        key = (layout.generation, layout.dp_rank, layout.dp_size)
        if self._layout == key:
            return
        self._layout = key
        self._cut(layout.dp_rank, layout.dp_size)

    def _newt_parts(self, prefix):
        """The shard's optimizer state as parts of flat tensors of N elements (the scalars, the
        same on every rank, whole)."""
        from ._state import Part
        parts = []
        for k, v in self._inner.state[self._shard].items():
            if not torch.is_tensor(v):
                continue
            if v.numel() == self._shard.numel() and v.dim() == 1:
                parts.append(Part(f"{prefix}.{k}", v, self.numel, self._lo))
            else:
                parts.append(Part(f"{prefix}.{k}", v.reshape(-1) if v.dim() else v.reshape(1)))
        return parts

    def _newt_extra(self):
        """The rest: the group's hyperparameters (as a scheduler changes them) and the state's
        entries that are not tensors."""
        def get():
            g = {k: v for k, v in self._inner.param_groups[0].items() if k != "params"}
            rest = {k: v for k, v in self._inner.state[self._shard].items() if not torch.is_tensor(v)}
            return {"group": g, "state": rest}

        def put(value):
            self._inner.param_groups[0].update(value["group"])
            self._inner.state[self._shard].update(value["state"])
            self._old = None  # restored: the last layout's shard is read
        return get, put

    # --- the optimizer -------------------------------------------------------------------------

    @property
    def param_groups(self):
        return self._inner.param_groups

    @property
    def state(self):
        return self._inner.state

    @property
    def defaults(self):
        return self._defaults

    def state_dict(self):
        raise UsageError("ZeroRedundancyOptimizer: its state is this rank's shard; newt keeps and checkpoints it "
                         "(job.state.add), a state_dict of it would be one rank's part")

    def load_state_dict(self, state_dict):
        raise UsageError("ZeroRedundancyOptimizer: newt restores its shards (job.state.add), not load_state_dict")

    def add_param_group(self, param_group):
        raise UsageError("ZeroRedundancyOptimizer: one group of the parameters given at its construction")

    def __repr__(self):
        return (f"<newt.torch.ZeroRedundancyOptimizer of {self._cls.__name__}: {self.numel} parameters, this rank "
                f"[{self._lo}, {self._hi}) of {self._size} shards>")

    def state_bytes(self):
        """Bytes of this rank's optimizer state (its shard's)."""
        return sum(v.numel() * v.element_size() for v in self._inner.state[self._shard].values() if torch.is_tensor(v))

    def zero_grad(self, set_to_none=False):
        for p in self._params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def _slices(self):
        """(parameter, its elements [a, b) in this rank's shard, where in the shard)."""
        off = 0
        for p, n in zip(self._params, self._sizes):
            a, b = max(self._lo, off), min(self._hi, off + n)
            if a < b:
                yield p, a - off, b - off, a - self._lo
            off += n

    @torch.no_grad()
    def step(self, closure=None):
        """This rank's shard of the parameters updated from the (whole, reduced) gradients,
        then every shard all-gathered over the data-parallel group."""
        if closure is not None:
            raise UsageError("ZeroRedundancyOptimizer.step: no closure (the gradients are reduced before it)")
        self._old = None  # a restore has read the last layout's shard by now
        shard = self._shard
        if shard.grad is None:
            shard.grad = torch.zeros_like(shard)
        for p, a, b, at in self._slices():
            shard[at:at + b - a].copy_(p.reshape(-1)[a:b])
            g = p.grad.reshape(-1)[a:b] if p.grad is not None else 0
            shard.grad[at:at + b - a].copy_(g)
        self._inner.step()
        group = self._job.layout.dp if self._job.layout else None
        size = group.size if group is not None else 1
        c = -(-self.numel // size)
        if size > 1:
            mine = torch.zeros(c, dtype=self._dtype, device=self._device)
            mine[:shard.numel()] = shard
            every = torch.empty(c * size, dtype=self._dtype, device=self._device)
            group.allgather(mine, every)
        else:
            every = shard
        flat = every[:self.numel]
        off = 0
        for p, n in zip(self._params, self._sizes):
            p.reshape(-1).copy_(flat[off:off + n])
            off += n


def _init_state(opt):
    from . import init_optimizer_state
    init_optimizer_state(opt)
