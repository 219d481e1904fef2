"""Keeping database passwords out of everything the library prints.

One source for every output path: the ``celery beat`` banner, log lines, the
CLI, error messages (and the metrics and health probes that will read from
here) show a database URL through :func:`safe_url` and engine options through
:func:`redact_options`. A password can also come back inside a driver's error
message, which nothing here controls: the store knows the secrets it connects
with (:class:`Secrets`) and scrubs them from the text of every error it wraps,
as a last line of defence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

#: what a secret is replaced with (SQLAlchemy's own mask for a URL's password)
MASK = "***"

#: Parts of option and query-parameter names that carry a secret, compared
#: case-insensitively. "pass" covers password, passwd, sslpassword (the client
#: key's passphrase) and passphrase; "pwd" is ODBC's. Names of *files* that
#: hold a secret (sslkey, sslcert, passfile's path) are not secrets themselves,
#: and are kept visible with the other parameters (sslmode, application_name)
#: so that a shown URL still says what it connects to; passfile is masked only
#: because it contains "pass", which costs nothing.
SECRET_WORDS = (
    "pass",
    "pwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "credential",
    "private_key",
    "privatekey",
)


def is_secret_key(key: object) -> bool:
    """Whether a URL query parameter or engine option of this name holds a secret."""
    if not isinstance(key, str):
        return False
    lowered = key.lower().replace("-", "_")
    return any(word in lowered for word in SECRET_WORDS)


def _masked_unparsable(raw: str) -> str:
    """A URL that does not parse, as far as it is safe to show: its scheme and
    the part after its last ``@`` (host, port, database), never its query.

    Without an ``@`` everything after the scheme is masked: a typo can put the
    password where a port or host is expected."""
    scheme, separator, rest = raw.partition("://")
    _, at, host = rest.rpartition("@") if separator else raw.rpartition("@")
    host, question, _query = host.partition("?")
    shown = f"{MASK}@{host}{'?' + MASK if question else ''}" if at else MASK
    return f"{scheme}://{shown}" if separator else shown


def safe_url(url: URL | str) -> str:
    """The URL as text to show: its password and every secret query parameter
    (:func:`is_secret_key`) masked; user, host, port, database and the other
    parameters (``sslmode`` ...) kept, so that the line still says where."""
    if not isinstance(url, URL):
        try:
            url = make_url(url)
        except (ArgumentError, ValueError):
            return _masked_unparsable(str(url))
    shown = url.set(query={}).render_as_string(hide_password=True)
    pairs = []
    for key, value in url.query.items():
        for one in value if isinstance(value, tuple) else (value,):
            pairs.append(f"{quote_plus(key)}={MASK if is_secret_key(key) else quote_plus(one)}")
    return f"{shown}?{'&'.join(pairs)}" if pairs else shown


def redact_options(options: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of engine options (``singlebeat_engine_options``) to show: the
    value of every secret-named key masked, nested mappings (``connect_args``)
    likewise, URLs through :func:`safe_url`."""
    shown: dict[Any, Any] = {}
    for key, value in options.items():
        if is_secret_key(key):
            shown[key] = MASK
        elif isinstance(value, Mapping):
            shown[key] = redact_options(value)
        elif isinstance(value, URL):
            shown[key] = safe_url(value)
        else:
            shown[key] = value
    return shown


def _secret_values(options: Mapping[Any, Any]) -> Iterator[str]:
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from _secret_values(value)
        elif is_secret_key(key) and value is not None:
            yield str(value)


@dataclass(frozen=True)
class Secrets:
    """The secret strings one database connection is made with: to scrub from
    any text that might repeat them, such as a driver's error message."""

    #: each secret as given and URL-encoded, longest first
    values: tuple[str, ...] = ()

    @classmethod
    def of(cls, url: URL, engine_options: Mapping[str, Any] | None = None) -> Secrets:
        """The URL's password, its secret query values and the secret values
        of ``engine_options`` (``connect_args={"password": ...}``)."""
        found = [] if url.password is None else [str(url.password)]
        for key, value in url.query.items():
            if is_secret_key(key):
                found.extend(value if isinstance(value, tuple) else (value,))
        found.extend(_secret_values(engine_options or {}))
        forms = {form for s in found if s for form in (s, quote(s, safe=""), quote_plus(s))}
        # longest first: a secret that contains another is replaced whole
        return cls(tuple(sorted(forms, key=lambda s: (-len(s), s))))

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of a secret replaced by :data:`MASK`."""
        for secret in self.values:
            text = text.replace(secret, MASK)
        return text

    def in_chain(self, exc: BaseException) -> bool:
        """Whether the text of ``exc`` or of any exception it was raised from
        (``__cause__``, ``__context__``) repeats a secret: a traceback prints
        every exception of that chain in full."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            texts: tuple[str, ...]
            try:
                texts = (str(current), repr(current))
            except Exception:  # a broken __str__ shows nothing either
                texts = ()
            if any(secret in text for text in texts for secret in self.values):
                return True
            current = current.__cause__ or current.__context__
        return False

    def cause(self, exc: BaseException) -> BaseException | None:
        """``exc`` to chain as the cause of a wrapping error (``raise ... from``),
        or None when its chain repeats a secret, so that no traceback prints it."""
        return None if self.in_chain(exc) else exc


__all__ = ["MASK", "SECRET_WORDS", "Secrets", "is_secret_key", "redact_options", "safe_url"]
