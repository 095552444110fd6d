"""The images real nodes run: the project's and the sandbox's ``pause``, built (or found unchanged,
by content hash) by ``hack/build-images.sh`` and imported into each node's containerd."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.kube.errors import ClusterError
from harness.paths import REPO, cache_dir

IMAGES_SCRIPT = REPO / "hack" / "build-images.sh"


@dataclass(frozen=True)
class Images:
    """The images ``hack/build-images.sh`` built, and their OCI archives."""

    mqbalance: str
    """e.g. ``localhost/mqbalance:3f2a...``: repository and tag for the chart's values."""
    pause: str
    archives: dict[str, Path]

    @property
    def repository(self) -> str:
        return self.mqbalance.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.mqbalance.rsplit(":", 1)[1]

    @classmethod
    def load(cls, manifest: Path) -> Images:
        try:
            data = json.loads(manifest.read_text())
            app, pause = data["mqbalance"], data["pause"]
            images = cls(
                app["image"],
                pause["image"],
                {app["image"]: Path(app["archive"]), pause["image"]: Path(pause["archive"])},
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterError(
                f"no usable image manifest at {manifest} ({exc}); run {IMAGES_SCRIPT}"
            ) from None
        missing = [str(p) for p in images.archives.values() if not p.is_file()]
        if missing:
            raise ClusterError(f"image archives missing: {', '.join(missing)}; run {IMAGES_SCRIPT}")
        return images


def images_manifest() -> Path:
    return cache_dir() / "images" / "images.json"


def ensure_images(build: bool = True) -> Images:
    """The current images: built (or found unchanged, by content hash) by hack/build-images.sh."""
    if build:
        result = subprocess.run(["bash", str(IMAGES_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{IMAGES_SCRIPT} failed with exit code {result.returncode}")
    return Images.load(images_manifest())
