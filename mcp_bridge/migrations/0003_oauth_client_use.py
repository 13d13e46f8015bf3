"""OAuthClientUse: which clients were ever issued a token (mcp_bridge.oauth.models). Clients holding a token of a
person now (an access or refresh token bound to a tenant) are marked used here; a dynamically registered client
with none is a candidate for the unused-registration cleanup once older than oauth.unused_client_hours."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


def mark_clients_in_use(apps, schema_editor):
    Binding = apps.get_model("mcp_bridge", "OAuthTenantBinding")
    Use = apps.get_model("mcp_bridge", "OAuthClientUse")
    used = set(Binding.objects.filter(access_token__isnull=False).values_list("access_token__application_id",
                                                                             flat=True))
    used |= set(Binding.objects.filter(refresh_token__isnull=False).values_list("refresh_token__application_id",
                                                                               flat=True))
    Use.objects.bulk_create([Use(application_id=pk) for pk in used if pk is not None], ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('mcp_bridge', '0002_oauth_cleanup_schedule'),
        ('oauth2_provider', '0022_refreshtoken_token_family_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='OAuthClientUse',
            fields=[
                ('application', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='runtime_use', serialize=False, to=settings.OAUTH2_PROVIDER_APPLICATION_MODEL)),
                ('first_token_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.RunPython(mark_clients_in_use, migrations.RunPython.noop),
    ]
