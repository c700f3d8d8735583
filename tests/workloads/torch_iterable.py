#!/usr/bin/env python3
"""PyTorch IterableDataset pipeline that splits its stream across workers.

A stream of --epoch-samples (1024) samples; __iter__ asks get_worker_info() and worker k of
n yields samples k, k+n, k+2n, ... (all of them with num_workers=0). Sample i is a 128x128
matrix from a torch.Generator seeded by (seed, i), put through --rounds (4) rounds of
tanh(m @ m / 128) -> (column sums float32[128], i). Each worker's last batch is partial,
so an epoch has up to num_workers partial batches.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_common  # noqa: E402
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402

NAME = "torch_iterable"
EPOCH_SAMPLES = 1024


def add_args(p):
    p.add_argument("--matrix", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)


class Stream(IterableDataset):
    def __init__(self, length, matrix, rounds, seed):
        self.length, self.matrix, self.rounds, self.seed = length, matrix, rounds, seed

    def __iter__(self):
        import torch

        info = get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(k, self.length, n):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            m = torch.rand(self.matrix, self.matrix, generator=g)
            for _ in range(self.rounds):
                m = torch.tanh(m @ m / self.matrix)
            yield m.sum(0), i


def build(args):
    return Stream(args.epoch_samples, args.matrix, args.rounds, args.seed)


if __name__ == "__main__":
    sys.exit(torch_common.main(sys.modules[__name__]))
