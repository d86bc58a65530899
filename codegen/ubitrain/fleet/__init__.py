"""A fleet: federated training of generated C trainers with Flower, for any model and any
clients' data.

    from ubitrain.fleet import run_fleet
    result = run_fleet(model_factory, [(x0, y0), (x1, y1), ...], (x_test, y_test),
                       optimizer=ub.SGD(lr=0.05, momentum=0.9), rounds=8, strategy="fedavg")

    simulate.py  `run_fleet`: the simulation engine on one machine, against central training
    deployment.py, deployed_apps.py
                 `run_deployment`: the same apps under the deployment engine (a SuperLink,
                 SuperNodes, flwr run)
    prepare.py   what both do first: data and model checked, compiled, shards written
    packages.py  the compiled model a client receives: the project's directory (package.json)
    data.py      the clients' shards: checked, split (IID or Dirichlet by label), one file each
    local.py     one client's round: load the global tensors, train in C, return the update
    apps.py      Flower's ClientApp around it (faults for tests, Flower's clipping mod for DP)
    server.py    Flower's ServerApp: strategies (FedAvg, FedProx, FedAdam, ...), failed rounds,
                 float32 downlink, checkpoints, Ctrl-C
    screening.py the updates the server refuses: non-finite, far larger than the others'
    inline.py    an in-process Grid: rounds without Ray (tests, measurements)
    security.py  the deployment engine's TLS certificates and SuperNode keys
    lock.py      one run an out-dir at a time
    int8_exchange.py  int8 (NITI) clients: int8 weights and exponents exchanged, merged
                 exactly in integers (Int8FedAvg), the fleet's NITI step count
    evaluation.py  the server's test metrics
    records.py   Flower's ArrayRecord <-> numpy
    result.py    FleetResult
    (`ubitrain fleet` is ubitrain/cli/fleet.py: the digits and the demo CNN as its defaults)
"""

__all__ = ["FleetResult", "run_deployment", "run_fleet", "split_dataset"]


def __getattr__(name):  # Flower and Ray load only when a fleet runs, not with `ubitrain -h`
    if name == "run_fleet":
        from .simulate import run_fleet
        return run_fleet
    if name == "run_deployment":
        from .deployment import run_deployment
        return run_deployment
    if name == "split_dataset":
        from .data import split_dataset
        return split_dataset
    if name == "FleetResult":
        from .result import FleetResult
        return FleetResult
    raise AttributeError(f"module 'ubitrain.fleet' has no attribute {name!r}")
