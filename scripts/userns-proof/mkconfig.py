#!/usr/bin/env python3
"""mkconfig.py BUNDLE ROOTFS USERNS NETNS BASE VOLUME_SRC: config.json for the proof container
(USERNS/NETNS "": runc makes them)."""
import json, sys
bundle, rootfs, userns, netns, base, vol = sys.argv[1:7]
base = int(base)
cfg = {
  "ociVersion": "1.0.2-dev",
  "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/counter"],
              "env": ["PATH=/bin", "PORT=80", "PORT2=8080", "ATE_DATA_DIR=/data"], "cwd": "/",
              "capabilities": {k: ["CAP_NET_BIND_SERVICE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"]
                               for k in ("bounding", "effective", "permitted")},
              "noNewPrivileges": True},
  "root": {"path": rootfs, "readonly": False},
  "hostname": "proof",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/data", "type": "bind", "source": vol, "options": ["rbind", "rw", "nosuid", "nodev"]},
  ],
  "linux": {
    "uidMappings": [{"containerID": 0, "hostID": base, "size": 65536}],
    "gidMappings": [{"containerID": 0, "hostID": base, "size": 65536}],
    "cgroupsPath": "/ate-userns-proof/" + bundle.rstrip("/").split("/")[-1],
    "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                   {"type": "user", **({"path": userns} if userns else {})},
                   {"type": "network", **({"path": netns} if netns else {})}],
    "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    "maskedPaths": ["/proc/kcore", "/sys/firmware"],
    "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"],
  },
}
json.dump(cfg, open(f"{bundle}/config.json", "w"), indent=1)
