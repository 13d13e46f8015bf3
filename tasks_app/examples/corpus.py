"""A deterministic corpus of contract-like documents with known answers, for document_review.

The generator decides each document's risk features first, writes text that expresses them (in varied
wording), and records the expected classification in answers.json. The workflow's classifier only reads the
text, so the test compares two independent paths.
"""

from __future__ import annotations

import json
import random
from datetime import date, timedelta
from pathlib import Path

REFERENCE_DATE = date(2027, 1, 1)  # "today" for expiry checks, fixed so answers never drift
HIGH_VALUE = 1_000_000

PARTIES = ["Acme Corp", "Globex Ltd", "Initech GmbH", "Umbrella plc", "Hooli Inc", "Soylent SA", "Vandelay BV",
           "Stark Industries", "Wayne Enterprises", "Tyrell AG", "Cyberdyne LLC", "Wonka Co"]
FILLER = [
    "The parties shall cooperate in good faith to achieve the purposes of this Agreement.",
    "Notices shall be given in writing to the addresses set out above.",
    "This Agreement is governed by the laws of the jurisdiction stated in the order form.",
    "Each party shall keep the other party's confidential information secret.",
    "Headings are for convenience only and do not affect interpretation.",
    "No waiver of any breach shall be deemed a waiver of any other breach.",
]
UNLIMITED = ["The Supplier's liability under this Agreement shall be unlimited.",
             "Nothing in this Agreement limits the liability of the Supplier, which is unlimited in amount."]
CAPPED = ["The Supplier's total liability is capped at the fees paid in the preceding twelve months.",
          "Liability of either party shall not exceed the total fees paid under this Agreement."]
AUTO_RENEW = ["This Agreement shall automatically renew for successive one-year terms.",
              "Unless terminated, the term renews automatically for further periods of twelve months."]
NO_RENEW = ["This Agreement ends at the end of its term and does not renew.",
            "Any extension requires a written amendment signed by both parties."]
CONVENIENCE = ["Either party may terminate this Agreement for convenience on 30 days' written notice.",
               "The Customer may end this Agreement at any time for convenience upon 60 days' notice."]
NO_CONVENIENCE = ["This Agreement may not be terminated for convenience.",
                  "Termination is permitted only for material breach."]


def _features(rng: random.Random) -> dict:
    return {
        "unlimited_liability": rng.random() < 0.15,
        "amount": rng.choice([rng.randint(5_000, 900_000), rng.randint(5_000, 900_000), rng.randint(1_000_001, 9_000_000)]),
        "auto_renew": rng.random() < 0.4,
        "expiry": REFERENCE_DATE + timedelta(days=rng.randint(-200, 900)),
        "convenience": rng.random() < 0.6,
    }


def expected_risk(features: dict) -> tuple[int, str, list[str]]:
    """The scoring rules, stated on features (document_review applies the same rules to parsed text)."""
    reasons = []
    if features["unlimited_liability"]:
        reasons.append("unlimited_liability")
    if features["amount"] > HIGH_VALUE:
        reasons.append("high_value")
    if features["auto_renew"]:
        reasons.append("auto_renewal")
    if features["expiry"] <= REFERENCE_DATE + timedelta(days=90):
        reasons.append("expiring_or_expired")
    if not features["convenience"]:
        reasons.append("no_termination_for_convenience")
    weights = {"unlimited_liability": 3, "high_value": 2, "auto_renewal": 1, "expiring_or_expired": 1,
               "no_termination_for_convenience": 1}
    score = sum(weights[r] for r in reasons)
    level = "high" if score >= 4 else "medium" if score >= 2 else "low"
    return score, level, reasons


def _render(doc_id: str, features: dict, rng: random.Random) -> str:
    a, b = rng.sample(PARTIES, 2)
    effective = features["expiry"] - timedelta(days=rng.choice([365, 730, 1095]))
    amount = f"{features['amount']:,}" if rng.random() < 0.5 else str(features["amount"])
    currency = rng.choice(["USD ", "EUR ", "$"])
    clauses = [
        f"MASTER SERVICES AGREEMENT {doc_id}",
        f"This Agreement is made between {a} (the Supplier) and {b} (the Customer), effective {effective.isoformat()}.",
        f"1. Term. This Agreement expires on {features['expiry'].isoformat()}. "
        + rng.choice(AUTO_RENEW if features["auto_renew"] else NO_RENEW),
        f"2. Fees. The Customer shall pay a total contract value of {currency}{amount}.",
        "3. Liability. " + rng.choice(UNLIMITED if features["unlimited_liability"] else CAPPED),
        "4. Termination. " + rng.choice(CONVENIENCE if features["convenience"] else NO_CONVENIENCE),
    ]
    body = clauses + rng.sample(FILLER, 3)
    return "\n\n".join(body) + "\n"


def corpus_generate(out_dir: Path, *, count: int = 2000, seed: int = 7) -> dict:
    """Write docs/DOC-00001.txt …, manifest.json and answers.json into out_dir; return the manifest."""
    rng = random.Random(seed)
    docs_dir = out_dir / "docs"
    docs_dir.mkdir(parents=True, exist_ok=True)
    files, answers = [], {}
    totals = {"high": 0, "medium": 0, "low": 0}
    for number in range(1, count + 1):
        doc_id = f"DOC-{number:05d}"
        features = _features(rng)
        (docs_dir / f"{doc_id}.txt").write_text(_render(doc_id, features, rng))
        score, level, reasons = expected_risk(features)
        answers[doc_id] = {"score": score, "level": level, "reasons": reasons}
        totals[level] += 1
        files.append(f"docs/{doc_id}.txt")
    manifest = {"count": count, "seed": seed, "reference_date": REFERENCE_DATE.isoformat(), "files": files}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out_dir / "answers.json").write_text(json.dumps({"totals": totals, "documents": answers}, indent=1))
    return manifest
