"""The budgets `analyze` measures with unless told otherwise (imports nothing: the command line shows them in --help)."""

DEFAULT_TOKENS = 256 * 1024  # LM tokens for angular distance and layer-drop
DEFAULT_IMAGES = 1024  # vit images (all their tokens) for the same
DEFAULT_SEEDS = (0, 1, 2)
