"""The durable runtime's own settings: config/runtime.yaml (+ RUNTIME_* overrides) and local folders."""

from pathlib import Path

from config.runtime import load_runtime_config
from config.settings.env import BASE_DIR, env

RUNTIME = load_runtime_config()

# Generated document corpora for the document_review workflow live here; task input names one by folder.
CORPUS_ROOT = Path(env.str("CORPUS_ROOT", default=str(BASE_DIR / "var" / "corpus")))
# Where the example workflows' "external systems" write (an outbox file, an effects log): outside PostgreSQL,
# so tests and benchmarks can count effects independently of the ledger.
EXTERNAL_ROOT = Path(env.str("EXTERNAL_ROOT", default=str(BASE_DIR / "var" / "external")))

# Tool output screening (agents_app/screening.py, docs/tool-screening.md): an optional ML classifier run after the
# rules, as "package.module:Class" (empty: the rules alone decide), and the score at which its verdict flags a string.
TOOL_SCREENING_CLASSIFIER = env.str("TOOL_SCREENING_CLASSIFIER", default="") or None
TOOL_SCREENING_CLASSIFIER_THRESHOLD = env.float("TOOL_SCREENING_CLASSIFIER_THRESHOLD", default=0.5)
