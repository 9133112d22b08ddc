"""Backbones that take any registered attention."""

from .decoder import Decoder, ModelOutput, sinusoidal_positions
from .stack import AttentionStack, Block, StackConfig
from .vit import VisionTransformer

__all__ = ["AttentionStack", "Block", "Decoder", "ModelOutput", "StackConfig", "VisionTransformer",
           "sinusoidal_positions"]
