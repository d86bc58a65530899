"""Flower's deployment engine on this machine: a SuperLink, one SuperNode process per client,
each driving its own generated trainer (with `emulated=TARGET`, the last one drives that
board under its emulator), and `flwr run` of the fleet's apps (deployed_apps.py). A phone or
a board behind a gateway joins the same way: a SuperNode with its own node config (README,
"A fleet"). `ubitrain fleet --engine deployment` runs it. Every connection to the
SuperLink is TLS, and only SuperNodes with registered keys join (security.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

import ubitrain as ub

from .lock import out_dir_lock
from .packages import fleet_package
from .prepare import prepare
from .result import FleetResult
from .security import Certificates, local_certificates, supernode_keys
from .server import check_outcome

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


REFUSED = "Failed to activate SuperNode"  # flower-supernode's words for an unknown key


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
    return json.dumps(v) if isinstance(v, (str, bool)) else repr(v)  # true, "text"


def run_deployment(model_factory, client_data, test_data=None, *, optimizer=None,
                   rounds: int = 2, local_steps: int = 5, batch: int = 16, strategy="fedavg",
                   strategy_args: dict | None = None, fraction_train: float = 1.0,
                   sparse: bool = False, target: str = "host", emulated: str | None = None,
                   precision: str = "fp32", rounding: str = "nearest",
                   min_clients: int | None = None, screen: str | None = "norm",
                   dp: dict | None = None, certificates: Certificates | None = None,
                   out_dir="build/fleet-deployment", seed: int = 0,
                   progress: bool | None = False, log=print, timeout: float = 1800,
                   kill=(), intruders: int = 0) -> FleetResult:
    """`run_fleet`'s federated training (the same arguments) under Flower's deployment
    engine: start a SuperLink and one SuperNode process per client, each reading its own
    shard file and driving its own trainer (`emulated`: the last one drives that target's
    build under its emulator), run the fleet's apps on them with `flwr run`, stop them.

    Every connection to the SuperLink is TLS (`certificates`: the user's CA, certificate
    and key; default: made for this run, for 127.0.0.1), and only SuperNodes whose public
    key was registered join (Flower's SuperNode authentication): each SuperNode gets a
    P-384 key pair, registered with `flwr supernode register` before it starts.
    `intruders`: SuperNodes started with keys nobody registered, which the SuperLink must
    refuse (tests; FleetResult.refused names them). `kill`: (client, round) pairs whose
    ClientApp process is killed mid-round (the SuperNode starts a new one the next round).
    No central yardstick here."""
    from .simulate import check_run

    if not isinstance(strategy, str):
        raise ub.UbitrainError(f"strategy={strategy!r}: the deployment engine's ServerApp runs "
                               "in its own process; name one of fedavg, fedprox, fedadam")
    clients = len(client_data) if isinstance(client_data, (list, tuple)) else 0
    check_run(rounds, local_steps, fraction_train, strategy, precision, rounding, clients,
              min_clients, screen, dp, optimizer)
    certificates = certificates.check() if certificates is not None else None
    out_dir = Path(out_dir).resolve()
    with out_dir_lock(out_dir):
        return _run_deployment(
            model_factory, client_data, test_data, optimizer, rounds, local_steps, batch,
            strategy, strategy_args, fraction_train, sparse, target, emulated, precision,
            rounding, min_clients, screen, dp, certificates, out_dir, seed, progress, log,
            timeout, kill, intruders)


def _run_deployment(model_factory, client_data, test_data, optimizer, rounds, local_steps,
                    batch, strategy, strategy_args, fraction_train, sparse, target, emulated,
                    precision, rounding, min_clients, screen, dp, certificates, out_dir, seed,
                    progress, log, timeout, kill, intruders) -> FleetResult:
    from .simulate import clients_per_round, round_line, strategy_arguments

    start_time = time.perf_counter()
    clients = len(client_data)
    steps = clients_per_round(clients, fraction_train) * local_steps * rounds
    prep = prepare(model_factory, client_data, test_data, out_dir=out_dir, target=target,
                   precision=precision, optimizer=optimizer, batch=batch,
                   local_steps=local_steps, sparse=sparse, seed=seed, progress=progress,
                   total_steps=steps)
    device = None
    if emulated:  # its driver is built here; each round's ClientApp starts the emulator
        from ..training.sparse_update import SparseUpdate
        device, board = fleet_package(
            out_dir, emulated, model_factory, prep.shards[0][0].shape[1:], batch,
            prep.optimizer, SparseUpdate(biases=True, last_layers=1) if sparse else None,
            seed, progress, precision)
        board.close()
    config = {"server-project": str(prep.evaluator.package.out_dir),
              "server-library": str(prep.evaluator.library),
              "project": str(prep.client_project),
              "library": str(prep.client_library or ""), "data-dir": str(prep.data_dir),
              "clients": clients, "seed": seed, "local-steps": local_steps, "batch": batch,
              "lr": prep.local.lr, "rounds": rounds, "strategy": strategy,
              "strategy-args": json.dumps(strategy_arguments(strategy, strategy_args,
                                                             precision, rounding, seed)),
              "fraction-fit": fraction_train, "sparse": sparse, "out-dir": str(out_dir),
              "kill": ",".join(f"{c}:{r}" for c, r in kill), "precision": precision,
              "min-clients": -1 if min_clients is None else min_clients,
              "screen": json.dumps(screen), "dp": json.dumps(dp)}
    app = out_dir / "app"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(APP_TOML.format(
        config="\n".join(f"{k} = {_toml_value(v)}" for k, v in config.items())))
    tls = certificates or local_certificates(out_dir / "tls")
    keys = {f"supernode-{i}": supernode_keys(out_dir / "keys", f"supernode-{i}")
            for i in range(clients)}
    strangers = {f"intruder-{i}": supernode_keys(out_dir / "keys", f"intruder-{i}")
                 for i in range(intruders)}
    port = _free_port()  # the SuperLink's one HTTPS port: Fleet, Control and Runtime APIs
    home = out_dir / "flwr-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "fleet"\n\n[superlink.fleet]\n'
        f'address = "127.0.0.1:{port}"\nroot-certificates = "{tls.ca}"\n')
    env = {**os.environ, "FLWR_HOME": str(home)}
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    (out_dir / "rounds.json").unlink(missing_ok=True)
    for stale in out_dir.glob("superlink.db*"):  # registrations of an earlier run
        stale.unlink()

    with ExitStack() as stack:
        def start(name, command):
            log_file = stack.enter_context(open(logs / f"{name}.log", "w"))
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       env=env, cwd=out_dir)
            stack.callback(_stop, process)
            return process

        def supernode(name, private_key, node):
            return start(name, ["flower-supernode", "--root-certificates", str(tls.ca),
                                "--superlink", f"127.0.0.1:{port}",
                                "--auth-supernode-private-key", str(private_key),
                                "--port", str(_free_port()), "--node-config", node])

        start("superlink", ["flower-superlink", "--ssl-ca-certfile", str(tls.ca),
                            "--ssl-certfile", str(tls.certificate),
                            "--ssl-keyfile", str(tls.key), "--enable-supernode-auth",
                            "--port", str(port), "--database", str(out_dir / "superlink.db")])
        _wait_for_port(port, 300, "the SuperLink")
        _register([public for _, public in keys.values()], env, out_dir, logs)
        for i, (name, (private, _)) in enumerate(keys.items()):
            node = f"partition-id={i} num-partitions={clients}"
            if device and i == clients - 1:
                node += f' project="{device}" library=""'
            supernode(name, private, node)
        outsiders = {name: supernode(name, private, "partition-id=0 num-partitions=1")
                     for name, (private, _) in strangers.items()}
        log(f"SuperLink on 127.0.0.1:{port} (TLS, {clients} registered SuperNode keys), "
            f"{clients} SuperNodes"
            + (f" (supernode-{clients - 1}: {emulated} under its emulator)" if emulated
               else "") + f"; logs in {logs}")
        run = subprocess.run(["flwr", "run", str(app), "fleet", "--stream"], env=env,
                             cwd=out_dir, capture_output=True, text=True, timeout=timeout)
        (logs / "flwr-run.log").write_text(run.stdout + run.stderr)
        result = out_dir / "rounds.json"
        if run.returncode != 0 or not result.exists():
            raise ub.UbitrainError(f"flwr run failed (status {run.returncode}); see "
                                   f"{logs / 'flwr-run.log'}")
        refused = [name for name, process in outsiders.items()
                   if process.poll() not in (None, 0)
                   and REFUSED in (logs / f"{name}.log").read_text()]
    rounds_done = json.loads(result.read_text())
    for m in rounds_done[1:]:
        log(round_line(m, rounds, emulated or target))
    for name in refused:
        log(f"{name}: refused by the SuperLink (its public key is not registered)")
    check_outcome(rounds_done, log)
    last = out_dir / "checkpoints" / f"round_{len(rounds_done) - 1:03d}.npz"
    with np.load(last) as f:
        model = dict(f)
    fleet = FleetResult(rounds_done, model, out_dir, time.perf_counter() - start_time,
                        refused=refused)
    log(fleet.summary(clients))
    return fleet


def _register(public_keys: list[Path], env: dict, cwd: Path, logs: Path) -> None:
    """The SuperNodes' public keys registered with the SuperLink (over its Control API; one
    `flwr supernode register` a key, four at a time)."""
    for first in range(0, len(public_keys), 4):
        running = []
        for key in public_keys[first:first + 4]:
            log_file = logs / f"register-{key.stem}.log"
            with open(log_file, "w") as out:
                running.append((key, log_file, subprocess.Popen(
                    ["flwr", "supernode", "register", str(key), "fleet"], env=env, cwd=cwd,
                    stdout=out, stderr=subprocess.STDOUT)))
        for key, log_file, process in running:
            if process.wait(timeout=300) != 0:
                raise ub.UbitrainError(f"registering {key.name} with the SuperLink failed "
                                       f"(status {process.returncode}); see {log_file}")


def _stop(process: subprocess.Popen):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()

