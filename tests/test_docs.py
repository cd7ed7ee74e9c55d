"""The README and ``docs/`` say what the project has: every relative link resolves, every ``make X`` is a target,
every ``section.key`` is a config key, every path of the repository they name exists, and they speak as
documentation (no workplace wording). Each check is first shown failing on a broken page.

``docs/history/`` is exempt from the path and key checks: it records what was true on its date.
"""

import importlib.util
import json
import re
from pathlib import Path

from pipeline.config import RETIRED_KEYS, load_config
from tests.conftest import PROJECT_ROOT

HISTORY = PROJECT_ROOT / "docs" / "history"
FILE_SUFFIXES = {
    "keras",
    "json",
    "yaml",
    "yml",
    "parquet",
    "py",
    "md",
    "png",
    "csv",
    "txt",
    "db",
    "safetensors",
    "npy",
    "joblib",
    "pkl",
    "html",
    "lock",
    "toml",
    "gz",
    "tar",
}
REPOSITORY_FOLDERS = ("pipeline/", "lab/", "configs/", "docs/", "tests/", "tools/", ".ci/")
WORKPLACE_WORDING = re.compile(r"this session|last session|previous session|\bissue \d+|/tmp/", re.IGNORECASE)
# the lab's words, which a user never meets outside docs/history/: the sandbox the project was built in, what could
# not be done there
LAB_WORDING = re.compile(
    r"this machine|not seen here|the house|this sandbox|no GPU has been lent|could not be tried", re.IGNORECASE
)


def pages() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]


REFERENCE = PROJECT_ROOT / "docs" / "reference"  # generated from the code (tools/reference.py)


def tool(name: str):
    """``tools/<name>.py`` as a module (the tools folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, PROJECT_ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_tool():
    return tool("reference")


def test_the_reference_pages_are_what_the_makefile_and_the_config_say():
    for path, text in reference_tool().pages().items():
        assert path.read_text() == text, f"{path} differs from the code: run `python tools/reference.py`"


def figures_tool():
    return tool("figures")


def test_every_marked_figure_equals_its_snapshot():
    tool = figures_tool()
    marked = {page.name: len(tool.BLOCK.findall(page.read_text())) for page in tool.pages()}
    assert marked["README.md"] >= 1 and marked["results.md"] >= 1
    stale = [page.name for page in tool.pages() if tool.render_text(page.read_text()) != page.read_text()]
    assert stale == [], f"{stale}: run `python tools/figures.py render`"


def test_the_figures_check_catches_a_figure_edited_by_hand(tmp_path):
    """The control: a block whose figure was changed by hand, and a snapshot that moved, are both found."""
    tool = figures_tool()
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = tool.BLOCK.search(readme).group(0)
    edited = readme.replace(block, block.replace("0.9221", "0.9231", 1))
    assert edited != readme and tool.render_text(edited) == readme
    for path in tool.SNAPSHOTS.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    snapshot = json.loads((tool.SNAPSHOTS / "default.json").read_text())
    snapshot["deployed"]["test"] = 0.5
    (tmp_path / "default.json").write_text(json.dumps(snapshot))
    assert "test 0.5000" in tool.render_text(readme, tmp_path) and tool.render_text(readme, tmp_path) != readme


def test_the_reference_check_catches_a_target_the_page_lacks():
    """The control: a Makefile with one more target gives another page."""
    tool = reference_tool()
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    grown = makefile + "\nnew-target: ## a target the page does not list\n\techo\n"
    assert "`make new-target`" in tool.make_page(grown) and tool.make_page(grown) != (REFERENCE / "make.md").read_text()
    assert "| `make all` |" in tool.make_page(makefile) and "| `data.seed` | `int` | `1337` |" in tool.config_page()


def current_pages() -> list[Path]:
    return [page for page in pages() if HISTORY not in page.parents]


def broken_links(page: Path, text: str) -> list[str]:
    """Relative Markdown links of ``text`` (on ``page``) whose file does not exist."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            found.append(f"{page.name}: {target}")
    return found


def make_targets() -> set[str]:
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.MULTILINE))


