"""The `ubitrain` command: one module per command (compile, demo, targets, passes, build,
report, fleet), each with `add_parser(sub)` and `run(args)`.

Errors that ubitrain raises on purpose (ub.UbitrainError) print as one line, "error: ...",
and exit with status 2; anything else is a bug and keeps its traceback. A command imports
what it needs when it runs, so that `ubitrain --help` starts at once.
"""

from __future__ import annotations

import sys

from . import build, compile, demo, fleet, passes, report, targets
from .common import Parser, formatter, version

DESCRIPTION = """\
ubitrain: an on-device training compiler. It takes a torch.nn.Module, a loss and an
optimizer, and writes a self-contained C project (model.h, model.c, CMakeLists.txt,
runtime_c/) that runs the whole training step: forward, loss, backward, optimizer update,
over one statically planned memory arena."""

EPILOG = """\
examples:
  ubitrain demo                                   train a CNN on the digits data in C and PyTorch
  ubitrain compile examples/digits_factory.py:factory --out-dir build/digits
  ubitrain targets

Run "ubitrain COMMAND --help" for the options of a command."""

COMMANDS = {module.__name__.rpartition(".")[2]: module
            for module in (compile, demo, targets, passes, build, report, fleet)}


def build_parser() -> Parser:
    parser = Parser(prog="ubitrain", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"ubitrain {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    import logging
    import warnings

    from ..errors import UbitrainError, UbitrainWarning

    verbose = getattr(args, "verbose", False)
    shown = warnings.showwarning

    def show(message, category, *rest, **kw):  # ours as one line; torch's and TVM's chatter
        if issubclass(category, UbitrainWarning):  # only with --verbose
            print(f"warning: {message}", file=sys.stderr)
        elif verbose:
            shown(message, category, *rest, **kw)

    if not verbose:  # torch.export logs through logging, not warnings
        for name in ("torch", "tvm"):
            logging.getLogger(name).setLevel(logging.ERROR)

    try:
        with warnings.catch_warnings():  # restores showwarning for callers of main()
            warnings.showwarning = show
            return COMMANDS[args.command].run(args)
    except UbitrainError as err:
        first, _, rest = str(err).strip().partition("\n")
        if rest and not verbose:
            first += " (run with --verbose for details)"
        print(f"error: {first}", file=sys.stderr)
        if rest and verbose:
            print(rest, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
