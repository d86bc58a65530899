"""`ubitrain compile`: a model file into a C training project."""

from __future__ import annotations

from pathlib import Path

from .common import PRECISIONS, formatter, progress
from .models import load_factory, make_optimizer, model_from_factory, model_from_onnx

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
  ubitrain compile mynet.py:make_model --optimizer adamw --clip-grad-norm 1.0

A factory file:
  import torch
  from torch import nn

  def factory(batch=32):
      model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
      return model, (torch.zeros(batch, 1, 8, 8),), torch.zeros(batch, dtype=torch.long)"""


def add_parser(sub):
    c = sub.add_parser("compile", help="compile a model file into a C training project",
                       description=COMPILE_HELP, epilog=COMPILE_EPILOG,
                       formatter_class=formatter)
    c.add_argument("model", metavar="MODEL",
                   help='"path/to/file.py:factory" or "path/to/model.onnx"')
    c.add_argument("--loss", default="cross_entropy",
                   help="cross_entropy (default) or mse")
    c.add_argument("--optimizer", default="sgd", type=str.lower,
                   help="sgd (default), adam or adamw")
    c.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the optimizer's, 0.01 SGD, 0.001 Adam/AdamW)")
    c.add_argument("--momentum", type=float, default=None, help="SGD momentum (default 0)")
    c.add_argument("--weight-decay", type=float, default=None,
                   help="weight decay (default: 0; 0.01 for adamw)")
    c.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX_NORM",
                   help="clip the gradients by their global L2 norm before each update, as "
                        "torch.nn.utils.clip_grad_norm_ (default: no clipping)")
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
    c.add_argument("--dsp-offload", action="store_true",
                   help="int8 on hexagon-v66: split the step between the CPU and the DSP, "
                        "and print where each kernel runs (a chain of bias-free layers)")
    c.add_argument("--verbose", action="store_true",
                   help="on an error, print its full details (e.g. the C compiler's log)")


def run(args) -> int:
    import ubitrain as ub
    from ubitrain.targets import get_target
    from ubitrain.training.losses import LOSSES

    get_target(args.target)  # an unknown target fails before the model file is imported
    if args.loss not in LOSSES:
        raise ub.CompileError(f"unknown loss {args.loss!r}; supported: {', '.join(LOSSES)}")
    if args.batch is not None and args.batch < 1:
        raise ub.CompileError(f"--batch {args.batch} must be at least 1")
    optimizer = make_optimizer(args.optimizer, args.lr, args.momentum, args.weight_decay,
                               args.clip_grad_norm)
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
        if args.clip_grad_norm is not None:
            raise ub.CompileError("--clip-grad-norm applies to --precision fp32 only; NITI "
                                  "(int8) has no gradient clipping")
        optimizer = ub.NITI(adaptive_rescale=args.adaptive_rescale,
                            dsp_offload=args.dsp_offload)
    pkg = ub.compile(module, inputs, labels, loss=args.loss, optimizer=optimizer,
                     target=args.target, memory_budget=args.memory_budget, out_dir=out_dir,
                     progress=progress(args), precision=args.precision,
                     micro_batches=args.micro_batches,
                     disable_passes=[n for n in args.disable_passes.split(",") if n])
    batch = int(inputs[0].shape[0]) if len(inputs[0].shape) else 1
    name = Path(args.model).name if args.model.endswith(".onnx") else type(module).__name__
    print(f"compiled {name} for target {args.target} in "
          f"{pkg.compile_seconds:.1f} s: batch {batch}, {len(pkg.trainable)} trainable "
          f"tensor(s), {pkg.kernel_count} C kernels")
    print(f"memory plan: {pkg.memory_plan.summary()}")
    if getattr(pkg, "placement", None):  # int8 on hexagon-v66: which kernel runs where
        from ..offload.placement import placement_report
        print("placement of the int8 step (the split of ub.NITI(dsp_offload=True)):")
        print(placement_report(pkg.placement, pkg.programs["train_step"]))
    print(f"C project written to {out_dir}/ (model.h, model.c, CMakeLists.txt, runtime_c/); "
          f"C API prefix ub_{pkg.model_name}_")
    target = pkg.target
    toolchain = "" if target.runs_on_host else (
        f" -DCMAKE_TOOLCHAIN_FILE={out_dir}/toolchains/{target.toolchain_dir}/toolchain.cmake "
        "-DUB_BUILD_DRIVER=ON")
    print(f"build it: cmake -S {out_dir} -B {out_dir}/build{toolchain} && "
          f"cmake --build {out_dir}/build")
    return 0
