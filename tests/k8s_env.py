"""A real, throw-away Kubernetes control plane for integration tests.

Why this exists: the operator (built on kopf) must be tested against a real
Kubernetes API server -- admission, validation, RBAC, watches, resource
versions and the built-in controllers behave in ways no fake reproduces. There
is no docker (so no kind/k3d) and no downloadable envtest tarball here, so
``scripts/k8s-test-binaries.sh`` builds kube-apiserver and
kube-controller-manager from the Go module proxy (etcd comes from Debian), and
this module runs them, envtest style:

* etcd on loopback with random ports and a throw-away data dir (on tmpfs when
  ``/dev/shm`` exists, since Debian's etcd 3.4 has no ``--unsafe-no-fsync``);
* kube-apiserver on ``127.0.0.1`` with a random secure port, a CA and serving
  certificate and a service-account signing key generated with the ``openssl``
  CLI, and a static admin token in group ``system:masters`` (RBAC);
* optionally kube-controller-manager, so that e.g. Deployments get
  ReplicaSets and namespaces really get deleted.

Only the standard library and the ``openssl`` CLI are used, so this module can
be imported without pytest. Every child process gets ``PR_SET_PDEATHSIG`` =
SIGKILL so that none outlives the Python process, even on a hard crash.

Usage::

    with KubeTestEnv(with_controller_manager=True) as env:
        subprocess.run(["kubectl", "--kubeconfig", str(env.kubeconfig_path), "get", "ns"])
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "KubeBinariesUnavailable",
    "KubeTestEnv",
    "KubeTestEnvError",
    "find_bin_dir",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "scripts" / "k8s-test-binaries.sh"
BIN_DIR_ENV = "AIRUNTIME_K8S_BIN"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
ADMIN_USER = "airuntime-admin"

# Controllers that need a cloud provider or real nodes' networking.
_CLOUD_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "service-lb-controller",
    "node-route-controller",
)

_PR_SET_PDEATHSIG = 1
# Temp dirs are named <prefix><owner pid>-<random> so that the leftovers of a
# killed test run (which cannot clean up) are removed by the next one.
_WORKDIR_PREFIX = "airuntime-k8s-"
_ETCD_DIR_PREFIX = "airuntime-etcd-"
_LOG_TAIL_BYTES = 6000


class KubeTestEnvError(RuntimeError):
    """The control plane could not be started."""


class KubeBinariesUnavailable(KubeTestEnvError):
    """The Kubernetes binaries are not there and could not be built."""


def find_bin_dir(*, build_timeout: float = 3600.0) -> Path:
    """Return the directory holding etcd, kube-apiserver and kube-controller-manager.

    Uses ``$AIRUNTIME_K8S_BIN`` when set, otherwise runs the build script
    (instant when its cache is warm; tens of minutes on a cold cache).
    """
    env_dir = os.environ.get(BIN_DIR_ENV)
    if env_dir:
        bin_dir = Path(env_dir)
    else:
        if not BUILD_SCRIPT.is_file():
            raise KubeBinariesUnavailable(f"build script not found: {BUILD_SCRIPT}")
        try:
            proc = subprocess.run(
                ["bash", str(BUILD_SCRIPT)],
                capture_output=True,
                text=True,
                timeout=build_timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KubeBinariesUnavailable(f"{BUILD_SCRIPT} failed: {exc}") from exc
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise KubeBinariesUnavailable(
                f"{BUILD_SCRIPT} exited with {proc.returncode}:\n{_tail_text(proc.stderr)}"
            )
        bin_dir = Path(lines[-1])
    missing = [b for b in REQUIRED_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise KubeBinariesUnavailable(f"missing in {bin_dir}: {', '.join(missing)}")
    return bin_dir


def _tail_text(text: str, limit: int = _LOG_TAIL_BYTES) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed but not yet reaped process (zombie) is gone too
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _remove_stale_dirs(parent: Path, prefix: str) -> None:
    """Remove ``<parent>/<prefix><pid>-*`` dirs whose owner process is gone."""
    try:
        candidates = list(parent.glob(f"{prefix}*"))
    except OSError:
        return
    for path in candidates:
        pid_text = path.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies.

    Caveat of PR_SET_PDEATHSIG: "parent" is the *thread* that forked, so start
    the environment from a long-lived thread (pytest's main thread is fine).
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent_pid = os.getpid()

    def preexec() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)
        # The parent may have died between fork() and prctl().
        if os.getppid() != parent_pid:
            os._exit(127)

    return preexec


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise KubeTestEnvError(f"openssl {' '.join(args)} failed:\n{proc.stdout}")


class _Process:
    """One child process with its log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        return _tail_text(data.decode("utf-8", "replace"), limit)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        try:
            self.popen.send_signal(signal.SIGTERM)
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        except ProcessLookupError:
            pass

    def failure(self, message: str) -> KubeTestEnvError:
        status = self.popen.poll()
        state = "running" if status is None else f"exited with {status}"
        return KubeTestEnvError(
            f"{self.name}: {message} ({state}); log {self.log_path}:\n{self.log_tail()}"
        )


