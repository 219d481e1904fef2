"""No secret anywhere (celery_singlebeat.redact): the one function every output
path shows a database URL with, the engine options' redaction, and the store's
last line of defence, its secrets scrubbed from the driver errors it wraps.

No service: the store's connections are replaced by a failing one whose
driver error repeats the connection's parameters, as a driver's may.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from celery_singlebeat.config import Settings
from celery_singlebeat.exceptions import ConfigurationError, StoreUnavailable
from celery_singlebeat.redact import MASK, Secrets, is_secret_key, redact_options, safe_url
from celery_singlebeat.store.sql import SqlStore

SECRET = "Pa55-w0rd-s3cr3t"


def shown(exc: BaseException) -> str:
    """Everything a log of the exception would show, chained causes included."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# -- safe_url ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # the user part
        (
            f"postgresql+psycopg://beat:{SECRET}@db.internal:5432/app",
            "postgresql+psycopg://beat:***@db.internal:5432/app",
        ),
        # the query string; sslmode and other plain parameters stay visible
        (
            f"postgresql+psycopg://beat@db/app?password={SECRET}&sslmode=require",
            "postgresql+psycopg://beat@db/app?password=***&sslmode=require",
        ),
        # both, mixed-case keys, and every secret-bearing key of the list
        (
            f"postgresql://beat:{SECRET}@db/app?PassWord={SECRET}&SSLPASSWORD={SECRET}"
            f"&passwd={SECRET}&pwd={SECRET}&token={SECRET}&api_key={SECRET}"
            f"&client-secret={SECRET}&application_name=beat",
            "postgresql://beat:***@db/app?PassWord=***&SSLPASSWORD=***&passwd=***&pwd=***"
            "&token=***&api_key=***&client-secret=***&application_name=beat",
        ),
        # URL-encoded: the decoded password is masked, not only its encoding
        (
            f"mysql+pymysql://beat:{quote(SECRET + '@/:?', safe='')}@127.0.0.1:3306/test"
            f"?password={quote(SECRET + '&=', safe='')}",
            "mysql+pymysql://beat:***@127.0.0.1:3306/test?password=***",
        ),
        # no password: nothing changes
        ("postgresql+psycopg://beat@db:5432/app", "postgresql+psycopg://beat@db:5432/app"),
        ("mysql+pymysql://root@127.0.0.1:3306/test", "mysql+pymysql://root@127.0.0.1:3306/test"),
        # SQLite paths untouched
        ("sqlite:///celery-singlebeat.sqlite", "sqlite:///celery-singlebeat.sqlite"),
        ("sqlite:////var/lib/beat/state.sqlite", "sqlite:////var/lib/beat/state.sqlite"),
        # a repeated parameter, each value kept
        ("postgresql://db/app?options=a&options=b", "postgresql://db/app?options=a&options=b"),
    ],
)
def test_safe_url(url: str, expected: str) -> None:
    assert safe_url(url) == expected
    assert safe_url(make_url(url)) == expected
    assert SECRET not in expected and quote(SECRET) not in expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"postgresql://beat:{SECRET}@db:notaport/x", "postgresql://***@db:notaport/x"),
        (
            f"postgresql://beat:{SECRET}@db:notaport/x?password={SECRET}",
            "postgresql://***@db:notaport/x?***",
        ),
        (f"postgresql://beat:{SECRET}", "postgresql://***"),
        (f"beat:{SECRET}", MASK),
    ],
)
def test_an_unparsable_url_shows_its_host_part_only(url: str, expected: str) -> None:
    assert safe_url(url) == expected


@pytest.mark.parametrize(
    "key", ["password", "PASSWORD", "sslpassword", "passwd", "pwd", "auth_token", "secret"]
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["sslmode", "sslkey", "sslcert", "host", "user", "connect_timeout", "options", 5]
)
def test_plain_keys(key: object) -> None:
    assert not is_secret_key(key)


