"""Flower's deployment engine on this machine: a SuperLink, one SuperNode process per client,
each driving its own generated trainer (with `--emulated TARGET`, the last one drives that
board under QEMU), and `flwr run` of the fleet's apps (deployed_apps.py). A phone or a board
behind a gateway joins the same way: a SuperNode with its own node config (README, "A fleet").

    python -m ubitrain.fleet.deployment [--clients 3] [--rounds 2] [--emulated cortex-m4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import ubitrain as ub

from .packages import fleet_package

APP_TOML = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "ubitrain-fleet"
version = "1.0.0"
description = "ubitrain's fleet: generated C trainers under Flower"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "ubitrain"

[tool.flwr.app.components]
serverapp = "ubitrain.fleet.deployed_apps:server"
clientapp = "ubitrain.fleet.deployed_apps:client"

[tool.flwr.app.config]
{config}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, seconds: float, what: str):
    """Until something listens on 127.0.0.1:port (a server starting on a busy machine)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise ub.UbitrainError(f"{what} did not start listening on port {port} in {seconds:.0f} s")


def _toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def run_deployment(clients: int = 3, rounds: int = 2, local_steps: int = 5, batch: int = 16,
                   lr: float = 0.05, momentum: float = 0.9, emulated: str | None = None,
                   out_dir="build/fleet-deployment", seed: int = 0, log=print,
                   timeout: float = 1800, kill=(), precision: str = "fp32") -> list[dict]:
    """Start the SuperLink and the SuperNodes, run the fleet's apps on them, stop them; the
    per-round metrics the ServerApp wrote. `kill`: (client, round) pairs whose ClientApp
    process is killed mid-round (the SuperNode starts a new one the next round).
    precision="int8": NITI clients, merged exactly in integers (int8_exchange.py)."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    compiled = dict(batch=batch, lr=lr, momentum=momentum, seed=seed, precision=precision)
    if precision == "int8":  # NITI's schedule over the fleet's steps
        from ..demos.int8 import niti_config
        compiled["niti"] = niti_config(clients * local_steps * rounds, adaptive=False)
    package, host = fleet_package(out_dir, "host", **compiled)
    library = str(host.library)
    device = None
    if emulated:  # its driver is built here; each round's ClientApp starts the emulator
        device_package, board = fleet_package(out_dir, emulated, **compiled)
        board.close()
        device = (device_package, "")
    config = {"package": str(package), "library": library, "clients": clients,
              "non-iid": -1.0, "seed": seed, "local-steps": local_steps, "batch": batch,
              "lr": lr, "rounds": rounds, "strategy": "fedavg", "fraction-fit": 1.0,
              "out-dir": str(out_dir), "kill": ",".join(f"{c}:{r}" for c, r in kill),
              "precision": precision}
    app = out_dir / "app"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(APP_TOML.format(
        config="\n".join(f"{k} = {_toml_value(v)}" for k, v in config.items())))
    port = _free_port()  # the SuperLink's one HTTP port: Fleet, Control and Runtime APIs
    home = out_dir / "flwr-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "fleet"\n\n[superlink.fleet]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home)}
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    (out_dir / "rounds.json").unlink(missing_ok=True)

    with ExitStack() as stack:
        def start(name, command):
            log_file = stack.enter_context(open(logs / f"{name}.log", "w"))
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       env=env, cwd=out_dir)
            stack.callback(_stop, process)
            return process

        start("superlink", ["flower-superlink", "--insecure", "--port", str(port),
                            "--database", str(out_dir / "superlink.db")])
        _wait_for_port(port, 300, "the SuperLink")
        for i in range(clients):
            node = f"partition-id={i} num-partitions={clients}"
            if device and i == clients - 1:
                node += f' package="{device[0]}" library="{device[1]}"'
            start(f"supernode-{i}", ["flower-supernode", "--insecure",
                                     "--superlink", f"127.0.0.1:{port}",
                                     "--port", str(_free_port()), "--node-config", node])
        log(f"SuperLink on 127.0.0.1:{port}, {clients} SuperNodes"
            + (f" (supernode-{clients - 1}: {emulated} under QEMU)" if emulated else "")
            + f"; logs in {logs}")
        run = subprocess.run(["flwr", "run", str(app), "fleet", "--stream"], env=env,
                             cwd=out_dir, capture_output=True, text=True, timeout=timeout)
        (logs / "flwr-run.log").write_text(run.stdout + run.stderr)
        result = out_dir / "rounds.json"
        if run.returncode != 0 or not result.exists():
            raise ub.UbitrainError(f"flwr run failed (status {run.returncode}); see "
                                   f"{logs / 'flwr-run.log'}")
    rounds_done = json.loads(result.read_text())
    for m in rounds_done[1:]:
        log(f"round {m['round']}/{rounds}: test accuracy {100 * m['accuracy']:.1f}%, "
            f"{m['clients'] - m['failures']}/{m['clients']} clients ({m['emulated']} on an "
            f"emulated board), {m['seconds']:.1f} s")
    return rounds_done


def _stop(process: subprocess.Popen):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--emulated", default=None, metavar="TARGET",
                        help="the last SuperNode drives this target under its emulator")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                        help="fp32 (SGD) or int8 (NITI) clients, as in `ubitrain fleet`")
    parser.add_argument("--out-dir", default="build/fleet-deployment")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    run_deployment(args.clients, args.rounds, args.local_steps, emulated=args.emulated,
                   out_dir=args.out_dir, precision=args.precision)
    print(f"deployment: {args.clients} SuperNodes, {args.rounds} rounds in "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
