"""`--web-config-file`: TLS and basic auth in the Prometheus exporter-toolkit's format.

The file is the one node_exporter and the other Prometheus exporters read, so an operator
writes it once (https://prometheus.io/docs/prometheus/latest/configuration/https/):

    tls_server_config:
      cert_file: /etc/gpuledger/tls/tls.crt
      key_file: /etc/gpuledger/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: /etc/gpuledger/tls/ca.crt      # with a Verify*/Require* type
      min_version: TLS12                             # optional; also max_version
    http_server_config:
      headers: {X-Frame-Options: deny}               # added to every answer
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes, never passwords

What is read and what is refused:
* Unknown keys are an error (a typo must not silently turn TLS off); so are
  `cipher_suites`, `curve_preferences` and `http2`, whose Go semantics we do not
  reproduce: refused rather than ignored.
* The certificate and key are re-read when their files change (cert-manager rotates
  them in place), checked at most once a second on a new connection.
* Basic auth guards every path except `/healthz` and `/readyz`, which the kubelet's
  probes call without credentials. A bcrypt check costs ~50-250 ms, so a verified
  (user, password) pair is remembered by its SHA-256 for the process's life (the
  exporter-toolkit caches the same way); a changed password simply misses.
* PyYAML and bcrypt are imported only when the flag is given: `serve` without it loads
  neither (tests/e2e/test_serve_imports.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
RELOAD_CHECK_SECONDS = 1.0
MAX_REMEMBERED_CREDENTIALS = 64

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# exporter-toolkit's client_auth_type values -> (verify mode, needs a CA file).
_CLIENT_AUTH = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_OPTIONAL, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, False),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
_TOP_KEYS = frozenset({"tls_server_config", "http_server_config", "basic_auth_users"})
_TLS_KEYS = frozenset(
    {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
)
_REFUSED_TLS_KEYS = frozenset({"cipher_suites", "curve_preferences", "prefer_server_cipher_suites"})
_HTTP_KEYS = frozenset({"headers"})


class WebConfigError(ValueError):
    """The web config file cannot be used; the message is one line for the operator."""


@dataclass(frozen=True)
class TlsFiles:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    verify_mode: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion | None


class TlsContext:
    """An SSLContext that follows its certificate files when they are replaced."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._context = build_context(files)
        self._checked = time.monotonic()

    def _mtimes(self) -> tuple[float, ...]:
        paths = [self.files.cert_file, self.files.key_file, self.files.client_ca_file]
        return tuple(p.stat().st_mtime if p is not None else 0.0 for p in paths)

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return self._context
        with self._lock:
            self._checked = now
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._context, self._stamp = build_context(self.files), stamp
            except (OSError, ssl.SSLError, WebConfigError):
                pass  # a half-written rotation: keep serving the previous certificate
            return self._context


def build_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = files.min_version
    if files.max_version is not None:
        context.maximum_version = files.max_version
    try:
        for path in (files.cert_file, files.key_file, files.client_ca_file):
            if path is not None:
                path.open("rb").close()  # ssl's own error does not name the file
        context.load_cert_chain(files.cert_file, files.key_file)
        if files.client_ca_file is not None:
            context.load_verify_locations(cafile=files.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"cannot load the TLS certificate or CA: {_reason(exc)}") from None
    context.verify_mode = files.verify_mode
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@dataclass
class BasicAuth:
    """Checks `Authorization: Basic …` against bcrypt hashes."""

    users: Mapping[str, bytes]
    _verified: dict[bytes, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allows(self, authorization: str | None) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self.users.get(user)
        if hashed is None:
            return False
        digest = hashlib.sha256(hashed + b"\0" + user.encode() + b"\0" + password).digest()
        with self._lock:
            if digest in self._verified:
                return True
        import bcrypt  # noqa: PLC0415 (only when basic auth is configured)

        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:  # a malformed hash in the file: nobody gets in with it
            return False
        if ok:
            with self._lock:
                if len(self._verified) >= MAX_REMEMBERED_CREDENTIALS:
                    self._verified.clear()
                self._verified[digest] = user
        return ok


def _basic_credentials(authorization: str | None) -> tuple[str, bytes] | None:
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class WebConfig:
    tls: TlsContext | None
    auth: BasicAuth | None
    headers: tuple[tuple[str, str], ...]

    def authorized(self, path: str, authorization: str | None) -> bool:
        return self.auth is None or path in OPEN_PATHS or self.auth.allows(authorization)


def load_web_config(path: str) -> WebConfig:
    """Reads and checks `path`; raises WebConfigError with a one-line reason."""
    import yaml  # noqa: PLC0415 (only when the flag is given)

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise WebConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path} is not YAML: {str(exc).splitlines()[0]}") from None
    doc = {} if doc is None else doc
    _mapping(doc, "the file")
    _known(doc, _TOP_KEYS, "the file")
    base = Path(path).parent
    tls = _tls(doc.get("tls_server_config"), base)
    return WebConfig(
        tls=TlsContext(tls) if tls is not None else None,
        auth=_users(doc.get("basic_auth_users")),
        headers=_headers(doc.get("http_server_config")),
    )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WebConfigError(f"{where} must be a mapping")
    return value


