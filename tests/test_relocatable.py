"""A generated project names no file outside itself: the same model and options give the same
bytes in any folder, and a project moved elsewhere builds there (host, and a cross target with
the toolchain files it carries) and trains as it did where it was compiled."""

import dataclasses
import shutil
from pathlib import Path

import torch
from harness import assert_same_training, require_tools, small_bn_cnn, train_build

import ubitrain as ub

STEPS = 2


def batches():
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
            for _ in range(STEPS)]


def compile_into(out_dir: Path, target="host"):
    x, y = batches()[0]
    return ub.compile(small_bn_cnn(), (x,), y, optimizer=ub.SGD(lr=0.05, momentum=0.9),
                      target=target, out_dir=out_dir)


def files(project: Path) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(project.rglob("*"))
            if p.is_file() and not p.relative_to(project).parts[0].startswith("build")}


def test_the_same_model_gives_the_same_project_in_any_folder(tmp_path):
    one = compile_into(tmp_path / "first" / "net")
    two = compile_into(tmp_path / "second" / "deeper" / "net")
    assert files(one.out_dir) == files(two.out_dir)
    for name, data in files(one.out_dir).items():
        assert str(tmp_path).encode() not in data, f"{name} names the folder it was written to"


def _moved(pkg, tmp_path: Path):
    """`pkg` with its project moved to another folder (the original is gone)."""
    moved = tmp_path / "elsewhere" / pkg.out_dir.name
    shutil.copytree(pkg.out_dir, moved, ignore=shutil.ignore_patterns("build*"))
    shutil.rmtree(pkg.out_dir)
    return dataclasses.replace(pkg, out_dir=moved)


def test_a_moved_host_project_builds_and_trains_the_same(tmp_path):
    pkg = compile_into(tmp_path / "here" / "net")
    before = train_build(pkg, batches())
    assert_same_training(train_build(_moved(pkg, tmp_path), batches()), before)


def test_a_moved_cross_project_builds_with_its_own_toolchain(tmp_path):
    """Built under qemu-aarch64 from where it was compiled, then from a copy elsewhere, with
    the toolchain file it carries in toolchains/."""
    require_tools("aarch64-neon")
    pkg = compile_into(tmp_path / "here" / "net", "aarch64-neon")
    assert (pkg.out_dir / "toolchains" / "aarch64-neon" / "toolchain.cmake").is_file()
    before = train_build(pkg, batches())
    assert_same_training(train_build(_moved(pkg, tmp_path), batches()), before)
