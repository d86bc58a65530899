"""Speed of one training step: the generated C, PyTorch eager and TVM's own Relax build.

    python benchmarks/speed.py [--models lenet5 ...] [--batch 1 8 32] [--repeat 30]
                               [--out results/speed.json]

Everything runs on one thread, in one process, side by side:

- C: `ub.compile(...).build()` on the host target; the generated `train_step` (forward,
  loss, backward and the SGD-momentum update) called through ctypes on a batch checked and
  converted once (`trainer.bound_step(x, y)`), as TVM's VM is invoked on inputs set once.
  `trainer.step(x, y)`, which checks shapes, dtypes and label range every call, is timed too
  (`c_step_api_seconds`): at batch 1 those checks can cost more than the step.
- PyTorch: eager, `torch.set_num_threads(1)`; zero_grad, forward, loss, backward,
  `optimizer.step()` with the same SGD-momentum.
- TVM: `tvm.compile` of the Relax training module (`build_training_module(...).mod`, the
  same forward + loss + gradient graph the C is built from, its fused BatchNorm and
  cross-entropy ops legalized into ubitrain's kernels) with `target="llvm -mcpu=<host>"`
  and TVM's default Relax pipeline (LegalizeOps, FuseOps, FuseTIR, default TIR passes), run
  by `relax.VirtualMachine` with `TVM_NUM_THREADS=1`. That module returns the loss, the new
  BatchNorm buffers and the gradients; it has no optimizer update (ubitrain adds the update
  later, as its own kernels), so the TVM column leaves out the update: a few elementwise
  passes over the parameters, well under 1% of the step for these models.

Each time is the median of `--repeat` rounds after `--warmup` runs; a round runs the C step,
the checked C step, PyTorch's step and TVM's in turn, each twice and timing the second run
(the first warms its caches), so that load from outside (this shared machine's times move by
up to 2x over seconds) weighs on both sides of every ratio alike.

FLOPs of one step, counted from the model: for every Conv2d and Linear, MACs = output
elements x (in_channels / groups) x kernel area (Linear: kernel area 1). Forward is 2 x MACs;
backward is 2 x MACs for the data gradient plus 2 x MACs for the weight gradient, so a step
is 6 x MACs. Elementwise ops, BatchNorm, pooling, the loss and the update are not counted
(they are memory-bound and small), and the first layer's data gradient, which a step need
not compute, is counted all the same. GFLOP/s = that count / median C step time.

The roof is this machine's single-thread SGEMM rate: numpy's `matmul` of two 512 x 512
float32 matrices with BLAS limited to one thread (threadpoolctl), timed as one more side of
every model's interleaved rounds (its median there), so that the step and the roof it is
measured against see the same machine: a roof timed once before the run read 93 and 51
GFLOP/s on two runs of this shared machine. The best of 20 products before the run is
printed too.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy, torch or tvm is imported

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _results import write_json  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import ubitrain as ub  # noqa: E402
from ubitrain.zoo import ZOO  # noqa: E402

LR, MOMENTUM = 0.01, 0.9


def interleaved_medians(steps: dict, repeat: int, warmup: int) -> dict:
    """{name: median seconds} of each step function, timed in rounds: every round runs each
    function twice and times the second run (the first brings its data back into the caches
    the other functions used), so that load from outside, which comes and goes over seconds
    on a shared machine, weighs on every side of a ratio alike."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in steps}
    for _ in range(repeat):
        for name, fn in steps.items():
            fn()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


ROOF_N = 512  # the SGEMM of the roof: ROOF_N x ROOF_N times ROOF_N x ROOF_N


