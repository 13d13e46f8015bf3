"""The OAuth toolkit's admins (clients, grants, tokens), registered again audited: creating, changing, deleting a
client and revoking tokens through the admin are in the audit trail like every other admin write
(tasks_app.web.admin_audit; tests/test_admin_audit.py checks no writing admin is left out)."""

from django.contrib import admin
from oauth2_provider.models import AccessToken, Application, Grant, IDToken, RefreshToken

from tasks_app.web.admin_audit import AuditedAdmin, audited

for _model, _attributes in ((Application, {}), (AccessToken, {"audited_actions": ("revoke_tokens",)}),
                            (RefreshToken, {"audited_actions": ("revoke_tokens",)}), (Grant, {}), (IDToken, {})):
    _registered = admin.site._registry.get(_model)
    if _registered is not None and not isinstance(_registered, AuditedAdmin):
        admin.site.unregister(_model)
        admin.site.register(_model, audited(type(_registered), **_attributes))
