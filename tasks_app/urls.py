from django.urls import path

from tasks_app import api

urlpatterns = [
    path("tasks", api.TaskCollectionApi.as_view(), name="tasks"),
    path("tasks/<uuid:task_id>", api.TaskDetailApi.as_view(), name="task-detail"),
    path("tasks/<uuid:task_id>/cancel", api.TaskCancelApi.as_view(), name="task-cancel"),
    path("workflows", api.WorkflowListApi.as_view(), name="workflows"),
]
