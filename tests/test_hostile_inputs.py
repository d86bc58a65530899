"""What a user can get wrong, and what must still end in a clear error or a right result with
nothing lost: recompiling, inputs, parameters, checkpoints, ONNX files, the CLI, the C API."""

import copy
import os
import re

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub


def test_recompiling_into_the_same_out_dir_runs_the_new_code(tmp_path):
    """The loader hands out a library a process already loaded from a path: the new trainer
    must not run the old code with the new shapes."""
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    for width in (6, 4, 6):
        torch.manual_seed(width)
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 3))
        trainer = ub.compile(model, (x,), y, out_dir=tmp_path / "same").build()
        assert trainer.parameters()["1.weight"].shape == (width, 12)
        with torch.no_grad():
            np.testing.assert_allclose(trainer.predict(x), model(x).numpy(), rtol=1e-5,
                                       atol=1e-6)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    return ub.compile(model, (x,), y, out_dir=tmp_path_factory.mktemp("t")).build()


def test_load_parameters_writes_nothing_unless_every_entry_is_good(trainer):
    before = trainer.parameters()
    with pytest.raises(ub.InputError, match="parameter '3.weight' has shape"):
        trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32),
                                 "3.weight": np.ones((2, 2), np.float32)})
    with pytest.raises(ub.InputError, match="unknown parameter names"):
        trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32), "nope": 1})
    after = trainer.parameters()
    for name, value in before.items():
        assert np.array_equal(after[name], value), name


