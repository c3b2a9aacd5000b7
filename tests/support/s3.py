"""The credentials of the tests' S3-compatible server (``tests/object_store/conftest.py`` starts it)."""

from __future__ import annotations

ACCESS_KEY_ID = "lambda-test-key"
#: A recognisable secret: tests assert it never shows up in output.
SECRET = "s3cr3t-LAMBDA-never-shown-9f2c"
