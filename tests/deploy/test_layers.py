"""The layering of docs/design.md, checked by import-linter's contracts in pyproject.toml.

import-linter's graph builder walks a package's own directory, and this repository maps its
folders into `specdec` with setuptools' package-dir; so the check runs on the tree as installed:
the Python files staged under one `specdec/`, exactly as the package-dir table places them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stage_installed_tree(out: Path) -> Path:
    """Copy every package's .py files to where an install puts them; returns the staged root."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools["package-dir"]
    for package in setuptools["packages"]:
        # The longest mapped prefix owns the package (specdec.coordinator lies under coordinator/).
        prefix = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
        source = ROOT / package_dir[prefix] / Path(*package[len(prefix) :].split(".")[1:])
        target = out / Path(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for py in source.glob("*.py"):
            shutil.copy2(py, target / py.name)
    return out


def test_every_package_is_declared(tmp_path):
    """A folder with an __init__.py that the packages list misses would not be installed."""
    staged = stage_installed_tree(tmp_path)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for top, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([top, *rel.parts])
            assert name in setuptools["packages"], f"{init.parent} holds a package that pyproject.toml does not list"
    assert (staged / "specdec" / "coordinator" / "engine.py").is_file()


def test_layers_hold(tmp_path):
    staged = stage_installed_tree(tmp_path)
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(staged)}
    proc = subprocess.run(
        [str(lint), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=staged,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: " in proc.stdout and " broken" in proc.stdout  # the contracts ran


def test_every_package_names_a_public_face_that_resolves():
    """Each package's __init__ lists its public names; each must import from the module it names."""
    import importlib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    faces = 0
    for name in setuptools["packages"]:
        package = importlib.import_module(name)
        assert package.__doc__, f"{name}/__init__.py says nothing of what the package is"
        for public in getattr(package, "__all__", ()):
            assert getattr(package, public) is not None, f"{name}.{public}"
            faces += 1
    assert faces > 50


def test_light_modules_stay_light():
    """A package's public face is imported on first use: the CLI's flag machinery loads no torch."""
    code = "import sys, specdec.cli.config_flags; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
