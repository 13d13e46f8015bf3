"""One clock on screen: every date and time the admin renders (list columns, read-only fields, filters' dates) in
the one zone the project runs in (TIME_ZONE, UTC), to the second, with the zone written after it — the same text
as the console's own times (tasks_app/templatetags/console_time.py). Django's English default ("Dec. 2, 2026,
5:59 a.m.") drops the seconds and the zone, so a lease expiry and an event could not be compared on one page.
Loaded through FORMAT_MODULE_PATH (config/settings/base.py) for the en locale the admin uses."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
