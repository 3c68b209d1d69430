"""A real etcd cluster for the Python tests: Debian's etcd (etcd-server, which tools/dev
installs) started as `members` processes on loopback ports, its data in /dev/shm, stopped
and removed on exit."""
import os
import shutil
import socket
import subprocess
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdCluster:
    def __init__(self, members=3):
        if not os.access("/usr/bin/etcd", os.X_OK):
            raise RuntimeError("this test needs etcd: apt-get install etcd-server (tools/dev does)")
        self.directory = tempfile.mkdtemp(prefix="braid-etcd-", dir="/dev/shm")
        self.ports = [(free_port(), free_port()) for _ in range(members)]
        initial = ",".join(f"m{m}=http://127.0.0.1:{peer}"
                           for m, (_, peer) in enumerate(self.ports))
        self.processes = []
        for m, (client, peer) in enumerate(self.ports):
            log = open(os.path.join(self.directory, f"m{m}.log"), "w")
            self.processes.append(subprocess.Popen(
                ["/usr/bin/etcd", "--name", f"m{m}",
                 "--data-dir", os.path.join(self.directory, f"m{m}"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--log-level", "error", "--logger", "zap"],
                stdout=log, stderr=subprocess.STDOUT))

    def url(self, name):
        """BRAID_STORE / braid-run --store for a run called `name`."""
        members = ",".join(f"127.0.0.1:{client}" for client, _ in self.ports)
        return f"etcd://{members}/{name}"

    def stop_member(self, m):
        """Kills member m, as the loss of its machine would."""
        if self.processes[m].poll() is None:
            self.processes[m].kill()
            self.processes[m].wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for m in range(len(self.processes)):
            self.stop_member(m)
        shutil.rmtree(self.directory, ignore_errors=True)
