"""The identity of a base model: the SHA-256 of its weights.

The recipe hash (:func:`harness.running.modelcache.model_recipe`) names how a model was made and
keys the cache; two trainings of one recipe on different devices give different
weights, and so different certificates. The weights digest names the model itself:
SHA-256 over the state dict in sorted key order, each entry as its key, dtype, shape
and raw little-endian tensor bytes, so equal digests mean bit-identical weights.
"""

from __future__ import annotations

import hashlib
import json

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """Hex SHA-256 of ``model.state_dict()`` (parameters and buffers) in canonical form."""
    state = model.state_dict()
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().to("cpu").contiguous()
        header = json.dumps([key, str(tensor.dtype), list(tensor.shape)], separators=(",", ":"))
        digest.update(header.encode() + b"\n")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
