"""The wheel a user installs: ``maturin build --release`` gives an abi3 manylinux wheel that
carries the demo's data set, and it runs in a fresh venv on a PATH without ``cargo`` or
``rustc``: ``gnl demo`` on its packaged CSV, and a short enqueue/drain script.

The build reuses the repository's ``target/`` (``make build`` has just built the same crate with
the same profile and features), so it only packs the wheel. The sdist is checked for the files
its build needs (building it would be a cold Rust build, ~8 CPU minutes; docs/DECISIONS.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
MATURIN = Path(sys.executable).parent / "maturin"
PACKAGED_CSV = ROOT / "python" / "gnl" / "demo_data" / "airports.csv"
TOOLCHAIN = ("cargo", "rustc")


def _run(
    args: list[str | Path], *, timeout: float, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def _path_without_toolchain() -> str:
    """The current PATH less every directory that holds ``cargo`` or ``rustc``."""
    kept = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any((Path(d) / tool).exists() for tool in TOOLCHAIN)
    ]
    return os.pathsep.join(kept)


@dataclass(frozen=True)
class Installed:
    """A fresh venv with the built wheel installed, and the environment to run it in."""

    wheel: Path
    venv: Path
    env: dict[str, str]
    cwd: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([MATURIN, "build", "--release", "--quiet", "--out", out], cwd=ROOT, timeout=840)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel-venv")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=120)
    path = os.pathsep.join([str(venv / "bin"), _path_without_toolchain()])
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")
        and not k.startswith(("CARGO", "RUSTUP", "MATURIN"))
    }
    env.update(PATH=path, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    for tool in TOOLCHAIN:
        assert shutil.which(tool, path=path) is None, f"{tool} is still on the test's PATH"
    # Binary packages only: nothing in this install may be compiled.
    _run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--only-binary=:all:", wheel],
        env=env,
        cwd=base,
        timeout=300,
    )
    yield Installed(wheel, venv, env, base)


def test_wheel_is_abi3_manylinux_and_carries_the_demo_csv(wheel: Path) -> None:
    # name-version-python-abi-platform: one wheel for every CPython >= 3.10.
    m = re.fullmatch(r"gnl-([^-]+)-cp310-abi3-(manylinux_(\d+)_(\d+)_\w+)\.whl", wheel.name)
    assert m, f"{wheel.name}: not a cp310-abi3 manylinux wheel"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "gnl/_native.abi3.so" in names
        assert "gnl/demo_data/airports.csv" in names
        assert z.read("gnl/demo_data/airports.csv") == PACKAGED_CSV.read_bytes()
        # Studio's templates and vendored files are package data too.
        for f in ("static/htmx.min.js", "static/htmx.LICENSE", "templates/base.html"):
            assert f"gnl/studio/{f}" in names, f
        metadata = z.read(f"gnl-{m.group(1)}.dist-info/METADATA").decode()
        wheel_info = z.read(f"gnl-{m.group(1)}.dist-info/WHEEL").decode()
    assert "Requires-Python: >=3.10" in metadata
    assert "Provides-Extra: studio" in metadata
    assert f"Tag: cp310-abi3-{m.group(2)}" in wheel_info


def test_the_manylinux_tag_is_honest(wheel: Path, tmp_path: Path) -> None:
    # manylinux_2_X promises a glibc of 2.X or later is enough: the native module may need no
    # symbol version newer than that (the policy pip trusts when it picks this wheel).
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not on this machine")
    m = re.search(r"-manylinux_(\d+)_(\d+)_", wheel.name)
    assert m, wheel.name
    tag = (int(m.group(1)), int(m.group(2)))
    with zipfile.ZipFile(wheel) as z:
        so = tmp_path / "_native.abi3.so"
        so.write_bytes(z.read("gnl/_native.abi3.so"))
    symbols = _run([objdump, "-T", so], timeout=120).stdout
    needed = {(int(a), int(b)) for a, b in re.findall(r"\bGLIBC_(\d+)\.(\d+)(?:\.\d+)?\b", symbols)}
    assert needed, "no versioned glibc symbol found: objdump's output changed?"
    assert max(needed) <= tag, f"{wheel.name} needs GLIBC_{max(needed)} beyond its tag {tag}"


def test_installed_wheel_has_no_toolchain_and_is_not_the_source_tree(
    installed: Installed,
) -> None:
    probe = (
        "import json, shutil, gnl, gnl.demo\n"
        "print(json.dumps({'tools': [shutil.which(t) for t in ('cargo', 'rustc')],\n"
        "  'gnl': gnl.__file__, 'csv': str(gnl.demo.default_csv())}))\n"
    )
    out = _run([installed.python, "-c", probe], env=installed.env, cwd=installed.cwd, timeout=60)
    seen = json.loads(out.stdout)
    assert seen["tools"] == [None, None]
    site = installed.venv.resolve()
    assert Path(seen["gnl"]).resolve().is_relative_to(site), seen["gnl"]
    assert Path(seen["csv"]).resolve().is_relative_to(site), seen["csv"]


def test_installed_wheel_runs_gnl_demo_on_its_packaged_csv(installed: Installed) -> None:
    db = installed.cwd / "demo.db"
    # No --csv: the packaged airports.csv. --work-ms 2 keeps it short; the crash stays on.
    out = _run(
        [installed.venv / "bin" / "gnl", "demo", "--url", f"sqlite:///{db}", "--work-ms", "2"],
        env={**installed.env, "COLUMNS": "200"},
        cwd=installed.cwd,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert "3,376 rows from " in text and "airports.csv" in text, text[-2000:]
    assert "OK: every row imported exactly once (3,376 rows, 0 written twice)" in text, text[-2000:]
    # Not a terminal: progress as whole log lines (no live bar cut at the line's width).
    assert "imported 3,376 of 3,376 rows" in text, text[-2000:]
    assert "importing rows" not in text, text[-2000:]
    assert db.is_file()


SCRIPT = """
import asyncio, json, sys
import gnl

