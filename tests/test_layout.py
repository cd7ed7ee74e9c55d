"""The package's layout, as rules a newcomer can rely on:

- the package root holds a handful of entries: the CLI, ``stages/`` and the shared libraries grouped by concern;
- the product never imports its lab: nothing under ``pipeline/`` imports ``lab`` (the experiments and probes beside
  it, ``lab/``), so a user's install holds what the product runs;
- one package per ``make`` stage under ``pipeline/stages/`` (its entry point in ``__init__``, its logic beside
  it), one module (or package) per experiment under ``lab/experiments/``;
- a stage imports shared libraries and the packages of the stages upstream of it (what the stage table says it
  reads or runs), never one downstream or beside it; libraries never import a stage or the lab; no cycle;
- imports stand at the top of a module; one sits inside a function only when it loads a heavy or optional package
  (``HEAVY_PACKAGES``), directly or through the package modules it imports at their top, so a module's import list
  says what it needs and ``python -m pipeline --help`` loads no framework;
- the libraries stand in layers (``LIBRARY_LAYERS``: core, config, then metrics, text and tracking, then runtime and
  the lexical models, then the model): a library imports its own layer or the ones below, never one above;
- only the modules of ``MLFLOW_IMPORTERS`` import MLflow (tracking's names and queries, the model layer's pyfunc
  models and their logging, and the stages and experiments that open runs);
- the Makefile's prerequisites and the stage table agree (the stage graph is written once);
- one name per idea: no two modules named after forms of one word (``tokenize``/``tokenizer``/``tokenization``);
- every file name a stage hands on is written once (in ``pipeline.core.catalog``);
- a model kind owns its behaviour: outside ``pipeline/model/kinds/`` no code compares something named a kind with a
  kind's name (``kind == "fusion"``, ``summary[name]["kind"] != "nbsvm"``) or tests a kind's class
  (``isinstance(model, FusedClassifier)``); it asks the kind (``kind_of(name).deployable``, ``model.graph(k)``);
- sizes: no module over 300 statements, no function over 50 statements or with more than 8 parameters;
- functions take the config section they use: a shared library takes sections, never the whole ``Config`` (but
  ``pipeline.tracking.flat_params``, which logs every value); a stage or experiment function takes the whole
  ``Config`` only when it is an entry point (``run``, ``main``), reads two sections or more, hands the config on,
  or uses what only the whole config has (``section_hash``, ``replace``, ``with_settings``, ``to_dict``);
- tests mirror the layout: ``tests/<folder>/test_<name>.py`` tests a module or package ``<name>`` under
  ``pipeline/<folder>/`` or ``lab/<folder>/``, and every stage has its ``tests/stages/test_<stage>.py``.

The rules other than the first two read ``pipeline/`` and ``lab/`` alike: the lab is held to the product's layout.

Each rule is checked by a function that reads sources as text (``ast``), and each function is first shown to
catch a broken input, so a rule that silently stopped checking would fail here.
"""

from __future__ import annotations

import ast
import fnmatch
import graphlib
import re
import tomllib
from pathlib import Path

from lab.experiments import EXPERIMENTS
from pipeline.core import catalog
from pipeline.model.kinds import KINDS
from pipeline.stages import STAGES
from tests.conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "pipeline"
LAB = PROJECT_ROOT / "lab"
TESTS = PROJECT_ROOT / "tests"
CROSS_CUTTING = {"test_layout", "test_quality_gates", "test_docs", "test_tutorial"}  # the whole project: layout; lint,
# types; docs; the tutorial walked through make
ROOT_ENTRIES = 12
# sizes in statements (``ast.stmt`` nodes), which the formatter does not change: guards against outliers with room
# under them (the largest module holds 261, the largest function 45), not targets to fill
MAX_MODULE_STATEMENTS, MAX_FUNCTION_STATEMENTS, MAX_PARAMETERS = 300, 50, 8
EVERYTHING = {**STAGES, **EXPERIMENTS}
WHOLE_CONFIG_METHODS = {"section_hash", "replace", "with_settings", "to_dict"}
PATH_PROPERTIES = {"data_dir", "reports_dir"}  # Config's shortcuts to the paths section
PATH_FUNCTIONS = {"stage_dir", "require_output"}  # pipeline.core.catalog: read config.data_dir alone
WHOLE_CONFIG_LIBRARY = {"pipeline.tracking.flat_params"}  # logs every resolved value
ENTRY_POINTS = {"run", "main"}
# declared conventions: a stage's readers of its outputs; a report; a package's command line (the product's, the lab's)
SHARED_MODULE_NAMES = {"outputs", "report", "__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, str]:
    """Every module of the product and of its lab, by dotted name."""
    return {module_name(path): path.read_text() for root in (PACKAGE, LAB) for path in sorted(root.rglob("*.py"))}


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

    A package's ``__init__`` is imported by its submodules' own import, so edges from a package to its
    children are not cycles by themselves; they are left out.
    """
    edges = {
        name: {target for target in targets if not target.startswith(name + ".")} for name, targets in graph.items()
    }
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


RUNNER_PACKAGES = ("pipeline.stages", "lab")
CLI = "pipeline.__main__"


def in_lab(module: str) -> bool:
    return module == "lab" or module.startswith("lab.")


def lab_imports(modules: dict[str, str]) -> list[str]:
    """Where a module of the product imports the lab (``lab`` or anything in it): an import statement anywhere in
    the module (its top, a function, an ``if TYPE_CHECKING:`` block) or an ``import_module``/``__import__`` call
    naming a lab module. The product cannot depend on its lab: a user's install does not hold it."""
    found = []
    for name, source in modules.items():
        if in_lab(name):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                named = [node.module or ""]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module",
                "__import__",
            ):
                named = [
                    arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                ]
            else:
                continue
            found += [f"{name}:{node.lineno} imports {target}" for target in named if in_lab(target)]
    return sorted(found)


