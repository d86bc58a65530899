"""`ubitrain report`: a model's memory plan drawn (memory/report.py) and summarised."""

from __future__ import annotations

from pathlib import Path

from .common import formatter
from .models import load_factory, make_optimizer, model_from_factory

REPORT_HELP = """\
Compile a model (as "ubitrain compile" does) and show its memory plan: a PNG of the arena
over the training step (buffers as rectangles in time x address, colored by kind) and a
text summary (arena, lower bound, bytes by kind, the largest buffers)."""


def add_parser(sub):
    r = sub.add_parser("report", help="draw the memory plan of a model (PNG + summary)",
                       description=REPORT_HELP, formatter_class=formatter)
    r.add_argument("model", metavar="MODEL", help='"path/to/file.py:factory"')
    r.add_argument("--loss", default="cross_entropy", help="cross_entropy (default) or mse")
    r.add_argument("--optimizer", default="sgd", type=str.lower, help="sgd, adam or adamw")
    r.add_argument("--lr", type=float, default=None, help="learning rate")
    r.add_argument("--momentum", type=float, default=None, help="SGD momentum")
    r.add_argument("--weight-decay", type=float, default=None, help="weight decay")
    r.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX_NORM",
                   help="gradient clipping by global norm (every gradient then coexists)")
    r.add_argument("--batch", type=int, default=None, help="batch size")
    r.add_argument("--input-shape", default=None, metavar="D,D,...",
                   help="shape of one sample (when the factory returns only a module)")
    r.add_argument("--target", default="host", help="target name (default host)")
    r.add_argument("--memory-budget", default=None,
                   help='arena budget in bytes or e.g. "256KiB": micro-batch, recompute and '
                        'page to fit')
    r.add_argument("--micro-batches", type=int, default=None, metavar="K",
                   help="run each step as K micro-batches with gradient accumulation "
                        "(default: as the memory budget needs, else 1)")
    r.add_argument("--out-dir", default=None, help="where to write the C project")
    r.add_argument("--png", default=None,
                   help="where to write the picture (default OUT_DIR/memory_plan.png)")
    r.add_argument("--program", default="train_step", choices=["train_step", "predict"])
    r.add_argument("--verbose", action="store_true", help="on an error, print its details")


def run(args) -> int:
    import ubitrain as ub

    from ..memory.report import render_png, require_matplotlib, text_summary

    require_matplotlib()  # before the compile, not after it
    optimizer = make_optimizer(args.optimizer, args.lr, args.momentum, args.weight_decay,
                               args.clip_grad_norm)
    module, inputs, labels = model_from_factory(load_factory(args.model), args.model,
                                                args.batch, args.input_shape, args.loss)
    out_dir = Path(args.out_dir or Path("build") / Path(args.model.rpartition(":")[0]).stem)
    pkg = ub.compile(module, inputs, labels, loss=args.loss, optimizer=optimizer,
                     target=args.target, memory_budget=args.memory_budget, out_dir=out_dir,
                     micro_batches=args.micro_batches)
    png = render_png(pkg.memory_plan, args.png or out_dir / "memory_plan.png", args.program,
                     title=f"{type(module).__name__}, batch {int(inputs[0].shape[0])}: "
                           f"{pkg.memory_plan.summary()}")
    summary = text_summary(pkg.memory_plan, args.program)
    (png.parent / (png.stem + ".txt")).write_text(summary + "\n")
    print(summary)
    print(f"picture written to {png}; summary to {png.with_suffix('.txt')}")
    return 0
