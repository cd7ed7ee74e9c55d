"""The package's layout: one module per stage (and per experiment), stages import libraries and never each
other, libraries never import a stage or an experiment, no import cycle, and every file name a stage hands on
is written once (in the catalog of ``pipeline.artifacts``).

Each rule is checked by a function that reads sources as text (``ast``), and each function is first
shown to catch a broken input, so a rule that silently stopped checking would fail here.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from pipeline import artifacts
from pipeline.experiments import EXPERIMENTS
from pipeline.stages import STAGES
from tests.conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "pipeline"


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(source: str, known: set[str]) -> set[str]:
    """The package modules ``source`` imports anywhere (module level or inside functions), as in ``known``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from pipeline import x
    return {name for name in found if name in known}


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    known = set(modules)
    return {name: imported_modules(source, known) - {name} for name, source in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of ``graph`` (module -> modules it imports), or None.

    A package's ``__init__`` is imported by its submodules' own import, so ``pipeline`` and
    ``pipeline.stages`` edges to their children are not cycles by themselves; they are left out.
    """
    edges = {name: {target for target in targets if not target.startswith(name + ".")}
             for name, targets in graph.items()}
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def stage_modules() -> set[str]:
    """The modules of every sub-command: the product's stages and the experiments."""
    return {stage.module for stage in (*STAGES.values(), *EXPERIMENTS.values())}


RUNNER_PACKAGES = ("pipeline.stages", "pipeline.experiments")
CLI = "pipeline.__main__"


def library_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of anything in ``pipeline.stages`` or ``pipeline.experiments`` (their tables included) by a
    library: a module outside those packages other than the CLI."""
    def runs_things(module: str) -> bool:
        return module == CLI or any(module == p or module.startswith(p + ".") for p in RUNNER_PACKAGES)

    return sorted(f"{source} imports {target}" for source, targets in graph.items() if not runs_things(source)
                  for target in targets if runs_things(target) and target != CLI)


def layering_violations(graph: dict[str, set[str]], stages: set[str]) -> list[str]:
    """Imports of a stage module by anything but the CLI's table (stages import libraries, never each other)."""
    return sorted(f"{source} imports {target}" for source, targets in graph.items()
                  for target in targets if target in stages and source != target)


def string_literals(source: str) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def catalog_names() -> dict[str, str]:
    """The catalog's file names: upper-case ``str`` constants of ``pipeline.artifacts`` that name a file."""
    return {name: value for name, value in vars(artifacts).items()
            if name.isupper() and isinstance(value, str) and "." in value}


def repeated_file_names(modules: dict[str, str], names: set[str]) -> dict[str, list[str]]:
    """File names of ``names`` that appear as a literal outside the catalog's one definition."""
    places: dict[str, list[str]] = {}
    for module, source in modules.items():
        for literal in string_literals(source):
            if literal in names:
                places.setdefault(literal, []).append(module)
    return {name: where for name, where in places.items() if len(where) > 1}


# --------------------------------------------------------------------------- the checks catch broken inputs


def test_the_checks_catch_a_cycle_a_stage_importing_a_stage_and_a_repeated_file_name():
    assert find_cycle({"pipeline.a": {"pipeline.b"}, "pipeline.b": {"pipeline.a"}}) is not None
    assert find_cycle({"pipeline.a": {"pipeline.b"}, "pipeline.b": set()}) is None
    inside_a_function = "def run():\n    from pipeline.stages import train\n"
    graph = {"pipeline.stages.compare": imported_modules(inside_a_function, {"pipeline.stages.train"})}
    assert layering_violations(graph, {"pipeline.stages.compare", "pipeline.stages.train"}) == [
        "pipeline.stages.compare imports pipeline.stages.train"]
    library = "from pipeline.stages import require_output\n"
    known = {"pipeline.stages", "pipeline.experiments", "pipeline.experiments.tune"}
    assert library_violations({"pipeline.backbone": imported_modules(library, known)}) == [
        "pipeline.backbone imports pipeline.stages"]
    assert library_violations({"pipeline.training": {"pipeline.experiments.tune"}}) == [
        "pipeline.training imports pipeline.experiments.tune"]
    assert library_violations({"pipeline.stages.train": {"pipeline.training"}, CLI: {"pipeline.stages"}}) == []
    modules = {"pipeline.artifacts": 'A = "x.parquet"', "pipeline.stages.y": 'path = "x.parquet"'}
    assert repeated_file_names(modules, {"x.parquet"}) == {"x.parquet": ["pipeline.artifacts", "pipeline.stages.y"]}


# --------------------------------------------------------------------------- the package


def test_one_module_per_make_target_in_pipeline_stages_and_pipeline_experiments():
    for package, table in (("stages", STAGES), ("experiments", EXPERIMENTS)):
        modules = {module_name(path) for path in (PACKAGE / package).glob("*.py") if path.name != "__init__.py"}
        assert modules == {stage.module for stage in table.values()}, package
        for name, stage in table.items():
            assert stage.module == f"pipeline.{package}.{name.replace('-', '_')}", name
    assert not set(STAGES) & set(EXPERIMENTS)


def test_stages_import_libraries_never_each_other_and_libraries_never_import_a_stage():
    graph = import_graph(sources())
    assert layering_violations(graph, stage_modules()) == []
    assert library_violations(graph) == []


def test_no_import_cycle_anywhere_in_the_package():
    assert find_cycle(import_graph(sources())) is None


def test_every_file_name_of_the_catalog_is_written_once():
    names = catalog_names()
    assert {"test_predictions.parquet", "model.keras", "labels.json", "vocabulary.txt"} <= set(names.values())
    assert repeated_file_names(sources(), set(names.values())) == {}
