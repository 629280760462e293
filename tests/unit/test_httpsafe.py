"""Credentials stay on their origin across redirects, and never reach a message (issue 50)."""

from __future__ import annotations

import urllib.request

import pytest

from stallscope.httpsafe import (
    MAX_REDIRECTS,
    CredentialRedirects,
    redact,
    secrets_of,
    split_userinfo,
)


def _redirected(old: str, new: str) -> dict[str, str]:
    req = urllib.request.Request(
        old, headers={"Authorization": "Bearer t0ken", "Cookie": "s=1", "Accept": "x"}
    )
    out = CredentialRedirects().redirect_request(req, None, 302, "Found", {}, new)
    assert out is not None
    return {k.lower(): v for k, v in out.header_items()}


@pytest.mark.parametrize(
    "new",
    [
        "https://prom.example/api",
        "http://prom.example:443/api",
        "http://prom.example/api",
        "https://prom.example:9443/",
        "https://evil.example/",
    ],
)
def test_credentials_are_dropped_when_the_origin_changes(new: str) -> None:
    # https -> http on the same host is a downgrade: dropped too
    h = (
        _redirected("https://prom.example:443/x", new)
        if new.startswith("http://")
        else _redirected("http://prom.example/x", new)
    )
    assert "authorization" not in h and "cookie" not in h and h["accept"] == "x"


def test_credentials_stay_on_the_same_origin() -> None:
    h = _redirected("https://prom.example/x", "https://PROM.example:443/y")
    assert h["authorization"] == "Bearer t0ken"


def test_redirects_are_capped() -> None:
    assert CredentialRedirects.max_redirections == MAX_REDIRECTS <= 5


def test_redact_masks_userinfo_and_known_secrets() -> None:
    secrets = secrets_of({"Authorization": "Basic YWxpY2U6aHVudGVyMg=="})
    assert "hunter2" in secrets and "alice:hunter2" in secrets
    text = redact("at http://alice:hunter2@h:9/ said hunter2 YWxpY2U6aHVudGVyMg==", secrets)
    assert "hunter2" not in text and "YWxpY2U6aHVudGVyMg==" not in text
    assert text.startswith("at http://alice:***@h:9/")


def test_split_userinfo() -> None:
    assert split_userinfo("http://a%40b:p%3Aw@h:90/p?q") == ("http://h:90/p?q", "a@b", "p:w")
    assert split_userinfo("http://h/") == ("http://h/", None, None)
    assert split_userinfo("http://[::1") == ("http://[::1", None, None)
