"""The image's install steps and the chart's generated copies.

No image can be built here, so the Dockerfile keeps every install step in
scripts/install-runtime, and this runs that script the way the Dockerfile does: into a
fresh venv, from a build context holding exactly what the Dockerfile copies.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from gpuledger import __version__
from tests.helm.chart import CHART, REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
INSTALL_RUNTIME = REPO / "scripts" / "install-runtime"
SYNC_CHART = REPO / "scripts" / "sync-chart"
TEST_ONLY = {"ray", "pytest", "jsonnet", "hypothesis", "ruff", "mypy", "grpcio-tools"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _build_stage_copies() -> list[tuple[str, str]]:
    """(source, destination) of the COPY instructions of the build stage (before the 2nd FROM)."""
    copies = []
    stages = 0
    for word, rest in _instructions():
        if word == "FROM":
            stages += 1
            continue
        if word == "COPY" and stages == 1:
            parts = rest.split()
            *sources, destination = parts
            copies += [(source, destination) for source in sources]
    return copies


def test_dockerfile_installs_only_through_install_runtime() -> None:
    instructions = _instructions()
    runs = [rest for word, rest in instructions if word == "RUN"]
    assert runs == ["scripts/install-runtime /opt/gpuledger /src"]
    text = DOCKERFILE.read_text()
    assert "pip install" not in text and "apt-get" not in text


def test_dockerfile_final_stage_is_non_root_and_runs_the_exporter() -> None:
    instructions = _instructions()
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    assert ("ENTRYPOINT", '["gpuledger"]') in final
    assert ("CMD", '["serve"]') in final
    # Only the venv comes over from the build stage: no source tree, no compiler.
    copies = [rest for word, rest in final if word == "COPY"]
    assert copies == ["--from=build /opt/gpuledger /opt/gpuledger"]


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics for the patterns used there: last match wins, ! re-includes."""
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.removeprefix("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes) or (
            pattern.startswith("**/") and any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        ):
            ignored = not negate
    return ignored


def test_dockerignore_lets_through_what_the_dockerfile_copies() -> None:
    patterns = _dockerignore()
    for source, _ in _build_stage_copies():
        assert not _ignored(source.rstrip("/"), patterns), source
    for kept_out in (".venv", "tests/helm/test_packaging.py", ".git", "helm/gpuledger/Chart.yaml"):
        assert _ignored(kept_out, patterns), kept_out
    # No simulator in the image: its fakes, scenarios and the fake NVML's C source stay out.
    for kept_out in ("exporter/gpuledger/sim", "exporter/gpuledger/sim/fake_nvml.c"):
        assert _ignored(kept_out, patterns), kept_out
    assert not _ignored("exporter/gpuledger/sources/nvml.py", patterns)


def _dockerignore() -> list[str]:
    return [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _build_context(tmp: Path) -> Path:
    """What the Dockerfile's build stage holds in its WORKDIR (/src): its COPY sources only,
    less what .dockerignore keeps out of the context, placed as COPY places them (a
    directory's contents into the destination directory; a file into a destination ending
    in / or . by its own name, else at the destination)."""
    src = tmp / "src"
    src.mkdir()
    patterns = _dockerignore()

    def ignore(folder: str, names: list[str]) -> set[str]:
        where = Path(folder).resolve().relative_to(REPO).as_posix()
        return {n for n in names if _ignored(f"{where}/{n}", patterns)}

    for source, destination in _build_stage_copies():
        origin = REPO / source
        into_dir = destination.endswith("/") or destination in (".", "./")
        dest = src / destination.rstrip("/") if destination not in (".", "./") else src
        if origin.is_dir():
            shutil.copytree(origin, dest, ignore=ignore, dirs_exist_ok=True)
            continue
        target = dest / origin.name if into_dir else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, target)
    return src


