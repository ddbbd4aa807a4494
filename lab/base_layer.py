"""The lab's SSH key and the base layer every host's overlay shares: users, sudo rules, sshd and journald
settings, masked units (docs/test-hosts.md, "The base layer")."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab import light as light_form
from lab import linux

ROOTFS_SCRIPT = Path(__file__).with_name("rootfs.sh")

#: Login users of the base layer: every one accepts the lab key; they differ in sudo rights.
USERS = ("deploy", "nosudo", "pwsudo")

#: Bumped whenever the base layer recipe changes, so cached base layers are rebuilt.
BASE_VERSION = 2

#: Units that are useless in a lab container and either slow the boot, fail
#: there, or run apt/dpkg jobs at random times (which would take the dpkg lock
#: in the middle of a test). They are masked in the base layer.
MASKED_UNITS = (
    "getty@tty1.service",
    "console-getty.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "systemd-pstore.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
)

SSHD_DROPIN = """\
# Lab hosts: key login only, no DNS look-ups (there is no DNS), and room for
# many parallel connections from the tests.
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 100:30:200
MaxSessions 50
"""

JOURNALD_DROPIN = """\
# Lab hosts: keep the persistent journal (reboot tests read earlier boots) but
# small; journald's defaults preallocate 8 MB per journal file, 30+ MB a host.
[Journal]
SystemMaxUse=16M
SystemMaxFileSize=1M
"""


def default_rootfs() -> Path:
    """The cached Debian rootfs; lab/rootfs.sh builds it once, then prints its path instantly."""
    out = linux.run(["bash", str(ROOTFS_SCRIPT)]).stdout.strip().splitlines()
    if not out:
        raise linux.LabError(f"{ROOTFS_SCRIPT} printed no rootfs path")
    return Path(out[-1])


def public_key(path: Path, comment: str) -> str:
    """The OpenSSH public key line of the private key at `path`, with `comment`."""
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return pub.decode() + f" {comment}"


def ensure_key(path: Path, comment: str) -> None:
    """Generate the lab's ed25519 key once per workdir (OpenSSH format, 0600), with its .pub beside it."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    tmp.rename(path)
    path.with_suffix(".pub").write_text(public_key(path, comment) + "\n")


def ensure_base(base_dir: Path, rootfs: Path, pub: str, host_key_types: tuple[str, ...], mount_source: str,
                light: bool = False) -> None:
    """Build the shared base layer in `base_dir` once (rebuilt when missing or stale).

    The stamp ties it to the rootfs, the lab key `pub` and the recipe version: the
    authorized_keys files in it hold this workdir's key. The build mount's source is
    `mount_source` (`lg<name>base`), so a sweep finds it after a crash.
    """
    stamp = base_dir / "stamp.json"
    want: dict[str, object] = {"version": BASE_VERSION, "rootfs": str(rootfs), "key": pub,
                               "host_key_types": list(host_key_types)}
    if light:  # the light form's layer (lab/light.py); a default layer's stamp stays as it was
        want["light"] = [*light_form.MASKED_UNITS, light_form.SYSTEM_DROPIN]
    try:
        if json.loads(stamp.read_text()) == want and (base_dir / "up").is_dir():
            return
    except (OSError, ValueError):
        pass
    shutil.rmtree(base_dir, ignore_errors=True)
    up, wk, mnt = (base_dir / d for d in ("up", "wk", "mnt"))
    for d in (up, wk, mnt):
        d.mkdir(parents=True)
    opts = f"lowerdir={rootfs},upperdir={up},workdir={wk}"
    linux.run(["mount", "-t", "overlay", mount_source, "-o", opts, str(mnt)])
    try:
        configure_base(mnt, base_dir, pub, host_key_types, light)
    finally:
        linux.umount(mnt)
    shutil.rmtree(wk, ignore_errors=True)
    mnt.rmdir()
    stamp.write_text(json.dumps(want))


def configure_base(root: Path, base_dir: Path, pub: str, host_key_types: tuple[str, ...], light: bool = False) -> None:
    """Users, sudo rules, sshd settings and unit masks shared by every host (pwsudo's password beside the layer);
    with `light`, the light form's too (lab/light.py: more units masked, a systemd drop-in)."""
    password = secrets.token_urlsafe(18)
    for user in USERS:
        linux.run(["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", user])
    linux.run(["chroot", str(root), "chpasswd"], input=f"pwsudo:{password}\n")
    linux.write_file(base_dir / "pwsudo-password", password + "\n", 0o600)
    linux.write_file(root / "etc/sudoers.d/deploy", "deploy ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    linux.write_file(root / "etc/sudoers.d/pwsudo", "pwsudo ALL=(ALL) ALL\n", 0o440)
    for user in USERS:
        uid, gid, home = linux.passwd_ids(root, user)
        ssh_dir = root / home.lstrip("/") / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(ssh_dir, uid, gid)
        linux.write_file(ssh_dir / "authorized_keys", pub + "\n", 0o600, uid, gid)
    # Name the host keys, so sshd does not complain about the types the lab does not generate.
    host_keys = "".join(f"HostKey /etc/ssh/ssh_host_{t}_key\n" for t in host_key_types)
    linux.write_file(root / "etc/ssh/sshd_config.d/lab.conf", SSHD_DROPIN + host_keys, 0o644)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    linux.write_file(root / "etc/machine-id", "", 0o444)
    linux.write_file(root / "etc/systemd/journald.conf.d/lab.conf", JOURNALD_DROPIN, 0o644)
    units = root / "etc/systemd/system"
    masked = (*MASKED_UNITS, *(light_form.MASKED_UNITS if light else ()))
    if light:
        linux.write_file(root / "etc/systemd/system.conf.d/lab-light.conf", light_form.SYSTEM_DROPIN, 0o644)
    for unit in masked:
        link = units / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    for wants in units.glob("*.wants/*"):
        if wants.name in masked:
            wants.unlink()
