"""Mutual TLS between the tasks of a cluster, keyed by the cluster's token, which never leaves a
task.

Why: a token sent with every call (as gRPC metadata) reaches whoever listens at a task's
address: another user who binds the port of a task that died receives it, then calls the live
tasks with it. Here the token never travels. Every task derives the same certificate
authority from it (a P-256 key from ``scrypt(token)``, so guessing the token offline costs a
memory-hard hash per guess) and, at start, makes its own key and a certificate signed by that
authority. A server presents its certificate and requires the client's; a client accepts only
a server whose certificate that authority signed. A listener without the token completes no
handshake: it learns nothing it can replay (a TLS handshake proves possession of a key with a
signature over that connection's transcript), and the client refuses it before sending any
request. The same TLS encrypts every frame between hosts.

The certificates name ``TARGET_NAME``, not a host: the cluster's addresses are whatever its spec
says, and the proof that matters is the authority's signature, not a host name.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib

import grpc

TARGET_NAME = "stratax-cluster"
_SALT = b"stratax parameter-server cluster authority v1"
# scrypt's cost: 16 MiB of memory and a fraction of a second, once per process and per offline
# guess of the token.
_SCRYPT = {"n": 1 << 14, "r": 8, "p": 1}
_FOREVER = datetime.datetime(2200, 1, 1, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class _Material:
    authority: bytes  # the cluster's CA certificate (PEM)
    key: bytes        # this process' private key (PEM)
    certificate: bytes  # this process' certificate, signed by the authority (PEM)


def server_credentials(token: str) -> grpc.ServerCredentials:
    """A server's side: its certificate, and a client certificate required, signed by the
    authority that ``token`` gives."""
    material = _material(token)
    return grpc.ssl_server_credentials([(material.key, material.certificate)],
                                       root_certificates=material.authority,
                                       require_client_auth=True)


def channel_credentials(token: str) -> grpc.ChannelCredentials:
    """A client's side: its certificate, and only servers signed by ``token``'s authority."""
    material = _material(token)
    return grpc.ssl_channel_credentials(root_certificates=material.authority,
                                        private_key=material.key,
                                        certificate_chain=material.certificate)


@functools.lru_cache(maxsize=4)
def _material(token: str) -> _Material:
    """The authority of ``token`` and this process' certificate (made once per token)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as err:  # a declared dependency; a broken install says how to fix it
        raise ImportError(
            "stratax's parameter-server TLS needs the 'cryptography' package; "
            "`pip install cryptography`.") from err

    seed = hashlib.scrypt(token.encode("utf-8"), salt=_SALT, dklen=48, **_SCRYPT)
    order = int("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551", 16)
    authority_key = ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1,
                                          ec.SECP256R1())
    authority_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                   "stratax cluster authority")])
    authority_id = x509.SubjectKeyIdentifier.from_public_key(authority_key.public_key())
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    authority = (
        x509.CertificateBuilder()
        .subject_name(authority_name).issuer_name(authority_name)
        .public_key(authority_key.public_key())
        .serial_number(1).not_valid_before(start).not_valid_after(_FOREVER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(authority_id, critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stratax task")]))
        .issuer_name(authority_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(_FOREVER)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(TARGET_NAME)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
            authority_id), critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return _Material(
        authority=authority.public_bytes(pem),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
        certificate=certificate.public_bytes(pem),
    )
