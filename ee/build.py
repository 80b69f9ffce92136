#!/usr/bin/env python
"""Build the execution environment image localhost/gpu-ops-ee from execution-environment.yml, cached by content.

  1. the collection tarball: ``ansible-galaxy collection build --output-path .cache/ee/collection``;
  2. the content hash: execution-environment.yml, every file under ee/, the tarball's MANIFEST.json and FILES.json
     (the checksum of every file of the collection), the base image's ID and the ansible-builder version;
     ``localhost/gpu-ops-ee:<hash>`` already there means nothing to build (``:latest`` is pointed at it);
  3. the context: ``ansible-builder create`` (.cache/ee/context), then ``podman build --network host --pull=never``
     (PyPI and deb.debian.org are reached from the build; nothing is pulled: the base is the lab's local Debian 12
     image, built by ``lab/labctl.py images --only debian12`` when it is missing), tagged ``:<hash>`` and ``:latest``.
     The host's CA bundle is mounted over the build's during RUN steps only, so pip trusts what the host trusts
     (this project's machines reach PyPI through a TLS-inspecting egress proxy whose CA only the host has);
  4. with ``--prove``: ``ansible-galaxy collection list gpu_ops.cluster`` and ``ansible-doc
     gpu_ops.cluster.nvidia_gpu_facts`` in the image, then a small playbook that uses the collection's module and
     filter, run by runner/gpu_ops_run.py in container mode (ansible-runner with podman and the image) against the
     container's own localhost; its artifacts go to ``--artifacts`` (default .cache/ee/prove-runs).

    .venv/bin/python ee/build.py              # build when the content changed (else a few seconds)
    .venv/bin/python ee/build.py --prove      # and prove the image
    .venv/bin/python ee/build.py --no-cache   # a cold build: no podman layer cache

Standard library only: it runs the project's tools (ansible-galaxy, ansible-builder, the runner) from the virtualenv of
the interpreter that runs it (``.venv/bin/python ee/build.py``), and podman.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parents[1]
EE_FILE = REPO_ROOT / "execution-environment.yml"
EE_DIR = REPO_ROOT / "ee"
CACHE = REPO_ROOT / ".cache" / "ee"
# execution-environment.yml's additional_build_files names this directory (relative to the repository root).
COLLECTION_DIR = CACHE / "collection"
DEFAULT_IMAGE = "localhost/gpu-ops-ee"
BASE_IMAGE = "localhost/gpu-lab-debian12:latest"  # images.base_image.name in execution-environment.yml
CONTAINER_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HASH_LABEL = "gpu-ops-ee.content-hash"
HASH_LENGTH = 12  # in the tag
HASH_SCHEME = "gpu-ops-ee/1"  # change to rebuild every image whatever its inputs

PROVE_PLAYBOOK = """\
# Written by ee/build.py --prove: the collection's module and filter by their FQCN, inside the execution environment.
- name: Prove the execution environment
  hosts: all
  gather_facts: false
  tasks:
    - name: Read the GPU state (no GPU in the container; reported, not failed)
      gpu_ops.cluster.nvidia_gpu_facts:
        fail_on_unmet: false
      register: gpu

    - name: The module reported the missing GPU stack as data
      ansible.builtin.assert:
        that:
          - gpu is not changed
          - ansible_facts.nvidia_gpu is defined
          - not ansible_facts.nvidia_gpu.healthy
          - ansible_facts.nvidia_gpu.error_kind is not none
        quiet: true

    - name: The collection's filter and the Python client of kubernetes.core are there
      ansible.builtin.assert:
        that:
          - inputs | gpu_ops.cluster.bool_input_problems | length == 1
          - lookup('ansible.builtin.pipe', python ~ ' -c "import kubernetes; print(kubernetes.__version__)"') == '37.0.2'
        quiet: true
      vars:
        inputs: {real: true, quoted: "false"}
        python: "{{ ansible_playbook_python }}"

    - name: Show what the module found
      ansible.builtin.debug:
        msg: "nvidia_gpu_facts: source={{ ansible_facts.nvidia_gpu.source }} error_kind={{ ansible_facts.nvidia_gpu.error_kind }}"
