"""URL path converters of the task routes (registered here, on import, for every app's URLconf that names them)."""

import re
import uuid

from django.urls import register_converter

# A UUID written with dashes, in either case: clients copy ids from tools that upper-case them, and a UUID's hex
# digits mean the same in both. (Django's built-in `uuid` converter accepts lower case only.)
TASK_ID_PATTERN = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
TASK_ID = re.compile(TASK_ID_PATTERN)
# What the 404 for a malformed id shows as the shape to use (a version 7 UUID, as tasks_app.ids makes).
TASK_ID_EXAMPLE = "0192f0c1-7e4a-7b3c-9d2e-5f6a7b8c9d0e"


class TaskIdConverter:
    regex = TASK_ID_PATTERN

    def to_python(self, value: str) -> uuid.UUID:
        return uuid.UUID(value)

    def to_url(self, value) -> str:
        return str(value).lower()


register_converter(TaskIdConverter, "task_id")
