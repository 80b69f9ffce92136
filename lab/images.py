"""`labctl images`: the systemd base images localhost/gpu-lab-debian12:latest (bookworm) and
localhost/gpu-lab-debian13:latest (trixie), built with debootstrap and cached by recipe hash.

Standard library only: it runs with plain ``python3`` on a brand-new Debian 12 host.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
from pathlib import Path

from _common import (
    Heartbeat,
    LabError,
    Stopwatch,
    cache_root,
    debian_mirror,
    file_lock,
    format_seconds,
    log,
    remove_tree,
    require_root,
    require_tools,
    run,
    sha256_bytes,
    stream,
)

# Bump when the build steps change in a way the recipe fields below do not capture.
IMAGE_RECIPE_VERSION = 1
IMAGE_SUITES = {"debian12": "bookworm", "debian13": "trixie"}
IMAGE_INCLUDES = (
    "python3", "systemd", "systemd-sysv", "dbus", "sudo", "ca-certificates", "iproute2", "procps", "gnupg",
    "python3-apt",  # Ansible's apt module needs it (check mode fails without it)
)
IMAGE_LABEL = "gpu-lab.recipe"
KEEP_DEBS_CONF = (
    "// gpu-lab: keep downloaded .debs; Molecule mounts a shared cache at /var/cache/apt/archives.\n"
    'Binary::apt::APT::Keep-Downloaded-Packages "true";\n'
    'APT::Keep-Downloaded-Packages "true";\n'
)


@dataclasses.dataclass(frozen=True)
class ImageRecipe:
    key: str  # debian12
    suite: str  # bookworm
    mirror: str
    includes: tuple[str, ...]
    files: tuple[tuple[str, str], ...]  # (absolute path inside the rootfs, text)

    @property
    def name(self) -> str:
        return f"gpu-lab-{self.key}"

    @property
    def ref(self) -> str:
        return f"localhost/{self.name}:latest"


def image_recipe(key: str, mirror: str) -> ImageRecipe:
    suite = IMAGE_SUITES[key]
    files = (
        ("/etc/apt/sources.list", f"deb {mirror} {suite} main\n"),
        ("/etc/apt/apt.conf.d/00gpu-lab-keep-debs", KEEP_DEBS_CONF),
    )
    return ImageRecipe(key=key, suite=suite, mirror=mirror, includes=IMAGE_INCLUDES, files=files)


def recipe_hash(recipe: ImageRecipe) -> str:
    """sha256 over everything that decides the image's content (order-insensitive where order is)."""
    document = {
        "version": IMAGE_RECIPE_VERSION,
        "suite": recipe.suite,
        "mirror": recipe.mirror,
        "includes": sorted(recipe.includes),
        "files": sorted([path, text] for path, text in recipe.files),
        "variant": "minbase",
    }
    return sha256_bytes(json.dumps(document, sort_keys=True).encode("utf-8"))


def debootstrap_command(recipe: ImageRecipe, rootfs: Path) -> list[str]:
    return [
        "debootstrap", "--variant=minbase", "--include=" + ",".join(recipe.includes),
        recipe.suite, str(rootfs), recipe.mirror,
    ]


def import_command(recipe: ImageRecipe, digest: str, tarball: Path) -> list[str]:
    return [
        "podman", "import", "--quiet",
        "--change", 'CMD ["/sbin/init"]',
        "--change", f"LABEL {IMAGE_LABEL}={digest}",
        "--change", f"LABEL gpu-lab.suite={recipe.suite}",
        str(tarball), recipe.ref,
    ]


_DEBOOTSTRAP_PER_PACKAGE = re.compile(
    r"^I: ((Retrieving|Validating) \S+ \S+|(Extracting|Unpacking|Configuring) \S+\.\.\.)$"
)


def debootstrap_milestone(line: str) -> bool:
    """Lines worth echoing: debootstrap's phases, not its hundreds of per-package lines."""
    return line.startswith(("I: ", "W: ", "E: ")) and not _DEBOOTSTRAP_PER_PACKAGE.match(line)


def is_archive_clean_hook(text: str) -> bool:
    """A docker-clean style apt hook: deletes downloaded .debs after every dpkg run."""
    return "Post-Invoke" in text and "/var/cache/apt/archives" in text


def customise_rootfs(recipe: ImageRecipe, rootfs: Path) -> None:
    for path, text in recipe.files:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        os.chmod(target, 0o644)
    for conf in (rootfs / "etc/apt/apt.conf.d").glob("*"):
        if not conf.is_file():
            continue
        if conf.name.startswith("docker-") or is_archive_clean_hook(conf.read_text(errors="replace")):
            conf.unlink()
    # Each container must get its own machine id: an empty file makes systemd generate one at boot.
    (rootfs / "etc/machine-id").write_text("", encoding="utf-8")
    for leftover in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    for leftover in (rootfs / "var/lib/apt/lists").glob("*_*"):
        leftover.unlink()