def test_labels_that_would_wrap_are_refused(trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    for labels in (np.array([0, 1, 2, 2**32 + 1], np.int64),
                   np.array([0, 1, 2, 2**63 + 1], np.uint64),
                   np.array([0, 1, -(2**32) + 2, 1], np.int64)):
        with pytest.raises(ub.InputError, match="outside int32's range"):
            trainer.step(x, labels)


def test_shape_and_dtype_messages_name_what_is_wrong(trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    with pytest.raises(ub.InputError, match=r"parameter '1.bias' has shape \[3\]; it must be "
                                            r"\[8\]$"):
        trainer.load_parameters({"1.bias": np.zeros(3, np.float32)})
    with pytest.raises(ub.InputError, match="recompile for another one"):
        trainer.step(np.zeros((2, 3, 2, 2), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ub.InputError, match=r"dtype int64; it must be a float array \(float32\)"):
        trainer.step(x.astype(np.int64), np.zeros(4, np.int64))
    with pytest.raises(ub.InputError, match=r"labels has dtype float32; it must be an integer "
                                            r"array \(int32\)"):
        trainer.step(x, np.zeros(4, np.float32))


# ---- float dtypes ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_model_in_another_float_dtype_trains_as_its_float32_copy(dtype, tmp_path):
    """Before: float64 and float16 crashed the process in TVM's legalization, bfloat16 raised a
    bare TypeError. Now the C trains model.float() as PyTorch does, with a warning."""
    from harness import assert_trains_like_torch, batches

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)
    name = str(dtype).replace("torch.", "")
    with pytest.warns(ub.UbitrainWarning, match=f"'1.weight', .* are {name}; ubitrain trains "
                                                "in float32"):
        assert_trains_like_torch(copy.deepcopy(model).float(), batches((4, 3, 2, 2), 3, 2),
                                 ub.SGD(0.1), tmp_path, compiled=model)
    assert {p.dtype for p in model.parameters()} == {dtype}  # the user's model as it was


def test_float64_example_inputs_compile_a_float32_step(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    with pytest.warns(ub.UbitrainWarning, match="example input 0 is float64; the step is "
                                                "compiled for float32 batches"):
        pkg = ub.compile(model, (x,), torch.randn(4, 3, dtype=torch.float64), loss="mse",
                         out_dir=tmp_path / "f64in")
    assert [s.dtype for s in pkg.inputs] == ["float32"]


class _Double(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(x.flatten(1)).double().float()


@pytest.mark.parametrize("model,match", [
    (_Double(), r"<top>: aten._to_copy computes in float64; ubitrain trains in float32: keep "
                r"the forward in float32"),
    (nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).to(torch.complex64),
     r"parameter or buffer '1.weight' is complex64: ubitrain trains real float32 models"),
])
def test_a_forward_outside_float32_is_refused_by_name(model, match, tmp_path):
    with pytest.raises(ub.CompileError, match=match):
        ub.compile(model, (torch.randn(4, 3, 2, 2),), torch.randint(0, 3, (4,)),
                   out_dir=tmp_path)


def test_the_cli_compiles_a_float64_factory_with_one_warning_line(tmp_path):
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(12, 3)).double()\n")
    for loss in ("cross_entropy", "mse"):  # mse: the labels are shaped by running the model
        run = _cli("compile", "m.py:f", "--input-shape", "3,2,2", "--batch", "2", "--loss",
                   loss, "--no-progress", "--out-dir", str(tmp_path / loss), cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stderr.strip().splitlines() == [
            "warning: the model's '1.weight', '1.bias' are float64; ubitrain trains in "
            "float32: it compiles a float32 copy (model.float(), values rounded) and leaves "
            "your model as it is"], run.stderr


# ---- ONNX files ------------------------------------------------------------------------------
def _onnx(nodes, opset=17, inputs=(("x", [2, 3]),), initializers=()):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compile_onnx(model, tmp_path, **kw):
    return ub.compile(model, (torch.randn(2, 3),), torch.randn(2, 3), loss="mse",
                      out_dir=tmp_path / "onnx", **kw)


def test_onnx_clip_of_opset_6_clips_with_its_attributes(tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.eye(3, dtype=np.float32) * 30, "w")
    model = _onnx([helper.make_node("MatMul", ["x", "w"], ["h"]),
                   helper.make_node("Clip", ["h"], ["y"], min=0.0, max=0.1)], opset=6,
                  initializers=[w])
    trainer = _compile_onnx(model, tmp_path).build()
    out = trainer.predict(np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32))
    assert out.min() >= 0.0 and out.max() <= np.float32(0.1)


@pytest.mark.parametrize("opset,match", [
    (99, "opset 99, newer than the newest"),
    (5, r"Add-1 \(opset 5\) is not supported; Add is from version 7 on"),
])
def test_onnx_opsets_outside_what_is_implemented_are_refused(opset, match, tmp_path):
    from onnx import helper

    with pytest.raises(ub.UnsupportedOpError, match=match):
        _compile_onnx(_onnx([helper.make_node("Add", ["x", "x"], ["y"])], opset=opset), tmp_path)


def test_onnx_attributes_the_converter_does_not_implement_are_refused(tmp_path):
    from onnx import helper

    model = _onnx([helper.make_node("ReduceMean", ["x"], ["y"], keepdims=1,
                                    noop_with_empty_axes=1)], opset=18)
    with pytest.raises(ub.UnsupportedOpError, match="noop_with_empty_axes=1 is not supported"):
        _compile_onnx(model, tmp_path)


def test_onnx_node_reading_an_undefined_tensor(tmp_path):
    from onnx import helper

    with pytest.raises(ub.CompileError, match="reads 'nothere', which no graph input"):
        _compile_onnx(_onnx([helper.make_node("Relu", ["nothere"], ["y"])]), tmp_path)


@pytest.mark.parametrize("options,sign", [
    ({}, r"Conv node .* reads 'onnx::Conv_\d+', a constant the exporter folded"),
    ({"do_constant_folding": False}, r"BatchNormalization node .* has training_mode=0"),
    ({"training": "TRAINING", "do_constant_folding": False}, None),
])
def test_an_onnx_model_exported_for_inference_is_named_with_the_export_to_use(options, sign,
                                                                             tmp_path):
    """Before: an eval-mode export (BatchNorm folded into the conv, or frozen) compiled
    silently and trained unlike the module."""
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Dropout(0.2), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x, y = torch.randn(2, 1, 6, 6), torch.tensor([0, 2])
    if "training" in options:
        options = dict(options, training=torch.onnx.TrainingMode.TRAINING)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, **options)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ub.compile(str(path), (x,), y, out_dir=tmp_path / "out")
    ours = [str(w.message) for w in seen if issubclass(w.category, ub.UbitrainWarning)]
    if sign is None:
        assert ours == []
        return
    assert len(ours) == 1, ours
    assert re.search(r"^the ONNX model was exported for inference: " + sign, ours[0]), ours[0]
    assert ours[0].endswith("export for training: torch.onnx.export(model, args, path, "
                            "dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
                            "do_constant_folding=False)")


def test_an_onnx_model_in_float64_is_refused_by_name(tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.eye(3), "w")  # float64
    model = _onnx([helper.make_node("MatMul", ["x", "w"], ["y"])], initializers=[w])
    with pytest.raises(ub.CompileError, match="the ONNX model's initializer 'w' is float64; "
                                              "ubitrain trains float32 models"):
        _compile_onnx(model, tmp_path)


def test_empty_and_corrupt_onnx_files(tmp_path):
    empty, garbage = tmp_path / "empty.onnx", tmp_path / "garbage.onnx"
    empty.write_bytes(b"")
    garbage.write_bytes(b"hello world")
    with pytest.raises(ub.CompileError, match="has no nodes"):
        _compile_onnx(str(empty), tmp_path)
    with pytest.raises(ub.CompileError, match="cannot read the ONNX model"):
        _compile_onnx(str(garbage), tmp_path)


# ---- compile arguments -----------------------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: ub.SGD(lr="fast"), "lr='fast' must be a number, not str"),
    (lambda: ub.SGD(momentum=None), "momentum=None must be a number"),
    (lambda: ub.SGD(lr=float("nan")), "lr=nan is out of range"),
    (lambda: ub.SGD(momentum=0.9, nesterov="yes"), r"nesterov='yes'\) must be True or False"),
    (lambda: ub.Adam(betas=0.9), "betas=0.9 must be a pair"),
    (lambda: ub.AdamW(weight_decay=True), "weight_decay=True must be a number"),
])
def test_optimizer_arguments_of_the_wrong_type(make, match):
    with pytest.raises(ub.CompileError, match=match):
        make()


