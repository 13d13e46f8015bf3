"""document_review: classify the risk of every contract in a corpus, aggregate, report, publish.

Steps: load_manifest → classify_batch × ⌈count / batch_size⌉ → aggregate → write_report (costly: it
checkpoints) → publish_report (an external effect through the ledger, reconciled against the outbox).
Generate a corpus first: `python manage.py generate_corpus` (2,000 documents by default).
"""

from __future__ import annotations

import json
import math
import re
from datetime import date, timedelta
from pathlib import Path

from django.conf import settings

from checkpoints_app.ledger import EffectOutcome
from tasks_app.examples import external
from tasks_app.examples.corpus import HIGH_VALUE
from tasks_app.registry import Workflow, register, step

OUTBOX = "outbox/reports.jsonl"

_AMOUNT = re.compile(r"total contract value of (?:USD |EUR |\$)([\d,]+)")
_EXPIRY = re.compile(r"expires on (\d{4}-\d{2}-\d{2})")
_AUTO_RENEW = re.compile(r"automatically renew|renews automatically", re.IGNORECASE)
_NO_CONVENIENCE = re.compile(r"may not be terminated for convenience", re.IGNORECASE)
_CONVENIENCE = re.compile(r"(terminate|end) this Agreement[^.]*for convenience", re.IGNORECASE)
_UNLIMITED = re.compile(r"\bunlimited\b", re.IGNORECASE)
WEIGHTS = {"unlimited_liability": 3, "high_value": 2, "auto_renewal": 1, "expiring_or_expired": 1,
           "no_termination_for_convenience": 1}


def corpus_dir(name: str) -> Path:
    return Path(settings.CORPUS_ROOT) / name


def classify(text: str, reference: date) -> dict:
    """Plain rules over the contract text: clauses, dates, amounts."""
    reasons = []
    if _UNLIMITED.search(text):
        reasons.append("unlimited_liability")
    amount = _AMOUNT.search(text)
    if amount and int(amount.group(1).replace(",", "")) > HIGH_VALUE:
        reasons.append("high_value")
    if _AUTO_RENEW.search(text):
        reasons.append("auto_renewal")
    expiry = _EXPIRY.search(text)
    if expiry and date.fromisoformat(expiry.group(1)) <= reference + timedelta(days=90):
        reasons.append("expiring_or_expired")
    if _NO_CONVENIENCE.search(text) or not _CONVENIENCE.search(text):
        reasons.append("no_termination_for_convenience")
    score = sum(WEIGHTS[r] for r in reasons)
    return {"score": score, "level": "high" if score >= 4 else "medium" if score >= 2 else "low", "reasons": reasons}


def publish(report: dict):
    def send(key: str) -> dict:
        # The outbox is the "remote side": it stores the idempotency key with the report it received.
        external.append_record(OUTBOX, {"key": key, **report})
        return {"published": True, "key": key}

    return send


def reconcile_publish(key: str) -> EffectOutcome:
    record = external.find_record(OUTBOX, key=key)
    return EffectOutcome.was_applied({"published": True, "key": key}) if record else EffectOutcome.not_applied()


