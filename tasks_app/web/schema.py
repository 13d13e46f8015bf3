"""OpenAPI post-processing: the create-task body documents each registered workflow's own input schema."""

from tasks_app.registry import registry


def workflow_inputs(result, generator, request, public):
    """TaskCreateRequest becomes oneOf one variant per workflow, each with that workflow's input JSON Schema,
    so clients (and schema-driven fuzzers) see exactly what a valid request is."""
    schemas = result.get("components", {}).get("schemas", {})
    # The API refuses unknown fields (a typo is a 400, not silently ignored): say so in the schema.
    for name in ("TaskCreateRequest", "TaskCancelRequest", "TaskBudgetRequest"):
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    schema = schemas.get("TaskCreateRequest")
    if schema is None:
        return result
    schema["properties"]["workflow"]["enum"] = registry.names()
    schema["oneOf"] = [
        {
            "title": workflow.name,
            "description": workflow.description,
            "properties": {"workflow": {"type": "string", "enum": [workflow.name]}, "input": workflow.input_schema},
            "required": ["workflow", "input"],
        }
        for workflow in registry.all()
    ]
    return result
