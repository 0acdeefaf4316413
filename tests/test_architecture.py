"""docs/architecture.md stays true: every ``import aiayn…`` of src/aiayn/ (lazy ones inside
functions too) is read and held against the document's floors and its table of the directions of
dependency. An import the table does not list, a direction it lists that no import takes, or an
import that does not point to a lower floor fails here, naming the file."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict

from tests.helpers.runs import REPO

PACKAGE = REPO / "src" / "aiayn"
DOCUMENT = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(\w+)(?:/|\.py)` \| (.+?) \| (.+?) \|$")
FLOOR = re.compile(r"^ floor (\d+) (.*)$")


def _names(cell: str) -> set[str]:
    """The units a cell of the table names: remarks in parentheses left out; "nothing" is none."""
    bare = re.sub(r"\s*\([^)]*\)", "", cell).strip()
    return set() if bare == "nothing" else {name.strip(" `/") for name in bare.split(",")}


def documented() -> tuple[dict[str, int], dict[str, set[str]], dict[str, set[str]]]:
    """The document's floor of each unit, and its table: what each imports and is imported by."""
    floors, imports, imported_by = {}, {}, {}
    for line in DOCUMENT.read_text(encoding="utf-8").splitlines():
        if floor := FLOOR.match(line):
            for name in re.findall(r"(\w+)(?:/|\.py)", floor[2]):
                floors[name] = int(floor[1])
        elif row := ROW.match(line):
            imports[row[1]], imported_by[row[1]] = _names(row[2]), _names(row[3])
    return floors, imports, imported_by


def actual() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]], dict[str, set[str]]]:
    """What each unit (a folder or module of src/aiayn/) imports of the others, where each such
    import is, and which outside packages each imports."""
    imports, where, outside = defaultdict(set), defaultdict(list), defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if unit == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module, *(f"aiayn.{alias.name}" for alias in node.names if node.module == "aiayn")]
            else:
                continue
            for module in modules:
                top, _, rest = module.partition(".")
                if top != "aiayn":
                    outside[unit].add(top)
                elif rest and (target := rest.split(".")[0]) != unit:
                    imports[unit].add(target)
                    where[unit, target].append(str(path.relative_to(REPO)))
    units = {path.name.removesuffix(".py") for path in PACKAGE.iterdir()
             if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").is_file())}
    return {unit: imports.get(unit, set()) for unit in units}, where, outside


def test_every_import_of_the_package_is_a_direction_the_document_allows() -> None:
    floors, allowed, imported_by = documented()
    imports, where, _ = actual()
    assert sorted(allowed) == sorted(imports), "the table's rows are not the package's folders and modules"
    assert sorted(floors) == sorted(imports), "the floors are not the package's folders and modules"
    for unit, targets in imports.items():
        for target in sorted(targets - allowed[unit]):
            raise AssertionError(f"{where[unit, target][0]} imports aiayn.{target}, which docs/architecture.md does "
                                 f"not allow {unit} (it lists: {', '.join(sorted(allowed[unit])) or 'nothing'})")
        for target in sorted(allowed[unit] - targets):
            raise AssertionError(f"docs/architecture.md says {unit} imports {target}; no import of it does")
        for target in targets:
            assert floors[target] < floors[unit], (f"{where[unit, target][0]} imports aiayn.{target} (floor "
                                                   f"{floors[target]}) from floor {floors[unit]}: up, or sideways")
        users = {user for user, used in imports.items() if unit in used}
        assert imported_by[unit] == users, f"docs/architecture.md: {unit} is imported by {sorted(users)}"


def test_the_model_imports_torch_alone() -> None:
    """model/ lifts out alone: besides the standard library, torch and nothing else (no Lightning, no Hydra)."""
    _, _, outside = actual()
    assert outside["model"] - set(sys.stdlib_module_names) == {"torch"}, outside["model"]
