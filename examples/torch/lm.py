"""The model and data of examples/torch/train.py, without newt: a small transformer language
model (token and position embeddings, nn.TransformerEncoderLayer blocks under a causal mask,
a linear head) and sequences that are a pure function of their index, so any training loop --
newt's (train.py), DDP's (bench/torch/ddp_train.py) -- trains on exactly the same samples."""

import torch
import torch.nn as nn

VOCAB = 64


def tokens_of(indices, seq, seed):
    """The sequences of samples `indices` (a range), seq + 1 tokens each: t[0] from the index,
    t[k+1] = (5 t[k] + 3) mod V, one token in four replaced by a hash of (seed, i, k)."""
    i = torch.arange(indices.start, indices.stop, dtype=torch.int64).unsqueeze(1)
    k = torch.arange(seq + 1, dtype=torch.int64).unsqueeze(0)
    h = (i * 1103515245 + k * 12345 + seed * 7919) % 2147483648
    h = (h * 1103515245 + 12345) % 2147483648
    h = (h * 1103515245 + 12345) % 2147483648
    out = torch.empty(len(indices), seq + 1, dtype=torch.int64)
    out[:, 0] = h[:, 0] % VOCAB
    for p in range(seq):
        nxt = (5 * out[:, p] + 3) % VOCAB
        noisy = (h[:, p + 1] >> 8) % 4 == 0
        out[:, p + 1] = torch.where(noisy, (h[:, p + 1] >> 12) % VOCAB, nxt)
    return out


class LM(nn.Module):
    def __init__(self, d_model, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(seq, d_model)
        block = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        return self.head(self.blocks(h, mask=self.mask))


def add_args(ap):
    """The model's, data's and optimizer's flags (an argparse parser's), with their defaults."""
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20, help="steps of linear warm-up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")


def build(args, device):
    """The model on device, AdamW (weight decay 0.01) and its LambdaLR warm-up, from the seed:
    the same start in every process."""
    torch.manual_seed(args.seed)
    model = LM(args.d_model, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    return model, opt, sched
