"""The one-turn examples of docs/other-languages.md are files of the repository, each run by a test.

- Every fenced block right after a line ``<!-- example: PATH -->`` (in README.md or docs/*.md)
  is the file PATH, byte for byte but for trailing whitespace at the end.
- The section "One turn, in each language" has one subsection per language, in LANGUAGES order;
  each holds exactly one fenced block, and that block is an example. REQUIRED_LANGUAGES must all
  be there.
- Each example is run: a test or build script (a file under clients/ or tests/, dev.sh, .ci/)
  names it, by its file name without the extension, as a word; so a renamed example whose runner
  still names the old file fails here. A Go example instead is a ``_test.go`` file whose Example
  function has an ``// Output:`` comment (without one, go test compiles it but never runs it), in
  a module dev.sh runs go test in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGE = Path("docs/other-languages.md")
SECTION = "One turn, in each language"
LANGUAGES = ("TypeScript", "Python", "Rust", "Go", "Java")
# The languages whose example has landed; each client's change adds its own.
REQUIRED_LANGUAGES = ("TypeScript", "Python", "Rust", "Go", "Java")

MARKER = re.compile(r"<!-- example: (\S+) -->")
FENCE = re.compile(r"(`{3,}|~{3,})")
# Where the tests and the scripts that run the examples live; builds and dependencies are skipped.
RUNNER_PLACES = ("clients", "tests", "dev.sh", ".ci")
NOT_RUNNERS = {"node_modules", "target", "build", "dist", ".venv", "__pycache__", "contextsidecarv1"}


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its text, the line its fence opens on, the example it names (the
    marker on the line before, or ""), and the subsection of SECTION it is in (or "")."""

    text: str
    line: int
    example: str
    language: str


def scan(page: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a page, and the subsections of SECTION in order (a heading inside a
    fenced block is code, not a heading)."""
    lines = page.splitlines()
    found, headings, section, heading, at = [], [], "", "", 0
    while at < len(lines):
        line = lines[at]
        if line.startswith("## "):
            section, heading = line[3:].strip(), ""
        elif line.startswith("### "):
            heading = line[4:].strip()
            if section == SECTION:
                headings.append(heading)
        opening = FENCE.match(line)
        if not opening:
            at += 1
            continue
        fence, start = opening.group(1), at
        at += 1
        while at < len(lines) and lines[at].rstrip() != fence:
            at += 1
        marker = MARKER.fullmatch(lines[start - 1].strip()) if start else None
        found.append(Block(text="".join(f"{text}\n" for text in lines[start + 1:at]), line=start + 1,
                           example=marker.group(1) if marker else "",
                           language=heading if section == SECTION else ""))
        at += 1
    return found, headings


def runner_texts(root: Path) -> dict[Path, str]:
    """Every text file a test or a build script may name an example in."""
    texts = {}
    for place in RUNNER_PLACES:
        top = root / place
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if path.is_file() and path.suffix != ".md" and not NOT_RUNNERS.intersection(path.parts):
                try:
                    texts[path.relative_to(root)] = path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue  # not a text file
    return texts


def go_example_runs(root: Path, example: Path, text: str) -> bool:
    """A _test.go file go test runs and checks: an Example with Output, in a module dev.sh tests."""
    if not example.name.endswith("_test.go") or not re.search(r"^func Example\w*\(\)[\s\S]*^\s*// Output:", text,
                                                               re.MULTILINE):
        return False
    module = next((folder for folder in example.parents if (root / folder / "go.mod").is_file()), None)
    dev = root / "dev.sh"
    return module is not None and dev.is_file() and any(
        f"cd {module.as_posix()} " in line and "go test" in line for line in dev.read_text().splitlines())


def problems(root: Path, page_path: Path, required: tuple[str, ...]) -> list[str]:
    """What is wrong with the examples of page_path (relative to root), none when all is well."""
    page = (root / page_path).read_text(encoding="utf-8")
    found, headings = scan(page)
    wrong = []
    for language in headings:
        if language not in LANGUAGES:
            wrong.append(f"### {language}: not one of {', '.join(LANGUAGES)}")
    known = [language for language in headings if language in LANGUAGES]
    if known != sorted(set(known), key=LANGUAGES.index):
        wrong.append(f"the subsections are {', '.join(headings)}: each once, in the order {', '.join(LANGUAGES)}")
    for language in required:
        if language not in headings:
            wrong.append(f"### {language}: missing from {SECTION!r}")
    for language in headings:
        theirs = [block for block in found if block.language == language]
        if len(theirs) != 1 or not theirs[0].example:
            wrong.append(f"### {language}: {len(theirs)} fenced blocks; it needs exactly one, an example "
                         "(the line before its fence `<!-- example: PATH -->`)")
    runners = None
    for block in found:
        if not block.example:
            continue
        example = Path(block.example)
        where = f"{page_path}:{block.line} ({block.example})"
        if not (root / example).is_file():
            wrong.append(f"{where}: no such file")
            continue
        text = (root / example).read_text(encoding="utf-8")
        if block.text.rstrip() != text.rstrip():
            wrong.append(f"{where}: the block differs from the file")
        if runners is None:
            runners = runner_texts(root)
        named = re.compile(rf"\b{re.escape(example.name.split('.')[0])}\b")
        if not go_example_runs(root, example, text) and not any(
                named.search(runner) for path, runner in runners.items() if path != example):
            go = "; a Go example needs an `// Output:` comment, in a module dev.sh runs go test in" \
                if example.suffix == ".go" else ""
            wrong.append(f"{where}: no test or build script runs it (none names {example.name.split('.')[0]!r}{go})")
    return wrong


def test_each_example_on_the_page_is_a_file_that_a_test_runs() -> None:
    assert problems(ROOT, PAGE, REQUIRED_LANGUAGES) == []


def test_the_markers_elsewhere_in_the_docs_name_files_a_test_runs() -> None:
    pages = [Path("README.md"), *sorted(path.relative_to(ROOT) for path in (ROOT / "docs").glob("*.md"))]
    assert [problem for page in pages if page != PAGE for problem in problems(ROOT, page, ())] == []


# The check itself, on a small repository of its own: it passes there, and fails for each way
# a page and its examples drift apart.
EXAMPLE = "print('one turn')\n"
GOOD_PAGE = f"""# Other languages

## {SECTION}

### Python

A turn:

<!-- example: tests/one_turn.py -->
```python
{EXAMPLE}```

## After
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "docs/page.md").write_text(GOOD_PAGE)
    (tmp_path / "tests/one_turn.py").write_text(EXAMPLE)
    (tmp_path / "tests/test_one_turn.py").write_text("def test_it(): run('one_turn.py')\n")
    return tmp_path


