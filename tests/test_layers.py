"""The packages' one-way rule (README, Layout; ARCHITECTURE §2), checked on the source: every import in the apps
points down. Parsed with ast, nothing imported: a new upward edge fails here with the file and line that added it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The apps, lowest first: an app may import the apps below it, never one above it.
APPS = ["checkpoints_app", "tasks_app", "steering_app", "agents_app", "mcp_bridge"]
# Tooling above every app: it may import any of them, none of them may import it.
ABOVE_APPS = ["bench"]

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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, `from a import b` as a.b when a.b is a module of ours."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: -node.level] if path.name != "__init__.py" else here.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)] + ([node.module] if node.module
                                                                                   else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (ROOT / Path(*candidate.split("."))).is_dir()
                found.append((node.lineno, candidate if is_module else base))
    return found


def source_files(app: str):
    return [p for p in sorted((ROOT / app).rglob("*.py")) if "migrations" not in p.parts]


def upward_imports() -> list[str]:
    problems = []
    for app in APPS:
        for path in source_files(app):
            here = module_name(path)
            for line, target in imports_of(path):
                top = target.split(".")[0]
                where = f"{path.relative_to(ROOT)}:{line} imports {target}"
                if (top in APPS and APPS.index(top) > APPS.index(app)) or top in ABOVE_APPS:
                    problems.append(f"{where}: {top} is above {app}")
                if app == top == "tasks_app" and \
                        TASKS_APP_LAYERS[layer_of(target)] > TASKS_APP_LAYERS[layer_of(here)]:
                    problems.append(f"{where}: {layer_of(target)} is above {layer_of(here)}")
    return problems


def test_it_finds_no_import_that_points_up():
    assert upward_imports() == []


def test_it_would_catch_an_upward_import(tmp_path):
    """The check itself can fail: an engine module that imports the services, an app above its own or bench is
    reported."""
    fake_root = tmp_path
    engine = fake_root / "tasks_app" / "engine"
    engine.mkdir(parents=True)
    (fake_root / "tasks_app" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text("")
    (fake_root / "tasks_app" / "services.py").write_text("")
    (engine / "bad.py").write_text("from tasks_app.services import task_create\nimport steering_app.models\n")
    commands = fake_root / "tasks_app" / "management" / "commands"
    commands.mkdir(parents=True)  # what seed_tasks was before it moved to bench/
    (commands / "seed_tasks.py").write_text("from bench.seeding import SeedError\n")
    globals()["ROOT"], saved = fake_root, ROOT
    try:
        problems = upward_imports()
    finally:
        globals()["ROOT"] = saved
    assert problems == ["tasks_app/engine/bad.py:1 imports tasks_app.services: services is above engine",
                        "tasks_app/engine/bad.py:2 imports steering_app.models: steering_app is above tasks_app",
                        "tasks_app/management/commands/seed_tasks.py:1 imports bench.seeding: bench is above tasks_app"]


def test_it_keeps_the_top_of_tasks_app_small():
    """At most 15 modules at tasks_app's top level: the rest lives in engine/, db/ and web/ (issue 19)."""
    modules = sorted(p.name for p in (ROOT / "tasks_app").glob("*.py"))
    assert len(modules) <= 15, modules
