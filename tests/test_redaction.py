import pytest

from tasks_app.redaction import redact


@pytest.mark.parametrize("secret, text", [
    ("art_0123456789abcdefghijkl", "token art_0123456789abcdefghijkl leaked"),
    ("eyJhbGciOiJIUzI1NiJ9.payload", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload"),
    ("sk-live0123456789abcdefgh", "key sk-live0123456789abcdefgh"),
    ("hunter2", "password=hunter2 in the config"),
    ("s3cret", "postgres://app:s3cret@db.internal/app"),
    ("jane.doe@example.com", "mail jane.doe@example.com about it"),
])
def test_it_masks_secrets_and_personal_data(secret, text):
    assert secret not in redact(text)


def test_it_keeps_ordinary_text():
    assert redact("classified 40/2000 documents") == "classified 40/2000 documents"
