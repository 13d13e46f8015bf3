"""The packages' one-way rules (README, Layout; ARCHITECTURE §2), checked on the source, nothing imported:

- every import in the apps points down (an app may import the apps below it; tasks_app's layers likewise);
- config/ is two things: its base (the shared helpers every app imports: CONFIG_BASE) and the top-level wiring
  (settings, URLs, the ASGI and Celery entry points: the rest of config/, which imports the apps). The base imports
  no app and no wiring module; an app imports the base, never the wiring (it reads settings through
  django.conf.settings, which is not an import of config.settings);
- no import cycle among the project's modules.

A new edge that breaks one fails here with the file and line that added it.

Which imports count: for the layers, every import, a function-local one too (it runs sooner or later, and an upward
edge is one whether it runs at import time or at the first call). For cycles, module-level imports only (those under
``if TYPE_CHECKING:`` excepted): a function-local import is how a cycle is deliberately broken — it runs once every
module involved has finished loading — so it is not one; the layer rules keep such imports from pointing up. An
import of ``a.b.c`` also runs ``a`` and ``a.b`` (their ``__init__``), so those count as edges too — except the
importer's own packages, which are loading already."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The apps, lowest first: an app may import the apps below it, never one above it.
APPS = ["checkpoints_app", "tasks_app", "steering_app", "agents_app", "mcp_bridge"]
# Tooling above every app: it may import any of them (and config's wiring), none of them may import it.
ABOVE_APPS = ["bench"]
# Every package whose modules take part in the cycle check.
PACKAGES = ["config", *APPS, *ABOVE_APPS]

# config's base: config/base/, the helpers the apps share. Everything else under config/ is the wiring (settings/,
# urls, asgi, celery, celery_consumer, beat, health, api_docs, logging_redaction — which installs tasks_app's
# redaction in the logging —, asgi_shutdown, formats). The package itself (config/__init__.py) runs whenever a base
# module is imported, so it belongs to the base and must not load the wiring (the settings load the Celery app).
CONFIG_BASE = {"config", "config.base"}  # and all of config/base/

# tasks_app's layers, lowest first. A module may import its own layer and the layers below it.
TASKS_APP_LAYERS = {
    "domain": 0,    # models, registry, ids, events, streaming, redaction, errors
    "db": 1,        # tasks_app/db: the named statements and their executors
    "engine": 2,    # tasks_app/engine: the slice loop and what it runs on
    "services": 3,  # services, selectors, dead_letters, forks, the shipped example workflows
    "interface": 4,  # tasks_app/web, admin, Celery tasks, management commands, the AppConfig, templatetags
}
SERVICES = {"services", "selectors", "dead_letters", "forks", "examples"}
INTERFACES = {"web", "admin", "tasks", "management", "apps", "templatetags"}


def layer_of(module: str) -> str:
    """The layer of a tasks_app module ('tasks_app.engine.lease' → 'engine')."""
    parts = module.split(".")
    if len(parts) == 1:
        return "domain"  # the package itself (its __init__ is empty)
    head = parts[1]
    if head in ("db", "engine"):
        return head
    if head in SERVICES:
        return "services"
    if head in INTERFACES:
        return "interface"
    return "domain"


def config_part(module: str) -> str | None:
    """'base' or 'wiring' for a module of config/, None for any other."""
    if module.split(".")[0] != "config":
        return None
    return "base" if module in CONFIG_BASE or module.startswith("config.base.") else "wiring"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    where = root / Path(*name.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists() or where.is_dir()


class _Imports(ast.NodeVisitor):
    """(line, module, module_level) for every import, `from a import b` as a.b when a.b is a module of ours."""

    def __init__(self, here: str, is_package: bool, root: Path):
        self.here, self.is_package, self.root = here, is_package, root
        self.found: list[tuple[int, str, bool]] = []
        self.depth = 0  # > 0 inside a function (or under `if TYPE_CHECKING:`): not run at import time

    def _nested(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node):
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
                (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            self._nested(node)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        self.found += [(node.lineno, alias.name, not self.depth) for alias in node.names]

    def visit_ImportFrom(self, node):
        if node.level:
            package = self.here.split(".") if self.is_package else self.here.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            self.found.append((node.lineno, candidate if is_module(candidate, self.root) else base, not self.depth))


def imports_of(path: Path, root: Path | None = None) -> list[tuple[int, str, bool]]:
    root = root or ROOT
    visitor = _Imports(module_name(path, root), path.name == "__init__.py", root)
    with warnings.catch_warnings():  # a stray escape in some docstring is not this test's business
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        tree = ast.parse(path.read_text(), filename=str(path))
    visitor.visit(tree)
    return visitor.found


def source_files(package: str, root: Path | None = None):
    root = root or ROOT
    return [p for p in sorted((root / package).rglob("*.py")) if "migrations" not in p.parts]


def with_parents(target: str, here: str) -> list[str]:
    """What importing ``target`` runs: its packages' __init__ first, then itself — but not ``here``'s own packages
    (already loading when ``here`` runs)."""
    parts = target.split(".")
    own = {".".join(here.split(".")[:n]) for n in range(1, here.count(".") + 1)}
    return [name for name in (".".join(parts[:n]) for n in range(1, len(parts) + 1)) if name not in own]


def upward_imports(root: Path | None = None) -> list[str]:
    root = root or ROOT
    problems = []
    for package in ["config", *APPS]:
        if not (root / package).is_dir():
            continue
        for path in source_files(package, root):
            here = module_name(path, root)
            for line, target, _ in imports_of(path, root):
                top = target.split(".")[0]
                where = f"{path.relative_to(root)}:{line} imports {target}"
                if package == "config":
                    if config_part(here) != "base":
                        continue  # the wiring may import anything
                    wiring = [name for name in with_parents(target, here) if config_part(name) == "wiring"]
                    if top in APPS or top in ABOVE_APPS:
                        problems.append(f"{where}: config's base imports no app ({top})")
                    elif wiring:
                        problems.append(f"{where}: config's base imports no wiring ({wiring[0]})")
                    continue
                wiring = [name for name in with_parents(target, here) if config_part(name) == "wiring"]
                if wiring:
                    problems.append(f"{where}: {wiring[0]} is config's wiring, above every app")
                if (top in APPS and APPS.index(top) > APPS.index(package)) or top in ABOVE_APPS:
                    problems.append(f"{where}: {top} is above {package}")
                if package == top == "tasks_app" and \
                        TASKS_APP_LAYERS[layer_of(target)] > TASKS_APP_LAYERS[layer_of(here)]:
                    problems.append(f"{where}: {layer_of(target)} is above {layer_of(here)}")
    return problems


def import_cycles(root: Path | None = None) -> list[str]:
    """Each cycle of module-level imports among the project's modules, once, as 'a (a.py:3) → b (b.py:7) → a'."""
    root = root or ROOT
    edges: dict[str, dict[str, str]] = {}  # module → {module it runs at import: 'file:line'}
    for package in PACKAGES:
        if not (root / package).is_dir():
            continue
        for path in source_files(package, root):
            here = module_name(path, root)
            edges.setdefault(here, {})
            for line, target, module_level in imports_of(path, root):
                if not module_level or target.split(".")[0] not in PACKAGES:
                    continue
                for name in with_parents(target, here):
                    if name != here and is_module(name, root):
                        edges[here].setdefault(name, f"{path.relative_to(root)}:{line}")
    # Tarjan's strongly connected components; a component of two or more modules holds a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str):
        work = [(node, iter(sorted(edges.get(node, {}))))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[current] = min(low[current], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == current:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(edges):
        if node not in index:
            connect(node)
    cycles = []
    for component in components:
        members = set(component)
        start = min(component)
        # The shortest way back to start inside the component (breadth first): one cycle to show.
        paths = {start: [start]}
        queue = [start]
        cycle = None
        while queue and cycle is None:
            node = queue.pop(0)
            for child in sorted(edges[node]):
                if child == start:
                    cycle = paths[node] + [start]
                    break
                if child in members and child not in paths:
                    paths[child] = paths[node] + [child]
                    queue.append(child)
        cycles.append(" → ".join(f"{a} ({edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" → {start}")
    return sorted(cycles)


def test_it_finds_no_import_that_points_up():
    assert upward_imports() == []


def test_it_finds_no_import_cycle():
    assert import_cycles() == []


def test_it_would_catch_an_upward_import(tmp_path):
    """The check itself can fail: an engine module that imports the services, an app above its own or bench is
    reported."""
    engine = tmp_path / "tasks_app" / "engine"
    engine.mkdir(parents=True)
    (tmp_path / "tasks_app" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text("")
    (tmp_path / "tasks_app" / "services.py").write_text("")
    (engine / "bad.py").write_text("from tasks_app.services import task_create\nimport steering_app.models\n")
    commands = tmp_path / "tasks_app" / "management" / "commands"
    commands.mkdir(parents=True)  # what seed_tasks was before it moved to bench/
    (commands / "seed_tasks.py").write_text("from bench.seeding import SeedError\n")
    assert upward_imports(tmp_path) == [
        "tasks_app/engine/bad.py:1 imports tasks_app.services: services is above engine",
        "tasks_app/engine/bad.py:2 imports steering_app.models: steering_app is above tasks_app",
        "tasks_app/management/commands/seed_tasks.py:1 imports bench.seeding: bench is above tasks_app"]


def test_it_would_catch_an_upward_import_from_configs_base(tmp_path):
    """config's base importing an app or the wiring (even inside a function), the package loading the Celery app
    (it runs with every base import), and an app importing the wiring (the Celery app: issue 38's cycle) are
    reported; the wiring importing the apps and the base, and an app importing the base, are not."""
    config = tmp_path / "config"
    (config / "settings").mkdir(parents=True)
    (tmp_path / "tasks_app" / "db").mkdir(parents=True)
    files = {
        "config/__init__.py": "from config.celery import app as celery_app\n",
        "config/celery.py": "from celery import Celery\n\ndef ready():\n    from tasks_app.engine import failover\n",
        "config/urls.py": "from config.base import problems\nfrom tasks_app.web import views\n",
        "config/settings/__init__.py": "from config.base.rate_limits import rate_parse\n",
        "config/base/rate_limits.py": "",
        "config/base/problems.py": "from django.conf import settings\n\n\ndef f():\n"
                                   "    from tasks_app.models import Task\n",
        "config/base/json_input.py": "from config.base.problems import Problem\nfrom config.settings import DEBUG\n",
        "tasks_app/__init__.py": "",
        "tasks_app/db/__init__.py": "",
        "tasks_app/db/dispatch.py": "from config.base.json_input import loads\n\n\ndef send():\n"
                                    "    from config.celery import app\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert upward_imports(tmp_path) == [
        "config/__init__.py:1 imports config.celery: config's base imports no wiring (config.celery)",
        "config/base/json_input.py:2 imports config.settings: config's base imports no wiring (config.settings)",
        "config/base/problems.py:5 imports tasks_app.models: config's base imports no app (tasks_app)",
        "tasks_app/db/dispatch.py:5 imports config.celery: config.celery is config's wiring, above every app"]


def test_it_would_catch_a_cycle(tmp_path):
    """Two modules that import each other at load time, and a longer loop through a package's __init__, are
    cycles; a function-local import back, or one under TYPE_CHECKING, is not."""
    for package in ("tasks_app", "tasks_app/engine", "config"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    files = {
        "tasks_app/engine/a.py": "from tasks_app.engine import b\n",
        "tasks_app/engine/b.py": "import tasks_app.engine.a\n",
        "tasks_app/engine/c.py": "from tasks_app.engine.d import x\n",
        "tasks_app/engine/d.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                 "    from tasks_app.engine.c import y\n\n\ndef f():\n"
                                 "    from tasks_app.engine import c\n",
        "config/__init__.py": "from config.celery import app\n",
        "config/celery.py": "from tasks_app.db.dispatch import send\n",
        "tasks_app/db/__init__.py": "",
        "tasks_app/db/dispatch.py": "from config.base.problems import Problem\n",
        "config/base/problems.py": "",
    }
    (tmp_path / "tasks_app" / "db").mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_cycles(tmp_path) == [
        "config (config/__init__.py:1) → config.celery (config/celery.py:1) → tasks_app.db.dispatch "
        "(tasks_app/db/dispatch.py:1) → config",
        "tasks_app.engine.a (tasks_app/engine/a.py:1) → tasks_app.engine.b (tasks_app/engine/b.py:1) → "
        "tasks_app.engine.a"]


def test_it_loads_the_celery_app_with_the_settings_not_with_configs_base():
    """At run time, not only in the source: importing config's base loads no wiring (no Celery app, no app module),
    the settings load the Celery app, and a thread other than the one that loaded it sends through it too
    (tasks_app.db.dispatch uses celery.current_app, which is per thread: config/celery.py makes it the default)."""
    script = """
import sys, threading
import config.base.canonical, config.base.lazy_imports, config.base.rate_limits, config.base.runtime
PACKAGES = %r
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("config", *PACKAGES))))
import django
django.setup()
from celery import current_app
from django.conf import settings
seen = []
thread = threading.Thread(target=lambda: seen.append((current_app.main, current_app.conf.broker_url)))
thread.start()
thread.join()
print(seen == [("agent_runtime", settings.CELERY_BROKER_URL)])
"""
    done = subprocess.run([sys.executable, "-c", script % (PACKAGES,)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"})
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, same_app = done.stdout.split("\n")[:2]
    assert any(name.endswith(".canonical") for name in loaded.split()), loaded
    assert [name for name in loaded.split() if config_part(name) != "base"] == []
    assert same_app == "True"


def test_it_keeps_the_top_of_tasks_app_small():
    """At most 15 modules at tasks_app's top level: the rest lives in engine/, db/ and web/ (issue 19)."""
    modules = sorted(p.name for p in (ROOT / "tasks_app").glob("*.py"))
    assert len(modules) <= 15, modules
