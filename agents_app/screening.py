"""Tool output screening: a prompt-injection screen every tool result passes before a workflow or a model sees it
(docs/tool-screening.md; docs/architecture.md §11, "outcome recorded ──▶ output screen ──▶ the step / model").

    screening = screen(result)          # result: an MCP CallToolResult as a dict, or any JSON value
    screening.flagged                   # True when any rule (or the optional classifier) found something
    screening.findings                  # [Finding(rule, where="content[0].text", excerpt (redacted), severity)]
    screening.cleaned                   # the result with each flagged span replaced by "[removed: <rule>]" and
                                        # hidden characters stripped: what the "redact" policy passes on

The rules live in agents_app/screening_rules.py, one named rule per kind of attack: hidden_unicode,
instruction_override, role_marker, markdown_exfil, secret_request. They read a view of each string (invisible
characters removed, compatibility forms folded, whitespace collapsed, lower case), so "ig\u200bnore" and full-width
letters match like plain ASCII; their spans are mapped back onto the original string for `cleaned`. Every pattern
is bounded (its longest match is known) and runs only near the literals its matches must contain, so no output can
make the screen slow (tests/test_tool_screening.py times the worst inputs we know).

Bounded: at most MAX_SCAN_BYTES of strings (UTF-8, keys included), MAX_NODES values and MAX_DEPTH levels are read.
What lies past a bound is NOT passed unscreened: it yields one `unscanned` finding (so the result is flagged and
the policy decides) and is replaced by "[removed: unscanned]" in `cleaned`. Binary content (an image's or audio's
`data`, a resource's `blob`) is not text a model reads as instructions and is not screened; it is kept as is.

An optional classifier (an ML model, outside this project) runs after the rules on every screened string:
settings.TOOL_SCREENING_CLASSIFIER = "package.module:Class" (see Classifier). Without it the rules alone decide.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import re
import sys
import time
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Protocol, runtime_checkable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agents_app import screening_rules as rules
from agents_app.screening_rules import HIGH, MEDIUM, RULES, View
from tasks_app.redaction import redact

logger = logging.getLogger(__name__)

MAX_SCAN_BYTES = 256 * 1024  # strings read per result (UTF-8 bytes, dict keys included)
MAX_NODES = 20_000  # JSON values visited per result
# Past the byte cap a string this short is still screened (bounded by MAX_NODES), so a result keeps its shape —
# "type": "text", MIME types, ids — while its long text is removed.
SHORT_BYTES = 64
MAX_DEPTH = 64  # nesting levels
EXCERPT_CHARS = 120
# How far `cleaned` widens a removed instruction: back to its sentence's start, on to its paragraph's end.
WIDEN_BACK = 300
WIDEN_FORWARD = 1000

MAX_FINDINGS = 100  # Finding objects per result; past this they are counted (Screening.omitted), not listed


@dataclass(frozen=True)
class Finding:
    """One thing a rule found. `where` is a JSON path into the result (content[0].text, structuredContent.items[2]
    .body, "$" for a bare string); `excerpt` is short and redacted (tasks_app.redaction), fit for an event; `span` is
    the (start, end) character range in the original string at `where` (None: the whole string)."""

    rule: str
    where: str
    excerpt: str
    severity: str
    span: tuple[int, int] | None = None

    def as_event(self) -> dict:
        return {"rule": self.rule, "where": self.where, "excerpt": self.excerpt, "severity": self.severity}


@dataclass(frozen=True)
class Screening:
    flagged: bool
    findings: list[Finding]
    cleaned: Any
    scanned_bytes: int = 0
    complete: bool = True  # False: a bound stopped the walk (an `unscanned` finding says where)
    omitted: int = 0  # findings past MAX_FINDINGS, counted and not listed

    def as_event(self) -> dict:
        """The `tool.flagged` event's data: rules, paths, redacted excerpts — never the output itself."""
        return {"flagged": self.flagged, "findings": [finding.as_event() for finding in self.findings],
                "omittedFindings": self.omitted, "scannedBytes": self.scanned_bytes, "complete": self.complete}


