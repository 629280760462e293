"""`diagnose --prometheus` against servers that misbehave: each answer is one line on stderr
and a bounded wait, never a traceback, a hang or a terminal taken over by escape sequences."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import stallscope_argv

Reply = Callable[[BaseHTTPRequestHandler], None]


def _json(doc: Any) -> Reply:
    body = json.dumps(doc).encode()

    def reply(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return reply


def _result(result: Any) -> Reply:
    return _json({"status": "success", "data": {"resultType": "matrix", "result": result}})


def _trickle(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "100000")
    h.end_headers()
    try:
        for _ in range(200):  # a byte every 0.5 s: each read is quick, the answer never ends
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass


def _short(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "5000")
    h.end_headers()
    h.wfile.write(b'{"status": "success", "data": {')


def _escapes(h: BaseHTTPRequestHandler) -> None:
    body = json.dumps(
        {"status": "error", "error": "bad \x1b]0;pwned\x07 query \x1b[2J\x1b[H"}
    ).encode()
    h.send_response(400)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _redirect_loop(h: BaseHTTPRequestHandler) -> None:
    h.send_response(302)
    h.send_header("Location", h.path)
    h.send_header("Content-Length", "0")
    h.end_headers()


T0 = time.time() - 300
STEPS = [
    {
        "metric": {"__name__": name, "instance": "n1:10127", "run": "r", "rank": "0"},
        "values": [[T0 + 15 * i, str(v)] for i, v in enumerate(vals)],
    }
    for name, vals in (
        ("stallscope_train_steps_total", [0, 10, 1e12, 1e12 + 10]),
        ("stallscope_train_step_seconds_total", [0, 5, 10, 15]),
        ("stallscope_train_data_wait_seconds_total", [0, 1, 2, 3]),
    )
]

CASES: dict[str, Reply] = {
    "trickle": _trickle,
    "short body": _short,
    "result of numbers": _result([1, 2, 3]),
    "metric a number": _result([{"metric": 7, "values": [[T0, "1"]]}]),
    "one-element values": _result(
        [
            {
                "metric": {"__name__": "stallscope_host_cpu_busy_ratio", "instance": "n1"},
                "values": [[T0], "x"],
            }
        ]
    ),
    "string values": _result(
        [
            {
                "metric": {"__name__": "stallscope_host_cpu_busy_ratio", "instance": "n1"},
                "values": "abc",
            }
        ]
    ),
    "bad timestamp": _result(
        [
            {
                "metric": {"__name__": "stallscope_host_cpu_busy_ratio", "instance": "n1"},
                "values": [["soon", "1"]],
            }
        ]
    ),
    "counter jump to 1e12": _result(STEPS),
    "escape sequences": _escapes,
    "redirect loop": _redirect_loop,
}


@pytest.fixture
def server() -> Iterator[Callable[[Reply], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(reply: Reply) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                reply(self)

            def log_message(self, *_a: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misbehaving_prometheus_is_one_line(server: Callable[[Reply], str], case: str) -> None:
    url = server(CASES[case])
    t0 = time.monotonic()
    argv = stallscope_argv("diagnose", "--prometheus", url, "--since", "10m", "--timeout", "6s")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    if case == "counter jump to 1e12":
        # steps no training makes are not read as steps; the rest of the series is used
        assert r.returncode in (0, 1), r.stderr
    else:
        assert r.returncode == 1, (r.returncode, r.stdout[-500:], r.stderr[-500:])
        assert r.stderr.count("\n") == 1, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, repr(r.stderr)
    assert took < 30, took  # two queries, each bounded by --timeout 6s


def test_a_url_python_cannot_parse_is_one_line() -> None:
    r = subprocess.run(
        stallscope_argv("diagnose", "--prometheus", "http://[::1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def _trickle_headers(h: BaseHTTPRequestHandler) -> None:
    try:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100):  # a header line every 0.5 s: each read is quick, they never end
            h.wfile.write(f"X-Slow-{i}: 1\r\n".encode())
            h.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass


@pytest.mark.parametrize("reply", [_trickle, _trickle_headers])
def test_the_timeout_holds_for_the_whole_answer(
    server: Callable[[Reply], str], reply: Reply
) -> None:
    """Issue 40: a server that trickles its answer made `diagnose --prometheus` return after its
    own --timeout. Reaching the server, its headers and its body all count."""
    url = server(reply)
    t0 = time.monotonic()
    r = subprocess.run(
        stallscope_argv("diagnose", "--prometheus", url, "--timeout", "3s"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert r.returncode == 1 and "no complete answer in 3 s (--timeout)" in r.stderr, r.stderr
    assert took < 3 + 2.5, took  # the deadline, and the interpreter's start and exit


def _needs(header: str) -> Reply:
    """An empty Prometheus answer for requests carrying ``header`` as Authorization, 401 else."""
    ok = _result([])

    def reply(h: BaseHTTPRequestHandler) -> None:
        if h.headers.get("Authorization") != header:
            h.send_response(401)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        ok(h)

    return reply


def test_bearer_token_and_basic_auth_come_from_files(
    server: Callable[[Reply], str], tmp_path: Path
) -> None:
    """Issue 40: Thanos, Mimir, Grafana Cloud and most company Prometheus servers need a token
    or a password; secrets come from files, never from the command line alone."""
    import base64

    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    url = server(_needs("Bearer s3cret-token"))
    base = ("diagnose", "--prometheus", url, "--timeout", "10s")
    r = subprocess.run(stallscope_argv(*base), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "refused the query (401)" in r.stderr
    assert "--bearer-token-file" in r.stderr  # the refusal says how to get in
    r = subprocess.run(
        stallscope_argv(*base, "--bearer-token-file", str(token)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "holds no stallscope series" in r.stderr, r.stderr  # let in: an empty answer
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    url = server(_needs("Basic " + base64.b64encode(b"ops:hunter2").decode()))
    r = subprocess.run(
        stallscope_argv(
            "diagnose",
            "--prometheus",
            url,
            "--basic-auth-user",
            "ops",
            "--basic-auth-password-file",
            str(pw),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "holds no stallscope series" in r.stderr, r.stderr
    r = subprocess.run(
        stallscope_argv("diagnose", "--prometheus", url, "--basic-auth-user", "ops"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "never taken on the command line" in r.stderr


def test_a_ca_file_lets_in_a_server_with_its_own_certificate(tmp_path: Path) -> None:
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            _result([])(self)

        def log_message(self, *_a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{srv.server_address[1]}"
    try:
        r = subprocess.run(
            stallscope_argv("diagnose", "--prometheus", url, "--timeout", "10s"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "cannot reach Prometheus" in r.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in r.stderr or "certificate" in r.stderr, r.stderr
        r = subprocess.run(
            stallscope_argv(
                "diagnose", "--prometheus", url, "--timeout", "10s", "--ca-file", str(cert)
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "holds no stallscope series" in r.stderr, r.stderr
    finally:
        srv.shutdown()
        srv.server_close()


class _Recorder:
    """A server on another address (127.0.0.2) that records the headers it received."""

    def __init__(self, host: str = "127.0.0.2") -> None:
        seen = self.seen = []  # type: list[dict[str, str]]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append({k.lower(): v for k, v in self.headers.items()})
                _result([])(self)

            def log_message(self, *_a: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer((host, 0), Handler)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _redirect_to(
    location: str, code: int, same_origin_seen: list[dict[str, str]] | None = None
) -> Reply:
    def reply(h: BaseHTTPRequestHandler) -> None:
        if same_origin_seen is not None and h.path.startswith("/final"):
            same_origin_seen.append({k.lower(): v for k, v in h.headers.items()})
            _result([])(h)
            return
        h.send_response(code)
        h.send_header("Location", location + h.path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return reply


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("how", ["bearer", "basic", "userinfo"])
def test_credentials_never_follow_a_redirect_to_another_host(
    server: Callable[[Reply], str], tmp_path: Path, code: int, how: str
) -> None:
    """Issue 50: urllib's redirect handler copied `Authorization` onto the redirected request,
    so a Prometheus answering 302 to another host handed it the token. Dropped when the scheme,
    host or port changes (as Go's net/http and requests do); the query itself still runs."""
    other = _Recorder()
    try:
        token = tmp_path / "token"
        token.write_text("s3cret-token-xyz\n")
        pw = tmp_path / "pw"
        pw.write_text("hunter2-pw\n")
        url = server(_redirect_to(other.url, code))
        auth = {
            "bearer": ["--bearer-token-file", str(token)],
            "basic": ["--basic-auth-user", "ops", "--basic-auth-password-file", str(pw)],
            "userinfo": [],
        }[how]
        if how == "userinfo":
            url = url.replace("http://", "http://ops:hunter2-pw@")
        r = subprocess.run(
            stallscope_argv("diagnose", "--prometheus", url, "--timeout", "10s", "--json", *auth),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.seen, (r.returncode, r.stderr)  # the redirect was followed
        for headers in other.seen:
            assert "authorization" not in headers, headers
        assert "holds no stallscope series" in r.stderr, r.stderr
        for secret in ("s3cret-token-xyz", "hunter2-pw"):
            assert secret not in r.stderr + r.stdout
    finally:
        other.close()


def test_credentials_stay_on_a_redirect_within_the_same_server(
    server: Callable[[Reply], str], tmp_path: Path
) -> None:
    """A redirect to the same scheme, host and port (a path move) keeps the token: the
    server it was given for asked for it."""
    seen: list[dict[str, str]] = []
    token = tmp_path / "token"
    token.write_text("s3cret-token-xyz\n")
    box: list[str] = []

    def reply(h: BaseHTTPRequestHandler) -> None:
        _redirect_to(box[0] + "/final", 307, seen)(h)

    url = server(reply)
    box.append(url)
    r = subprocess.run(
        stallscope_argv(
            "diagnose", "--prometheus", url, "--timeout", "10s", "--bearer-token-file", str(token)
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert seen and seen[0].get("authorization") == "Bearer s3cret-token-xyz", (seen, r.stderr)


def test_a_scheme_relative_redirect_chain_drops_credentials(
    server: Callable[[Reply], str], tmp_path: Path
) -> None:
    """`Location: //127.0.0.2:port/...` (another host, same scheme), reached through a chain of
    two redirects on the first server: no credential arrives there."""
    other = _Recorder()
    try:
        token = tmp_path / "token"
        token.write_text("s3cret-token-xyz\n")
        box: list[str] = []

        def reply(h: BaseHTTPRequestHandler) -> None:
            h.send_response(302)
            if h.path.startswith("/hop"):
                h.send_header("Location", "//" + other.url.split("//", 1)[1] + "/x")
            else:
                h.send_header("Location", box[0] + "/hop")
            h.send_header("Content-Length", "0")
            h.end_headers()

        url = server(reply)
        box.append(url)
        r = subprocess.run(
            stallscope_argv(
                "diagnose",
                "--prometheus",
                url,
                "--timeout",
                "10s",
                "--bearer-token-file",
                str(token),
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.seen, r.stderr
        assert all("authorization" not in h for h in other.seen), other.seen
    finally:
        other.close()


def _echoes_secrets(h: BaseHTTPRequestHandler) -> None:
    got = h.headers.get("Authorization", "")
    body = json.dumps({"status": "error", "error": f"bad credentials: {got}"}).encode()
    h.send_response(403, f"Forbidden {got}")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_secrets_are_never_printed(server: Callable[[Reply], str], tmp_path: Path) -> None:
    """Issue 50: a password in the URL was echoed in "cannot reach Prometheus at ...", and a
    server echoing the token in its 401/403 body got it printed. Redacted everywhere."""
    import base64

    token = tmp_path / "token"
    token.write_text("s3cret-token-xyz\n")
    url = server(_echoes_secrets)
    r = subprocess.run(
        stallscope_argv(
            "diagnose", "--prometheus", url, "--timeout", "10s", "--bearer-token-file", str(token)
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "refused the query (403)" in r.stderr, r.stderr
    assert "s3cret-token-xyz" not in r.stderr and "***" in r.stderr, r.stderr
    url = server(_echoes_secrets).replace("http://", "http://alice:pw-hunter2@")
    r = subprocess.run(
        stallscope_argv("diagnose", "--prometheus", url, "--timeout", "10s"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    b64 = base64.b64encode(b"alice:pw-hunter2").decode()
    assert "pw-hunter2" not in r.stderr and b64 not in r.stderr, r.stderr
    assert "refused the query (403)" in r.stderr, r.stderr  # user:pw@ was sent as basic auth
    # nothing listens there: the "cannot reach" line names the server without its password
    r = subprocess.run(
        stallscope_argv(
            "diagnose", "--prometheus", "http://alice:pw-hunter2@127.0.0.1:1", "--timeout", "5s"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "cannot reach Prometheus" in r.stderr, r.stderr
    assert "pw-hunter2" not in r.stderr, r.stderr