def test_engine_options_are_redacted_at_every_depth() -> None:
    options = {
        "pool_size": 2,
        "connect_args": {"password": SECRET, "sslmode": "require", "ssl": {"key_passwd": SECRET}},
    }
    assert redact_options(options) == {
        "pool_size": 2,
        "connect_args": {"password": MASK, "sslmode": "require", "ssl": {"key_passwd": MASK}},
    }
    assert options["connect_args"]["password"] == SECRET, "the original is left as it was"


def test_settings_show_no_secret_in_their_repr_or_safe_url() -> None:
    settings = Settings.from_conf(
        {
            "singlebeat_url": f"postgresql+psycopg://beat:{SECRET}@db.internal/app"
            f"?password={SECRET}&sslmode=require",
            "singlebeat_engine_options": {"connect_args": {"password": SECRET}},
        }
    )
    for text in (repr(settings), str(settings), settings.safe_url):
        assert SECRET not in text
        assert "db.internal" in text and "app" in text and "sslmode=require" in text
    assert "pool" not in repr(settings) and "connect_args" in repr(settings)
    # what the engine gets is left whole
    assert settings.url.password == SECRET
    assert settings.engine_options["connect_args"]["password"] == SECRET


def test_an_unparsable_url_with_a_query_password_is_refused_without_it() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_conf({"singlebeat_url": f"postgresql://beat@db:notaport/x?password={SECRET}"})
    assert SECRET not in shown(info.value)
    assert "db:notaport/x" in str(info.value)


# -- Secrets: the last line of defence -------------------------------------------


def test_secrets_scrub_every_form_of_every_secret() -> None:
    secrets = Secrets.of(
        make_url(f"postgresql://beat:{quote(SECRET + ' x', safe='')}@db/app?token=t0k3n-{SECRET}"),
        {"connect_args": {"password": "other-p4ss"}},
    )
    text = f"a {SECRET} x, {quote(SECRET + ' x', safe='')}, {SECRET}+x, t0k3n-{SECRET}, other-p4ss"
    scrubbed = secrets.scrub(text)
    assert scrubbed == "a ***, ***, ***, ***, ***"
    assert Secrets.of(make_url("sqlite:///x.sqlite")).scrub(text) == text


class _DriverError(Exception):
    """Stands in for a driver's error that repeats the connection parameters."""


def _failing(store: SqlStore, message: str) -> None:
    @contextmanager
    def connect() -> Iterator[None]:
        raise OperationalError(None, None, _DriverError(message))
        yield None  # pragma: no cover

    store.executor.connect = connect  # type: ignore[method-assign,assignment]


@pytest.mark.parametrize("where", ["user part", "query", "connect_args"])
def test_the_store_scrubs_its_secrets_from_the_driver_errors_it_wraps(where: str) -> None:
    url = {
        "user part": f"postgresql+psycopg://beat:{SECRET}@db.internal:5432/app",
        "query": f"postgresql+psycopg://beat@db.internal:5432/app?password={SECRET}",
        "connect_args": "postgresql+psycopg://beat@db.internal:5432/app",
    }[where]
    options = {"connect_args": {"password": SECRET}} if where == "connect_args" else {}
    store = SqlStore(make_url(url), engine_options=options)  # connects on first use only
    try:
        _failing(store, f'invalid dsn: "host=db.internal password={SECRET}" refused')
        with pytest.raises(StoreUnavailable) as info:
            store.ping()
    finally:
        store.close()
    exc = info.value
    assert str(exc) == (
        'ping failed: _DriverError: invalid dsn: "host=db.internal password=***" refused'
    ), str(exc)
    # a traceback would print the driver error whole: the chain is cut
    assert exc.__cause__ is None and exc.__suppress_context__
    assert SECRET not in shown(exc)


def test_a_driver_error_without_a_secret_stays_chained_for_debugging() -> None:
    store = SqlStore(make_url(f"postgresql+psycopg://beat:{SECRET}@db.internal:5432/app"))
    try:
        _failing(store, 'connection to server at "db.internal" failed: Connection refused')
        with pytest.raises(StoreUnavailable) as info:
            store.ping()
    finally:
        store.close()
    assert isinstance(info.value.__cause__, OperationalError)
    assert "Connection refused" in shown(info.value) and SECRET not in shown(info.value)
