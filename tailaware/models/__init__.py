"""Flax backbones for descriptor extraction and their PyTorch weight import."""

from tailaware.models.vit import (
    FAMILIES,
    SIZES,
    TextSpec,
    TextTransformer,
    ViT,
    ViTSpec,
    text_spec,
    vit_spec,
)
from tailaware.models.weights import TABLES, CheckpointError, convert, describe, load, spec_for

__all__ = [
    "FAMILIES",
    "SIZES",
    "TABLES",
    "CheckpointError",
    "TextSpec",
    "TextTransformer",
    "ViT",
    "ViTSpec",
    "convert",
    "describe",
    "load",
    "spec_for",
    "text_spec",
    "vit_spec",
]
