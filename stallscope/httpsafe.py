"""HTTP requests that carry credentials: they never leave the server they were given for, and
the credentials never reach a message.

urllib's default redirect handler copies every header of a request onto the redirected one, so a
``Authorization: Bearer`` header given for ``http://prometheus:9090`` would be sent to whatever
host a ``302`` names. :class:`CredentialRedirects` does what Go's ``net/http`` and ``requests``
do: a redirect that changes the scheme, the host or the port drops every credential header
(``Authorization``, ``Proxy-Authorization``, ``Cookie``); a redirect from https to http drops
them too (never downgraded with credentials); at most :data:`MAX_REDIRECTS` redirects are
followed.

:func:`redact` takes the secrets out of any text before it is printed: ``user:password@`` in a
URL, and each secret value the caller knows (a token, a password, their base64 form), wherever a
server echoed them (a 401 body, a reason phrase).
"""

from __future__ import annotations

import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CREDENTIAL_HEADERS",
    "MAX_REDIRECTS",
    "CredentialRedirects",
    "opener",
    "redact",
    "redact_url",
    "secrets_of",
    "split_userinfo",
]

#: request headers that hold credentials (compared lower-case)
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
#: redirects followed for one request (urllib's own default is 10)
MAX_REDIRECTS = 5
_MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/@\s?#]*)@")


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:
        return "", url, None
    scheme = p.scheme.lower()
    try:
        port = p.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (p.hostname or "").lower(), port


class CredentialRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does, but credentials only to the same origin."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 2

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        old_o, new_o = _origin(req.full_url), _origin(new.full_url)
        if old_o != new_o:  # another scheme, host or port (https -> http among them)
            for name in list(new.headers):
                if name.lower() in CREDENTIAL_HEADERS:
                    del new.headers[name]
            for name in list(new.unredirected_hdrs):
                if name.lower() in CREDENTIAL_HEADERS:
                    del new.unredirected_hdrs[name]
        return new


def opener(ca_file: str | None = None) -> urllib.request.OpenerDirector:
    """An opener whose redirects keep credentials on their origin (``ca_file``: CAs to trust
    for https)."""
    handlers: list[Any] = [CredentialRedirects()]
    if ca_file:
        handlers.append(
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_file))
        )
    return urllib.request.build_opener(*handlers)


def redact_url(url: str) -> str:
    """``url`` without the password of its ``user:password@`` (the user is kept)."""

    def mask(m: re.Match[str]) -> str:
        user = m.group("info").split(":", 1)[0]
        return (
            f"{m.group('scheme')}{user}:{_MASK}@"
            if ":" in m.group("info")
            else f"{m.group('scheme')}{_MASK}@"
        )

    return _USERINFO.sub(mask, url)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL's userinfo masked and each of ``secrets`` (kept when 4
    characters or longer: a shorter one would mask ordinary words) replaced by ``***``."""
    out = redact_url(str(text))
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        out = out.replace(s, _MASK)
    return out


def secrets_of(headers: dict[str, str]) -> list[str]:
    """The secret values inside credential headers: a bearer token; a basic-auth token, its
    decoded ``user:password`` and the password."""
    import base64
    import binascii

    out: list[str] = []
    for name, value in headers.items():
        if name.lower() not in CREDENTIAL_HEADERS or not isinstance(value, str):
            continue
        out.append(value)
        kind, _, cred = value.partition(" ")
        if not cred:
            continue
        out.append(cred)
        if kind.lower() == "basic":
            try:
                plain = base64.b64decode(cred, validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                continue
            out.append(plain)
            out.append(plain.partition(":")[2])
    return out


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(``url`` without ``user:password@``, the user, the password): urllib cannot send a URL's
    userinfo, so the caller turns it into a basic-auth header."""
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL Python can parse: the request says so
        return url, None, None
    if "@" not in p.netloc:
        return url, None, None
    info, _, hostport = p.netloc.rpartition("@")
    user, sep, pw = info.partition(":")
    clean = urllib.parse.urlunsplit((p.scheme, hostport, p.path, p.query, p.fragment))
    return (clean, urllib.parse.unquote(user) or None, urllib.parse.unquote(pw) if sep else None)
