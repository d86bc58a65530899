"""Snapshot the generated C of the fuzzer's seeds and of the real models, and compare two
snapshots: how a refactor shows that it leaves the C byte-identical.

    python -m tools.c_snapshot fuzz 0:1000 OUT [--jobs 2] [--traced-every 10]
                                [--disabled-from OTHER/disabled.json]
    python -m tools.c_snapshot real OUT
    python -m tools.c_snapshot int8 0:40 OUT
    python -m tools.c_snapshot compare BEFORE AFTER

Run `fuzz` and `real` with PYTHONPATH at each checkout's codegen/ (and the checkout itself,
for tools/). Per seed: variant A with every pass, B with the passes the seed switches off
(--disabled-from reuses another checkout's draw, since the draw follows the pipeline's
order), T traced (every 10th seed). Each project (without build/; weights.bin as its sha256)
is copied to OUT/<case>/<variant>/ with the compile folder's path replaced by <OUT>.
`int8`: the int8 fuzzer's seeds (their drawn NITI config) and tools/int8_models.py's nets
with each BatchNorm mode.
`compare` ignores what a relocatable project changed on purpose: model.c's weights.bin
lines, CMakeLists.txt's toolchain comment, a cross project's toolchains/, package.json.
"""

import argparse
import functools
import hashlib
import json
import multiprocessing
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path


def _imports():
    try:
        from ubitrain.fidelity.fuzz import draw_case
        from ubitrain.fidelity.graphs import instantiate
    except ImportError:  # after the refactor: the fuzzer lives in tools/
        from tools.fuzzing.case import draw_case
        from tools.fuzzing.graphs import instantiate
    return draw_case, instantiate


def _traced_compile(fn):
    try:
        from ubitrain.fidelity.sides import traced
    except ImportError:
        from ubitrain.pipeline import CallTrace
        return fn(instruments=[CallTrace()])
    return traced(fn)


