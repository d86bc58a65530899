"""package.json: what a trainer needs to know of a compiled project, beside its C.

`ub.compile` writes it last into the project's directory (`write_manifest`), so that the
directory alone (C sources, weights.bin, runtime_c/, package.json) is the model: copied to
another folder or machine, `ub.load_package(dir)` (api.py) gives a Package whose `build()`
builds and loads it there, with no pickle and no compiler state. A fleet's clients receive
their model this way (fleet/packages.py).

The manifest holds the model's name (the C symbols' prefix), target and precision; the
inputs', labels' and output's names, shapes and dtypes; the classes; the trainable names;
the state tensors (name, kind, dtype, shape; the library's own tensor table stays what the
trainers read); the arena's sizes and alignment; whether the step pages tensors; an int8
model's weights, NITI state size and schedule; and a SHA-256 of every file of the project,
which `load_package` checks, so that a project copied in part, or edited, is refused
rather than built into a trainer that disagrees with its manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from ..errors import UbitrainError

MANIFEST = "package.json"
FORMAT = "ubitrain.package"
VERSION = 2  # 2: an int8 package lists its integer parameters
STATE_KINDS = ("parameter", "buffer", "optimizer_state")


def _slot(slot) -> dict:
    bound = slot.index_bound
    return {"name": slot.name, "shape": [int(d) for d in slot.shape], "dtype": str(slot.dtype),
            "index_bound": None if bound is None else int(bound)}


def _state_tensors(package) -> list[dict]:
    """The state slots of the package's programs (a frozen tensor kept in flash is a
    constant there, under its state_dict name)."""
    trained = {t.split("[", 1)[0] for t in package.trainable}
    frozen = set(package.frozen_in_flash)
    rows, seen = [], set()
    for program in package.programs.values():
        for slot in program.slots():
            root = slot.root
            name = root.label or root.name
            if id(root) in seen or not (root.kind in STATE_KINDS or
                                        (root.kind == "constant" and name in frozen)):
                continue
            seen.add(id(root))
            rows.append({"name": name, "kind": root.kind if root.kind != "constant" else
                         "frozen", "dtype": str(root.dtype),
                         "shape": [int(d) for d in root.shape], "trainable": name in trained})
    return rows


def project_files(out_dir: Path) -> list[Path]:
    """The files of a generated project, relative to it: everything but the build
    directories (build/, build-<target>/) and the manifest itself."""
    out_dir = Path(out_dir)
    files = []
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir)
        if path.is_file() and not rel.parts[0].startswith("build") and rel.name != MANIFEST:
            files.append(rel)
    return files


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_of(package) -> dict:
    plan = package.memory_plan
    data = {
        "format": FORMAT, "version": VERSION,
        "model_name": package.model_name, "target": package.target.name,
        "precision": getattr(package, "precision", "fp32"),
        "inputs": [_slot(s) for s in package.inputs], "labels": _slot(package.labels),
        "output": _slot(package.output),
        "classes": None if package.classes is None else int(package.classes),
        "trainable": list(package.trainable), "tensors": _state_tensors(package),
        "frozen_in_flash": list(package.frozen_in_flash), "aliases": dict(package.aliases),
        "memory_plan": {k: int(getattr(plan, k)) for k in (
            "arena_bytes", "lower_bound_bytes", "persistent_bytes", "alignment",
            "micro_batches")},
        "pages": int(package.pages),
        "kernel_count": int(package.kernel_count),
    }
    if data["precision"] == "int8":
        data["int8"] = {
            "parameters": list(package.integer_parameters),
            "niti": dataclasses.asdict(package.config),
            "dsp_offload": package.segments is not None}
    return data


def write_manifest(package) -> Path:
    """`package.json` in the package's project directory: the manifest and the digests of
    the project's files as they are now (call it after the project is written)."""
    out_dir = Path(package.out_dir)
    data = manifest_of(package)
    data["files"] = {str(rel): _digest(out_dir / rel) for rel in project_files(out_dir)}
    path = out_dir / MANIFEST
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def read_manifest(out_dir) -> dict:
    """The manifest of the project in `out_dir`, checked: its format and version, and every
    file it lists present with its digest."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.is_file():
        raise UbitrainError(f"{str(out_dir)!r} holds no {MANIFEST}: give the directory "
                           "ub.compile wrote (its out_dir), copied whole")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UbitrainError(f"{path} is not a readable manifest ({err}); copy the project "
                           "again from where it was compiled") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UbitrainError(f"{path} is not a ubitrain package manifest")
    if data.get("version") != VERSION:
        raise UbitrainError(f"{path} is manifest version {data.get('version')}; this ubitrain "
                           f"reads version {VERSION}: recompile the model with it")
    bad = [rel for rel, digest in data.get("files", {}).items()
           if not (out_dir / rel).is_file() or _digest(out_dir / rel) != digest]
    if bad:
        raise UbitrainError(f"{out_dir}: {len(bad)} file(s) of the project are missing or "
                           f"differ from what was compiled ({', '.join(bad[:3])}"
                           f"{', ...' if len(bad) > 3 else ''}); copy the whole project again")
    return data

