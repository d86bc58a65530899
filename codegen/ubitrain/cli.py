"""The `ubitrain` command: compile a model file into a C project, run the demo, list targets.

Errors that ubitrain raises on purpose (ub.UbitrainError) print as one line, "error: ...",
and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
import sys
from pathlib import Path

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

COMPILE_HELP = """\
Compile a model into a C training project.

MODEL is "path/to/model.onnx" (exported from PyTorch in training mode: see the README), or
"path/to/file.py:factory". The file is imported and factory() is called; it
returns either
  * (module, example_inputs, labels): a torch.nn.Module, a tuple with one batch of every
    model input, and one batch of labels (integer class indices of shape [batch] for
    --loss cross_entropy, float targets shaped like the output for --loss mse). The batch
    size of the compiled step is the batch size of these arrays; or
  * module: a torch.nn.Module alone. Then --input-shape gives the shape of one sample
    (without the batch dimension) and --batch the batch size; the labels are derived from
    the loss and the model's output.
If the factory takes a parameter named "batch", --batch is passed to it.

The memory plan and the project's location are printed. The project builds without
Python: cmake -S OUT_DIR -B OUT_DIR/build && cmake --build OUT_DIR/build"""

COMPILE_EPILOG = """\
examples:
  ubitrain compile examples/digits_factory.py:factory
  ubitrain compile examples/digits_factory.py:factory --optimizer adam --lr 1e-3 \\
      --batch 16 --out-dir build/digits16
  ubitrain compile mynet.py:make_model --input-shape 3,32,32 --batch 8 --loss cross_entropy