def _clean_env() -> dict[str, str]:
    """The caller's environment (pip's index settings, proxies) without anything that would
    let the fresh venv import the source tree instead of what it installed."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env["PYTHON"] = sys.executable
    return env


def test_install_runtime_into_a_fresh_venv(tmp_path: Path) -> None:
    src = _build_context(tmp_path)
    assert (src / "scripts" / "install-runtime").is_file()
    venv = tmp_path / "venv"
    result = subprocess.run(
        [str(src / "scripts" / "install-runtime"), str(venv), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_clean_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr

    version = subprocess.run(
        [str(venv / "bin" / "gpuledger"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
        cwd=tmp_path,
    )
    assert version.stdout.strip() == f"gpuledger {__version__}"
    imported = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import gpuledger.cli; print(gpuledger.cli.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
        cwd=tmp_path,
    )
    assert imported.stdout.strip().startswith(str(venv)), imported.stdout
    # The image has no simulator: no sim/ module installed, and demo says where to run it.
    assert not list(venv.rglob("gpuledger/sim"))
    assert not list(venv.rglob("fake_nvml*"))
    demo = subprocess.run(
        [str(venv / "bin" / "gpuledger"), "demo", "--once"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=_clean_env(),
        cwd=tmp_path,
    )
    assert demo.returncode == 2, demo.stdout[-2000:] + demo.stderr
    assert "simulator is not installed here" in demo.stderr
    assert "scripts/demo" in demo.stderr
    assert "Traceback" not in demo.stderr

    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {_normalise(p["name"]) for p in json.loads(listing.stdout)}
    assert not installed & TEST_ONLY, sorted(installed & TEST_ONLY)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {
        _normalise(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }
    assert runtime <= installed, sorted(runtime - installed)
    # The extras' own packages are test-only by definition.
    for extra in ("test", "dev", "gen"):
        for dep in project.get("optional-dependencies", {}).get(extra, []):
            name = _normalise(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0])
            if name not in runtime:
                assert name not in installed, f"{name} of the [{extra}] extra is in the image"


def test_a_plain_pip_install_runs_the_demo(tmp_path: Path) -> None:
    # Outside the image, `pip install gpuledger` (here: of this checkout, as a wheel would
    # be built) carries the simulator: its C source, scenarios and PyYAML came along.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_clean_env())
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_clean_env(),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    demo = subprocess.run(
        [str(venv / "bin" / "gpuledger"), "demo", "--once"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**_clean_env(), "GPULEDGER_CACHE_DIR": str(tmp_path / "cache")},
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stderr
    nvml_up = re.compile(r'^gpuledger_source_up\{[^}]*source="nvml"[^}]*\} 1(\.0)?$', re.M)
    assert nvml_up.search(demo.stdout), demo.stdout[-2000:]


def test_install_runtime_refuses_an_existing_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(INSTALL_RUNTIME), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "already exists" in result.stderr


# --- the chart's copies of the mixin's rendered files -----------------------------------------


def test_chart_copies_of_rules_and_dashboards_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(SYNC_CHART), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{result.stderr}(run scripts/sync-chart)"


def test_chart_copies_equal_the_mixin_files() -> None:
    files = CHART / "files"
    sources = sorted((REPO / "mixin" / "rendered" / "dashboards").glob("*.json"))
    assert sources
    assert sorted(p.name for p in (files / "dashboards").glob("*.json")) == [
        p.name for p in sources
    ]
    for source in sources:
        assert (files / "dashboards" / source.name).read_bytes() == source.read_bytes()
    copy = (files / "rules" / "gpuledger.rules.yaml").read_text()
    source_rules = (REPO / "mixin" / "rendered" / "gpuledger.rules.yaml").read_text()
    assert copy.startswith("# Copied by scripts/sync-chart")
    assert copy.endswith(source_rules)
    assert yaml.safe_load(copy) == yaml.safe_load(source_rules)


def test_sync_chart_reports_and_repairs_a_stale_copy(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for part in ("mixin/rendered/gpuledger.rules.yaml", "scripts/sync-chart"):
        (repo / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / part, repo / part)
    dashboards = repo / "mixin" / "rendered" / "dashboards"
    shutil.copytree(REPO / "mixin" / "rendered" / "dashboards", dashboards)
    shutil.copytree(CHART / "files", repo / "helm" / "gpuledger" / "files")
    script = [sys.executable, str(repo / "scripts" / "sync-chart")]

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, "--check"], capture_output=True, text=True, check=False)

    subprocess.run(script, capture_output=True, check=True)
    assert check().returncode == 0
    # The mixin changes (a dashboard edited, one added, one removed): --check notices.
    first, *_ = sorted(dashboards.glob("*.json"))
    first.write_text(first.read_text().replace('"gpuledger"', '"gpuledger-changed"', 1))
    (dashboards / "gpuledger-new.json").write_text("{}\n")
    removed = sorted(dashboards.glob("*.json"))[-1]
    removed.unlink()
    stale = check()
    assert stale.returncode == 1
    assert "out of date" in stale.stderr and "missing" in stale.stderr
    assert "no longer rendered" in stale.stderr
    # Rerunning the script is all it takes.
    subprocess.run(script, capture_output=True, check=True)
    assert check().returncode == 0
    copies = repo / "helm" / "gpuledger" / "files" / "dashboards"
    assert (copies / "gpuledger-new.json").read_text() == "{}\n"
    assert not (copies / removed.name).exists()


@pytest.mark.parametrize("major", ["3", "4"])
def test_get_helm_gives_the_pinned_versions(major: str) -> None:
    from tests.helm.chart import helm_binary

    result = subprocess.run(
        [helm_binary(major), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith({"3": "v3.18.", "4": "v4."}[major])