class KubeTestEnv:
    """etcd + kube-apiserver (+ kube-controller-manager) on loopback.

    ``start()`` (or ``with``) brings it up and waits until the API server's
    ``/readyz`` says ok; ``stop()`` ends every process and removes the temp
    dir. Connect with ``kubeconfig_path`` or with ``server`` + ``token`` +
    ``ca_path``.
    """

    def __init__(
        self,
        *,
        bin_dir: Path | str | None = None,
        with_controller_manager: bool = False,
        startup_timeout: float = 120.0,
        extra_apiserver_args: Sequence[str] = (),
        service_account_admission: bool = False,
    ) -> None:
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.with_controller_manager = with_controller_manager
        self.service_account_admission = service_account_admission
        self.startup_timeout = startup_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.token = secrets.token_hex(24)
        self.startup_seconds: float | None = None
        self._workdir: Path | None = None
        self._etcd_dir: Path | None = None
        self._processes: list[_Process] = []
        self._server: str | None = None

    # -- public accessors ---------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise KubeTestEnvError("KubeTestEnv is not started")
        return self._workdir

    @property
    def server(self) -> str:
        """The API server URL, ``https://127.0.0.1:<port>``."""
        if self._server is None:
            raise KubeTestEnvError("KubeTestEnv is not started")
        return self._server

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def ca_path(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> KubeTestEnv:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> KubeTestEnv:
        if self._workdir is not None:
            raise KubeTestEnvError("KubeTestEnv is already started")
        bin_dir = self.bin_dir  # may build; not part of the startup time
        started = time.monotonic()
        shm = Path("/dev/shm")
        etcd_parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        _remove_stale_dirs(Path(tempfile.gettempdir()), _WORKDIR_PREFIX)
        if etcd_parent is not None:
            _remove_stale_dirs(etcd_parent, _ETCD_DIR_PREFIX)
        pid_prefix = f"{os.getpid()}-"
        self._workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX + pid_prefix))
        self._etcd_dir = Path(
            tempfile.mkdtemp(prefix=_ETCD_DIR_PREFIX + pid_prefix, dir=etcd_parent or self._workdir)
        )
        try:
            self._write_pki()
            self._write_token_file()
            etcd_url = self._start_etcd(bin_dir)
            self._start_apiserver(bin_dir, etcd_url)
            self._write_kubeconfig()
            if self.with_controller_manager:
                self._start_controller_manager(bin_dir)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and remove temp dirs."""
        for proc in reversed(self._processes):
            proc.stop()
        self._processes.clear()
        for path in (self._etcd_dir, self._workdir):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        self._etcd_dir = None
        self._workdir = None
        self._server = None

    def logs(self) -> dict[str, Path]:
        """Log file of each running process, by name."""
        return {p.name: p.log_path for p in self._processes}

    def pids(self) -> dict[str, int]:
        """Process id of each running process, by name (e.g. for its CPU time)."""
        return {p.name: p.popen.pid for p in self._processes}

    def log_tail(self, name: str, limit: int = _LOG_TAIL_BYTES) -> str:
        """The end of a running process's log (``etcd``, ``kube-apiserver``, ...)."""
        for proc in self._processes:
            if proc.name == name:
                return proc.log_tail(limit)
        return f"<no process named {name!r}>"

    # -- setup steps --------------------------------------------------------

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir()
        ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
        _openssl("genpkey", *ec, "-out", "ca.key", cwd=pki)
        _openssl(
            "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "7",
            "-subj", "/CN=airuntime-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            cwd=pki,
        )  # fmt: skip
        _openssl("genpkey", *ec, "-out", "apiserver.key", cwd=pki)
        _openssl(
            "req", "-new", "-key", "apiserver.key", "-out", "apiserver.csr",
            "-subj", "/CN=kube-apiserver",
            cwd=pki,
        )  # fmt: skip
        sans = ",".join(
            [
                "IP:127.0.0.1",
                f"IP:{KUBERNETES_SERVICE_IP}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        (pki / "apiserver.ext").write_text(
            f"subjectAltName={sans}\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl(
            "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "7", "-extfile", "apiserver.ext",
            "-out", "apiserver.crt",
            cwd=pki,
        )  # fmt: skip
        # Service-account token signing key (RS256 is what every client expects).
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                 "-out", "sa.key", cwd=pki)  # fmt: skip
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

    def _write_token_file(self) -> None:
        # token,user,uid,"group1,group2"
        line = f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        path = self.workdir / "tokens.csv"
        path.write_text(line)
        path.chmod(0o600)

    def _write_kubeconfig(self) -> None:
        ca_data = base64.b64encode(self.ca_path.read_bytes()).decode("ascii")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "airuntime-test",
                    "cluster": {"server": self.server, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "airuntime-test",
                    "context": {"cluster": "airuntime-test", "user": ADMIN_USER},
                }
            ],
            "current-context": "airuntime-test",
        }
        # JSON is valid YAML, and every kubeconfig loader takes it.
        self.kubeconfig_path.write_text(json.dumps(config, indent=2) + "\n")
        self.kubeconfig_path.chmod(0o600)

    def _spawn(self, name: str, argv: Sequence[str]) -> _Process:
        proc = _Process(name, argv, self.workdir / f"{name}.log")
        self._processes.append(proc)
        return proc

    def _deadline(self) -> float:
        return time.monotonic() + self.startup_timeout

    def _start_etcd(self, bin_dir: Path) -> str:
        assert self._etcd_dir is not None
        client_port, peer_port = _free_port(), _free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        proc = self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self._etcd_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-level=warn",
            ],
        )
        deadline = self._deadline()
        while True:
            if not proc.alive():
                raise proc.failure("exited during startup")
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return client_url
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise proc.failure("not healthy in time")
            time.sleep(0.1)

    def _start_apiserver(self, bin_dir: Path, etcd_url: str) -> None:
        pki = self.workdir / "pki"
        port = _free_port()
        argv = [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # The ServiceAccount admission plugin rejects pods until the
            # controller-manager has created the namespace's "default"
            # ServiceAccount; without it no pod could be created at all. A real
            # node (tests/k8s_node.py) needs it: it mounts the pods' API tokens.
            *(
                ()
                if self.service_account_admission
                else ("--disable-admission-plugins=ServiceAccount",)
            ),
            "--allow-privileged=true",
            # The master-endpoint reconciler cannot publish a loopback address
            # in the "kubernetes" Endpoints (validation rejects 127.0.0.0/8).
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]
        proc = self._spawn("kube-apiserver", argv)
        self._server = f"https://127.0.0.1:{port}"
        self._wait_https_ok(proc, f"{self._server}/readyz", cafile=self.ca_path, token=self.token)

    def _start_controller_manager(self, bin_dir: Path) -> None:
        pki = self.workdir / "pki"
        port = _free_port()
        controllers = ",".join(["*", *(f"-{c}" for c in _CLOUD_CONTROLLERS)])
        argv = [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig_path}",
            # No --authentication/authorization-kubeconfig: they would make it
            # look for a front-proxy (requestheader) CA that this apiserver
            # lacks. Its own endpoints are not used beyond /healthz.
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false",
            f"--controllers={controllers}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--profiling=false",
        ]
        proc = self._spawn("kube-controller-manager", argv)
        # Its serving certificate is self-signed; /healthz only proves it is up.
        self._wait_https_ok(proc, f"https://127.0.0.1:{port}/healthz", cafile=None, token=None)

    def _wait_https_ok(
        self, proc: _Process, url: str, *, cafile: Path | None, token: str | None
    ) -> None:
        if cafile is not None:
            context = ssl.create_default_context(cafile=str(cafile))
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = self._deadline()
        last_error = "no answer"
        while True:
            if not proc.alive():
                raise proc.failure(f"exited during startup (last probe of {url}: {last_error})")
            request = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                    body = resp.read().decode("utf-8", "replace").strip()
                    if resp.status == 200 and body == "ok":
                        return
                    last_error = f"HTTP {resp.status}: {body[:200]}"
            except urllib.error.HTTPError as exc:
                last_error = f"HTTP {exc.code}: {exc.read()[:500].decode('utf-8', 'replace')}"
            except (OSError, ssl.SSLError) as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                raise proc.failure(f"{url} not ok after {self.startup_timeout:.0f}s: {last_error}")
            time.sleep(0.2)
