"""The fleet fails loudly and merges only what it should (issue 42): a run whose every round
failed is an error; NaN, inf and huge updates are refused and the global model stays within
a point of the clean run's; Flower's differential privacy runs; a model with too few
classes is refused up front; and `ubitrain fleet` itself, interrupted with Ctrl-C mid-run:
it stops promptly and cleanly, Ray listened on the loopback only, FedAdam's sparse rounds
sent float32 and counted it, and a second run in the same out-dir was refused while the
first went on. (TLS and SuperNode authentication: tests/test_fleet.py, the deployment
engine's test.)

The rounds of the merge tests run in this process (fleet/inline.py: Flower's strategies and
the fleet's ClientApp, no Ray), on the digits CNN compiled once."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fleet_harness import digits_shards

import ubitrain as ub
from ubitrain.zoo import DigitsCNN


@pytest.fixture(scope="module")
def digits_fleet(tmp_path_factory):
    """The digits CNN (batch 8, SGD lr 0.05 momentum 0.9) compiled, and the digits split
    over 10 clients, each shard in its own file: what a FleetSetup points at."""
    from ubitrain.fleet.data import save_shards

    where = tmp_path_factory.mktemp("faults")
    torch.manual_seed(0)
    pkg = ub.compile(DigitsCNN(), (torch.zeros(8, 1, 8, 8),), torch.zeros(8, dtype=torch.long),
                     optimizer=ub.SGD(lr=0.05, momentum=0.9), progress=False,
                     out_dir=where / "host")
    library = pkg.build().library
    shards, test = digits_shards(10)
    save_shards(where / "data", shards, test)
    return pkg.out_dir, library, where / "data", test


def inline_run(digits_fleet, tmp_path, rounds=4, faults=None, **plan_args):
    """`rounds` rounds of the 10 clients in this process: the plan's result (the rounds'
    metrics, the strategy, the model)."""
    from ubitrain.fleet.apps import FleetSetup, client_app
    from ubitrain.fleet.evaluation import model_metrics
    from ubitrain.fleet.inline import InlineGrid
    from ubitrain.fleet.local import LocalTraining, exchanged_names
    from ubitrain.fleet.packages import open_trainer
    from ubitrain.fleet.server import ServerPlan, run_server

    project, library, data, test = digits_fleet
    evaluator = open_trainer(ub.load_package(project), library, 0)  # the initial weights
    initial = {k: v for k, v in evaluator.parameters().items()
               if k in exchanged_names(evaluator, sparse=False)}
    setup = FleetSetup(Path(project), Path(library), data, 0, LocalTraining(10, 8, 0.05),
                       faults or {})
    plan = ServerPlan("fedavg", rounds, 1.0, initial,
                      lambda r, t: {"round": r, **model_metrics(evaluator, test, t)},
                      tmp_path / "checkpoints", **plan_args)
    run_server(plan, 10, InlineGrid(client_app(setup), 10))
    return plan.result


@pytest.fixture(scope="module")
def clean_run(digits_fleet, tmp_path_factory):
    return inline_run(digits_fleet, tmp_path_factory.mktemp("clean"))


@pytest.mark.parametrize("faults", [
    {(3, r): "nan" for r in range(1, 5)},
    {(3, r): "inf" for r in range(1, 5)},
    {(3, r): "huge" for r in range(1, 5)},   # 10^4 times the update it trained
    {(3, 1): "nan", (3, 2): "inf", (3, 3): "huge", (3, 4): "nan"},
], ids=["nan", "inf", "huge", "each"])
def test_a_poisoned_client_is_refused_and_the_model_stays_within_a_point(
        digits_fleet, clean_run, tmp_path, faults):
    result = inline_run(digits_fleet, tmp_path, faults=faults)
    assert [m["refused"] for m in result["rounds"][1:]] == [1, 1, 1, 1]
    assert all(np.all(np.isfinite(v)) for v in result["model"].values())
    clean, poisoned = clean_run["rounds"][-1]["accuracy"], result["rounds"][-1]["accuracy"]
    assert clean > 0.85  # the clean run learned: the comparison means something
    assert abs(poisoned - clean) <= 0.01, (clean, poisoned)


def test_the_norm_screen_leaves_a_clean_run_as_fedavg(clean_run):
    """No honest client of the clean run was refused: FedAvg of all ten, every round."""
    assert [m["refused"] for m in clean_run["rounds"][1:]] == [0] * 4
    assert all(len(clean_run["strategy"].replies[r]) == 10 for r in range(1, 5))


def test_a_run_whose_every_round_failed_is_an_error(digits_fleet, tmp_path):
    """Each round, six of ten clients crash: fewer than a majority answer, no round merges
    anything, and the run is an error (ubitrain fleet exits with status 2), not a model."""
    from ubitrain.fleet.server import check_outcome

    faults = {(c, r): "crash" for c in range(6) for r in (1, 2)}
    result = inline_run(digits_fleet, tmp_path, rounds=2, faults=faults)
    assert all("4 of 10 clients" in m["failed"] for m in result["rounds"][1:])
    with pytest.raises(ub.UbitrainError, match="every round failed: round 1: 4 of 10"):
        check_outcome(result["rounds"], print)
    lines = []
    check_outcome(result["rounds"][:2] + [{"round": 2}], lines.append)  # one of two: said
    assert lines == ["warning: 1 of 2 rounds failed (rounds 1); the global model skipped them"]


def test_flowers_differential_privacy_runs(digits_fleet, tmp_path):
    """Central DP with client-side clipping: Flower's fixedclipping_mod clips each update on
    the client (the norm of each reply's change is at most the clipping norm), Flower's
    strategy wrapper adds the noise, and the model still learns."""
    from ubitrain.fleet.screening import _delta_norm

    clip = 2.0
    result = inline_run(digits_fleet, tmp_path, rounds=2,
                        dp={"noise_multiplier": 0.01, "clipping_norm": clip})
    initial = dict(np.load(tmp_path / "checkpoints" / "round_000.npz"))
    norms = [_delta_norm(update, initial) for update, _ in result["strategy"].replies[1]]
    assert len(norms) == 10 and max(norms) <= clip * (1 + 1e-5)
    assert result["rounds"][2]["accuracy"] > 0.5
    assert all(v.dtype == np.float32 for v in result["model"].values())


def test_a_model_with_fewer_classes_than_the_data_is_refused_up_front(tmp_path, capsys):
    """`ubitrain fleet --model` returning 5 classes for the 10 digits: one line, before any
    compile (before the fix: an IndexError after the compile and a round)."""
    from ubitrain.cli import main

    factory = tmp_path / "five.py"
    factory.write_text("from ubitrain.zoo import DigitsCNN\n\n"
                       "def factory():\n    return DigitsCNN(classes=5)\n")
    start = time.perf_counter()
    status = main(["fleet", "--model", f"{factory}:factory", "--clients", "2", "--rounds", "1",
                   "--out-dir", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert err.startswith("error: model_factory()'s module gives 5 class logits, but the data "
                          "has labels up to 9")
    assert not (tmp_path / "out" / "host").exists() and time.perf_counter() - start < 60


# ---- ubitrain fleet, interrupted ------------------------------------------------------------


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _alive(pids: list[int]) -> list[str]:
    """The command lines of those of `pids` still running (not zombies)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                left.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:80])
        except (OSError, IndexError):
            continue
    return left


