"""The runtime's house rules, read from the source (``ast``, nothing imported): which package may import which.

Every module under ``slime/`` and ``train.py`` is parsed and every import it makes is an edge of one graph,
imports inside functions included (a lazy import still ties the two modules together). The edge goes to the
module named: ``from slime.utils import http_utils`` to ``slime.utils.http_utils``, ``from slime.utils.types
import Sample`` to ``slime.utils.types``. Imports of anything outside ``slime`` (``examples``, torch) are
not edges. The rules:

* no import circle between modules;
* no import from a lower layer to a higher one (``LAYERS``, lowest first; a module may import its own layer
  and every layer below). docs/en/developer_guide/architecture.md shows the same order (``ORDER_LINE``);
* no file under ``slime/`` over ``MAX_LINES`` lines;
* at most ``MAX_UTILS_FILES`` files directly in ``slime/utils/`` (``__init__.py`` included), and no package
  inside it.

Each failure names the offending edge (``file:line``), circle or file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs/en/developer_guide/architecture.md"
MAX_LINES = 400
MAX_UTILS_FILES = 15

# (layer, module prefixes), lowest first. A module belongs to the layer of its longest matching prefix.
# slime/utils/tcod_arguments.py is an argument group like those of slime/arguments/ (which import it); it stays
# in utils only because the PR ports it to that path.
LAYERS = (
    ("arguments", ("slime.arguments", "slime.utils.tcod_arguments")),
    ("utils", ("slime.utils",)),
    ("checkpoint", ("slime.checkpoint",)),
    ("backends", ("slime.backends",)),
    ("rollout", ("slime.rollout",)),
    ("ray", ("slime.ray",)),
    ("launch", ("slime.launch",)),
    ("train.py", ("train",)),
)
# The package root holds only __version__: any layer may import it.
ROOT_PACKAGE = "slime"
ORDER_LINE = " < ".join(name for name, _ in LAYERS)


def _modules() -> dict[str, Path]:
    found = {"train": ROOT / "train.py"}
    for path in sorted((ROOT / "slime").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of this tree that ``name`` (a module or a name inside one) lives in, or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges() -> dict[str, list[tuple[str, int]]]:
    """module -> [(imported module, line)], each import once per line."""
    edges: dict[str, list[tuple[str, int]]] = {}
    for module, path in MODULES.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        out = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                # "from pkg import mod" names a module; "from mod import name" names the module.
                targets = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            for target in targets:
                resolved = _resolve(target)
                if resolved and resolved != module and (resolved, node.lineno) not in out:
                    out.append((resolved, node.lineno))
        edges[module] = out
    return edges


EDGES = _edges()


def layer_of(module: str) -> int | None:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def _circles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a list of modules."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w, _ in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(EDGES):
        if v not in index:
            visit(v)
    return found


def _one_circle(component: list[str]) -> str:
    """One closed path through ``component``, each step with the line that imports: a -> b (file:line) -> ... -> a."""
    members, start = set(component), component[0]
    came_from: dict[str, tuple[str, int]] = {}  # module -> (the module importing it on the path, line)
    queue = [start]
    while queue and start not in came_from:  # breadth first: the shortest way back to start
        here = queue.pop(0)
        for target, line in EDGES[here]:
            if target in members and target not in came_from:
                came_from[target] = (here, line)
                queue.append(target)
    steps, node = [], start
    while True:
        importer, line = came_from[node]
        steps.append(f"{node} ({_where(importer, line)})")
        node = importer
        if node == start:
            break
    return " -> ".join([start, *reversed(steps)])


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if m != ROOT_PACKAGE and layer_of(m) is None]
    assert not missing, f"modules in no layer of LAYERS (add their package to the table and to architecture.md): " \
                        f"{missing}"


def test_no_import_circle():
    circles = [_one_circle(component) for component in _circles()]
    assert not circles, "import circles (break each: move the shared piece down a layer, or pass it in):\n  " + \
        "\n  ".join(circles)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = []
    for module, targets in EDGES.items():
        here = layer_of(module)
        for target, line in targets:
            there = layer_of(target)
            if target != ROOT_PACKAGE and here is not None and there is not None and there > here:
                upward.append(f"{_where(module, line)}: {module} ({LAYERS[here][0]}) imports {target} "
                              f"({LAYERS[there][0]})")
    assert not upward, f"imports against the layer order {ORDER_LINE}:\n  " + "\n  ".join(upward)


def test_architecture_shows_the_same_layer_order():
    shown = ORDER_LINE in ARCHITECTURE.read_text(encoding="utf-8")
    assert shown, f"{ARCHITECTURE.relative_to(ROOT)} does not show the layer order of this test: {ORDER_LINE}"


def test_no_file_under_slime_is_over_the_line_limit():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in sorted((ROOT / "slime").rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines (split each by job):\n  " + "\n  ".join(long)


def test_utils_stays_small():
    utils = ROOT / "slime/utils"
    files = sorted(p.name for p in utils.glob("*.py"))
    packages = sorted(p.name for p in utils.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert len(files) <= MAX_UTILS_FILES, (f"slime/utils/ holds {len(files)} files, more than {MAX_UTILS_FILES}: "
                                           f"{files}; give the newest its package's room")
    assert not packages, f"packages inside slime/utils/ (a package of its own belongs under slime/): {packages}"
