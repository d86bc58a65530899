"""`ubitrain fleet`: federated training of generated C trainers, simulated on this machine or
under Flower's deployment engine, on the digits demo's data and CNN (or --model)."""

from __future__ import annotations

from .common import PRECISIONS, formatter
from .models import load_factory

FLEET_HELP = """\
Federated training with Flower's simulation engine: scikit-learn's digits are split over N
clients (IID, or by label with --non-iid ALPHA); every round the server sends the global
model to a fraction of them, each trains it for --local-steps steps of the generated C on its
own shard, and the server merges their updates (--strategy). The global model is evaluated
and checkpointed after every round; one line a round gives its test accuracy, loss, the bytes
sent each way and the seconds. The same model trained centrally on as many samples is the
yardstick. With --precision int8 the clients train with NITI's integer-only int8 and send int8
weights with their exponents, which the server averages exactly in integers and rounds back
to int8 (--int8-rounding). With --engine deployment the same apps run on a SuperLink and one
SuperNode process per client on this machine (--emulated TARGET: the last one drives that
board under its emulator). The last line is exactly:
  fleet: N clients, R rounds, test accuracy A% (centralized C%)"""

FLEET_EPILOG = """\
examples:
  ubitrain fleet --clients 20 --rounds 8
  ubitrain fleet --clients 100 --rounds 5 --fraction-fit 0.2 --non-iid 0.5
  ubitrain fleet --clients 10 --rounds 5 --sparse --strategy fedadam
  ubitrain fleet --strategy fedprox --momentum 0
  ubitrain fleet --clients 20 --rounds 8 --precision int8
  ubitrain fleet --clients 3 --rounds 2 --engine deployment --emulated cortex-m4
  ubitrain fleet --model mynet.py:factory     a factory of a module for 1x8x8 images, 10 classes"""


def add_parser(sub):
    f = sub.add_parser("fleet", help="federated training of generated C trainers (Flower)",
                       description=FLEET_HELP, epilog=FLEET_EPILOG, formatter_class=formatter)
    f.add_argument("--clients", type=int, default=20, help="simulated clients (default 20)")
    f.add_argument("--rounds", type=int, default=8, help="federated rounds (default 8)")
    f.add_argument("--local-steps", type=int, default=10,
                   help="local training steps per client and round (default 10)")
    f.add_argument("--fraction-fit", type=float, default=1.0,
                   help="fraction of the clients that train each round (default 1)")
    f.add_argument("--non-iid", type=float, default=None, metavar="ALPHA",
                   help="split labels by Dirichlet(ALPHA) (small: skewed); default IID")
    f.add_argument("--strategy", default="fedavg", choices=("fedavg", "fedprox", "fedadam"),
                   help="Flower strategy (default fedavg)")
    f.add_argument("--proximal-mu", type=float, default=0.01, help="FedProx's mu")
    f.add_argument("--sparse", action="store_true",
                   help="train and send only the biases and the last layer (SparseUpdate)")
    f.add_argument("--model", default=None, metavar="FILE.py:factory",
                   help="a factory returning a module for [batch, 1, 8, 8] images and 10 "
                        "classes (default: the demo's digits CNN)")
    f.add_argument("--batch", type=int, default=16, help="local batch size (default 16)")
    f.add_argument("--lr", type=float, default=None,
                   help="local SGD learning rate (default 0.05; fp32 only)")
    f.add_argument("--momentum", type=float, default=None,
                   help="local SGD momentum (default 0.9; restarted every round; fp32 only)")
    f.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (SGD) or int8 clients (NITI; the CNN without BatchNorm and "
                        "biases, mu 5, 4, 3 over the thirds of the fleet's steps)")
    f.add_argument("--int8-rounding", choices=("nearest", "stochastic"), default="nearest",
                   help="int8: how the server rounds the exact mean back to int8 (default "
                        "nearest, ties to even; stochastic: seeded by --seed and the round)")
    f.add_argument("--target", default="host",
                   help="the clients' target (default host; another runs under its emulator)")
    f.add_argument("--engine", choices=("simulation", "deployment"), default="simulation",
                   help="Flower's simulation engine (default), or its deployment engine: a "
                        "SuperLink and one SuperNode process per client on this machine")
    f.add_argument("--emulated", default=None, metavar="TARGET",
                   help="--engine deployment: the last SuperNode drives a TARGET build under "
                        "its emulator (e.g. cortex-m4)")
    f.add_argument("--min-clients", type=int, default=None, metavar="N",
                   help="a round fails (the global model stays) when fewer than N clients "
                        "sent an update it merges (default: a majority of the round's)")
    f.add_argument("--screen", choices=("norm", "finite", "none"), default="norm",
                   help="updates the server refuses: norm (default: NaN/inf, or a norm over "
                        "10x the others' median), finite (NaN/inf only), none")
    f.add_argument("--dp-noise", type=float, default=None, metavar="Z",
                   help="differential privacy (Flower's, client-side clipping): the noise "
                        "multiplier; with --dp-clip")
    f.add_argument("--dp-clip", type=float, default=None, metavar="C",
                   help="differential privacy: the clipping norm of each client's update")
    f.add_argument("--ssl-ca-certfile", default=None, metavar="FILE",
                   help="--engine deployment: your CA (PEM); with --ssl-certfile and "
                        "--ssl-keyfile, the SuperLink's certificate and key (default: made "
                        "for this run, for 127.0.0.1)")
    f.add_argument("--ssl-certfile", default=None, metavar="FILE")
    f.add_argument("--ssl-keyfile", default=None, metavar="FILE")
    f.add_argument("--out-dir", default="build/fleet",
                   help="trainer, checkpoints and accuracy.png (default build/fleet)")
    f.add_argument("--seed", type=int, default=0, help="seed of the split, weights, batches")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument("--verbose", action="store_true", help="Flower's and Ray's log too")


