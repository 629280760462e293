"""An ImageFolder-style PyTorch training: a folder of JPEG photos (one sub-folder per class,
written with PIL at start-up into a temporary directory, so they sit in the page cache), a
Dataset that opens each file with PIL, decodes it, crops, resizes and flips it and turns it
into a normalised tensor, one DataLoader worker, and a tiny model. Decoding and resizing on the
CPU cannot keep up with the model: the loop mostly waits for its next batch.

torchvision is not used (it does not import with every torch build); the transforms are PIL
and numpy, as torchvision's would be.

A held-out training, written as a user writes one: it contains no stallscope code. It measures
its own data wait (the time spent in ``next(iterator)``, over the training loop's wall time)
and prints it at the end as ``data wait: 87.3% of 15.1 s (measured by the trainer)``.

What the trainings here share (the timing, the loop, the closing lines, the options) is in
``_truth.py`` beside it, which holds no stallscope code either.

    python torch_jpeg.py --seconds 15
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _truth import arguments, classify_step, report, train_for
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def write_photos(root: Path, n: int, classes: int, size: tuple[int, int]) -> None:
    """``n`` JPEGs of smooth noise with grain (compresses like a photo), in ``root/class_k/``."""
    rng = np.random.default_rng(0)
    w, h = size
    grain = rng.integers(-12, 13, (h, w, 3), dtype=np.int16)
    for k in range(classes):
        (root / f"class_{k}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        small = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.int16) + np.roll(grain, i, axis=1)
        Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(
            root / f"class_{i % classes}" / f"img_{i:05d}.jpg", quality=90
        )


class ImageFolder(Dataset):
    """Every ``root/<class>/*.jpg``, labelled by its folder."""

    def __init__(self, root: Path, crop: int = 160):
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [
            (p, c)
            for c, name in enumerate(self.classes)
            for p in sorted((root / name).glob("*.jpg"))
        ]
        self.crop = crop
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        with Image.open(path) as im:
            img = im.convert("RGB")
        # RandomResizedCrop(crop) + RandomHorizontalFlip, then ToTensor + Normalize
        w, h = img.size
        side = int(min(w, h) * self.rng.uniform(0.5, 1.0))
        x0 = int(self.rng.integers(0, w - side + 1))
        y0 = int(self.rng.integers(0, h - side + 1))
        img = img.resize((self.crop, self.crop), Image.BICUBIC, box=(x0, y0, x0 + side, y0 + side))
        if self.rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        arr = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()), label


def main() -> int:
    ap = arguments(__doc__, workers=1, batch_size=32)
    ap.add_argument("--files", type=int, default=256)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="photos-"))
    try:
        t = time.perf_counter()
        write_photos(root, args.files, classes=5, size=(500, 375))
        print(f"{args.files} photos in {root} ({time.perf_counter() - t:.1f} s)", flush=True)
        loader = DataLoader(
            ImageFolder(root),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
        )
        model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 5))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        step = classify_step(model, opt)

        run = train_for(args.seconds, loader, step)
        report(run.steps, run.wait, run.wall, loss=run.last)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
