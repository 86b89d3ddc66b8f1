"""Modules: norms, placements, attention, MLPs, the Block, and the llama and vit backbones."""