def run(args) -> int:
    """The fleet takes any model and data (fleet/); the command line's default ones are the
    digits demo's: its data split over the clients and its CNN."""
    import ubitrain as ub

    from ..demos.data import load_data
    from ..errors import UbitrainError
    from ..fleet.data import split_dataset
    from ..zoo import DigitsCNN, DigitsCNNNiti

    default_model = {"fp32": DigitsCNN, "int8": DigitsCNNNiti}

    if args.precision == "int8":
        given = [f"--{n}" for n in ("lr", "momentum") if getattr(args, n) is not None]
        if given:
            raise SystemExit(f"ubitrain fleet: {' and '.join(given)} set SGD's step, which int8 "
                             "clients do not run: NITI's update has no learning rate or "
                             "momentum (its schedule is mu 5, 4, 3 over the fleet's steps). "
                             "Leave them out with --precision int8")
        optimizer = None
    else:
        optimizer = ub.SGD(lr=0.05 if args.lr is None else args.lr,
                           momentum=0.9 if args.momentum is None else args.momentum)
    if args.emulated and args.engine != "deployment":
        raise UbitrainError("--emulated TARGET puts one SuperNode of the deployment engine on "
                            "an emulated board: add --engine deployment (or use --target "
                            "TARGET to run every simulated client on it)")
    if (args.dp_noise is None) != (args.dp_clip is None):
        raise UbitrainError("--dp-noise and --dp-clip go together: the noise multiplier and "
                            "the clipping norm of Flower's differential privacy")
    tls = [args.ssl_ca_certfile, args.ssl_certfile, args.ssl_keyfile]
    if any(tls) and (not all(tls) or args.engine != "deployment"):
        raise UbitrainError("--ssl-ca-certfile, --ssl-certfile and --ssl-keyfile go together, "
                            "with --engine deployment (the simulation has no network)")
    model = load_factory(args.model) if args.model else default_model[args.precision]
    x_train, y_train, x_test, y_test = load_data(args.seed)
    shards = split_dataset(x_train, y_train, args.clients, args.non_iid, args.seed)
    common = dict(optimizer=optimizer, rounds=args.rounds, local_steps=args.local_steps,
                  batch=args.batch, strategy=args.strategy,
                  strategy_args={"proximal_mu": args.proximal_mu}
                  if args.strategy == "fedprox" else None,
                  fraction_train=args.fraction_fit, sparse=args.sparse,
                  precision=args.precision, rounding=args.int8_rounding, out_dir=args.out_dir,
                  seed=args.seed, progress=False if args.no_progress else None,
                  min_clients=args.min_clients,
                  screen=None if args.screen == "none" else args.screen,
                  dp=None if args.dp_noise is None else {"noise_multiplier": args.dp_noise,
                                                         "clipping_norm": args.dp_clip})
    if args.engine == "deployment":
        from ..fleet.deployment import run_deployment
        from ..fleet.security import Certificates
        run_deployment(model, shards, (x_test, y_test), target=args.target,
                       emulated=args.emulated,
                       certificates=Certificates(*tls) if all(tls) else None, **common)
    else:
        from ..fleet.simulate import run_fleet
        run_fleet(model, shards, (x_test, y_test), target=args.target, verbose=args.verbose,
                  **common)
    return 0
