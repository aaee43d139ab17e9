"""A real Kubernetes node for the end-to-end tests: containerd + runc + CNI + kubelet.

Why this exists: :class:`tests.k8s_env.KubeTestEnv` is a real control plane (etcd,
kube-apiserver, kube-controller-manager) but has no node, so no pod ever runs. This
module adds one, made of the real parts a cluster node runs, so that the chart's
Deployments go the whole way -- Deployment -> ReplicaSet -> scheduled Pod -> containers
started by containerd and runc from the built image, with the pod spec's command, env,
user, read-only root filesystem, capabilities, volumes and probes enforced by the real
kubelet:

* ``kube-scheduler`` and ``kubelet`` v1.30 built from the Go module proxy
  (``scripts/k8s-node-binaries.sh``), the kubelet with the cgroupfs driver (the machines
  have the hybrid cgroup v1 layout) and containerd's CRI socket;
* ``containerd`` and ``runc`` from Debian, in a private root/state directory with its own
  socket; the images (the airuntime image archive built by ``scripts/image-build.sh``
  and a ``pause`` sandbox image written here from a static binary, since no image can
  be pulled) are imported with ``ctr``;
* pod networking: the CNI ``bridge`` + ``host-local`` plugins from Debian on a bridge of
  its own (:data:`POD_SUBNET`, gateway :data:`POD_GATEWAY` on the host), so every pod has
  its own network namespace and IP, reachable from the host;
* no kube-proxy: Services are not load-balanced. Two virtual IPs of the service range are
  DNATed to loopback instead (``route_localnet`` on the bridge): the ``kubernetes``
  Service IP to the API server (so in-cluster clients work unchanged, its serving
  certificate names that IP) and :data:`REDIS_SERVICE_IP` to a Redis of the test's.
  The test reaches pods by their pod IP.

One node per machine at a time (a lock file); the leftovers of a killed run (mounts,
containerd shims, network namespaces, the bridge, the iptables chain) are removed by
the next run. Needs root, iptables, and the Debian packages ``containerd``, ``runc``
and ``containernetworking-plugins``: :func:`node_unavailable` says what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.k8s_env import (
    SERVICE_CLUSTER_IP_RANGE,
    KubeTestEnv,
    KubeTestEnvError,
    _free_port,
    _Process,
)
from tests.polling import wait_until

__all__ = [
    "NODE_NAME",
    "POD_GATEWAY",
    "POD_SUBNET",
    "REDIS_SERVICE_IP",
    "KubeNode",
    "node_binaries",
    "node_unavailable",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = REPO_ROOT / "scripts" / "k8s-node-binaries.sh"
NODE_NAME = "airt-node"
BRIDGE = "airt-cni0"
POD_SUBNET = "10.244.213.0/24"
POD_GATEWAY = "10.244.213.1"
REDIS_SERVICE_IP = "10.0.0.10"
"""A virtual IP of the API server's service range that pods reach the test's Redis on."""
KUBERNETES_SERVICE = ("10.0.0.1", 443)
CHAIN = "AIRT-NODE"
CNI_BIN = Path("/usr/lib/cni")
PAUSE_IMAGE = "localhost/airuntime-pause:3.9"
CONTAINERD_NAMESPACE = "k8s.io"
_LOCK = Path("/run/airuntime-k8s-node.lock")
_WORKDIR_PREFIX = "airuntime-node-"


class NodeUnavailable(KubeTestEnvError):
    """This machine cannot run the node (not root, a tool missing, ...)."""


def node_unavailable() -> str | None:
    """Why a node cannot run here, or None."""
    if os.geteuid() != 0:
        return "the node needs root (containerd, mounts, iptables)"
    for tool in ("containerd", "ctr", "runc", "iptables", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install containerd runc iptables)"
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(CNI_BIN / plugin, os.X_OK):
            return (
                f"CNI plugin {CNI_BIN / plugin} missing"
                " (apt-get install containernetworking-plugins)"
            )
    return None


def node_binaries(*, timeout: float = 3600.0) -> Path:
    """The directory of kubelet, kube-scheduler, kubectl, kind and pause (built once)."""
    proc = subprocess.run(
        ["bash", str(NODE_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise NodeUnavailable(
            f"{NODE_SCRIPT.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return Path(lines[-1])


def _run(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NodeUnavailable(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


# -- the pause image, written without any container tool ---------------------------------


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_pause_archive(pause_binary: Path, out: Path, *, name: str = PAUSE_IMAGE) -> Path:
    """An OCI image archive (``ctr images import`` format) of one static binary,
    ``/pause``, as the entrypoint: the sandbox image of every pod."""
    layer = _tar_bytes({"pause": (pause_binary.read_bytes(), 0o755)})
    layer_gz = gzip.compress(layer, mtime=0)

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
    }).encode()  # fmt: skip
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(layer_gz), "size": len(layer_gz)}],
    }).encode()  # fmt: skip
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest), "size": len(manifest),
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rpartition(":")[2]},
        }],
    }).encode()  # fmt: skip
    blobs = {f"blobs/sha256/{digest(b)[7:]}": (b, 0o644) for b in (layer_gz, config, manifest)}
    files = {
        "oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644),
        "index.json": (index, 0o644),
        **blobs,
    }
    out.write_bytes(_tar_bytes(files))
    return out


# -- cleanup of this run's (or a killed run's) leftovers ---------------------------------


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].encode().decode("unicode_escape")
            if mount_point.startswith(prefix) or mount_point == str(root):
                found.append(mount_point)
    return found


def _unmount_all(root: Path) -> None:
    for _ in range(5):
        mounts = _mounts_under(root)
        if not mounts:
            return
        for mount_point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)


def _pids_referring_to(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (containerd shims of a killed run)."""
    needle = str(root).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def _kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _network_teardown() -> None:
    for table, chain in (("nat", "PREROUTING"), ("nat", "OUTPUT")):
        while (
            subprocess.run(
                ["iptables", "-t", table, "-D", chain, "-j", CHAIN], capture_output=True
            ).returncode
            == 0
        ):
            pass
    subprocess.run(["iptables", "-t", "nat", "-F", CHAIN], capture_output=True)
    subprocess.run(["iptables", "-t", "nat", "-X", CHAIN], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _owner_alive(path: Path) -> bool:
    pid = path.name[len(_WORKDIR_PREFIX) :].split("-", 1)[0]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pod_cgroup_pids() -> list[int]:
    """Processes of the pods of a node (the kubelet's ``/kubepods`` cgroups): a killed run
    leaves its containers behind when their shims die. One node per machine (the lock),
    so every process there is one of ours."""
    pids: list[int] = []
    for procs in Path("/sys/fs/cgroup/memory/kubepods").rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _remove_stale_runs(parent: Path) -> None:
    for path in parent.glob(f"{_WORKDIR_PREFIX}*"):
        if path.is_dir() and not _owner_alive(path):
            _kill_pids(_pids_referring_to(path))
            _kill_pids(_pod_cgroup_pids())
            _unmount_all(path)
            for netns in _read_lines(path / "netns.txt"):
                subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
            shutil.rmtree(path, ignore_errors=True)


def _read_lines(path: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return path.read_text().split()
    return []


def _netns() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/var/run/netns"))
    return set()


class KubeNode:
    """containerd + CNI + kube-scheduler + kubelet, registered with ``env``'s API server.

    ``with KubeNode(env, images=[archive]) as node:`` starts it and waits until the Node
    is Ready; leaving the block stops the kubelet, kills every container of the node,
    and removes mounts, network namespaces, the bridge and the iptables rules.
    ``redis_port`` (optional): the loopback port that :data:`REDIS_SERVICE_IP`:6379
    forwards to.
    """

    def __init__(
        self,
        env: KubeTestEnv,
        *,
        images: Sequence[Path],
        bin_dir: Path | None = None,
        redis_port: int | None = None,
        startup_timeout: float = 180.0,
    ) -> None:
        self.env = env
        self.images = [Path(p) for p in images]
        self._bin_dir = bin_dir
        self.redis_port = redis_port
        self.startup_timeout = startup_timeout
        self.workdir: Path | None = None
        self.timings: dict[str, float] = {}
        self._processes: list[_Process] = []
        self._lock_file: Any = None
        self._netns_before: set[str] = set()

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = node_binaries()
        return self._bin_dir

    @property
    def socket(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "containerd.sock"

    def __enter__(self) -> KubeNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> KubeNode:
        missing = node_unavailable()
        if missing:
            raise NodeUnavailable(missing)
        bin_dir = self.bin_dir
        _LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(_LOCK, "w")  # noqa: SIM115 - held until stop()
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        parent = Path("/var/tmp")
        _remove_stale_runs(parent)
        _network_teardown()
        started = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-", dir=parent))
        self._netns_before = _netns()
        try:
            self._network_setup()
            t0 = time.monotonic()
            self._start_containerd()
            self._import_images(bin_dir)
            self.timings["containerd + image import"] = time.monotonic() - t0
            self._start_scheduler(bin_dir)
            t0 = time.monotonic()
            self._start_kubelet(bin_dir)
            self.timings["kubelet to Node Ready"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        self.timings["node start"] = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop the kubelet and the scheduler, kill every container, clean up."""
        for proc in reversed([p for p in self._processes if p.name != "containerd"]):
            proc.stop()
        if self.workdir is not None:
            self._kill_containers()
        for proc in [p for p in self._processes if p.name == "containerd"]:
            proc.stop()
        self._processes.clear()
        if self.workdir is not None:
            _kill_pids(_pids_referring_to(self.workdir))
            for netns in _netns() - self._netns_before:
                if netns.startswith("cni-"):
                    subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
            _unmount_all(self.workdir)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        _network_teardown()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def logs(self) -> dict[str, Path]:
        return {p.name: p.log_path for p in self._processes}

    def log_tail(self, name: str, limit: int = 6000) -> str:
        for proc in self._processes:
            if proc.name == name:
                return proc.log_tail(limit)
        return f"<no process named {name!r}>"

    # -- network ---------------------------------------------------------------------------

    def _network_setup(self) -> None:
        assert self.workdir is not None
        prefix = POD_SUBNET.split("/")[1]
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{POD_GATEWAY}/{prefix}", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # DNAT to 127.0.0.1 from the bridge needs route_localnet on it.
        Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")
        _run("iptables", "-t", "nat", "-N", CHAIN)
        api_port = int(self.env.server.rsplit(":", 1)[1])
        forwards = [(*KUBERNETES_SERVICE, api_port)]
        if self.redis_port is not None:
            forwards.append((REDIS_SERVICE_IP, 6379, self.redis_port))
        for ip, port, target in forwards:
            _run("iptables", "-t", "nat", "-A", CHAIN, "-d", f"{ip}/32", "-p", "tcp",
                 "--dport", str(port), "-j", "DNAT",
                 "--to-destination", f"127.0.0.1:{target}")  # fmt: skip
        _run("iptables", "-t", "nat", "-I", "PREROUTING", "-j", CHAIN)
        _run("iptables", "-t", "nat", "-I", "OUTPUT", "-j", CHAIN)
        cni = self.workdir / "cni"
        cni.mkdir()
        (cni / "10-airt.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0",
            "name": "airt",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.workdir / "ipam"),
                         "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                         # No default route: pods reach their subnet and the service
                         # range (the virtual IPs above), nothing beyond this machine.
                         "routes": [{"dst": SERVICE_CLUSTER_IP_RANGE}]},
            }],
        }, indent=2))  # fmt: skip

    # -- containerd ------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> _Process:
        assert self.workdir is not None
        proc = _Process(name, argv, self.workdir / f"{name}.log")
        self._processes.append(proc)
        return proc

    def _wait(self, proc: _Process, what: str, check: Any) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if not proc.alive():
                raise proc.failure(f"exited while waiting for {what}")
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                raise proc.failure(f"timed out waiting for {what}")
            time.sleep(0.2)

    def ctr(self, *args: str, timeout: float = 300) -> str:
        proc = _run("ctr", "--address", str(self.socket), "--namespace", CONTAINERD_NAMESPACE,
                    *args, timeout=timeout)  # fmt: skip
        return proc.stdout

    def _start_containerd(self) -> None:
        assert self.workdir is not None
        config = self.workdir / "containerd.toml"
        config.write_text(f"""\
version = 2
root = "{self.workdir / "containerd-root"}"
state = "{self.workdir / "containerd-state"}"
disabled_plugins = ["io.containerd.grpc.v1.cri.v1alpha2", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.workdir / "containerd.sock.ttrpc"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  # The machines drop CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below
  # its parent's: the kubelet's -998 for pod sandboxes fails in runc ("failed to update
  # /proc/self/oom_score_adj: Permission denied"). Clamp to containerd's own value.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{os.environ.get("AIRUNTIME_NODE_RUNC") or shutil.which("runc")}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.workdir / "cni"}"
""")
        proc = self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait(proc, "containerd's socket", lambda: self.ctr("version") != "")

    def _import_images(self, bin_dir: Path) -> None:
        assert self.workdir is not None
        pause = write_pause_archive(bin_dir / "pause", self.workdir / "pause.oci.tar")
        for archive in [pause, *self.images]:
            # Unpacked into the CRI's snapshotter, as a pull would.
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=600)

    def images_present(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").split()

    def _kill_containers(self) -> None:
        if not self.socket.exists():
            return
        with contextlib.suppress(Exception):
            for task in self.ctr("tasks", "list", "--quiet").split():
                _run("ctr", "--address", str(self.socket), "--namespace", CONTAINERD_NAMESPACE,
                     "tasks", "kill", "--signal", "SIGKILL", task, check=False)  # fmt: skip
            wait_until(  # SIGKILL delivered: no task reports RUNNING any more
                lambda: "RUNNING" not in self.ctr("tasks", "list"),
                within=10,
                what="the killed container tasks to stop",
                interval=0.05,
            )
            for task in self.ctr("tasks", "list", "--quiet").split():
                _run("ctr", "--address", str(self.socket), "--namespace", CONTAINERD_NAMESPACE,
                     "tasks", "delete", "--force", task, check=False)  # fmt: skip

    # -- scheduler and kubelet ---------------------------------------------------------------

    def _start_scheduler(self, bin_dir: Path) -> None:
        assert self.workdir is not None
        port = _free_port()
        proc = self._spawn("kube-scheduler", [
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.env.kubeconfig_path}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
        ])  # fmt: skip
        self.env._wait_https_ok(proc, f"https://127.0.0.1:{port}/healthz", cafile=None, token=None)

    def _start_kubelet(self, bin_dir: Path) -> None:
        assert self.workdir is not None
        root = self.workdir / "kubelet"
        root.mkdir()
        healthz = _free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The API server reaches the kubelet (logs, exec) at the node's InternalIP.
            "address": POD_GATEWAY,
            "port": _free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            # Never garbage-collect the imported images (they cannot be pulled again).
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "registerNode": True,
            "podLogsDir": str(self.workdir / "pod-logs"),
            "enableServer": True,
            "makeIPTablesUtilChains": False,
        }  # fmt: skip
        path = self.workdir / "kubelet.json"
        path.write_text(json.dumps(config, indent=2))
        proc = self._spawn("kubelet", [
            str(bin_dir / "kubelet"),
            f"--config={path}",
            f"--kubeconfig={self.env.kubeconfig_path}",
            f"--root-dir={root}",
            f"--cert-dir={self.workdir / 'kubelet-certs'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={POD_GATEWAY}",
            "--v=1",
        ])  # fmt: skip
        self._wait(proc, "the Node to be Ready", self._node_ready)

    def _node_ready(self) -> bool:
        out = _run(str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.env.kubeconfig_path),
                   "get", "node", NODE_NAME, "-o", "json", check=False)  # fmt: skip
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
