"""Forms built from a JSON Schema (a wait's, a workflow's goal parameters), for the operators' console.

The fields check what Django can state (types, min/max length and value), so most typos are answered at once;
the schema itself is checked by the service, the one authority, whose 422 errors attach_problem_errors puts back on
the fields they name.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from config.base.json_input import JsonFormField
from config.base.problems import Problem


def choice_key(value: Any) -> str:
    """An enum value as the text a <select> posts: strings as they are, other JSON values as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


class _EnumCoerce:
    """Posted choice text back to the enum's JSON value (a value that is already one passes through)."""

    def __init__(self, values: list):
        self.by_key = {choice_key(v): v for v in values}

    def __call__(self, key):
        return self.by_key.get(key, key) if isinstance(key, str) else key


def schema_field(name: str, schema: Any, *, required: bool) -> forms.Field:
    """A form field for one property's JSON Schema: enum → select, array of enum → checkboxes, string / integer /
    number / boolean → their fields, anything else → a JSON textarea.

    ``required`` (the parent's required list) is shown to the browser only: the server leaves it to the schema,
    because JSON Schema's `required` asks for the key, not for a non-empty value."""
    schema = schema if isinstance(schema, dict) else {}
    # Labelled with the property's own name (unless the schema gives a title): the name the API and docs use.
    label_help = {"label": schema["title"] if isinstance(schema.get("title"), str) else name,
                  "help_text": schema.get("description", "") if isinstance(schema.get("description"), str) else ""}
    attrs = {"required": True} if required else {}
    kind = schema.get("type")
    items = schema.get("items")
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        values = schema["enum"]
        choices = [(choice_key(v), str(v)) for v in values]
        return forms.TypedChoiceField(choices=choices if required else [("", "—"), *choices],
                                      coerce=_EnumCoerce(values), empty_value=None, required=False, **label_help)
    if kind == "array" and isinstance(items, dict) and isinstance(items.get("enum"), list) and items["enum"]:
        values = items["enum"]
        return forms.TypedMultipleChoiceField(choices=[(choice_key(v), str(v)) for v in values],
                                              coerce=_EnumCoerce(values), required=False,
                                              widget=forms.CheckboxSelectMultiple, **label_help)
    if kind == "string":
        return forms.CharField(min_length=schema.get("minLength"), max_length=schema.get("maxLength"), strip=False,
                               required=False, widget=forms.TextInput(attrs=attrs), **label_help)
    if kind == "integer":
        return forms.IntegerField(min_value=schema.get("minimum"), max_value=schema.get("maximum"), required=False,
                                  widget=forms.NumberInput(attrs=attrs), **label_help)
    if kind == "number":
        return forms.FloatField(min_value=schema.get("minimum"), max_value=schema.get("maximum"), required=False,
                                widget=forms.NumberInput(attrs=attrs), **label_help)
    if kind == "boolean":
        return forms.BooleanField(required=False, **label_help)
    label_help["help_text"] = " ".join(filter(None, [label_help["help_text"], "JSON."]))
    return JsonFormField(required=False, widget=forms.Textarea(attrs={"rows": 3, **attrs}), **label_help)


def schema_form(schema: Any, *, prefix: str, data=None) -> forms.Form:
    """A form for a JSON value described by ``schema``: one field per property of an object schema (none for an
    object that allows no property), or, for any other schema, one JSON textarea `value` for the whole value."""
    form = forms.Form(data, prefix=prefix)
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    form.required_names = set(schema["required"]) if isinstance(schema.get("required"), list) else set()
    form.whole_value = schema.get("type", "object") != "object" or (
        not properties and schema.get("additionalProperties") is not False)
    if form.whole_value:
        form.fields["value"] = JsonFormField(required=False, widget=forms.Textarea(attrs={"rows": 6}),
                                               help_text="The whole value, as JSON matching the schema shown.")
        return form
    for name, property_schema in properties.items():
        form.fields[name] = schema_field(name, property_schema, required=name in form.required_names)
    return form


def schema_form_value(form: forms.Form, *, only: set[str] | None = None) -> Any:
    """The JSON value a valid schema_form states; ``only``: just these properties (the ones a person changed).

    A field left empty ("" or no choice ticked) is left out, unless its property is required (then "" or [] is
    sent, so the schema's own rule, e.g. minLength, names the field) or it is one of ``only`` (emptied on
    purpose). A field with no value at all (an empty number, no choice, JSON null) is always left out: this form
    cannot send null."""
    if form.whole_value:
        return form.cleaned_data["value"]
    value = {}
    for name in form.fields:
        if only is not None and name not in only:
            continue
        data = form.cleaned_data.get(name)
        if data is None:
            continue
        if data in ("", []) and only is None and name not in form.required_names:
            continue
        value[name] = data
    return value


def attach_problem_errors(problem: Problem, *, forms_by_path: dict[str, forms.Form]) -> None:
    """Put the service's errors ({"field": "payload.value.note", …}) on the form fields they name; what names no
    field goes on the form whose path it starts with, or the first form."""
    for error in getattr(problem, "errors", None) or []:
        where, message = str(error.get("field", "")), str(error.get("message", ""))
        for prefix, form in forms_by_path.items():
            if where == prefix or where.startswith(f"{prefix}."):
                name = where.removeprefix(prefix).lstrip(".").split(".")[0]
                if name in form.fields:
                    form.add_error(name, message)
                else:
                    form.add_error(None, f"{where}: {message}" if where != prefix else message)
                break
        else:
            next(iter(forms_by_path.values())).add_error(None, f"{where}: {message}" if where else message)
