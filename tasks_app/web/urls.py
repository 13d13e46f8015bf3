from django.urls import path, re_path

import tasks_app.web.converters  # noqa: F401  (registers <task_id:…>)
from tasks_app.web import api, stream_views

urlpatterns = [
    path("tasks", api.TaskCollectionApi.as_view(), name="tasks"),
    path("tasks/<task_id:task_id>", api.TaskDetailApi.as_view(), name="task-detail"),
    path("tasks/<task_id:task_id>/artifacts", api.TaskArtifactListApi.as_view(), name="task-artifacts"),
    path("tasks/<task_id:task_id>/artifacts/<str:name>", api.TaskArtifactApi.as_view(), name="task-artifact"),
    path("tasks/<task_id:task_id>/events", stream_views.task_events, name="task-events"),
    path("tasks/<task_id:task_id>/fork", api.TaskForkApi.as_view(), name="task-fork"),
    path("tasks/<task_id:task_id>/forks", api.TaskForksApi.as_view(), name="task-forks"),
    path("events", stream_views.tenant_events, name="events"),
    path("workflows", api.WorkflowListApi.as_view(), name="workflows"),
    # Last: anything else under tasks/ whose first segment is not a task id (or a task id with an unknown tail)
    # gets a 404 that says what a task id looks like. ([\s\S], not `.`: a path may hold an encoded newline; the
    # (?s) flag would make the URLconf impossible to reverse.)
    re_path(r"^tasks/(?P<segment>[^/]+)(?P<rest>/[\s\S]*)?$", api.task_path_not_found,
            name="task-path-not-found"),
]
