"""The packages import only the layers below them (pyproject.toml, [tool.importlinter]): the
import graph has no cycle, and a newcomer reads the compiler from the bottom up."""

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_imports_follow_the_declared_layers(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"))
    assert status == 0, capsys.readouterr().out[-4000:]
