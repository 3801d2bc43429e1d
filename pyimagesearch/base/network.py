"""Whether a host on the internet answers, asked as a download would ask it; no TensorFlow.

`pyimagesearch.datasets.sources` asks before `auto` picks tfds (its host is
Google's bucket); the notebook asks before it uninstalls anything for pip
(the package index's host).
"""
import os
import re
import socket
import threading

ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"  # what the probe can find


def probe(address, timeout, environ=os.environ):
    """How `address` (host, port) answers: {"verdict": ANSWERS | REFUSED | SILENT, "via": ...}.

    "via" says what was asked: host:port, or the proxy.

    As `requests` does (tfds' downloads, pip), it goes through the proxy that
    HTTPS_PROXY names unless NO_PROXY exempts the host: a CONNECT there that
    the proxy must accept. REFUSED is a definite no (no route, no name, a
    refused connection, a proxy that says no); SILENT is no answer within
    `timeout` seconds, which a slow link can give too. Runs in a daemon
    thread so that a hanging DNS lookup cannot hold us past the timeout either.
    """
    import urllib.request

    host, port = address
    proxy = environ.get("https_proxy") or environ.get("HTTPS_PROXY")
    exempt = environ.get("no_proxy") or environ.get("NO_PROXY")
    if proxy and exempt and urllib.request.proxy_bypass_environment(host, {"no": exempt}):
        proxy = None
    via = f"the proxy {_without_password(proxy)}" if proxy else f"{host}:{port}"
    result = []

    def ask():
        try:
            if proxy:
                result.append(_through_proxy(proxy, host, port, timeout))
            else:
                socket.create_connection(address, timeout=timeout).close()
                result.append(ANSWERS)
        except socket.timeout:
            result.append(SILENT)
        except (OSError, ValueError):  # no name, no route, refused; a proxy URL we cannot read
            result.append(REFUSED)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return {"verdict": result[0] if result else SILENT, "via": via}


def _without_password(url):
    """A proxy URL fit to print: user:password@ taken out."""
    return re.sub(r"//[^/@]*@", "//", url)


def _through_proxy(proxy, host, port, timeout):
    """ANSWERS if the HTTP proxy at `proxy` opens a tunnel to host:port, else REFUSED."""
    import base64
    import ssl
    import urllib.parse

    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    tunnel = socket.create_connection(
        (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
        timeout=timeout)
    with tunnel:
        if parts.scheme == "https":
            tunnel = ssl.create_default_context().wrap_socket(tunnel,
                                                              server_hostname=parts.hostname)
        ask = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        if parts.username:
            secret = f"{urllib.parse.unquote(parts.username)}:" \
                     f"{urllib.parse.unquote(parts.password or '')}"
            ask += f"Proxy-Authorization: Basic {base64.b64encode(secret.encode()).decode()}\r\n"
        tunnel.sendall((ask + "\r\n").encode())
        status = tunnel.recv(1024).split(b"\r\n", 1)[0].split()
    return ANSWERS if len(status) > 1 and status[1] == b"200" else REFUSED