def code(text: str) -> str:
    """The code of a Markdown page: its fenced blocks and its code spans (prose says "make the ..." too)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return "\n".join([*blocks, *re.findall(r"`([^`\n]+)`", outside)])


def unknown_targets(text: str, targets: set[str]) -> list[str]:
    """``make X`` in the code of ``text`` where X is not a target."""
    return sorted({name for name in re.findall(r"\bmake ([a-z][a-z0-9-]*)", code(text)) if name not in targets})


def config_keys() -> dict[str, set[str]]:
    """Today's keys, and the retired ones (``RETIRED_KEYS``: a page may say that one was retired, and why)."""
    keys = {section: set(values) for section, values in load_config(None).to_dict().items()}
    for section, key in RETIRED_KEYS:
        keys[section].add(key)
    return keys


def unknown_keys(text: str, keys: dict[str, set[str]]) -> list[str]:
    """``section.key`` named in code spans (or ``SET=``/``--set`` lines) that the config does not have."""
    found = set()
    spans = re.findall(r"`([^`\n]+)`", text)
    for span in spans:
        for section, key in re.findall(r"(?<![\w./-])([a-z_]+)\.([a-z_]+)(?=[=\s`'\"]|$)", span):
            if section in keys and key not in FILE_SUFFIXES and key not in keys[section]:
                found.add(f"{section}.{key}")
    return sorted(found)


def missing_paths(text: str) -> list[str]:
    """Paths of the repository (``pipeline/...``, ``configs/...``, ...) in code spans that do not exist."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in span.split():
            path = token.strip("'\",;:()").split(":", 1)[0]
            if path.startswith(REPOSITORY_FOLDERS) and not any(c in path for c in "*<>{}$"):
                if not (PROJECT_ROOT / path).exists():
                    found.add(path)
    return sorted(found)


# --------------------------------------------------------------------------- the checks catch broken pages


def test_the_checks_catch_a_broken_link_target_key_path_and_workplace_words(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    assert broken_links(page, "[ok](there.md#a) [web](https://x.org) [gone](missing.md)") == ["page.md: missing.md"]
    assert unknown_targets("run `make all`, make the most of it, `make nonsense-target`", {"all"}) == [
        "nonsense-target"
    ]
    assert unknown_targets("```\nmake all\nmake missing\n```\n", {"all"}) == ["missing"]
    keys = {"model": {"pooling"}, "training": {"epochs"}}
    text = "`model.pooling=mean` `training.epochz=3` `model.keras` `SET='model.poolng=x'`"
    assert unknown_keys(text, keys) == ["model.poolng", "training.epochz"]
    assert missing_paths("`pipeline/tracking.py` `pipeline/no_such_module.py:12` `data/ingest/`") == [
        "pipeline/no_such_module.py"
    ]
    assert WORKPLACE_WORDING.search("as measured in this session") and not WORKPLACE_WORDING.search("as measured")


# --------------------------------------------------------------------------- the pages


def test_every_relative_link_resolves():
    assert [link for page in pages() for link in broken_links(page, page.read_text())] == []


def test_every_make_target_named_exists():
    targets = make_targets()
    found = {page.name: unknown_targets(page.read_text(), targets) for page in current_pages()}
    assert {name: names for name, names in found.items() if names} == {}


def test_every_config_key_named_exists():
    keys = config_keys()
    found = {page.name: unknown_keys(page.read_text(), keys) for page in current_pages()}
    assert {name: names for name, names in found.items() if names} == {}


def test_every_repository_path_named_exists():
    found = {page.name: missing_paths(page.read_text()) for page in current_pages()}
    assert {name: paths for name, paths in found.items() if paths} == {}


def test_the_lab_words_stay_in_the_history():
    found = [
        f"{page.relative_to(PROJECT_ROOT)}: {match.group(0)!r}"
        for page in current_pages()
        for match in LAB_WORDING.finditer(page.read_text())
    ]
    assert found == []
    assert LAB_WORDING.search("measured on this machine") and not LAB_WORDING.search("measured on a 2-core machine")


def test_the_pages_speak_as_documentation():
    found = [
        f"{page.relative_to(PROJECT_ROOT)}: {match.group(0)!r}"
        for page in pages()
        for match in WORKPLACE_WORDING.finditer(page.read_text())
    ]
    assert found == []


def test_the_readme_and_the_current_docs_stay_short():
    """A landing page and a guide read in minutes; measurements of earlier days go to docs/history/."""
    assert len((PROJECT_ROOT / "README.md").read_bytes()) <= 10_000
    current = [page for page in current_pages() if page.name != "README.md" and REFERENCE not in page.parents]
    assert sum(len(page.read_bytes()) for page in current) <= 100_000