def test_the_check_passes_a_page_whose_examples_are_run_files(repo: Path) -> None:
    assert problems(repo, Path("docs/page.md"), ("Python",)) == []


def test_the_check_fails_when_a_byte_of_the_example_changes(repo: Path) -> None:
    (repo / "tests/one_turn.py").write_text(EXAMPLE.replace("one", "One"))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "docs/page.md:10 (tests/one_turn.py): the block differs from the file"]


def test_the_check_fails_when_a_required_language_is_missing(repo: Path) -> None:
    assert problems(repo, Path("docs/page.md"), ("Python", "Go")) == [
        f"### Go: missing from {SECTION!r}"]


def test_the_check_fails_when_a_subsection_has_no_example_or_two_blocks(repo: Path) -> None:
    page = repo / "docs/page.md"
    page.write_text(GOOD_PAGE.replace("<!-- example: tests/one_turn.py -->\n", ""))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "### Python: 1 fenced blocks; it needs exactly one, an example (the line before its fence "
        "`<!-- example: PATH -->`)"]
    page.write_text(GOOD_PAGE.replace("A turn:\n", "A turn:\n\n```sh\npython one_turn.py\n```\n"))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "### Python: 2 fenced blocks; it needs exactly one, an example (the line before its fence "
        "`<!-- example: PATH -->`)"]


def test_the_check_fails_when_the_subsections_are_out_of_order(repo: Path) -> None:
    page = repo / "docs/page.md"
    page.write_text(GOOD_PAGE.replace("### Python", "### Java\n\nSoon.\n\n### Python"))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "the subsections are Java, Python: each once, in the order TypeScript, Python, Rust, Go, Java",
        "### Java: 0 fenced blocks; it needs exactly one, an example (the line before its fence "
        "`<!-- example: PATH -->`)"]


def test_the_check_fails_when_the_example_is_renamed_and_no_test_runs_the_new_name(repo: Path) -> None:
    (repo / "tests/one_turn.py").rename(repo / "tests/one_turn_v2.py")
    page = repo / "docs/page.md"
    page.write_text(GOOD_PAGE.replace("tests/one_turn.py", "tests/one_turn_v2.py"))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "docs/page.md:10 (tests/one_turn_v2.py): no test or build script runs it (none names 'one_turn_v2')"]
    page.write_text(GOOD_PAGE.replace("tests/one_turn.py", "tests/one_turn_moved.py"))
    assert problems(repo, Path("docs/page.md"), ("Python",)) == [
        "docs/page.md:10 (tests/one_turn_moved.py): no such file"]


def test_a_go_example_runs_only_with_output_in_a_module_dev_sh_tests(repo: Path) -> None:
    (repo / "clients/go").mkdir(parents=True)
    (repo / "clients/go/go.mod").write_text("module example.com/x\n")
    example = "package x_test\n\nfunc Example() {\n\tprintln(1)\n\t// Output:\n\t// 1\n}\n"
    (repo / "clients/go/turn_test.go").write_text(example)
    (repo / "dev.sh").write_text("(cd clients/go && go test -count=1 ./...)\n")
    assert go_example_runs(repo, Path("clients/go/turn_test.go"), example)
    assert not go_example_runs(repo, Path("clients/go/turn_test.go"), example.replace("// Output:", "// Prints:"))
    (repo / "dev.sh").write_text("(cd clients/go && go vet ./...)\n")
    assert not go_example_runs(repo, Path("clients/go/turn_test.go"), example)
