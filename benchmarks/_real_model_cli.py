"""The command line that the referee's benchmarks over the real-model suite share
(mutants.py, referee_tolerance.py): --models, --batches, --out; then PyTorch set up as the
referee's runs want it (one thread, warnings off)."""

from __future__ import annotations

import argparse
import warnings

import _results  # noqa: F401 - first: it puts the repository's root (tools/) on sys.path
import torch

from tools.real_models import REAL_MODELS


def parser(doc: str, out: str, batches=(1, 4, 8)) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of `doc`, with the shared options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=[m.name for m in REAL_MODELS])
    p.add_argument("--batches", nargs="+", type=int, default=list(batches))
    p.add_argument("--out", default=out)
    return p


def parse(p: argparse.ArgumentParser):
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    return args
