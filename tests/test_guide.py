"""Every Python example of the user guide runs (docs/, built by ``make docs``).

Each fenced ```` ```python ```` block of a guide page is a whole program, as a reader would
paste it: it runs here as ``__main__`` in a fresh namespace, in an empty temporary working
directory (so ``sqlite:///jobs.db`` is a new store), with ``GNL_URL`` unset. A block that reads
``GNL_URL`` also runs once per backend with ``GNL_URL`` pointing at a fresh store of it. A failing
example fails the suite; its traceback names the page and the page's line.

A ``print(...)  # => TEXT`` line states what the example prints: the run's output must hold
each such ``TEXT`` as a whole line, in the order of the code (a print in a loop may print more
lines between them). Other comments after a ``print`` describe the output and are not checked.

Other fences (``console``, ``text``, ``toml``) are not run: keep Python in ``python`` blocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Internal notes that live in docs/ but are not guide pages.
NOT_GUIDE = {"STATUS.md"}

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)$")


@dataclass(frozen=True)
class Example:
    """One ```python block: its page, the line of its opening fence, its code."""

    page: str
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def examples_of(path: Path) -> list[Example]:
    """The ```python blocks of a Markdown file, dedented (blocks may sit in admonitions)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].split()
        close = re.compile(rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: a code fence that is never closed")
        if info and info[0] in ("python", "py"):
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
            # Line numbers in tracebacks are the page's own.
            found.append(Example(path.name, i + 1, "\n" * (i + 1) + "\n".join(body) + "\n"))
        i = j + 1
    return found


PAGES = sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_GUIDE)
EXAMPLES = [e for p in PAGES for e in examples_of(p)]
URL_EXAMPLES = [e for e in EXAMPLES if "GNL_URL" in e.code]


_STATED = re.compile(r"^\s*print\(.*\)  # => (?P<text>.*)$")


def stated_output(example: Example) -> list[str]:
    """The ``# => TEXT`` of the example's ``print`` lines, in the order of the code."""
    return [m["text"].rstrip() for ln in example.code.splitlines() if (m := _STATED.match(ln))]


def run_example(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    code = compile(example.code, str(DOCS / example.page), "exec")
    exec(code, {"__name__": "__main__", "__file__": str(DOCS / example.page)})
    printed = [ln.rstrip() for ln in capsys.readouterr().out.splitlines()]
    at = 0
    for want in stated_output(example):
        while at < len(printed) and printed[at] != want:
            at += 1
        assert at < len(printed), (
            f"{example.id}: the page says it prints {want!r}; it printed {printed!r}"
        )
        at += 1


@pytest.fixture
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GNL_URL", raising=False)
    return tmp_path


def test_the_guide_has_examples() -> None:
    # An extractor that found nothing would make the tests below pass by not existing.
    assert len(EXAMPLES) >= 15, [e.id for e in EXAMPLES]
    assert URL_EXAMPLES, "no example reads GNL_URL: the engine page's example is gone"


def test_stated_output_is_read_from_print_lines() -> None:
    ex = Example("p.md", 1, "print(1)  # => 1\nprint(x)  # the clock\n    print(a, b)  # => a b\n")
    assert stated_output(ex) == ["1", "a b"]
    # Some pages state what they print: a checker that read none would check nothing.
    assert sum(len(stated_output(e)) for e in EXAMPLES) >= 10


def test_the_extractor_reads_fences_as_markdown_does(tmp_path: Path) -> None:
    page = tmp_path / "fences.md"
    text = (
        "```python\nx = 1\n```\n\n"
        "````md\n```python\nnot_a_block()\n```\n````\n\n"
        '!!! note\n    ```python title="t.py"\n    y = 2\n    ```\n\n'
        "```console\n$ gnl demo\n```\n"
    )
    page.write_text(text, encoding="utf-8")
    found = examples_of(page)
    assert [(e.line, e.code.strip()) for e in found] == [(1, "x = 1"), (12, "y = 2")]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_guide_example_runs(
    example: Example, in_tmp_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_example(example, capsys)


@pytest.mark.parametrize("example", URL_EXAMPLES, ids=lambda e: e.id)
def test_guide_example_runs_on_each_backend(
    example: Example,
    store_url: Callable[[], str],
    in_tmp_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GNL_URL", store_url())
    run_example(example, capsys)