@runtime_checkable
class Classifier(Protocol):
    """An optional second opinion after the rules, e.g. a fine-tuned prompt-injection model (an optional extra; none
    ships with the runtime). Configured as settings.TOOL_SCREENING_CLASSIFIER = "package.module:Class" (a class is
    instantiated once, without arguments; a module-level object with a classify method is used as is).

    classify(text) is called once per screened string, with the rules' view of it (invisible characters removed),
    at most MAX_SCAN_BYTES in all per result; it does its own chunking if its model has a context limit. It returns:
      - a float in [0, 1], the probability of an injection: at or above settings.TOOL_SCREENING_CLASSIFIER_THRESHOLD
        (default 0.5) it becomes a `classifier` finding over the whole string (≥ 0.9: high severity);
      - or Findings (one, or an iterable): their rule, excerpt, severity and span (character offsets into the text it
        was given) are kept, `where` is set by the screen;
      - or None: nothing found.
    If it raises, the string gets a `classifier_error` finding (the screen fails closed, loudly; the exception's type
    is logged, never the text)."""

    def classify(self, text: str) -> float | Finding | Iterable[Finding] | None: ...


# --- characters ---------------------------------------------------------------------------------------------------

# Stripped from `cleaned` (outside flagged spans): what carries no meaning in ordinary text. Joiners (ZWJ/ZWNJ) only
# next to ASCII letters or in runs — they shape emoji, Persian and Indic text. Embeddings and isolates stay.
_CLEAN_STRIP = re.compile("[\u200b\u2060-\u2064\ufeff\u180e\u202d\u202e]+|[\ufe00-\ufe0f\U000e0100-\U000e01ef]{2,}"
                          "|(?<=[A-Za-z])[\u200c\u200d]+|[\u200c\u200d]+(?=[A-Za-z])|[\u200c\u200d]{2,}")


# Any character _strip_for_cleaned may remove (one cheap scan decides whether the slower substitution runs).
_MAY_STRIP = re.compile("[\u200b-\u200d\u2060-\u2064\ufeff\u180e\u202d\u202e\ufe00-\ufe0f\U000e0000-\U000e01ef]")


def _strip_for_cleaned(text: str) -> str:
    if text.isascii() or not _MAY_STRIP.search(text):
        return text
    text = _CLEAN_STRIP.sub("", text)
    if "\U000e0000" <= max(text, default="\0"):
        flags = {m.start() for m in rules.FLAG_SEQUENCE.finditer(text)}
        out, pos = [], 0
        for m in rules.TAG_RUN.finditer(text):
            if m.start() - 1 in flags:  # the tags of a subdivision flag
                continue
            out.append(text[pos:m.start()])
            pos = m.end()
        text = "".join(out) + text[pos:]
    return text


# --- the classifier hook ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def _load_classifier(path: str) -> Classifier:
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ImproperlyConfigured(f"TOOL_SCREENING_CLASSIFIER {path!r} cannot be loaded ({error}); give "
                                   f"'package.module:Class'") from None
    classifier = target() if isinstance(target, type) else target
    if not callable(getattr(classifier, "classify", None)):
        raise ImproperlyConfigured(f"TOOL_SCREENING_CLASSIFIER {path!r} has no classify(text) method")
    return classifier


def configured_classifier() -> Classifier | None:
    """The classifier settings.TOOL_SCREENING_CLASSIFIER names (loaded once), or None."""
    path = getattr(settings, "TOOL_SCREENING_CLASSIFIER", None)
    if not path:
        return None
    threshold = getattr(settings, "TOOL_SCREENING_CLASSIFIER_THRESHOLD", 0.5)
    if not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise ImproperlyConfigured(f"TOOL_SCREENING_CLASSIFIER_THRESHOLD must be a number from 0 to 1, not "
                                   f"{threshold!r}")
    return _load_classifier(path)


def _classifier_findings(classifier: Classifier, view: View, where: str) -> list[tuple[Finding, tuple | None]]:
    """(finding, span in the original string or None) for what the classifier says about one string."""
    threshold = float(getattr(settings, "TOOL_SCREENING_CLASSIFIER_THRESHOLD", 0.5))
    try:
        verdict = classifier.classify(view.text)
    except Exception as error:  # an optional extra failing must not let output through unscreened
        logger.warning("tool output classifier %s raised %s", type(classifier).__name__, type(error).__name__)
        return [(Finding("classifier_error", where, f"the classifier raised {type(error).__name__}", MEDIUM), None)]
    if verdict is None:
        return []
    if isinstance(verdict, (int, float)) and not isinstance(verdict, bool):
        if verdict < threshold:
            return []
        return [(Finding("classifier", where, f"score {float(verdict):.2f}: {_excerpt(view.text)}",
                         HIGH if verdict >= 0.9 else MEDIUM), None)]
    found = []
    for finding in [verdict] if isinstance(verdict, Finding) else verdict:
        span = view.original_span(*finding.span) if finding.span else None
        found.append((replace(finding, where=where, excerpt=_excerpt(finding.excerpt), span=span), span))
    return found


