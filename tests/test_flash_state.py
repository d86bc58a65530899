"""Frozen weights in flash on Cortex-M: with a sparse update, the weights no step writes are
`const` data in flash (.rodata) instead of arena bytes in SRAM. The model trains exactly as
with those weights in SRAM, and as PyTorch with them frozen (the referee); the linked ELF shows
them in flash and the SRAM it needs drops by their size."""

import copy
import dataclasses
import subprocess

import pytest
import torch
from harness import (
    assert_same_training,
    assert_trains_like_torch,
    require_tools,
    run_trainer,
    zoo_case,
)

import ubitrain as ub
from ubitrain.targets import TARGETS

TARGET = "cortex-m4"
RULE = ub.SparseUpdate(biases=True, last_layers=1)
SRAM_BASE = 0x20000000  # mps2.ld: flash below, SRAM from here


def train(model, batches, out_dir, judged: bool):
    """Train under QEMU; `judged`: by the referee against PyTorch with the frozen weights
    frozen (a mismatch fails the fixture, so every test that uses it)."""
    optimizer = ub.SGD(lr=0.01, momentum=0.9)
    if judged:
        run = assert_trains_like_torch(model, batches, optimizer, out_dir, trainable=RULE,
                                       target=TARGET)
        pkg, trainer, trajectory = run.package, run.trainer, run.verdict.trajectory
    else:
        pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1], trainable=RULE,
                         optimizer=optimizer, target=TARGET, out_dir=out_dir)
        trainer = pkg.build()
        trajectory = run_trainer(trainer, batches)
    with trainer:
        params = trainer.parameters()
        result = dict(pkg=pkg, trajectory=trajectory, memory=trainer.device_memory,
                      binary=trainer.command[-1])
        if pkg.frozen_in_flash:
            frozen = pkg.frozen_in_flash[0]
            trainer.load_parameters({frozen: params[frozen]})  # its own value: accepted
            with pytest.raises(ub.InputError, match="frozen and kept in flash"):
                trainer.load_parameters({frozen: params[frozen] + 1})  # refused before writing
            index = [t[0] for t in trainer.tensors].index(frozen)
            assert trainer._set(index, params[frozen] + 1) == -13  # the C refuses it too
    return result


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    require_tools(TARGET)
    model, batches = zoo_case("lenet5", 2, 3, seed=2)
    out = tmp_path_factory.mktemp("flash")
    flash = train(model, batches, out / "flash", judged=True)
    mp = pytest.MonkeyPatch()
    mp.setitem(TARGETS, TARGET, dataclasses.replace(TARGETS[TARGET], frozen_state_in_flash=False))
    try:
        sram = train(model, batches, out / "sram", judged=False)
    finally:
        mp.undo()
    return model, batches, flash, sram


def test_frozen_weights_train_like_pytorch_and_like_weights_in_sram(builds):
    """Like PyTorch: the flash build is judged by the referee in `builds`."""
    model, batches, flash, sram = builds
    trainable = set(flash["pkg"].trainable)
    assert flash["pkg"].frozen_in_flash == [n for n, _ in model.named_parameters()
                                            if n not in trainable]
    assert sram["pkg"].frozen_in_flash == []
    # Bit for bit the same steps: only where the frozen weights are read from changed.
    assert_same_training(flash["trajectory"], sram["trajectory"])


