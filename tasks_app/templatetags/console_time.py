"""One clock on screen: how the console writes a time and an age.

A time is written in the project's one zone (TIME_ZONE, UTC), to the second, with the zone after it
("2026-12-02 05:59:38 UTC", the admin's DATETIME_FORMAT too: config/formats/en/formats.py), inside a
<time datetime="…"> whose title is the exact instant. An age ("12 min") is measured against the database's clock,
read once per page (one clock: the database's — a web host's or a browser's clock may be off by minutes, and a
lease expiry compared with it would lie); static/console/clock.js keeps ages current from the same clock, corrected
by the offset the page was rendered with (the `console_now` tag in admin/base_site.html).

    {% load console_time %}
    {{ event.at|console_time }}            the time, labelled
    {{ event.at|console_time:"u" }}        the same with its microseconds (the audit pages: rows of one second)
    {% console_age task.updated_at %}     "12 min", kept current by clock.js
    {% console_now %}                     the database's now (ISO 8601), for clock.js
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.db import connection
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def zone_label(value: datetime) -> str:
    return value.tzname() or timezone.get_current_timezone_name()


def time_text(value: datetime, *, microseconds: bool = False) -> str:
    """'2026-12-02 05:59:38 UTC': the project's zone, to the second (or the microsecond), labelled."""
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    fraction = f".{local.microsecond:06d}" if microseconds else ""
    return f"{local.strftime(TIME_FORMAT)}{fraction} {zone_label(local)}"


def age_text(seconds: float) -> str:
    """How long, for people: '12 s', '12 min', '3 h 5 min', '2 d 4 h' (the same steps as clock.js's age())."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def database_now(context) -> datetime:
    """The database's now, read once per request (cached on it) or once per render without one."""
    request = context.get("request")
    now = getattr(request, "_console_database_now", None)
    if now is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
        if request is not None:
            request._console_database_now = now
    return now


@register.filter
def console_time(value, precision=""):
    """A time as the console writes it, in a <time> element; "" for None. ``precision`` "u": with microseconds."""
    if not isinstance(value, datetime):
        return ""
    return format_html('<time datetime="{}" title="{}">{}</time>', value.isoformat(), value.isoformat(),
                       time_text(value, microseconds=precision == "u"))


@register.simple_tag(takes_context=True)
def console_age(context, value, suffix=""):
    """How long ago `value` was, by the database's clock, in a <time data-age> that clock.js keeps current."""
    if not isinstance(value, datetime):
        return ""
    seconds = (database_now(context) - value).total_seconds()
    return format_html('<time class="console-age" datetime="{}" title="{}" data-age data-suffix="{}">{}{}</time>',
                       value.isoformat(), time_text(value), suffix, age_text(seconds), suffix)


@register.simple_tag(takes_context=True)
def console_now(context):
    return database_now(context).isoformat()
