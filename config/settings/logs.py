"""Logging: one readable line per record on stderr. No secrets, tokens or personal data in messages."""

from config.settings.env import env

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"redact": {"()": "config.logging_redaction.RedactingFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Django's own handlers on the "django" logger (its console one, on with DEBUG, and mail_admins) are dropped:
    # its records reach the root handler above, once — with both, the development server wrote every 4xx twice.
    # The HTTP clients' one line per request (every tool call, every tool list) is routine: warnings only.
    "loggers": {"django": {"handlers": [], "propagate": True}, "django.db.backends": {"level": "WARNING"},
                "httpx2": {"level": "WARNING"}, "httpcore2": {"level": "WARNING"}},
}
