"""A Cortex-M project ready for a board (board_main.c, host_client.py, the driver over the UART).

The project is compiled, then copied to another folder (the original removed) and built
there with the toolchain file it carries, as a user would: -DUB_BUILD_BOARD=ON builds the
example firmware and the driver over the UART, -DUB_BUILD_DRIVER=ON the semihosting driver.
The firmware runs under qemu-system-arm without semihosting (a board with no probe): the
losses it prints on its UART must equal, bit for bit, those of the trainer `pkg.build()`
runs for the same target (the same C under the same emulator, driven from the host), and
PyTorch's for the same steps on the same batch within float32 rounding; and the host
trainer's (target "host") to the printed six decimals. host_client.py, run as a user runs
it, talks to both drivers under QEMU and gets the same losses and parameters.
"""

import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import require_tools, small_bn_cnn, zoo_case
from torch import nn

import ubitrain as ub

STEPS = 5
LR, MOMENTUM = 0.05, 0.9
LINE = re.compile(r"step (\d+) loss (-?[0-9.]+) \(0x([0-9a-f]{8})\)")
REPO = Path(__file__).resolve().parents[1]


def batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)


def bits(loss: float) -> int:
    return struct.unpack("<I", struct.pack("<f", loss))[0]


def torch_losses(steps: int) -> list[float]:
    """PyTorch's losses for `steps` steps on the example batch, in float64."""
    net = small_bn_cnn().double()
    x, y = batch()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x.double()), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_firmware(elf: Path, board: str, timeout: float = 120.0) -> list[tuple[int, str, int]]:
    """The firmware under QEMU without semihosting, its UART on stdout: (step, printed loss,
    loss bits) of each line, once it printed "done" (the core then sleeps: QEMU is ended)."""
    proc = subprocess.Popen(["qemu-system-arm", "-M", board, "-display", "none", "-monitor",
                             "none", "-serial", "stdio", "-kernel", str(elf)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if "ub_board: done" in line or "ub_board: error" in line or \
                    time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    assert lines and lines[-1] == "ub_board: done", "\n".join(lines)
    return [(int(m[1]), m[2], int(m[3], 16)) for m in map(LINE.fullmatch, lines) if m]


def client(project: Path, *args: str) -> str:
    """host_client.py as a user runs it: its own folder, the system's Python."""
    done = subprocess.run([sys.executable, "host_client.py", *args], cwd=project,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def client_losses(out: str) -> list[tuple[int, str, int]]:
    return [(int(m[1]), m[2], int(m[3], 16)) for m in map(LINE.fullmatch, out.splitlines())
            if m]


def prepare(target: str, tmp: Path):
    """(target, the copied and built project, the emulated trainer's 6 losses and its
    parameters after 5 steps, the package)."""
    require_tools(target)
    x, y = batch()
    pkg = ub.compile(small_bn_cnn(), (x,), y, optimizer=ub.SGD(lr=LR, momentum=MOMENTUM),
                     target=target, out_dir=tmp / "compiled" / "net")
    with pkg.build(seed=0) as trainer:
        losses = [float(trainer.step(x, y)) for _ in range(STEPS)]
        params = trainer.parameters()
        losses.append(float(trainer.step(x, y)))
    project = tmp / "copied" / "net"
    shutil.copytree(pkg.out_dir, project, ignore=shutil.ignore_patterns("build*"))
    shutil.rmtree(pkg.out_dir)
    toolchain = f"toolchains/{pkg.target.toolchain_dir}/toolchain.cmake"
    subprocess.run(["cmake", "-S", ".", "-B", "build", f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
                    "-DUB_BUILD_BOARD=ON", "-DUB_BUILD_DRIVER=ON", "-DUB_WERROR=ON"],
                   cwd=project, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", "build", "-j2"], cwd=project, check=True,
                   capture_output=True)
    return target, project, losses, params, pkg


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """The cortex-m4 project, compiled, copied elsewhere and built (prepare)."""
    return prepare("cortex-m4", tmp_path_factory.mktemp("cortex-m4"))


def test_the_board_files_name_nothing_outside_the_project(board):
    _, project, _, _, pkg = board
    for name in ("board_main.c", "board_batch.h", "board_batch.bin", "host_client.py",
                 "toolchains/arm-none-eabi/board_mps2.c"):
        data = (project / name).read_bytes()
        assert str(REPO).encode() not in data and str(project).encode() not in data, name
    x, y = batch()  # board_batch.bin: the compile's example batch, inputs then labels
    raw = x.numpy().tobytes() + y.numpy().astype(pkg.labels.dtype).tobytes()
    assert (project / "board_batch.bin").read_bytes() == raw
    ub.load_package(project)  # package.json lists and hashes the board files too


def test_the_example_firmware_prints_the_trainers_losses(board):
    check_firmware(board)


def test_the_example_firmware_on_cortex_m7(tmp_path):
    """mps2-an500: the same UART, the double-precision FPU (float64 accumulators)."""
    check_firmware(prepare("cortex-m7", tmp_path))


def check_firmware(prepared):
    _, project, losses, _, pkg = prepared
    elf = project / "build" / f"ub_{pkg.model_name}_board"
    objdump = shutil.which("arm-none-eabi-objdump")
    if objdump:  # no semihosting call anywhere: it runs on a board without a probe
        code = subprocess.run([objdump, "-d", str(elf)], capture_output=True, text=True).stdout
        assert "bkpt" not in code
    printed = run_firmware(elf, pkg.target.board.name)
    assert [step for step, _, _ in printed] == list(range(1, STEPS + 1))
    assert [b for _, _, b in printed] == [bits(v) for v in losses[:STEPS]]
    assert [text for _, text, _ in printed] == [f"{v:.6f}" for v in losses[:STEPS]]
    reference = torch_losses(STEPS)
    np.testing.assert_allclose([float(t) for _, t, _ in printed], reference, rtol=2e-6,
                               atol=1e-6)


def test_the_firmware_agrees_with_the_host_trainer(board, tmp_path):
    """The same model compiled for the host (float64 accumulators where cortex-m4 has
    float32 ones): the same losses to the six decimals the firmware prints."""
    _, project, _, _, pkg = board
    x, y = batch()
    host = ub.compile(small_bn_cnn(), (x,), y, optimizer=ub.SGD(lr=LR, momentum=MOMENTUM),
                      target="host", out_dir=tmp_path / "host")
    trainer = host.build(seed=0)
    host_losses = [float(trainer.step(x, y)) for _ in range(STEPS)]
    printed = run_firmware(project / "build" / f"ub_{pkg.model_name}_board",
                           pkg.target.board.name)
    assert [float(t) for _, t, _ in printed] == pytest.approx(host_losses, abs=1.5e-6)


def test_host_client_trains_through_the_uart_driver(board, tmp_path):
    """host_client.py --qemu: the driver over the UART under QEMU; the losses of the trainer,
    and after the steps its parameters, bit for bit."""
    _, project, losses, params, _ = board
    saved = tmp_path / "params"
    out = client(project, "--qemu", "--steps", str(STEPS), "--save-parameters", str(saved))
    assert [b for _, _, b in client_losses(out)] == [bits(v) for v in losses[:STEPS]]
    for name, value in params.items():
        got = np.frombuffer((saved / f"{name}.bin").read_bytes(), value.dtype)
        np.testing.assert_array_equal(got.reshape(value.shape), value, err_msg=name)
    # parameters loaded into a fresh driver: its first step is the trainer's sixth forward
    out = client(project, "--qemu", "--steps", "1", "--load-parameters", str(saved))
    assert [b for _, _, b in client_losses(out)] == [bits(losses[STEPS])]


def test_host_client_talks_to_the_semihosting_driver(board):
    _, project, losses, _, _ = board
    out = client(project, "--qemu-semihosting", "--steps", "1", "--tensors")
    assert [b for _, _, b in client_losses(out)] == [bits(losses[0])]
    assert "5.weight: parameter float32 [10, 64] 2560 B" in out


def test_a_batch_of_the_users_own(board, tmp_path):
    """The firmware built with a header of the user's own (-DUB_BOARD_BATCH), and
    host_client.py --batch with the same bytes: the same losses."""
    _, project, _, _, pkg = board
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    floats = ", ".join(float(v).hex() + "f" for v in x.numpy().reshape(-1))
    assert str(pkg.labels.dtype) == "int32"  # the compiled labels' dtype (model.h)
    labels = ", ".join(str(int(v)) for v in y.numpy())
    header = tmp_path / "my_batch.h"
    header.write_text("#include <stdint.h>\n"
                      f"static const float ub_board_input0[64 * 4] = {{{floats}}};\n"
                      f"static const int32_t ub_board_labels[4] = {{{labels}}};\n")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(project), "-B", str(build),
                    f"-DCMAKE_TOOLCHAIN_FILE={project}/toolchains/cortex-m4/toolchain.cmake",
                    "-DUB_BUILD_BOARD=ON", f"-DUB_BOARD_BATCH={header}", "-DUB_BOARD_STEPS=2"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2"], check=True, capture_output=True)
    printed = run_firmware(build / f"ub_{pkg.model_name}_board", pkg.target.board.name)
    raw = tmp_path / "my_batch.bin"
    raw.write_bytes(x.numpy().tobytes() + y.numpy().astype(np.int32).tobytes())
    out = client(project, "--qemu", "--elf", str(build / f"ub_{pkg.model_name}_driver_uart"),
                 "--steps", "2", "--batch", str(raw))
    assert len(printed) == 2 and client_losses(out) == printed


def test_a_paged_model_on_the_board(tmp_path):
    """A plan that pages (the smallest budget of the digits CNN): the firmware and the UART
    driver page to a static buffer in SRAM, the trainer to the host's files; the same
    losses bit for bit."""
    require_tools("cortex-m4")
    model, batches = zoo_case("digits_cnn", 4, 1)
    x, y = batches[0]
    opt = ub.SGD(lr=0.05, momentum=0.9)
    with pytest.raises(ub.CompileError) as err:
        ub.compile(model, (x,), y, optimizer=opt, target="cortex-m4", memory_budget=1,
                   micro_batches=1, out_dir=tmp_path / "no")
    smallest = int(re.search(r"smallest budget that works is ([\d,]+) bytes",
                             str(err.value))[1].replace(",", ""))
    pkg = ub.compile(model, (x,), y, optimizer=opt, target="cortex-m4", memory_budget=smallest,
                     micro_batches=1, out_dir=tmp_path / "net")
    assert pkg.pages > 0
    with pkg.build(seed=0) as trainer:
        losses = [float(trainer.step(x, y)) for _ in range(3)]
    subprocess.run(["cmake", "-S", ".", "-B", "build", "-DCMAKE_TOOLCHAIN_FILE=toolchains/"
                    "cortex-m4/toolchain.cmake", "-DUB_BUILD_BOARD=ON", "-DUB_WERROR=ON",
                    "-DUB_BOARD_STEPS=3"], cwd=pkg.out_dir, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", "build", "-j2"], cwd=pkg.out_dir, check=True,
                   capture_output=True)
    printed = run_firmware(pkg.out_dir / "build" / f"ub_{pkg.model_name}_board", "mps2-an386")
    assert [b for _, _, b in printed] == [bits(v) for v in losses]
    out = client(pkg.out_dir, "--qemu", "--steps", "3")
    assert client_losses(out) == printed
