"""Redaction gaps (issue 8, #21): the credential forms real services use, and the text around
them kept; the journal's errors and the log records' tracebacks redacted whatever the cause
chain carries."""

from __future__ import annotations

import json
import logging

import pytest

import durable
from durable._logging import get_logger, redact

from .helpers import running_worker

SECRET = "Waob7Qx2secretTail"


@pytest.mark.parametrize("text", [
    f"Authorization: Bearer 3|{SECRET}",           # Coolify's <id>|<token>
    f"bearer 3|{SECRET} was refused",
    f"xi-api-key: {SECRET}",                       # ElevenLabs
    f"x-api-key: {SECRET}",
    f"X-Api-Key={SECRET}",
    f"{{'xi-api-key': '{SECRET}', 'accept': 'audio/mpeg'}}",
    f'{{"x-api-key": "{SECRET}"}}',
    f"GET https://h/v1?xi-api-key={SECRET}&a=1",
    # a credential's name with a prefix: an environment variable, a config key, OAuth
    f"psql failed: PGPASSWORD={SECRET} psql -h db",
    f"db_password={SECRET}",
    f"GITHUB_TOKEN={SECRET}",
    f"POST https://auth/oauth/token?client_secret={SECRET}&grant_type=refresh",
    f"refresh_token={SECRET}",
    f'{{"client_secret": "{SECRET}", "scope": "all"}}',
    f"private_key: {SECRET}",
    f"db_passwd={SECRET}",
    # a signed URL's signature (S3 presigned, Azure SAS)
    f"GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}",
    f"PUT https://a.blob.core.windows.net/c/b?sv=2022&sig={SECRET}&se=2030",
])
def test_credential_forms_are_redacted(text: str) -> None:
    out = redact(text)
    assert SECRET not in out and "secretTail" not in out, out
    assert "[redacted]" in out


def test_the_text_after_an_authorization_value_is_kept() -> None:
    out = redact("Authorization: Bearer x1 (authorization=y2) then the rest")
    assert "x1" not in out and "y2" not in out
    assert out == "Authorization: [redacted] (authorization=[redacted]) then the rest"
    out = redact("Authorization: abc123 was sent to host h")
    assert out == "Authorization: [redacted] was sent to host h"
    assert redact("authorization=Token t0k next") == "authorization=[redacted] next"
    assert redact("nothing secret here") == "nothing secret here"


def test_a_signed_url_alone_is_redacted() -> None:
    """A text whose only credential is a signature (no word the quick look searches for
    elsewhere in it) is redacted too."""
    assert (redact("PUT https://a.blob.core.windows.net/c/b?sv=2022&sig=AbC123xyz")
            == "PUT https://a.blob.core.windows.net/c/b?sv=2022&sig=[redacted]")
    assert (redact("GET https://b.s3.amazonaws.com/k?X-Amz-Signature=9f8e7d")
            == "GET https://b.s3.amazonaws.com/k?X-Amz-Signature=[redacted]")


@pytest.mark.parametrize("text", [
    "max_tokens=5 (tokens: 12)", "design signal sent", "keyboard=us", "token_count: 3",
    "GET https://h/v1?sign=up&design=x", "passwords: 2 rotated",
])
def test_words_that_only_look_like_credential_names_are_kept(text: str) -> None:
    assert redact(text) == text


def test_a_traceback_is_redacted_in_the_record_every_handler_sees() -> None:
    """A handler with a plain Formatter would format ``exc_info`` itself, after redaction ran
    on the message: the record carries the traceback already formatted and redacted."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("durable.test_redaction")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        try:
            try:
                raise ValueError(f"upstream said xi-api-key: {SECRET}")
            except ValueError as inner:
                raise RuntimeError(f"call failed (Authorization: Bearer 7|{SECRET})") from inner
        except RuntimeError:
            get_logger("durable.test_redaction").exception("probe_failed")
    finally:
        logger.removeHandler(handler)
    [text] = lines
    assert "Traceback" in text and "RuntimeError" in text and "ValueError" in text
    assert SECRET not in text


@pytest.mark.anyio
async def test_the_journal_and_the_run_error_carry_no_credential_of_the_cause_chain(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity("leaky", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def leaky(ctx: durable.ActivityContext) -> None:
        try:
            raise ConnectionError(f"x-api-key: {SECRET}")
        except ConnectionError as exc:
            raise RuntimeError(f"refused: bearer 12|{SECRET}; xi-api-key={SECRET}; "
                               f"PGPASSWORD={SECRET} psql") from exc

    @durable.workflow("leaks", registry=registry)
    async def leaks(ctx: durable.WorkflowContext) -> None:
        await leaky(ctx)

    async with running_worker(client, registry):
        await client.start("leaks", id="leak-1")
        done = await client.wait("leak-1")
    assert done.state is durable.RunState.FAILED
    assert done.error is not None and "refused: bearer [redacted]" in done.error
    journal = json.dumps([dict(e.data) for e in await client.journal("leak-1")])
    assert "RuntimeError" in journal
    assert SECRET not in journal and SECRET not in done.error
    report = (await client.report("leak-1")).text()
    assert SECRET not in report


def test_a_password_already_masked_is_left_as_it_is() -> None:
    """The stores show their URLs as user:***@host; redacting those again hid nothing and
    changed the message a user searches for."""
    assert redact("postgresql://me:***@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redact("postgresql://me:hunter2@db:5432/x") == "postgresql://me:[redacted]@db:5432/x"
    assert redact("postgresql://me:***x@db/x") == "postgresql://me:[redacted]@db/x"
