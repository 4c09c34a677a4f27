"""ILIAS-style image preprocessing and aspect-ratio buckets.

ILIAS resizes the longer side of every image to the evaluation resolution with the aspect ratio
kept (384 for most 224-trained models, 724 for DINOv2; Kordopatis-Zilos et al. 2025, Sec. 5),
normalises with the model's own mean and standard deviation, and L2-normalises the output.

A ViT on an `h x w` patch grid compiles once per grid, so a stream of mixed aspect ratios would
recompile per image. Instead each image is padded (bottom/right) to one of a few *buckets*: the
longer side is always `R // p` patches, the shorter side is rounded up to one of `num_buckets`
levels. `models.ViT` masks the padded patches, so the embedding is the unpadded one.

Shapes: `p` patch size, `R` resolution in pixels, `G = R // p` patches along the longer side.
"""

import dataclasses
import io
import math
from collections.abc import Iterable, Iterator

import numpy as np
from PIL import Image

# Per-channel (mean, std) in [0, 1] RGB, as the models were trained.
NORMS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # DINOv2, timm ImageNet
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "siglip": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
FAMILY_NORM = {
    "dinov2": "imagenet",
    "dinov2_reg": "imagenet",
    "clip": "clip",
    "openclip": "clip",
    "siglip": "siglip",
}
_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """How images become model inputs.

    Attributes:
      resolution: R, the longer side in pixels after resizing.
      patch_size: p; grids are counted in patches of this size.
      norm: a key of `NORMS`.
      num_buckets: shorter-side levels per orientation (2 * num_buckets compiled shapes at most).
      resample: "bicubic" or "bilinear" (PIL, with antialiasing when shrinking).
    """

    resolution: int
    patch_size: int
    norm: str = "imagenet"
    num_buckets: int = 4
    resample: str = "bicubic"

    @property
    def long_grid(self) -> int:
        return self.resolution // self.patch_size

    def levels(self) -> list[int]:
        """Returns the shorter-side bucket sizes in patches, ascending, ending at G."""
        g = self.long_grid
        return sorted(
            {max(1, math.ceil(g * (k + 1) / self.num_buckets)) for k in range(self.num_buckets)}
        )

    def bucket(self, grid: tuple[int, int]) -> tuple[int, int]:
        """Returns the bucket [Hb, Wb] (in patches) that holds an image of patch `grid`."""
        h, w = grid
        level = lambda n: next(lv for lv in self.levels() if lv >= n)
        return (h, level(w)) if h >= w else (level(h), w)

    def resize(self, image: Image.Image) -> Image.Image:
        """Resizes so that the longer side is `resolution` pixels, keeping the aspect ratio."""
        image = image.convert("RGB")
        w, h = image.size
        scale = self.resolution / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        return image.resize(size, _RESAMPLE[self.resample]) if size != (w, h) else image

    def __call__(self, image) -> tuple[np.ndarray, tuple[int, int]]:
        """Returns (pixels [h_px, w_px, 3] float32 normalised, patch grid (h, w)).

        Args:
          image: a PIL image, encoded bytes, or a uint8 [H, W, 3] array.
        """
        image = to_pil(image)
        x: np.ndarray = np.asarray(self.resize(image), np.float32) / 255.0
        mean, std = NORMS[self.norm]
        x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        p = self.patch_size
        grid = (max(1, x.shape[0] // p), max(1, x.shape[1] // p))
        return x, grid


def to_pil(image) -> Image.Image:
    """Returns a PIL image from a PIL image, encoded bytes or a uint8 [H, W, C] array."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, bytes | bytearray | memoryview):
        with Image.open(io.BytesIO(image)) as im:
            return im.convert("RGB")
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return Image.fromarray(arr)


@dataclasses.dataclass
class Batch:
    """One padded batch of a single bucket.

    Attributes:
      images: [B, Hb * p, Wb * p, 3] float32, zero where padded.
      grid: [B, 2] int32 real patch grids (padding rows have the whole bucket).
      ids: the n <= B real ids; rows n.. are padding.
    """

    images: np.ndarray
    grid: np.ndarray
    ids: list[str]


def batches(
    examples: Iterable[tuple[str, np.ndarray, tuple[int, int]]], pre: Preprocess, batch_size: int
) -> Iterator[Batch]:
    """Groups preprocessed `(id, pixels, grid)` into full per-bucket batches of `batch_size`.

    Each bucket fills independently; at the end the partial ones are padded with blank rows, so
    every batch has one of at most `2 * num_buckets` shapes.
    """
    open_buckets: dict[tuple[int, int], list] = {}
    for ex in examples:
        key = pre.bucket(ex[2])
        rows = open_buckets.setdefault(key, [])
        rows.append(ex)
        if len(rows) == batch_size:
            yield _assemble(key, rows, pre, batch_size)
            open_buckets[key] = []
    for key, rows in open_buckets.items():
        if rows:
            yield _assemble(key, rows, pre, batch_size)


def _assemble(key, rows, pre: Preprocess, batch_size: int) -> Batch:
    p = pre.patch_size
    images = np.zeros((batch_size, key[0] * p, key[1] * p, 3), np.float32)
    grid = np.tile(np.asarray(key, np.int32), (batch_size, 1))
    for i, (_, x, g) in enumerate(rows):
        h, w = min(x.shape[0], key[0] * p), min(x.shape[1], key[1] * p)
        images[i, :h, :w] = x[:h, :w]
        grid[i] = g
    return Batch(images, grid, [r[0] for r in rows])