# --- the walk -----------------------------------------------------------------------------------------------------

def _excerpt(text: str) -> str:
    # Redacted before it is cut, so the cut cannot split a secret out of its pattern's reach.
    text = redact(" ".join(text[:4 * EXCERPT_CHARS].split()))
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 1] + "…"


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _child_path(path: str, key: str) -> str:
    if _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(_excerpt(_strip_for_cleaned(key))[:64], ensure_ascii=False)}]"


# Between the strings of a result, which are screened as one text (one pass of each pattern, however many strings):
# no pattern matches across it — a word pattern needs a word after the line break, a turn's body stops at "<", a
# line's at the line break, a tag's attributes at ">".
SEPARATOR = "\n<\x00>\n"


@dataclass(frozen=True)
class _Slot:
    """Where a screened string goes back into the cleaned result."""

    index: int


@dataclass
class _Walk:
    """Collects the strings of a result (within the bounds) and the result's shape with each string's slot."""

    budget: int = MAX_SCAN_BYTES
    nodes: int = 0
    scanned: int = 0
    texts: list[str] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    tails: list[str] = field(default_factory=list)  # "" or "[removed: unscanned]": the part past the byte cap
    unscanned_at: str | None = None
    unscanned_bytes: int = 0

    def skipped(self, where: str, size: int) -> str:
        if self.unscanned_at is None:
            self.unscanned_at = where
        self.unscanned_bytes += size
        return "[removed: unscanned]"

    def value(self, value: Any, path: str, depth: int, binary: bool = False) -> Any:
        self.nodes += 1
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str):
            return value if binary else self.string(value, path)
        if not isinstance(value, (dict, list, tuple)):
            raise TypeError(f"screen() takes JSON values (dict, list, str, number, bool, None), not "
                            f"{type(value).__name__} at {path or '$'}")
        if depth >= MAX_DEPTH or self.nodes > MAX_NODES:
            return self.skipped(path or "$", len(json.dumps(value, default=str)))
        if isinstance(value, dict):
            # An MCP image/audio block's data and a resource's blob are base64, not text a model reads.
            binary_keys = {"data", "blob"} if value.get("type") in ("image", "audio") else {"blob"}
            shape = []
            for key, item in value.items():
                key = str(key)
                child = _child_path(path, key)
                shape.append((self.string(key, f"{child}(key)"), self.value(item, child, depth + 1,
                                                                            binary=key in binary_keys)))
            return _Dict(shape)
        return [self.value(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]

    def string(self, text: str, path: str) -> _Slot | str:
        where = path or "$"
        if not text:
            return text
        size = len(text.encode("utf-8", "surrogatepass"))
        tail = ""
        if self.budget <= 0:
            if size > SHORT_BYTES:
                return self.skipped(where, size)
        elif size > self.budget:  # read up to the bound; the rest is removed, not passed on unread
            head = text.encode("utf-8", "surrogatepass")[:self.budget].decode("utf-8", "ignore")
            tail = self.skipped(where, size - len(head.encode("utf-8", "surrogatepass")))
            text, size = head, self.budget
        if self.budget > 0:
            self.budget -= size
            self.scanned += size
        self.texts.append(text)
        self.wheres.append(where)
        self.tails.append(tail)
        return _Slot(len(self.texts) - 1)


class _Dict(list):
    """A dict's shape: (key or its slot, value) pairs, in order."""


def _filled(shape: Any, cleaned: list[str], tails: list[str]) -> Any:
    if isinstance(shape, _Slot):
        return cleaned[shape.index] + tails[shape.index]
    if isinstance(shape, _Dict):
        result = {}
        for key, item in shape:
            key = _filled(key, cleaned, tails)
            if key in result:  # two keys cleaned to the same marker
                key = f"{key}#{len(result)}"
            result[key] = _filled(item, cleaned, tails)
        return result
    if isinstance(shape, list):
        return [_filled(item, cleaned, tails) for item in shape]
    return shape


@dataclass
class _Screened:
    findings: list[Finding] = field(default_factory=list)
    omitted: int = 0

    def add(self, finding: Finding) -> None:  # (findings past MAX_FINDINGS are counted, not listed)
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append(finding)
        else:
            self.omitted += 1


def _screen_texts(texts: list[str], wheres: list[str], classifier: Classifier | None, full_scan: bool,
                  screened: _Screened) -> list[str]:
    """Each text's cleaned form, the findings added to `screened`. The texts are joined by SEPARATOR and each rule
    runs once over the whole; each hit is put back into its own text."""
    if not texts:
        return []
    starts, at = [], 0
    for text in texts:
        starts.append(at)
        at += len(text) + len(SEPARATOR)
    joined = SEPARATOR.join(texts)
    view = View(joined)
    text_rules = full_scan or rules.may_match(view)
    spans: list[list[tuple[int, int, str]]] = [[] for _ in texts]
    saturated: set[str] = set()
    for name, (rule, on_original) in RULES.items():
        if not on_original and not text_rules:
            continue
        hits = rule(joined) if on_original else rule(view, full_scan)
        if len(hits) > rules.MAX_HITS:
            saturated.add(name)  # a rule stopped early: what it did not reach cannot be kept
        for hit in hits[:rules.MAX_HITS]:
            start, end = (hit.start, hit.end) if on_original else view.original_span(hit.start, hit.end)
            index = bisect_right(starts, end - 1) - 1  # the text it ends in (it may begin on the separator)
            base = starts[index]
            local_start, local_end = max(0, start - base), min(len(texts[index]), end - base)
            if local_end <= local_start:
                continue
            text = texts[index]
            excerpt = hit.excerpt or View(text[local_start:local_end]).text
            screened.add(Finding(name, wheres[index], _excerpt(excerpt), hit.severity, (local_start, local_end)))
            if hit.widen:
                local_start, local_end = _widened(text, local_start, local_end)
            spans[index].append((local_start, local_end, name))
    if classifier is not None:
        for index, text in enumerate(texts):
            for finding, span in _classifier_findings(classifier, View(text), wheres[index]):
                screened.add(finding)
                spans[index].append((*(span or (0, len(text))), finding.rule))
    if saturated:
        # An output this dense with attack shapes is not worth keeping in part: every string of it is removed.
        marker = f"[removed: {', '.join(sorted(saturated))}]"
        return [marker for _ in texts]
    return [_cleaned(text, text_spans) for text, text_spans in zip(texts, spans)]


_PARAGRAPH_END = re.compile(r"\n[ \t]*\n")


def _last_sentence_end(text: str, low: int, high: int) -> int | None:
    """The end of the last sentence that ends in text[low:high] (after . ! ? and a space, or a line break)."""
    best = text.rfind("\n", low, high)
    best = best + 1 if best >= 0 else None
    for mark in ".!?。！？":
        at = text.rfind(mark, low, high)
        while at >= 0 and (best is None or at + 1 > best):
            if mark in "。！？" or at + 1 == len(text) or text[at + 1].isspace():
                best = at + 1
                break
            at = text.rfind(mark, low, at)
    return best


def _widened(text: str, start: int, end: int) -> tuple[int, int]:
    """The span from its sentence's start (at most WIDEN_BACK characters back) to its paragraph's end (a blank line,
    at most WIDEN_FORWARD characters on; past that, the last sentence end within reach)."""
    low = max(0, start - WIDEN_BACK)
    sentence_start = _last_sentence_end(text, low, start)
    new_start = sentence_start if sentence_start is not None else (0 if low == 0 else start)
    while new_start < start and text[new_start] in " \t":  # the space after the sentence before stays
        new_start += 1
    high = min(len(text), end + WIDEN_FORWARD)
    paragraph = _PARAGRAPH_END.search(text, end, high)
    if paragraph:
        return new_start, paragraph.start()
    if high == len(text):
        return new_start, high
    sentence_end = _last_sentence_end(text, end, high)
    return new_start, sentence_end if sentence_end is not None else high


def _cleaned(text: str, spans: list[tuple[int, int, str]]) -> str:
    if not spans:
        return _strip_for_cleaned(text)
    spans.sort()
    merged: list[list] = []
    for start, end, rule in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
            if rule not in merged[-1][2]:
                merged[-1][2].append(rule)
        else:
            merged.append([start, end, [rule]])
    out, pos = [], 0
    for start, end, names in merged:
        out.append(_strip_for_cleaned(text[pos:start]))
        out.append(f"[removed: {', '.join(names)}]")
        pos = end
    out.append(_strip_for_cleaned(text[pos:]))
    return "".join(out)


def screen(result: Any, *, classifier: Classifier | None | bool = True, full_scan: bool = False) -> Screening:
    """Screen a tool's result (an MCP CallToolResult as a dict, or any JSON value) before a workflow or model sees it.

    Every string is read (up to MAX_SCAN_BYTES; what lies past a bound is flagged `unscanned` and removed from
    `cleaned`), each rule in RULES runs on it, then the configured classifier if any (classifier=False: rules only;
    an object: that classifier). full_scan=True runs every pattern over the whole of each string instead of the
    windows around its anchors: the same findings, slower (the tests compare the two). Raises TypeError for a value
    JSON cannot hold; ImproperlyConfigured for a TOOL_SCREENING_CLASSIFIER that cannot be loaded."""
    if classifier is True:
        classifier = configured_classifier()
    walk = _Walk()
    shape = walk.value(result, "", 0)
    screened = _Screened()
    cleaned = _screen_texts(walk.texts, walk.wheres, classifier or None, full_scan, screened)
    if walk.unscanned_at is not None:
        screened.findings.append(Finding(
            "unscanned", walk.unscanned_at, f"{walk.unscanned_bytes} bytes past the screening bounds ({MAX_SCAN_BYTES} "
            f"bytes, {MAX_NODES} values, {MAX_DEPTH} levels) were not screened and are removed", MEDIUM))
    return Screening(flagged=bool(screened.findings or screened.omitted), findings=screened.findings,
                     cleaned=_filled(shape, cleaned, walk.tails), scanned_bytes=walk.scanned,
                     complete=walk.unscanned_at is None, omitted=screened.omitted)


# --- the corpus ---------------------------------------------------------------------------------------------------

CORPUS_DIR = Path(__file__).resolve().parent / "screening_corpus"


@dataclass(frozen=True)
class CorpusReport:
    injections: int
    detected: list[str]
    misses: list[dict]  # injection lines not flagged
    benign: int
    false_positives: list[tuple[dict, list[Finding]]]  # benign lines flagged, with what flagged them

    @property
    def detection_rate(self) -> float:
        return len(self.detected) / self.injections if self.injections else 0.0

    @property
    def false_positive_rate(self) -> float:
        return len(self.false_positives) / self.benign if self.benign else 0.0


def load_corpus(path: Path) -> list[dict]:
    """A corpus file: one JSON object a line, {"id", "text" or "result", "note"}."""
    lines = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        if not isinstance(item.get("id"), str) or ("text" in item) == ("result" in item):
            raise ValueError(f"{path.name}:{number}: needs an id and exactly one of text, result")
        lines.append(item)
    return lines


def evaluate_corpus(directory: Path = CORPUS_DIR, *, classifier: Classifier | None | bool = False) -> CorpusReport:
    """Screen injection.jsonl and benign.jsonl (rules only unless a classifier is given)."""
    injections, benign = load_corpus(directory / "injection.jsonl"), load_corpus(directory / "benign.jsonl")
    detected, misses, false_positives = [], [], []
    for item in injections:
        flagged = screen(item.get("result", item.get("text")), classifier=classifier).flagged
        if flagged:
            detected.append(item["id"])
        else:
            misses.append(item)
    for item in benign:
        screening = screen(item.get("result", item.get("text")), classifier=classifier)
        if screening.flagged:
            false_positives.append((item, screening.findings))
    return CorpusReport(len(injections), detected, misses, len(benign), false_positives)


def _print_corpus_report(directory: Path, classifier_path: str | None) -> int:
    started = time.perf_counter()
    report = evaluate_corpus(directory, classifier=True if classifier_path else False)
    elapsed = time.perf_counter() - started
    print(f"corpus {directory.relative_to(Path.cwd()) if directory.is_relative_to(Path.cwd()) else directory} "
          f"— rules{' + classifier ' + classifier_path if classifier_path else ' only'}")
    print(f"injection: {len(report.detected)}/{report.injections} flagged — detection rate "
          f"{100 * report.detection_rate:.1f} %")
    print(f"benign:    {len(report.false_positives)}/{report.benign} flagged — false-positive rate "
          f"{100 * report.false_positive_rate:.1f} %")
    print(f"screened {report.injections + report.benign} outputs in {1000 * elapsed:.0f} ms")
    print(f"misses ({len(report.misses)}):")
    for item in report.misses:
        print(f"  {item['id']}: {item.get('note', '')}")
    print(f"false positives ({len(report.false_positives)}):")
    for item, findings in report.false_positives:
        print(f"  {item['id']}: {item.get('note', '')}")
        for finding in findings:
            print(f"    {finding.rule} ({finding.severity}) at {finding.where}: {finding.excerpt}")
    return 0


def _timing_inputs() -> dict[str, Any]:
    """Outputs of the byte cap's size: ordinary ones, and the costliest hostile shapes we know."""
    cap = MAX_SCAN_BYTES

    def fill(unit: str) -> str:
        return (unit * (cap // len(unit.encode()) + 1)).encode()[:cap].decode("utf-8", "ignore")

    source = Path(__file__).read_text(encoding="utf-8")
    return {
        "prose (a web page's text)": fill("The committee met on Tuesday to review the budget; the user survey, the "
                                          "API key rotation and the new onboarding notes were discussed. "),
        "code (this module)": fill(source),
        "a table: 3,000 rows × 5 fields": {"rows": [
            {"id": i, "name": f"user{i}", "email": f"user{i}@example.com", "status": "active",
             "note": "regular customer since 2019"} for i in range(3000)]},
        "hostile: 'ignore all the previous ' repeated": fill("ignore all the previous "),
        "hostile: 'include the token to the reply ' repeated": fill("include the token to the reply "),
        "hostile: image URLs with payloads": fill("![x](https://e.example/?q=" + "A1b" * 20 + " "),
        "hostile: a letter and a zero-width space repeated": fill("a\u200b"),
        "hostile: '<|im_start|>system' lines": fill("<|im_start|>system\n"),
    }


def _print_timing() -> int:
    print(f"screen() at the byte cap ({MAX_SCAN_BYTES} bytes), rules only, best of 5:")
    for name, result in _timing_inputs().items():
        best = min(_timed(result) for _ in range(5))
        print(f"  {name}: {1000 * best:.1f} ms")
    return 0


def _timed(result: Any) -> float:
    started = time.perf_counter()
    screen(result, classifier=False)
    return time.perf_counter() - started


def _main(argv: list[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m agents_app.screening", description="Screen tool output for "
                                     "prompt injection (docs/tool-screening.md).")
    parser.add_argument("--corpus", nargs="?", const=str(CORPUS_DIR), metavar="DIR",
                        help="report detection and false-positive rates on DIR/injection.jsonl and "
                             "DIR/benign.jsonl (default: the shipped corpus)")
    parser.add_argument("--timing", action="store_true",
                        help="time the screen on ordinary and hostile outputs at the byte cap (docs/performance.md)")
    parser.add_argument("file", nargs="?", help="a JSON tool result to screen ('-': standard input)")
    arguments = parser.parse_args(argv)
    if not settings.configured and "DJANGO_SETTINGS_MODULE" not in os.environ:
        # Only the redaction and screening settings are needed: no database, no secret key (config/runtime.yaml's
        # redaction patterns apply; TOOL_SCREENING_CLASSIFIER from the environment, as in config/settings).
        from config.base.runtime import load_runtime_config
        settings.configure(RUNTIME=load_runtime_config(),
                           TOOL_SCREENING_CLASSIFIER=os.environ.get("TOOL_SCREENING_CLASSIFIER") or None,
                           TOOL_SCREENING_CLASSIFIER_THRESHOLD=float(
                               os.environ.get("TOOL_SCREENING_CLASSIFIER_THRESHOLD") or 0.5))
    else:
        import django
        django.setup()
    classifier_path = getattr(settings, "TOOL_SCREENING_CLASSIFIER", None)
    if arguments.corpus:
        return _print_corpus_report(Path(arguments.corpus).resolve(), classifier_path)
    if arguments.timing:
        return _print_timing()
    if not arguments.file:
        parser.print_usage()
        return 2
    source = sys.stdin.read() if arguments.file == "-" else Path(arguments.file).read_text(encoding="utf-8")
    screening = screen(json.loads(source))
    print(json.dumps({**screening.as_event(), "cleaned": screening.cleaned}, ensure_ascii=False, indent=2))
    return 1 if screening.flagged else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