def keep(project: Path, dest: Path):
    dest.mkdir(parents=True, exist_ok=True)
    names = [str(project.resolve()), str(project)]
    for f in sorted(project.rglob("*")):
        rel = f.relative_to(project)
        if f.is_dir() or rel.parts[0] == "build":
            continue
        data = f.read_bytes()
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.name == "weights.bin":
            (dest / "weights.bin.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
            continue
        for n in names:
            data = data.replace(n.encode(), b"<OUT>")
        out.write_bytes(data)


def fuzz_seed(args):
    seed, out, traced, disabled_b = (tuple(args) + (None,))[:4]
    import torch

    import ubitrain as ub

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    draw_case, instantiate = _imports()
    case = draw_case(seed)
    model = instantiate(case.graph, case.seed)
    *xs, y = case.batches(0)[0]
    trainable = list(case.trainable) if case.trainable is not None else None
    status = "ok"
    with tempfile.TemporaryDirectory() as tmp:
        b = tuple(disabled_b) if disabled_b is not None else case.disabled
        variants = [("A", ()), ("B", b)] + ([("T", ())] if traced else [])
        for variant, disabled in variants:
            d = Path(tmp) / ("A" if variant == "T" else variant)
            shutil.rmtree(d, ignore_errors=True)

            go = functools.partial(ub.compile, model, tuple(xs), y, loss=case.graph.loss,
                                   optimizer=case.optimizer, out_dir=d, trainable=trainable,
                                   disable_passes=disabled)
            try:
                _traced_compile(go) if variant == "T" else go()
            except ub.UbitrainError as err:
                status = f"{type(err).__name__}: {str(err)[:200]}"
                (Path(out) / str(seed)).mkdir(parents=True, exist_ok=True)
                (Path(out) / str(seed) / f"{variant}.error").write_text(status + "\n")
                continue
            keep(d, Path(out) / str(seed) / variant)
    return seed, status


def real(out: Path):
    import torch

    import ubitrain as ub
    try:
        from ubitrain.fidelity.real_models import REAL_MODELS, batches
    except ImportError:
        from tools.real_models import REAL_MODELS, batches
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for model in REAL_MODELS:
        for batch in model.batches:
            torch.manual_seed(0)
            net = model.make()
            *xs, y = batches(model, batch)[0]
            for variant in ("model", "traced"):
                if variant == "traced" and batch != 1:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    d = Path(tmp) / "model"

                    go = functools.partial(ub.compile, net, tuple(xs), y,
                                           optimizer=ub.SGD(**model.optimizer), out_dir=d)
                    _traced_compile(go) if variant == "traced" else go()
                    keep(d, out / f"{model.name}_b{batch}" / variant)
            print(model.name, batch, flush=True)


def int8(seeds: range, out: Path):
    import torch

    import ubitrain as ub
    from tools.fuzzing.graphs import instantiate
    from tools.fuzzing.int8_case import draw_int8_case
    from tools.int8_models import MODEL_IDS, MODELS, int8_batches
    from ubitrain.int8.update import BATCH_NORMS

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cases = {}
    for seed in seeds:
        case = draw_int8_case(seed)
        x = torch.randn(case.graph.input_shape, generator=torch.Generator().manual_seed(seed))
        y = torch.arange(x.shape[0]) % max(case.graph.outputs, 2)
        cases[f"int8_{seed}"] = (lambda c=case: instantiate(c.graph, c.seed), x, y, case.config)
    x, y = int8_batches(1)[0]
    for make, name in zip(MODELS, MODEL_IDS):
        for mode in BATCH_NORMS:
            cases[f"{name}_{mode}"] = (make, x, y, ub.NITI(batch_norm=mode))
    for name, (make, x, y, config) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            d = Path(tmp) / "model"
            try:
                ub.compile(make(), (x,), y, precision="int8", optimizer=config, out_dir=d,
                           progress=False)
            except ub.UbitrainError as err:
                (out / name).mkdir(parents=True, exist_ok=True)
                (out / name / "A.error").write_text(f"{type(err).__name__}: {err}\n")
            else:
                keep(d, out / name / "A")
        print(name, flush=True)


# ---- compare --------------------------------------------------------------------------------
WEIGHTS = re.compile(r"/\* ---- weights\.bin:.*?#endif\n", re.S)
TOOLCHAIN_COMMENT = re.compile(r"^# (A ubitrain target|[a-z0-9-]+): cmake -S \. -B build "
                               r"-DCMAKE_TOOLCHAIN_FILE=.*\n#   \(the toolchain file may set.*\n",
                               re.M)


def _normalized(rel: str, data: bytes) -> bytes:
    """What a relocatable project changed on purpose, taken out."""
    if rel.endswith("model.c"):
        return WEIGHTS.sub("<WEIGHTS>\n", data.decode(), count=1).encode()
    if rel.endswith("CMakeLists.txt"):
        return TOOLCHAIN_COMMENT.sub("", data.decode()).encode()
    if rel.endswith("ub_kernel_flags.cmake"):  # a comment names the harness's new home
        return data.replace(b"kernels/microkernels/harness.py", b"tools/microkernels/harness.py")
    return data


def _files(case: Path) -> dict[str, Path]:
    return {str(p.relative_to(case)): p for p in case.rglob("*") if p.is_file()}


def _added_on_purpose(rel: str) -> bool:
    """A file relocatable projects added: compared where both sides have it."""
    return "/toolchains/" in "/" + rel or rel.rsplit("/", 1)[-1] == "package.json"


def compare(before: Path, after: Path) -> int:
    cases = sorted(d.name for d in before.iterdir() if (after / d.name).exists())
    differ = []
    for case in cases:
        fb = _files(before / case)
        fa = {r: p for r, p in _files(after / case).items()
              if r in fb or not _added_on_purpose(r)}
        if set(fb) != set(fa):
            differ.append((case, f"files: {sorted(set(fb) ^ set(fa))[:5]}"))
            continue
        diffs = [r for r in fb if _normalized(r, fb[r].read_bytes())
                 != _normalized(r, fa[r].read_bytes())]
        if diffs:
            differ.append((case, diffs[:5]))
    print(f"{len(cases)} cases compared: {len(cases) - len(differ)} identical, "
          f"{len(differ)} differ")
    for case, what in differ[:20]:
        print(" ", case, what)
    return 1 if differ else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fuzz")
    f.add_argument("seeds")
    f.add_argument("out", type=Path)
    f.add_argument("--jobs", type=int, default=2)
    f.add_argument("--traced-every", type=int, default=10)
    f.add_argument("--disabled-from", type=Path, default=None,
                   help="JSON {seed: [passes]}: variant B's passes of another version")
    r = sub.add_parser("real")
    r.add_argument("out", type=Path)
    i = sub.add_parser("int8")
    i.add_argument("seeds")
    i.add_argument("out", type=Path)
    d = sub.add_parser("draws", help="this checkout's variant-B passes per seed, as JSON")
    d.add_argument("seeds")
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    a = p.parse_args()
    if a.what == "real":
        return real(a.out)
    if a.what == "compare":
        sys.exit(compare(a.before, a.after))
    lo, hi = map(int, a.seeds.split(":"))
    if a.what == "int8":
        return int8(range(lo, hi), a.out)
    if a.what == "draws":
        draw_case, _ = _imports()
        a.out.write_text(json.dumps({s: list(draw_case(s).disabled) for s in range(lo, hi)}))
        return
    given = json.loads(a.disabled_from.read_text()) if a.disabled_from else {}
    work = [(s, str(a.out), s % a.traced_every == 0, given.get(str(s))) for s in range(lo, hi)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(a.jobs, maxtasksperchild=20) as pool:
        for seed, status in pool.imap_unordered(fuzz_seed, work):
            print(seed, status, flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
