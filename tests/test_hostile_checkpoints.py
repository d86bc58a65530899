"""Checkpoints that must lose nothing: restores all or nothing, failing storage, paths,
symlinks, non-finite values, fsync."""

import os

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub


class _MemoryStorage:
    """A ub_storage in Python memory whose reads can be made to fail from the k-th on."""

    def __init__(self):
        import ctypes

        from ubitrain.runtime.host_trainer import _Storage

        self.blocks, self.reads, self.fail_from = {}, 0, None
        read_t = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint32,
                                  ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32)
        write_t = read_t

        def read(user, block, offset, dst, n):
            self.reads += 1
            data = self.blocks.get(block, b"")
            if self.fail_from is not None and self.reads >= self.fail_from:
                ctypes.memset(dst, 0xA5, n // 2)  # a read that fails half way, garbage in
                return -9
            if offset + n > len(data):
                return -9
            ctypes.memmove(dst, bytes(data[offset:offset + n]), n)
            return 0

        def write(user, block, offset, src, n):
            data = self.blocks.setdefault(block, bytearray())
            data.extend(b"\0" * max(0, offset + n - len(data)))
            data[offset:offset + n] = ctypes.string_at(src, n)
            return 0

        self._callbacks = (read_t(read), write_t(write))
        self.struct = _Storage(None, 1 << 30, ctypes.cast(self._callbacks[0], ctypes.c_void_p),
                               ctypes.cast(self._callbacks[1], ctypes.c_void_p))


def _c_call(trainer, name, storage):
    import ctypes

    fn = getattr(trainer.lib, f"ub_{trainer.package.model_name}_{name}")
    fn.restype = ctypes.c_int32
    return fn(ctypes.byref(trainer.ctx), ctypes.byref(storage.struct))


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A model whose step's working memory can hold a copy of its state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 16, 3))
    x, y = torch.randn(4, 3, 4, 4), torch.randint(0, 3, (4,))
    pkg = ub.compile(model, (x,), y, out_dir=tmp_path_factory.mktemp("staged"))
    assert pkg.memory_plan.restore_is_atomic
    return pkg.build()


def test_a_restore_whose_reads_fail_midway_changes_nothing(staged):
    trainer = staged
    x, y = np.ones((4, 3, 4, 4), np.float32), np.array([0, 1, 2, 1])
    storage = _MemoryStorage()
    assert _c_call(trainer, "save", storage) == 0
    trainer.step(x, y)
    before, steps = trainer.parameters(), trainer.steps
    storage.reads = 0
    assert _c_call(trainer, "restore", storage) == 0  # count the reads of a whole restore
    whole = storage.reads
    trainer.load_parameters(before)
    trainer.ctx.step = steps
    for k in range(1, whole + 1):  # fail at every read of the restore, in turn
        storage.reads, storage.fail_from = 0, k
        state = trainer.arena[:trainer.package.memory_plan.persistent_bytes].copy()
        assert _c_call(trainer, "restore", storage) != 0  # the C alone: staged
        assert np.array_equal(trainer.arena[:len(state)], state), f"read {k} of {whole}"
        assert trainer.steps == steps


def test_the_trainer_restores_all_or_nothing_even_in_place(mlp_trainer, monkeypatch):
    """A model whose working memory is smaller than its state: the C restore reads over the
    state; HostTrainer.restore keeps a copy and puts it back on a failure."""
    assert not mlp_trainer.package.memory_plan.restore_is_atomic
    storage = _MemoryStorage()
    monkeypatch.setattr(mlp_trainer, "_storage", lambda path, create=False: (None, storage.struct))
    mlp_trainer.save("memory")
    mlp_trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    storage.reads = 0
    mlp_trainer.restore("memory")
    whole = storage.reads
    mlp_trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    state, steps = mlp_trainer.arena.copy(), mlp_trainer.steps
    storage.reads, storage.fail_from = 0, whole  # the last read: mid-copy
    with pytest.raises(ub.RuntimeStatusError, match="storage failed"):
        mlp_trainer.restore("memory")
    assert np.array_equal(mlp_trainer.arena, state) and mlp_trainer.steps == steps


def test_checkpoint_paths(mlp_trainer, tmp_path):
    long_dir = tmp_path / ("d" * 200)
    long_dir.mkdir()
    for path in (long_dir / ("p" * 40), os.fsencode(tmp_path / "bytes_path")):
        mlp_trainer.save(path)
        mlp_trainer.restore(path)
    assert (tmp_path / "bytes_path.0").exists() and not list(tmp_path.glob("b'*"))
    with pytest.raises(ub.InputError, match="the checkpoint path is 2011 bytes long"):
        mlp_trainer.save("/" + "x" * 2010)
    with pytest.raises(ub.InputError, match=r"no checkpoint at .*nowhere/ck': the folder "
                                            r"'/.*/nowhere' does not exist"):
        mlp_trainer.restore(tmp_path / "nowhere" / "ck")
    (tmp_path / "file").write_text("")
    with pytest.raises(ub.InputError, match="cannot make the checkpoint folder .*file': a file "
                                            "of that name is in the way"):
        mlp_trainer.save(tmp_path / "file" / "ck")


def test_save_makes_the_folders_it_needs(mlp_trainer, tmp_path, monkeypatch):
    """Before: `mlp_trainer.save("ckpt/mynet")` failed unless ckpt/ existed."""
    monkeypatch.chdir(tmp_path)
    before = mlp_trainer.parameters()
    mlp_trainer.save("ckpt/a/mynet")
    mlp_trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    mlp_trainer.restore(tmp_path / "ckpt" / "a" / "mynet")
    after = mlp_trainer.parameters()
    assert all(np.array_equal(after[k], v) for k, v in before.items())
    assert [p.name for p in (tmp_path / "ckpt" / "a").iterdir()] == ["mynet.0"]  # one save


def test_load_parameters_refuses_values_that_are_not_finite(mlp_trainer):
    """Before: a NaN loaded silently, and every later step's loss was NaN."""
    before = mlp_trainer.parameters()
    for bad in (np.nan, np.inf, -np.inf):
        weight = before["1.weight"].copy()
        weight[2, 5] = bad
        with pytest.raises(ub.InputError, match=rf"parameter '1.weight' holds 1 value\(s\) that "
                                                rf"are not finite \({bad} at \[2, 5\]\); load "
                                                "finite values"):
            mlp_trainer.load_parameters({"1.bias": before["1.bias"] + 1, "1.weight": weight})
    after = mlp_trainer.parameters()
    assert all(np.array_equal(after[k], v) for k, v in before.items())  # nothing written


def test_load_optimizer_state_refuses_values_that_are_not_finite(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    trainer = ub.compile(model, (torch.randn(4, 3, 2, 2),), torch.randint(0, 3, (4,)),
                         optimizer=ub.SGD(0.1, momentum=0.9), out_dir=tmp_path / "m").build()
    state = trainer.optimizer_state()
    name = next(iter(state))
    with pytest.raises(ub.InputError, match=f"optimizer state '{name}' holds"):
        trainer.load_optimizer_state({name: np.full_like(state[name], np.nan)})


def test_an_inf_the_tensor_already_holds_loads_back(tmp_path):
    """A buffer holding -inf (an attention mask): the trainer's own parameters() load back."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("mask", torch.tensor([0.0, -float("inf"), 0.0, 0.0]))

        def forward(self, x):
            return self.fc(x) + self.mask

    trainer = ub.compile(Masked(), (torch.randn(2, 4),), torch.tensor([0, 2]),
                         out_dir=tmp_path / "masked").build()
    values = trainer.parameters()
    assert np.isneginf(values["mask"][1])
    trainer.load_parameters(values)
    values["mask"][2] = -np.inf
    with pytest.raises(ub.InputError, match=r"parameter 'mask' holds 1 value\(s\) that are not "
                                            r"finite \(-inf at \[2\]\)"):
        trainer.load_parameters(values)


def test_save_does_not_follow_a_symlink_at_a_slot_path(mlp_trainer, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    for block in (0, 1):
        (tmp_path / f"ck.{block}").symlink_to(target)
    with pytest.raises(ub.RuntimeStatusError, match="storage failed"):
        mlp_trainer.save(tmp_path / "ck")
    assert target.read_text() == "keep me"


FSYNC_COUNTER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static int calls;
int fsync(int fd) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    ++calls;
    return real(fd);
}
__attribute__((destructor)) static void report(void) {
    FILE *f = fopen(getenv("FSYNC_LOG"), "w");
    if (f) { fprintf(f, "%d\n", calls); fclose(f); }
}
"""


def test_a_save_is_synced_to_disk(mlp_trainer, tmp_path):
    """ub_storage.h: a write that returned is durable. Count the file storage's fsyncs
    (an LD_PRELOAD shim) in a process that saves once."""
    import subprocess
    import sys

    shim = tmp_path / "fsync_counter.so"
    (tmp_path / "shim.c").write_text(FSYNC_COUNTER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c"),
                    "-ldl"], check=True)
    script = (f"import ctypes\nfrom ubitrain.runtime import host_trainer as h\n"
              f"lib = ctypes.CDLL({str(mlp_trainer.lib._name)!r})\n"
              f"f, s = h._FileStorage(), h._Storage()\n"
              f"assert lib.ub_file_storage_open(ctypes.byref(f), ctypes.byref(s), "
              f"{str(tmp_path / 'ck').encode()!r}) == 0\n"
              f"data = ctypes.create_string_buffer(64)\n"
              f"assert s.write if False else True\n"
              f"write = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint32, "
              f"ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32)(s.write)\n"
              f"assert write(s.user, 0, 0, data, 64) == 0\n")
    log = tmp_path / "fsyncs"
    env = dict(os.environ, LD_PRELOAD=str(shim), FSYNC_LOG=str(log))
    subprocess.run([sys.executable, "-c", script], check=True, env=env)
    assert int(log.read_text()) >= 2  # the file, and the folder that got a new file
