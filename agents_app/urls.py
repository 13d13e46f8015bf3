from django.urls import path

import tasks_app.web.converters  # noqa: F401  (registers <task_id:…>)
from agents_app import api

urlpatterns = [
    path("tool-servers", api.ToolServerListApi.as_view(), name="tool-servers"),
    path("tasks/<task_id:task_id>/transcript", api.TaskTranscriptApi.as_view(), name="task-transcript"),
]
