"""The documentation: the site builds without a warning, and the Markdown stays self-contained."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# Text that narrates the project's own history, or points at documents outside the repository.
FORBIDDEN = re.compile(
    r"\bsessions?\b|design notes|design document|\.\./shared|previous release|has only begun",
    re.IGNORECASE,
)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life banner
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not [line for line in output.splitlines() if "WARNING" in line], output
    assert (tmp_path / "site" / "index.html").is_file()


def test_markdown_is_self_contained() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for command in (
        "bash scripts/setup.sh && .venv/bin/nopelab reproduce chi2023",
        "bash scripts/test.sh",
    ):
        assert command in readme  # CI and the docs' home page rely on the README's two commands
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).is_file(), f"README.md links to a missing file: {target}"
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in markdown_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_every_command_has_a_generated_reference() -> None:
    """docs/ holds an options table, generated from the command line, for every command; the
    generated table lists every option the command has."""
    import typer.main

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mkdocs_hooks import options_table
    finally:
        sys.path.pop(0)
    from nopelab.cli import app

    pages = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for name, command in typer.main.get_command(app).commands.items():
        assert f"<!-- options: {name} -->" in pages, name
        table = options_table(name)
        for param in command.params:
            if param.param_type_name == "option" and param.name != "help":
                assert f"`{param.opts[0]}`" in table, (name, param.opts[0])


def test_the_code_layout_names_every_module() -> None:
    """docs/contributing.md's code layout names every module, but the commands' and the
    reproduced parts' own (it names those as kinds)."""
    from nopelab.experiments import EXPERIMENTS

    text = (ROOT / "docs" / "contributing.md").read_text()
    layout = text.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    parts = {
        part.run.__module__ for e in EXPERIMENTS.values() for part in e.parts.values()
    }  # one module per paper and part
    package = ROOT / "src" / "nopelab"
    missing = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(("nopelab", *path.relative_to(package).with_suffix("").parts))
        command = path.parent.name == "cli" and "@app.command" in path.read_text()
        if path.stem.startswith("__") or command or module in parts:
            continue
        names = (f"`{path.name}`", f"`{path.stem}.", f"`{path.relative_to(package)}`")
        if not any(name in layout for name in names):
            missing.append(str(path.relative_to(package)))
    assert not missing, f"docs/contributing.md's code layout does not name {missing}"


def fenced(page: Path, language: str) -> list[str]:
    """The fenced ``language`` blocks of a Markdown page."""
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.S | re.M)


def test_the_cluster_blocks_of_the_sweeps_page_are_well_formed(tmp_path: Path) -> None:
    """The SLURM script is valid bash; the KubeRay manifest is a RayCluster whose fields have
    the types KubeRay's resource takes (``rayStartParams`` values are strings, counts integers),
    with a head that runs no cells and the Ray Client port open."""
    import yaml

    page = ROOT / "docs" / "sweeps.md"
    (slurm,) = [b for b in fenced(page, "bash") if "#SBATCH" in b]
    script = tmp_path / "sweep.sbatch"
    script.write_text(slurm)
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert '--address "$head_ip:6379"' in slurm

    (manifest,) = [yaml.safe_load(b) for b in fenced(page, "yaml")]
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCluster")
    spec = manifest["spec"]
    head, workers = spec["headGroupSpec"], spec["workerGroupSpecs"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    for group in [head, *workers]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        (container,) = group["template"]["spec"]["containers"]
        assert isinstance(container["name"], str) and isinstance(container["image"], str)
        for side in ("requests", "limits"):
            assert set(container["resources"][side]) == {"cpu", "memory"}
    ports = {
        p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]
    }
    assert ports == {"gcs-server": 6379, "client": 10001}
    for group in workers:
        assert isinstance(group["groupName"], str)
        assert all(isinstance(group[k], int) for k in ("replicas", "minReplicas", "maxReplicas"))
    (apply,) = [b for b in fenced(page, "bash") if "kubectl apply" in b]
    assert f"service/{manifest['metadata']['name']}-head-svc 10001:10001" in apply