def sgemm() -> callable:
    """One single-thread float32 SGEMM of numpy's BLAS, 2 * ROOF_N^3 FLOPs."""
    a = np.random.default_rng(0).standard_normal((ROOF_N, ROOF_N), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((ROOF_N, ROOF_N), dtype=np.float32)
    return lambda: a @ b


def sgemm_roof() -> float:
    """Single-thread SGEMM GFLOP/s of numpy's BLAS (best of 20 runs)."""
    product = sgemm()
    with threadpool_limits(limits=1):
        best = min(_time_once(product) for _ in range(20))
    return 2 * ROOF_N**3 / best / 1e9


def _time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """6 x the MACs of every Conv2d and Linear (see the module docstring)."""
    macs = []

    def hook(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1]
            macs.append(output.numel() * module.in_channels // module.groups * k)
        elif isinstance(module, torch.nn.Linear):
            macs.append(output.numel() * module.in_features)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return 6 * sum(macs)


def c_steps(model, x, y, out_dir: Path):
    """(bound step, checked step, compile s, build s, kernels) of the generated C."""
    start = time.perf_counter()
    pkg = ub.compile(model, (x,), y, optimizer=ub.SGD(lr=LR, momentum=MOMENTUM),
                     out_dir=out_dir)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    trainer = pkg.build()
    build_s = time.perf_counter() - start
    xn, yn = x.numpy(), y.numpy()
    step = trainer.bound_step(xn, yn)
    if step() != 0:
        raise RuntimeError(f"the generated train_step of {pkg.model_name} returned an error")
    return step, lambda: trainer.step(xn, yn), compile_s, build_s, pkg.kernel_count


def torch_step(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def tvm_step(model, x, y):
    """(step, compile seconds) of TVM's own build of the training module."""
    import tvm
    from tvm import relax

    from ubitrain.lowering.fused_kernels import legalize_fused_ops
    from ubitrain.training.graph import build_training_module

    start = time.perf_counter()
    tm = build_training_module(model, (x,), y, "cross_entropy")
    main = tm.mod["main"].with_attr("global_symbol", "main")  # Gradient named it main_adjoint
    mod = tvm.IRModule({"main": main})
    for gvar, func in tm.mod.functions.items():  # kernels the gradient rules emitted
        if gvar.name_hint not in ("main", "predict"):
            mod[gvar] = func
    mod = legalize_fused_ops(mod, "float64")  # ubitrain's fused BatchNorm and loss kernels
    target = tvm.target.Target({"kind": "llvm", "mcpu": _llvm_cpu()})
    exe = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    compile_s = time.perf_counter() - start
    dev = tvm.cpu()
    label = y.numpy().astype(tm.labels_dtype)
    args = [tvm.runtime.tensor(x.numpy(), dev), tvm.runtime.tensor(label, dev)]
    args += [tvm.runtime.tensor(np.array(s.value, order="C"), dev) for s in tm.graph.state]
    if len(tm.mod["main"].params) != len(args):
        raise RuntimeError("unexpected training-module signature (dropout masks?)")
    vm.set_input("main", *args)
    return lambda: vm.invoke_stateful("main"), compile_s


def _llvm_cpu() -> str:
    import tvm
    try:
        return str(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")())
    except Exception:
        return "generic"


def measure(name: str, batch: int, root: Path, args) -> dict:
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    torch.manual_seed(0)
    model = entry.factory()
    flops = step_flops(model, x)
    row = dict(model=name, batch=batch, step_flops=flops)
    c_step, api_step, compile_s, build_s, kernels = c_steps(model, x, y, root / f"{name}_b{batch}")
    row.update(compile_seconds=compile_s, cmake_build_seconds=build_s, kernels=kernels)
    torch.manual_seed(0)
    steps = dict(c=c_step, c_step_api=api_step, torch=torch_step(entry.factory(), x, y),
                 sgemm=sgemm())
    if not args.no_tvm:
        try:
            torch.manual_seed(0)
            steps["tvm"], row["tvm_compile_seconds"] = tvm_step(entry.factory(), x, y)
        except Exception as err:  # reported, not hidden
            row["tvm_error"] = f"{type(err).__name__}: {str(err).splitlines()[-1][:200]}"
    with threadpool_limits(limits=1):
        medians = interleaved_medians(steps, args.repeat, args.warmup)
    row.update({f"{side}_seconds": t for side, t in medians.items()})
    row["c_gflops"] = flops / row["c_seconds"] / 1e9
    row["roof_gflops"] = 2 * ROOF_N**3 / row.pop("sgemm_seconds") / 1e9
    return row


def print_row(r: dict):
    tvm_s = r.get("tvm_seconds")
    tvm_txt = (f"{tvm_s * 1e3:9.3f} {tvm_s / r['c_seconds']:6.2f}x" if tvm_s
               else f"{'n/a':>9} {'':>7}")
    print(f"{r['model']:<19}{r['batch']:>4} {r['c_seconds'] * 1e3:9.3f} "
          f"{r['torch_seconds'] * 1e3:9.3f} {r['torch_seconds'] / r['c_seconds']:6.2f}x "
          f"{tvm_txt} {r['c_gflops']:7.2f} {r['roof_gflops']:6.1f} "
          f"{100 * r['c_gflops'] / r['roof_gflops']:5.1f}% "
          f"{r['compile_seconds']:7.2f} {r['cmake_build_seconds']:6.2f} "
          f"{r['c_step_api_seconds'] * 1e3:9.3f}", flush=True)
    if "tvm_error" in r:
        print(f"    TVM build failed: {r['tvm_error']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-tvm", action="store_true", help="skip TVM's build")
    parser.add_argument("--out", type=Path, default=Path("results/speed.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    roof = sgemm_roof()
    print(f"single-thread SGEMM roof (numpy {ROOF_N}x{ROOF_N} float32), best of 20 before the "
          f"run: {roof:.1f} GFLOP/s; per model, its median in the interleaved rounds")
    print(f"{'model':<19}{'b':>4} {'C ms':>9} {'torch ms':>9} {'t/C':>7} {'TVM ms':>9} "
          f"{'TVM/C':>7} {'GFLOP/s':>7} {'roof':>6} {'of roof':>6} {'compile':>7} {'cmake':>6} "
          f"{'step() ms':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for batch in args.batch:
                rows.append(measure(name, batch, Path(tmp), args))
                print_row(rows[-1])
    write_json(args.out, dict(
        machine=dict(cpu=platform.processor() or platform.machine(),
                     python=platform.python_version(), torch=torch.__version__),
        sgemm_roof_gflops=roof, repeat=args.repeat, warmup=args.warmup, rows=rows))


if __name__ == "__main__":
    main()