def test_frozen_weights_sit_in_flash_and_sram_drops_by_their_size(builds):
    model, _, flash, sram = builds
    state = dict(model.state_dict())
    frozen = {n: state[n].numel() * 4 for n in flash["pkg"].frozen_in_flash}
    # mps2.ld links .rodata into flash with the code: the frozen tensors are read where they
    # lie in the weights blob (weights.bin, embedded by .incbin), a data object below the
    # SRAM's base address holding them and the other weights' initial values.
    symbols = {}
    table = subprocess.run(["arm-none-eabi-readelf", "-sW", flash["binary"]],
                           capture_output=True, text=True, check=True).stdout
    for line in table.splitlines():
        parts = line.split()  # Num: Value Size Type Bind Vis Ndx Name
        if len(parts) == 8 and parts[7].endswith("_weights"):
            symbols[parts[7]] = (int(parts[1], 16), int(parts[2], 0), parts[3])
    (address, size, kind), = symbols.values()
    assert kind == "OBJECT" and address < SRAM_BASE
    assert size >= sum(frozen.values()) + sum(v.numel() * 4 for n, v in state.items()
                                              if n not in frozen and v.dtype == torch.float32)
    source = (flash["pkg"].out_dir / "model.c").read_text()
    for name in frozen:
        assert f"#define ub_frozen_{name.replace('.', '_')} ((const float *)(ub_" in source

    # The frozen weights leave the arena's persistent part. The Linear layers read their
    # weight as it is stored (lowering/transposed_matmul.py), so no transposed copy is
    # folded into flash beside it: a frozen weight takes its flash once.
    frozen_bytes = sum(frozen.values())
    plan_flash, plan_sram = flash["pkg"].memory_plan, sram["pkg"].memory_plan
    assert 0 <= plan_sram.persistent_bytes - plan_flash.persistent_bytes - frozen_bytes < 8 * 4
    train = flash["pkg"].programs["train_step"]
    folded = sum(s.nbytes for s in train.slots() if s.kind == "constant" and s.view_of is None
                 and s.label is None and s.nbytes > 1024)  # not the graph's small constants
    assert folded == 0
    arena_drop = plan_sram.arena_bytes - plan_flash.arena_bytes
    assert frozen_bytes <= arena_drop < frozen_bytes + 8 * 4
    sram_drop = sram["memory"]["sram_bytes"] - flash["memory"]["sram_bytes"]
    assert arena_drop <= sram_drop <= arena_drop + 8  # .bss holds the arena, 8-byte aligned
    # The initial weights were in flash before too (copied into SRAM at init).
    assert abs(flash["memory"]["flash_bytes"] - sram["memory"]["flash_bytes"]) < 1024


def mlp(hidden: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def test_frozen_weights_in_flash_let_a_plan_fit_the_sram_it_did_not(tmp_path):
    """2 MB of weights: trained with momentum (weight and momentum in SRAM; the gradient
    goes block by block into the update) they overflow the 4 MiB SRAM; frozen, they are
    flash data and the arena holds the last layer's state and the activations only."""
    x, y = torch.randn(4, 1024), torch.randint(0, 10, (4,))
    opt = ub.SGD(lr=0.01, momentum=0.9)
    with pytest.raises(ub.CompileError, match="does not fit the SRAM of mps2-an386"):
        ub.compile(mlp(500), (x,), y, optimizer=opt, target=TARGET, out_dir=tmp_path / "all")
    pkg = ub.compile(mlp(500), (x,), y, optimizer=opt, target=TARGET,
                     trainable=ub.SparseUpdate(last_layers=1), out_dir=tmp_path / "sparse")
    assert pkg.frozen_in_flash == ["0.weight", "0.bias"]
    plan = pkg.memory_plan  # SRAM state: the last layer's weight, bias and their momentum
    assert 2 * 4 * (500 * 10 + 10) <= plan.persistent_bytes <= 2 * 4 * (500 * 10 + 10) + 64
    assert plan.arena_bytes < plan.persistent_bytes + 4 * (4 * 1024 + 2 * 4 * 500)
    source = (tmp_path / "sparse" / "model.c").read_text()
    assert "#define ub_frozen_0_weight ((const float *)(ub_sparse_weights + " in source
    assert (tmp_path / "sparse" / "weights.bin").stat().st_size >= 512000 * 4
    # The one kernel that reads the frozen weight is the forward matmul, from flash, and
    # nothing writes it.
    calls = pkg.programs["train_step"].calls
    readers = [c for c in calls if any(a.root.label == "0.weight" for a in c.args)]
    assert len(readers) == 1 and "matmul_nt" in readers[0].kernel
    assert not any(s.root.label == "0.weight" for s in readers[0].writes)


def test_weights_that_cannot_fit_the_flash_fail_at_compile_time(tmp_path):
    x, y = torch.randn(4, 1024), torch.randint(0, 10, (4,))
    with pytest.raises(ub.CompileError, match=r"weights \([\d,]+ B, initial values and "
                       r"frozen weights as const data\) do not fit the flash of mps2-an386 "
                       r"\(4,194,304 B\)"):
        ub.compile(mlp(1024), (x,), y, target=TARGET, trainable=ub.SparseUpdate(biases=True),
                   out_dir=tmp_path / "big")
    assert not (tmp_path / "big" / "model.c").exists()