def owner(module: str, table: dict) -> str | None:
    """The stage or experiment whose package (or module) holds ``module``, or None for a library."""
    for name, stage in table.items():
        if module == stage.module or module.startswith(stage.module + "."):
            return name
    return None


def reachable(start, neighbours) -> set[str]:
    """Every node reached from ``neighbours(start)`` by following ``neighbours`` (which lists only nodes to keep)."""
    seen: set[str] = set()
    todo = list(neighbours(start))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(neighbours(current))
    return seen


def upstream_closure(name: str, table: dict) -> set[str]:
    """Every stage ``name`` reads or runs, directly or through them."""
    return reachable(name, lambda stage: [s for s in table[stage].upstream if s in table])


def library_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of anything in ``pipeline.stages`` or ``lab`` (their tables included) by a library: a module outside
    those packages other than the CLI."""

    def runs_things(module: str) -> bool:
        return module == CLI or any(module == p or module.startswith(p + ".") for p in RUNNER_PACKAGES)

    return sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if not runs_things(source)
        for target in targets
        if runs_things(target) and target != CLI
    )


def stage_violations(graph: dict[str, set[str]], table: dict) -> list[str]:
    """Imports of a stage's package by another stage (or experiment) that neither reads nor runs it upstream."""
    found = []
    for source, targets in graph.items():
        importer = owner(source, table)
        for target in targets:
            imported = owner(target, table)
            if importer is None or imported is None or imported == importer:
                continue
            if (
                target == "pipeline.stages"
                or imported not in upstream_closure(importer, table)
                and (importer in STAGES or imported in EXPERIMENTS)
            ):
                found.append(f"{source} ({importer}) imports {target} ({imported})")
    return sorted(found)


LIBRARY_LAYERS = (
    ("pipeline.core",),
    ("pipeline.config",),
    ("pipeline.metrics", "pipeline.text", "pipeline.tracking"),
    ("pipeline.runtime", "pipeline.lexical"),
    ("pipeline.model",),
)
MLFLOW_IMPORTERS = {
    "pipeline.tracking",  # MLflow's names and queries
    "pipeline.core.logs",  # replaces the terminal handler MLflow's logger installs on import
    "pipeline.model.classifiers",  # loading the pyfunc models (mlflow.pyfunc.load_model)
    "pipeline.model.kinds.base",  # what every pyfunc model is (mlflow.pyfunc.PythonModel)
    "pipeline.model.logged_model",  # how they are logged
    "pipeline.model.progress",  # what a training run logs: its epochs' metrics and its summary
    # stages and experiments that open, read or register runs and models
    "pipeline.stages.compare.recorder",
    "pipeline.stages.compare.runner",
    "pipeline.stages.evaluate.scorecard",
    "pipeline.stages.export.publish",
    "pipeline.stages.pretrain.masked_lm",
    "pipeline.stages.pretrain.outputs",
    "pipeline.stages.pseudo_label.teacher",
    "pipeline.stages.register.card",
    "pipeline.stages.register.champion",
    "pipeline.stages.score.spark",
    "pipeline.stages.serve.app",  # MLflow's scoring server, behind the served model's front
    "pipeline.stages.train.fit_and_log",
    "lab.experiments.learning_curve",
    "lab.experiments.tune",
    "lab.audits.refactor_check",  # the A/B's and the fault harness's stores (artifacts under their own folders)
    "lab.audits.faults",
}