def test_an_empty_batch_is_refused(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ub.CompileError, match=r"example input 0 has shape \[0, 3, 2, 2\]: it "
                                              "holds no element"):
        ub.compile(model, (torch.zeros(0, 3, 2, 2),), torch.zeros(0, dtype=torch.long),
                   out_dir=tmp_path)


# ---- checkpoints -----------------------------------------------------------------------------
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


def test_the_trainer_restores_all_or_nothing_even_in_place(trainer, monkeypatch):
    """A model whose working memory is smaller than its state: the C restore reads over the
    state; HostTrainer.restore keeps a copy and puts it back on a failure."""
    assert not trainer.package.memory_plan.restore_is_atomic
    storage = _MemoryStorage()
    monkeypatch.setattr(trainer, "_storage", lambda path, create=False: (None, storage.struct))
    trainer.save("memory")
    trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    storage.reads = 0
    trainer.restore("memory")
    whole = storage.reads
    trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    state, steps = trainer.arena.copy(), trainer.steps
    storage.reads, storage.fail_from = 0, whole  # the last read: mid-copy
    with pytest.raises(ub.RuntimeStatusError, match="storage failed"):
        trainer.restore("memory")
    assert np.array_equal(trainer.arena, state) and trainer.steps == steps


def test_checkpoint_paths(trainer, tmp_path):
    long_dir = tmp_path / ("d" * 200)
    long_dir.mkdir()
    for path in (long_dir / ("p" * 40), os.fsencode(tmp_path / "bytes_path")):
        trainer.save(path)
        trainer.restore(path)
    assert (tmp_path / "bytes_path.0").exists() and not list(tmp_path.glob("b'*"))
    with pytest.raises(ub.InputError, match="the checkpoint path is 2011 bytes long"):
        trainer.save("/" + "x" * 2010)
    with pytest.raises(ub.InputError, match=r"no checkpoint at .*nowhere/ck': the folder "
                                            r"'/.*/nowhere' does not exist"):
        trainer.restore(tmp_path / "nowhere" / "ck")
    (tmp_path / "file").write_text("")
    with pytest.raises(ub.InputError, match="cannot make the checkpoint folder .*file': a file "
                                            "of that name is in the way"):
        trainer.save(tmp_path / "file" / "ck")


def test_save_makes_the_folders_it_needs(trainer, tmp_path, monkeypatch):
    """Before: `trainer.save("ckpt/mynet")` failed unless ckpt/ existed."""
    monkeypatch.chdir(tmp_path)
    before = trainer.parameters()
    trainer.save("ckpt/a/mynet")
    trainer.step(np.ones((4, 3, 2, 2), np.float32), np.array([0, 1, 2, 1]))
    trainer.restore(tmp_path / "ckpt" / "a" / "mynet")
    after = trainer.parameters()
    assert all(np.array_equal(after[k], v) for k, v in before.items())
    assert [p.name for p in (tmp_path / "ckpt" / "a").iterdir()] == ["mynet.0"]  # one save


