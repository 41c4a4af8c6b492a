#!/usr/bin/python3
"""MNIST in PyTorch with libmoe.torch.MoELayer, on the recipe of `moe train`'s defaults; with --moe, also
runs `moe train` with the same options and seeds and compares the mean test accuracies over the seeds
(exit 1 when they differ by more than --tolerance points; one seed's runs differ by up to about 0.5
points in either direction from the data order and initial weights alone, so compare over a few).

The recipe (cli/train.c, src/model/model.c, src/model/optim.c): a Linear(784, 128) input projection, one pre-norm
block h + MoE(LayerNorm(h)) with 8 experts of hidden size 512, top-2, gelu, dynamic dispatch, then
LayerNorm and Linear(128, 10); weights uniform in +-1/sqrt(fan_in), biases 0 (the MoE layer's from
moe_layer_init_params); loss cross-entropy + 0.01 * the balance loss; AdamW (0.9, 0.999, 1e-8) with
weight decay 0.01 on the weight matrices only; learning rate 2e-3 with one epoch of linear warm-up and
cosine decay to 0 (libmoe.lr_schedule, the same function); 60 epochs of batches of 64, reshuffled each
epoch, every image shifted by up to 2 pixels each way, rotated by up to 15 degrees and scaled by up to
15% (bilinear, zeros outside: cli/augment.c); test accuracy on the t10k
split in batches of 500. The data order and the initial weights come from other random draws than the
C trainer's, so the two runs agree in accuracy, not bit for bit.

Usage: /usr/bin/python3 python/examples/train_mnist.py [--data data/mnist] [--epochs 60] [--seeds 1,2,3]
           [--dtype f32|bf16] [--moe build/moe] [--tolerance 0.5]
(PYTHONPATH is not needed from the source tree; data from scripts/get-mnist.sh.)
"""
import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import libmoe  # noqa: E402
from libmoe.torch import MoELayer  # noqa: E402


class Classifier(nn.Module):
    """src/model/model.c's classifier with one block, the MoE layer from libmoe."""

    def __init__(self, in_dim, classes, seed, dtype):
        super().__init__()
        D = 128
        self.inp = nn.Linear(in_dim, D)
        self.block_norm = nn.LayerNorm(D)
        self.moe = MoELayer(D=D, H=512, E=8, top_k=2, act="gelu", seed=seed, dtype=dtype)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, classes)
        with torch.no_grad():
            for lin in (self.inp, self.head):
                lin.weight.uniform_(-1, 1).div_(lin.in_features ** 0.5)
                lin.bias.zero_()

    def forward(self, x):
        h = self.inp(x)
        h = h + self.moe(self.block_norm(h))
        return self.head(self.norm(h))


def decays(name, p):
    """moe_param_decays: weight matrices, not biases, norms or scales."""
    return p.dim() >= 2 and "bias" not in name


def distorted(images, rows, cols, rng, shift=2, rotate=15.0, scale=0.15):
    """Every image shifted by its own random (dy, dx) in [-shift, shift]^2, rotated by up to +-rotate
    degrees and scaled by a factor in [1 - scale, 1 + scale] about its centre, sampled bilinearly with
    zeros outside (cli/augment.c's map, through torch's affine_grid and grid_sample)."""
    n = len(images)
    dy, dx = rng.integers(-shift, shift + 1, (2, n))
    a = np.deg2rad(rng.uniform(-rotate, rotate, n))
    zoom = 1 + rng.uniform(-scale, scale, n)
    cs, sn = np.cos(a) / zoom, np.sin(a) / zoom
    # source = A (output - centre - shift) + centre in pixels (x along columns, y along rows);
    # grid_sample with align_corners=True takes it in units of the half-extents hx, hy
    hx, hy = (cols - 1) / 2, (rows - 1) / 2
    theta = np.empty((n, 2, 3))
    theta[:, 0, 0], theta[:, 0, 1] = cs, -sn * hy / hx
    theta[:, 1, 0], theta[:, 1, 1] = sn * hx / hy, cs
    theta[:, 0, 2] = -(cs * dx - sn * dy) / hx
    theta[:, 1, 2] = -(sn * dx + cs * dy) / hy
    theta = torch.from_numpy(theta.astype(np.float32))
    x = torch.from_numpy(images.reshape(n, 1, rows, cols))
    grid = F.affine_grid(theta, (n, 1, rows, cols), align_corners=True)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True).reshape(n, rows * cols).numpy()


