"""A fleet: federated training of generated C trainers with Flower.

    data.py      the digits split over clients (IID, or Dirichlet non-IID by label)
    local.py     one client's round: load the global tensors, train in C, return the update
    apps.py      Flower's ClientApp and ServerApp around them (FedAvg, FedProx, FedAdam)
    int8_exchange.py  int8 (NITI) clients: int8 weights and exponents exchanged, merged
                 exactly in integers (Int8FedAvg), the fleet's NITI step count
    records.py   Flower's ArrayRecord <-> numpy
    simulate.py  `run_fleet`: the simulation engine on one machine, against central training
    cli.py       `ubitrain fleet`
    deployed_apps.py, deployment.py
                 the same apps under the deployment engine: SuperLink, SuperNodes, flwr run
"""