def test_load_parameters_refuses_values_that_are_not_finite(trainer):
    """Before: a NaN loaded silently, and every later step's loss was NaN."""
    before = trainer.parameters()
    for bad in (np.nan, np.inf, -np.inf):
        weight = before["1.weight"].copy()
        weight[2, 5] = bad
        with pytest.raises(ub.InputError, match=rf"parameter '1.weight' holds 1 value\(s\) that "
                                                rf"are not finite \({bad} at \[2, 5\]\); load "
                                                "finite values"):
            trainer.load_parameters({"1.bias": before["1.bias"] + 1, "1.weight": weight})
    after = trainer.parameters()
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


def test_save_does_not_follow_a_symlink_at_a_slot_path(trainer, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    for block in (0, 1):
        (tmp_path / f"ck.{block}").symlink_to(target)
    with pytest.raises(ub.RuntimeStatusError, match="storage failed"):
        trainer.save(tmp_path / "ck")
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


def test_a_save_is_synced_to_disk(trainer, tmp_path):
    """ub_storage.h: a write that returned is durable. Count the file storage's fsyncs
    (an LD_PRELOAD shim) in a process that saves once."""
    import subprocess
    import sys

    shim = tmp_path / "fsync_counter.so"
    (tmp_path / "shim.c").write_text(FSYNC_COUNTER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c"),
                    "-ldl"], check=True)
    script = (f"import ctypes\nfrom ubitrain.runtime import host_trainer as h\n"
              f"lib = ctypes.CDLL({str(trainer.lib._name)!r})\n"
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


# ---- C names -----------------------------------------------------------------------------------
TWO_MODELS_C = r"""
#include <stdio.h>
#include "first/model.h"
#include "checkpoint/model.h"

#define ALIGNED __attribute__((aligned(16)))
static uint8_t arena_a[UB_FIRST_ARENA_BYTES] ALIGNED;
static uint8_t arena_b[UB_CHECKPOINT_MODEL_ARENA_BYTES] ALIGNED;

static void fill(float *x, int n, int32_t *labels, int batch) {
    for (int i = 0; i < n; ++i) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < batch; ++i) labels[i] = i % 3;
}

int main(void) {
    ub_first_ctx a;
    ub_checkpoint_model_ctx b;
    float xa[UB_FIRST_INPUT0_ELEMENTS], xb[UB_CHECKPOINT_MODEL_INPUT0_ELEMENTS], la, lb;
    int32_t ya[UB_FIRST_LABEL_ELEMENTS], yb[UB_CHECKPOINT_MODEL_LABEL_ELEMENTS];
    ub_first_dtype dtype = UB_F32;
    fill(xa, UB_FIRST_INPUT0_ELEMENTS, ya, UB_FIRST_BATCH);
    fill(xb, UB_CHECKPOINT_MODEL_INPUT0_ELEMENTS, yb, UB_CHECKPOINT_MODEL_BATCH);
    if (ub_first_init(&a, arena_a, sizeof arena_a, 1) != UB_OK ||
        ub_checkpoint_model_init(&b, arena_b, sizeof arena_b, 1) != UB_OK ||
        ub_first_train_step(&a, xa, ya, &la) != UB_OK ||
        ub_checkpoint_model_train_step(&b, xb, yb, &lb) != UB_OK) return 1;
    printf("%.9g %.9g %d\n", la, lb, (int)dtype);
    return 0;
}
"""

TWO_MODELS_CMAKE = """
cmake_minimum_required(VERSION 3.13)
project(two_models C)
add_subdirectory({first} first_build)
add_subdirectory({second} second_build)
add_executable(two main.c)
target_include_directories(two PRIVATE {root})
target_link_libraries(two PRIVATE ub_first ub_checkpoint_model)
"""


def _c_inputs(shape, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """TWO_MODELS_C's batch."""
    n = int(np.prod(shape))
    x = torch.tensor([((i * 7) % 11) / 11.0 - 0.5 for i in range(n)], dtype=torch.float32)
    return x.reshape(shape), torch.arange(batch) % 3


def test_two_generated_models_include_and_link_in_one_program(tmp_path):
    """Before: an out_dir named `checkpoint` gave `ub_checkpoint_save`, the runtime's own, and
    did not build; two model.h in one C file redeclared UB_F32 and UB_PARAMETER. Each model's
    first loss in the one program is PyTorch's."""
    import subprocess

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    xa, ya = _c_inputs((4, 3, 2, 2), 4)
    xb, yb = _c_inputs((2, 1, 6, 6), 2)
    ub.compile(mlp, (xa,), ya, out_dir=tmp_path / "first")
    with pytest.warns(ub.UbitrainWarning, match=r"out_dir 'checkpoint' would give the C prefix "
                                                r"ub_checkpoint_, which would declare "
                                                r"ub_checkpoint_restore .* the prefix is "
                                                r"ub_checkpoint_model_"):
        pkg = ub.compile(cnn, (xb,), yb, out_dir=tmp_path / "checkpoint")
    assert pkg.model_name == "checkpoint_model"
    (tmp_path / "main.c").write_text(TWO_MODELS_C)
    (tmp_path / "CMakeLists.txt").write_text(TWO_MODELS_CMAKE.format(
        first=(tmp_path / "first").as_posix(), second=(tmp_path / "checkpoint").as_posix(),
        root=tmp_path.as_posix()))
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(tmp_path), "-B", str(build)],
                ["cmake", "--build", str(build)]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = subprocess.run([str(build / "two")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    got = [float(v) for v in run.stdout.split()]
    with torch.no_grad():
        want = [nn.functional.cross_entropy(mlp(xa), ya).item(),
                nn.functional.cross_entropy(cnn(xb), yb).item()]
    np.testing.assert_allclose(got[:2], want, rtol=1e-5)
    assert got[2] == 0  # UB_F32


def test_a_name_that_would_redeclare_the_runtimes_names_is_refused(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ub.CompileError, match=r"name='check' gives the C prefix ub_check_, "
                                              r"which would declare ub_check_ctx of ubitrain's "
                                              r"own C again; choose another name"):
        ub.compile(model, (torch.randn(4, 3, 2, 2),), torch.randint(0, 3, (4,)),
                   out_dir=tmp_path, name="check")


# ---- the command line ------------------------------------------------------------------------
def _cli(*args, cwd=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ubitrain.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.mark.parametrize("args,match", [
    (("compile",), "the following arguments are required: MODEL"),
    (("compile", "m.py:f", "--lr", "fast"), "argument --lr: invalid float value: 'fast'"),
    # the fuzzer is a development tool of the checkout now (test_fuzz.py checks its errors)
    (("fuzz", "--seeds", "x"), "argument COMMAND: invalid choice: 'fuzz'"),
    (("compile", "m.py:f", "--input-shape", "1,8,x"), "--input-shape '1,8,x' is not a shape"),
])
def test_cli_errors_are_one_line(args, match, tmp_path):
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(64, 3))\n")
    run = _cli(*args, cwd=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], run.stderr


def test_cli_keeps_torch_chatter_off_stderr(tmp_path):
    """A model that makes PyTorch warn (padding='same' with an even kernel): the CLI prints
    only its own lines; --verbose shows the rest."""
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Conv2d(1, 2, 2, "
                                   "padding='same'), nn.Flatten(), nn.Linear(128, 3))\n")
    run = _cli("compile", "m.py:f", "--input-shape", "1,8,8", "--batch", "2", "--no-progress",
               "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "", run.stderr


def test_the_cli_starts_without_torch_or_tvm():
    """`ubitrain --help` (and each command's --help) in a fresh interpreter imports neither
    torch, TVM nor numpy: before the fix `import ubitrain` took seconds to load them."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "from ubitrain.cli import COMMANDS, main\n"
            "for argv in [['--help']] + [[c, '--help'] for c in COMMANDS]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            main(argv)\n"
            "        except SystemExit as e:\n"
            "            assert e.code == 0, argv\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'tvm', 'numpy'}))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_building_a_project_for_another_target_than_it_was_compiled_for(tmp_path):
    """`ubitrain build --target hexagon-v66` of a host project: one line naming both targets
    and the two ways out (before: the toolchain file it lacked, or a host build of a
    cross project)."""
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(12, 3))\n")
    out = tmp_path / "net"
    assert _cli("compile", "m.py:f", "--input-shape", "3,2,2", "--batch", "2", "--no-progress",
                "--out-dir", str(out), cwd=tmp_path).returncode == 0
    run = _cli("build", str(out), "--target", "hexagon-v66", "--no-progress", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: {out} was compiled for host, not hexagon-v66 (its "
                                  "kernels and memory plan are host's): build it with --target "
                                  "host, or compile the model again with --target hexagon-v66")
    assert not (out / "build-hexagon-v66").exists()
