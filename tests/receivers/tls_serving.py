"""HTTPS for the HTTP receivers (pyroscope_ingest.py, otlp_profiles.py):
with [CERT, KEY] (PEM files) the server's socket is wrapped by Python's
ssl module, TLS 1.2 or later, the certificate its chain as given. A
client that refuses the certificate fails its handshake in accept(),
which socketserver takes as one failed request: the server goes on.
"""
import ssl


def serve_tls_if_asked(server, cert_and_key):
    if len(cert_and_key) < 2:
        return server
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_and_key[0], cert_and_key[1])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server