async def main(url):
    async def double(payload, ctx):
        return {"n": payload["n"] * 2}

    async with await gnl.connect(url) as storage:
        await gnl.enqueue(storage.work, "double", {"n": 0}, id="first")
        await gnl.enqueue_many(storage.work, [
            {"type": "double", "payload": {"n": i}, "options": {"org_id": f"org-{i % 3}"}}
            for i in range(1, 31)
        ])
        drained = await gnl.create_worker(storage, {"double": double}, concurrency=4).drain()
        jobs, cursor = [], None
        while True:
            page = await gnl.list_all_jobs(storage.work, limit=7, cursor=cursor)
            jobs += page.items
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    print(json.dumps({
        "drained": [drained.processed, drained.succeeded, drained.failed],
        "states": sorted({j.state for j in jobs}),
        "results": sorted(j.result["n"] for j in jobs),
    }))

asyncio.run(main(sys.argv[1]))
"""


def test_installed_wheel_enqueues_and_drains(installed: Installed) -> None:
    db = installed.cwd / "drain.db"
    out = _run(
        [installed.python, "-c", SCRIPT, f"sqlite:///{db}"],
        env=installed.env,
        cwd=installed.cwd,
        timeout=120,
    )
    seen = json.loads(out.stdout)
    assert seen == {
        "drained": [31, 31, 0],
        "states": ["done"],
        "results": [2 * n for n in range(31)],
    }


def test_sdist_carries_what_the_wheel_build_needs(tmp_path: Path) -> None:
    _run([MATURIN, "sdist", "--out", tmp_path], cwd=ROOT, timeout=300)
    (sdist,) = tmp_path.glob("gnl-*.tar.gz")
    prefix = sdist.name.removesuffix(".tar.gz")
    needed = [ROOT / "Cargo.toml", ROOT / "Cargo.lock", ROOT / "pyproject.toml"]
    for top in ("rust", "python/gnl"):
        needed += [
            p
            for p in sorted((ROOT / top).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".so")
        ]
    assert PACKAGED_CSV in needed and any("migrations" in p.parts for p in needed)
    with tarfile.open(sdist) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        missing = [
            str(p.relative_to(ROOT))
            for p in needed
            if f"{prefix}/{p.relative_to(ROOT)}" not in members
        ]
        assert not missing, f"the sdist lacks {missing}"
        for p in needed:
            f = tar.extractfile(members[f"{prefix}/{p.relative_to(ROOT)}"])
            assert f is not None
            data = f.read()
            if p.name == "Cargo.toml":
                # maturin writes the manifest it packs; it must still be this crate.
                assert b'name = "gnl"' in data
            else:
                assert data == p.read_bytes(), f"{p.relative_to(ROOT)} differs in the sdist"
