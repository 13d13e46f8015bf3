"""document_review: classify the risk of every contract in a corpus, aggregate, report, publish.

Steps: load_manifest → classify_batch × ⌈count / batch_size⌉ → aggregate → one report_<class> step per risk class
(the class the goal puts first, then the others) → write_report (costly: it checkpoints) → publish_report (an
external effect through the ledger that waits for a person's approval unless the input says
`approve_publication: false`).

Where it publishes: the input's `publish_to: {server, tool}`; else the deployment's default downstream MCP tool
(config/runtime.yaml `examples.document_review`: the tool `append` of the server `reports`) when the task's tenant has
a tool server of that name — a durable tool call through the policy gateway (docs/tools.md); else a local outbox file
(tasks_app/examples/external.py), the stand-in for a remote system, reconciled against it. The result's
`published.via` says which.

Steering: adjust_goal's parameters `excludeCategories` (risk reasons, e.g. expiring_or_expired: documents with
one are left out of the report) and `reportFirst` (the risk class reported first) re-plan the rest of the task
(replan): the aggregation and the report are redone under the new goal, even after the report was written, and
the report says what the goal asked for.
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
from tasks_app.engine.waits import EffectRejected
from tasks_app.examples import external
from tasks_app.examples.corpus import HIGH_VALUE
from tasks_app.registry import Workflow, goal_parameters, register, step, tool_server_exists

OUTBOX = "outbox/reports.jsonl"

_AMOUNT = re.compile(r"total contract value of (?:USD |EUR |\$)([\d,]+)")
_EXPIRY = re.compile(r"expires on (\d{4}-\d{2}-\d{2})")
_AUTO_RENEW = re.compile(r"automatically renew|renews automatically", re.IGNORECASE)
_NO_CONVENIENCE = re.compile(r"may not be terminated for convenience", re.IGNORECASE)
_CONVENIENCE = re.compile(r"(terminate|end) this Agreement[^.]*for convenience", re.IGNORECASE)
_UNLIMITED = re.compile(r"\bunlimited\b", re.IGNORECASE)
WEIGHTS = {"unlimited_liability": 3, "high_value": 2, "auto_renewal": 1, "expiring_or_expired": 1,
           "no_termination_for_convenience": 1}
REASONS = list(WEIGHTS)  # a document's reasons are kept as a bit mask in this order
LEVELS = ["high", "medium", "low"]


def reasons_mask(reasons: list[str]) -> int:
    return sum(1 << REASONS.index(reason) for reason in reasons)


def mask_reasons(mask: int) -> list[str]:
    return [reason for bit, reason in enumerate(REASONS) if mask & (1 << bit)]


def section_steps(goal) -> list[str]:
    first = goal_parameters(goal).get("reportFirst", "high")
    return [f"report_{level}" for level in [first, *(level for level in LEVELS if level != first)]]


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


def publish_target(ctx) -> dict:
    """Where the report goes: {"server", "tool"} of a downstream MCP tool, or {"outbox": path, "via": why}."""
    target = ctx.input.get("publish_to")
    if target:
        return {"server": target["server"], "tool": target.get("tool", "append")}
    default = settings.RUNTIME.examples.document_review
    if default.publish_server and tool_server_exists(ctx.task_id, default.publish_server):
        return {"server": default.publish_server, "tool": default.publish_tool}
    reason = (f"no tool server '{default.publish_server}' for this tenant" if default.publish_server
              else "no default tool server configured")
    return {"outbox": OUTBOX, "via": f"outbox file ({reason})"}


@register
class DocumentReview(Workflow):
    name = "document_review"
    description = ("Reviews every contract in a generated corpus: classifies risk (liability, amounts, renewal, "
                   "expiry, termination), aggregates, writes a Markdown and JSON report, and publishes it.")
    version = "2"  # 1 had no per-document reasons in its state and no report_<class> steps: not resumable here
    # As an MCP tool: minutes of work, so only as a task; it publishes (an external effect, once).
    mcp_task_support = "required"
    mcp_annotations = {"title": "Review contracts", "readOnlyHint": False, "destructiveHint": False,
                       "idempotentHint": False, "openWorldHint": True}
    input_schema = {
        "type": "object",
        "properties": {
            "corpus": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "default": "default",
                       "description": "Corpus folder name under CORPUS_ROOT (manage.py generate_corpus --name)."},
            "batch_size": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
            "approve_publication": {"type": "boolean", "default": True,
                                    "description": "Publishing the report waits for a person's approval (false: "
                                                   "only if the task's approvalPolicy asks for it)."},
            "publish_to": {"type": "object", "required": ["server"], "additionalProperties": False,
                           "description": "Publish through this downstream MCP tool server of your tenant (its "
                                          "`append` tool, e.g. the example server examples/tool_server.py): a "
                                          "durable tool call, once. Default: the tenant's server `reports` if it "
                                          "has one (the deployment's examples.document_review setting), else a "
                                          "local outbox file.",
                           "properties": {"server": {"type": "string", "minLength": 1, "maxLength": 63},
                                          "tool": {"type": "string", "minLength": 1, "maxLength": 128,
                                                   "default": "append"}}},
        },
        "additionalProperties": False,
    }
    goal_parameters_schema = {
        "type": "object",
        "properties": {
            "excludeCategories": {"type": "array", "items": {"enum": REASONS}, "uniqueItems": True,
                                  "description": "Leave documents with any of these risk reasons out of the report."},
            "reportFirst": {"enum": LEVELS, "description": "The risk class the report lists first."},
        },
        "additionalProperties": False,
    }

    def plan(self, goal, input, state):
        manifest = json.loads((corpus_dir(input.get("corpus", "default")) / "manifest.json").read_text())
        batches = math.ceil(manifest["count"] / input.get("batch_size", 100))
        return ["load_manifest"] + ["classify_batch"] * batches + self._report_steps(goal)

    def replan(self, goal, input, state, *, remaining):
        # Classification does not depend on the goal: the batches still to run stay. Everything after it is redone
        # under the new goal, even if it already ran (a report written for the old goal is replaced).
        if not remaining:
            return remaining
        return ["classify_batch"] * remaining.count("classify_batch") + self._report_steps(goal)

    @staticmethod
    def _report_steps(goal) -> list[str]:
        return ["aggregate", *section_steps(goal), "write_report", "publish_report"]

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
        levels = {"high": 0, "medium": 0, "low": 0}
        documents = []
        for number in range(first, last + 1):
            verdict = classify((folder / f"DOC-{number:05d}.txt").read_text(), reference)
            levels[verdict["level"]] += 1
            documents.append([number, LEVELS.index(verdict["level"]), reasons_mask(verdict["reasons"])])
        # Compact per batch: [number, level, reasons mask] per document, so a goal adjusted later (categories left
        # out) is answered from state, without reading the corpus again.
        ctx.state[f"batch_{batch:05d}"] = documents
        ctx.state["next_batch"] = batch + 1
        ctx.progress(0.05 + 0.8 * last / ctx.state["count"], f"classified {last}/{ctx.state['count']}")
        return {"batch": batch, "documents": last - first + 1, "high": levels["high"]}

    @step
    def aggregate(self, ctx):
        parameters = goal_parameters(ctx.goal)
        excluded_mask = reasons_mask(parameters.get("excludeCategories", []))
        totals = {"high": 0, "medium": 0, "low": 0}
        reasons: dict[str, int] = {}
        ids: dict[str, list[str]] = {level: [] for level in LEVELS}
        excluded = 0
        for batch in range(ctx.state["next_batch"]):
            for number, level, mask in ctx.state[f"batch_{batch:05d}"]:
                if mask & excluded_mask:
                    excluded += 1
                    continue
                totals[LEVELS[level]] += 1
                if level < 2:  # the report lists high and medium documents; low ones are counted
                    ids[LEVELS[level]].append(f"DOC-{number:05d}")
                for reason in mask_reasons(mask):
                    reasons[reason] = reasons.get(reason, 0) + 1
        ctx.state["summary"] = {"documents": ctx.state["count"], "totals": totals,
                                "reasons": dict(sorted(reasons.items())), "high_risk": ids["high"],
                                "medium_risk": ids["medium"], "excluded": excluded,
                                "excludedCategories": parameters.get("excludeCategories", []),
                                "reportFirst": section_steps(ctx.goal)[0].removeprefix("report_"),
                                "planVersion": ctx.plan_version}
        ctx.state["sections"] = []
        ctx.progress(0.88, "aggregated")
        return {"totals": totals, "excluded": excluded}

    def _section(self, ctx, level: str):
        summary = ctx.state["summary"]
        lines = [f"## {level.capitalize()} risk: {summary['totals'][level]} documents", ""]
        if level != "low":
            lines += [f"- {doc_id}" for doc_id in summary[f"{level}_risk"]]
        ctx.state["sections"] = [*ctx.state["sections"], "\n".join(lines)]
        ctx.progress(0.9, f"{level}-risk section written")
        return {"section": level}

    @step
    def report_high(self, ctx):
        return self._section(ctx, "high")

    @step
    def report_medium(self, ctx):
        return self._section(ctx, "medium")

    @step
    def report_low(self, ctx):
        return self._section(ctx, "low")

    @step(costly=True)
    def write_report(self, ctx):
        summary = ctx.state["summary"]
        lines = [
            "# Contract risk review", "",
            f"Documents reviewed: **{summary['documents']}** (reference date {ctx.state['reference_date']})", "",
            "| risk | documents |", "|---|---|",
            *(f"| {level} | {summary['totals'][level]} |" for level in LEVELS), "",
        ]
        if summary["excludedCategories"] or summary["planVersion"] > 1:
            lines += ["## Goal", "",
                      f"- Reported first: {summary['reportFirst']} risk",
                      f"- Left out: {', '.join(summary['excludedCategories']) or 'nothing'} "
                      f"({summary['excluded']} documents)",
                      f"- Plan version {summary['planVersion']} (the goal was adjusted while the task ran)", ""]
        lines += ["## Findings", "", *(f"- {reason}: {n}" for reason, n in summary["reasons"].items()), "",
                  *ctx.state["sections"], ""]
        ctx.state["report"] = {"markdown": ctx.artifact("report.md", "\n".join(lines)),
                               "json": ctx.artifact("report.json", json.dumps(summary, indent=1))}
        # Decided here, committed with the report: every attempt of publish_report (a retry, the run after an approval)
        # goes the same way even if the tenant's tool servers change meanwhile — a call to the server that may have
        # landed is never followed by an append to the outbox, or the other way round.
        ctx.state["publish_target"] = publish_target(ctx)
        ctx.progress(0.97, "report written")
        return {"artifacts": 2}

    @step
    def publish_report(self, ctx):
        summary = ctx.state["summary"]
        report = {"task": str(ctx.task_id), "totals": summary["totals"], "report": ctx.state["report"]["json"]}
        approval = ctx.input.get("approve_publication", True)
        target = ctx.state.get("publish_target")
        if target is None:  # its report was written before write_report decided the target: publish as it would have
            publish_to = ctx.input.get("publish_to")
            target = ({"server": publish_to["server"], "tool": publish_to.get("tool", "append")} if publish_to
                      else {"outbox": OUTBOX, "via": "outbox file"})
        try:
            if "server" in target:  # a downstream MCP tool, through the policy gateway and the ledger (docs/tools.md)
                answer = ctx.tool(target["server"], target["tool"], {"text": json.dumps(report, sort_keys=True)},
                                  approval=approval)
                ctx.state["published"] = {"published": not answer.get("isError"), "via": target["server"],
                                          "answer": answer.get("content")}
            else:
                sent = ctx.effect("publish_report", publish(report), reconcile=reconcile_publish, approval=approval,
                                  arguments=report)
                ctx.state["published"] = {**sent, "via": target["via"]}
        except EffectRejected as rejected:  # a person said no: the task completes, unpublished, saying why
            ctx.state["published"] = {"published": False, "rejected": rejected.reason}
        ctx.progress(1.0, "published" if ctx.state["published"].get("published") else "not published")
        return ctx.state["published"]

    def result(self, state):
        summary = state.get("summary", {})
        return {"documents": summary.get("documents"), "totals": summary.get("totals"),
                "reasons": summary.get("reasons"), "report": state.get("report"), "published": state.get("published")}
