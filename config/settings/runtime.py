"""The durable runtime's own settings: config/runtime.yaml (+ RUNTIME_* overrides) and local folders."""

from pathlib import Path

from config.base.runtime import load_runtime_config
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

# The audit trail's anchors (tasks_app/audit/anchors.py, docs/audit.md): the Ed25519 private key that signs each seal
# of the event chains' heads. It is held OUTSIDE the database (a file, readable only by the runtime's account; in
# production a mounted secret), so that someone who can rewrite the database cannot forge a seal. Never logged. With
# AUDIT_SIGNING_KEY_GENERATE (development and tests: deploy/dev.py sets it) a missing key is generated into the file.
AUDIT_SIGNING_KEY_FILE = Path(env.str("AUDIT_SIGNING_KEY_FILE",
                                      default=str(BASE_DIR / "var" / "audit_signing_key.pem")))
AUDIT_SIGNING_KEY_GENERATE = env.bool("AUDIT_SIGNING_KEY_GENERATE", default=False)
# The retention purge (tasks_app/audit/retention.py) first writes each task it deletes as JSON Lines with its chain and
# anchor proof to blob storage (exports/tasks/<id>.jsonl), verifiable offline with deploy/verify_export.py.
RETENTION_EXPORT = env.bool("RETENTION_EXPORT", default=False)