"""

PROVE_INVENTORY = """\
# Written by ee/build.py --prove: the execution environment's own localhost.
all:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: /usr/bin/python3
"""


class BuildError(RuntimeError):
    pass


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


CLOCK = Clock()


def log(message: str) -> None:
    print(f"[ee {CLOCK.elapsed():6.1f}s] {message}", flush=True)


def venv_tool(name: str) -> str:
    """The tool next to this interpreter (the project's virtualenv), else the one on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise BuildError(f"{name} not found next to {sys.executable} nor on PATH: run with the project's .venv/bin/python")
    return found


def run(argv: Sequence[str], *, check: bool = True, capture: bool = True,
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), cwd=cwd, text=True, capture_output=capture)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-4000:] if capture else ""
        raise BuildError(f"{' '.join(argv)} failed with rc {result.returncode}\n{detail}")
    return result


def stream(argv: Sequence[str], log_path: Path, keep: Callable[[str], bool]) -> None:
    """Run a long command: every line to log_path, the ones keep() selects to the console."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: List[str] = []
    with log_path.open("w", encoding="utf-8") as handle:
        handle.write("$ " + " ".join(argv) + "\n")
        process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1, errors="replace")
        assert process.stdout is not None
        for line in process.stdout:
            handle.write(line)
            tail = (tail + [line.rstrip()])[-40:]
            if keep(line):
                log("  " + line.rstrip()[:200])
        rc = process.wait()
    if rc != 0:
        raise BuildError(f"{argv[0]} {argv[1]} failed with rc {rc}; last lines (full log: {log_path}):\n"
                         + "\n".join(tail))


BUILD_MILESTONE = re.compile(r"^(\[\d+/\d+\] )?(STEP \d+/\d+: (FROM|RUN|COPY)|COMMIT )|^--> Using cache|^Error|ERROR")


def podman_build_milestone(line: str) -> bool:
    """FROM, RUN and COPY steps, cache hits and errors; not the hundreds of apt and pip lines."""
    return bool(BUILD_MILESTONE.search(line))


# --- the content hash --------------------------------------------------------------------------------------------------

def tarball_members(tarball: Path, names: Iterable[str]) -> List[Tuple[str, bytes]]:
    """The named top-level members of a collection tarball (MANIFEST.json, FILES.json)."""
    found: List[Tuple[str, bytes]] = []
    with tarfile.open(tarball, "r:gz") as archive:
        for name in names:
            member = archive.extractfile(name)
            if member is None:
                raise BuildError(f"{tarball}: no {name}")
            found.append((name, member.read()))
    return found


def ee_sources(ee_dir: Path) -> List[Path]:
    return sorted(p for p in ee_dir.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", "~")))


def content_hash(ee_file: Path, ee_dir: Path, tarball: Path, base_image_id: str, builder_version: str) -> str:
    """sha256 over everything the image is made from. Each part is framed (name, length, bytes)."""
    digest = hashlib.sha256()

    def part(name: str, data: bytes) -> None:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)

    part("scheme", HASH_SCHEME.encode())
    part("execution-environment.yml", ee_file.read_bytes())
    for path in ee_sources(ee_dir):
        part("ee/" + path.relative_to(ee_dir).as_posix(), path.read_bytes())
    for name, data in tarball_members(tarball, ("MANIFEST.json", "FILES.json")):
        part("collection/" + name, data)
    part("base-image-id", base_image_id.encode())
    part("ansible-builder", builder_version.encode())
    return digest.hexdigest()


# --- steps -------------------------------------------------------------------------------------------------------------

def image_exists(ref: str) -> bool:
    return run(["podman", "image", "exists", ref], check=False).returncode == 0


def image_id(ref: str) -> str:
    return run(["podman", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()


def image_size(ref: str) -> int:
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", ref]).stdout.strip())


def ensure_base_image(base: str) -> str:
    if not image_exists(base):
        if base != BASE_IMAGE:
            raise BuildError(f"base image {base} is not here (nothing can be pulled): build it first")
        log(f"{base} is missing: building it with lab/labctl.py images --only debian12 (debootstrap, about a minute)")
        stream([sys.executable, str(REPO_ROOT / "lab" / "labctl.py"), "images", "--only", "debian12"],
               CACHE / "base-image.log", lambda line: True)
    return image_id(base)


def remove_old_tags(image: str, keep: str) -> None:
    """Untag this image's other content-hash tags (their layers stay while another tag or a container uses them)."""
    listed = run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", image]).stdout.split()
    for ref in sorted(set(listed)):
        if ref not in (keep, f"{image}:latest") and ref.startswith(f"{image}:"):
            if run(["podman", "rmi", ref], check=False).returncode == 0:
                log(f"removed the older {ref}")