def _known(doc: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise WebConfigError(f"unknown key {unknown[0]!r} in {where}")


def _file(value: object, base: Path, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"tls_server_config.{key} must be a file path")
    candidate = Path(value)
    return candidate if candidate.is_absolute() else base / candidate


def _version(value: object, key: str) -> ssl.TLSVersion:
    if value not in _TLS_VERSIONS:
        raise WebConfigError(
            f"tls_server_config.{key} must be one of {', '.join(_TLS_VERSIONS)}, not {value!r}"
        )
    return _TLS_VERSIONS[str(value)]


def _tls(value: object, base: Path) -> TlsFiles | None:
    if value is None:
        return None
    doc = _mapping(value, "tls_server_config")
    refused = sorted(str(k) for k in doc if k in _REFUSED_TLS_KEYS)
    if refused:
        raise WebConfigError(f"tls_server_config.{refused[0]} is not supported by gpuledger")
    _known(doc, _TLS_KEYS, "tls_server_config")
    auth_type = doc.get("client_auth_type", "NoClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type must be one of {', '.join(_CLIENT_AUTH)}"
        )
    verify_mode, needs_ca = _CLIENT_AUTH[auth_type]
    ca = doc.get("client_ca_file")
    if needs_ca and not ca:
        raise WebConfigError(f"client_auth_type {auth_type} needs tls_server_config.client_ca_file")
    files = TlsFiles(
        cert_file=_file(doc.get("cert_file"), base, "cert_file"),
        key_file=_file(doc.get("key_file"), base, "key_file"),
        client_ca_file=_file(ca, base, "client_ca_file") if ca else None,
        verify_mode=verify_mode,
        min_version=_version(doc.get("min_version", "TLS12"), "min_version"),
        max_version=_version(doc["max_version"], "max_version") if "max_version" in doc else None,
    )
    build_context(files)  # a bad certificate fails at startup, not on the first scrape
    return files


def _users(value: object) -> BasicAuth | None:
    if value is None:
        return None
    doc = _mapping(value, "basic_auth_users")
    users: dict[str, bytes] = {}
    for user, hashed in doc.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"basic_auth_users.{user}: expected a bcrypt hash ($2y$…)")
        users[str(user)] = hashed.encode()
    try:
        import bcrypt  # noqa: F401, PLC0415
    except ImportError:
        raise WebConfigError(
            "basic_auth_users needs the bcrypt package: pip install 'gpuledger[web]'"
        ) from None
    return BasicAuth(users)


def _headers(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    doc = _mapping(value, "http_server_config")
    if "http2" in doc:
        raise WebConfigError("http_server_config.http2 is not supported by gpuledger")
    _known(doc, _HTTP_KEYS, "http_server_config")
    headers = _mapping(doc.get("headers") or {}, "http_server_config.headers")
    pairs = []
    for name, text in headers.items():
        if not isinstance(text, str) or any(c in str(name) + text for c in "\r\n"):
            raise WebConfigError(f"http_server_config.headers.{name} must be a one-line string")
        pairs.append((str(name), text))
    return tuple(pairs)