def image_label(ref: str) -> tuple[str | None, str | None]:
    """(image id, recipe label) of ref, or (None, None) when podman has no such image."""
    result = run(
        ["podman", "image", "inspect", "--format", "{{.Id}} {{index .Labels \"" + IMAGE_LABEL + "\"}}", ref],
        check=False,
    )
    if result.returncode != 0:
        return None, None
    image_id, _, label = result.stdout.strip().partition(" ")
    return image_id, (label if label and label != "<no value>" else None)


@dataclasses.dataclass
class ImageResult:
    ref: str
    action: str
    seconds: float


def build_rootfs_tarball(recipe: ImageRecipe, work: Path, tarball: Path, prefix: str) -> None:
    rootfs = work / "rootfs"
    remove_tree(work)
    rootfs.mkdir(parents=True)
    log(f"debootstrap {recipe.suite} from {recipe.mirror} (about a minute) ...", prefix)
    last_line = [""]

    def on_line(line: str) -> None:
        last_line[0] = line
        if debootstrap_milestone(line):
            log(line, prefix)

    timer = Stopwatch()
    with Heartbeat(lambda: f"debootstrap running {format_seconds(timer.elapsed)}: {last_line[0]}", prefix):
        stream(debootstrap_command(recipe, rootfs), on_line, log_path=work.parent / f"{recipe.name}.debootstrap.log")
    log(f"debootstrap done in {format_seconds(timer.elapsed)}; customising and packing the rootfs", prefix)
    customise_rootfs(recipe, rootfs)
    partial = tarball.with_name(tarball.name + ".partial")
    run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(rootfs), "-cf", str(partial), "."])
    os.replace(partial, tarball)
    remove_tree(work)


def ensure_image(recipe: ImageRecipe, images_dir: Path, rebuild: bool) -> ImageResult:
    prefix = recipe.key
    timer = Stopwatch()
    digest = recipe_hash(recipe)
    tarball = images_dir / f"{recipe.name}-{digest}.tar"
    with file_lock(images_dir / f".{recipe.name}.lock", recipe.ref):
        old_id, label = image_label(recipe.ref)
        if label == digest and not rebuild:
            log(f"{recipe.ref} is up to date (recipe {digest[:12]})", prefix)
            return ImageResult(recipe.ref, "up to date", timer.elapsed)
        reason = "missing" if old_id is None else ("rebuild requested" if rebuild else "recipe changed")
        if rebuild or not tarball.is_file():
            build_rootfs_tarball(recipe, images_dir / f".work-{recipe.name}", tarball, prefix)
            action = "built with debootstrap"
        else:
            action = "re-imported from cache"
            log(f"{recipe.ref} {reason}; importing cached rootfs {tarball}", prefix)
        run(import_command(recipe, digest, tarball))
        new_id, new_label = image_label(recipe.ref)
        if new_label != digest:
            raise LabError(f"podman import of {recipe.ref} did not record label {IMAGE_LABEL}={digest}")
        if old_id and old_id != new_id:
            # The replaced image is ours and now untagged; keep it only while a container uses it.
            if run(["podman", "rmi", old_id], check=False).returncode != 0:
                log(f"left old image {old_id[:12]} in place (a container still uses it)", prefix)
        for stale in images_dir.glob(f"{recipe.name}-*.tar"):
            if stale != tarball:
                stale.unlink()
                log(f"removed stale cached rootfs {stale.name}", prefix)
        log(f"{recipe.ref} {action} in {format_seconds(timer.elapsed)} ({reason})", prefix)
        return ImageResult(recipe.ref, action, timer.elapsed)


def cmd_images(args: argparse.Namespace) -> None:
    require_root()
    require_tools({"podman": "podman", "debootstrap": "debootstrap", "tar": "tar"})
    keys = [args.only] if args.only else list(IMAGE_SUITES)
    mirror = debian_mirror()
    images_dir = cache_root() / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    timer = Stopwatch()
    results: dict[str, ImageResult] = {}
    failures: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {pool.submit(ensure_image, image_recipe(key, mirror), images_dir, args.rebuild): key for key in keys}
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            try:
                results[key] = future.result()
            except LabError as exc:
                failures.append(f"{key}: {exc}")
    for key in keys:
        if key in results:
            result = results[key]
            log(f"{result.ref}: {result.action} ({format_seconds(result.seconds)})")
    log(f"images: total {format_seconds(timer.elapsed)}")
    if failures:
        raise LabError("image build failed:\n" + "\n".join(failures))