A factory file:
  import torch
  from torch import nn

  def factory(batch=32):
      model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
      return model, (torch.zeros(batch, 1, 8, 8),), torch.zeros(batch, dtype=torch.long)"""

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

TARGETS_HELP = "List the targets that --target accepts."
TARGETS_EPILOG = """\
examples:
  ubitrain targets
  ubitrain compile examples/digits_factory.py:factory --target host
  ubitrain compile examples/digits_factory.py:factory --target cortex-m4
  ubitrain demo --target cortex-m4"""


PASSES_HELP = """\
List the steps of the compile pipeline of a precision, in the order they run. The rewrite
passes (marked *) change how the step is computed, never what; --disable-passes switches
them off by name, each stating whether the step then stays the same bit for bit."""
PRECISIONS = ("fp32", "int8")  # pipeline/__init__.py PIPELINES (not imported: start-up time)


def _formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, `error: ...`, and status 2, like every other error."""

    def error(self, message):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ubitrain", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=_formatter)
    parser.add_argument("--version", action="version", version=f"ubitrain {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("compile", help="compile a model file into a C training project",
                       description=COMPILE_HELP, epilog=COMPILE_EPILOG,
                       formatter_class=_formatter)
    c.add_argument("model", metavar="MODEL", help='"path/to/file.py:factory"')
    c.add_argument("--loss", default="cross_entropy",
                   help="cross_entropy (default) or mse")
    c.add_argument("--optimizer", default="sgd", type=str.lower,
                   help="sgd (default), adam or adamw")
    c.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the optimizer's, 0.01 SGD, 0.001 Adam/AdamW)")
    c.add_argument("--momentum", type=float, default=None, help="SGD momentum (default 0)")
    c.add_argument("--weight-decay", type=float, default=None,
                   help="weight decay (default: 0; 0.01 for adamw)")
    c.add_argument("--batch", type=int, default=None,
                   help="batch size; with a factory that returns only a module (default 32), "
                        "or one that takes a batch parameter")
    c.add_argument("--input-shape", default=None, metavar="D,D,...",
                   help="shape of one input sample without the batch dimension, e.g. 1,8,8 "
                        "(only when the factory returns only a module)")
    c.add_argument("--memory-budget", default=None,
                   help="arena budget, e.g. 256KiB or 262144: micro-batch, recompute and page "
                        "to fit, or fail naming the smallest budget that works")
    c.add_argument("--micro-batches", type=int, default=None, metavar="K",
                   help="run each step as K micro-batches with gradient accumulation "
                        "(default: as the memory budget needs, else 1)")
    c.add_argument("--target", default="host", help='target name (default host; see '
                   '"ubitrain targets")')
    c.add_argument("--out-dir", default=None,
                   help="where to write the project (default build/<file name>)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="int8: NITI integer-only training (--optimizer and --lr do not apply)")
    c.add_argument("--disable-passes", default="", metavar="NAME,...",
                   help='rewrite passes to switch off, for debugging (see "ubitrain passes")')
    c.add_argument("--adaptive-rescale", action="store_true",
                   help="int8: reuse each tensor's shift, reducing only when due or saturated")
    c.add_argument("--verbose", action="store_true",
                   help="on an error, print its full details (e.g. the C compiler's log)")

    d = sub.add_parser("demo", help="train a CNN on the digits data through the generated C",
                       description=DEMO_HELP, epilog=DEMO_EPILOG, formatter_class=_formatter)
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

    sub.add_parser("targets", help="list the compile targets", description=TARGETS_HELP,
                   epilog=TARGETS_EPILOG, formatter_class=_formatter)
    p = sub.add_parser("passes", help="list the steps of the compile pipeline",
                       description=PASSES_HELP, formatter_class=_formatter)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    b = sub.add_parser("build", help="build a generated C project with CMake",
                       description=BUILD_HELP, epilog=BUILD_EPILOG, formatter_class=_formatter)
    b.add_argument("project", help="the directory ubitrain compile wrote (its --out-dir)")
    b.add_argument("--target", default="host",
                   help="host (the system compiler) or a cross target from ubitrain targets")
    b.add_argument("--build-dir", help="where CMake builds (default PROJECT/build-TARGET)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    from .memory.report import add_report_parser
    add_report_parser(sub, _formatter)
    from .fleet.cli import add_fleet_parser
    add_fleet_parser(sub, _formatter)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ubitrain")
    except PackageNotFoundError:
        return "unknown"


# ---- compile --------------------------------------------------------------------------------
def load_factory(spec: str):
    """"path/to/file.py:name" → the callable `name` defined in that file."""
    from .errors import CompileError

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise CompileError(f"model {spec!r} must be given as path/to/file.py:factory")
    file = Path(path)
    if not file.is_file():
        raise CompileError(f"model file {path!r} does not exist")
    module_name = "ubitrain_user_" + "".join(ch if ch.isalnum() else "_" for ch in file.stem)
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    if module_spec is None or module_spec.loader is None:
        raise CompileError(f"model file {path!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.resolve().parent))  # the file may import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any error in the user's file, told in one line
        raise CompileError(f"importing {path!r} failed: {type(err).__name__}: {err}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if factory is None:
        raise CompileError(f"{path!r} defines no {name!r}")
    if not callable(factory):
        raise CompileError(f"{path}:{name} is not callable; give a function that returns the "
                           "model")
    return factory


def _parse_shape(text: str) -> tuple[int, ...]:
    from .errors import CompileError

    parts = re.split(r"[,x]", text.strip())  # "1,8,8" or "1x8x8"; every part a size
    shape = tuple(int(p) for p in parts) if all(p.strip().isdigit() for p in parts) else ()
    if not shape or min(shape) < 1:
        raise CompileError(f"--input-shape {text!r} is not a shape; give positive sizes such "
                           "as 1,8,8")
    return shape


def model_from_factory(factory, label: str, batch: int | None, input_shape: str | None,
                       loss: str):
    """Call the factory and return (module, example_inputs, labels)."""
    import torch

    from .errors import CompileError

    takes_batch = "batch" in _parameters(factory)
    try:
        made = factory(batch=batch) if takes_batch and batch is not None else factory()
    except Exception as err:  # noqa: BLE001 - any error in the user's factory, in one line
        raise CompileError(f"{label}() failed: {type(err).__name__}: {err}") from None

    if isinstance(made, torch.nn.Module):
        if input_shape is None:
            raise CompileError(f"{label}() returned only a module; give --input-shape (one "
                               "sample's shape, e.g. 1,8,8) or return (module, example_inputs, "
                               "labels)")
        n = batch or 32
        module, inputs = made, (torch.zeros((n,) + _parse_shape(input_shape)),)
        if loss == "mse":
            was_training = module.training
            module.eval()
            with torch.no_grad():
                labels = torch.zeros_like(module(*inputs))
            module.train(was_training)
        else:
            labels = torch.zeros(n, dtype=torch.long)
        return module, inputs, labels

    if not (isinstance(made, (tuple, list)) and len(made) == 3
            and isinstance(made[0], torch.nn.Module)):
        raise CompileError(f"{label}() must return a torch.nn.Module or (module, "
                           f"example_inputs, labels); it returned {type(made).__name__}")
    module, inputs, labels = made
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if input_shape is not None:
        raise CompileError("--input-shape applies only to a factory that returns a module "
                           "alone; this one returns its own example inputs")
    got = int(inputs[0].shape[0]) if len(inputs) and len(inputs[0].shape) else None
    if batch is not None and got != batch:
        raise CompileError(f"--batch {batch} differs from the batch of {got} that {label}() "
                           "returned; give the factory a 'batch' parameter to make it follow "
                           "--batch")
    return module, tuple(inputs), labels


def model_from_onnx(path: str, batch: int | None, input_shape: str | None, loss: str):
    """The ONNX model, example inputs shaped from its graph (a symbolic batch dimension
    takes --batch; --input-shape replaces a sample's shape) and labels for the loss."""
    import torch

    from .errors import CompileError
    from .frontend.onnx_import import load_onnx

    model = load_onnx(path)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]

    def shape(value_info, sample=None):
        dims = [d.dim_value or None for d in value_info.type.tensor_type.shape.dim]
        if sample is not None:
            dims = dims[:1] + list(sample)
        dims[0] = batch or dims[0]
        if None in dims:
            raise CompileError(f"{path}: {value_info.name} has a dimension that is not fixed "
                               f"({dims}); give --batch and --input-shape")
        return tuple(dims)

    sample = _parse_shape(input_shape) if input_shape else None
    inputs = tuple(torch.zeros(shape(i, sample)) for i in graph_inputs)
    n = inputs[0].shape[0]
    if loss == "mse":
        labels = torch.zeros(shape(model.graph.output[0]))
    else:
        labels = torch.zeros(n, dtype=torch.long)
    return model, inputs, labels


def _parameters(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def make_optimizer(name: str, lr, momentum, weight_decay):
    import ubitrain as ub

    kwargs = {}
    if lr is not None:
        kwargs["lr"] = lr
    if weight_decay is not None:
        kwargs["weight_decay"] = weight_decay
    if name == "sgd":
        if momentum is not None:
            kwargs["momentum"] = momentum
        return ub.SGD(**kwargs)
    if momentum is not None:
        raise ub.CompileError(f"--momentum applies to sgd only, not to {name}")
    if name == "adam":
        return ub.Adam(**kwargs)
    if name == "adamw":
        return ub.AdamW(**kwargs)
    raise ub.CompileError(f"unknown optimizer {name!r}; choose sgd, adam or adamw")


def _progress(args) -> bool | None:
    """--no-progress turns the bars off; otherwise they show on a terminal."""
    return False if args.no_progress else None


def cmd_compile(args) -> int:
    import ubitrain as ub
    from ubitrain.targets import get_target
    from ubitrain.training.losses import LOSSES

    get_target(args.target)  # an unknown target fails before the model file is imported
    if args.loss not in LOSSES:
        raise ub.CompileError(f"unknown loss {args.loss!r}; supported: {', '.join(LOSSES)}")
    if args.batch is not None and args.batch < 1:
        raise ub.CompileError(f"--batch {args.batch} must be at least 1")
    optimizer = make_optimizer(args.optimizer, args.lr, args.momentum, args.weight_decay)
    if args.model.endswith(".onnx"):
        module, inputs, labels = model_from_onnx(args.model, args.batch, args.input_shape,
                                                 args.loss)
        stem = Path(args.model).stem
    else:
        factory = load_factory(args.model)
        module, inputs, labels = model_from_factory(factory, args.model, args.batch,
                                                    args.input_shape, args.loss)
        stem = Path(args.model.rpartition(":")[0]).stem
    out_dir = Path(args.out_dir or Path("build") / stem)
    if args.precision == "int8":
        optimizer = ub.NITI(adaptive_rescale=args.adaptive_rescale)
    pkg = ub.compile(module, inputs, labels, loss=args.loss, optimizer=optimizer,
                     target=args.target, memory_budget=args.memory_budget, out_dir=out_dir,
                     progress=_progress(args), precision=args.precision,
                     micro_batches=args.micro_batches,
                     disable_passes=[n for n in args.disable_passes.split(",") if n])
    batch = int(inputs[0].shape[0]) if len(inputs[0].shape) else 1
    name = Path(args.model).name if args.model.endswith(".onnx") else type(module).__name__
    print(f"compiled {name} for target {args.target} in "
          f"{pkg.compile_seconds:.1f} s: batch {batch}, {len(pkg.trainable)} trainable "
          f"tensor(s), {pkg.kernel_count} C kernels")
    print(f"memory plan: {pkg.memory_plan.summary()}")
    if getattr(pkg, "placement", None):  # int8 on hexagon-v66: which kernel runs where
        from .int8.placement import placement_report
        print("placement of the int8 step (followed with ub.NITI(dsp_offload=True); "
              "otherwise every kernel runs on the Hexagon core):")
        print(placement_report(pkg.placement, pkg.programs["train_step"]))
    print(f"C project written to {out_dir}/ (model.h, model.c, CMakeLists.txt, runtime_c/); "
          f"C API prefix ub_{pkg.model_name}_")
    print(f"build it: cmake -S {out_dir} -B {out_dir}/build && cmake --build {out_dir}/build")
    return 0


# ---- demo, targets ----------------------------------------------------------------------------
def cmd_demo(args) -> int:
    from .demos.digits import run_demo
    from .targets import get_target

    get_target(args.target)
    if args.precision == "int8":
        from .demos.int8 import run_int8_demo

        out_dir = args.out_dir if args.out_dir != "build/demo" else "build/demo_int8"
        run_int8_demo(epochs=args.epochs, out_dir=out_dir, seed=args.seed,
                      progress=not args.no_progress, target=args.target)
        return 0
    if args.sparse:
        from .demos.sparse import run_sparse_demo

        run_sparse_demo(epochs=args.epochs, out_dir=args.out_dir, seed=args.seed,
                        progress=not args.no_progress)
        return 0
    run_demo(epochs=args.epochs, out_dir=args.out_dir, seed=args.seed,
             progress=not args.no_progress, target=args.target)
    return 0


BUILD_HELP = """\
Build a project that ubitrain compile wrote, with CMake: for the host with the system C
compiler (a shared library), or for a cross target with its toolchain file
from targets/ (the static library and the driver program that runs under the emulator).
This is what `cmake -S PROJECT -B BUILD_DIR && cmake --build BUILD_DIR` does; no Python is
needed to build the project on a machine of your own."""

BUILD_EPILOG = """\
examples:
  ubitrain compile examples/digits_factory.py:factory --out-dir build/digits
  ubitrain build build/digits
  ubitrain compile examples/digits_factory.py:factory --target cortex-m4 --out-dir build/m4
  ubitrain build build/m4 --target cortex-m4"""


def cmd_build(args) -> int:
    from .errors import BuildError
    from .runtime.build import cmake_build
    from .targets import get_target

    target = get_target(args.target)
    project = Path(args.project)
    if not (project / "CMakeLists.txt").is_file():
        raise BuildError(f"{project} holds no generated project (no CMakeLists.txt); write one "
                         "with ubitrain compile --out-dir first")
    build_dir = Path(args.build_dir or project / f"build-{target.name}")
    if target.runs_on_host:
        cmake_build(project, build_dir, progress=_progress(args))
    else:
        from .runtime.target_build import build_driver

        header = (project / "model.h").read_text()
        model = re.search(r"int32_t ub_(\w+)_init\(", header).group(1)
        print(f"driver: {build_driver(project, model, target, _progress(args))}")
    print(f"built {project} for {target.name} in {build_dir}:")
    for artifact in sorted(build_dir.glob("libub_*")) + sorted(build_dir.glob("ub_*_driver")):
        print(f"  {artifact}")
    return 0


def cmd_targets(args) -> int:
    from .targets import TARGETS

    def size(n: int) -> str:
        return f"{n // 1048576} MiB" if n % 1048576 == 0 else f"{n // 1024} KiB"

    width = max(len(name) for name in TARGETS)
    pad = " " * (width + 2)
    for name, t in TARGETS.items():
        where = "runs here" if t.runs_on_host else "cross-compiled, runs under QEMU"
        isas = ", ".join(f"{dtype} {isa}" for dtype, isa in t.isas)
        print(f"{name:<{width}}  {t.description} [kernels: {isas}; {where}]")
        if t.runs_on_host:
            continue
        print(f"{pad}compiler: {t.compiler} {t.compile_flags} "
              f"(targets/{t.toolchain_dir}/toolchain.cmake)")
        print(f"{pad}vectors {t.vector_bytes} B, accumulate {t.accumulate_dtype}, kernels: "
              f"{', '.join(t.kernel_variants)}")
        print(f"{pad}run: {' '.join(t.emulator_command('<binary>'))}")
        if t.board is not None:
            b = t.board
            print(f"{pad}board {b.name}: flash {size(b.flash_bytes)}, SRAM {size(b.sram_bytes)} "
                  f"(stack {size(b.stack_bytes)})")
    return 0


def cmd_passes(args) -> int:
    from .pipeline import PIPELINES, Rewrite

    pipeline = PIPELINES[args.precision]
    print(f"the {pipeline.precision} pipeline; lowering (once per number of micro-batches):")
    for step in pipeline.steps:
        if step is pipeline.finishing[0]:
            print("finishing:")
        if isinstance(step, Rewrite):
            claim = "bit-exact" if step.bit_exact else "not bit-exact"
            print(f"  * {step.name} ({claim}): {step.summary}")
        else:
            print(f"    {step.name}: {step.summary}")
    return 0


def cmd_report(args) -> int:
    from .memory.report import cmd_report as report

    return report(args)


COMMANDS = {"compile": cmd_compile, "demo": cmd_demo, "targets": cmd_targets,
            "passes": cmd_passes, "report": cmd_report}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    import logging
    import warnings

    from .errors import UbitrainError, UbitrainWarning

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
            return COMMANDS[args.command](args)
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


def cmd_fleet(args) -> int:
    from .demo import load_data
    from .fleet.cli import cmd_fleet as fleet
    from .zoo import DigitsCNN, DigitsCNNNiti

    # the fleet takes any model and data; the command line's are the digits demo's
    return fleet(args, load_factory, load_data, {"fp32": DigitsCNN, "int8": DigitsCNNNiti})


COMMANDS.update(build=cmd_build, fleet=cmd_fleet)

if __name__ == "__main__":
    sys.exit(main())