@register
class DocumentReview(Workflow):
    name = "document_review"
    description = ("Reviews every contract in a generated corpus: classifies risk (liability, amounts, renewal, "
                   "expiry, termination), aggregates, writes a Markdown and JSON report, and publishes it.")
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {
            "corpus": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "default": "default",
                       "description": "Corpus folder name under CORPUS_ROOT (manage.py generate_corpus --name)."},
            "batch_size": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
        },
        "additionalProperties": False,
    }

    def plan(self, goal, input, state):
        manifest = json.loads((corpus_dir(input.get("corpus", "default")) / "manifest.json").read_text())
        batches = math.ceil(manifest["count"] / input.get("batch_size", 100))
        return ["load_manifest"] + ["classify_batch"] * batches + ["aggregate", "write_report", "publish_report"]

    @step
    def load_manifest(self, ctx):
        manifest = json.loads((corpus_dir(ctx.input.get("corpus", "default")) / "manifest.json").read_text())
        ctx.state["count"] = manifest["count"]
        ctx.state["reference_date"] = manifest["reference_date"]
        ctx.state["next_batch"] = 0
        ctx.progress(0.01, "loading manifest")
        return {"documents": manifest["count"]}

    @step
    def classify_batch(self, ctx):
        size = ctx.input.get("batch_size", 100)
        batch = ctx.state["next_batch"]
        first, last = batch * size + 1, min((batch + 1) * size, ctx.state["count"])
        reference = date.fromisoformat(ctx.state["reference_date"])
        folder = corpus_dir(ctx.input.get("corpus", "default")) / "docs"
        levels = {"high": [], "medium": [], "low": []}
        reasons: dict[str, int] = {}
        for number in range(first, last + 1):
            doc_id = f"DOC-{number:05d}"
            verdict = classify((folder / f"{doc_id}.txt").read_text(), reference)
            levels[verdict["level"]].append(doc_id)
            for reason in verdict["reasons"]:
                reasons[reason] = reasons.get(reason, 0) + 1
        # Compact per batch: the high-risk ids (the report lists them) and counts for the rest.
        ctx.state[f"batch_{batch:05d}"] = {"high": levels["high"], "medium": len(levels["medium"]),
                                           "low": len(levels["low"]), "reasons": reasons}
        ctx.state["next_batch"] = batch + 1
        ctx.progress(0.05 + 0.85 * last / ctx.state["count"], f"classified {last}/{ctx.state['count']}")
        return {"batch": batch, "documents": last - first + 1, "high": len(levels["high"])}

    @step
    def aggregate(self, ctx):
        totals = {"high": 0, "medium": 0, "low": 0}
        reasons: dict[str, int] = {}
        high_ids: list[str] = []
        for batch in range(ctx.state["next_batch"]):
            part = ctx.state[f"batch_{batch:05d}"]
            totals["high"] += len(part["high"])
            totals["medium"] += part["medium"]
            totals["low"] += part["low"]
            high_ids += part["high"]
            for reason, n in part["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + n
        ctx.state["summary"] = {"documents": ctx.state["count"], "totals": totals,
                                "reasons": dict(sorted(reasons.items())), "high_risk": high_ids}
        ctx.progress(0.92, "aggregated")
        return {"totals": totals}

    @step(costly=True)
    def write_report(self, ctx):
        summary = ctx.state["summary"]
        lines = [
            "# Contract risk review", "",
            f"Documents reviewed: **{summary['documents']}** (reference date {ctx.state['reference_date']})", "",
            "| risk | documents |", "|---|---|",
            *(f"| {level} | {summary['totals'][level]} |" for level in ("high", "medium", "low")), "",
            "## Findings", "", *(f"- {reason}: {n}" for reason, n in summary["reasons"].items()), "",
            "## High-risk documents", "", *(f"- {doc_id}" for doc_id in summary["high_risk"]), "",
        ]
        ctx.state["report"] = {"markdown": ctx.artifact("report.md", "\n".join(lines)),
                               "json": ctx.artifact("report.json", json.dumps(summary, indent=1))}
        ctx.progress(0.97, "report written")
        return {"artifacts": 2}

    @step
    def publish_report(self, ctx):
        summary = ctx.state["summary"]
        report = {"task": str(ctx.task_id), "totals": summary["totals"], "report": ctx.state["report"]["json"]}
        ctx.state["published"] = ctx.effect("publish_report", publish(report), reconcile=reconcile_publish)
        ctx.progress(1.0, "published")
        return ctx.state["published"]

    def result(self, state):
        summary = state.get("summary", {})
        return {"documents": summary.get("documents"), "totals": summary.get("totals"),
                "reasons": summary.get("reasons"), "report": state.get("report"), "published": state.get("published")}