def _listening_addresses(pids: list[int]) -> set[str]:
    """The local addresses the processes' TCP sockets listen on (from /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    addresses = set()
    for family, table in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addresses.add(socket.inet_ntop(family, words))
    return addresses


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """`ubitrain fleet --strategy fedadam --sparse` in its own process group, rounds enough
    to outlast the test; in round 2: its processes and their listening sockets, then a
    second run in the same out-dir; after round 3, Ctrl-C (SIGINT to the group, as a
    terminal sends it)."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    command = [sys.executable, "-m", "ubitrain.cli", "fleet", "--clients", "2", "--rounds",
               "100000", "--local-steps", "1", "--strategy", "fedadam", "--sparse",
               "--no-progress", "--out-dir", str(out)]
    process = _start(command)
    seen = {"lines": []}
    try:
        for line in process.stdout:
            seen["lines"].append(line.rstrip("\n"))
            if line.startswith("round 2/"):
                seen["processes"] = _process_tree(process.pid)
                seen["listening"] = _listening_addresses(seen["processes"])
                second = _start(command)
                seen["second"] = _finish(second, 300)
            if line.startswith("round 3/"):
                break
        interrupted = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        status, rest, err = _finish(process, 120)
        seen["seconds"] = time.monotonic() - interrupted
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(seen["processes"]):
            time.sleep(0.5)
        seen["left"] = _alive(seen["processes"])
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seen.update(status=status, stderr=err, out=out, lines=seen["lines"] + rest.splitlines())
    return seen


def _start(command) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _finish(process: subprocess.Popen, seconds: float):
    """(exit status, stdout, stderr); status None when it had not ended after `seconds`
    (then its process group is killed)."""
    try:
        out, err = process.communicate(timeout=seconds)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return None, out, err


def test_ctrl_c_stops_a_run_promptly_and_cleanly(interrupted_run):
    """Before the fix: the process printed "interrupted" and never exited (Flower's server
    thread waited an hour for replies)."""
    run = interrupted_run
    assert run["status"] == 130 and run["stderr"].strip().splitlines()[-1] == "interrupted"
    assert run["seconds"] < 30
    assert "Exception ignored" not in run["stderr"] and "Traceback" not in run["stderr"]
    assert run["left"] == []  # Ray's processes and workers ended with it


def test_ray_listens_on_the_loopback_only(interrupted_run):
    """Before the fix: Ray's servers listened on the machine's address and on ::."""
    addresses = interrupted_run["listening"]
    assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, addresses


def test_fedadam_sends_float32_and_counts_the_bytes_sent(interrupted_run):
    """FedAdam computes in float64 on the server; what travels down is float32, the size of
    what goes up (before the fix: twice as much from round 2 on, 439 kB a round for the
    digits' 20 clients, more than the full model)."""
    from ubitrain.fleet.records import as_record

    rounds = [line for line in interrupted_run["lines"] if line.startswith("round ")]
    down = [float(line.split("down ")[1].split(" kB")[0]) for line in rounds]
    up = [float(line.split("up ")[1].split(" kB")[0]) for line in rounds]
    assert len(rounds) >= 3 and down == up == [down[0]] * len(rounds)
    checkpoint = dict(np.load(interrupted_run["out"] / "checkpoints" / "round_002.npz"))
    assert {v.dtype for v in checkpoint.values()} == {np.dtype(np.float32)}
    assert "features.0.weight" not in checkpoint  # sparse: what the clients train
    assert down[0] == round(2 * as_record(checkpoint).count_bytes() / 1e3, 1)


def test_a_second_run_in_the_same_out_dir_is_refused_and_the_first_goes_on(interrupted_run):
    """Before the fix: the second run rebuilt the project under the first, whose clients
    could then not load their library (0 of 2 clients every round, exit status 0)."""
    status, _, err = interrupted_run["second"]
    assert status == 2 and "is in use by another fleet run" in err
    round_3 = next(line for line in interrupted_run["lines"] if line.startswith("round 3/"))
    assert "2/2 clients" in round_3
