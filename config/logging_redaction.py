"""Every log line passes through redaction (tasks_app.redaction): a token or e-mail address that a message, its
arguments or an exception carries is masked before any handler writes it — Django's, uvicorn's and Celery's."""

from __future__ import annotations

import logging

from tasks_app.redaction import redact  # (it reads the settings at log time, not at import)


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg, record.args = redact(record.getMessage()), None
            if record.exc_info and not record.exc_text:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            if record.stack_info:
                record.stack_info = redact(record.stack_info)
        except Exception:  # a log line is never lost to its redaction; the built-in patterns still apply
            record.msg, record.args = "(log message could not be redacted; dropped)", None
        return True
