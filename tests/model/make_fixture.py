#!/usr/bin/env python3
"""Writes tests/model/fixture_tiny.bin, the PyTorch reference that test_model_torch checks
newt's CPU model against.

Run where PyTorch is installed (Debian: apt-get install python3-torch):
    /usr/bin/python3 tests/model/make_fixture.py [out]

The model is GPT-2 with the `tiny` preset's shapes, written out with plain torch ops over a
dict of tensors named as in newt's parameter table (model/layout.h), computed in float64
so the reference carries no rounding of its own. The initial weights are drawn here
(seeded), rounded to bfloat16-representable values so they store in two bytes each, and
saved in the fixture; the C test loads them into its buffer by name. Also saved: the
batch, the logits, the mean loss, the gradient of every tensor, and the losses of 10 AdamW
steps with the schedule, clipping and weight-decay split that newt uses.

File format (little-endian): magic b"NEWTFIX1", u32 record count, then records of
    u32 name length, name bytes, u32 dtype (0 f32, 1 bf16, 3 i32, 6 f64), u32 ndim,
    u64 dims[ndim], data (row-major).
"""
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

V, CTX, L, NH, C = 256, 64, 4, 4, 128  # the tiny preset
B, T = 2, 64
STEPS = 10
HP = dict(lr=1e-3, lr_min=1e-4, warmup=2, steps=STEPS, beta1=0.9, beta2=0.95, eps=1e-8,
          weight_decay=0.1, grad_clip=1.0)


def names_shapes():
    out = [("wte", (V, C)), ("wpe", (CTX, C))]
    for l in range(L):
        p = f"h.{l}."
        out += [(p + "ln1.w", (C,)), (p + "ln1.b", (C,)), (p + "attn.qkv.w", (3 * C, C)),
                (p + "attn.qkv.b", (3 * C,)), (p + "attn.proj.w", (C, C)), (p + "attn.proj.b", (C,)),
                (p + "ln2.w", (C,)), (p + "ln2.b", (C,)), (p + "mlp.fc.w", (4 * C, C)),
                (p + "mlp.fc.b", (4 * C,)), (p + "mlp.proj.w", (C, 4 * C)), (p + "mlp.proj.b", (C,))]
    return out + [("lnf.w", (C,)), ("lnf.b", (C,))]


def to_bf16(t):
    """Rounds float32 to the nearest bfloat16 (ties to even); returns (values, uint16 bits)."""
    u = t.to(torch.float32).numpy().view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = u.astype(np.uint16)
    vals = (bits.astype(np.uint32) << 16).view(np.float32)
    return torch.from_numpy(vals.copy()), bits


def init_params(gen):
    P = {}
    for name, shape in names_shapes():
        if name.endswith(".w") and len(shape) == 1:  # layernorm weights near 1
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif len(shape) == 1:  # biases, small and non-zero so they are exercised
            t = 0.02 * torch.randn(shape, generator=gen)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.w") else 0.02
            t = std * torch.randn(shape, generator=gen)
        P[name] = t
    return P


def forward(P, idx, tgt):
    Bn, Tn = idx.shape
    hs = C // NH
    x = P["wte"][idx] + P["wpe"][:Tn]
    mask = torch.triu(torch.ones(Tn, Tn, dtype=torch.bool), 1)
    for l in range(L):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), P[p + "ln1.w"], P[p + "ln1.b"], eps=1e-5)
        qkv = h @ P[p + "attn.qkv.w"].t() + P[p + "attn.qkv.b"]
        q, k, v = [t.view(Bn, Tn, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ P[p + "attn.proj.w"].t() + P[p + "attn.proj.b"]
        h = F.layer_norm(x, (C,), P[p + "ln2.w"], P[p + "ln2.b"], eps=1e-5)
        h = F.gelu(h @ P[p + "mlp.fc.w"].t() + P[p + "mlp.fc.b"], approximate="tanh")
        x = x + h @ P[p + "mlp.proj.w"].t() + P[p + "mlp.proj.b"]
    x = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], eps=1e-5)
    logits = x @ P["wte"].t()
    return logits, F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def lr_at(step):
    if step < HP["warmup"]:
        return HP["lr"] * (step + 1) / HP["warmup"]
    span = HP["steps"] - HP["warmup"]
    if span <= 0 or step >= HP["steps"]:
        return HP["lr_min"]
    prog = (step - HP["warmup"]) / span
    return HP["lr_min"] + 0.5 * (HP["lr"] - HP["lr_min"]) * (1 + math.cos(math.pi * prog))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/model/fixture_tiny.bin"
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(1234)
    init = init_params(gen)
    bits = {}
    P = {}
    for name, t in init.items():
        vals, bits[name] = to_bf16(t)
        P[name] = vals.to(torch.float64).requires_grad_(True)
    tokens = torch.randint(0, V, (B, T + 1), generator=gen)
    idx, tgt = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()

    logits, loss = forward(P, idx, tgt)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in P.items()}

    decay = [p for n, p in P.items() if p.dim() == 2]
    no_decay = [p for n, p in P.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"])
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        _, l = forward(P, idx, tgt)
        l.backward()
        losses.append(l.item())
        torch.nn.utils.clip_grad_norm_(list(P.values()), HP["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()

    recs = []

    def rec(name, dtype, shape, data):
        recs.append((name, dtype, shape, data))

    rec("config", 3, (8,), np.array([V, CTX, L, NH, C, B, T, STEPS], dtype=np.int32).tobytes())
    hp = [HP[k] for k in ("lr", "lr_min", "warmup", "steps", "beta1", "beta2", "eps", "weight_decay",
                          "grad_clip")]
    rec("hparams", 6, (len(hp),), np.array(hp, dtype=np.float64).tobytes())
    rec("inputs", 3, (B, T), idx.numpy().astype(np.int32).tobytes())
    rec("targets", 3, (B, T), tgt.numpy().astype(np.int32).tobytes())
    for name, shape in names_shapes():
        rec("param." + name, 1, shape, bits[name].tobytes())
    rec("logits", 0, (B, T, V), logits.detach().numpy().astype(np.float32).tobytes())
    rec("loss", 0, (1,), np.array([loss.item()], dtype=np.float32).tobytes())
    for name, shape in names_shapes():
        rec("grad." + name, 0, shape, grads[name].numpy().astype(np.float32).tobytes())
    rec("losses", 0, (STEPS,), np.array(losses, dtype=np.float32).tobytes())

    with open(out, "wb") as f:
        f.write(b"NEWTFIX1" + struct.pack("<I", len(recs)))
        for name, dtype, shape, data in recs:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", dtype, len(shape)))
            f.write(struct.pack("<%dQ" % len(shape), *shape))
            f.write(data)
    print(f"wrote {out}: loss {loss.item():.6f}, losses {[round(x, 5) for x in losses]}")


if __name__ == "__main__":
    main()
