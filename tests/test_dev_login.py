import io

from django.core.management import call_command

from tasks_app.models import ApiToken
from tasks_app.services import token_hash


def test_it_creates_a_login_once_and_replaces_a_token_the_database_does_not_know(db, tmp_path):
    call_command("ensure_dev_login", "--credentials-dir", str(tmp_path), stdout=io.StringIO())
    first = (tmp_path / "dev-api-token").read_text().strip()
    call_command("ensure_dev_login", "--credentials-dir", str(tmp_path), stdout=io.StringIO())
    assert (tmp_path / "dev-api-token").read_text().strip() == first  # kept across runs
    assert oct((tmp_path / "dev-admin-password").stat().st_mode & 0o777) == "0o600"

    ApiToken.objects.all().delete()  # as if the database had been re-created
    call_command("ensure_dev_login", "--credentials-dir", str(tmp_path), stdout=io.StringIO())

    replaced = (tmp_path / "dev-api-token").read_text().strip()
    assert replaced != first and ApiToken.objects.filter(token_hash=token_hash(replaced)).exists()
