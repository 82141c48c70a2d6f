"""Gradient compression for DistributedOptimizer (Horovod's Compression.none / .fp16)."""

import torch


class NoneCompressor:
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor:
    """Sends floating-point tensors as float16 (half the bytes; sums in float16, so expect
    about 3 significant digits), casting back after."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Compression.none or Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
