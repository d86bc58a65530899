"""Cross targets: the generated C built by each target's real cross compiler, trained under
QEMU through the driver program, against the host build of the same model.

Per target and model, 5 training steps run in one emulator process; every step's loss, every
parameter and buffer, the optimizer state and the eval-mode output must agree with the host
within 1e-4 relative. A missing toolchain or emulator skips a target locally and fails it in
CI (CI=true): scripts/setup.sh installs them all.
"""

import copy
import os

import numpy as np
import pytest
import torch
from test_models import pytorch_sensitivity, relative_error

import ubitrain as ub
from ubitrain.runtime.target_build import missing_tools
from ubitrain.targets import TARGETS, get_target
from ubitrain.zoo import ZOO

CROSS = [name for name, t in TARGETS.items() if not t.runs_on_host]
MODELS = ["digits_cnn", "lenet5"]  # conv-BN-ReLU-pool + linear; conv/pool/linear stacks
STEPS = 5
BATCH = 4
RTOL = 1e-4


def require_tools(target_name: str):
    missing = missing_tools(get_target(target_name))
    if missing:
        message = f"target {target_name}: {', '.join(missing)} not installed (scripts/setup.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def make_case(model_name: str):
    entry = ZOO[model_name]
    torch.manual_seed(1)
    model = entry.factory()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn((BATCH,) + entry.sample_shape, generator=gen),
                torch.randint(0, entry.classes, (BATCH,), generator=gen))
               for _ in range(STEPS)]
    return model, batches


def optimizer():
    return ub.SGD(lr=0.005, momentum=0.9, weight_decay=1e-4)


def torch_optimizer(params):
    return torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=1e-4)


def run(model, batches, target, out_dir):
    pkg = ub.compile(copy.deepcopy(model), (batches[0][0],), batches[0][1], optimizer=optimizer(),
                     target=target, out_dir=out_dir)
    trainer = pkg.build(seed=0)
    try:
        losses = trainer.train(batches)
        result = {"losses": losses, "parameters": trainer.parameters(),
                  "optimizer_state": trainer.optimizer_state(),
                  "output": trainer.predict(batches[0][0]), "steps": trainer.steps,
                  "device_memory": getattr(trainer, "device_memory", {})}
        if target != "host":
            # Loading parameters goes through the driver's set-tensor command; a value read
            # back must be the value written.
            state = {k: v + 1 for k, v in result["parameters"].items()}
            trainer.load_parameters(state)
            back = trainer.parameters()
            assert all(np.array_equal(back[k], v) for k, v in state.items())
            with pytest.raises(ub.InputError, match="fixed at compile time"):
                trainer.step(batches[0][0][:2], batches[0][1][:2])  # the host's own checks
    finally:
        getattr(trainer, "close", lambda: None)()
    return result


def momentum_sensitivity(model, batches, perturbation=1e-7, seeds=3) -> dict:
    """Per parameter, how far PyTorch's own momentum buffer moves after the steps when the
    initial weights move by float32 rounding (test_models.pytorch_sensitivity does the same
    for the state_dict)."""
    def buffers(m):
        m = copy.deepcopy(m)
        opt = torch_optimizer(m.parameters())
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        return {f"{n}.momentum_buffer": opt.state[p]["momentum_buffer"].numpy()
                for n, p in m.named_parameters()}

    base, drift = buffers(model), {}
    for seed in range(1, seeds + 1):
        m = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(perturbation * max(float(p.abs().max()), 1.0)
                       * torch.randn(p.shape, generator=gen))
        for name, value in buffers(m).items():
            drift[name] = max(drift.get(name, 0.0), relative_error(value, base[name]))
    return drift


@pytest.fixture(scope="module")
def host_results(tmp_path_factory):
    """The host build's results, and the tensors that no float32 run reproduces to RTOL
    (measured as in test_models: PyTorch's own drift under 1e-7 perturbations). In these
    models that is the bias of a conv that feeds a BatchNorm: its gradient is mathematically
    zero, so its momentum buffer holds rounding residue only."""
    cache = {}

    def get(model_name):
        if model_name not in cache:
            model, batches = make_case(model_name)
            drift, tensor_drift, _ = pytorch_sensitivity(model, batches, torch_optimizer)
            assert drift < RTOL / 10, f"ill-conditioned case: PyTorch drifts {drift:.1e}"
            residue = {name for name, d in tensor_drift.items() if d > RTOL}
            assert len(residue) <= len(tensor_drift) // 4, residue
            momentum = momentum_sensitivity(model, batches)
            residue |= {name for name, d in momentum.items() if d > RTOL}
            out = tmp_path_factory.mktemp(f"host_{model_name}")
            cache[model_name] = run(model, batches, "host", out / model_name), residue
        return cache[model_name]

    return get


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("target", CROSS)
def test_training_on_target_matches_host(target, model_name, host_results, tmp_path):
    check_training_matches_host(target, model_name, host_results, tmp_path)


def test_depthwise_model_trains_on_neon_like_host(host_results, tmp_path):
    """MobileNetV2-style blocks (1x1 expand, depthwise 3x3 of stride 1 and 2, 1x1 project,
    BatchNorm, ReLU6): the NEON depthwise and GEMM micro-kernels under qemu-aarch64."""
    check_training_matches_host("aarch64-neon", "mobilenetv2_small", host_results, tmp_path)


def check_training_matches_host(target, model_name, host_results, tmp_path):
    require_tools(target)
    model, batches = make_case(model_name)
    want, residue = host_results(model_name)
    got = run(model, batches, target, tmp_path / model_name)

    assert got["steps"] == STEPS
    loss_error = float(np.max(np.abs(got["losses"] - want["losses"]) / np.abs(want["losses"])))
    assert loss_error <= RTOL, (got["losses"], want["losses"])
    for group in ("parameters", "optimizer_state"):
        assert set(got[group]) == set(want[group])
        errors = {k: relative_error(got[group][k], v) for k, v in want[group].items()
                  if k not in residue}
        worst = max(errors, key=errors.get)
        assert errors[worst] <= RTOL, f"{group} {worst}: {errors[worst]:.2e}"
    assert relative_error(got["output"], want["output"]) <= RTOL

    board = get_target(target).board
    if board is not None:  # the build reports flash and SRAM from the linked ELF
        mem = got["device_memory"]
        assert 0 < mem["flash_bytes"] <= board.flash_bytes
        assert mem["sram_bytes"] <= board.sram_bytes
        assert board.name in mem["summary"]


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7"])
def test_plan_that_cannot_fit_the_board_sram_fails_at_compile_time(target, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    x, y = torch.randn(8, 1024), torch.randint(0, 10, (8,))
    with pytest.raises(ub.CompileError, match=r"does not fit the SRAM of mps2-an\d+ "
                       r"\(4,194,304 B\): arena [\d,]+ B \+ batch buffers [\d,]+ B \+ stack "
                       r"65,536 B"):
        ub.compile(model, (x,), y, target=target, out_dir=tmp_path / "big")
    assert not (tmp_path / "big" / "model.c").exists()


def test_targets_command_lists_every_target(capsys):
    from ubitrain.cli import main

    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for name in TARGETS:
        assert name in out
    assert "qemu-system-arm -M mps2-an386" in out and "SRAM 4 MiB" in out
