"""The admin's forms under the rate limits of the REST API (config.base.rate_limits; issue 37: the admin's fork, steering
and "Call a tool" forms were not limited — 8 forks after a 5/minute limit all went through).

A form that creates a task (fork, "Call a tool") counts as "create", one that sends a steering command (steer,
adjust the goal, answer a wait, raise a budget; the bulk pause / resume / cancel, once per command) as "steer" — in
the person's bucket, which their tokens share, and the tenant's, exactly as the REST request that does the same. Over
a limit the form is not acted on: a 429 page in the admin's frame saying whose limit it is and when to send it again
(Retry-After), as the REST API answers 429 with problem details. Nothing is written.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpResponse
from django.template.response import TemplateResponse

from tasks_app.errors import RateLimited
from tasks_app.web.authentication import rate_limit_check


def admin_rate_refusal(request, action: str, *, tenant, cost: int = 1) -> HttpResponse | None:
    """Count ``cost`` ``action`` requests of the person signed in, in ``tenant`` (the task's or the server's: staff
    of no tenant act in the object's); None when the form may go on, else the 429 page to answer with."""
    try:
        rate_limit_check(request, action, tenant=tenant, cost=cost)
    except RateLimited as refused:
        response = TemplateResponse(request, "admin/rate_limited.html", {
            **admin.site.each_context(request), "title": "Too many requests", "detail": str(refused.detail),
            "retry_after": refused.wait}, status=429)
        response["Retry-After"] = str(refused.wait)
        return response
    return None
