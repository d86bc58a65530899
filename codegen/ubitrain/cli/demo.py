"""`ubitrain demo`: the digits CNN trained through the generated C beside PyTorch."""

from __future__ import annotations

from .common import PRECISIONS, formatter

DEMO_HELP = """\
Train a small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes, shipped
with scikit-learn) through the generated C, and the same network with the same initial
weights, batches and optimizer in PyTorch. Prints the loss and test accuracy of every
epoch, both final accuracies, the compile time and the memory plan."""

DEMO_EPILOG = """\
examples:
  ubitrain demo
  ubitrain demo --epochs 3 --out-dir /tmp/ub-demo --no-progress
  ubitrain demo --target cortex-m4 --epochs 2      train on an emulated Cortex-M4 board
  ubitrain demo --precision int8                  integer-only (NITI) training beside fp32"""


def add_parser(sub):
    d = sub.add_parser("demo", help="train a CNN on the digits data through the generated C",
                       description=DEMO_HELP, epilog=DEMO_EPILOG, formatter_class=formatter)
    d.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    d.add_argument("--out-dir", default="build/demo",
                   help="where to write the generated project (default build/demo)")
    d.add_argument("--seed", type=int, default=0, help="seed of the split, weights, batches")
    d.add_argument("--target", default="host",
                   help="where the generated C trains (default host); a cross target such as "
                        "cortex-m4 is cross-compiled and trains under QEMU")
    d.add_argument("--sparse", action="store_true",
                   help="transfer learning instead: pre-train on digits 0-4 in PyTorch, then "
                        "learn 5-9 in the generated C with a sparse update (last 2 layers)")
    d.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="int8: NITI integer-only training of the CNN without BatchNorm, side "
                        "by side with fp32 (and with self-adaptive rescaling)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.add_argument("--verbose", action="store_true",
                   help="on an error, print its full details (e.g. the C compiler's log)")


def run(args) -> int:
    from ..demos.digits import run_demo
    from ..targets import get_target

    get_target(args.target)
    if args.precision == "int8":
        from ..demos.int8 import run_int8_demo

        out_dir = args.out_dir if args.out_dir != "build/demo" else "build/demo_int8"
        run_int8_demo(epochs=args.epochs, out_dir=out_dir, seed=args.seed,
                      progress=not args.no_progress, target=args.target)
        return 0
    if args.sparse:
        from ..demos.sparse import run_sparse_demo

        run_sparse_demo(epochs=args.epochs, out_dir=args.out_dir, seed=args.seed,
                        progress=not args.no_progress)
        return 0
    run_demo(epochs=args.epochs, out_dir=args.out_dir, seed=args.seed,
             progress=not args.no_progress, target=args.target)
    return 0
