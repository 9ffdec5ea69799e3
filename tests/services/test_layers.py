"""app.services is the Qt-core glue: QtCore and QtNetwork only (no widgets, no GUI classes), so it runs
without a display and the window's classes stay in app.ui. (import-linter sees PySide6 only as a whole.)"""

from __future__ import annotations

import ast
from pathlib import Path

import app.services

QT_CORE = {"PySide6.QtCore", "PySide6.QtNetwork"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_the_services_import_qt_core_and_network_only() -> None:
    root = Path(app.services.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 5
    qt = {}
    for module in modules:
        name = module.relative_to(root).as_posix()
        qt[name] = {
            imported for imported in _imports(module) if imported.split(".")[0] in ("PySide6", "shiboken6")
        }
        assert qt[name] <= QT_CORE, name
    assert qt["client.py"] == QT_CORE  # the check reads the imports it should
    assert "library/catalog.py" in qt  # ...and those of the packages too
