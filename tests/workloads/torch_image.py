#!/usr/bin/env python3
"""PyTorch image-folder pipeline: JPEG files decoded with PIL, torchvision augmentation.

ImageFolder over DATA/class_K/*.jpg (256 generated 256x256 JPEGs, 4 classes) ->
RandomResizedCrop(224) -> RandomHorizontalFlip -> ToTensor -> Normalize(ImageNet) ->
DataLoader(shuffle, batch 32). --epoch-samples N makes the dataset N long (index i reads
file i mod 256), so epochs can be shorter or longer than the file set. Files are opened with
torch_common.open_counted (PIL reads them as from open(path, "rb")): each reading process prints
IO lines, the bytes its read() syscalls on the dataset's files returned.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_common  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

NAME = "torch_image"
EPOCH_SAMPLES = 256


def add_args(p):
    p.add_argument("--files", type=int, default=256, help="JPEGs to generate (default 256)")
    p.add_argument("--crop", type=int, default=224)


def counted_pil_loader(path):
    """torchvision's PIL loader, its file's reads counted."""
    from PIL import Image

    with torch_common.open_counted(path) as f:
        img = Image.open(f)
        return img.convert("RGB")


class Images(Dataset):
    """ImageFolder (PIL loader) with a chosen length."""

    counts_io = True

    def __init__(self, root, length, crop):
        from torchvision import datasets, transforms

        transform = transforms.Compose([
            transforms.RandomResizedCrop(crop),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])
        self.folder = datasets.ImageFolder(root, transform=transform, loader=counted_pil_loader)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        item = self.folder[i % len(self.folder)]
        torch_common.emit_io()
        return item


def build(args):
    files = torch_common.image_files(args.data)
    if len(files) != args.files:
        files = torch_common.generate_images(args.data, count=args.files, seed=args.seed)
    if len(files) != args.files:
        raise SystemExit(f"{args.data} holds {len(files)} images, not --files {args.files}: "
                         "use another --data")
    return Images(args.data, args.epoch_samples, args.crop)


if __name__ == "__main__":
    sys.exit(torch_common.main(sys.modules[__name__]))