def build_collection(out_dir: Path) -> Path:
    for stale in out_dir.glob("*.tar.gz"):
        stale.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    run([venv_tool("ansible-galaxy"), "collection", "build", "--force", "--output-path", str(out_dir), str(REPO_ROOT)])
    tarballs = sorted(out_dir.glob("gpu_ops-cluster-*.tar.gz"))
    if len(tarballs) != 1:
        raise BuildError(f"expected one gpu_ops-cluster tarball in {out_dir}, found {[t.name for t in tarballs]}")
    return tarballs[0]


def builder_version() -> str:
    return run([venv_tool("ansible-builder"), "--version"]).stdout.strip()


def create_context(context: Path, base: str) -> None:
    if context.exists():
        shutil.rmtree(context)
    argv = [venv_tool("ansible-builder"), "create", "-f", str(EE_FILE), "-c", str(context),
            "--output-filename", "Containerfile", "-v", "1"]
    run(argv, cwd=REPO_ROOT)
    if base != BASE_IMAGE:
        log(f"base image overridden: {base}")


def host_ca_bundle() -> Optional[Path]:
    """The CA bundle this host's TLS clients trust (Debian: /etc/ssl/certs/ca-certificates.crt), if any."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def podman_build(context: Path, tags: Sequence[str], full_hash: str, base: str, log_path: Path,
                 ca_bundle: Optional[Path], no_cache: bool = False) -> None:
    argv = ["podman", "build", "--network", "host", "--pull=never", "--no-cache" if no_cache else "--layers",
            "-f", str(context / "Containerfile"), "--label", f"{HASH_LABEL}={full_hash}",
            "--build-arg", f"EE_BASE_IMAGE={base}"]
    if ca_bundle:
        # The build's RUN steps trust what the host trusts (a TLS-inspecting egress proxy's CA, as on this project's
        # machines): pip and apt in Debian read this path. Mounted for the build only; the image keeps Debian's bundle.
        argv += ["--volume", f"{ca_bundle}:{CONTAINER_CA_BUNDLE}:ro"]
    for tag in tags:
        argv += ["-t", tag]
    stream(argv + [str(context)], log_path, podman_build_milestone)


def prove(image: str, artifacts: Path, cache: Path) -> int:
    """The three proofs; returns the runner's rc (0: the playbook passed in the image)."""
    log(f"prove: podman run --rm {image} ansible-galaxy collection list gpu_ops.cluster")
    listed = run(["podman", "run", "--rm", image, "ansible-galaxy", "collection", "list", "gpu_ops.cluster"])
    print(listed.stdout.rstrip(), flush=True)
    if "gpu_ops.cluster" not in listed.stdout:
        raise BuildError("gpu_ops.cluster is not listed in the image")
    log(f"prove: podman run --rm {image} ansible-doc gpu_ops.cluster.nvidia_gpu_facts")
    doc = run(["podman", "run", "--rm", image, "ansible-doc", "gpu_ops.cluster.nvidia_gpu_facts"]).stdout
    print("\n".join(doc.splitlines()[:4]), flush=True)
    if "nvidia_gpu_facts" not in doc:
        raise BuildError("ansible-doc did not document gpu_ops.cluster.nvidia_gpu_facts in the image")
    work = cache / "prove"
    work.mkdir(parents=True, exist_ok=True)
    (work / "prove.yml").write_text(PROVE_PLAYBOOK, encoding="utf-8")
    (work / "inventory.yml").write_text(PROVE_INVENTORY, encoding="utf-8")
    argv = [sys.executable, str(REPO_ROOT / "runner" / "gpu_ops_run.py"), str(work / "prove.yml"),
            "-i", str(work / "inventory.yml"), "--artifacts", str(artifacts),
            "--process-isolation-executable", "podman", "--container-image", image]
    log("prove: " + " ".join(argv[1:]))
    rc = subprocess.run(argv).returncode
    log(f"prove: the runner's rc {rc}; artifacts in {artifacts}")
    return rc


