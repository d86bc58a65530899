"""A large model's kernels in several C files (project/kernel_files.py): the step trains as
PyTorch's does, and bit for bit as the same model's one-file build; the kernels' symbols carry
the model's name."""

import subprocess

import numpy as np
import torch
from harness import assert_trains_like_torch
from torch import nn

import ubitrain as ub
from ubitrain.project import kernel_files


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU6(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def batches(steps=3):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
            for _ in range(steps)]


def split_small(monkeypatch):
    monkeypatch.setattr(kernel_files, "KERNEL_FILE_BYTES", 4096)  # this small model splits


def test_split_kernels_train_like_pytorch(tmp_path, monkeypatch):
    split_small(monkeypatch)
    assert_trains_like_torch(net(), batches(), ub.Adam(lr=0.01), tmp_path)
    assert len(list(tmp_path.rglob("model_kernels_*.c"))) >= 2


def trained(out_dir):
    x, y = batches(1)[0]
    pkg = ub.compile(net(), (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=out_dir,
                     progress=False)
    trainer = pkg.build(progress=False)
    for x, y in batches():
        trainer.step(x.numpy(), y.numpy())
    return pkg, trainer.parameters()


def test_split_build_is_bit_for_bit_the_one_file_build(tmp_path, monkeypatch):
    _, whole = trained(tmp_path / "whole")
    assert not list((tmp_path / "whole").glob("model_kernels*"))
    split_small(monkeypatch)
    pkg, split = trained(tmp_path / "split")
    files = sorted(p.name for p in pkg.out_dir.glob("model_kernels_*.c"))
    assert len(files) >= 2
    for name in files:
        assert name in (pkg.out_dir / "CMakeLists.txt").read_text()
    assert whole.keys() == split.keys()
    for name in whole:
        np.testing.assert_array_equal(split[name], whole[name], err_msg=name)


def test_split_kernels_are_named_after_the_model(tmp_path, monkeypatch):
    """Two generated models link into one program: no kernel symbol without the model's
    name is global."""
    split_small(monkeypatch)
    pkg, _ = trained(tmp_path / "m")
    library = next(pkg.out_dir.rglob("libub_*.so"))
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(library)], capture_output=True,
                             text=True, check=True).stdout.split()
    kernels = [s for s in symbols if s.startswith("ub_") and "__" in s]
    assert kernels, "no kernel is global: model.c could not call across files"
    assert all(s.startswith(f"ub_{pkg.model_name}_") for s in kernels), kernels
