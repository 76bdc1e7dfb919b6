"""Dory: a looped nGPT-style transformer (docs/models/dory.md).

model      the forward: sessions' state, the loops, attention and MLP, the head
config     DoryConfig (the file's header, validated) and DoryOptions (run-time choices,
           the CORTIQ_DORY_* environment read once)
far_field  the O(1) far field of the full-attention layers (exact rows + Nyström states)
nystrom    NystromState, the streaming Nyström summary the far field keeps per layer
"""
from .config import DoryConfig, DoryOptions
from .model import AttnWeights, DoryModel, top_prob

__all__ = ["AttnWeights", "DoryConfig", "DoryModel", "DoryOptions", "top_prob"]