# what a function may import inside itself: packages slow to load (a framework, a tracker, a plotting library) or
# installed only for some targets (Spark, the browser, the checkpoint); everything else is imported at the top
HEAVY_PACKAGES = {
    "tensorflow", "tensorflow_text", "keras", "keras_hub", "jax", "jaxlib", "mlflow", "optuna", "pyspark", "sklearn",
    "scipy", "playwright", "matplotlib", "skops", "torch", "huggingface_hub", "safetensors", "tokenizers",
    "sentencepiece", "uvicorn", "fastapi", "requests", "psutil", "onnx", "onnxruntime", "tf2onnx",
}  # fmt: skip


def split_imports(source: str) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """The import statements of ``source`` at module level (``if TYPE_CHECKING:`` blocks left out) and those inside
    functions and methods."""
    top: list[ast.stmt] = []
    inner: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top).append(child)
            elif not (isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING")):
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return top, inner


def statement_names(node: ast.stmt) -> list[str]:
    """What an import statement names: ``import a.b`` -> a.b; ``from a import b`` -> a and a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def heavy_modules(modules: dict[str, str]) -> set[str]:
    """The package modules whose import loads a ``HEAVY_PACKAGES`` package: they import one at their top, or a heavy
    package module, or sit in a heavy package."""
    tops = {
        name: [n for node in split_imports(source)[0] for n in statement_names(node)]
        for name, source in modules.items()
    }
    heavy: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, names in tops.items():
            parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
            if name not in heavy and (
                any(n.split(".")[0] in HEAVY_PACKAGES or n in heavy for n in names) or parents & heavy
            ):
                heavy.add(name)
                changed = True
    return heavy


def light_function_imports(modules: dict[str, str]) -> list[str]:
    """Imports inside a function that load nothing heavy: they belong at the top of the module."""
    heavy = heavy_modules(modules)
    found = []
    for name, source in modules.items():
        for node in split_imports(source)[1]:
            names = statement_names(node)
            if not any(n.split(".")[0] in HEAVY_PACKAGES or n in heavy for n in names):
                found.append(f"{name}:{node.lineno} imports {names[0]}")
    return sorted(found)


def layer_of(module: str) -> int | None:
    """The index of ``module``'s library layer in ``LIBRARY_LAYERS``, or None (a stage, an experiment, the CLI)."""
    for index, layer in enumerate(LIBRARY_LAYERS):
        if any(module == library or module.startswith(library + ".") for library in layer):
            return index
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a library of a higher layer by a library (``LIBRARY_LAYERS``)."""
    found = []
    for source, targets in graph.items():
        own = layer_of(source)
        for target in targets:
            other = layer_of(target)
            if own is not None and other is not None and other > own:
                found.append(f"{source} imports {target}, a layer above it")
    return sorted(found)


def mlflow_importers(modules: dict[str, str]) -> set[str]:
    """The modules that import ``mlflow`` (module level or inside functions)."""
    found = set()
    for name, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                found.add(name)
    return found


def makefile_prerequisites(makefile: str) -> dict[str, set[str]]:
    """target -> the stage output folders (``$(DATA_DIR)/<folder>/manifest.json``) it names as prerequisites,
    a stage target standing for its manifest rule (``ingest: $(DATA_DIR)/ingest/manifest.json``)."""
    rules: dict[str, str] = {}
    for line in makefile.splitlines():
        match = re.match(r"^([$()\w/.-]+):(?!=)([^#]*)", line)
        if match:
            rules[match.group(1)] = match.group(2)
    needs = {}
    for target, prerequisites in rules.items():
        folders = set(re.findall(r"\$\(DATA_DIR\)/(\w+)/manifest\.json", prerequisites))
        for folder in list(folders):
            own = f"$(DATA_DIR)/{folder}/manifest.json"
            if prerequisites.strip() == own and own in rules:  # `ingest: its manifest`: the manifest rule's needs
                folders = set(re.findall(r"\$\(DATA_DIR\)/(\w+)/manifest\.json", rules[own]))
        needs[target] = folders
    return needs


def stage_graph_drift(makefile: str, table: dict, folders: dict[str, str]) -> list[str]:
    """Stage targets whose Makefile prerequisites (followed through the manifest rules) build other stage
    outputs than the table's ``reads`` (followed through the table) ask for. Only stages whose output make can
    see (a ``$(DATA_DIR)/<folder>/manifest.json`` rule) count; the others are MLflow runs or phony."""
    needs = makefile_prerequisites(makefile)
    by_folder = {folder: stage for stage, folder in folders.items()}
    file_backed = {by_folder[f] for f in by_folder if f"$(DATA_DIR)/{f}/manifest.json" in needs}

    def make_closure(target: str) -> set[str]:
        return reachable(target, lambda node: [by_folder[f] for f in needs.get(node, set()) if f in by_folder])

    def table_closure(name: str) -> set[str]:  # make builds nothing through an MLflow run
        return reachable(name, lambda stage: [s for s in table[stage].reads if s in file_backed])

    return sorted(
        f"{name}: make builds {sorted(make_closure(name))}, the table reads {sorted(table_closure(name))}"
        for name in table
        if name in needs and make_closure(name) != table_closure(name)
    )


def word_stem(name: str) -> str:
    """``tokenization``, ``tokenizer``, ``tokenize`` -> ``token``; ``servers``, ``serve`` -> ``serv``."""
    stem = name.lower().removesuffix("s")
    for suffix in ("ization", "ation", "izer", "ize", "ing", "ion", "er", "e"):
        if stem.endswith(suffix) and len(stem) - len(suffix) >= 3:
            return stem[: -len(suffix)]
    return stem


KINDS_PACKAGE = "pipeline.model.kinds"


def kind_switches(modules: dict[str, str]) -> list[str]:
    """Outside :data:`KINDS_PACKAGE`: comparisons of an expression that names a kind (``kind``, ``x.kind``,
    ``entry["kind"]``) with a kind's name, and ``isinstance``/``issubclass`` tests of a kind's class."""
    from pipeline.tracking import OLD_MODEL_KINDS

    names = set(KINDS) | set(OLD_MODEL_KINDS)
    classes = {kind.__name__ for kind in KINDS.values()}
    found = []
    for module, source in modules.items():
        if module == KINDS_PACKAGE or module.startswith(KINDS_PACKAGE + "."):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                literals = {
                    c.value
                    for o in operands
                    for c in ([o] if isinstance(o, ast.Constant) else getattr(o, "elts", []))
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
                named = [o for o in operands if "kind" in ast.unparse(o).lower() and not isinstance(o, ast.Constant)]
                if literals & names and named:
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
                and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & classes
            ):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_kind_rule_catches_a_switch_on_a_kinds_name_or_class():
    switches = {
        "pipeline.stages.register.card": 'if kind == "fusion":\n    pass\n',
        "pipeline.stages.compare.effects": 'x = [n for n in s if s[n]["kind"] in ("transformer", "nbsvm")]\n',
        "pipeline.stages.export.graph": "if isinstance(classifier, FusedClassifier):\n    pass\n",
        "pipeline.model.kinds.fusion_classifier": 'if kind == "fusion":\n    pass\n',  # inside the kinds: allowed
        "pipeline.stages.compare.runner": 'x = encoder if variant == "transformer" else variant\n',  # not a kind
    }
    assert kind_switches(switches) == [
        "pipeline.stages.register.card:1: kind == 'fusion'",
        "pipeline.stages.compare.effects:1: s[n]['kind'] in ('transformer', 'nbsvm')",
        "pipeline.stages.export.graph:1: isinstance(classifier, FusedClassifier)",
    ]


def test_no_code_outside_the_kinds_switches_on_a_kind():
    assert kind_switches(sources()) == []


def names_of_one_idea(modules: list[str]) -> dict[str, list[str]]:
    """Module and package names (last part) that are forms of one word, by their stem."""
    by_stem: dict[str, set[str]] = {}
    for module in modules:
        for part in module.split(".")[1:]:
            by_stem.setdefault(word_stem(part), set()).add(part)
    return {stem: sorted(names) for stem, names in by_stem.items() if len(names) > 1}


def repeated_module_names(modules: list[str]) -> dict[str, list[str]]:
    """Module names (last part) that two packages both hold, the declared conventions aside: one idea, one name
    (``text/presets.py`` beside ``model/presets.py`` splits one feature under a name that says neither half)."""
    by_name: dict[str, list[str]] = {}
    for module in modules:
        by_name.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    return {
        name: sorted(where) for name, where in by_name.items() if len(where) > 1 and name not in SHARED_MODULE_NAMES
    }


def entry_point_violations(modules: dict[str, str], table: dict) -> list[str]:
    """Functions and classes a stage's ``__init__`` defines besides its entry points (``run``, ``main``): the
    package's ``__init__`` is its entry point, its work lives in the package's modules or a library."""
    found = []
    for stage in table.values():
        source = modules.get(stage.module)
        if source is None:
            continue
        for node in ast.parse(source).body:
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.name not in ENTRY_POINTS
            ):
                found.append(f"{stage.module}.{node.name}")
    return found


def string_literals(source: str) -> list[str]:
    return [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def catalog_names() -> dict[str, str]:
    """The catalog's file names: upper-case ``str`` constants of ``pipeline.core.catalog`` that name a file."""
    return {
        name: value
        for name, value in vars(catalog).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }


def repeated_file_names(modules: dict[str, str], names: set[str]) -> dict[str, list[str]]:
    """File names of ``names`` that appear as a literal outside the catalog's one definition."""
    places: dict[str, list[str]] = {}
    for module, source in modules.items():
        for literal in string_literals(source):
            if literal in names:
                places.setdefault(literal, []).append(module)
    return {name: where for name, where in places.items() if len(where) > 1}


def statements(node: ast.AST) -> int:
    """The statements in ``node``, nested ones included (a function's own ``def`` not counted)."""
    count = sum(isinstance(child, ast.stmt) for child in ast.walk(node))
    return count - isinstance(node, ast.stmt)


def size_violations(modules: dict[str, str]) -> list[str]:
    """Modules over ``MAX_MODULE_STATEMENTS`` statements, functions over ``MAX_FUNCTION_STATEMENTS`` or with more
    than ``MAX_PARAMETERS`` parameters (``self``/``cls`` aside)."""
    found = []
    for module, source in modules.items():
        tree = ast.parse(source)
        if statements(tree) > MAX_MODULE_STATEMENTS:
            found.append(f"{module}: {statements(tree)} statements")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            parameters = len(names) + bool(args.vararg) + bool(args.kwarg) - (names[:1] in (["self"], ["cls"]))
            if statements(node) > MAX_FUNCTION_STATEMENTS:
                found.append(f"{module}.{node.name}: {statements(node)} statements")
            if parameters > MAX_PARAMETERS:
                found.append(f"{module}.{node.name}: {parameters} parameters")
    return sorted(found)


def config_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The parameters annotated ``Config``."""
    args = node.args
    return {
        a.arg
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
        if a.annotation is not None and ast.unparse(a.annotation).strip("\"'") == "Config"
    }


def config_use(node: ast.AST, params: set[str]) -> tuple[set[str], bool]:
    """What a function does with its ``Config`` parameters: the sections it reads, and whether it uses the config
    whole (hands it to a call, or calls a method only the whole config has)."""
    sections, whole = set(), False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in params:
            whole |= sub.attr in WHOLE_CONFIG_METHODS
            if sub.attr not in WHOLE_CONFIG_METHODS:
                sections.add("paths" if sub.attr in PATH_PROPERTIES else sub.attr)
        elif isinstance(sub, ast.Call):
            handed = [
                a for a in (*sub.args, *(k.value for k in sub.keywords)) if isinstance(a, ast.Name) and a.id in params
            ]
            name = sub.func.id if isinstance(sub.func, ast.Name) else getattr(sub.func, "attr", "")
            if handed and name in PATH_FUNCTIONS:
                sections.add("paths")
            elif handed:
                whole = True
    return sections, whole


def whole_config_violations(modules: dict[str, str]) -> list[str]:
    """Functions that take the whole ``Config`` where the section they use would do (the rule in the docstring)."""
    found = []
    for module, source in modules.items():
        library = not (module.startswith(("pipeline.stages", "pipeline.config")) or in_lab(module))
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not config_parameters(node):
                continue
            name = f"{module}.{node.name}"
            if library and name not in WHOLE_CONFIG_LIBRARY:
                found.append(f"{name}: a shared library takes the whole Config")
            elif not library and node.name not in ENTRY_POINTS:
                sections, whole = config_use(node, config_parameters(node))
                if not whole and len(sections) < 2:
                    found.append(f"{name}: takes the whole Config and reads {sorted(sections) or 'nothing'} of it")
    return sorted(found)


def unmirrored_tests(test_files: list[Path]) -> list[str]:
    """Test files whose path does not mirror the package's or the lab's: ``tests/<path>/test_<name>.py`` (or
    ``test_<name>_<topic>.py``) needs ``<path>/<name>.py`` or the package ``<path>/<name>/`` in that very folder of
    ``pipeline/`` or ``lab/`` (a test of ``stages/ingest/tables.py`` lives in ``tests/stages/ingest/``, one of
    ``lab/experiments/tune.py`` in ``tests/experiments/``)."""
    found = []
    for path in test_files:
        relative = path.relative_to(TESTS)
        if relative.stem in CROSS_CUTTING:
            continue
        folders = [root.joinpath(*relative.parts[:-1]) for root in (PACKAGE, LAB)]
        entries = [entry for folder in folders if folder.is_dir() for entry in folder.iterdir()]
        names = {
            entry.stem
            for entry in entries
            if (entry.suffix == ".py" or (entry / "__init__.py").is_file()) and entry.stem != "__init__"
        }
        topic = relative.stem.removeprefix("test_")
        if not any(topic == name or topic.startswith(name + "_") for name in names):
            found.append(relative.as_posix())
    return sorted(found)


def all_test_files() -> list[Path]:
    return sorted(path for path in TESTS.rglob("test_*.py") if "data" not in path.relative_to(TESTS).parts)


# --------------------------------------------------------------------------- the checks catch broken inputs


def test_the_checks_catch_a_cycle_a_library_importing_a_stage_and_a_repeated_file_name():
    assert find_cycle({"pipeline.a": {"pipeline.b"}, "pipeline.b": {"pipeline.a"}}) is not None
    assert find_cycle({"pipeline.a": {"pipeline.b"}, "pipeline.b": set()}) is None
    library = "from pipeline.stages import require_output\n"
    known = {"pipeline.stages", "lab.experiments", "lab.experiments.tune"}
    assert library_violations({"pipeline.model.fit": imported_modules(library, known)}) == [
        "pipeline.model.fit imports pipeline.stages"
    ]
    assert library_violations({"pipeline.lexical": {"lab.experiments.tune"}}) == [
        "pipeline.lexical imports lab.experiments.tune"
    ]
    assert library_violations({"pipeline.stages.train": {"pipeline.lexical"}, CLI: {"pipeline.stages"}}) == []
    modules = {"pipeline.core.catalog": 'A = "x.parquet"', "pipeline.stages.y": 'path = "x.parquet"'}
    assert repeated_file_names(modules, {"x.parquet"}) == {"x.parquet": ["pipeline.core.catalog", "pipeline.stages.y"]}


def test_the_lab_rule_catches_the_product_importing_its_lab():
    modules = {
        "pipeline.__main__": "from lab.experiments import EXPERIMENTS\n",  # the import this rule removed
        "pipeline.stages.compare.runner": "def f():\n    import lab.experiments.tune\n",
        "pipeline.core.catalog": 'import importlib\n\nMODULE = importlib.import_module("lab.probes.cascade")\n',
        "pipeline.text.crops": "import labels\nfrom pipeline import lexical\nfrom .lab import x\n",
        "lab.experiments.tune": "from lab.experiments import parse_seeds\nfrom pipeline.stages import train\n",
    }
    assert lab_imports(modules) == [
        "pipeline.__main__:1 imports lab.experiments",
        "pipeline.core.catalog:3 imports lab.probes.cascade",
        "pipeline.stages.compare.runner:2 imports lab.experiments.tune",
    ]
    assert shipped_packages(["lab*"]) >= {"lab", "lab.experiments.bench"}  # the wheel check's control
    assert not shipped_packages(["pipeline*"]) & shipped_packages(["lab*", "tests*"])


def test_the_layer_and_mlflow_rules_catch_an_arrow_up_and_a_new_importer():
    # the arrow this rule removed: tracking (layer 2) imported the model layer's explanations
    assert layer_violations({"pipeline.tracking": {"pipeline.model.explain", "pipeline.config"}}) == [
        "pipeline.tracking imports pipeline.model.explain, a layer above it"
    ]
    assert (
        layer_violations(
            {
                "pipeline.model.fit": {"pipeline.tracking"},
                "pipeline.text.crops": {"pipeline.text"},
                "pipeline.stages.train": {"pipeline.model"},
            }
        )
        == []
    )
    modules = {
        "pipeline.text.crops": "def f():\n    import mlflow.pyfunc\n",
        "pipeline.core.files": "import os\n",
        "pipeline.metrics": "from mlflow import log_metric\n",
    }
    assert mlflow_importers(modules) == {"pipeline.text.crops", "pipeline.metrics"}


def test_the_import_rule_catches_a_light_import_inside_a_function():
    modules = {
        "pipeline.a": "import json\n\ndef f():\n    import numpy\n    from pipeline import b\n    import keras\n",
        "pipeline.b": "import os\n",
        "pipeline.c": "def g():\n    from pipeline.d import work\n",
        "pipeline.d": "from pipeline.e import x\n",
        "pipeline.e": "import tensorflow as tf\n",
    }
    assert heavy_modules(modules) == {"pipeline.d", "pipeline.e"}
    assert light_function_imports(modules) == ["pipeline.a:4 imports numpy", "pipeline.a:5 imports pipeline"]


def test_the_stage_rule_catches_a_stage_importing_one_downstream_or_beside_it():
    inside_a_function = "def run():\n    from pipeline.stages.compare.runner import run_comparison\n"
    graph = {
        "pipeline.stages.train.fit_and_log": imported_modules(inside_a_function, {"pipeline.stages.compare.runner"})
    }
    assert stage_violations(graph, STAGES) == [
        "pipeline.stages.train.fit_and_log (train) imports pipeline.stages.compare.runner (compare)"
    ]
    beside = {"pipeline.stages.pretrain.masked_lm": {"pipeline.stages.pseudo_label.teacher"}}
    assert len(stage_violations(beside, STAGES)) == 1
    upstream = {
        "pipeline.stages.compare.runner": {"pipeline.stages.train.fit_and_log"},
        "lab.experiments.bench": {"pipeline.stages.score.csv_file"},
    }
    assert stage_violations(upstream, EVERYTHING) == []


def test_the_drift_check_catches_a_makefile_and_a_table_that_disagree():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert stage_graph_drift(makefile, STAGES, files_folders()) == []
    broken = makefile.replace("\ntrain: $(ENV) $(DATA_DIR)/tokenize/manifest.json", "\ntrain: $(ENV)")
    assert broken != makefile
    assert stage_graph_drift(broken, STAGES, files_folders()) == [
        "train: make builds [], the table reads ['ingest', 'tokenize']"
    ]
    table = {**STAGES, "evaluate": STAGES["evaluate"].__class__(**{**vars(STAGES["evaluate"]), "reads": ("train",)})}
    assert stage_graph_drift(makefile, table, files_folders()) == [
        "evaluate: make builds ['ingest'], the table reads []"
    ]


def test_the_name_and_size_checks_catch_forms_of_one_word_and_a_long_function():
    assert names_of_one_idea(["pipeline.stages.tokenize", "pipeline.text.tokenizer", "pipeline.stages.train"]) == {
        "token": ["tokenize", "tokenizer"]
    }
    assert names_of_one_idea(["pipeline.runtime.servers", "pipeline.stages.serve"]) == {"serv": ["serve", "servers"]}
    assert names_of_one_idea(["pipeline.stages.train", "pipeline.model.fit"]) == {}
    long_function = "def f(a, b, c, d, e, f, g, h, i):\n" + "    x = 1\n" * 51
    assert size_violations({"pipeline.m": long_function}) == [
        "pipeline.m.f: 51 statements",
        "pipeline.m.f: 9 parameters",
    ]
    wrapped = "def f(a):\n    return g(\n" + "        a,\n" * 80 + "    )\n"  # one statement on 83 lines
    assert size_violations({"pipeline.m": wrapped}) == []
    method = "class C:\n    def f(self, a, b, c, d, e, f, g, h):\n        pass\n"
    assert size_violations({"pipeline.m": method}) == []
    assert size_violations({"pipeline.m": "x = 1\n" * 301}) == ["pipeline.m: 301 statements"]


def test_the_config_check_catches_a_whole_config_where_a_section_would_do():
    one_section = "def f(config: Config, n: int):\n    return config.training.epochs * n\n"
    assert whole_config_violations({"pipeline.stages.train.x": one_section}) == [
        "pipeline.stages.train.x.f: takes the whole Config and reads ['training'] of it"
    ]
    assert whole_config_violations({"pipeline.model.fit": one_section}) == [
        "pipeline.model.fit.f: a shared library takes the whole Config"
    ]
    paths_only = 'def f(config: "Config"):\n    return stage_dir(config, "ingest") / config.data_dir.name\n'
    assert len(whole_config_violations({"pipeline.stages.compare.x": paths_only})) == 1
    fine = {
        "pipeline.stages.train.a": "def f(config: Config):\n    return config.model, config.training\n",
        "pipeline.stages.train.b": "def f(config: Config):\n    return g(config)\n",
        "pipeline.stages.train.c": "def f(config: Config):\n    return config.section_hash('model')\n",
        "pipeline.stages.train.d": "def run(config: Config):\n    return config.model\n",
        "pipeline.stages.train.e": "def f(training: TrainingConfig):\n    return training.epochs\n",
    }
    assert whole_config_violations(fine) == []


def test_the_mirror_check_catches_a_test_of_nothing_and_one_in_the_wrong_folder():
    assert (
        unmirrored_tests(
            [
                TESTS / "stages" / "test_train.py",
                TESTS / "stages" / "ingest" / "test_tables.py",
                TESTS / "test_metrics.py",
                TESTS / "stages" / "test_score_legacy_models.py",
                TESTS / "text" / "test_wordpiece.py",
            ]
        )
        == []
    )
    assert unmirrored_tests(
        [
            TESTS / "stages" / "test_nothing.py",
            TESTS / "model" / "test_train.py",
            TESTS / "test_tables.py",
            TESTS / "elsewhere" / "test_train.py",
            TESTS / "stages" / "test_tables.py",
            TESTS / "test_wordpiece.py",
        ]
    ) == [
        "elsewhere/test_train.py",
        "model/test_train.py",
        "stages/test_nothing.py",
        "stages/test_tables.py",
        "test_tables.py",
        "test_wordpiece.py",
    ]


def test_the_name_check_catches_one_module_name_in_two_packages_but_not_the_conventions():
    assert repeated_module_names(["pipeline.text.presets", "pipeline.model.presets", "pipeline.model.fit"]) == {
        "presets": ["pipeline.model.presets", "pipeline.text.presets"]
    }
    assert (
        repeated_module_names(
            [
                "pipeline.stages.train.outputs",
                "pipeline.stages.ingest.outputs",
                "pipeline.stages.compare.report",
                "lab.experiments.bench.report",
            ]
        )
        == {}
    )
    assert repeated_module_names(["pipeline.stages.serve", "lab.experiments.serve"]) == {
        "serve": ["lab.experiments.serve", "pipeline.stages.serve"]
    }


def test_the_entry_point_check_catches_work_in_a_stage_init():
    worked = {
        "pipeline.stages.export": "def run(config):\n    pass\n\ndef folder_bytes(folder):\n    return 0\n",
        "pipeline.stages.train": "X = 1\n\ndef run(config):\n    pass\n\ndef main(config, args):\n    pass\n",
    }
    assert entry_point_violations(worked, STAGES) == ["pipeline.stages.export.folder_bytes"]


def files_folders() -> dict[str, str]:
    return catalog.FOLDERS


def shipped_packages(include: list[str]) -> set[str]:
    """The packages of the checkout (folders with an ``__init__.py``) that setuptools' ``packages.find`` with
    ``include`` patterns puts in the wheel (it matches dotted names with ``fnmatch``)."""
    names = {module_name(path.parent) for root in (PACKAGE, LAB, TESTS) for path in root.rglob("__init__.py")}
    return {name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in include)}


# --------------------------------------------------------------------------- the package


def test_the_package_root_holds_a_handful_of_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= ROOT_ENTRIES, entries
    assert {"__init__.py", "__main__.py", "stages", "core", "config"} <= set(entries)
    lab = {p.name for p in LAB.iterdir() if p.name != "__pycache__"}
    assert lab == {"__init__.py", "__main__.py", "experiments", "probes", "audits"}, lab


def test_the_wheel_ships_the_product_and_the_type_check_reads_the_lab_too():
    """``pip install`` gets ``pipeline`` and nothing of the lab, which runs from a checkout; mypy (like ruff, which
    reads the whole tree) checks both."""
    settings = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]
    shipped = shipped_packages(settings["setuptools"]["packages"]["find"]["include"])
    assert {"pipeline", "pipeline.stages.compare", "pipeline.model"} <= shipped
    assert all(name == "pipeline" or name.startswith("pipeline.") for name in shipped), sorted(shipped)
    assert set(settings["mypy"]["files"]) == {"pipeline", "lab"}


def test_one_package_per_stage_and_one_module_per_experiment():
    packages = {module_name(path.parent) for path in (PACKAGE / "stages").glob("*/__init__.py")}
    assert packages == {stage.module for stage in STAGES.values()}
    for name, stage in STAGES.items():
        assert stage.module == f"pipeline.stages.{name.replace('-', '_')}", name
    # an experiment is one module, or a package when it outgrows one: lab/experiments/<name>/__init__.py
    modules = {module_name(path) for path in (LAB / "experiments").glob("*.py") if path.name != "__init__.py"}
    experiment_packages = {module_name(path.parent) for path in (LAB / "experiments").glob("*/__init__.py")}
    assert not modules & experiment_packages
    assert modules | experiment_packages == {stage.module for stage in EXPERIMENTS.values()}
    assert not set(STAGES) & set(EXPERIMENTS)


def test_the_product_never_imports_its_lab():
    assert lab_imports(sources()) == []


def test_stages_import_only_upstream_stages_and_libraries_never_import_a_stage():
    graph = import_graph(sources())
    assert stage_violations(graph, EVERYTHING) == []
    assert library_violations(graph) == []


def test_libraries_import_only_their_layer_and_those_below():
    assert layer_violations(import_graph(sources())) == []


def test_only_the_listed_modules_import_mlflow():
    assert mlflow_importers(sources()) == MLFLOW_IMPORTERS


def test_a_function_imports_inside_itself_only_what_is_heavy():
    assert light_function_imports(sources()) == []


def test_no_import_cycle_anywhere_in_the_package():
    assert find_cycle(import_graph(sources())) is None


def test_the_makefile_and_the_stage_table_agree():
    assert stage_graph_drift((PROJECT_ROOT / "Makefile").read_text(), EVERYTHING, files_folders()) == []


def test_one_name_per_idea():
    assert names_of_one_idea(list(sources())) == {}
    assert repeated_module_names(list(sources())) == {}


def test_a_stage_init_holds_its_entry_point_only():
    assert entry_point_violations(sources(), STAGES) == []


def test_every_file_name_of_the_catalog_is_written_once():
    names = catalog_names()
    assert {"test_predictions.parquet", "model.keras", "labels.json", "vocabulary.txt"} <= set(names.values())
    assert repeated_file_names(sources(), set(names.values())) == {}


def test_no_module_function_or_parameter_list_is_too_long():
    assert size_violations(sources()) == []


def test_functions_take_the_config_section_they_use():
    assert whole_config_violations(sources()) == []


def test_the_tests_mirror_the_layout_and_every_stage_has_its_own():
    files = all_test_files()
    assert unmirrored_tests(files) == []
    named = {path.relative_to(TESTS).as_posix() for path in files}
    assert {f"stages/test_{name.replace('-', '_')}.py" for name in STAGES} <= named