def accuracy(model, data, batch=500):
    model.eval()
    hits = 0
    with torch.no_grad():
        for s in range(0, len(data.labels), batch):
            logits = model(torch.from_numpy(data.images[s:s + batch]))
            hits += int((logits.argmax(1).numpy() == data.labels[s:s + batch]).sum())
    model.train()
    return hits / len(data.labels)


def train(args, seed):
    train_set, test_set = libmoe.load_split(args.data, "train"), libmoe.load_split(args.data, "t10k")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Classifier(train_set.images.shape[1], max(train_set.classes, test_set.classes), seed, args.dtype)
    named = list(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for n, p in named if decays(n, p)], "weight_decay": 0.01},
                             {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    B = 64
    steps = len(train_set.labels) // B
    labels = torch.from_numpy(train_set.labels.astype(np.int64))
    step, acc = 0, 0.0
    for epoch in range(args.epochs):
        t0 = time.time()
        order = rng.permutation(len(train_set.labels))
        x_all = torch.from_numpy(distorted(train_set.images[order], train_set.rows, train_set.cols, rng))
        y_all = labels[order]
        loss_sum = correct = 0.0
        for s in range(steps):
            x, y = x_all[s * B:(s + 1) * B], y_all[s * B:(s + 1) * B]
            for g in opt.param_groups:
                g["lr"] = libmoe.lr_schedule(args.lr, step, steps, args.epochs * steps)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            (loss + 0.01 * model.moe.aux_loss).backward()
            opt.step()
            step += 1
            loss_sum += float(loss) * B
            correct += int((logits.argmax(1) == y).sum())
        acc = accuracy(model, test_set)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / (steps * B):.4f} train_acc "
              f"{correct / (steps * B):.4f} test_acc {acc:.4f} ({time.time() - t0:.1f} s)", flush=True)
    return acc


def moe_train(args, seed):
    cmd = [args.moe, "train", "--data", args.data, "--epochs", str(args.epochs), "--seed", str(seed),
           "--lr", str(args.lr), "--dtype", args.dtype]
    print("running:", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^test_accuracy=([0-9.]+)$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/mnist", help="IDX directory (scripts/get-mnist.sh writes data/mnist)")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[1],
                    help="comma-separated seeds, one run each")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="the experts' GEMMs")
    ap.add_argument("--moe", help="the moe binary: also run `moe train` and compare")
    ap.add_argument("--tolerance", type=float, default=0.5, help="largest accepted difference, in points")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        acc = train(args, seed)
        print(f"seed {seed}: test_accuracy={acc:.4f}", flush=True)
        rows.append((seed, acc, moe_train(args, seed) if args.moe else None))
    mean = np.mean([a for _, a, _ in rows])
    print(f"test_accuracy={mean:.4f}" + (f" (mean over seeds {args.seeds})" if len(rows) > 1 else ""))
    if not args.moe:
        return 0
    ref = np.mean([r for _, _, r in rows])
    for seed, acc, r in rows:
        print(f"seed {seed}: pytorch + libmoe.torch {acc:.4f}, moe train {r:.4f}")
    diff = 100 * abs(mean - ref)
    print(f"mean: pytorch + libmoe.torch {mean:.4f}, moe train {ref:.4f}, difference {diff:.2f} points "
          f"(tolerance {args.tolerance})")
    return 0 if diff <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