def build(args: argparse.Namespace) -> int:
    cache = CACHE
    image = args.image
    if not shutil.which("podman"):
        raise BuildError("podman is not installed (lab/labctl.py prereqs installs and configures it)")
    base_id = ensure_base_image(args.base_image)
    log(f"base {args.base_image} ({base_id[:12]})")
    tarball = build_collection(COLLECTION_DIR)
    log(f"collection {tarball.name}")
    full_hash = content_hash(EE_FILE, EE_DIR, tarball, base_id, builder_version())
    tag = f"{image}:{full_hash[:HASH_LENGTH]}"
    latest = f"{image}:latest"
    if image_exists(tag) and not (args.force or args.no_cache):
        run(["podman", "tag", tag, latest])
        log(f"cached: {tag} exists (content hash {full_hash[:HASH_LENGTH]}); {latest} points to it")
    else:
        context = cache / "context"
        create_context(context, args.base_image)
        log(f"context {context} (ansible-builder create); podman build (log: {cache / 'build.log'})")
        started = time.monotonic()
        ca_bundle = None if args.no_host_ca else host_ca_bundle()
        podman_build(context, [tag, latest], full_hash, args.base_image, cache / "build.log", ca_bundle,
                     args.no_cache)
        log(f"built {tag} and {latest} in {time.monotonic() - started:.1f}s")
        if not args.keep_old:
            remove_old_tags(image, keep=tag)
    size = image_size(tag)
    log(f"image {tag}: {size / 1e6:.0f} MB ({size} bytes), id {image_id(tag)[:12]}")
    (cache / "image.json").write_text(json.dumps({"image": tag, "latest": latest, "content_hash": full_hash,
                                                  "size_bytes": size}, indent=2) + "\n", encoding="utf-8")
    rc = 0
    if args.prove:
        rc = prove(latest, Path(args.artifacts).resolve() if args.artifacts else cache / "prove-runs", cache)
    log(f"done in {CLOCK.elapsed():.1f}s")
    return rc


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"image name without tag (default {DEFAULT_IMAGE})")
    parser.add_argument("--base-image", default=BASE_IMAGE, help=f"local base image (default {BASE_IMAGE})")
    parser.add_argument("--force", action="store_true", help="build even if the image of this content hash exists")
    parser.add_argument("--keep-old", action="store_true", help="keep the older content-hash tags of the image")
    parser.add_argument("--no-cache", action="store_true", help="build without podman's layer cache (a cold build)")
    parser.add_argument("--prove", action="store_true", help="then prove the image (collection list, ansible-doc, "
                                                             "a playbook through the runner in container mode)")
    parser.add_argument("--no-host-ca", action="store_true",
                        help="do not mount the host's CA bundle into the build's RUN steps")
    parser.add_argument("--artifacts", help="the proof run's artifacts directory (default .cache/ee/prove-runs)")
    args = parser.parse_args(argv)
    try:
        return build(args)
    except BuildError as exc:
        log(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
