"""The audit trail's guarantees beyond the chain itself (docs/audit.md): anchors (signed seals of the chains' heads),
retention (the purge, the only transaction in which the append-only tables accept DELETE) and export (a task as
JSON Lines, verifiable offline)."""
