from django.urls import path

import tasks_app.web.converters  # noqa: F401  (registers <task_id:…>)
from steering_app import api

urlpatterns = [
    path("tasks/<task_id:task_id>/steering", api.TaskSteeringApi.as_view(), name="task-steering"),
    path("tasks/<task_id:task_id>/cancel", api.TaskCancelApi.as_view(), name="task-cancel"),
]
