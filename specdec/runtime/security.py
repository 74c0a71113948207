"""Transport security and credentials for servers and the channels between them.

Off by default (loopback); one flag away everywhere else:
- `--auth-token-file`: callers send `authorization: Bearer <token>`; services present the same
  token to each other, so one secret guards the whole stack.
- `--tls-cert/--tls-key`: serve TLS. `--tls-ca`: trust this CA for the services this process
  calls, and (on a server) require client certificates signed by it, i.e. mutual TLS.
"""

from __future__ import annotations

import argparse
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Security:
    """`tokens`: the accepted bearer tokens (one per line in the file; the first is the one this
    process presents to its peers). A client's token is its credential: it owns its sessions."""

    tokens: tuple[str, ...] = ()
    cert: bytes = b""  # PEM: this process's certificate chain (server, and client for mTLS)
    key: bytes = b""
    ca: bytes = b""  # PEM: the CA that signs peers
    server_name: str = ""  # the name peers' certificates carry, when they are reached by IP (Redis discovery)

    @classmethod
    def from_files(cls, token_file: str = "", cert: str = "", key: str = "", ca: str = "",
                   server_name: str = "") -> "Security":
        read = lambda path: Path(path).read_bytes() if path else b""  # noqa: E731
        tokens = tuple(line.strip() for line in Path(token_file).read_text().splitlines() if line.strip()) \
            if token_file else ()
        if token_file and not tokens:
            raise SystemExit(f"auth token file {token_file} holds no token")
        if bool(cert) != bool(key):
            raise SystemExit("--tls-cert and --tls-key go together")
        return cls(tokens, read(cert), read(key), read(ca), server_name)

    @property
    def token(self) -> str:
        """The token this process presents to the services it calls."""
        return self.tokens[0] if self.tokens else ""

    @property
    def tls(self) -> bool:
        return bool(self.cert or self.ca)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """None: serve plaintext. With a CA, clients must present a certificate it signed."""
        if not self.cert:
            return None
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca or None,
                                           require_client_auth=bool(self.ca))

    def authorized(self, authorization: str) -> bool:
        """Whether an `authorization` header value carries an accepted token (always, without tokens)."""
        if not self.tokens:
            return True
        presented = authorization.encode()
        return any([hmac.compare_digest(presented, f"Bearer {token}".encode()) for token in self.tokens])

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca or None, private_key=self.key or None,
                                            certificate_chain=self.cert or None)

    def _options(self, options: list | None) -> list:
        names = [("grpc.ssl_target_name_override", self.server_name)] if self.tls and self.server_name else []
        return [*(options or []), *names]

    def channel(self, address: str, options: list | None = None) -> grpc.Channel:
        """A channel to a peer service or server, with TLS and the bearer token as configured."""
        if self.tls:
            channel = grpc.secure_channel(address, self._credentials(), options=self._options(options))
        else:
            channel = grpc.insecure_channel(address, options=options)
        if self.token:
            channel = grpc.intercept_channel(channel, _BearerToken(self.token))
        return channel

    def aio_channel(self, address: str, options: list | None = None) -> grpc.aio.Channel:
        """An asyncio channel with the same TLS; calls pass `call_metadata()` for the token."""
        if self.tls:
            return grpc.aio.secure_channel(address, self._credentials(), options=self._options(options))
        return grpc.aio.insecure_channel(address, options=options)

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (works on plaintext channels too)."""

    def __init__(self, token: str):
        self.header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        return details._replace(metadata=[*(details.metadata or ()), self.header])  # grpc's details: a namedtuple

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


_process = Security()


def use(security: Security) -> None:
    """Set this process's security: what `open_channel` and `start_server` apply by default."""
    global _process
    _process = security


def current() -> Security:
    return _process


def open_channel(address: str, options: list | None = None) -> grpc.Channel:
    """A channel from this process to a peer, with this process's TLS and token."""
    return _process.channel(address, options)


def add_security_args(parser: argparse.ArgumentParser) -> None:
    """The flags, each defaulting to an environment variable (for containers and Secrets)."""
    env = os.environ.get
    parser.add_argument("--auth-token-file", default=env("SPECDEC_AUTH_TOKEN_FILE", ""),
                        help="require (and send) 'authorization: Bearer <token>'; one token per line, the first "
                             "is sent to peers (default: $SPECDEC_AUTH_TOKEN_FILE)")
    parser.add_argument("--tls-cert", default=env("SPECDEC_TLS_CERT", ""),
                        help="PEM certificate chain: serve TLS and present it to peers (default: $SPECDEC_TLS_CERT)")
    parser.add_argument("--tls-key", default=env("SPECDEC_TLS_KEY", ""), help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", default=env("SPECDEC_TLS_CA", ""),
                        help="PEM CA: verify peers; a server then requires client certificates (mutual TLS)")
    parser.add_argument("--tls-server-name", default=env("SPECDEC_TLS_SERVER_NAME", ""),
                        help="expect this name in every peer's certificate instead of its address "
                             "(for peers reached by IP); default: $SPECDEC_TLS_SERVER_NAME")


def security_from_args(args: argparse.Namespace) -> Security:
    return Security.from_files(args.auth_token_file, args.tls_cert, args.tls_key, args.tls_ca, args.tls_server_name)


def security_flags(args: argparse.Namespace) -> list[str]:
    """The security flags of `args`, to hand on to child services."""
    pairs = [("--auth-token-file", args.auth_token_file), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
             ("--tls-ca", args.tls_ca), ("--tls-server-name", args.tls_server_name)]
    return [part for flag, value in pairs if value for part in (flag, value)]
