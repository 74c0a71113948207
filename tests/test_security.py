"""Authentication and TLS through the real interface: a stack started with a token and with
mutual TLS; callers without the credential are refused, health checks stay open."""

from __future__ import annotations

import dataclasses
import subprocess

import grpc
import pytest
from conftest import tiny_stack
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import make_request
from specdec.launch.stack import EmbeddedStack
from specdec.runtime import security
from specdec.runtime.security import Security


def _generate(channel: grpc.Channel) -> list[int]:
    request = make_request(prompt="secure", max_new_tokens=4, gamma=2)
    return [t for reply in pb_grpc.SpecDecStub(channel).Generate(request, timeout=60) for t in reply.token_ids]


def _health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


@pytest.fixture
def secured(request, tmp_path):
    """Start a stack under `Security` built from files in tmp_path; this process uses it too."""
    def start(token: bool, tls: bool) -> tuple[EmbeddedStack, Security]:
        flags = {}
        if token:
            (tmp_path / "tokens").write_text("service-token\nclient-token\n")
            flags["token_file"] = str(tmp_path / "tokens")
        if tls:
            _make_certificates(tmp_path)
            flags.update(cert=str(tmp_path / "node.pem"), key=str(tmp_path / "node.key"), ca=str(tmp_path / "ca.pem"))
        settings = Security.from_files(**flags)
        pairs = [("--auth-token-file", "token_file"), ("--tls-cert", "cert"), ("--tls-key", "key"), ("--tls-ca", "ca")]
        argv = tuple(part for flag, name in pairs if name in flags for part in (flag, flags[name]))
        previous = security.current()
        security.use(settings)
        request.addfinalizer(lambda: security.use(previous))
        stack = EmbeddedStack(dataclasses.replace(tiny_stack().opts, security_flags=argv)).__enter__()
        request.addfinalizer(stack.stop)
        return stack, settings

    return start


def test_a_token_guards_every_service_but_not_health(secured):
    stack, settings = secured(token=True, tls=False)
    for token in ("service-token", "client-token"):  # every listed token is a credential
        assert len(_generate(Security((token,)).channel(stack.endpoint))) == 4
    for channel in (grpc.insecure_channel(stack.endpoint), Security(("wrong",)).channel(stack.endpoint)):
        with pytest.raises(grpc.RpcError) as info:
            _generate(channel)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    # The services behind the orchestrator demand the token too.
    with grpc.insecure_channel(stack.target_address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.TargetServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_mutual_tls_between_every_hop(secured):
    stack, settings = secured(token=False, tls=True)
    assert len(_generate(settings.channel(stack.endpoint))) == 4
    no_client_cert = Security(ca=settings.ca)
    for channel in (grpc.insecure_channel(stack.target_address), no_client_cert.channel(stack.target_address)):
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.TargetServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _make_certificates(folder) -> None:
    """A CA and one node certificate for 127.0.0.1/localhost, usable as server and client (openssl)."""
    run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=specdec test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=localhost")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem",
        "-days", "2", "-extfile", "ext.cnf")


def test_a_plaintext_health_port_beside_a_tls_server(tmp_path):
    """Probes that cannot speak TLS (Kubernetes' gRPC probe) get health, and only health, in plaintext."""
    from specdec.runtime.server import free_port, start_server

    _make_certificates(tmp_path)
    settings = Security.from_files(cert=str(tmp_path / "node.pem"), key=str(tmp_path / "node.key"),
                                   ca=str(tmp_path / "ca.pem"))
    previous = security.current()
    security.use(settings)
    try:
        health_port = free_port()
        running = start_server(lambda server: None, ["specdec.v1.SpecDec"], "127.0.0.1", 0, max_concurrent=4,
                               health_port=health_port)
    finally:
        security.use(previous)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="x"), timeout=5).next()
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel, pytest.raises(grpc.RpcError):
            _health(channel)
        assert _health(settings.channel(f"127.0.0.1:{running.port}")) == health_pb2.HealthCheckResponse.SERVING
    finally:
        running.stop(0)


def test_the_http_api_serves_https_and_wants_the_token(secured, tmp_path):
    """The OpenAI API beside a token + mutual-TLS stack: HTTPS with the stack's certificate, the bearer
    token from HTTP clients, and the stack's own credentials towards the orchestrator."""
    import ssl

    import httpx2 as httpx

    from specdec.http.flags import HttpConfig
    from specdec.http.server import start_http

    stack, _ = secured(token=True, tls=True)
    running = start_http(HttpConfig(endpoint=stack.endpoint), "127.0.0.1", 0)
    try:
        assert running.url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))  # written by `secured`
        with httpx.Client(verify=trust, timeout=30) as client:
            assert client.get(running.url + "/health").status_code == 200  # probes need no token
            assert client.get(running.url + "/v1/models").status_code == 401
            body = {"model": "tiny:seed=0", "prompt": "secure", "max_tokens": 4, "temperature": 0}
            reply = client.post(running.url + "/v1/completions", json=body,
                                headers={"Authorization": "Bearer client-token"})
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        with pytest.raises(httpx.TransportError):  # plaintext HTTP is not served
            httpx.get(running.url.replace("https://", "http://") + "/health", timeout=5)
    finally:
        running.stop()

